"""The float64 references (DESIGN.md, "Semantics") and the near-tie rule.

``ref_logits`` sums over k in a fixed order with elementwise float64 ops, so
identical weight rows give bit-identical logits wherever they sit and IEEE
specials (0 * inf, inf - inf) come out as IEEE says; it is independent of
``localargmax.reference`` (which tests/test_reference.py checks against it).
"""

from __future__ import annotations

import math

import torch

FLOAT32_UNIT_ROUNDOFF = 2.0**-24


def ref_logits(hidden, weight, bias=None) -> torch.Tensor:
    """``[B, V]`` float64 logits of the full, unsharded problem (fixed summation order)."""
    h = hidden.detach().cpu().double()
    w = weight.detach().cpu().double()
    logits = torch.zeros((h.shape[0], w.shape[0]), dtype=torch.float64)
    for k in range(h.shape[1]):
        logits += h[:, k : k + 1] * w[:, k]
    if bias is not None:
        logits = logits + bias.detach().cpu().double()
    return logits


def ref_argmax(hidden, weight, bias=None, d2t=None) -> torch.Tensor:
    """``[B]`` int64: torch.argmax of :func:`ref_logits`, then ``k + d2t[k]``."""
    ids = ref_logits(hidden, weight, bias).argmax(dim=1)
    if d2t is not None:
        ids = ids + d2t.cpu()[ids]
    return ids


def ref_topk(logits64: torch.Tensor, k: int) -> torch.Tensor:
    """Per row: the k best indices by (NaN first, larger value, smaller index)."""
    rows = []
    for row in logits64.tolist():
        order = sorted(range(len(row)), key=lambda v: (0, 0, v) if math.isnan(row[v]) else (1, -row[v], v))
        rows.append(order[:k])
    return torch.tensor(rows, dtype=torch.int64).view(len(rows), k)


def error_bound(hidden, weight, bias=None) -> torch.Tensor:
    """``[B, V]`` bound on |float32-accumulated logit - exact logit|: the worst
    case of an H-term float32 dot product (any summation order) plus the bias
    add, gamma = (H + 2) * u applied to sum_k |h_k w_k| + |bias|."""
    gamma = (hidden.shape[1] + 2) * FLOAT32_UNIT_ROUNDOFF
    mag = hidden.detach().cpu().double().abs() @ weight.detach().cpu().double().abs().T
    if bias is not None:
        mag = mag + bias.detach().cpu().double().abs()
    return gamma / (1 - gamma) * mag


def reference_logits_and_error(hidden, weight, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(:func:`ref_logits`, :func:`error_bound` with 0 at non-finite logits):
    compute it once and pass it as ``reference=`` to check several results."""
    logits = ref_logits(hidden, weight, bias)
    err = error_bound(hidden, weight, bias)
    return logits, torch.where(torch.isfinite(logits), err, torch.zeros_like(err))


def judge(ids: torch.Tensor, logits: torch.Tensor, err: torch.Tensor):
    """Judge draft ``ids [B]`` against float64 ``logits [B, V]`` and their error
    bound. Returns boolean ``[B]`` masks ``(clear, wrong, too_far)``: ``clear``
    rows have a winner beyond the error bound (or are decided by NaN / +inf /
    all -inf, rules 1-3); ``wrong`` clear rows with another id; ``too_far``
    near-tie rows whose id's logit lies further below the maximum than the
    float32 error bound allows."""
    batch = logits.shape[0]
    rows = torch.arange(batch)
    ref = logits.argmax(dim=1)
    best = logits[rows, ref]
    decided = torch.isnan(logits).any(dim=1) | (best == math.inf) | (logits == -math.inf).all(dim=1)
    upper = logits + err
    upper[rows, ref] = -math.inf
    clear = decided | (best - err[rows, ref] > upper.max(dim=1).values)
    ours = logits[rows, ids]
    too_far = (~clear) & ~(best - ours <= err[rows, ref] + err[rows, ids])
    return clear, clear & (ids != ref), too_far


def check_against_reference(
    ids: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    *,
    min_clear_fraction: float = 0.9,
    context: str = "",
    reference: tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """Compare ``ids`` with the float64 reference by :func:`judge`: clear rows
    must match exactly, near-tie rows lie within the error bound. At least
    ``min_clear_fraction`` of the rows (give or take one) must be clear, so the
    check never passes vacuously."""
    ids = ids.cpu()
    logits, err = reference if reference is not None else reference_logits_and_error(hidden, weight, bias)
    batch, vocab = logits.shape
    assert ids.shape == (batch,), f"{context}: ids shape {tuple(ids.shape)} != ({batch},)"
    draft_ids = ids
    if d2t is not None:  # ids are target ids: map them back (build_d2t targets are unique)
        inverse = {int(t): k for k, t in enumerate((torch.arange(d2t.shape[0]) + d2t).tolist())}
        bad = [int(i) for i in ids if int(i) not in inverse]
        assert not bad, f"{context}: ids {bad[:5]} are not targets of any draft id"
        draft_ids = torch.tensor([inverse[int(i)] for i in ids], dtype=torch.int64)
    if batch == 0:
        return
    in_range = (draft_ids >= 0) & (draft_ids < vocab)
    assert bool(in_range.all()), f"{context}: ids out of range: {ids.tolist()[:10]}"
    clear, wrong, too_far = judge(draft_ids, logits, err)
    assert not bool(wrong.any()), (
        f"{context}: {int(wrong.sum())} clear-winner rows differ from the float64 reference; rows "
        f"{wrong.nonzero().flatten().tolist()[:10]}: got {draft_ids[wrong].tolist()[:10]}, "
        f"want {logits.argmax(dim=1)[wrong].tolist()[:10]}"
    )
    assert not bool(too_far.any()), (
        f"{context}: rows {too_far.nonzero().flatten().tolist()[:10]} picked an id whose float64 logit is "
        f"further below the maximum than the float32 error bound allows"
    )
    n_clear = int(clear.sum())
    assert n_clear + 1 >= min_clear_fraction * batch, (
        f"{context}: only {n_clear} of {batch} rows have a clear winner (test data too tie-prone to be a real check)"
    )


def min_gap(hidden, weight, bias=None) -> float:
    """Smallest (top-1 - top-2) / |top-1| over rows of the float64 logits."""
    top = ref_logits(hidden, weight, bias).topk(2, dim=1).values
    return float(((top[:, 0] - top[:, 1]) / top[:, 0].abs()).min())


def ref_transform(logits64: torch.Tensor, scale: float = 1.0, soft_cap: float | None = None) -> torch.Tensor:
    """vLLM's logit transform in float64: soft-cap ``tanh(x / c) * c``, then scale."""
    x = logits64
    if soft_cap is not None:
        x = torch.tanh(x / soft_cap) * soft_cap
    return x * scale


def ref_log_probs(logits64: torch.Tensor, scale=1.0, soft_cap=None, temperature=None) -> torch.Tensor:
    """``[B, V]`` float64 ``y - logsumexp(y)``, ``y = x / T``, of the transformed
    logits ``x`` over the full unpadded vocabulary (``T`` per row; ``T == 0``
    rows and ``None`` use 1): vLLM's formula. A NaN makes the whole row NaN,
    an all -inf row is NaN, and beside a +inf logit (NaN) the others are -inf
    (torch.logsumexp is +inf there; torch.log_softmax would make the row NaN)."""
    x = ref_transform(logits64, scale, soft_cap)
    if temperature is not None:
        t = temperature.detach().cpu().double()
        x = x / torch.where(t > 0, t, 1.0)[:, None]
    return x - torch.logsumexp(x, dim=1, keepdim=True)


def ref_log_odds(logits64: torch.Tensor, ids: torch.Tensor, scale=1.0, soft_cap=None, temperature=None):
    """``[B]`` float64 ``-log Σ_{z ≠ a} exp((x_z - x_a) / T)`` of the
    transformed logits ``x`` at the entries ``a = ids`` (the argmax), summed
    directly (no ``total - 1``); ``T <= 0`` rows and ``None`` use 1. NaN where
    ``x_a`` is NaN or infinite, ``+inf`` where every other entry is ``-inf``."""
    x = ref_transform(logits64, scale, soft_cap)
    t = torch.ones(x.shape[0], dtype=torch.float64)
    if temperature is not None:
        t = temperature.detach().cpu().double()
        t = torch.where(t > 0, t, 1.0)
    top = x.gather(1, ids[:, None])
    d = (x - top) / t[:, None]
    d.scatter_(1, ids[:, None], -math.inf)  # leave the argmax out
    d = torch.where(x == -math.inf, -math.inf, d)
    return torch.where(top[:, 0].isfinite(), -torch.logsumexp(d, dim=1), math.nan)


def log_prob_tolerance(hidden, weight, bias=None, scale=1.0, soft_cap=None, temperature=None, tp=1) -> float:
    """A bound on |float32 fused log-probability - float64 reference|: each
    logit is off by at most :func:`error_bound` (times the scale; the soft-cap
    is 1-Lipschitz), so ``x - logsumexp(x)`` by at most twice the largest of
    those (divided by the smallest T), plus the float32 rounding of the
    transform, the exponentials and the sums (a sequential sum of n terms:
    relative error (n - 1) u; the CPU kernel sums 64-row tiles and then the
    tiles, the merge the ranks) and of the final subtraction (|value| u)."""
    err = float(error_bound(hidden, weight, bias).max()) if hidden.shape[0] and weight.shape[0] else 0.0
    x = ref_transform(ref_logits(hidden, weight, bias), scale, soft_cap)
    finite = x[torch.isfinite(x)]
    mag = float(finite.abs().max()) if finite.numel() else 0.0
    t_min = 1.0
    if temperature is not None and bool((temperature > 0).any()):
        t_min = min(1.0, float(temperature[temperature > 0].min()))
    n_terms = 64 + weight.shape[0] // 64 + tp + 8
    u = FLOAT32_UNIT_ROUNDOFF
    return (2 * err * scale + 4 * mag * u) / t_min + 2 * n_terms * u + 1e-7
