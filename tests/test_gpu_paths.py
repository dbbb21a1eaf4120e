"""GPU tests of every CUDA path (marker ``gpu``; skipped without a device).

bf16 / fp16 argmax and sample run on one of three paths (csrc/cuda/
shard_argmax_cuda.cu, pick_path): ``simt`` (CUDA-core fused kernel), ``mma``
(tensor-core fused kernel) and ``gemm`` (cuBLAS float32 logits + keys kernel).
The ops' ``path`` argument forces one (``each_path`` binds it on
``localargmax.shard_argmax`` / ``shard_sample``), so each test runs its problem on all
three (the float64 reference is computed once per problem): the semantics of
DESIGN.md rules 1-6, with the hard cases planted where each path's blocking
could get them wrong (rows at every position of an mma tile, k tails, batch
tails of every n-tile width, padding that would win, shards of unequal
``num_valid``, subnormal logits).
"""
import functools

import pytest
import torch

import localargmax
from helpers import (build_shards, check_against_reference, fill_winning_padding, random_problem, ref_argmax,
                     reference_logits_and_error)
from localargmax.reference import reference_argmax

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(not localargmax.WITH_CUDA, reason="built without CUDA kernels"),
]

HALF = [torch.bfloat16, torch.float16]
PATHS = ("simt", "mma", "gemm")


@pytest.fixture
def each_path(monkeypatch):
    """Iterate the CUDA paths: binds ``path=`` on localargmax.shard_argmax and
    shard_sample (the names the tests call) and poisons the caching
    allocator's free blocks (0xFF) before each."""
    ops = {name: getattr(localargmax, name) for name in ("shard_argmax", "shard_sample")}

    def paths():
        for path in PATHS:
            for name, op in ops.items():
                monkeypatch.setattr(localargmax, name, functools.partial(op, path=path))
            junk = torch.full((64 << 20,), -1, dtype=torch.int64, device="cuda")
            del junk
            yield path

    return paths


def _ids(hidden, weight, **kw):
    keys = localargmax.shard_argmax(hidden.cuda(), weight.cuda(), **kw)
    return localargmax.decode_keys(keys)[0].cpu()


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "batch,hsize",
    # H = 4096 at small batches only: the float64 reference is a loop over k.
    [(b, h) for h in (8, 40, 264) for b in (1, 8, 9, 17, 33, 64, 65, 130)]
    + [(1, 4096), (9, 4096), (3, 4104), (5, 33), (70, 33)],  # H = 33: simt and gemm only
)
@pytest.mark.parametrize("bias", [None, "weight"])
def test_paths_match_reference(gen, each_path, dtype, batch, hsize, bias):
    hidden, weight, b = random_problem(gen, batch, 1501, hsize, dtype, bias)
    num_valid = 1499
    fill_winning_padding(weight[num_valid:], hidden, scale=1e3)  # rule 4: would win if evaluated
    reference = reference_logits_and_error(hidden, weight[:num_valid], None if b is None else b[:num_valid])
    for path in each_path():
        if path == "mma" and hsize % 8:  # forced mma cannot take H % 8 != 0: it raises (test_path_arg_is_checked)
            continue
        keys = localargmax.shard_argmax(hidden.cuda(), weight.cuda(), bias=None if b is None else b.cuda(),
                                        vocab_start=77, num_valid=num_valid)
        ids = localargmax.decode_keys(keys)[0].cpu() - 77
        check_against_reference(ids, hidden, weight[:num_valid], None if b is None else b[:num_valid],
                                reference=reference, context=f"{path} {dtype} B={batch} H={hsize} bias={bias}")


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch", [1, 9, 64, 130])
def test_exact_ties_at_every_tile_position(gen, each_path, dtype, batch):
    """Rule 1: identical winning rows give identical logits wherever they sit
    (row g or g + 8 of an m-tile, either m-tile of a warp, any warp, any
    block, any GEMM tile), so the smallest index wins."""
    hidden, weight, _ = random_problem(gen, batch, 4100, 64, dtype)
    positions = [4099, 2050, 300, 130, 127, 40, 35, 27, 19, 11, 8, 3]
    winner = (hidden[0].float() * 3).to(dtype)  # logit ~ 3 * 64, far above the others
    for p in positions:
        weight[p] = winner
    hidden = hidden[:1].expand(batch, -1).contiguous()
    for path in each_path():
        assert torch.equal(_ids(hidden, weight), torch.full((batch,), min(positions))), path


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("tp", [2, 3, 4])
@pytest.mark.parametrize("batch", [5, 130])
@pytest.mark.parametrize("pad_fill", ["huge", "nan"])
def test_tie_across_shards_of_unequal_num_valid(gen, each_path, dtype, tp, batch, pad_fill):
    """The same winning row on the first and the last shard (the last one
    partly padding, with weights that would win): the smaller index wins
    (rules 1 and 4) on every path, including the GEMM, whose shape must not
    depend on num_valid."""
    vocab = 1001
    hidden, weight, _ = random_problem(gen, batch, vocab, 256, dtype)
    winner = (hidden[0].float() * 3).to(dtype)
    weight[5] = winner
    weight[vocab - 3] = winner
    hidden = hidden[:1].expand(batch, -1).contiguous()
    shards = build_shards(weight, None, tp, 64, hidden=hidden, pad_fill=pad_fill)
    assert shards[-1][2].num_valid < shards[0][2].num_valid
    for path in each_path():
        keys = torch.stack([localargmax.shard_argmax(hidden.cuda(), w.cuda(), vocab_start=s.vocab_start,
                                                     num_valid=s.num_valid) for w, _, s in shards])
        ids, _ = localargmax.merge_keys(keys)
        assert torch.equal(ids.cpu(), torch.full((batch,), 5)), path


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_padding_and_empty_shards(gen, each_path, dtype, tp):
    """Vocab not divisible by tp, shards that are all padding (vocab 5 at tp 4
    with pad_to 64), padding that would win (huge and NaN)."""
    for vocab, batch in ((1, 3), (5, 9), (300, 17), (1001, 70)):
        hidden, weight, _ = random_problem(gen, batch, vocab, 40, dtype)
        want = ref_argmax(hidden, weight)
        for pad_fill in ("huge", "nan"):
            shards = build_shards(weight, None, tp, 64, hidden=hidden, pad_fill=pad_fill)
            for path in each_path():
                keys = torch.stack([localargmax.shard_argmax(hidden.cuda(), w.cuda(), vocab_start=s.vocab_start,
                                                             num_valid=s.num_valid) for w, _, s in shards])
                ids, _ = localargmax.merge_keys(keys)
                assert torch.equal(ids.cpu(), want), f"{path} vocab={vocab} pad={pad_fill}"


@pytest.mark.parametrize("dtype", HALF)
def test_nan_and_minus_inf_rows(gen, each_path, dtype):
    """Rule 2: a NaN logit wins (the smallest NaN index). Rule 3: -inf rows
    lose to any finite logit, and an all -inf batch row picks index 0."""
    hidden, weight, _ = random_problem(gen, 12, 500, 48, dtype)
    hidden = hidden.abs() + 0.01  # positive: a -inf weight row gives a -inf logit, not NaN
    weight[[3, 17, 200]] = float("-inf")
    nan_case = weight.clone()
    nan_case[[250, 90]] = float("nan")
    all_inf = torch.full_like(weight, float("-inf"))
    cases = {"-inf rows": weight, "nan rows": nan_case, "all -inf": all_inf}
    wants = {name: reference_argmax(hidden, w) for name, w in cases.items()}
    assert int(wants["nan rows"][0]) == 90 and int(wants["all -inf"][0]) == 0
    for path in each_path():
        for name, w in cases.items():
            assert torch.equal(_ids(hidden, w), wants[name]), f"{path}: {name}"


def test_subnormal_logits_are_not_flushed(gen, each_path):
    """DESIGN.md: no flush-to-zero on the comparison path. bf16 carries the
    float32 exponent range, so hidden = 1 and weight rows with one subnormal
    entry give distinct subnormal logits; a flushing path would see a 0-0-0
    tie and answer index 0."""
    vocab, hsize = 64, 16
    weight = torch.zeros(vocab, hsize)
    # k * 2**-133, k = 1..64: bf16 subnormals (the 7 mantissa bits of bf16 are
    # float32 mantissa bits 16..22), 9.2e-41 .. 5.9e-39 < 1.2e-38
    tiny = torch.arange(1, vocab + 1, dtype=torch.float32) * 2.0**-133
    perm = torch.randperm(vocab, generator=gen)
    weight[:, 0] = tiny[perm]
    weight = weight.to(torch.bfloat16)
    assert bool((weight[:, 0].float() == tiny[perm]).all())  # exact in bf16
    hidden = torch.ones(3, hsize, dtype=torch.bfloat16)
    want = int(perm.argmax())
    for path in each_path():
        assert torch.equal(_ids(hidden, weight), torch.full((3,), want)), path


def test_sample_paths_agree_with_cpu(gen, each_path):
    hidden, weight, _ = random_problem(gen, 70, 3000, 64, torch.bfloat16)
    t = torch.rand(70, generator=gen) + 0.1
    t[::5] = 0  # greedy rows
    cpu = localargmax.lm_head_sample(hidden, weight, temperature=t, seed=9, offset=4)
    for path in each_path():  # one shard: the sample is the shard's key
        gpu = localargmax.decode_keys(localargmax.shard_sample(hidden.cuda(), weight.cuda(), t.cuda(), 9, 4))[0]
        # Same noise, logits equal up to float32 summation order: the samples
        # agree except where two perturbed scores are within rounding.
        assert (gpu.cpu() == cpu).float().mean() >= 0.95, path


@pytest.mark.parametrize("path", ["mma", "gemm"])
def test_batch_past_grid_y_limit(gen, path):
    """More 64-row batch chunks (mma) or batch rows (gemm keys kernel) than
    grid y holds: the grid-stride loops must cover them all."""
    batch = 65535 * 64 + 3
    base, weight, _ = random_problem(gen, 61, 70, 8, torch.bfloat16)
    rows = torch.arange(batch) % 61
    assert torch.equal(_ids(base[rows], weight, path=path), reference_argmax(base, weight)[rows])


def test_path_arg_is_checked(gen):
    """An unknown path, and a forced path that cannot take the inputs (the mma
    kernel needs H % 8 == 0), raise ValueError instead of falling back."""
    hidden, weight, _ = random_problem(gen, 2, 64, 33, torch.bfloat16)
    with pytest.raises(ValueError, match="path must be one of"):
        localargmax.shard_argmax(hidden.cuda(), weight.cuda(), path="tensorcore")
    with pytest.raises(ValueError):
        localargmax.shard_argmax(hidden.cuda(), weight.cuda(), path="mma")


@pytest.mark.parametrize("batch", [4, 200])
def test_cuda_graph_capture_each_path(gen, each_path, batch):
    for path in each_path():
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
        check_against_reference(localargmax.decode_keys(keys)[0].cpu(), new_hidden, new_weight, context=path)
