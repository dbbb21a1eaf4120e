"""GPU tests (marker ``gpu``; skipped without a CUDA device). The same
semantics as the CPU suite, against the float64 reference and against the
CPU kernel; outputs from poisoned memory; CUDA-graph capture and replay of the
whole step in a world-size-1 NCCL group; the device guard. Run them with
``pytest -m gpu`` on a machine with a GPU (bench/gpu_check.sh does)."""
import os

import pytest
import torch

import localargmax
from helpers import build_shards, ref_argmax, reference_logits_and_error
from localargmax.reference import reference_argmax

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(not localargmax.WITH_CUDA, reason="built without CUDA kernels"),
]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
WIDTHS = [1, 2, 3, 31, 33, 127, 129, 4095, 4097]


@pytest.fixture(autouse=True)
def poison_allocator():
    """Fill the caching allocator's free blocks with 0xFF bytes, so that an op
    that forgets to initialise its output returns garbage instead of zeros."""
    if torch.cuda.is_available():
        junk = torch.full((64 << 20,), -1, dtype=torch.int64, device="cuda")
        del junk
    yield


def _planted(gen, batch, vocab, hsize, dtype):
    weight = torch.randn(vocab, hsize, generator=gen).to(dtype)
    hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
    winners = torch.randint(0, vocab, (batch,), generator=gen)
    weight[winners] = (hidden.float() * 3).to(dtype)
    return hidden, weight


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hsize", WIDTHS)
def test_shard_argmax_matches_reference_and_cpu(gen, dtype, hsize):
    for batch, vocab in [(1, 1), (3, 129), (17, 4097), (64, 20000)]:
        hidden, weight = _planted(gen, batch, vocab, hsize, dtype)
        keys = localargmax.shard_argmax(hidden.cuda(), weight.cuda(), vocab_start=123)
        ids, values = localargmax.decode_keys(keys)
        want = reference_argmax(hidden, weight) + 123
        assert torch.equal(ids.cpu(), want)
        cpu_ids, _ = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, vocab_start=123))
        assert torch.equal(ids.cpu(), cpu_ids)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_lm_head_argmax_hard_cases(gen, dtype, tp):
    """Ties across shards, NaN, padding rows that would win, empty shards,
    vocab not divisible by tp: the CPU suite's shard builder on the GPU."""
    for vocab in (1, 5, 300, 1001):
        hidden, weight = _planted(gen, 9, vocab, 40, dtype)
        weight[vocab // 2] = weight[0]  # an exact tie across shards
        shards = build_shards(weight, None, tp, 64, hidden=hidden)
        keys = torch.stack([localargmax.shard_argmax(hidden.cuda(), w.cuda(), vocab_start=s.vocab_start,
                                                     num_valid=s.num_valid) for w, _, s in shards])
        ids, _ = localargmax.merge_keys(keys)
        assert torch.equal(ids.cpu(), ref_argmax(hidden, weight))


def test_batch_past_grid_y_limit(gen):
    hidden, weight = _planted(gen, 65535 * 8 + 3, 70, 8, torch.bfloat16)
    ids, _ = localargmax.decode_keys(localargmax.shard_argmax(hidden.cuda(), weight.cuda()))
    assert torch.equal(ids.cpu(), reference_argmax(hidden, weight))


def test_topk_and_sample_match_cpu(gen):
    """Top-k against the float64 reference, never GPU keys against CPU keys:
    the keys carry float32 value bits and the devices sum in different orders.
    Each value is within the float32 bound of its id's exact logit; the j-th
    id's exact logit is the j-th best up to twice the bound; rows without a
    near-tie among the first k + 1 exact logits return the reference ids, in order."""
    hidden, weight = _planted(gen, 7, 3000, 64, torch.bfloat16)
    logits, err = reference_logits_and_error(hidden, weight)
    ref_values, ref_ids = torch.sort(logits, dim=1, descending=True, stable=True)
    tol = 2 * err.max(dim=1, keepdim=True).values
    for k in (1, 8, 64):
        ids, values = localargmax.decode_keys(localargmax.shard_topk(hidden.cuda(), weight.cuda(), k).cpu())
        exact = logits.gather(1, ids)
        assert bool(((values.double() - exact).abs() <= err.gather(1, ids)).all()), k
        assert bool(((exact - ref_values[:, :k]).abs() <= tol).all()), k
        clear = ((ref_values[:, :k] - ref_values[:, 1 : k + 1]) > tol).all(dim=1)
        assert torch.equal(ids[clear], ref_ids[clear, :k]), k
        assert int(clear.sum()) >= 4 or k == 64, (k, clear)
    t = torch.rand(7, generator=gen) + 0.1
    gpu = localargmax.lm_head_sample(hidden.cuda(), weight.cuda(), temperature=t.cuda(), seed=9, offset=4)
    cpu = localargmax.lm_head_sample(hidden, weight, temperature=t, seed=9, offset=4)
    # Same logits up to float32 rounding order, same noise: the samples agree
    # except where two perturbed scores are within rounding of each other.
    assert (gpu.cpu() == cpu).float().mean() >= 6 / 7


def test_merge_keys_d2t_cuda(gen):
    hidden, weight = _planted(gen, 5, 700, 16, torch.float32)
    d2t = localargmax.build_d2t(torch.rand(2000, generator=gen), 700)
    ids = localargmax.lm_head_argmax(hidden.cuda(), weight.cuda(), d2t=d2t.cuda())
    assert torch.equal(ids.cpu(), reference_argmax(hidden, weight, d2t=d2t))


def test_cuda_graph_capture_and_replay_world_size_1_nccl(gen):
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=0, world_size=1)
    group = dist.group.WORLD
    hidden, weight = _planted(gen, 8, 5000, 128, torch.bfloat16)
    h, w = hidden.cuda(), weight.cuda()
    for reduce in ("all_gather", "all_reduce"):
        localargmax.lm_head_argmax(h, w, group=group, reduce=reduce)  # warm up outside the graph
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = localargmax.lm_head_argmax(h, w, group=group, reduce=reduce)
        new_hidden, new_weight = _planted(gen, 8, 5000, 128, torch.bfloat16)
        h.copy_(new_hidden.cuda())
        w.copy_(new_weight.cuda())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), reference_argmax(new_hidden, new_weight))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_device_guard_second_gpu(gen):
    hidden, weight = _planted(gen, 4, 999, 32, torch.bfloat16)
    ids = localargmax.lm_head_argmax(hidden.to("cuda:1"), weight.to("cuda:1"))
    assert ids.device == torch.device("cuda:1")
    assert torch.equal(ids.cpu(), reference_argmax(hidden, weight))
