"""Bytes each emulated CUDA kernel requests from the weight (issue #69's
yardstick, measurable without a GPU): the emulation counts every global load,
cp.async and TMA source per tensor (tests/support/emulation.py,
``bytes_loaded``). A kernel reads the shard once per pass over the batch: the
simt kernel takes 8 batch rows a pass (csrc/cuda/shard_launch.cuh,
``launch_simt``), a tensor-core config ``8 * nt`` (its n-tiles,
csrc/cuda/mma_configs.h), so the weight bytes requested are exactly
``ceil(B / rows_per_pass) * shard bytes``: every byte once a pass, none past
the shard's rows (uneven rows, a hidden size off the 32-element chunk). The
emulation cannot time; these counts are what a GPU run must confirm."""

from __future__ import annotations

import math

import pytest
import torch

from localargmax._validation import MMA_CONFIGS

SIMT_ROWS_PER_PASS = 8
"""launch_simt's widest batch tile (1, 2 and 4 rows below 8: one pass either way)."""

ROWS, BATCHES = 200, (1, 7, 8, 9, 16, 17, 33, 64)


def _rows_per_pass(path: str) -> int:
    return SIMT_ROWS_PER_PASS if path == "simt" else 8 * MMA_CONFIGS[path.removeprefix("mma/")].nt


def _paths(op: str) -> list[str]:
    if op == "topk":  # the simt kernel alone takes top-k
        return ["simt"]
    configs = [c for c, m in MMA_CONFIGS.items() if not (op == "lse" and m.tma)]  # TMA: no log-partition
    return ["simt", *(f"mma/{c}" for c in configs)]


@pytest.mark.parametrize("hidden_size", [64, 72])
@pytest.mark.parametrize("op", ["argmax", "topk", "sample", "lse"])
def test_weight_bytes_requested_are_one_shard_a_pass(emu, gen, op, hidden_size):
    dtype = torch.bfloat16
    weight = torch.randn(ROWS, hidden_size, generator=gen).to(dtype)
    shard_bytes = ROWS * hidden_size * weight.element_size()
    for path in _paths(op):
        for batch in BATCHES:
            hidden = torch.randn(batch, hidden_size, generator=gen).to(dtype)
            ratio = emu.weight_passes(op, hidden, weight, path)
            passes = math.ceil(batch / _rows_per_pass(path))
            got = emu.bytes_loaded("weight")  # exact bytes, not the ratio
            assert got == passes * shard_bytes, (op, path, batch, ratio, passes)


def test_the_count_is_per_launch_and_per_tensor(emu, gen):
    """The count starts at zero with each launch's tensors and names one
    tensor: the hidden states are counted apart from the weight."""
    weight = torch.randn(ROWS, 64, generator=gen).bfloat16()
    hidden = torch.randn(3, 64, generator=gen).bfloat16()
    emu.shard(hidden, weight, path="simt")
    first = emu.bytes_loaded("weight")
    emu.shard(hidden, weight, path="simt")
    assert emu.bytes_loaded("weight") == first == ROWS * 64 * 2
    assert emu.bytes_loaded("hidden") >= 3 * 64 * 2  # every block reads the batch
    assert emu.bytes_loaded("no such tensor") == 0
