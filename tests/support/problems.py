"""Test problems, the shard builder and simulated ranks.

Problems: :func:`random_problem` (Gaussian), :func:`planted_problem` (one clear
winner per batch row), :func:`integer_problem` (small integers: every logit is
exact in float32 and float64, ties included) and the hypothesis strategy
:func:`exact_problems` (m * 2**e values with IEEE specials planted).

Shards: :func:`make_shards` splits a full lm_head into the standard layout of
``localargmax.shard_vocab`` with padding rows that would win if a kernel read
them. Simulated ranks run the public step once per shard in one process, the
collective played by a callable group.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

import localargmax
from tests.support.keys import allreduce_max
from tests.support.reference import ref_argmax

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
        # draw distinct bit patterns (magnitudes ~1e-3 .. 30, both signs)
        lo, hi = (0x3A00, 0x4200) if dtype == torch.bfloat16 else (0x1400, 0x4F00)
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
    others; hsize >= 32). A draw whose plant is not the float64 winner (another
    row's plant can outscore it, rarely) is drawn again.
    Returns (hidden, weight, bias, winners)."""
    assert hsize >= 32 and vocab >= batch
    for _ in range(20):
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, bias)
        winners = torch.randperm(vocab, generator=gen)[:batch]
        h = hidden.float()
        weight[winners] = (6.0 * h / (h * h).sum(dim=1, keepdim=True)).to(dtype)
        if b is not None:
            b[winners] = b.max()
        if torch.equal(ref_argmax(hidden, weight, b), winners):
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
    return localargmax.merge_keys(shard_keys(hidden, make_shards(weight, bias, tp, pad_to, hidden=hidden, pad=pad)), d2t)


# ----------------------------------------------------------------------------- simulated ranks


def _each_rank(shards, keys, exchanged, step):
    """Run ``step(w, b, s, group)`` for every shard with a callable group that
    checks the rank passes its own ``keys[r]`` and returns ``exchanged``; check
    that all ranks agree and return rank 0's result."""
    out = None
    for r, (w, b, s) in enumerate(shards):

        def group(k, r=r):
            assert torch.equal(k, keys[r]), f"rank {r} passed keys that are not its shard's"
            return exchanged

        result = step(w, b, s, group)
        ids = result[0] if isinstance(result, tuple) else result
        assert out is None or torch.equal(ids, out[0] if isinstance(out, tuple) else out), f"rank {r} disagrees"
        out = result
    return out


def simulated_argmax(hidden, shards, *, d2t=None, reduce="all_gather"):
    """lm_head_argmax on every simulated rank; the collective returns the
    stacked keys (all-gather) or their emulated all-reduce MAX ``[1, B]``."""
    keys = shard_keys(hidden, shards)
    exchanged = keys if reduce == "all_gather" else allreduce_max(keys)
    return _each_rank(
        shards,
        keys,
        exchanged,
        lambda w, b, s, group: localargmax.lm_head_argmax(
            hidden, w, vocab_start=s.vocab_start, num_valid=s.num_valid, bias=b, d2t=d2t, group=group
        ),
    )


def simulated_topk(hidden, shards, k, *, d2t=None):
    """lm_head_topk on every simulated rank: (ids, values) of rank 0."""
    keys = torch.stack(
        [
            localargmax.shard_topk(hidden, w, k, vocab_start=s.vocab_start, num_valid=s.num_valid, bias=b)
            for w, b, s in shards
        ]
    )
    return _each_rank(
        shards,
        keys,
        keys,
        lambda w, b, s, group: localargmax.lm_head_topk(
            hidden, w, k, vocab_start=s.vocab_start, num_valid=s.num_valid, bias=b, d2t=d2t, group=group
        ),
    )


def simulated_sample(hidden, shards, temperature, seed, offset=0, *, d2t=None):
    """lm_head_sample on every simulated rank: the sampled ids of rank 0."""
    t = temperature if isinstance(temperature, torch.Tensor) else torch.full((hidden.shape[0],), float(temperature))
    keys = torch.stack(
        [
            localargmax.shard_sample(hidden, w, t, seed, offset, vocab_start=s.vocab_start, num_valid=s.num_valid, bias=b)
            for w, b, s in shards
        ]
    )
    return _each_rank(
        shards,
        keys,
        keys,
        lambda w, b, s, group: localargmax.lm_head_sample(
            hidden, w, temperature=temperature, seed=seed, offset=offset, vocab_start=s.vocab_start,
            num_valid=s.num_valid, bias=b, d2t=d2t, group=group,
        ),
    )


# ----------------------------------------------------------------------------- hypothesis: exact problems

EXACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
EXP_RANGE = {torch.float32: (-149, 120), torch.bfloat16: (-133, 120), torch.float16: (-24, 12)}
"""Exponents e of m * 2**e, |m| <= 7, exactly representable (subnormals included)."""
SPECIALS = ("w_nan", "w_inf", "w_ninf", "h_inf", "h_ninf", "h_nan", "b_nan", "b_inf", "b_ninf", "dup", "dup",
            "dup_far", "zero_hidden_row", "all_neg_inf_bias", "neg_zero_weight_row")


class Problem:
    def __init__(self, hidden, weight, bias, desc):
        self.hidden, self.weight, self.bias, self.desc = hidden, weight, bias, desc

    def __repr__(self):
        return f"Problem({self.desc})"


def _plant_special(kind, fa, fb, fc, hidden, weight, bias):
    batch, vocab, hsize = hidden.shape[0], weight.shape[0], weight.shape[1]

    def pick(frac, n):
        return min(n - 1, int(frac * n))

    if kind.startswith("w_") or kind.startswith("dup") or kind == "neg_zero_weight_row":
        i, j = pick(fa, vocab), pick(fb, hsize)
        if kind.startswith("w_"):
            weight[i, j] = {"w_nan": math.nan, "w_inf": math.inf, "w_ninf": -math.inf}[kind]
        elif kind == "dup":
            weight[pick(fc, vocab)] = weight[i]
        elif kind == "dup_far":
            weight[vocab - 1 - pick(fc, max(1, vocab // 8))] = weight[i]
        else:
            weight[i] = -0.0
    elif kind.startswith("h_") or kind == "zero_hidden_row":
        if batch:
            b, j = pick(fa, batch), pick(fb, hsize)
            if kind == "zero_hidden_row":
                hidden[b] = 0.0
            else:
                hidden[b, j] = {"h_inf": math.inf, "h_ninf": -math.inf, "h_nan": math.nan}[kind]
    else:
        bias = torch.zeros(vocab) if bias is None else bias
        if kind == "all_neg_inf_bias":
            bias[:] = -math.inf
        else:
            bias[pick(fa, vocab)] = {"b_nan": math.nan, "b_inf": math.inf, "b_ninf": -math.inf}[kind]
    return bias


@st.composite
def exact_problems(draw, max_batch=6, max_vocab=260, max_h=48, min_batch=0):
    """Problems whose float32 accumulation is exact in any order: hidden values
    m * 2**eh, weights m * 2**ew (|m| <= 7, eh + ew >= -149, H <= 48), so every
    partial sum is a multiple of 2**(eh + ew) below 2**24 of them, and so is the
    float64 reference. Ties, NaN, +-inf, -0.0 and denormals are then decided by
    DESIGN.md's rules alone. Tensors come from a torch generator whose seed
    hypothesis draws (a failure shrinks to small shapes and a small seed)."""
    dtype = draw(st.sampled_from(EXACT_DTYPES))
    batch = draw(st.integers(min_batch, max_batch))
    vocab = draw(st.integers(1, max_vocab))
    hsize = draw(st.integers(1, max_h))
    lo, hi = EXP_RANGE[dtype]
    eh = draw(st.integers(lo, hi))
    ew = draw(st.integers(max(lo, -149 - eh), min(hi, 100 - eh)))
    seed = draw(st.integers(0, 2**32 - 1))
    bias_kind = draw(st.sampled_from([None, "float32", "weight"]))
    specials = draw(
        st.lists(st.tuples(st.sampled_from(SPECIALS), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)), max_size=4)
    )
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.randint(-7, 8, (batch, hsize), generator=gen).double() * 2.0**eh).to(dtype)
    weight = (torch.randint(-7, 8, (vocab, hsize), generator=gen).double() * 2.0**ew).to(dtype)
    if vocab > 4 and seed % 3 == 0:  # few distinct rows: exact ties are common
        weight = weight[torch.randint(0, max(1, vocab // 4), (vocab,), generator=gen)]
    bias = None
    if bias_kind is not None:
        b64 = torch.randint(-64, 65, (vocab,), generator=gen).double() * 2.0 ** (eh + ew)
        bias = b64.float()
        if bias_kind == "weight" and torch.equal(b64.to(dtype).double(), b64):
            bias = b64.to(dtype)
    for kind, fa, fb, fc in specials:
        bias = _plant_special(kind, fa, fb, fc, hidden, weight, bias)
    desc = (
        f"B={batch} V={vocab} H={hsize} {dtype} eh={eh} ew={ew} seed={seed} bias={bias_kind}"
        f"{'/' + str(bias.dtype) if bias is not None else ''} specials={[s[0] for s in specials]}"
    )
    return Problem(hidden, weight, bias, desc)


@st.composite
def layouts(draw):
    """(tp, pad_to, pad kind)."""
    return draw(st.integers(1, 4)), draw(st.integers(1, 128)), draw(st.sampled_from(PAD_KINDS))


def d2t_for(seed: int, vocab: int) -> torch.Tensor:
    """A valid build_d2t table for a draft vocabulary of ``vocab`` ids."""
    gen = torch.Generator().manual_seed(seed)
    target = vocab + int(torch.randint(0, 3 * vocab + 1, (1,), generator=gen))
    d2t = localargmax.build_d2t(torch.randint(0, 50, (target,), generator=gen), vocab)
    localargmax.validate_d2t(d2t, vocab, target)
    return d2t
