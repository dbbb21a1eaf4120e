"""The float64 reference of DESIGN.md, "Semantics": the full, un-sharded logits
in float64, then ``torch.argmax``. Used by the tests and by the benchmark's
``agree`` column."""
from __future__ import annotations

from typing import Optional

import torch


def reference_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[B, V]`` float64 logits of the full ``[V, H]`` lm_head (on the CPU)."""
    logits = hidden.detach().cpu().double() @ weight.detach().cpu().double().T
    if bias is not None:
        logits = logits + bias.detach().cpu().double()
    return logits


def reference_argmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    d2t: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``[B]`` int64 ids: ``argmax`` of the float64 logits of the full,
    unpadded lm_head ``weight [V, H]``, mapped by ``d2t`` (``k + d2t[k]``)."""
    ids = reference_logits(hidden, weight, bias).argmax(dim=1)
    if d2t is not None:
        ids = ids + d2t.cpu()[ids]
    return ids
