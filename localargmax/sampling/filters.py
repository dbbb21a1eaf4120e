"""Per-row filters of the sampling steps: vLLM's top-k / top-p / min-p on a
row's candidates or its gathered logits, and Gumbel-max over the allowed set
(DESIGN.md, "Filtered sampling"). :func:`decide_rows` decides from the merged
candidates and every rank's log-partition pair which rows the candidates
settle; :func:`filter_and_sample` samples the rest from their gathered
logits."""

from __future__ import annotations

import math

import torch

from .._validation import VllmNoise
from ..ops import decode_keys
from ..packed_key import NO_ENTRY_STANDIN, SIGN_FLIP
from .logprobs import log_prob_of
from .noise import G_BOUND, gumbel_noise, vllm_gumbel_noise

_DENSE_NOISE = 1 / 8
"""Share of set entries from which :func:`_add_noise_where` evaluates the noise everywhere."""
_HEAD = 64
"""Sorted positions whose noise gives the fallback's first bound (:func:`_gumbel_argmax`)."""
_Z_RTOL = 1e-4
"""Relative error allowed to the log-partition pairs' total (measured <= 2e-6: DESIGN.md, "Log-probabilities")."""


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
    ids, x = decode_keys(torch.where(valid, cand, NO_ENTRY_STANDIN))
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
    logp = log_prob_of(y.gather(1, best)[:, 0], a[:, 0], (w * allowed).sum(dim=1))
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
        return ids.gather(1, best)[:, 0], log_prob_of(y.gather(1, best)[:, 0], a[:, 0], w.sum(dim=1))
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
    return chosen, log_prob_of(y.gather(1, best)[:, 0], a[:, 0], w.sum(dim=1))


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
    ``ys + G_BOUND >= s`` (the others score ``fl(ys + g) <= fl(ys +
    G_BOUND) < s``: below the maximum, so -inf leaves the first maximum
    where it was). ``ys`` [n, V] float64, ``ids`` [n, V] int64, ``keep`` [n, V]
    bool, ``rows`` [n] int64; returns [n, 1] int64 positions."""
    h = min(_HEAD, ys.shape[1])
    score = torch.full_like(ys, -math.inf)
    g = gumbel_noise(seed, rows[:, None], ids[:, :h]).to(torch.float64)
    score[:, :h] = torch.where(keep[:, :h], ys[:, :h] + g, -math.inf)
    rest = keep & (ys + G_BOUND >= score[:, :h].max(dim=1, keepdim=True).values)
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
    rest = keep & (y + G_BOUND >= head_score.max(dim=1, keepdim=True).values)
    rest.scatter_(1, head.indices, False)
    score = _add_noise_where(score, rest, y, None, seed, rows)
    tied = score == score.max(dim=1, keepdim=True).values
    first = tied & (y == torch.where(tied, y, -math.inf).max(dim=1, keepdim=True).values)
    return first.to(torch.uint8).argmax(dim=1, keepdim=True)
