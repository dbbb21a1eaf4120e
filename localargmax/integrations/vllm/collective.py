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

_GATHERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # coordinator -> its all_gather


def payload_dtype(communicator) -> torch.dtype:
    """The dtype the int64 payload is viewed as on vLLM's device communicator
    ``communicator`` (``GroupCoordinator.device_communicator``); every route
    moves the bytes unchanged (docs/vllm.md, "Which collective"):

    - ``torch.float32`` on vLLM's CPU shared-memory all-gather (a
      ``CpuCommunicator`` whose ``dist_module`` is vLLM's ``_CPUSHMDistributed``:
      ``torch.ops._C.shm_all_gather`` takes floating dtypes only; every bit
      pattern, float NaNs included, is tested through it);
    - ``torch.int32`` everywhere else (gloo, pynccl, RCCL take any dtype): an
      integer keeps the payload off float-only routes whose bit-exactness is
      not known (0.34's AITER ``all_gather_unreg`` on ROCm)."""
    if type(getattr(communicator, "dist_module", None)).__name__ == "_CPUSHMDistributed":
        return torch.float32
    return torch.int32


def coordinator_all_gather(coordinator):
    """The step's collective on vLLM's ``GroupCoordinator``: a callable group
    (``[L]`` int64 -> ``[tp, L]`` int64) that pads the payload to
    :data:`PAYLOAD_ALIGN_BYTES`, views it as :func:`payload_dtype` of the
    coordinator's device communicator (an all-gather moves bits; no arithmetic
    touches them) and calls ``coordinator.all_gather(x, dim=0)``, so vLLM's
    device communicator picks its collective (pynccl, also under CUDA-graph
    capture; NCCL symmetric memory where enabled; gloo or shared memory on
    CPU), never raw torch.distributed on the group. Built once per coordinator
    (a step reuses it: no closure per call)."""
    try:
        found = _GATHERS.get(coordinator)
    except TypeError:  # a coordinator that takes no weak reference: built per call
        found = None
    if found is not None:
        return found
    tp = coordinator.world_size
    communicator = coordinator.device_communicator
    view = payload_dtype(communicator)
    name = f"collective: GroupCoordinator.all_gather ({type(communicator).__name__}, {str(view).split('.')[-1]})"

    def all_gather(payload: torch.Tensor) -> torch.Tensor:
        length = payload.shape[0]
        words = padded_words(length, PAYLOAD_ALIGN_BYTES)
        if words != length:
            payload = torch.cat([payload, payload.new_zeros(words - length)])
        gathered = coordinator.all_gather(payload.view(view), dim=0)
        STATS[name] += 1
        return gathered.view(torch.int64).view(tp, words)[:, :length]

    try:
        _GATHERS[coordinator] = all_gather
    except TypeError:
        pass
    return all_gather
