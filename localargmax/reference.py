"""The float64 reference of DESIGN.md, "Semantics": the full, un-sharded logits
in float64, then ``torch.argmax``'s rules. Used by the tests and by the
benchmark's ``agree`` column.

A float64 matrix multiply (MKL, OpenBLAS) may round identical rows 1 ulp
apart depending on where they sit in its blocks, which would break exact ties
the wrong way. So the matmul only finds the candidates; every row whose
near-maximum is shared by several entries is decided by correctly rounded sums
(``math.fsum``), which do not depend on the order of the terms: identical
rows tie exactly and the smallest index wins (rule 1).
"""

from __future__ import annotations

import math

import torch

_CANDIDATE_RTOL = 1e-9  # far above float64 matmul error, far below float32 gaps


def reference_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, V]`` float64 logits of the full ``[V, H]`` lm_head (on the CPU;
    rounded by the BLAS, see the module docstring)."""
    logits = hidden.detach().cpu().double() @ weight.detach().cpu().double().T
    if bias is not None:
        logits = logits + bias.detach().cpu().double()
    return logits


def _exact_logit(h: torch.Tensor, w: torch.Tensor, bias: float | None) -> float:
    terms = (h * w).tolist()  # float32 x float32 products are exact in float64
    if bias is not None:
        terms.append(bias)
    return math.fsum(terms)


def reference_argmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B]`` int64 ids: argmax of the float64 logits of the full, unpadded
    lm_head ``weight [V, H]`` with torch.argmax's rules (NaN wins, ties to the
    smallest index), mapped by ``d2t`` (``k + d2t[k]``)."""
    logits = reference_logits(hidden, weight, bias)
    ids = logits.argmax(dim=1)
    if logits.shape[1]:
        h64, w64 = hidden.detach().cpu().double(), weight.detach().cpu().double()
        b64 = bias.detach().cpu().double() if bias is not None else None
        top = logits.max(dim=1).values
        for b in torch.nonzero(torch.isfinite(top)).flatten().tolist():
            threshold = top[b] - _CANDIDATE_RTOL * (1.0 + abs(float(top[b])))
            candidates = torch.nonzero(logits[b] >= threshold).flatten().tolist()
            if len(candidates) > 1:
                exact = [_exact_logit(h64[b], w64[c], None if b64 is None else float(b64[c])) for c in candidates]
                best = max(exact)
                ids[b] = candidates[exact.index(best)]
    if d2t is not None:
        ids = ids + d2t.cpu()[ids]
    return ids
