"""The sampling step, :func:`lm_head_sample`: tp-invariant Gumbel-max over a
vocab-parallel lm_head, one key per row per rank; with vLLM's top-k / top-p /
min-p, exact sampling from the filtered distribution in one exchange
(DESIGN.md, "Filtered sampling"): each rank's fused top-K pass with
its log-partition pair, the exchange ``lm_head_topk(..., return_log_probs=True)``
sends, then Gumbel-max over the allowed set among the merged candidates with
the noise :func:`localargmax.lm_head_sample` uses. Rows whose allowed set is
not decided by the candidates are recomputed from a gather of their logits."""

from __future__ import annotations

import math

import torch

from .. import envs
from .._validation import (
    MAX_TOPK,
    FilterRows,
    VllmNoise,
    check_d2t_arg,
    check_noise,
    check_seed_offset,
    check_transform_args,
    filter_rows,
    host_checks,
)
from ..collective import Group, exchange_logits, logits_payload_length
from ..engine import exchange_checked, gather_logits, merge_checked, step_fields, vocab_end, winning_rank
from ..ops import decode_keys, shard_sample, shard_topk
from ..packed_key import NO_ENTRY_STANDIN, pack_keys, top_keys
from ..plan import StepPlan
from .filters import decide_rows, filter_and_sample
from .logprobs import log_probs_from_pairs, shard_partition
from .noise import vllm_gumbel_noise

CANDIDATES = MAX_TOPK
"""Candidate keys per row each rank sends (its top-K); with its noised best
key (for rows with every filter off) the step's payload is
``payload_length(B, CANDIDATES + 1, log_probs=True)`` words."""

FALLBACKS = ("gather", "error")

fallback_payload_length = logits_payload_length
"""Int64 words one rank sends in the fallback gather
(:func:`localargmax.collective.logits_payload_length`: ``6 + ceil(n_rows·shard_rows / 2)``)."""


def lm_head_sample(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    temperature,
    seed: int,
    offset: int = 0,
    vocab_start: int = 0,
    num_valid: int | None = None,
    bias: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    group: Group = None,
    reduce: str = "all_gather",
    return_log_probs: bool = False,
    logit_scale: float = 1.0,
    soft_cap: float | None = None,
    top_k=None,
    top_p=None,
    min_p=None,
    fallback: str = "gather",
    noise=None,
):
    """Sample ``ids ~ softmax(logits / T)`` of a vocab-parallel lm_head with
    ``O(tp)`` communication: Gumbel-max, ``argmax_v (logit[b, v] / T[b] + g)``,
    where the noise ``g`` comes from Philox 4x32-10 keyed by
    ``(seed, offset + b, global index v)`` inside the fused kernel
    (:func:`localargmax.shard_sample`). The noise depends on the global index
    only, so the sample is identical for every TP size and shard layout
    (tp-invariant sampling); one key per row per rank is exchanged.

    Example::

        t = torch.full((B,), 0.7, device=hidden.device)
        ids = lm_head_sample(hidden, weight, temperature=t, seed=1234, offset=step * B, vocab_start=shard.vocab_start,
                             num_valid=shard.num_valid, group=tp_group)  # [B], the same for every tp

    Args:
        temperature: a finite float ``>= 0`` or a float32 tensor ``[B]`` (or
            ``[]``); ``T == 0`` rows are greedy. Every ``T > 0``, however
            small, samples ``softmax(logits / T)``: the kernels score
            ``logit + T * g`` for ``T < 1`` (the same argmax as
            ``logit / T + g``, without its overflow), so a ``T`` small enough
            to round the noise away gives the greedy id. ``T = inf`` is
            refused (it would make a banned ``-inf`` logit NaN, and NaN wins).
        seed: ``0 <= seed < 2**63``; offset: Philox subsequence of row 0
            (advance by ``B`` per step for fresh noise).
        return_log_probs: also return the log-probability of each sampled
            token under the distribution it was sampled from,
            ``softmax(x / T)`` of the transformed logits ``x`` (rows with
            ``T == 0``, greedy: under ``softmax(x)``, as
            :func:`lm_head_argmax`). The Gumbel-max scores are then those of
            ``x``. Each rank's pair refers to its own sampled entry, so no
            noise is recomputed in the merge.
        logit_scale, soft_cap: vLLM's transform (soft-cap, then scale; see
            :func:`lm_head_argmax`), with or without ``return_log_probs``:
            the samples are those of ``softmax(x / T)`` of the transformed
            logits ``x``.
        top_k, top_p, min_p: vLLM's filters (``SamplingParams``), a number
            or a ``[B]`` tensor each; off at None, ``top_k <= 0`` (or ``>=
            V``), ``top_p = 1``, ``min_p = 0``; greedy rows ignore them. With
            any of them the step runs :func:`filtered_sample` below (DESIGN.md,
            "Filtered sampling"): ``payload_length(B, 65, True)`` words and
            ``reduce="all_gather"``; ``fallback`` (``"gather"``, eager only,
            or ``"error"``) says what rows the candidates cannot decide get.
            A row with every filter off (``top_k <= 0``, ``top_p = 1``,
            ``min_p = 0``) gets the id (and log-probability) this step gives
            without filters, at any ``T``: it never needs the fallback.
        noise: None (the Philox noise above), or
            ``localargmax.vllm_noise(seed, pos, drafting=, spec_step=)`` (a
            :class:`localargmax.VllmNoise` of ``[B]`` int64 tensors on
            ``hidden``'s device): vLLM 0.34's noise and score, ``argmax_v
            fl(x / T) + g(seed[b], pos[b], v)`` in float32, the id vLLM's
            ``gumbel_sample`` draws from the full logits (DESIGN.md, "vLLM's
            noise"; ``seed`` and ``offset`` are then unused: pass 0). With
            ``top_k`` / ``top_p`` / ``min_p``: that score over the allowed
            set, ties to the smaller id, as vLLM's ``gumbel_sample`` after
            its filters (the filters' float32 boundaries aside: DESIGN.md,
            "Filtered sampling"); fp64 noise: not here.
        Others: as in :func:`lm_head_argmax`.

    Returns:
        ``[B]`` int64 sampled ids (target ids with ``d2t``), the same on every
        rank; with ``return_log_probs``, ``(ids, log_probs [B] float32)``.

    Raises:
        TypeError / ValueError naming the argument for malformed inputs; ValueError
        for a negative, NaN or infinite temperature: for a Python number or a
        CPU tensor at once, eager or under torch.compile (the CPU kernel reads
        the values); on CUDA the kernel gives such a row no valid key and the
        step's device-side assert raises (see :func:`lm_head_argmax`). The
        exchange is checked as in :func:`lm_head_argmax`.
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    if top_k is not None or top_p is not None or min_p is not None:
        if reduce != "all_gather":
            raise ValueError(f"top_k / top_p / min_p need reduce='all_gather', got {reduce!r}")
        return filtered_sample(
            hidden, weight, temperature=temperature, seed=seed, offset=offset, top_k=top_k, top_p=top_p,
            min_p=min_p, vocab_start=vocab_start, num_valid=num_valid, bias=bias, d2t=d2t, group=group,
            return_log_probs=return_log_probs, logit_scale=logit_scale, soft_cap=soft_cap, fallback=fallback,
            noise=noise,
        )  # fmt: skip
    plan = StepPlan(
        weight, kind="sample", vocab_start=vocab_start, num_valid=num_valid, bias=bias, d2t=d2t, group=group,
        reduce=reduce, return_log_probs=return_log_probs, logit_scale=logit_scale, soft_cap=soft_cap,
    )  # fmt: skip
    return plan.run(hidden, temperature=temperature, seed=seed, offset=offset, noise=noise)


def filtered_sample(
    hidden, weight, *, temperature, seed, offset=0, top_k=None, top_p=None, min_p=None, vocab_start=0,
    num_valid=None, bias=None, d2t=None, group=None, return_log_probs=False, logit_scale=1.0, soft_cap=None,
    fallback="gather", noise=None, shard_logits=None,
):  # fmt: skip
    """:func:`localargmax.lm_head_sample` with ``top_k`` / ``top_p`` /
    ``min_p`` (its docstring has the arguments; DESIGN.md, "Filtered sampling").
    Each rank sends ``payload_length(B, CANDIDATES + 1, log_probs=True)``
    words (its candidates, and its noised best key for the rows with every
    filter off: those are the unfiltered step's samples, never a fallback),
    plus, for rows whose allowed set the candidates do not decide, one gather
    of those rows' logits (``fallback="gather"``, eager only) or an error
    (``fallback="error"``: ValueError on the CPU, a device-side assert
    otherwise). ``noise``: vLLM's (:func:`vllm_scores`), or None: the Philox
    noise of (``seed``, ``offset + b``).

    ``shard_logits``: this rank's transformed logits ``[B, num_valid]`` as
    an engine computed them (vLLM's own bits, in any float dtype), in place
    of the fused kernel's float32 dots: the candidates, the pairs, the
    unfiltered rows' keys and the fallback's gather all read them (with
    vLLM's ``noise``, no ``bias``, ``d2t``, ``logit_scale`` / ``soft_cap``
    or ``return_log_probs``: ValueError otherwise). ``hidden`` / ``weight``
    still give the batch, the shard's rows and the device."""
    if shard_logits is not None:
        options = {"bias": bias is not None, "d2t": d2t is not None, "return_log_probs": return_log_probs}
        options |= {"logit_scale": logit_scale != 1.0, "soft_cap": soft_cap is not None}
        given = [name for name, on in options.items() if on]
        if noise is None or given:
            raise ValueError(f"shard_logits needs noise=vllm_noise(...) and no {', '.join(given) or 'other options'}")
        nv = weight.shape[0] if num_valid is None else num_valid
        if not isinstance(shard_logits, torch.Tensor) or tuple(shard_logits.shape) != (hidden.shape[0], nv):
            raise ValueError(f"shard_logits must be [B={hidden.shape[0]}, num_valid={nv}], got "
                             f"{tuple(getattr(shard_logits, 'shape', ()))}")  # fmt: skip
    check_seed_offset(seed, offset)
    if not isinstance(return_log_probs, bool):
        raise TypeError(f"return_log_probs must be a bool, got {type(return_log_probs).__name__}")
    if fallback == "gather" and _capturing():
        raise ValueError(
            "fallback='gather' needs the number of fallback rows on the host, which CUDA-graph capture and "
            "torch.compile do not allow: pass fallback='error' (a device-side assert if any row needs the gather)"
        )
    f = filter_rows(hidden, temperature, top_k, top_p, min_p)  # parsed once, here; handed down as one record
    batch, dev = hidden.shape[0], hidden.device
    debug = {"seed": seed, "offset": offset, "fallback": FALLBACKS.index(fallback), "temperature": f.t}
    debug |= {"top_k": f.k, "top_p": f.p, "min_p": f.mp}  # what the ranks decide the fallback rows from
    if noise is not None:
        noise = check_noise(noise, hidden)
        debug.update({"noise seed": noise.seed, "noise pos": noise.pos})
    if shard_logits is None:
        op, op_args = _candidates_and_sample, (CANDIDATES, f, seed, offset, return_log_probs, noise)
    else:
        op, op_args = _candidates_from_logits, (CANDIDATES, f, noise, shard_logits)
    check_transform_args(logit_scale, soft_cap, "logit_scale")
    keys, pairs = op(hidden, weight, *op_args, log_partition=True, vocab_start=vocab_start, num_valid=num_valid,
                     bias=bias, scale=logit_scale, soft_cap=soft_cap)  # fmt: skip
    if d2t is not None:
        check_d2t_arg(d2t, keys.device)
    fields = (
        step_fields(hidden, weight, d2t, CANDIDATES + 1, "all_gather", True, False, debug)
        if envs.LOCALARGMAX_DEBUG
        else None
    )
    end = vocab_end(weight, vocab_start, num_valid)
    gathered, pairs, ok, vocab_total = exchange_checked(
        keys, group, "all_gather", end, d2t, pairs, vocab_start=vocab_start, debug=fields
    )  # the group checked after the op has checked its arguments
    if batch == 0:
        empty = hidden.new_empty((0,), dtype=torch.int64)
        return (empty, hidden.new_empty((0,), dtype=torch.float32)) if return_log_probs else empty
    gathered, sampled = gathered[..., :CANDIDATES], gathered[..., CANDIDATES]
    greedy_ids, _ = merge_checked(gathered[..., 0], d2t, ok)  # the argmax, d2t applied, checked
    rows = torch.arange(batch, device=dev) + offset
    draft, logp, need = decide_rows(gathered, pairs, *f.filters, seed, rows, vocab_total, noise)
    # Rows with every filter off: the merge of the ranks' noised best keys, as lm_head_sample without filters.
    winner = winning_rank(sampled)
    best = sampled.gather(0, winner)[0]
    draft = torch.where(f.off, decode_keys(torch.where(best == 0, NO_ENTRY_STANDIN, best))[0], draft)
    if fallback == "error" and host_checks(need) and bool(need.any()):
        raise ValueError(
            f"{int(need.sum())} rows' allowed sets do not fit among the {CANDIDATES} candidates per rank "
            "(fallback='error'); pass fallback='gather' to recompute them from their gathered logits"
        )
    if fallback == "gather" and bool(need.any()):  # (refused above under capture / compile)
        idx = need.nonzero()[:, 0]
        if shard_logits is None:
            logits = gather_logits(
                hidden[idx], weight, vocab_start=vocab_start, num_valid=num_valid, bias=bias, group=group,
                scale=logit_scale, soft_cap=soft_cap,
            )  # fmt: skip
        else:
            local = shard_logits[idx].to(torch.float32)  # padded to the shard's rows, as every rank's
            padded = torch.cat([local, local.new_full((idx.numel(), weight.shape[0] - local.shape[1]), math.nan)], 1)
            logits = exchange_logits(padded, group, vocab_start=vocab_start, num_valid=local.shape[1])
        fb_noise = None if noise is None else VllmNoise(noise.seed[idx], noise.pos[idx])
        fb_ids, fb_logp = filter_and_sample(logits, *f.take(idx).filters, seed, rows[idx], fb_noise)
        draft, logp = draft.index_put((idx,), fb_ids), logp.index_put((idx,), fb_logp)
    elif fallback == "error" and not host_checks(need):
        torch._assert_async(~need.any(), "localargmax: a row's filtered set needs fallback='gather'")
    sampling = (f.t > 0) & (draft >= 0)
    ids = torch.where(sampling, draft, 0)
    if d2t is not None:
        ids = ids + d2t[ids]
    ids = torch.where(sampling, ids, greedy_ids)
    if not return_log_probs:
        return ids
    greedy_values = decode_keys(torch.where(gathered[..., 0] == 0, NO_ENTRY_STANDIN, gathered[..., 0]))[1]
    greedy_lp = log_probs_from_pairs(greedy_values.gather(0, winning_rank(gathered[..., 0]))[0], pairs)
    off_lp = log_probs_from_pairs(pairs[..., 0].gather(0, winner)[0], pairs, f.t)  # off rows: the sampled pairs
    return ids, torch.where(f.off, off_lp, torch.where(sampling, logp.to(torch.float32), greedy_lp))


def _candidates_and_sample(hidden, weight, kk, f: FilterRows, seed, offset, off_lp, noise, *, log_partition, **kw):
    """One rank's keys for the filtered exchange (the op :func:`filtered_sample`
    runs, always with ``log_partition``): its ``kk`` largest keys of ``x`` with its
    pair at ``T = 1`` (:func:`shard_topk`), then, in column ``kk``, its
    noised best key (:func:`shard_sample` at ``f.t``, the unfiltered step's
    key; 0 unless ``f.sample_off``: no row needs it). With ``off_lp`` the
    rows ``f.off`` carry the sampling kernel's pair instead (the unfiltered
    step's log-probabilities). ``noise``: vLLM's for that key, or None.
    Returns ``(keys [B, kk + 1], pairs [B, 2])``."""
    keys, pairs = shard_topk(hidden, weight, kk, log_partition=True, **kw)
    if not f.sample_off:
        return torch.cat([keys, keys.new_zeros(keys.shape[0], 1)], dim=1), pairs
    lse = off_lp or kw["scale"] != 1.0 or kw["soft_cap"] is not None
    out = shard_sample(hidden, weight, f.t, seed, offset, log_partition=lse, noise=noise, **kw)
    best, best_pairs = out if lse else (out, None)
    if off_lp:
        pairs = torch.where(f.off[:, None], best_pairs, pairs)
    return torch.cat([keys, best[:, None]], dim=1), pairs


def _candidates_from_logits(hidden, weight, kk, f: FilterRows, noise, logits, *, log_partition, vocab_start, **kw):
    """:func:`_candidates_and_sample`'s keys and pairs from this rank's given
    transformed ``logits`` ``[B, n]`` (ids ``vocab_start + j``): its ``kk``
    largest keys (the packed-key order: NaN first, ties to the smaller id;
    key 0 past ``n``), in column ``kk`` the key of its best vLLM score
    ``fl(x / T) + g`` (``x`` at ``T = 0``), and its pair ``(max,
    sum exp(x - max) - 1)`` at ``T = 1``."""
    x = logits.to(torch.float32)
    batch, n = x.shape
    keys = torch.zeros(batch, kk + 1, dtype=torch.int64, device=x.device)
    pairs = torch.zeros(batch, 2, dtype=torch.float32, device=x.device)
    pairs[:, 0] = -math.inf
    if n == 0:
        return keys, pairs
    ids = torch.arange(vocab_start, vocab_start + n, device=x.device).expand(batch, n)
    m = min(kk, n)
    keys[:, :m] = top_keys(pack_keys(x, ids), m, dim=1)
    ref, total = shard_partition(x)
    finite = ref.isfinite()
    pairs[:, 0], pairs[:, 1] = ref, torch.where(finite, (total - 1).clamp(min=0), 0.0).to(torch.float32)
    if f.sample_off:
        random = f.t > 0
        g = vllm_gumbel_noise(noise.seed[:, None], noise.pos[:, None], ids)
        score = torch.where(random[:, None], x / torch.where(random, f.t, 1.0).to(torch.float32)[:, None] + g, x)
        keys[:, kk] = top_keys(pack_keys(score, ids), 1, dim=1)[:, 0]
    return keys, pairs


def _capturing() -> bool:
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
