"""Test problems, the shard builder and simulated ranks.

Problems: :func:`random_problem` (Gaussian), :func:`planted_problem` (one clear
winner per batch row), :func:`integer_problem` (small integers: every logit is
exact in float32 and float64, ties included); hypothesis strategies for exact
problems are in :mod:`tests.support.strategies`.

Shards: :func:`make_shards` splits a full lm_head into the standard layout of
``localargmax.shard_vocab`` with padding rows that would win if a kernel read
them. Simulated ranks run the public step once per shard in one process, the
collective played by a callable group.
"""

from __future__ import annotations

import math
from functools import partial

import torch

import localargmax
from tests.support.keys import allreduce_max
from tests.support.reference import judge, min_gap, reference_logits_and_error

PAD_KINDS = ("huge", "nan", "inf", "inf_bias")
"""Padding fills: ``huge`` (1024 x a hidden row: by far the largest logit of
that batch row), ``nan`` (NaN weights), ``inf`` (+inf weights: logit +inf or
NaN), ``inf_bias`` (huge weights and a +inf / NaN bias; a float32 bias is
created if there is none)."""


# ----------------------------------------------------------------------------- problems


def random_problem(gen: torch.Generator, batch: int, vocab: int, hsize: int, dtype=torch.float32, bias=None):
    """Gaussian hidden [B, H], weight [V, H] (rows scaled to ~unit logits),
    bias None / "float32" / "weight" (the weight dtype)."""
    hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
    weight = (torch.randn(vocab, hsize, generator=gen) / math.sqrt(max(hsize, 1))).to(dtype)
    if hsize == 1 and dtype in (torch.bfloat16, torch.float16) and vocab > 1:
        # one column of 16-bit values would repeat the maximum all the time;
        # draw distinct bit patterns (magnitudes ~1e-3 .. 30, both signs; smaller normal magnitudes too
        # when the vocab needs more than that range holds: bfloat16 past 4096 rows)
        lo, hi = (0x3A00, 0x4200) if dtype == torch.bfloat16 else (0x1400, 0x4F00)
        lo = min(lo, hi - (vocab + 1) // 2)
        smallest_normal = 0x0080 if dtype == torch.bfloat16 else 0x0400
        assert lo >= smallest_normal, f"random_problem: no {vocab} distinct normal {dtype} values below {hi:#x}"
        pick = torch.randperm(2 * (hi - lo), generator=gen)[:vocab]
        bits = (lo + pick % (hi - lo)) | ((pick >= (hi - lo)).to(torch.int64) << 15)
        weight = bits.to(torch.int32).to(torch.int16).view(dtype).view(vocab, 1).clone()
    b = None
    if bias == "float32":
        b = torch.randn(vocab, generator=gen) * 0.5
    elif bias == "weight":
        b = (torch.randn(vocab, generator=gen) * 0.5).to(dtype)
    return hidden, weight, b


def planted_problem(gen: torch.Generator, batch: int, vocab: int, hsize: int, dtype=torch.float32, bias=None):
    """:func:`random_problem` with one planted winner per batch row:
    weight[t_b] = 6 * hidden[b] / |hidden[b]|^2 (a logit near 6 against ~N(0, 1)
    others; hsize >= 32). A draw whose plant is not the float64 winner by more
    than the float32 error bound, or by less than 2% of the winning logit
    (another row's plant can come close or outscore it, rarely), is drawn
    again.
    Returns (hidden, weight, bias, winners)."""
    assert hsize >= 32 and vocab >= batch
    for _ in range(20):
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, bias)
        winners = torch.randperm(vocab, generator=gen)[:batch]
        h = hidden.float()
        weight[winners] = (6.0 * h / (h * h).sum(dim=1, keepdim=True)).to(dtype)
        if b is not None:
            b[winners] = b.max()
        clear, wrong, _ = judge(winners, *reference_logits_and_error(hidden, weight, b))
        if bool(clear.all()) and not bool(wrong.any()) and min_gap(hidden, weight, b) > 0.02:
            return hidden, weight, b, winners
    raise AssertionError("could not plant clear winners in 20 draws")


def integer_problem(gen, batch, vocab, hsize, dtype=torch.float32, bias=False, ties=True):
    """Nonzero small-integer hidden (|h| <= 3), weight (|w| <= 3) and an
    optional integer float32 bias: every logit is exact in float32 and
    float64, so the reference decides ties exactly. ``ties`` copies random
    rows elsewhere (exact ties, across shards too)."""
    sign = torch.randint(0, 2, (batch, hsize), generator=gen) * 2 - 1
    hidden = torch.randint(1, 4, (batch, hsize), generator=gen) * sign
    weight = torch.randint(-3, 4, (vocab, hsize), generator=gen)
    if ties and vocab > 1:
        n = max(1, vocab // 5)
        weight[torch.randint(0, vocab, (n,), generator=gen)] = weight[torch.randint(0, vocab, (n,), generator=gen)]
    b = torch.randint(-4, 5, (vocab,), generator=gen).to(torch.float32) if bias else None
    return hidden.to(dtype), weight.to(dtype), b


# ----------------------------------------------------------------------------- shards


def make_shards(weight, bias, tp, pad_to=64, *, hidden=None, pad="huge"):
    """The ``tp`` standard-layout shards of the full ``weight [V, H]`` (and
    ``bias [V]``), padding rows filled as ``pad`` says (:data:`PAD_KINDS`).
    Returns ``[(weight_shard, bias_shard_or_None, VocabShard)]``."""
    assert pad in PAD_KINDS
    vocab, hsize = weight.shape
    shards = []
    for r in range(tp):
        s = localargmax.shard_vocab(vocab, r, tp, pad_to)
        nv, npad = s.num_valid, s.rows - s.num_valid
        w = torch.empty((s.rows, hsize), dtype=weight.dtype)
        w[:nv] = weight[s.vocab_start : s.vocab_start + nv]
        if pad == "nan":
            w[nv:] = float("nan")
        elif pad == "inf":
            w[nv:] = float("inf")
        elif npad:
            src = hidden.detach().cpu().float() if hidden is not None and hidden.shape[0] else torch.ones(1, hsize)
            w[nv:] = (src[torch.arange(npad) % src.shape[0]] * 1024).to(weight.dtype)
        b = None
        if bias is not None or pad == "inf_bias":
            b = torch.zeros((s.rows,), dtype=torch.float32 if bias is None else bias.dtype)
            if bias is not None:
                b[:nv] = bias[s.vocab_start : s.vocab_start + nv]
            if pad == "inf_bias":
                b[nv:] = float("inf")
                b[nv + 1 :: 2] = float("nan")
            else:
                b[nv:] = 1e30 if b.dtype == torch.float32 else 1e4
        shards.append((w, b, s))
    return shards


def layout_kwargs(shard) -> dict:
    """The layout keywords every op takes for one ``(weight, bias, VocabShard)``
    of :func:`make_shards`: ``vocab_start``, ``num_valid`` and ``bias``."""
    _, b, s = shard
    return {"vocab_start": s.vocab_start, "num_valid": s.num_valid, "bias": b}


def full_bias(bias, shards, vocab):
    """The bias of the unpadded vocabulary as the shards see it (zeros where
    make_shards created a bias for the padding)."""
    if bias is not None or all(b is None for _, b, _ in shards):
        return bias
    return torch.zeros(vocab, dtype=torch.float32)


def shard_keys(hidden, shards) -> torch.Tensor:
    """``[tp, B]`` keys: :func:`localargmax.shard_argmax` on every shard (on hidden's device)."""
    dev = hidden.device
    keys = [
        localargmax.shard_argmax(
            hidden, w.to(dev), vocab_start=s.vocab_start, num_valid=s.num_valid, bias=None if b is None else b.to(dev)
        )
        for w, b, s in shards
    ]
    return torch.stack(keys) if keys else torch.empty((0, hidden.shape[0]), dtype=torch.int64)


def sharded_argmax(hidden, weight, bias=None, tp=1, pad_to=64, d2t=None, pad="huge"):
    """(ids, values) of the full problem computed shard by shard and merged by merge_keys."""
    return localargmax.merge_keys(
        shard_keys(hidden, make_shards(weight, bias, tp, pad_to, hidden=hidden, pad=pad)), d2t
    )


# ----------------------------------------------------------------------------- simulated ranks


def stack_frames(keys, layouts) -> torch.Tensor:
    """What a real all-gather returns in a step's exchange: every simulated
    rank's payload (its keys, its log-partition pairs if the entry is a
    ``(keys, pairs)`` tuple, and the 3-word header of
    ``localargmax.collective.frame_keys``), stacked rank-major. ``layouts``:
    each rank's ``(vocab_start, num_valid)``."""
    from localargmax.collective import frame_keys

    frames = []
    for k, (s, n) in zip(keys, layouts):
        k, pairs = k if isinstance(k, tuple) else (k, None)
        frames.append(frame_keys(k, int(s) + int(n) if n else 0, pairs))
    return torch.stack(frames)


def _simulate(hidden, shards, shard_op, step, reduce="all_gather"):
    """``step(hidden, w, **layout, group=...)`` on every simulated rank, where
    the callable group checks the rank passes its own keys
    (``shard_op(hidden, w, **layout)``) and returns the keys of every shard
    (all-gather) or their emulated all-reduce MAX ``[1, B]``. Checks that all
    ranks agree; returns rank 0's result."""
    layouts = [layout_kwargs(sh) for sh in shards]
    keys = stack_frames(
        [shard_op(hidden, w, **lay) for (w, _, _), lay in zip(shards, layouts)],
        [(s.vocab_start, s.num_valid) for _, _, s in shards],
    )
    exchanged = keys if reduce == "all_gather" else allreduce_max(keys)
    out = None
    for r, ((w, _, _), lay) in enumerate(zip(shards, layouts)):

        def group(k, r=r):
            assert torch.equal(k, keys[r]), f"rank {r} passed keys that are not its shard's"
            return exchanged

        result = step(hidden, w, **lay, group=group)
        ids = result[0] if isinstance(result, tuple) else result
        assert out is None or torch.equal(ids, out[0] if isinstance(out, tuple) else out), f"rank {r} disagrees"
        if out is not None and isinstance(result, tuple):  # values / log-probs: the same bits on every rank
            assert torch.equal(result[1].view(torch.int32), out[1].view(torch.int32)), f"rank {r}'s values differ"
        out = result
    return out


def simulated_argmax(hidden, shards, *, d2t=None, reduce="all_gather"):
    """lm_head_argmax on every simulated rank: the ids."""
    return _simulate(hidden, shards, localargmax.shard_argmax, partial(localargmax.lm_head_argmax, d2t=d2t), reduce)


def simulated_topk(hidden, shards, k, *, d2t=None):
    """lm_head_topk on every simulated rank: (ids, values)."""
    shard_op = partial(localargmax.shard_topk, k=k)
    return _simulate(hidden, shards, shard_op, partial(localargmax.lm_head_topk, k=k, d2t=d2t))


def simulated_sample(hidden, shards, temperature, seed, offset=0, *, d2t=None):
    """lm_head_sample on every simulated rank: the sampled ids."""
    t = temperature if isinstance(temperature, torch.Tensor) else torch.full((hidden.shape[0],), float(temperature))
    shard_op = partial(localargmax.shard_sample, temperature=t, seed=seed, offset=offset)
    step = partial(localargmax.lm_head_sample, temperature=temperature, seed=seed, offset=offset, d2t=d2t)
    return _simulate(hidden, shards, shard_op, step)


# The same with return_log_probs=True: (ids, log_probs). ``lp`` holds the
# transform: logit_scale and soft_cap.


def simulated_argmax_log_probs(hidden, shards, *, d2t=None, **lp):
    """lm_head_argmax(return_log_probs=True) on every simulated rank: (ids, log_probs)."""
    shard_op = partial(localargmax.shard_argmax, log_partition=True, **_op_transform(lp))
    step = partial(localargmax.lm_head_argmax, d2t=d2t, return_log_probs=True, **lp)
    return _simulate(hidden, shards, shard_op, step)


def simulated_topk_log_probs(hidden, shards, k, *, d2t=None, **lp):
    """lm_head_topk(return_log_probs=True) on every simulated rank: (ids, log_probs)."""
    shard_op = partial(localargmax.shard_topk, k=k, log_partition=True, **_op_transform(lp))
    step = partial(localargmax.lm_head_topk, k=k, d2t=d2t, return_log_probs=True, **lp)
    return _simulate(hidden, shards, shard_op, step)


def simulated_sample_log_probs(hidden, shards, temperature, seed, offset=0, *, d2t=None, **lp):
    """lm_head_sample(return_log_probs=True) on every simulated rank: (ids, log_probs)."""
    noise = {"temperature": temperature, "seed": seed, "offset": offset}
    shard_op = partial(localargmax.shard_sample, log_partition=True, **noise, **_op_transform(lp))
    step = partial(localargmax.lm_head_sample, d2t=d2t, return_log_probs=True, **noise, **lp)
    return _simulate(hidden, shards, shard_op, step)


def simulated_argmax_log_odds(hidden, shards, temperature=None, *, log_probs=False, d2t=None, **lp):
    """lm_head_argmax(return_log_odds=True, temperature=...) on every simulated
    rank: (ids, log_odds), or (ids, log_probs, log_odds) with ``log_probs``."""
    t = temperature
    if t is not None and not isinstance(t, torch.Tensor):
        t = torch.full((hidden.shape[0],), float(t))
    shard_op = partial(localargmax.shard_argmax, log_partition=True, temperature=t, **_op_transform(lp))
    step = partial(
        localargmax.lm_head_argmax, d2t=d2t, return_log_probs=log_probs, return_log_odds=True,
        temperature=temperature, **lp,
    )  # fmt: skip
    return _simulate(hidden, shards, shard_op, step)


def _op_transform(lp: dict) -> dict:
    return {"scale": lp.get("logit_scale", 1.0), "soft_cap": lp.get("soft_cap")}
