"""The fused step's exchange on vLLM's TP ``GroupCoordinator`` (docs/vllm.md,
"Which collective, by vLLM mode")."""

from __future__ import annotations

import weakref

import torch

from ...collective import padded_words
from .counters import STATS

PAYLOAD_ALIGN_BYTES = 16
"""The exchange's payload is padded to this many bytes, the same rule on every
rank (``localargmax.payload_length(..., align_bytes=16)``): whole 16-byte
units for any route that moves vectors of them."""

PAYLOAD_DTYPE = torch.int32
"""The dtype the payload is viewed as for vLLM's all-gather: an integer, so
no route that takes only float payloads (0.34's AITER ``all_gather_unreg`` on
ROCm: contiguous bf16 / fp16 / fp32) is taken, and nothing on the way
converts or canonicalises a bit pattern (an int64 key's halves can read as
float NaNs)."""

_GATHERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # coordinator -> its all_gather


def coordinator_all_gather(coordinator):
    """The step's collective on vLLM's ``GroupCoordinator``: a callable group
    (``[L]`` int64 -> ``[tp, L]`` int64) that pads the payload to
    :data:`PAYLOAD_ALIGN_BYTES`, views it as :data:`PAYLOAD_DTYPE` (an
    all-gather moves bits; no arithmetic touches them) and calls
    ``coordinator.all_gather(x, dim=0)``, so vLLM's device communicator picks
    its collective (pynccl, also under CUDA-graph capture; NCCL symmetric
    memory where enabled; gloo / shared memory on CPU), never raw
    torch.distributed on the group. Built once per coordinator (a step reuses
    it: no closure per call)."""
    try:
        found = _GATHERS.get(coordinator)
    except TypeError:  # a coordinator that takes no weak reference: built per call
        found = None
    if found is not None:
        return found
    tp = coordinator.world_size
    name = f"collective: GroupCoordinator.all_gather ({type(coordinator.device_communicator).__name__})"

    def all_gather(payload: torch.Tensor) -> torch.Tensor:
        length = payload.shape[0]
        words = padded_words(length, PAYLOAD_ALIGN_BYTES)
        if words != length:
            payload = torch.cat([payload, payload.new_zeros(words - length)])
        gathered = coordinator.all_gather(payload.view(PAYLOAD_DTYPE), dim=0)
        STATS[name] += 1
        return gathered.view(torch.int64).view(tp, words)[:, :length]

    try:
        _GATHERS[coordinator] = all_gather
    except TypeError:
        pass
    return all_gather
