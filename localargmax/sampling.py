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

from ._validation import MAX_TOPK, FilterRows, check_seed_offset, filter_rows, host_checks
from .collective import Group, exchange_logits, logits_payload_length
from .engine import gather_logits, log_probs_from_pairs, merge_checked, run_step, winning_rank
from .ops import decode_keys, shard_sample, shard_topk
from .packed_key import SIGN_FLIP
from .plan import StepPlan
from .vllm_gumbel import VllmNoise, check_noise, vllm_gumbel_noise

CANDIDATES = MAX_TOPK
"""Candidate keys per row each rank sends (its top-K); with its noised best
key (for rows with every filter off) the step's payload is
``payload_length(B, CANDIDATES + 1, log_probs=True)`` words."""

FALLBACKS = ("gather", "error")

fallback_payload_length = logits_payload_length
"""Int64 words one rank sends in the fallback gather
(:func:`localargmax.collective.logits_payload_length`: ``6 + ceil(n_rows·shard_rows / 2)``)."""

_M0, _M1, _W0, _W1, _MASK = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF
_G_MAX = -math.log(-math.log((2.0**32 - 0.5) / 2.0**32))
"""The largest Gumbel noise the 32-bit Philox word can give (u = (2**32 - 0.5) / 2**32): about 22.87 (33 ln 2)."""
_G_BOUND = _G_MAX + 1e-5
"""Above every float32 noise value (``float32(_G_MAX)`` is within 1e-6 of it)."""
_DENSE_NOISE = 1 / 8
"""Share of set entries from which :func:`_add_noise_where` evaluates the noise everywhere."""
_HEAD = 64
"""Sorted positions whose noise gives the fallback's first bound (:func:`_gumbel_argmax`)."""
_Z_RTOL = 1e-4
"""Relative error allowed to the log-partition pairs' total (measured <= 2e-6: DESIGN.md, "Log-probabilities")."""
_NO_ENTRY_STANDIN = 0x007FFFFFFFFFFFFF  # a decodable key (-inf at id 0) in place of key 0 before decode_keys


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
    _, gathered, pairs, ok, vocab_total = run_step(
        op, op_args, hidden, weight,
        vocab_start=vocab_start, num_valid=num_valid, bias=bias, d2t=d2t, group=group, reduce="all_gather",
        log_probs=True, scale=logit_scale, soft_cap=soft_cap, k=CANDIDATES + 1, vocab_total=True, debug=debug,
    )  # fmt: skip
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
    draft = torch.where(f.off, decode_keys(torch.where(best == 0, _NO_ENTRY_STANDIN, best))[0], draft)
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
    greedy_values = decode_keys(torch.where(gathered[..., 0] == 0, _NO_ENTRY_STANDIN, gathered[..., 0]))[1]
    greedy_lp = log_probs_from_pairs(greedy_values.gather(0, winning_rank(gathered[..., 0]))[0], pairs)
    off_lp = log_probs_from_pairs(pairs[..., 0].gather(0, winner)[0], pairs, f.t)  # off rows: the sampled pairs
    return ids, torch.where(f.off, off_lp, torch.where(sampling, logp.to(torch.float32), greedy_lp))


def _candidates_and_sample(hidden, weight, kk, f: FilterRows, seed, offset, off_lp, noise, *, log_partition, **kw):
    """One rank's keys for the filtered exchange (the op :func:`run_step` runs,
    always with ``log_partition``): its ``kk`` largest keys of ``x`` with its
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
    keys[:, :m] = (pack_keys(x, ids) ^ SIGN_FLIP).topk(m, dim=1).values ^ SIGN_FLIP
    ref = x.max(dim=1).values
    finite = ref.isfinite()
    xd = x.to(torch.float64)
    others = (torch.exp(xd - torch.where(finite, ref, 0.0).to(torch.float64)[:, None]).sum(dim=1) - 1).clamp(min=0)
    pairs[:, 0], pairs[:, 1] = ref, torch.where(finite, others, 0.0).to(torch.float32)
    if f.sample_off:
        random = f.t > 0
        g = vllm_gumbel_noise(noise.seed[:, None], noise.pos[:, None], ids)
        score = torch.where(random[:, None], x / torch.where(random, f.t, 1.0).to(torch.float32)[:, None] + g, x)
        keys[:, kk] = (pack_keys(score, ids) ^ SIGN_FLIP).max(dim=1).values ^ SIGN_FLIP
    return keys, pairs


def pack_keys(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Packed keys (DESIGN.md, "The packed key") of float32 ``values`` at
    global ``ids`` (int64 ``<= 0xFFFFFFFE``), elementwise: the kernels'
    ``pack_key`` in tensor arithmetic (every NaN largest, -0.0 as +0.0)."""
    u = values.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    u = torch.where(u == 0x80000000, 0, u)
    ordered = torch.where(u >= 0x80000000, u ^ 0xFFFFFFFF, u | 0x80000000)
    ordered = torch.where(values.isnan(), 0xFFFFFFFF, ordered)
    high = torch.where(ordered >= 0x80000000, ordered - (1 << 32), ordered)  # as int32, so the shift stays in int64
    return (high << 32) | (0xFFFFFFFF - ids)


def _capturing() -> bool:
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def decide_rows(gathered, pairs, t, k, p, mp, seed, rows, vocab_total=None, noise=None):
    """From the merged candidates and every rank's pair, per row: the sampled
    draft id (-1 where the row is greedy, special, not decided or has every
    filter off), its log-probability under the filtered distribution, and
    whether the row needs the fallback. All from values every rank holds, in
    the same order. Rows with every filter off never need it: the ranks'
    noised best keys decide them (:func:`filtered_sample`). ``vocab_total``
    (the end of the valid vocabulary, an int or a tensor; None: unknown)
    bounds the outsiders' count for top-p at ``T > 1``. ``noise``: vLLM's
    (:func:`vllm_scores`), else the Philox noise of (``seed``, ``rows``)."""
    tp, batch, kk = gathered.shape
    cand = (gathered.permute(1, 0, 2).reshape(batch, tp * kk) ^ SIGN_FLIP).sort(dim=1, descending=True).values
    cand = cand ^ SIGN_FLIP  # [B, N], unsigned descending: the merged order
    valid = cand != 0
    ids, x = decode_keys(torch.where(valid, cand, _NO_ENTRY_STANDIN))
    frontier = gathered[:, :, kk - 1]  # each rank's K-th key: its ids beyond the candidates lie below it
    full = (frontier != 0).any(dim=0)  # some rank may hold ids that are not candidates
    fmax = ((frontier ^ SIGN_FLIP).max(dim=0).values ^ SIGN_FLIP)[:, None]
    prefix = valid & ((cand ^ SIGN_FLIP) >= (fmax ^ SIGN_FLIP))  # the exact head of the global order
    n_prefix = prefix.sum(dim=1)
    x = torch.where(valid, x.to(torch.float64), -math.inf)
    special = ~x[:, 0].isfinite()  # NaN / +inf / all -inf: the argmax (as lm_head_sample)
    tt = torch.where(t > 0, t, 1.0).to(torch.float64)[:, None]
    y = x / tt
    a = y[:, :1]
    w = torch.where(valid, torch.exp(y - a), 0.0)
    pos = torch.arange(tp * kk, device=cand.device)[None]
    y_front = y.gather(1, (n_prefix - 1).clamp(min=0)[:, None])  # the largest value a non-candidate can have
    k_on, p_on, mp_on = k > 0, p < 1, mp > 0
    thr = a + torch.log(torch.where(mp_on, mp, 1.0))[:, None]
    keep = valid & (~mp_on[:, None] | (y >= thr)) & (~k_on[:, None] | (pos < k[:, None]))
    mp_fits = ~full | (y_front[:, 0] < thr[:, 0])
    k_fits = ~full | (k <= n_prefix)
    restricted = (mp_on & mp_fits) | (k_on & k_fits)  # the min-p / top-k set is a known prefix
    # Partition of the allowed set before top-p: exact when restricted or no rank is full; else bounds from
    # the pairs (T = 1) and the frontier, a = exp(x - x_max) <= a_front for every outsider (n of them at most):
    # T <= 1: tail(T) <= a_front**(1/T - 1) * tail(1); T > 1: tail(T) <= n * a_front**(1/T), and by the power
    # mean, <= n**(1 - 1/T) * tail(1)**(1/T); T >= 1: tail(T) >= tail(1) (a**(1/T) >= a).
    z_known = (w * keep).sum(dim=1)
    xa = x[:, :1]
    ref, others = pairs[..., 0].to(torch.float64), pairs[..., 1].to(torch.float64)
    z1 = ((others + (ref > -math.inf)) * torch.where(ref == xa[:, 0], 1.0, torch.exp(ref - xa[:, 0]))).sum(dim=0)
    pre1 = torch.where(prefix, torch.exp(x - xa), 0.0).sum(dim=1)
    pre_t = (w * prefix).sum(dim=1)
    tail_hi1 = (z1 * (1 + _Z_RTOL) - pre1).clamp(min=0)
    tail_lo1 = (z1 * (1 - _Z_RTOL) - pre1).clamp(min=0)
    t1 = tt[:, 0]
    a_front = torch.exp(x.gather(1, (n_prefix - 1).clamp(min=0)[:, None])[:, 0] - xa[:, 0])  # exp(x_front - x_max)
    if vocab_total is None:
        hot = torch.full_like(tail_hi1, math.inf)
    else:
        n_out = (vocab_total - n_prefix).clamp(min=0).to(torch.float64)
        e = 1 / t1
        hot = torch.minimum(n_out * a_front**e, n_out ** (1 - e) * tail_hi1**e) * (1 + _Z_RTOL)
    tail_hi = torch.where(t1 <= 1, a_front ** (1 / t1 - 1) * tail_hi1, hot)
    tail_lo = torch.where(t1 >= 1, tail_lo1, 0.0)
    unrestricted = ~(mp_on | k_on)
    none_on = unrestricted & ~p_on
    z_lo = torch.where(restricted | ~full, z_known, pre_t + tail_lo)
    z_hi = torch.where(restricted | ~full, z_known, pre_t + tail_hi)
    member = torch.where((restricted | ~full | none_on)[:, None], keep, prefix)
    mass = w * member
    before = mass.cumsum(dim=1) - mass  # mass strictly before each candidate (vLLM: kept iff < p)
    keep_lo = before < (p * z_lo)[:, None]
    keep_hi = before < (p * z_hi)[:, None]
    p_fits = restricted | ~full | (((keep_lo & member) == (keep_hi & member)).all(dim=1) & (pre_t >= p * z_hi))
    allowed = member & (~p_on[:, None] | keep_lo | (pos == 0))
    if noise is None:
        g = gumbel_noise(seed, rows[:, None], ids)
        best = torch.where(allowed, y + g.to(torch.float64), -math.inf).argmax(dim=1, keepdim=True)
    else:
        best = vllm_scores(x.to(torch.float32), t, ids, allowed, noise)
    logp = (y.gather(1, best)[:, 0] - a[:, 0]) - torch.log((w * allowed).sum(dim=1))
    need = (mp_on | k_on) & ~restricted
    need |= p_on & ~p_fits
    need &= (t > 0) & ~special
    draft = torch.where((t > 0) & ~special & ~need & ~none_on, ids.gather(1, best)[:, 0], -1)
    return draft, logp, need


def filter_and_sample(logits, t, k, p, mp, seed, rows, noise=None):
    """vLLM 0.34's filters on full rows, then Gumbel-max with the kernels'
    noise: temperature, min-p (``y >= max(y) + log(min_p)``), top-k (exactly
    ``k`` ids, ties to the smaller id), top-p over what those kept (the
    smallest prefix, in descending order, of mass ``>= p``; at least one id).

    Args:
        logits: ``[n, V]`` float32 transformed logits, ``V >= 1``; NaN marks
            ids outside the vocabulary (gaps between shards), which are never
            sampled while a row has an entry that is not NaN (every row the
            step sends has: its shards hold ``num_valid >= 1`` ids in all).
        t: ``[n]`` float32 temperatures ``> 0``; k ``[n]`` int64 (``<= 0``
            off); p, mp ``[n]`` float64; seed; rows ``[n]`` int64 Philox
            subsequences; noise: vLLM's for these rows (:func:`vllm_scores`:
            the rows are sorted, the noise evaluated on every kept id), or
            None: the Philox noise.

    Returns:
        ``(ids [n] int64, log_probs [n] float64)`` under the filtered distribution.

    Rows without top-k and top-p (min-p alone, or no filter) need no order:
    they skip the sort (:func:`_filter_by_id`), with the same result.
    """
    if noise is not None:
        y, ids, keep, a = filter_sorted(logits, t, k, p, mp)
        best = vllm_scores(logits.gather(1, ids), t, ids, keep, noise)
        w = torch.where(keep, torch.exp(y - a), 0.0)
        return ids.gather(1, best)[:, 0], (y.gather(1, best) - a)[:, 0] - torch.log(w.sum(dim=1))
    unsorted = ((k <= 0) | (k >= logits.shape[1])) & (p >= 1)
    if bool(unsorted.any()) and not bool(unsorted.all()):
        out_ids = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
        out_lp = torch.empty(logits.shape[0], dtype=torch.float64, device=logits.device)
        for part in (unsorted, ~unsorted):
            out_ids[part], out_lp[part] = filter_and_sample(
                logits[part], t[part], k[part], p[part], mp[part], seed, rows[part]
            )
        return out_ids, out_lp
    if bool(unsorted.all()):
        y, keep, a = _filter_by_id(logits, t, mp)
        best = _gumbel_argmax_by_id(y, keep, seed, rows)  # positions are ids
        chosen = best[:, 0]
    else:
        y, ids, keep, a = filter_sorted(logits, t, k, p, mp)
        best = _gumbel_argmax(y, ids, keep, seed, rows)
        chosen = ids.gather(1, best)[:, 0]
    w = torch.where(keep, torch.exp(y - a), 0.0)
    return chosen, (y.gather(1, best) - a)[:, 0] - torch.log(w.sum(dim=1))


def vllm_scores(x, t, ids, allowed, noise: VllmNoise):
    """The position of vLLM's sample among a row's entries: the largest
    ``fl(fl(x / T) + g)`` in float32 over ``allowed`` (``g`` vLLM's noise at
    (``noise.seed[b]``, ``noise.pos[b]``, ``ids``): its ``gumbel_sample``
    after the filters set the others to -inf), ties to the smaller id, as
    vLLM's argmax takes the first. ``x`` ``[n, m]`` float32 transformed
    logits, ``t`` ``[n]`` float32 ``> 0``, ``ids`` ``[n, m]`` int64 (``>= 0``),
    ``allowed`` ``[n, m]`` bool, at least one per row. Returns ``[n, 1]``
    int64 positions."""
    g = vllm_gumbel_noise(noise.seed[:, None], noise.pos[:, None], ids)
    score = torch.where(allowed, x / t.to(torch.float32)[:, None] + g, -math.inf)
    tied = score == score.max(dim=1, keepdim=True).values
    first = torch.where(tied, ids, torch.iinfo(torch.int64).max).min(dim=1, keepdim=True).values
    return (tied & (ids == first)).to(torch.uint8).argmax(dim=1, keepdim=True)


def _tempered(logits, t):
    """``y = logits / t`` in float64, NaN (outside the vocabulary) as -inf."""
    return torch.nan_to_num(logits.to(torch.float64), nan=-math.inf) / t.to(torch.float64)[:, None]


def _min_p_keeps(y, a, mp):
    """min-p's mask: ``y >= a + log(min_p)`` (``a`` the row's maximum), every id where ``min_p = 0``."""
    return (y >= a + torch.log(torch.where(mp > 0, mp, 1.0))[:, None]) | (mp <= 0)[:, None]


def _filter_by_id(logits, t, mp):
    """The rows of :func:`filter_and_sample` whose only filter is min-p (or
    none), in id order: ``(y [n, V] float64 tempered values, keep [n, V] the
    allowed set, a [n, 1] the rows' maxima)``."""
    y = _tempered(logits, t)
    a = y.max(dim=1, keepdim=True).values
    return y, ~logits.isnan() & _min_p_keeps(y, a, mp), a


def filter_sorted(logits, t, k, p, mp):
    """The rows of :func:`filter_and_sample` sorted descending (stable):
    ``(ys [n, V] float64 tempered values, ids [n, V] their ids, keep [n, V]
    the allowed set, a [n, 1] the rows' maxima)``."""
    vocab = logits.shape[1]
    order = torch.sort(_tempered(logits, t), dim=1, descending=True, stable=True)  # ties: the smaller id first
    ys, ids = order.values, order.indices
    a = ys[:, :1]
    pos = torch.arange(vocab, device=logits.device)[None]
    keep = (~logits.isnan()).gather(1, ids) & (pos < torch.where(k > 0, k, vocab)[:, None]) & _min_p_keeps(ys, a, mp)
    w = torch.where(keep, torch.exp(ys - a), 0.0)
    before = w.cumsum(dim=1) - w
    keep &= (before < (p * w.sum(dim=1))[:, None]) | (p >= 1)[:, None] | (pos == 0)
    return ys, ids, keep, a


def _gumbel_argmax(ys, ids, keep, seed, rows):
    """``argmax(where(keep, ys + g, -inf), dim=1, keepdim=True)`` with the
    noise ``g = gumbel_noise(seed, rows[:, None], ids)`` evaluated only where
    it can matter: at the first ``_HEAD`` positions, whose best score ``s``
    bounds the row's maximum from below, and at the kept positions with
    ``ys + _G_BOUND >= s`` (the others score ``fl(ys + g) <= fl(ys +
    _G_BOUND) < s``: below the maximum, so -inf leaves the first maximum
    where it was). ``ys`` [n, V] float64, ``ids`` [n, V] int64, ``keep`` [n, V]
    bool, ``rows`` [n] int64; returns [n, 1] int64 positions."""
    h = min(_HEAD, ys.shape[1])
    score = torch.full_like(ys, -math.inf)
    g = gumbel_noise(seed, rows[:, None], ids[:, :h]).to(torch.float64)
    score[:, :h] = torch.where(keep[:, :h], ys[:, :h] + g, -math.inf)
    rest = keep & (ys + _G_BOUND >= score[:, :h].max(dim=1, keepdim=True).values)
    rest[:, :h] = False
    return _add_noise_where(score, rest, ys, ids, seed, rows).argmax(dim=1, keepdim=True)


def _add_noise_where(score, mask, y, ids, seed, rows):
    """``score`` with ``y + g`` where ``mask`` (``g`` at ``ids``, or at the
    column index when ``ids`` is None): dense when ``_DENSE_NOISE`` of the
    entries or more is set (the noise op costs less than indexing then), else at the
    set entries only. The same values either way."""
    if int(mask.sum()) >= _DENSE_NOISE * mask.numel():
        cols = torch.arange(y.shape[1], device=y.device)[None] if ids is None else ids
        return torch.where(mask, y + gumbel_noise(seed, rows[:, None], cols).to(torch.float64), score)
    r, c = mask.nonzero(as_tuple=True)
    score[r, c] = y[r, c] + gumbel_noise(seed, rows[r], c if ids is None else ids[r, c]).to(torch.float64)
    return score


def _gumbel_argmax_by_id(y, keep, seed, rows):
    """:func:`_gumbel_argmax` on rows in id order (``y`` [n, V] float64 by
    id, ``keep`` [n, V]): the noise only where an id can win (the head: the
    ``_HEAD`` largest allowed values), and among equal best scores the id the
    sorted order puts first (the larger value, then the smaller id). Returns
    [n, 1] int64 ids."""
    head = torch.where(keep, y, -math.inf).topk(min(_HEAD, y.shape[1]), dim=1)
    g = gumbel_noise(seed, rows[:, None], head.indices).to(torch.float64)
    head_score = torch.where(keep.gather(1, head.indices), head.values + g, -math.inf)
    score = torch.full_like(y, -math.inf).scatter_(1, head.indices, head_score)
    rest = keep & (y + _G_BOUND >= head_score.max(dim=1, keepdim=True).values)
    rest.scatter_(1, head.indices, False)
    score = _add_noise_where(score, rest, y, None, seed, rows)
    tied = score == score.max(dim=1, keepdim=True).values
    first = tied & (y == torch.where(tied, y, -math.inf).max(dim=1, keepdim=True).values)
    return first.to(torch.uint8).argmax(dim=1, keepdim=True)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a * b`` for ``a`` and ``b`` in [0, 2**32),
    from 16-bit halves of ``a`` so no int64 product overflows (9 tensor ops,
    in place where a temporary allows)."""
    p_lo, p_hi = b * (a & 0xFFFF), b * (a >> 16)  # < 2**48 each
    hi = (p_lo >> 16).add_(p_hi).bitwise_right_shift_(16)
    lo = (p_hi & 0xFFFF).bitwise_left_shift_(16).add_(p_lo).bitwise_and_(_MASK)
    return hi, lo


def _philox(seed: int, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Philox 4x32-10's first output word at counter ``(id, row)``, key ``seed`` (int64, < 2**32)."""
    c0, c1, c2, c3 = ids & _MASK, ids >> 32, rows & _MASK, (rows >> 32) & _MASK  # rows: uint64 bits
    k0, k1 = seed & _MASK, (seed >> 32) & _MASK
    for _ in range(9):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1.bitwise_xor_(c1).bitwise_xor_(k0), lo1, hi0.bitwise_xor_(c3).bitwise_xor_(k1), lo0
        k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return _mulhilo(_M1, c2)[0].bitwise_xor_(c1).bitwise_xor_(k0)  # round 10: only x0 is used


def gumbel_noise(seed: int, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The Gumbel noise of the sampling kernels at any (row, global id):
    Philox 4x32-10 with key ``seed`` and counter ``(id, row)``, ``u = (x0 +
    0.5) / 2**32``, ``g = float32(-log(-log(u)))`` (``gumbel_noise`` in
    csrc/common/philox.h). On the CPU the op ``localargmax::gumbel_noise``
    runs that function itself; on other devices it is evaluated in int64
    tensor arithmetic (one graph under torch.compile).

    Args:
        seed: int, ``0 <= seed < 2**63``.
        rows: int64 Philox subsequences ``offset + b``, read as uint64 (the
            kernels' ``offset + b`` past ``2**63 - 1`` is the int64 that
            wraps to negative), broadcastable with ``ids``.
        ids: int64 global (draft) vocabulary ids ``>= 0``, on the device of ``rows``.

    Returns:
        float32 noise of the broadcast shape, on their device. On the CPU
        bit-identical to the kernels'; elsewhere too, but where ``log`` of
        float64 differs by an ulp across libraries and that ulp crosses a
        float32 rounding boundary (about 2**-28 of values).

    Raises:
        ValueError: a seed out of range, shapes that do not broadcast,
            tensors on two devices; on the CPU a negative id.
        TypeError: rows or ids not int64.
    """
    check_seed_offset(seed, 0)
    if not isinstance(rows, torch.Tensor) or not isinstance(ids, torch.Tensor):
        raise TypeError(f"rows and ids must be int64 tensors, got {type(rows).__name__} and {type(ids).__name__}")
    if rows.dtype != torch.int64 or ids.dtype != torch.int64:
        raise TypeError(f"rows and ids must be int64, got {rows.dtype} and {ids.dtype}")
    if rows.device != ids.device:
        raise ValueError(f"rows and ids must be on one device, got {rows.device} and {ids.device}")
    try:
        rows, ids = torch.broadcast_tensors(rows, ids)
    except RuntimeError as e:
        raise ValueError(f"rows {tuple(rows.shape)} and ids {tuple(ids.shape)} must broadcast: {e}") from None
    if rows.device.type == "cpu":
        return torch.ops.localargmax.gumbel_noise(seed, rows.contiguous(), ids.contiguous())
    return _gumbel(_philox(seed, rows, ids))


def _gumbel(x0: torch.Tensor) -> torch.Tensor:
    """float32(-log(-log((x0 + 0.5) / 2**32))) of the int64 Philox words ``x0``, in float64."""
    u = x0.to(torch.float64).add_(0.5).mul_(1.0 / 2.0**32)
    return u.log_().neg_().log_().neg_().to(torch.float32)
