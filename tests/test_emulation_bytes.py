"""Bytes each emulated CUDA kernel requests from the weight (issue #69's
yardstick, measurable without a GPU): the emulation counts every global load,
cp.async and TMA source per tensor (tests/support/emulation.py,
``bytes_loaded``). A kernel reads the shard once per pass over the batch: the
simt kernel takes 8 batch rows a pass (csrc/cuda/shard_launch.cuh,
``launch_simt``), a tensor-core config ``batch_rows`` = ``8 * nt * wn`` (its
n-tiles times its warps along the batch, csrc/cuda/mma_configs.h), so the weight bytes requested are exactly
``ceil(B / rows_per_pass) * shard bytes``: every byte once a pass, none past
the shard's rows (uneven rows, a hidden size off the 32-element chunk). The
emulation cannot time; these counts are what a GPU run must confirm."""

from __future__ import annotations

import math

import pytest
import torch

from localargmax._validation import MMA_CONFIGS
from tests.support.emulation_cases import assert_keys_equal, cpu_keys, decode, exact_problem

SIMT_ROWS_PER_PASS = 8
"""launch_simt's widest batch tile (1, 2 and 4 rows below 8: one pass either way)."""

ROWS, BATCHES = 200, (1, 7, 8, 9, 16, 17, 33, 64)


def _rows_per_pass(path: str) -> int:
    return SIMT_ROWS_PER_PASS if path == "simt" else MMA_CONFIGS[path.removeprefix("mma/")].batch_rows


def _paths(op: str) -> list[str]:
    configs = [
        c
        for c, m in MMA_CONFIGS.items()
        if not (op == "lse" and m.tma) and not (op == "topk" and not m.topk)  # TMA: no log-partition
    ]
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


ONE_PASS = [name for name, m in MMA_CONFIGS.items() if m.batch_rows >= 256]
"""The configs whose warps along the batch share each weight stage for 256 batch rows (n16_r64_w2: forced only,
unmeasured on a GPU)."""


@pytest.mark.parametrize("op", ["argmax", "topk", "sample", "lse"])
def test_one_weight_read_at_every_batch_up_to_256(emu, gen, op):
    """Issue #69's target, on the configs that take 256 batch rows a pass: the weight bytes requested are the
    shard's bytes exactly at every batch 1-256 (B 257 takes a second pass), where n16_r64, the widest before,
    reads it twice from B 129."""
    assert ONE_PASS, "no config takes 256 batch rows a pass"
    weight = torch.randn(ROWS, 72, generator=gen).bfloat16()
    shard_bytes = weight.numel() * weight.element_size()
    for path in [f"mma/{name}" for name in ONE_PASS]:
        for batch in (1, 8, 9, 128, 129, 200, 255, 256, 257):
            hidden = torch.randn(batch, 72, generator=gen).bfloat16()
            emu.weight_passes(op, hidden, weight, path)
            assert emu.bytes_loaded("weight") == (1 if batch <= 256 else 2) * shard_bytes, (op, path, batch)
    hidden = torch.randn(200, 72, generator=gen).bfloat16()
    emu.weight_passes(op, hidden, weight, "mma/n16_r64")
    assert emu.bytes_loaded("weight") == 2 * shard_bytes


@pytest.mark.parametrize("config", ONE_PASS)
def test_one_pass_configs_on_the_hard_cases(emu, gen, config):
    """The 256-row pass against the CPU kernel's keys (small integers: exact sums, so every order gives the
    same bits) with the hard cases planted in the second warp column (batch rows 128-255): B 250 (not a
    multiple of 8), a winning row copied into three blocks (ties across CTAs: the smallest index), a NaN
    batch row, padding rows that would win, a shard of ids past 2**24, sampling rows and greedy rows mixed."""
    path = f"mma/{config}"
    batch, rows, hidden_size = 250, 260, 24
    h, w, b = exact_problem(gen, batch, rows, hidden_size, torch.bfloat16, "f")
    w[[200, 70, 140]] = 3.0  # equal rows in three 64-row blocks: every batch row ties them unless another wins
    h[130:140] = 3.0  # these rows' best: the three equal rows (positive sums); index 70 wins
    b[[200, 70, 140]] = 0.0
    h[131, 5] = float("nan")  # every logit NaN: index 0 (DESIGN.md's NaN rule)
    num_valid = 230
    w[num_valid:] = 100.0  # padding past num_valid would win every row
    b[num_valid:] = 1e4
    vocab_start = (1 << 24) + 5
    got = emu.shard(h, w, b, vocab_start, num_valid, path=path)
    assert_keys_equal(got, cpu_keys(h, w, b, vocab_start, num_valid), f"{path} argmax")
    ids = decode(got) - vocab_start
    assert ids[130].item() == 70 and ids[131].item() == 0 and (ids < num_valid).all()
    t = torch.rand(batch, generator=gen) + 0.3
    t[::3] = 0.0  # greedy rows among the sampling ones
    got = emu.shard(h, w, b, vocab_start, num_valid, path=path, temperature=t, seed=9, offset=4)
    want = cpu_keys(h, w, b, vocab_start, num_valid, temperature=t, seed=9, offset=4)
    assert_keys_equal(got, want, f"{path} sample")
    # random floats (inexact sums): the bits of every KC = 1 config (rule 5), batch rows in both warp columns,
    # a hidden row copied across them and a weight row copied into other blocks
    h = torch.randn(batch, 264, generator=gen).bfloat16()
    w = torch.randn(rows, 264, generator=gen).bfloat16()
    h[200] = h[3]
    w[[90, 250]] = w[17].clone()
    got = emu.shard(h, w, None, 0, rows, path=path)
    for other in (n for n, m in MMA_CONFIGS.items() if m.kc == MMA_CONFIGS[config].kc and n != config):
        assert torch.equal(got, emu.shard(h, w, None, 0, rows, path=f"mma/{other}")), other
    assert got[200] == got[3]


def test_only_the_batchs_n_tiles_are_multiplied(emu, gen):
    """Every tensor-core config issues mma.sync for the n-tiles that hold a batch row only (8 batch rows
    each): per block and pass, steps x KC chunk slots x WM x MT x 2 k-halves x ceil(the pass's batch rows
    / 8) warp-wide m16n8k16 instructions, counted by the emulation: a config of 16 n-tiles a warp at
    batch 9 multiplies 2 of them, not 16 (nor a second warp column at all)."""
    rows, hidden_size = 200, 72
    weight = torch.randn(rows, hidden_size, generator=gen).bfloat16()
    for name, m in MMA_CONFIGS.items():
        steps = math.ceil(math.ceil(hidden_size / 32) / m.kc)
        for batch in sorted({1, 9, 17, m.batch_rows - 1, m.batch_rows + 3}):
            hidden = torch.randn(batch, hidden_size, generator=gen).bfloat16()
            emu.shard(hidden, weight, path=f"mma/{name}")
            in_pass = [min(m.batch_rows, batch - b0) for b0 in range(0, batch, m.batch_rows)]
            per_block = sum(steps * m.kc * m.wm * m.mt * 2 * math.ceil(n / 8) for n in in_pass)
            assert emu.stats()["mma"] == math.ceil(rows / m.rows) * per_block, (name, batch)
