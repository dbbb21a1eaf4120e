"""shard_argmax on CUDA (skipped without a GPU, naming why): the paths' hard
cases (ties at every tile position, padding, NaN / -inf rows, subnormals, grid
limits, misaligned hidden), every tensor-core variant against the reference
and the same-order pairs bit for bit, CUDA-graph capture, the log-partition
pair on every path; and the C++ emulation test of the tensor-core fragment map
(no GPU needed) with its mutants."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from localargmax._validation import MMA_CONFIGS
from localargmax.reference import reference_argmax
from tests.support.cpp import check_cpp_test, needs_gxx, run_against_mutation
from tests.support.paths import (
    KernelPath,
    cuda_only,
    each_cuda_path,
    on,
    use_path,
)
from tests.support.problems import (
    make_shards,
    planted_problem,
    random_problem,
    shard_keys,
)
from tests.support.reference import (
    check_against_reference,
    ref_argmax,
    reference_logits_and_error,
)
from tests.support.shard_argmax_common import (
    DTYPE_IDS,
    DTYPES,
    HALF,
    dominant_padding,
    ids_of,
    log_partition_error,
)

# ----------------------------------------------------------------------------- CUDA paths: hard cases


@cuda_only
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "batch,hsize",  # H = 4096 at small batches only: the float64 reference is a loop over k
    [(b, h) for h in (8, 40, 264) for b in (1, 8, 9, 17, 33, 64, 65, 130)]
    + [(1, 4096), (9, 4096), (3, 4104), (5, 33), (70, 33)],
)
@pytest.mark.parametrize("bias", [None, "weight"])
def test_cuda_paths_match_reference(gen, dtype, batch, hsize, bias):
    """Every CUDA path against one float64 reference, padding that would win (H = 33: mma declines, simt runs)."""
    hidden, weight, b = random_problem(gen, batch, 1499, hsize, dtype, bias)
    ((w, bb, _),) = make_shards(weight, b, 1, 1501, hidden=hidden)
    reference = reference_logits_and_error(hidden, weight, b)
    for path in each_cuda_path():
        ids = ids_of(*on(path, hidden, w), bias=on(path, bb), vocab_start=77, num_valid=1499) - 77
        check_against_reference(
            ids, hidden, weight, b, reference=reference, context=f"{path} {dtype} B={batch} H={hsize}"
        )


@cuda_only
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch", [1, 9, 64, 130])
def test_cuda_exact_ties_at_every_tile_position(gen, dtype, batch):
    """Rule 1 at row g or g + 8 of an m-tile, either m-tile of a warp, any
    warp, any block, any GEMM tile: the smallest index wins."""
    hidden, weight, _ = random_problem(gen, batch, 4100, 64, dtype)
    positions = [4099, 2050, 300, 130, 127, 40, 35, 27, 19, 11, 8, 3]
    weight[positions] = (hidden[0].float() * 3).to(dtype)
    hidden = hidden[:1].expand(batch, -1).contiguous()
    for path in each_cuda_path():
        assert torch.equal(ids_of(*on(path, hidden, weight)), torch.full((batch,), 3)), path


@cuda_only
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("tp", [2, 3, 4])
@pytest.mark.parametrize("batch", [5, 130])
@pytest.mark.parametrize("pad", ["huge", "nan"])
def test_cuda_tie_across_shards_of_unequal_num_valid(gen, dtype, tp, batch, pad):
    """The same winning row on the first and the last (partly padding) shard:
    the smaller index wins on every path; the GEMM's shape must not depend on num_valid."""
    hidden, weight, _ = random_problem(gen, batch, 1001, 256, dtype)
    weight[[5, 998]] = (hidden[0].float() * 3).to(dtype)
    hidden = hidden[:1].expand(batch, -1).contiguous()
    shards = make_shards(weight, None, tp, 64, hidden=hidden, pad=pad)
    assert shards[-1][2].num_valid < shards[0][2].num_valid
    for path in each_cuda_path():
        ids, _ = localargmax.merge_keys(shard_keys(on(path, hidden), shards))
        assert torch.equal(ids.cpu(), torch.full((batch,), 5)), path


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_cuda_padding_and_empty_shards(gen, dtype, tp):
    """Vocab not divisible by tp, shards that are all padding, padding that
    would win (huge and NaN), an exact tie across shards."""
    for vocab, batch in ((1, 3), (5, 9), (300, 17), (1001, 70)):
        hidden, weight, _ = random_problem(gen, batch, vocab, 40, dtype)
        weight[vocab // 2] = weight[0]
        # random data: judged with the float32 error bound; the copy of row 0 ties it exactly, so only
        # row 0 may win for the pair (rule 1): its column is taken out of the reference
        logits, err = reference_logits_and_error(hidden, weight)
        if vocab > 1:
            logits[:, vocab // 2] = -math.inf
        for pad in ("huge", "nan"):
            shards = make_shards(weight, None, tp, 64, hidden=hidden, pad=pad)
            for path in each_cuda_path():
                ids, _ = localargmax.merge_keys(shard_keys(on(path, hidden), shards))
                ctx = f"{path} vocab={vocab} pad={pad}"
                check_against_reference(ids, hidden, weight, context=ctx, reference=(logits, err))


@cuda_only
@pytest.mark.parametrize("dtype", HALF)
def test_cuda_nan_and_minus_inf_rows(gen, dtype):
    """Rule 2: a NaN logit wins (the smallest NaN index). Rule 3: -inf rows
    lose to any finite logit, and an all -inf batch row picks index 0."""
    hidden, weight, _ = random_problem(gen, 12, 500, 48, dtype)
    hidden = hidden.abs() + 0.01  # positive: a -inf weight row gives a -inf logit, not NaN
    weight[[3, 17, 200]] = float("-inf")
    nan_case = weight.clone()
    nan_case[[250, 90]] = float("nan")
    cases = {"-inf rows": weight, "nan rows": nan_case, "all -inf": torch.full_like(weight, float("-inf"))}
    wants = {name: ref_argmax(hidden, w) for name, w in cases.items()}
    assert int(wants["nan rows"][0]) == 90 and int(wants["all -inf"][0]) == 0
    finite_rows = reference_logits_and_error(hidden, weight)  # "-inf rows": random finite logits elsewhere
    for path in each_cuda_path():
        for name, w in cases.items():
            ids = ids_of(*on(path, hidden, w))
            if name == "-inf rows":  # near-ties judged with the float32 error bound
                check_against_reference(ids, hidden, w, context=f"{path}: {name}", reference=finite_rows)
            else:  # decided by rules 2 and 3
                assert torch.equal(ids, wants[name]), f"{path}: {name}"


@cuda_only
def test_cuda_subnormal_logits_are_not_flushed(gen):
    """No flush-to-zero on the comparison path: bf16 weights k * 2**-133
    (subnormal) against hidden 1 give distinct subnormal logits; a flushing
    path would see a tie and answer index 0."""
    tiny = torch.arange(1, 65, dtype=torch.float32) * 2.0**-133
    perm = torch.randperm(64, generator=gen)
    weight = torch.zeros(64, 16)
    weight[:, 0] = tiny[perm]
    weight = weight.to(torch.bfloat16)
    assert bool((weight[:, 0].float() == tiny[perm]).all())  # exact in bf16
    hidden = torch.ones(3, 16, dtype=torch.bfloat16)
    for path in each_cuda_path():
        assert torch.equal(ids_of(*on(path, hidden, weight)), torch.full((3,), int(perm.argmax()))), path


@cuda_only
@pytest.mark.parametrize(
    "path_name,batch", [("simt", 65535 * 8 + 3), ("mma", 65535 * 64 + 3), ("gemm", 65535 * 64 + 3)]
)
def test_cuda_batch_past_grid_y_limit(gen, path_name, batch):
    """More batch blocks (simt), 64-row batch chunks (mma) or batch rows (gemm
    keys kernel) than grid y holds: the grid-stride loops cover them all."""
    base, weight, _ = random_problem(gen, 61, 70, 8, torch.bfloat16)
    rows = torch.arange(batch) % 61
    with use_path(KernelPath("cuda", path_name)):
        ids = ids_of(base[rows].cuda(), weight.cuda())
    assert torch.equal(ids, ids[:61][rows])  # the same hidden row, the same key at any batch position
    check_against_reference(ids[:61], base, weight, context=path_name)  # random bf16: the float32 bound


@cuda_only
@pytest.mark.parametrize("path_name", ["simt", "mma", "gemm"])
def test_cuda_columns_past_2_to_the_31(gen, path_name):
    """A shard of 2**31 + 200 rows (the limit is 2**31 - 64; this one is cut
    to num_valid = 2**31 - 100): column indexes past 2**31 - 1 overflow 32-bit
    arithmetic. The winner is planted in the last block; needs ~36 GiB of device
    memory (H200 has 139). gemm: refused past kGemmMaxRows rows (cuBLAS failed on
    2**31 - 1 of them), and auto takes mma at a gemm batch there."""
    free, _ = torch.cuda.mem_get_info()
    if free < 40 * 2**30:
        pytest.skip(f"needs 40 GiB of free device memory, {free / 2**30:.0f} GiB free")
    rows, num_valid = 2**31 + 200, 2**31 - 100
    hidden = torch.ones(2, 8, dtype=torch.bfloat16, device="cuda")
    weight = torch.zeros(rows, 8, dtype=torch.bfloat16, device="cuda")
    winner = num_valid - 1 - int(torch.randint(0, 50, (1,), generator=gen))
    weight[winner] = 1.0
    weight[num_valid + 5] = 2.0  # padding past num_valid that would win
    if path_name == "gemm":  # past kGemmMaxRows (cuBLAS failed at 2**31 - 1 rows): refused, and auto does not take it
        with pytest.raises(ValueError, match=r"path='gemm' takes shards of at most 2097152 rows"):
            ids_of(hidden, weight, vocab_start=2**31 + 50, num_valid=num_valid, path="gemm")
        big = torch.ones(17, 8, dtype=torch.bfloat16, device="cuda")  # a batch at which auto takes gemm
        ids = ids_of(big, weight, vocab_start=2**31 + 50, num_valid=num_valid)
        assert ids.tolist() == [2**31 + 50 + winner] * 17, (ids.tolist(), winner)
        return
    ids = ids_of(hidden, weight, vocab_start=2**31 + 50, num_valid=num_valid, path=path_name)  # last id 2**32 - 51
    assert ids.tolist() == [2**31 + 50 + winner] * 2, (ids.tolist(), winner)
    del weight
    torch.cuda.empty_cache()


@cuda_only
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch", [1, 9, 130])
def test_cuda_misaligned_hidden_gives_the_keys_of_an_aligned_one(gen, dtype, batch):
    """The path and the vector width (so the summation order) must depend only
    on the weight's layout and the shared arguments, never on where hidden
    happens to sit: a hidden at a 2-byte offset, or with an odd row stride,
    gives bit-identical keys to a contiguous aligned copy on every path (a rank
    whose activations sit misaligned would otherwise sum in another order)."""
    hidden, weight, _ = random_problem(gen, batch, 3000, 264, dtype)
    h, w = hidden.cuda(), weight.cuda()
    offset = torch.empty(batch * 264 + 1, dtype=dtype, device="cuda")[1:].view(batch, 264)
    offset.copy_(h)
    strided = torch.empty(batch, 271, dtype=dtype, device="cuda")[:, :264]
    strided.copy_(h)
    assert offset.data_ptr() % 16 != 0 and strided.stride(0) % 8 != 0
    for path in ("auto", "simt", "mma", "gemm"):
        want = localargmax.shard_argmax(h, w, path=path)
        for name, other in (("offset", offset), ("strided", strided)):
            assert torch.equal(localargmax.shard_argmax(other, w, path=path), want), f"{path} {name}"


@cuda_only
def test_cuda_path_arg_is_checked(gen):
    """An unknown path, or a forced path that cannot take the inputs, raises
    ValueError naming it (no silent fallback)."""
    hidden, weight, _ = random_problem(gen, 2, 64, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="path must be one of"):
        localargmax.shard_argmax(hidden.cuda(), weight.cuda(), path="tensorcore")
    with pytest.raises(ValueError, match="path='mma' needs"):
        localargmax.shard_argmax(hidden[:, :30].cuda(), weight[:, :30].cuda(), path="mma")
    with pytest.raises(ValueError, match="does not exist for top-k"):
        localargmax.shard_topk(hidden.cuda(), weight.cuda(), 2, path="gemm")
    with pytest.raises(ValueError, match="n8_r256' has no top-k"):
        localargmax.shard_topk(hidden.cuda(), weight.cuda(), 2, _mma_config="n8_r256")
    with pytest.raises(ValueError, match="needs bfloat16 or float16"):
        localargmax.shard_argmax(hidden.float().cuda(), weight.float().cuda(), path="gemm")


MMA_CONFIG_NAMES = list(MMA_CONFIGS)
_CLASSES = {kc: [n for n, m in MMA_CONFIGS.items() if m.kc == kc] for kc in {m.kc for m in MMA_CONFIGS.values()}}
SAME_ORDER_MMA_PAIRS = [
    (a, b, 32 if kc == 2 else 64) for kc, names in _CLASSES.items() for a, b in zip(names, names[1:])
]
"""DESIGN.md rule 5: (config, config, a batch of their class) that sum in the same order."""


def _tma_unsupported(config: str) -> bool:
    """A TMA config on a device below compute capability 9.0 (run_mma refuses it)."""
    return MMA_CONFIGS[config].tma and torch.cuda.get_device_capability()[0] < 9


def test_mma_config_keyword_is_checked_before_the_kernel():
    """The private ``_mma_config`` keyword names one tensor-core config on CUDA only, with
    ``path`` "auto" or "mma"; a name not in the table, another path, the CPU, or ``"mma/..."``
    in the public ``path`` is a ValueError naming the argument (no GPU needed)."""
    from localargmax._validation import check_path_arg, mma_config_path

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for name in MMA_CONFIG_NAMES:
        assert mma_config_path("mma", name, cuda) == mma_config_path("auto", name, cuda) == f"mma/{name}"
    assert mma_config_path("simt", None, cuda) == "simt"
    for bad in ("n3_r64", "", "N1_R64", "n1_r64 ", 4):
        with pytest.raises(ValueError, match="_mma_config must be one of"):
            mma_config_path("mma", bad, cuda)
    with pytest.raises(ValueError, match="path must be 'auto' or 'mma', got 'simt'"):
        mma_config_path("simt", "n1_r64", cuda)
    with pytest.raises(ValueError, match="exists on CUDA only"):
        mma_config_path("auto", "n1_r64", cpu)
    for bad in ("mma/n1_r64", "mma/4", "MMA", 4):
        with pytest.raises(ValueError, match=f"path must be one of .* on cuda, got {bad!r}"):
            check_path_arg(bad, cuda)
    hidden, weight = torch.randn(2, 16).to(torch.bfloat16), torch.randn(64, 16).to(torch.bfloat16)
    for call in (
        lambda: localargmax.shard_argmax(hidden, weight, _mma_config="n1_r64"),
        lambda: localargmax.shard_sample(hidden, weight, torch.ones(2), 1, _mma_config="n2_r64"),
    ):
        with pytest.raises(ValueError, match="exists on CUDA only"):
            call()
    with pytest.raises(ValueError, match="path must be one of .* on cpu, got 'mma/n1_r64'"):
        localargmax.shard_argmax(hidden, weight, path="mma/n1_r64")
    cpu_names = "'auto', 'generic', 'avx2', 'avx512', 'avx512_bf16' or 'brgemm'"
    with pytest.raises(ValueError, match=f"path must be {cpu_names} on CPU, got 'mma/n1_r64'"):
        torch.ops.localargmax.shard_argmax.default(hidden, weight, None, 0, 64, "mma/n1_r64")


@cuda_only
def test_cuda_mma_config_refusals(gen):
    """The C++ op refuses an unknown config name and a config that cannot take
    the inputs (H not a multiple of 8, float32), naming it."""
    hidden, weight, _ = random_problem(gen, 2, 64, 32, torch.bfloat16)
    h, w = hidden.cuda(), weight.cuda()
    with pytest.raises(ValueError, match="mma config 'n3_r64' is not one of n1_r64, "):
        torch.ops.localargmax.shard_argmax.default(h, w, None, 0, 64, "mma/n3_r64")
    if torch.cuda.get_device_capability()[0] < 9:  # the TMA configs: sm_90+
        for name in (n for n, m in MMA_CONFIGS.items() if m.tma):
            with pytest.raises(
                ValueError, match=f"mma config '{name}' copies the weight by TMA .* compute capability 9"
            ):
                localargmax.shard_argmax(h, w, _mma_config=name)
    with pytest.raises(ValueError, match="path='mma/n1_r64_sk2' needs sm_80\\+"):
        localargmax.shard_argmax(hidden[:, :30].cuda(), weight[:, :30].cuda(), _mma_config="n1_r64_sk2")
    with pytest.raises(ValueError, match="path='mma/n1_r64' needs bfloat16 or float16"):
        localargmax.shard_argmax(h.float(), w.float(), _mma_config="n1_r64")


@cuda_only
@pytest.mark.parametrize("config", MMA_CONFIG_NAMES)
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "f16"])
def test_every_cuda_mma_config_against_the_reference(gen, config, dtype):
    """_mma_config=<name> runs that config: planted winners (a wide gap) give the
    float64 reference's ids at batches below, at and past the config's batch
    rows (extra passes), with padding rows and a k tail; argmax and sample
    (temperature 0 is greedy). A TMA config below sm_90 is refused instead
    (test_cuda_mma_config_refusals)."""
    if _tma_unsupported(config):
        with pytest.raises(ValueError, match="compute capability 9"):
            hidden, weight, _ = random_problem(gen, 2, 64, 32, dtype)
            localargmax.shard_argmax(hidden.cuda(), weight.cuda(), _mma_config=config)
        return
    for batch, hsize in ((1, 4104), (9, 136), (33, 520), (70, 4096), (129, 264)):
        hidden, weight, _ = random_problem(gen, batch, 9000, hsize, dtype)
        winners = torch.randperm(8900, generator=gen)[:batch]  # distinct: every row keeps its plant
        weight[winners] = (hidden.float() * 3).to(dtype)  # ~3H against other plants ~N(0, 9H), others ~N(0, 1)
        bias = torch.randn(9000, generator=gen) * 0.01
        want = reference_argmax(hidden, weight[:8900], bias[:8900])
        h, w, b = hidden.cuda(), weight.cuda(), bias.cuda()
        got = ids_of(h, w, bias=b, vocab_start=5, num_valid=8900, _mma_config=config) - 5
        assert torch.equal(got, want), f"{config} batch {batch} H {hsize}"
        sampled = localargmax.shard_sample(
            h, w, torch.zeros(batch, device="cuda"), 3, bias=b, vocab_start=5, num_valid=8900, _mma_config=config
        )
        assert torch.equal(localargmax.decode_keys(sampled)[0].cpu() - 5, want), f"sample {config} batch {batch}"


@cuda_only
@pytest.mark.parametrize("pair", SAME_ORDER_MMA_PAIRS, ids=lambda p: f"{p[0]}-{p[1]}")
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "f16"])
def test_cuda_same_order_mma_configs_give_identical_keys(gen, pair, dtype):
    """DESIGN.md rule 5: configs of one order class (equal KC: neighbours in table order, so each
    TMA config beside the others of its class) give bit-identical keys on random floats, with a
    bias and padding (the TMA ones on sm_90+)."""
    a, b, batch = pair
    if _tma_unsupported(a) or _tma_unsupported(b):
        pytest.skip(f"{a} / {b}: a TMA config needs sm_90+ (its refusal: test_cuda_mma_config_refusals)")
    for hsize in (4096, 1032):
        hidden, weight, _ = random_problem(gen, batch, 20000, hsize, dtype)
        bias = (torch.randn(20000, generator=gen) * 0.1).cuda()
        h, w = hidden.cuda(), weight.cuda()
        keys = [
            localargmax.shard_argmax(h, w, bias=bias, vocab_start=7, num_valid=19990, _mma_config=c) for c in (a, b)
        ]
        assert torch.equal(keys[0], keys[1]), f"{a} vs {b}, H {hsize}"


@cuda_only
@pytest.mark.parametrize("batch", [4, 200])
def test_cuda_graph_capture_each_path(gen, batch):
    for path in each_cuda_path():
        hidden, weight, _ = random_problem(gen, batch, 5000, 128, torch.bfloat16)
        h, w = hidden.cuda(), weight.cuda()
        localargmax.shard_argmax(h, w)  # warm up (cuBLAS handles, workspaces) outside the graph
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            keys = localargmax.shard_argmax(h, w)
        new_hidden, new_weight, _ = random_problem(gen, batch, 5000, 128, torch.bfloat16)
        h.copy_(new_hidden.cuda())
        w.copy_(new_weight.cuda())
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(localargmax.decode_keys(keys)[0].cpu(), new_hidden, new_weight, context=str(path))


@needs_gxx
def test_mma_fragment_cpp(tmp_path, seed):
    """tests/cpp/test_mma_fragment.cpp: the tensor-core kernel's register map
    (csrc/common/mma_fragment.h) against an emulation of mma.sync m16n8k16
    written from the PTX ISA fragment tables, on the CPU."""
    check_cpp_test("test_mma_fragment", tmp_path, seed)


MMA_FRAGMENT_MUTATIONS = {  # id: (text of csrc/common/mma_fragment.h, broken replacement)
    "a_row_half": ("{ return reg % 2; }", "{ return reg / 2; }"),
    "a_word": ("return 2 * s + reg / 2;", "return 2 * s + reg % 2;"),
    "b_word": ("return 2 * s + reg; }", "return 2 * (1 - s) + reg; }"),
    "c_col": ("return 2 * (lane % 4) + r % 2;", "return 2 * (lane % 4) + r / 2;"),
    "chunk_k": ("return 8 * t + 4 * s + 2 * h + j;", "return 8 * t + 4 * s + h + 2 * j;"),
}


@needs_gxx
@pytest.mark.parametrize("mutation", list(MMA_FRAGMENT_MUTATIONS))
def test_cpp_test_catches_broken_fragments(tmp_path, mutation):
    """The C++ test can fail: it does against a broken copy of mma_fragment.h."""
    run_against_mutation("test_mma_fragment", "mma_fragment.h", *MMA_FRAGMENT_MUTATIONS[mutation], tmp_path)


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("batch", [1, 9, 130])
def test_cuda_log_partition_on_every_path(gen, dtype, batch):
    """CUDA: shard_argmax / shard_topk / shard_sample with log_partition on
    simt, mma and gemm (bf16 / fp16) and auto: the pair's ref + log1p(others)
    within 1e-5 of the float64 logsumexp of the valid rows (padding that would
    dominate excluded), ids as the CPU's on a planted problem; auto's keys
    with the log-partition are the plain auto keys bit for bit (the same path
    and config); a forced TMA config raises."""
    hidden, weight, bias, winners = planted_problem(gen, batch, 3000, 64, dtype, bias="float32")
    num_valid = 2990
    keep = winners < num_valid  # rows whose planted winner stays in the vocabulary: their ids are checked
    dominant_padding(hidden, weight, num_valid)
    want_ids = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=num_valid))[0]
    paths = ["auto", "simt"] + (["mma", "gemm"] if dtype != torch.float32 else [])
    for path in paths:
        for scale, cap in ((1.0, None), (0.5, 4.0)):
            kw = dict(bias=bias.cuda(), num_valid=num_valid, log_partition=True, scale=scale, soft_cap=cap, path=path)
            keys, pairs = localargmax.shard_argmax(hidden.cuda(), weight.cuda(), **kw)
            err = log_partition_error(pairs.cpu(), hidden, weight, bias, num_valid, scale, cap)
            assert err <= 1e-5, (path, scale, cap, err)
            assert torch.equal(pairs[:, 0].cpu(), localargmax.decode_keys(keys.cpu())[1])
            if cap is None:
                assert torch.equal(localargmax.decode_keys(keys.cpu())[0][keep], want_ids[keep])
                if scale == 1.0:
                    plain = localargmax.shard_argmax(
                        hidden.cuda(), weight.cuda(), bias=bias.cuda(), num_valid=num_valid, path=path
                    )
                    assert torch.equal(keys, plain), path
            t = torch.full((batch,), 0.8, device="cuda")
            s_keys, s_pairs = localargmax.shard_sample(hidden.cuda(), weight.cuda(), t, 3, 0, **kw)
            assert bool(torch.isfinite(s_pairs).all())
        if path in ("simt", "mma"):  # top-k's first key is the argmax key of the same kernel (same KC class)
            top, _ = localargmax.shard_topk(hidden.cuda(), weight.cuda(), 4, **kw)
            assert torch.equal(top[:, 0], keys), path
    if dtype != torch.float32:
        with pytest.raises(ValueError, match="TMA.*no log-partition"):
            localargmax.shard_argmax(hidden.cuda(), weight.cuda(), log_partition=True, _mma_config="n1_r64_tma")
