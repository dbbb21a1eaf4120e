"""The CPU kernel really runs on torch's intra-op threads.

at::parallel_for is a header template: compiled without -fopenmp it runs the
whole range on the calling thread, silently (that was the build's state until
CMakeLists.txt required OpenMP; the Qwen3 bf16 batch-1 shard then took 33.5 ms
instead of 22 ms on 2 cores). These tests fail on such a build.
"""
import threading

import pytest
import torch

import localargmax
from localargmax import _C


@pytest.fixture
def num_threads():
    saved = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(saved)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_for_uses_torch_threads(num_threads, threads):
    num_threads(threads)
    # OpenMP starts exactly `threads` workers whatever the core count.
    assert _C._parallel_workers(64) == threads
    assert _C._parallel_workers(1) == 1


def test_parallel_workers_rejects_bad_n():
    with pytest.raises(ValueError, match="n must be >= 1"):
        _C._parallel_workers(0)


def test_kernel_keys_do_not_depend_on_thread_count(num_threads):
    # Chunks are fixed by the problem (not by threads), so keys are identical.
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    hidden = torch.randn(5, 96, generator=gen).to(torch.bfloat16)
    weight = torch.randn(1000, 96, generator=gen).to(torch.bfloat16)
    keys = []
    for threads in (1, 2, 3):
        num_threads(threads)
        keys.append(localargmax.shard_argmax(hidden, weight))
    assert torch.equal(keys[0], keys[1]) and torch.equal(keys[0], keys[2])


def test_kernel_called_from_many_python_threads(num_threads):
    # Several Python threads calling the op at once (each call opens its own
    # OpenMP region) give the same keys as one call.
    num_threads(2)
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    hidden = torch.randn(3, 64, generator=gen)
    weight = torch.randn(4096, 64, generator=gen)
    expected = localargmax.shard_argmax(hidden, weight)
    results = [None] * 4

    def work(i):
        results[i] = localargmax.shard_argmax(hidden, weight)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(r, expected) for r in results)
