"""The host emulation (see tests/test_emulation.py) on the edges: the merge
with d2t and an empty shard, the grid-y loop, padding rows that would win,
ties across blocks, NaN / -0.0 / infinite rows, random floats against the
float64 reference, weight offsets past 2**31 elements."""

from __future__ import annotations

import pytest
import torch

import localargmax  # noqa: F401  (registers torch.ops.localargmax)
from localargmax._validation import MMA_CONFIGS
from localargmax.reference import reference_logits
from tests.support import emulation
from tests.support.emulation_cases import (
    EVERY_PATH_AND_CONFIG,
    TOPK_PATHS,
    assert_keys_equal,
    cpu_keys,
    decode,
    exact_problem,
    ops,
)
from tests.support.reference import check_against_reference, error_bound

pytestmark = pytest.mark.skipif(not emulation.have_compiler(), reason="g++ / objcopy not found")


# --- merge with d2t, empty shards ---


def test_merge_keys_with_d2t_and_an_empty_shard(emu, gen):
    h, w, _ = exact_problem(gen, 300, 200, 16, torch.bfloat16)
    shards = [(0, 64), (64, 0), (64, 136)]  # (vocab_start, num_valid); the middle shard is empty
    keys = torch.stack([emu.shard(h, w[s : s + n], None, s, n) for s, n in shards])
    assert (keys[1] == 0).all()
    d2t = torch.randint(0, 50, (200,), generator=gen)
    ids, values = emu.merge_keys(keys, d2t)
    want_ids, want_values = ops.merge_keys(keys, d2t)
    assert torch.equal(ids, want_ids) and torch.equal(values, want_values)
    # no valid entry, or a draft id past d2t: -1 and NaN (the CPU raises instead)
    bad = torch.zeros(2, 3, dtype=torch.int64)
    bad[:, 1] = keys[0, 0]
    ids, values = emu.merge_keys(bad, d2t[:0])
    assert ids.tolist() == [-1, -1, -1] and values.isnan().all()


# --- the grid-y loop, padding rows, ties across blocks, special values ---


@pytest.mark.parametrize(
    "path",
    [
        "simt",
        "mma",
        "gemm",
        "mma/n1_r64",
        "mma/n4_r128",
        "mma/n8_r192",
        "mma/n16_r64",
        "mma/n1_r64_tma",
        "mma/n8_r256_tma",
    ],
)
@pytest.mark.parametrize("max_grid_y", [1, 2])
def test_grid_y_loop(emu, gen, path, max_grid_y):
    h, w, b = exact_problem(gen, 130, 150, 24, torch.bfloat16, "f")
    got = emu.shard(h, w, b, 0, 150, path=path, max_grid_y=max_grid_y)
    assert_keys_equal(got, cpu_keys(h, w, b, 0, 150), f"{path} grid y <= {max_grid_y}")
    t = torch.full((130,), 0.7)
    got = emu.shard(h, w, b, 0, 150, path=path, max_grid_y=max_grid_y, temperature=t, seed=3, offset=5)
    assert_keys_equal(got, cpu_keys(h, w, b, 0, 150, temperature=t, seed=3, offset=5), "sample")


@pytest.mark.parametrize("path,dtype", EVERY_PATH_AND_CONFIG)
def test_padding_rows_never_win(emu, gen, path, dtype):
    h, w, b = exact_problem(gen, 9, 256, 16, dtype, "f" if dtype != torch.float32 else "t", lo=0, hi=2)
    w[70:] = 8.0  # padding rows past num_valid = 70, far larger than every real row
    b[70:] = 1e4
    got = emu.shard(h, w, b, 0, 70, path=path)
    assert_keys_equal(got, cpu_keys(h, w, b, 0, 70), path)
    assert (decode(got) < 70).all()


@pytest.mark.parametrize("path,dtype", EVERY_PATH_AND_CONFIG)
@pytest.mark.parametrize("scramble", [False, True])
def test_ties_across_blocks_go_to_the_smallest_index(emu, gen, path, dtype, scramble):
    """Random float data; the winning row is copied to rows in other warps, m-tiles
    and blocks: identical rows give identical logits (rule 5), the smallest index wins."""
    batch, rows, hidden_size = 12, 400, 40
    h = torch.randn(batch, hidden_size, generator=gen).to(dtype)
    w = (torch.randn(rows, hidden_size, generator=gen) * 0.1).to(dtype)
    win = torch.randn(hidden_size, generator=gen).to(dtype)
    places = [399, 263, 130, 69, 37, 21]
    for r in places:
        w[r] = win
    h[:] = (win.float() * 3 + torch.randn(batch, hidden_size, generator=gen) * 0.05).to(dtype)
    got = emu.shard(h, w, None, 0, rows, path=path, scramble=scramble, order_seed=int(gen.initial_seed()) % 1000)
    assert (decode(got) == 21).all(), decode(got)
    assert torch.equal(decode(got), decode(cpu_keys(h, w, None, 0, rows)))


@pytest.mark.parametrize("path,dtype", TOPK_PATHS)
def test_topk_hard_cases(emu, gen, path, dtype):
    """Top-k on every path that takes it, against the CPU kernel's lists: batch 13 (not a multiple of 8),
    a winning row copied into six blocks (the tie listed in index order), a NaN batch row, padding rows
    that would win, ids past 2**24, k past the shard; with the log-partition the same lists and the
    argmax's pairs; an empty shard and batch 0 give key-0 lists."""
    batch, rows, k, start = 13, 400, 8, (1 << 24) + 5
    h, w, b = exact_problem(gen, batch, rows, 16, dtype, "f" if dtype != torch.float32 else "t")
    places = [349, 263, 130, 69, 37, 21]  # (349: the last valid row)
    w[places] = 3.0
    b[places] = 8.0
    h[:4] = 3.0  # rows 0-3: the six copies tie at the top
    h[5, 3] = float("nan")
    num_valid = 350
    w[num_valid:] = 8.0
    b[num_valid:] = 1e4
    want = cpu_keys(h, w, b, start, num_valid, k=k)
    got = emu.shard(h, w, b, start, num_valid, path=path, k=k)
    assert_keys_equal(got, want, f"{path} top-k")
    assert (decode(got[:4, :6]) - start).tolist() == [sorted(places)] * 4  # equal keys: the smaller index first
    assert (decode(got[got != 0]) - start < num_valid).all()
    if not (path.startswith("mma/") and MMA_CONFIGS[path[4:]].tma):  # (TMA configs: no log-partition)
        lse_keys, pairs = emu.shard(h, w, b, start, num_valid, path=path, k=k, log_partition=True)
        assert_keys_equal(lse_keys, want, f"{path} top-k with the log-partition")
        _, argmax_pairs = emu.shard(h, w, b, start, num_valid, path=path, log_partition=True)
        torch.testing.assert_close(pairs, argmax_pairs, rtol=0, atol=0, equal_nan=True)  # (row 5: NaN)
    at_zero = emu.shard(h, w, b, 0, num_valid, path=path, k=k)  # row 5 all NaN from global index 0: key ~0 first
    assert_keys_equal(at_zero, cpu_keys(h, w, b, 0, num_valid, k=k), f"{path} top-k from index 0")
    assert decode(at_zero[5]).tolist() == list(range(k))
    wide = cpu_keys(h[:3, :], w[:5], b[:5], 0, 5, k=k)  # k past the shard: slots 5-7 key 0
    assert_keys_equal(emu.shard(h[:3], w[:5], b[:5], 0, 5, path=path, k=k), wide, f"{path} k > rows")
    assert (wide[:, 5:] == 0).all()
    assert (emu.shard(h, w, b, 0, 0, path=path, k=k) == 0).all()
    assert emu.shard(h[:0], w, b, 0, rows, path=path, k=k).shape == (0, k)


@pytest.mark.parametrize("path,dtype", EVERY_PATH_AND_CONFIG)
def test_nan_negative_zero_and_infinite_rows(emu, gen, path, dtype):
    h, w, _ = exact_problem(gen, 6, 150, 16, dtype)
    h[0] = 0.0  # every logit +-0.0: all tie, index 0 wins
    h[1] = -0.0
    h[2, 3] = float("nan")  # every logit NaN: index 0
    got = emu.shard(h, w, None, 0, 150, path=path)
    assert_keys_equal(got, cpu_keys(h, w, None, 0, 150), "+-0 and NaN rows")
    assert decode(got)[:3].tolist() == [0, 0, 0]
    w[100] = 0.0
    w[100, 5] = float("nan")  # a NaN weight row wins every batch row (row 2: all NaN, index 0)
    got = emu.shard(h, w, None, 0, 150, path=path)
    assert_keys_equal(got, cpu_keys(h, w, None, 0, 150), "a NaN row")
    assert decode(got).tolist() == [100, 100, 0, 100, 100, 100]
    b = torch.full((150,), float("-inf"), dtype=torch.float32 if dtype != torch.float32 else dtype)
    got = emu.shard(h[3:], w[:100], b[:100], 9, 100, path=path)  # all -inf: the first valid index
    assert decode(got).tolist() == [9, 9, 9]
    assert_keys_equal(got, cpu_keys(h[3:], w[:100], b[:100], 9, 100), "-inf rows")
    b[42] = float("inf")
    got = emu.shard(h[3:], w[:100], b[:100], 0, 100, path=path)
    assert decode(got).tolist() == [42, 42, 42]


@pytest.mark.parametrize(
    "path,dtype",
    [("simt", torch.float32), ("simt", torch.bfloat16), ("mma", torch.bfloat16), ("mma/n1_r64", torch.float16)]
    + [(f"mma/{name}", torch.bfloat16) for name in ("n1_r64_sk2", "n8_r192", "n16_r64")]
    + [(f"mma/{m.name}", (torch.bfloat16, torch.float16)[i % 2]) for i, m in enumerate(MMA_CONFIGS.values()) if m.tma],
)
def test_random_floats_against_the_float64_reference(emu, gen, path, dtype):
    for batch, rows, hidden_size in ((3, 300, 4104), (20, 129, 40)):
        h = torch.randn(batch, hidden_size, generator=gen).to(dtype)
        w = torch.randn(rows, hidden_size, generator=gen).to(dtype)
        # row 0 gets a planted winner (logit |h_0|^2 ~ H, others ~N(0, H)): at H 4104 the float32 bound makes
        # ~5.4% of random rows near-ties (4000 seeds), all 3 for ~1.6e-4 of seeds in each of the 12 configs
        w[rows // 2] = h[0]
        got = emu.shard(h, w, None, 0, rows, path=path)
        ids, values = localargmax.decode_keys(got)
        logits, err = reference_logits(h, w), error_bound(h, w)  # the float32 error bound of every entry
        # clear rows give the float64 id, near-ties lie within the bound (3 rows: the planted one clear)
        check_against_reference(ids, h, w, min_clear_fraction=0.6, reference=(logits, err), context=path)
        rows, best = torch.arange(batch), logits.argmax(1)
        assert ((values.double() - logits[rows, ids]).abs() <= err[rows, ids]).all()
        assert ((values.double() - logits[rows, best]).abs() <= 2 * err[rows, ids] + err[rows, best]).all()


@pytest.mark.parametrize(
    "path",
    ["simt", "mma", "mma/n1_r64", "mma/n4_r128", "mma/n8_r192", "mma/n16_r64", "mma/n1_r64_tma", "mma/n8_r256_tma"],
)
def test_weight_offsets_beyond_2_31_elements(emu, gen, path):
    """A weight view whose rows lie 2**23 + 8 elements apart: rows >= 256 sit
    past element 2**31 (4 GiB of bf16 address space, mostly never touched)."""
    rows, hidden_size, ldw = 300, 16, 2**23 + 8
    h, w, _ = exact_problem(gen, 9, rows, hidden_size, torch.bfloat16)
    w[290] = 3.0  # the winner sits past 2**31 elements
    h[:] = h.abs() + 1
    view = emu.alloc_weight_view(rows, ldw, hidden_size, torch.bfloat16, w)
    got = emu.shard(h, view, None, 0, rows, path=path)
    assert_keys_equal(got, cpu_keys(h, w, None, 0, rows), "2**31 offsets")
    assert (decode(got) == 290).all()
