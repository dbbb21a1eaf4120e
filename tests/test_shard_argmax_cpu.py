"""shard_argmax on the CPU: the ISA variants and thread counts (bit-identical
keys), blocks and batch positions, indices past 2**24, near-ties within the
error bound, the ops' path keyword and the log-partition pair."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from tests.support.keys import pack_key, same_float32, to_int64
from tests.support.paths import (
    BIT_EXACT_CPU_PATHS,
    CPU_PATHS,
    bit_exact_cpu_paths,
    bit_identical_to_generic,
    each_cpu_path_and_thread_count,
    use_path,
)
from tests.support.problems import (
    integer_problem,
    make_shards,
    random_problem,
    shard_keys,
    simulated_argmax,
    simulated_topk,
)
from tests.support.reference import (
    error_bound,
    ref_argmax,
    ref_logits,
)
from tests.support.shard_argmax_common import DTYPE_IDS, DTYPES, dominant_padding, ids_of, log_partition_error, logit_at

# ----------------------------------------------------------------------------- CPU ISA variants, threads, blocks


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [1, 7, 8, 9, 33, 100])
def test_generic_isa_matches_default(gen, dtype, hsize):
    """Bit-identical keys and per-row logits from every bit-exact CPU path
    this CPU has (auto, generic, avx2, avx512), with tiny / huge / non-finite
    values in a few places."""
    rows = 777
    hidden, weight, _ = random_problem(gen, 13, rows, hsize, dtype)
    weight[5, 0], weight[9, -1], hidden[3, 0] = float("inf"), float("nan"), 0.0
    if dtype == torch.float32:
        hidden[4] = hidden[4] * 1e-30
    bias = torch.randn(rows, generator=gen)
    results = []
    paths = bit_exact_cpu_paths()
    for path in (*paths, paths[0]):
        with use_path(path):
            results.append(
                [
                    localargmax.shard_argmax(hidden, weight, num_valid=nv, bias=b)
                    for nv in (rows, 600)
                    for b in (None, bias)
                ]
            )
    assert all(torch.equal(a, b) for r in results[1:] for a, b in zip(results[0], r)), "ISA variants differ"
    weight = weight.clone()
    weight[5, 0], weight[9, -1] = 1.0, -1.0
    for row in (0, 1, 5, 9, 63, 64, 600, 776):  # every row's own logit, through the bias trick
        vals = []
        for path in paths:
            with use_path(path):
                vals.append(logit_at(hidden, weight, row))
        assert all(same_float32(vals[0], v) for v in vals[1:]), f"row {row} logit differs between ISA variants"


HSIZES = (1, 2, 3, 31, 33, 127, 129, 4095, 4097)
ROW_COUNTS = (1, 2, 63, 64, 65, 127, 4095, 4097, 65537, 300000)
MAX_ELEMS = 3_000_000  # rows * H per case, to stay fast


def test_cross_block_planted_winner(gen):
    """Fault family, cross-block reduction: the winner planted at the first
    row, last row, tile boundaries (64-row tiles) and deep inside, for every
    hidden width and shard height; a tie with a later copy (another tile)
    goes to the first; padding right after the winner."""
    cases = 0
    for hsize in HSIZES:
        for rows in (r for r in ROW_COUNTS if r * hsize <= MAX_ELEMS):
            hidden = 0.5 + torch.rand(3, hsize, generator=gen)  # positive: one row wins all batch rows
            weight = torch.rand(rows, hsize, generator=gen) * 0.5
            big = torch.full((hsize,), 2.0)
            cand = {0, rows - 1, rows // 2, 63, 64, 65, 127, 128, 4095, 4096, 65536, rows - 64, rows - 65}
            for p in sorted(c for c in cand if 0 <= c < rows):
                saved = weight[p].clone()
                weight[p] = big
                assert ids_of(hidden, weight, vocab_start=7).tolist() == [p + 7] * 3, f"H={hsize} rows={rows} at {p}"
                later = [q for q in (p + 1, p + 64, rows - 1) if p < q < rows]
                if later:
                    saved_q = weight[later[-1]].clone()
                    weight[later[-1]] = big
                    assert ids_of(hidden, weight).tolist() == [p] * 3, f"tie {p} vs {later[-1]}, H={hsize} rows={rows}"
                    weight[later[-1]] = saved_q
                assert ids_of(hidden, weight, num_valid=p + 1).tolist() == [p] * 3
                weight[p] = saved
                cases += 1
    print(f"{cases} planted positions")


@pytest.mark.parametrize("batch", [1, 2, 3, 63, 64, 65, 255, 4095, 4096])
def test_cross_block_batch_sizes(gen, batch):
    """Large batches (row blocks of the batch) on exact integer data."""
    hidden, weight, bias = integer_problem(gen, batch, 130, 9, bias=True)
    ids, _ = localargmax.merge_keys(shard_keys(hidden, make_shards(weight, bias, 2, 64, hidden=hidden)))
    assert torch.equal(ids, ref_argmax(hidden, weight, bias))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_isa_and_threads_bit_identical(gen, dtype):
    """Every bit-exact CPU path this CPU has, 1 and 2 threads: bit-identical keys for every
    hidden width and shard height (chunks are fixed by the problem, not by
    the thread count), an exact tie across blocks included."""
    compared = 0
    for hsize in HSIZES:
        for rows in (r for r in ROW_COUNTS if r * hsize <= MAX_ELEMS // 3):
            hidden = torch.randn(5, hsize, generator=gen).to(dtype)
            weight = torch.randn(rows, hsize, generator=gen).to(dtype)
            bias = torch.randn(rows, generator=gen)
            if rows > 3:
                weight[rows // 3] = weight[rows - 1]
            results = {
                variant: localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=max(1, rows - 1))
                for variant in each_cpu_path_and_thread_count()
            }
            ref = results[("cpu", 1)]
            for key, keys in results.items():
                assert torch.equal(keys, ref), f"{key} differs: H={hsize} rows={rows} {dtype}"
            compared += 1
    print(f"{compared} shapes, 4 variants each")


# ----------------------------------------------------------------------------- indices past 2**24


ROWS = 37
BIG_STARTS = (2**24 - 1, 2**24, 2**24 + 1, 2**24 + 3, 2**25 + 1, 2**31 + 3, 2**32 - 2 - 3 * ROWS, 2**32 - 2 - ROWS + 1)


@pytest.mark.parametrize("start", BIG_STARTS)
def test_large_indices_exact(gen, start):
    """Fault family, indices carried as floats: shards at global offsets where
    a float32 index would round (above 2**24, up to the last legal index
    2**32 - 2): exact ids through shard_argmax, decode_keys, lm_head_argmax
    and lm_head_topk."""
    hidden = torch.randn(6, 40, generator=gen)
    tp = 1 if start + 3 * ROWS - 1 > localargmax.MAX_GLOBAL_INDEX else 3
    weight = torch.randn(tp * ROWS, 40, generator=gen) * 0.01
    winners = torch.tensor([1, 3, 5, ROWS - 2, tp * ROWS - 1, tp * ROWS // 2 | 1])  # odd: float32 rounds them
    weight[winners] = 8 * hidden / (hidden * hidden).sum(dim=1, keepdim=True)
    want = start + winners
    shards = [
        (weight[r * ROWS : (r + 1) * ROWS], None, localargmax.VocabShard(start + r * ROWS, ROWS, ROWS))
        for r in range(tp)
    ]
    assert localargmax.merge_keys(shard_keys(hidden, shards))[0].tolist() == want.tolist()
    assert torch.equal(simulated_argmax(hidden, shards), want)
    assert torch.equal(simulated_argmax(hidden, shards, reduce="all_reduce"), want)
    top, _ = simulated_topk(hidden, shards, 2)
    assert top[:, 0].tolist() == want.tolist() and bool((top >= start).all() & (top < start + tp * ROWS).all())
    idx = [start, start + 1, start + tp * ROWS - 1, localargmax.MAX_GLOBAL_INDEX]
    vals = [1.0, -2.5, float("inf"), 0.0]
    dec_ids, dec_vals = localargmax.decode_keys(torch.tensor([to_int64(pack_key(v, i)) for v, i in zip(vals, idx)]))
    assert dec_ids.tolist() == idx and dec_vals.tolist() == vals
    assert start < 2**24 or any(float(torch.tensor(int(i), dtype=torch.float32)) != int(i) for i in want)


# ----------------------------------------------------------------------------- near-ties on random data


@pytest.mark.parametrize("twins", [False, True], ids=["random", "near_twins"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_near_ties_only_within_error_bound(gen, dtype, twins):
    """Fault family, near-ties: random Gaussian data, no planted winners (tp = 3
    simulated ranks): wherever our id differs from the float64 argmax, the two
    entries' float64 logits lie within the float32 error bound of each other.
    ``near_twins``: every weight row has a twin perturbed by ~1e-7 relative, so
    nearly every row is a near-tie and disagreements really occur."""
    batch, vocab, hsize = 1000, 2000, 96
    hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
    weight = torch.randn(vocab, hsize, generator=gen) / math.sqrt(hsize)
    if twins:
        half = vocab // 2
        perm = torch.randperm(vocab, generator=gen)
        a, b = perm[:half], perm[half : 2 * half]
        weight[b] = weight[a] * (1 + 1e-7 * torch.randn(half, hsize, generator=gen))
        if dtype == torch.bfloat16:  # keep the twins apart after rounding: one coordinate 1 ulp off
            weight = weight.to(dtype)
            wb = weight[a].clone()
            wb.view(torch.int16)[torch.arange(half), torch.randint(0, hsize, (half,), generator=gen)] += 1
            weight[b] = wb
    weight = weight.to(dtype)
    ids = simulated_argmax(hidden, make_shards(weight, None, 3, 64, hidden=hidden))
    logits, err = ref_logits(hidden, weight), error_bound(hidden, weight)
    rows, ref = torch.arange(batch), logits.argmax(dim=1)
    differ = ids != ref
    gap, slack = logits[rows, ref] - logits[rows, ids], err[rows, ref] + err[rows, ids]
    top2 = logits.topk(2, dim=1).values
    near = (top2[:, 0] - top2[:, 1]) <= err[rows, ref] * 2
    print(f"{dtype} twins={twins}: near-tie rows={int(near.sum())} disagreements={int(differ.sum())}")
    assert bool((ids >= 0).all() & (ids < vocab).all())
    assert bool((gap[differ] <= slack[differ]).all()), (
        f"rows {differ.nonzero().flatten().tolist()[:10]} beyond the bound"
    )
    assert not twins or int(near.sum()) > batch // 10, "the twin construction did not produce near-ties"


# ----------------------------------------------------------------------------- the path keyword on CPU


@pytest.mark.parametrize("op", ["argmax", "topk", "sample"])
def test_cpu_path_keyword(gen, op):
    """CPU paths: generic, avx2 and avx512 (where the CPU has them) give
    bit-identical keys, and auto those of its choice for the dtype; a forced path the CPU lacks is a ValueError naming
    the missing features; an unknown path, or a CUDA path on CPU, is a
    ValueError naming ``path`` (checked by the wrapper and by the kernel
    itself)."""
    hidden = torch.randn(5, 37, generator=gen).to(torch.bfloat16)
    weight = torch.randn(200, 37, generator=gen).to(torch.bfloat16)
    call = {
        "argmax": lambda p: localargmax.shard_argmax(hidden, weight, path=p),
        "topk": lambda p: localargmax.shard_topk(hidden, weight, 3, path=p),
        "sample": lambda p: localargmax.shard_sample(hidden, weight, torch.full((5,), 0.7), 9, path=p),
    }[op]
    auto, generic = call("auto"), call("generic")
    chosen = localargmax.kernel_path(torch.bfloat16)  # brgemm on AMX (DESIGN.md, "CPU paths")
    assert torch.equal(auto, call(chosen)), chosen
    if bit_identical_to_generic("auto", torch.bfloat16):
        assert torch.equal(auto, generic), chosen
    for name in ("avx2", "avx512", "avx512_bf16", "brgemm"):
        try:
            got = call(name)
        except ValueError as e:  # a CPU without it: the refusal must say what is missing
            assert f"path='{name}' needs a CPU with" in str(e) and "this CPU lacks" in str(e)
        else:
            if name in BIT_EXACT_CPU_PATHS:  # vdpbf16ps, brgemm: other bits for bf16 (tests/test_cpu_paths.py)
                assert torch.equal(got, generic), name
    for bad in ("mma", "simt", "mma/4", "AVX2", "amx", "", None, 3):
        with pytest.raises(ValueError, match="path must be one of"):
            call(bad)
    with pytest.raises(
        ValueError, match="path must be 'auto', 'generic', 'avx2', 'avx512', 'avx512_bf16' or 'brgemm' on CPU"
    ):
        torch.ops.localargmax.shard_argmax.default(hidden, weight, None, 0, 200, "gemm")


# ----------------------------------------------------------------------------- the log-partition pair


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_log_partition_pair_on_every_cpu_path_and_thread_count(gen, dtype):
    """shard_argmax(log_partition=True): without a transform the same keys as
    shard_argmax; ref is the value of the row's key; ref + log(sum) is the
    float64 logsumexp of the valid rows only (padding that would dominate
    excluded), within 1e-5; the pairs are bit-identical on every bit-exact
    CPU path and 1 or 2 threads (tiles merged in order, whatever the chunking)."""
    for hsize, rows in ((7, 200), (64, 1000), (40, 4097)):
        hidden, weight, bias = random_problem(gen, 5, rows, hsize, dtype, bias="float32")
        hidden = (hidden.float() * 3).to(dtype)
        num_valid = rows - 10
        dominant_padding(hidden, weight, num_valid)
        for scale, cap in ((1.0, None), (0.3, 5.0)):
            kw = dict(bias=bias, num_valid=num_valid, log_partition=True, scale=scale, soft_cap=cap)
            results = {
                variant: localargmax.shard_argmax(hidden, weight, **kw) for variant in each_cpu_path_and_thread_count()
            }
            keys, pairs = results[("cpu", 1)]
            for variant, (k, p) in results.items():
                assert torch.equal(k, keys) and torch.equal(p.view(torch.int32), pairs.view(torch.int32)), variant
            if cap is None:
                with use_path(CPU_PATHS[0]):  # the same path ("default": auto's bit-exact float32 choice)
                    assert torch.equal(keys, localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=num_valid))
            assert torch.equal(pairs[:, 0], localargmax.decode_keys(keys)[1])
            err = log_partition_error(pairs, hidden, weight, bias, num_valid, scale, cap)
            assert err <= 1e-5, (hsize, rows, scale, err)


def test_log_partition_opcheck_empty_shard_and_batch_zero(gen):
    """opcheck of shard_argmax_lse; an empty shard gives (-inf, 0) (and keys
    0), a batch of 0 rows a [0, 2] pair tensor."""
    hidden, weight, bias = random_problem(gen, 4, 150, 16, bias="float32")
    op = torch.ops.localargmax.shard_argmax_lse.default
    for path in ("auto", "generic"):
        torch.library.opcheck(op, (hidden, weight, None, 10, 140), {"path": path})
        torch.library.opcheck(op, (hidden, weight, bias, 0, 150, 0.5, 3.0), {"path": path})
        torch.library.opcheck(op, (hidden[:0], weight, bias, 0, 150), {"path": path})
    keys, pairs = localargmax.shard_argmax(hidden, weight, num_valid=0, log_partition=True)
    assert torch.equal(keys, torch.zeros(4, dtype=torch.int64))
    assert pairs.tolist() == [[-math.inf, 0.0]] * 4
    keys, pairs = localargmax.shard_argmax(hidden[:0], weight, log_partition=True)
    assert keys.shape == (0,) and pairs.shape == (0, 2) and pairs.dtype == torch.float32


def test_log_partition_arguments_name_them(gen):
    hidden, weight, _ = random_problem(gen, 2, 10, 4)
    bad = [
        (dict(log_partition=1), TypeError, "log_partition must be a bool"),
        (dict(log_partition=True, scale=0.0), ValueError, "scale must be a finite float > 0"),
        (dict(log_partition=True, scale=-1.0), ValueError, "scale must be a finite float > 0"),
        (dict(log_partition=True, scale=math.inf), ValueError, "scale must be a finite float > 0"),
        (dict(log_partition=True, scale=True), ValueError, "scale must be a finite float > 0"),
        (dict(log_partition=True, soft_cap=0.0), ValueError, "soft_cap must be None or a finite float > 0"),
        (dict(log_partition=True, soft_cap=math.nan), ValueError, "soft_cap must be None or a finite float > 0"),
        (dict(scale=2.0), ValueError, "pass log_partition=True"),
        (dict(soft_cap=30.0), ValueError, "pass log_partition=True"),
    ]
    for kw, exc, match in bad:
        calls = [
            lambda: localargmax.shard_argmax(hidden, weight, **kw),
            lambda: localargmax.shard_topk(hidden, weight, 2, **kw),
        ]
        if "log_partition" in kw:  # shard_sample takes a scale / soft-cap alone: it changes the samples
            calls.append(lambda: localargmax.shard_sample(hidden, weight, torch.ones(2), 0, **kw))
        for call in calls:
            with pytest.raises(exc, match=match):
                call()
    # the C++ op checks the same (direct torch.ops calls)
    for scale, cap in ((0.0, 0.0), (1.0, -1.0), (math.nan, 0.0), (1e-50, 0.0)):
        with pytest.raises(ValueError, match="log-partition: scale|log-partition: soft_cap"):
            torch.ops.localargmax.shard_argmax_lse.default(hidden, weight, None, 0, 10, scale, cap)


@pytest.mark.parametrize("flush", [False, True], ids=["denormals-kept", "caller-flushes"])
def test_subnormal_scale_and_soft_cap_are_refused_in_either_flush_mode(gen, flush):
    """A scale or soft-cap below 2**-126 is subnormal in float32, where the
    kernel's products would follow the caller's flush-to-zero mode: refused
    alike with and without FTZ / DAZ on the calling thread (the op layer and
    the raw C++ op), and 2**-126 itself accepted."""
    hidden, weight, _ = random_problem(gen, 2, 10, 4)
    if flush and not torch.set_flush_denormal(True):
        pytest.skip("torch.set_flush_denormal is not supported on this CPU (no SSE3 / not x86)")
    try:
        for tiny in (1e-40, 2.0**-127, 2.0**-149):
            for kw, name in ((dict(scale=tiny), "scale"), (dict(soft_cap=tiny), "soft_cap")):
                with pytest.raises(ValueError, match=rf"{name} must be >= 2\*\*-126"):
                    localargmax.shard_argmax(hidden, weight, log_partition=True, **kw)
            for scale, cap in ((tiny, 0.0), (1.0, tiny)):
                with pytest.raises(ValueError, match=r"log-partition: (scale|soft_cap) .*2\*\*-126"):
                    torch.ops.localargmax.shard_argmax_lse.default(hidden, weight, None, 0, 10, scale, cap)
        keys, pairs = localargmax.shard_argmax(hidden, weight, log_partition=True, scale=2.0**-126, soft_cap=2.0**-126)
        assert keys.shape == (2,) and bool(torch.isfinite(pairs[:, 0]).all())
    finally:
        torch.set_flush_denormal(False)
