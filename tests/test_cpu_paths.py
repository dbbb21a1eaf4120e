"""The CPU kernel's ISA paths (DESIGN.md, "CPU paths"): the CPUID -> path
choice as a pure function of fake feature sets (localargmax._C._cpu_path,
the C++ choice itself); every named path this CPU has against the float64
reference with the hard cases planted, against generic bit for bit where
DESIGN.md says so (avx2, avx512; avx512_bf16 for float32 / float16), and
batch-position and shard invariance where it does not (avx512_bf16 with
bfloat16 weights; brgemm, every dtype: tests/test_cpu_brgemm.py for larger
batches). Paths this CPU lacks: the op's refusal is checked, then
the test is skipped with it as the reason (it names the missing features)."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from localargmax import _C
from localargmax.bench.report import cpu_auto_path
from tests.support.paths import (
    BIT_EXACT_CPU_PATHS,
    CPU_ISA_PATHS,
    KernelPath,
    cpu_path_unavailable,
    flushes_denormals,
    use_path,
)
from tests.support.problems import integer_problem, make_shards, random_problem, simulated_argmax
from tests.support.reference import check_against_reference, ref_argmax, reference_logits_and_error
from tests.support.shard_argmax_common import DTYPE_IDS, DTYPES, dominant_padding, log_partition_error

EPYC_AVX2 = "fpu sse4_2 avx avx2 fma f16c bmi2"
EPYC_ZEN4 = EPYC_AVX2 + " avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni"
XEON_SPR = EPYC_ZEN4 + " avx512_fp16 amx_tile amx_bf16 amx_int8"

# ----------------------------------------------------------------------------- the choice, a pure function


@pytest.mark.parametrize(
    ("flags", "auto", "have"),
    [
        ("", "generic", ("generic", "brgemm")),
        ("avx2 fma", "generic", ("generic", "brgemm")),  # no F16C: not the AVX2 path
        (EPYC_AVX2, "avx2", ("generic", "avx2", "brgemm")),
        ("avx2 fma f16c avx512f", "avx512", ("generic", "avx2", "avx512", "brgemm")),
        ("avx512f avx512bw avx512_bf16", "generic", ("generic", "brgemm")),  # the AVX-512 builds use AVX2 code too
        (EPYC_ZEN4, "avx512", CPU_ISA_PATHS),
        (XEON_SPR, "avx512", CPU_ISA_PATHS),  # float32: no AMX path (DESIGN.md)
        ("amx_tile amx_bf16", "generic", ("generic", "brgemm")),
    ],
)
def test_choice_from_fake_features(flags, auto, have):
    """auto for float32 weights = the first of avx512, avx2, generic the
    features allow (never avx512_bf16 or brgemm, not bit-exact); a named path
    runs as itself where the features have what it needs (brgemm: always,
    through ATen), else ValueError naming what is missing; the exported table
    (_C._cpu_paths) says the same."""
    needs = {
        "generic": (),
        "avx2": ("avx2", "fma", "f16c"),
        "avx512": ("avx2", "fma", "f16c", "avx512f"),
        "avx512_bf16": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"),
        "brgemm": (),
    }
    assert _C._cpu_path("auto", flags) == auto
    assert _C._cpu_path("auto", flags) == auto  # the same answer again: no state
    assert _C._cpu_path("auto", flags, "float32") == auto
    features = set(flags.split())
    for name in CPU_ISA_PATHS:
        lacks = [f for f in needs[name] if f not in features]
        assert (name in have) == (not lacks), name
        if not lacks:
            assert _C._cpu_path(name, flags) == name
            for dtype in ("bfloat16", "float16"):  # a named path is itself for every dtype
                assert _C._cpu_path(name, flags, dtype) == name
        else:
            with pytest.raises(ValueError) as info:
                _C._cpu_path(name, flags)
            msg = str(info.value)
            assert f"path='{name}' needs a CPU with {', '.join(needs[name])}" in msg
            assert msg.endswith(f"this CPU lacks {', '.join(lacks)}"), msg
    # the table _C exports (what Python, the benchmark and these tests read) is the one the choice uses
    table = localargmax._validation.CPU_PATHS
    assert {n: p.needs for n, p in table.items()} == needs and tuple(table) == CPU_ISA_PATHS
    assert [n for n, p in table.items() if p.bit_exact] == ["generic", "avx2", "avx512"]


@pytest.mark.parametrize(
    ("flags", "bf16", "fp16"),
    [
        (EPYC_ZEN4, "avx512_bf16", "avx512"),  # this machine's kind: bf16 at vdpbf16ps, no AMX
        (XEON_SPR, "brgemm", "avx512"),  # AMX-BF16, no AMX-FP16
        (XEON_SPR + " amx_fp16", "brgemm", "brgemm"),  # Granite Rapids
        (EPYC_ZEN4 + " amx_bf16", "avx512_bf16", "avx512"),  # no amx_tile (the OS did not enable the tiles)
        ("avx2 fma f16c avx512f avx512_bf16", "avx512", "avx512"),  # no avx512bw: not the avx512_bf16 build
        ("amx_tile amx_bf16 amx_fp16", "brgemm", "brgemm"),
        (EPYC_AVX2, "avx2", "avx2"),
    ],
)
def test_auto_takes_brgemm_where_it_runs_natively(flags, bf16, fp16):
    """auto by dtype: brgemm for bfloat16 / float16 weights where the AMX
    tiles run them (ATen's could_pack: amx_tile + amx_bf16 / amx_fp16), else
    avx512_bf16 for bfloat16 where the CPU has what it needs, else the
    bit-exact choice; float32 never (no AMX float32); a pure function of the
    features and the dtype."""
    assert _C._cpu_path("auto", flags, "bfloat16") == bf16
    assert _C._cpu_path("auto", flags, "float16") == fp16
    assert _C._cpu_path("auto", flags, "float32") == _C._cpu_path("auto", flags) != "brgemm"
    with pytest.raises(ValueError, match="dtype must be 'float32', 'bfloat16' or 'float16', got 'int8'"):
        _C._cpu_path("auto", flags, "int8")


def test_choice_refuses_unknown_names():
    for bad in ("AVX2", "amx", "amx_bf16", "avx512bf16", "", "mma", "BRGEMM"):
        with pytest.raises(
            ValueError, match="path must be 'auto', 'generic', 'avx2', 'avx512', 'avx512_bf16' or 'brgemm'"
        ):
            _C._cpu_path(bad, XEON_SPR)
    with pytest.raises(TypeError):
        _C._cpu_path(3)


def test_detected_features_agree_with_proc_cpuinfo():
    """The choice on this CPU (CPUID) equals the choice from /proc/cpuinfo's
    flags (the kernel clears flags the OS does not enable), path by path, and
    the benchmark's env record names the path auto runs."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line.split(":", 1)[1] for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags on this system")
    for name in ("auto", *CPU_ISA_PATHS):
        for dtype in ("float32", "bfloat16", "float16"):  # auto by dtype: the AMX features too
            outcomes = []
            for given in (None, flags):
                try:
                    outcomes.append(_C._cpu_path(name, given, dtype))
                except ValueError as e:
                    outcomes.append(str(e))
            assert outcomes[0] == outcomes[1], (name, dtype)
    assert cpu_auto_path() == _C._cpu_path("auto")


# ----------------------------------------------------------------------------- every path against float64


def _runnable(name: str) -> None:
    """Skip (after checking the op's refusal) when this CPU lacks path ``name``."""
    why = cpu_path_unavailable(name)
    if why is None:
        return
    hidden, weight = torch.ones(2, 8), torch.ones(4, 8)
    with pytest.raises(ValueError, match="needs a CPU with .* this CPU lacks"):
        localargmax.shard_argmax(hidden, weight, path=name)
    pytest.skip(why)


def _bit_exact(name: str, dtype: torch.dtype) -> bool:
    return name in BIT_EXACT_CPU_PATHS or (name == "avx512_bf16" and dtype != torch.bfloat16)


@pytest.mark.parametrize("name", CPU_ISA_PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_path_against_float64_with_hard_cases(gen, name, dtype):
    """Each path on 4 simulated ranks of an uneven vocabulary (an empty last
    shard, padding that would win): random problems within the float32 bound
    of the float64 reference; exact integer problems with ties across rows
    and ranks, a NaN row, an all -inf batch row: exactly the reference."""
    _runnable(name)
    path = KernelPath("cpu", name)
    for hsize, vocab, batch in ((37, 70, 7), (64, 1000, 13), (100, 333, 6), (1, 50, 3)):
        hidden, weight, bias = random_problem(gen, batch, vocab, hsize, dtype, bias="float32")
        shards = make_shards(weight, bias, 4, 64, hidden=hidden)
        assert any(s.num_valid == 0 for _, _, s in shards) == (vocab == 70)
        with use_path(path):
            ids = simulated_argmax(hidden, shards)
        check_against_reference(
            ids, hidden, weight, bias, reference=reference_logits_and_error(hidden, weight, bias), context=name
        )

        # exact ties across rows and ranks, and a NaN row (rule 2: it wins every batch row)
        hidden, weight, bias = integer_problem(gen, batch, vocab, hsize, dtype, bias=True)
        weight[5] = weight[vocab - 1]
        nan_row = vocab // 2 + 1
        weight[nan_row, hsize - 1] = math.nan
        with use_path(path):
            ids = simulated_argmax(hidden, make_shards(weight, bias, 4, 64, hidden=hidden))
        assert ids.tolist() == [nan_row] * batch, (name, hsize, vocab)
        assert torch.equal(ids, ref_argmax(hidden, weight, bias))
        # exact ties, no NaN; the last batch row all -inf (rule 3: the first valid id)
        hidden, weight, bias = integer_problem(gen, batch, vocab, hsize, dtype, bias=True)
        weight[5] = weight[vocab - 1]
        weight[:, 0] = -weight[:, 0].abs().clamp(min=1)  # inf * negative: -inf, never 0 * inf
        hidden[batch - 1, 0] = math.inf
        with use_path(path):
            ids = simulated_argmax(hidden, make_shards(weight, bias, 4, 64, hidden=hidden))
        want = ref_argmax(hidden, weight, bias)
        assert torch.equal(ids, want), (name, hsize, vocab, ids.tolist(), want.tolist())
        assert int(ids[-1]) == 0


def _logit_of_row(hidden, weight, row, num_valid, name):
    """The float32 value of local ``row`` alone (every other row gets bias -inf)."""
    bias = torch.full((weight.shape[0],), -math.inf)
    bias[row] = 0.0
    ids, values = localargmax.decode_keys(
        localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=num_valid, path=name)
    )
    assert ids.eq(row).all()
    return values


@pytest.mark.parametrize("name", CPU_ISA_PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_path_bits_against_generic(gen, name, dtype):
    """avx2 and avx512 (and avx512_bf16 for float32 / float16 weights) give
    generic's keys and log-partition pairs bit for bit, for argmax, top-k,
    sampling, with and without bias, every k tail and batch tail.
    avx512_bf16 with bfloat16 weights and brgemm: other bits, but the same keys for a
    batch row wherever it sits in the batch (alone, permuted), identical
    weight rows give identical values (exact ties), its log-partition pairs
    are within 1e-5 of float64, and an empty shard or batch 0 give what
    every path gives."""
    _runnable(name)
    for hsize, rows, batch in ((1, 9, 1), (7, 130, 13), (8, 65, 6), (33, 200, 7), (64, 257, 12), (100, 64, 2)):
        hidden, weight, bias = random_problem(gen, batch, rows, hsize, dtype, bias="float32")
        num_valid = rows - 3
        dominant_padding(hidden, weight, num_valid)
        weight[1] = weight[num_valid - 1]
        temperature = torch.rand(batch, generator=gen) + 0.1
        temperature[0] = 0.0

        def run(p, h=hidden, t=temperature, offset=0):
            kw = dict(bias=bias, num_valid=num_valid, vocab_start=11, path=p)
            return (
                localargmax.shard_argmax(h, weight, **kw),
                localargmax.shard_topk(h, weight, 5, **kw),
                localargmax.shard_sample(h, weight, t, 3, offset, **kw),  # noise of row b: offset + b
                *localargmax.shard_argmax(h, weight, log_partition=True, scale=0.5, soft_cap=4.0, **kw),
            )

        def bits(t):
            return t.view(torch.int32) if t.is_floating_point() else t

        got = run(name)
        ctx = (name, hsize, rows, batch)
        if _bit_exact(name, dtype):
            for a, b in zip(got, run("generic")):
                assert torch.equal(bits(a), bits(b)), ctx
            continue
        ids, _ = localargmax.decode_keys(got[0])
        check_against_reference(
            ids - 11, hidden, weight[:num_valid], bias[:num_valid], min_clear_fraction=0.8, context=str(ctx)
        )
        assert log_partition_error(got[4], hidden, weight, bias, num_valid, 0.5, 4.0) <= 1e-5, ctx
        perm = torch.randperm(batch, generator=gen)
        permuted = run(name, hidden[perm].contiguous(), temperature[perm])
        for i in (0, 1, 3, 4):  # argmax, top-k and the pairs follow the row (sampling noise follows the position)
            assert torch.equal(bits(got[i][perm]), bits(permuted[i])), (ctx, i)
        for b in range(batch):
            alone = run(name, hidden[b : b + 1], temperature[b : b + 1], offset=b)
            for a, c in zip(got, alone):
                assert torch.equal(bits(a[b : b + 1]), bits(c)), (ctx, b)
        # rows 1 and num_valid - 1 are identical: bit-identical values (rule 5), the tie to row 1 (rule 1);
        # their random biases differ, so the tie is checked with equal ones
        v1 = _logit_of_row(hidden, weight, 1, num_valid, name)
        v2 = _logit_of_row(hidden, weight, num_valid - 1, num_valid, name)
        assert torch.equal(bits(v1), bits(v2)), ctx
        tie_bias = bias.clone()  # the pair outscores every other valid row, with equal biases
        tie_bias[1] = tie_bias[num_valid - 1] = 1e3
        tied = localargmax.shard_argmax(hidden, weight, bias=tie_bias, num_valid=num_valid, vocab_start=11, path=name)
        assert localargmax.decode_keys(tied)[0].eq(11 + 1).all(), ctx
    empty = localargmax.shard_argmax(hidden, weight, num_valid=0, path=name)
    assert torch.equal(empty, torch.zeros(batch, dtype=torch.int64))
    assert localargmax.shard_argmax(hidden[:0], weight, path=name).shape == (0,)


def test_benchmark_lists_the_paths_this_cpu_has():
    """bench's cpu_paths_available (gpu_check's CPU paths, bench/cpu_paths.py)
    is the named paths the op accepts on this CPU; generic always."""
    from localargmax.bench.report import cpu_paths_available

    have = cpu_paths_available()
    assert have == [n for n in CPU_ISA_PATHS if cpu_path_unavailable(n) is None]
    assert have[0] == "generic" and _C._cpu_path("auto") in have


@pytest.mark.parametrize("name", CPU_ISA_PATHS)
def test_denormals_kept_or_flushed_as_documented(name):
    """Denormal bf16 weights (1e-39): the bit-exact paths keep them (generic's
    values, which order the two rows); avx512_bf16 flushes them to zero
    (vdpbf16ps' DAZ / FTZ, DESIGN.md "CPU paths"), so the rows tie at 0.0 and
    the smaller index wins; brgemm flushes them where it runs on the AMX
    tiles and keeps them where ATen serves it otherwise (this EPYC)."""
    _runnable(name)
    hidden = torch.ones(1, 32, dtype=torch.bfloat16)
    weight = torch.zeros(2, 32, dtype=torch.bfloat16)
    weight[0, 0], weight[1, 0] = -1e-39, 1e-39
    ids, values = localargmax.decode_keys(localargmax.shard_topk(hidden, weight, 2, path=name))
    if flushes_denormals(name, torch.bfloat16):
        assert ids.tolist() == [[0, 1]] and values.tolist() == [[0.0, 0.0]]
    else:
        tiny = float(weight[1, 0].float())
        assert ids.tolist() == [[1, 0]] and values.tolist() == [[tiny, -tiny]]


STEPS = {
    "lm_head_argmax": lambda h, w: localargmax.lm_head_argmax(h, w),
    "lm_head_topk": lambda h, w: localargmax.lm_head_topk(h, w, 2),
    "lm_head_sample": lambda h, w: localargmax.lm_head_sample(h, w, temperature=1.0, seed=1),
    "lm_head_sample top_k": lambda h, w: localargmax.lm_head_sample(h, w, temperature=1.0, seed=1, top_k=2),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_use_path_reaches_every_step(step):
    """tests' use_path binds the ops' path= in every module whose step calls
    them (once, a step moved to sampling.py and use_path failed with an
    AttributeError; a step left unbound would run auto and its path's tests
    would prove nothing): a CUDA path bound, a CPU call must be refused."""
    hidden, weight = torch.randn(3, 8), torch.randn(70, 8)
    with use_path(KernelPath("cuda", "simt")), pytest.raises(ValueError, match="path must be one of"):
        STEPS[step](hidden, weight)


@pytest.mark.parametrize("name", CPU_ISA_PATHS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_path_with_hidden_size_zero(gen, name, dtype):
    """H = 0: every logit is its float32 bias (an empty sum is +0.0), for every
    op of every path; brgemm once raised std::bad_alloc here (oneDNN has no
    K = 0 kernel). ids and top-k against float64 of the bias, ties planted
    (rows 3 and 60 share the best bias: the smaller id wins), sampling and the
    log-partition pairs against the generic path's bits."""
    _runnable(name)
    batch, rows = 3, 70
    hidden, weight = torch.empty(batch, 0, dtype=dtype), torch.empty(rows, 0, dtype=dtype)
    bias = torch.randn(rows, generator=gen)
    bias[60] = bias[3] = bias.max() + 1
    want = bias.double().expand(batch, rows)
    keys = localargmax.shard_argmax(hidden, weight, bias=bias, path=name)
    assert localargmax.decode_keys(keys)[0].tolist() == want.argmax(1).tolist() == [3] * batch, name
    top = localargmax.shard_topk(hidden, weight, 5, bias=bias, path=name)
    ref_top = sorted(range(rows), key=lambda v: (-float(bias[v]), v))[:5]
    assert localargmax.decode_keys(top)[0].tolist() == [ref_top] * batch, name
    t = torch.tensor([0.0, 0.7, 1.0])
    ops = ((localargmax.shard_argmax, ()), (localargmax.shard_topk, (5,)), (localargmax.shard_sample, (t, 7)))
    for op, args in ops:
        for lse in (False, True):
            ours = op(hidden, weight, *args, bias=bias, path=name, log_partition=lse)
            generic = op(hidden, weight, *args, bias=bias, path="generic", log_partition=lse)
            for a, b in zip(ours if lse else [ours], generic if lse else [generic], strict=True):
                assert torch.equal(a, b), (name, op.__name__, lse)
