"""GPU tests of every CUDA path (marker ``gpu``; skipped without a device).

bf16 / fp16 argmax and sample run on one of three paths (csrc/cuda/
shard_argmax_cuda.cu, pick_path): ``simt`` (CUDA-core fused kernel), ``mma``
(tensor-core fused kernel) and ``gemm`` (cuBLAS float32 logits + keys kernel).
``LOCALARGMAX_CUDA_PATH`` forces one, so each test here runs on all three:
the same semantics (DESIGN.md rules 1-6) against the float64 reference, with
the hard cases planted where each path's blocking could get them wrong (rows
at every position of an mma tile, k tails, batch tails of every n-tile width).
"""
import pytest
import torch

import localargmax
from helpers import build_shards, check_against_reference, random_problem, ref_argmax
from localargmax.reference import reference_argmax

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(not localargmax.WITH_CUDA, reason="built without CUDA kernels"),
]

HALF = [torch.bfloat16, torch.float16]


@pytest.fixture(params=["simt", "mma", "gemm"])
def cuda_path(request, monkeypatch):
    monkeypatch.setenv("LOCALARGMAX_CUDA_PATH", request.param)
    junk = torch.full((64 << 20,), -1, dtype=torch.int64, device="cuda")  # poison the allocator
    del junk
    return request.param


def _ids(hidden, weight, **kw):
    keys = localargmax.shard_argmax(hidden.cuda(), weight.cuda(), **kw)
    return localargmax.decode_keys(keys)[0].cpu()


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch", [1, 8, 9, 17, 33, 64, 65, 130])
@pytest.mark.parametrize("hsize", [8, 40, 264, 4096, 33])  # 33: the mma kernel declines, simt runs
@pytest.mark.parametrize("bias", [None, "weight"])
def test_paths_match_reference(gen, cuda_path, dtype, batch, hsize, bias):
    hidden, weight, b = random_problem(gen, batch, 3001, hsize, dtype, bias)
    num_valid = 2999
    keys = localargmax.shard_argmax(hidden.cuda(), weight.cuda(), bias=None if b is None else b.cuda(),
                                    vocab_start=77, num_valid=num_valid)
    ids = localargmax.decode_keys(keys)[0].cpu() - 77
    check_against_reference(ids, hidden, weight[:num_valid], None if b is None else b[:num_valid],
                            context=f"{cuda_path} {dtype} B={batch} H={hsize} bias={bias}")


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("batch", [1, 9, 64, 130])
def test_exact_ties_at_every_tile_position(gen, cuda_path, dtype, batch):
    """Rule 1: identical winning rows give identical logits wherever they sit
    (row g or g + 8 of an m-tile, either m-tile of a warp, any warp, any
    block), so the smallest index wins."""
    hidden, weight, _ = random_problem(gen, batch, 4100, 64, dtype)
    winner = (hidden[0].float() * 3).to(dtype)
    positions = [4099, 2050, 300, 130, 127, 40, 35, 27, 19, 11, 8, 3]
    for p in positions:
        weight[p] = winner
    ids = _ids(hidden[:1].expand(batch, -1).contiguous(), weight)
    assert torch.equal(ids, torch.full((batch,), min(positions)))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("tp", [1, 2, 3, 4])
@pytest.mark.parametrize("pad_fill", ["huge", "nan"])
def test_hard_cases_through_the_whole_step(gen, cuda_path, dtype, tp, pad_fill):
    """Ties across shards, NaN rows, all -inf rows, padding rows that would
    win, empty shards, vocab not divisible by tp."""
    for vocab, batch in ((1, 3), (5, 9), (300, 17), (1001, 70)):
        hidden, weight, _ = random_problem(gen, batch, vocab, 40, dtype)
        weight[vocab // 2] = weight[0]  # exact tie across shards
        if vocab == 300:
            weight[7] = float("nan")  # a NaN row wins every batch row (rule 2)
        if vocab > 10:
            weight[3] = float("-inf")
        shards = build_shards(weight, None, tp, 64, hidden=hidden, pad_fill=pad_fill)
        keys = torch.stack([localargmax.shard_argmax(hidden.cuda(), w.cuda(), vocab_start=s.vocab_start,
                                                     num_valid=s.num_valid) for w, _, s in shards])
        ids, _ = localargmax.merge_keys(keys)
        assert torch.equal(ids.cpu(), ref_argmax(hidden, weight)), f"{cuda_path} vocab={vocab}"


@pytest.mark.parametrize("dtype", HALF)
def test_all_minus_inf_and_zero_hidden(gen, cuda_path, dtype):
    hidden, weight, _ = random_problem(gen, 12, 500, 48, dtype)
    weight[:] = float("-inf")
    hidden[3] = 0  # -inf * 0 = NaN logits for that row
    assert torch.equal(_ids(hidden, weight), reference_argmax(hidden, weight))


def test_sample_paths_agree_with_cpu(gen, cuda_path):
    hidden, weight, _ = random_problem(gen, 70, 3000, 64, torch.bfloat16)
    t = torch.rand(70, generator=gen) + 0.1
    t[::5] = 0  # greedy rows
    gpu = localargmax.lm_head_sample(hidden.cuda(), weight.cuda(), temperature=t.cuda(), seed=9, offset=4)
    cpu = localargmax.lm_head_sample(hidden, weight, temperature=t, seed=9, offset=4)
    # Same noise, logits equal up to float32 summation order: the samples
    # agree except where two perturbed scores are within rounding.
    assert (gpu.cpu() == cpu).float().mean() >= 0.95


def test_mma_batch_past_grid_y_limit(gen, monkeypatch):
    monkeypatch.setenv("LOCALARGMAX_CUDA_PATH", "mma")
    batch = 65535 * 64 + 3  # more 64-row batch chunks than grid y holds
    base, weight, _ = random_problem(gen, 61, 70, 8, torch.bfloat16)
    rows = torch.arange(batch) % 61
    assert torch.equal(_ids(base[rows], weight), reference_argmax(base, weight)[rows])


def test_path_env_is_checked(gen, monkeypatch):
    hidden, weight, _ = random_problem(gen, 2, 64, 32, torch.bfloat16)
    monkeypatch.setenv("LOCALARGMAX_CUDA_PATH", "tensorcore")
    with pytest.raises(ValueError, match="LOCALARGMAX_CUDA_PATH must be auto, simt, mma or gemm"):
        localargmax.shard_argmax(hidden.cuda(), weight.cuda())
    monkeypatch.setenv("LOCALARGMAX_CUDA_PATH", "auto")
    monkeypatch.setenv("LOCALARGMAX_CUDA_GEMM_MIN_BATCH", "0")
    with pytest.raises(ValueError, match="LOCALARGMAX_CUDA_GEMM_MIN_BATCH must be an integer >= 1"):
        localargmax.shard_argmax(hidden.cuda(), weight.cuda())


@pytest.mark.parametrize("batch", [4, 200])
def test_cuda_graph_capture_each_path(gen, cuda_path, batch):
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
    check_against_reference(localargmax.decode_keys(keys)[0].cpu(), new_hidden, new_weight, context=cuda_path)
