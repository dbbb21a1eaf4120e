"""The brgemm CPU path (DESIGN.md, "CPU paths"): ATen's cpublas::brgemm for
the dot products, our epilogue for the keys. Whatever ATen runs it on here
(AMX tiles where could_pack, oneDNN's float32 kernel or ATen's gemm
fallback elsewhere), a batch row's keys, top-k, sampled id and
log-partition pair are the same bits at every batch size, every position in
the batch, 1 or 2 threads and every brgemm block (the rule's, by batch size
and AMX, and each forced M x N), within the float32 bound of float64, with
exact ties, a NaN row and an all -inf batch row across several batch
blocks. The hard cases on small problems: tests/test_cpu_paths.py (every
path)."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys

import pytest
import torch

import localargmax
from localargmax import _C
from tests.support.problems import integer_problem, random_problem
from tests.support.reference import check_against_reference, ref_argmax
from tests.support.shard_argmax_common import DTYPE_IDS, DTYPES, dominant_padding, log_partition_error


@contextlib.contextmanager
def forced_block(m: int, n: int, step: int = 1):
    _C._brgemm_block(1, 64, False, (m, n, step))
    try:
        yield
    finally:
        _C._brgemm_block(1, 64, False, (0, 0))


@contextlib.contextmanager
def threads(n: int):
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def run_ops(hidden, weight, bias, num_valid, temperature, offset):
    kw = dict(bias=bias, num_valid=num_valid, vocab_start=7, path="brgemm")
    keys, pairs = localargmax.shard_argmax(hidden, weight, log_partition=True, scale=0.5, soft_cap=6.0, **kw)
    return (
        localargmax.shard_argmax(hidden, weight, **kw),
        localargmax.shard_topk(hidden, weight, 5, **kw),
        localargmax.shard_sample(hidden, weight, temperature, 11, offset, **kw),  # noise of row b: offset + b
        keys,
        pairs.view(torch.int32),
    )


def seventy_rows(gen, dtype):
    """A 70-row batch on a 333-row shard (H 96) whose last tile is partial and whose
    padding would win; temperatures with every 7th row greedy."""
    batch, rows, hsize = 70, 333, 96
    hidden, weight, bias = random_problem(gen, batch, rows, hsize, dtype, bias="float32")
    num_valid = rows - 5
    dominant_padding(hidden, weight, num_valid)
    temperature = torch.rand(batch, generator=gen) + 0.1
    temperature[::7] = 0.0
    return hidden, weight, bias, num_valid, temperature


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_brgemm_row_keys_do_not_follow_batch_size_position_or_threads(gen, dtype):
    """A 70-row batch (three N blocks, the last partial) on a shard whose
    last tile is partial, then every slice of sizes 1, 5, 31, 32, 33, 61 at
    offsets 0, 3 and 9 (a row at every block position), 1 and 2 threads:
    every op's result for a batch row is the full batch's bits; argmax within
    the float32 bound of float64, the pairs within 1e-5."""
    hidden, weight, bias, num_valid, temperature = seventy_rows(gen, dtype)
    with threads(1):
        full = run_ops(hidden, weight, bias, num_valid, temperature, 0)
    ids, _ = localargmax.decode_keys(full[0])
    check_against_reference(ids - 7, hidden, weight[:num_valid], bias[:num_valid], context=str(dtype))
    pairs = full[4].view(torch.float32)
    assert log_partition_error(pairs, hidden, weight, bias, num_valid, 0.5, 6.0) <= 1e-5
    for n in (2, 1):
        with threads(n):
            again = run_ops(hidden, weight, bias, num_valid, temperature, 0)
            assert all(torch.equal(a, b) for a, b in zip(again, full)), n
            for size in (1, 5, 31, 32, 33, 61):
                for start in (0, 3, 9):
                    part = slice(start, start + size)
                    got = run_ops(hidden[part], weight, bias, num_valid, temperature[part], start)
                    for i, (a, b) in enumerate(zip(got, full)):
                        assert torch.equal(a, b[part]), (n, size, start, i)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_brgemm_blocks_do_not_change_a_rows_bits(gen, dtype):
    """Every block the path may take (M 16 / 32 / 64 weight rows, N 16 / 32
    / 64 batch rows, in 1, 2 or 4 calls of every step-th row, forced with
    _C._brgemm_block) gives every op the bits of the rule's block, a 70-row
    batch (every block boundary, the last block partial) on a shard with a
    partial last tile: oneDNN's kernel changes with the block, the
    per-element arithmetic must not."""
    hidden, weight, bias, num_valid, temperature = seventy_rows(gen, dtype)
    want = run_ops(hidden, weight, bias, num_valid, temperature, 0)
    for m in (16, 32, 64):
        for n in (16, 32, 64):
            for step in (s for s in (1, 2, 4) if m // s >= 16):
                with forced_block(m, n, step):
                    got = run_ops(hidden, weight, bias, num_valid, temperature, 0)
                    one = run_ops(hidden[33:34], weight, bias, num_valid, temperature[33:34], 33)
                for i, (a, b) in enumerate(zip(got, want)):
                    assert torch.equal(a, b), (m, n, step, i)
                    assert torch.equal(one[i], b[33:34]), (m, n, step, i)


BLOCKS = [(m, n, s) for m in (16, 32, 64) for n in (16, 32, 64) for s in (1, 2, 4) if m // s >= 16]


@pytest.mark.parametrize("layout", ["padded rows", "one row broadcast"])
def test_brgemm_blocks_on_strided_weights(gen, layout):
    """A weight whose rows are H + 5 apart (every tile read in place at that stride, the last one copied) or
    one row broadcast (stride 0: each tile copied to rows H apart first) gets the rule's bits under every
    block and step (bf16: on AMX the tiles), the argmax within the float32 bound of float64."""
    hidden, weight, bias, num_valid, temperature = seventy_rows(gen, torch.bfloat16)
    rows, hsize = weight.shape
    if layout == "padded rows":
        weight = torch.randn(rows, hsize + 5, generator=gen).bfloat16()[:, :hsize]
    else:
        weight = weight[:1].expand(rows, hsize)  # every logit of a batch row ties: the bias decides
        bias = torch.randperm(rows, generator=gen).float()
    want = run_ops(hidden, weight, bias, num_valid, temperature, 0)
    ids, _ = localargmax.decode_keys(want[0])
    check_against_reference(ids - 7, hidden, weight[:num_valid], bias[:num_valid], context=layout)
    for block in BLOCKS:
        with forced_block(*block):
            got = run_ops(hidden, weight, bias, num_valid, temperature, 0)
        for i, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), (layout, block, i)


def test_brgemm_call_count_follows_the_block():
    """The path makes tiles x batch blocks x (64 / M) x step cpublas::brgemm calls (_C._brgemm_calls counts
    them): the rule's block (whose step the rule test pins) and every forced block, so a step the path did
    not take, or took twice, shows; a stride below H (each tile copied) takes the same calls."""
    hidden = torch.randn(40, 96).bfloat16()
    weight = torch.randn(333, 96).bfloat16()  # 6 tiles, the last partial
    amx = _C._brgemm_mode("bfloat16") == "amx"
    _C._brgemm_calls()
    for block in [None, *BLOCKS]:
        m, n, step = _C._brgemm_block(40, 96, amx) if block is None else block
        with forced_block(m, n, step) if block else contextlib.nullcontext():
            for w in (weight, weight[:1].expand(333, 96)):
                localargmax.shard_argmax(hidden, w, path="brgemm")
                assert _C._brgemm_calls() == 6 * math.ceil(40 / n) * (64 // m) * step, (block, w.stride())


def test_brgemm_block_rule():
    """The rule (csrc/cpu/shard_argmax_brgemm.h): on AMX at H <= 1024 64
    weight rows by 16 / 32 / 64 batch rows (up to 16, up to 32, past), in 2
    calls of every 2nd row up to 32 batch rows and 4 of every 4th past; above
    H 1024 32 x 16 up to 16 batch rows, else 16 x 32 up to 32 and 16 x 64
    past; elsewhere 16 batch columns up to 16 rows, else 32, by 64 weight
    rows, one call; a forced block outside 16 / 32 / 64, or a step that
    leaves fewer than 16 rows a call, is a ValueError."""
    for hidden in (8, 1024, 1025, 4096):
        short = hidden <= 1024
        for batch in (1, 15, 16, 17, 32, 33, 64, 65, 1000):
            if batch <= 16:
                want = (64, 16, 2) if short else (32, 16, 1)
            elif batch <= 32:
                want = (64, 32, 2) if short else (16, 32, 1)
            else:
                want = (64, 64, 4) if short else (16, 64, 1)
            assert _C._brgemm_block(batch, hidden, True) == want, (batch, hidden)
            assert _C._brgemm_block(batch, hidden, False) == (64, 16 if batch <= 16 else 32, 1)
    for bad in ((8, 16), (16, 128), (0, 16), (64, 0), (16, 16, 2), (32, 16, 4), (64, 16, 3), (64, 16, 0), (0, 0, 2)):
        with pytest.raises(ValueError, match="16, 32 or 64"):
            _C._brgemm_block(1, 64, False, bad)
    for bad in ([16, 16], (16,), (16, 16, 1, 1)):
        with pytest.raises(TypeError, match="force must be"):
            _C._brgemm_block(1, 64, False, bad)
    with forced_block(64, 64, 2):
        assert _C._brgemm_block(1, 64, True) == (64, 64, 2)  # the block in force
    with forced_block(16, 32):
        assert _C._brgemm_block(1, 64, True) == (16, 32, 1)
    assert _C._brgemm_block(1, 64, True) == (64, 16, 2)
    assert _C._brgemm_block(1, 4096, True) == (32, 16, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_brgemm_hard_cases_across_batch_blocks(gen, dtype):
    """Exact integer logits, batch 45 (two N blocks), a shard of 3 tiles and a
    partial one: exact ties across tiles (the smaller index), a NaN row (wins
    every batch row), an all -inf batch row in the second block (the first
    valid id), padding that would win; an empty shard and batch 0."""
    batch, rows, hsize = 45, 230, 24
    hidden, weight, bias = integer_problem(gen, batch, rows, hsize, dtype, bias=True)
    num_valid = rows - 9
    weight[3] = weight[num_valid - 1]
    dominant_padding(hidden, weight, num_valid)  # padding that would win its batch rows
    want = ref_argmax(hidden, weight[:num_valid], bias[:num_valid])
    for n in (1, 2):
        with threads(n):
            keys = localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=num_valid, path="brgemm")
            assert torch.equal(localargmax.decode_keys(keys)[0], want), n
            nan_weight = weight.clone()
            nan_weight[150, hsize - 1] = math.nan
            keys = localargmax.shard_argmax(hidden, nan_weight, bias=bias, num_valid=num_valid, path="brgemm")
            assert localargmax.decode_keys(keys)[0].eq(150).all(), n
            inf_hidden, neg_weight = hidden.clone(), weight.clone()
            neg_weight[:, 0] = -neg_weight[:, 0].abs().clamp(min=1)
            inf_hidden[40, 0] = math.inf
            keys = localargmax.shard_argmax(inf_hidden, neg_weight, bias=bias, num_valid=num_valid, path="brgemm")
            ids = localargmax.decode_keys(keys)[0]
            assert torch.equal(ids, ref_argmax(inf_hidden, neg_weight[:num_valid], bias[:num_valid])) and ids[40] == 0
    empty = localargmax.shard_topk(hidden, weight, 3, num_valid=0, path="brgemm")
    assert torch.equal(empty, torch.zeros(batch, 3, dtype=torch.int64))
    assert localargmax.shard_argmax(hidden[:0], weight, path="brgemm").shape == (0,)


def test_auto_takes_brgemm_exactly_where_aten_packs():
    """auto's feature rule (AMX tiles for the dtype) agrees with ATen's own
    cpublas::could_pack on this CPU (brgemm mode "amx"; unless oneDNN is
    switched off); float32 always runs "plain"."""
    assert _C._brgemm_mode("float32") == "plain"
    assert {_C._brgemm_mode(d) for d in ("bfloat16", "float16")} <= {"amx", "vnni", "plain"}
    if not torch.backends.mkldnn.enabled:
        pytest.skip("oneDNN is disabled (torch.backends.mkldnn.enabled is False): could_pack says no")
    for dtype in ("bfloat16", "float16"):
        assert (_C._cpu_path("auto", None, dtype) == "brgemm") == (_C._brgemm_mode(dtype) == "amx"), dtype
    with pytest.raises(ValueError, match="dtype must be 'float32', 'bfloat16' or 'float16'"):
        _C._brgemm_mode("int8")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_brgemm_vnni_and_plain_operands_agree_within_the_bound(gen, dtype):
    """An even hidden size takes the VNNI B where ATen runs it (mode "amx" /
    "vnni"), an odd one the plain B: both within the float32 bound of float64,
    exact on integer logits; H = 1 and H = 2 (one VNNI pair)."""
    for hsize in (1, 2, 63, 64, 130):
        hidden, weight, bias = random_problem(gen, 9, 200, hsize, dtype, bias="float32")
        ids = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, bias=bias, path="brgemm"))[0]
        check_against_reference(ids, hidden, weight, bias, min_clear_fraction=0.8, context=f"H={hsize}")
        hidden, weight, bias = integer_problem(gen, 9, 200, hsize, dtype, bias=True)
        ids = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, bias=bias, path="brgemm"))[0]
        assert torch.equal(ids, ref_argmax(hidden, weight, bias)), hsize


TOGGLE_SCRIPT = r"""
import sys, threading, time
import torch
import localargmax
from tests.support.problems import integer_problem
from tests.support.reference import ref_argmax

seed, seconds = int(sys.argv[1]), float(sys.argv[2])
torch.set_num_threads(2)
gen = torch.Generator().manual_seed(seed)
problems = {}
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    hidden, weight, bias = integer_problem(gen, 40, 1000, 96, dtype, bias=True)  # 2 batch blocks, 16 tiles
    problems[dtype] = hidden, weight, bias, ref_argmax(hidden, weight[:997], bias[:997])
stop, flips = threading.Event(), [0]

def toggle():
    while not stop.is_set():
        with torch.backends.mkldnn.flags(enabled=False):
            time.sleep(1e-4)
        time.sleep(1e-4)  # on as long: calls start with it on, and it goes off under them
        flips[0] += 1

thread = threading.Thread(target=toggle)
thread.start()
calls, end = 0, time.monotonic() + seconds
try:
    while time.monotonic() < end or calls < 30:
        for dtype, (hidden, weight, bias, want) in problems.items():
            keys = localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=997, path="brgemm")
            ids = localargmax.decode_keys(keys)[0]
            assert torch.equal(ids, want), (dtype, calls, ids.tolist(), want.tolist())
            hidden.float() @ weight.float()[:64].T, hidden @ weight[:64].T  # torch's own kernels in between
        calls += 1
finally:
    stop.set()
    thread.join()
print(f"calls {calls} flips {flips[0]}")
"""


def test_brgemm_survives_the_mkldnn_flag_toggled_by_another_thread(seed):
    """Another thread switches torch.backends.mkldnn off for 0.1 ms, on for
    0.1 ms, in a loop while bf16 / fp16 / fp32 shard_argmax run on brgemm (with torch's own
    matmuls in between), in a subprocess (a SIGILL fails the test instead of
    killing pytest): every call returns float64's ids (exact integer logits,
    ties included); the process ends cleanly. Each call reads the flag once;
    a block ATen ran otherwise makes the call run again without oneDNN."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-c", TOGGLE_SCRIPT, str(seed), "3"]
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    calls, flips = (int(w) for w in proc.stdout.split()[1::2])
    assert calls >= 30 and flips >= 100, proc.stdout  # the flag did change during the calls


def test_brgemm_epilogue_switch_skips_only_the_epilogue(gen):
    """_C._brgemm_epilogue(False) (bench/cpu_paths.py --epilogue-share): the tiles alone, every key empty;
    switched back on, the keys are those of before; the other paths never read it."""
    hidden = torch.randn(5, 96, generator=gen)
    weight = torch.randn(200, 96, generator=gen)
    want = localargmax.shard_argmax(hidden, weight, path="brgemm")
    exact = localargmax.shard_argmax(hidden, weight, path="generic")
    assert bool((want != 0).all())
    assert _C._brgemm_epilogue(False) is True
    try:
        assert bool((localargmax.shard_argmax(hidden, weight, path="brgemm") == 0).all())
        assert bool((localargmax.shard_topk(hidden, weight, 3, path="brgemm") == 0).all())
        assert torch.equal(localargmax.shard_argmax(hidden, weight, path="generic"), exact)
    finally:
        assert _C._brgemm_epilogue(True) is False
    assert torch.equal(localargmax.shard_argmax(hidden, weight, path="brgemm"), want)


def test_cpu_paths_epilogue_share_record(tmp_path):
    """bench/cpu_paths.py --epilogue-share: a row per (batch, op) with both times and the share they give,
    the record kind bench/readme_tables.py renders, and the epilogue switched back on after the run."""
    import json

    from bench import cpu_paths

    out = tmp_path / "share.json"
    argv = ["--rows", "200", "--hidden", "64", "--dtype", "float32", "--batch", "1,3", "--threads", "1"]
    argv += ["--rounds", "1", "--steps", "1", "--epilogue-share", "argmax,topk4,sample,lse", "--json", str(out)]
    assert cpu_paths.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "epilogue_share"
    assert [(r["batch"], r["op"]) for r in doc["rows"]] == [
        (b, op) for b in (1, 3) for op in ("argmax", "topk4", "sample", "lse")
    ]
    for r in doc["rows"]:
        assert r["epilogue_share"] == pytest.approx(1 - r["tiles_only_us"] / r["with_epilogue_us"])
    assert _C._brgemm_epilogue(True) is True  # left on
    h, w = torch.randn(2, 64), torch.randn(200, 64)
    assert torch.equal(
        localargmax.shard_argmax(h, w, path="brgemm"), localargmax.shard_sample(h, w, torch.zeros(2), 0, path="brgemm")
    )


def test_cpu_paths_brgemm_blocks_record(tmp_path):
    """bench/cpu_paths.py --brgemm-blocks: a row per (batch, block), the rule's first and named with its block,
    each block's speed against the rule's from the same medians, keys equal to the rule's (every block gives the
    same bits), the rule in force again after the run; a malformed or refused block exits with the reason."""
    import json

    from bench import cpu_paths

    out = tmp_path / "blocks.json"
    argv = ["--rows", "200", "--hidden", "64", "--dtype", "bfloat16", "--batch", "1,40", "--threads", "1"]
    argv += ["--rounds", "1", "--steps", "1", "--brgemm-blocks", "64x64x4,16x32", "--json", str(out)]
    assert cpu_paths.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "brgemm_blocks"
    amx = _C._brgemm_mode("bfloat16") == "amx"
    rule = {b: "rule {}x{}x{}".format(*_C._brgemm_block(b, 64, amx)) for b in (1, 40)}
    assert [(r["batch"], r["block"]) for r in doc["rows"]] == [
        (b, name) for b in (1, 40) for name in (rule[b], "64x64x4", "16x32x1")
    ]
    by_batch = {b: [r for r in doc["rows"] if r["batch"] == b] for b in (1, 40)}
    for rows in by_batch.values():
        for r in rows:
            assert r["keys_equal_rule"] is True
            assert r["speedup_vs_rule"] == pytest.approx(rows[0]["median_us"] / r["median_us"])
    assert _C._brgemm_block(40, 64, True) == _C._brgemm_block(40, 64, True, (0, 0))  # no block left forced
    bad_blocks = (
        ("64x64x4,64x64x8", "step 1, 2 or 4"),  # refused after a valid block was forced: the rule again after
        ("64by64", "MxN or MxNxSTEP"),
        ("64x64x4x1", "MxN"),
        ("64x64,64x64x1", "each block once"),
        ("0x0", "none 0x0"),
    )
    for bad, reason in bad_blocks:
        with pytest.raises(SystemExit, match=reason):
            cpu_paths.main([*argv[:-4], "--brgemm-blocks", bad])
        assert _C._brgemm_block(40, 64, True) == _C._brgemm_block(40, 64, True, (0, 0)), bad
