"""Denormal logits under either flush-to-zero mode of the caller (DESIGN.md,
"CPU paths"): torch.set_flush_denormal(True) sets FTZ / DAZ on the calling
thread only, so a kernel that inherited it flushed the chunks the calling
thread ran and kept those of the OpenMP workers: the keys followed the
thread count. Every CPU path this CPU has, 1 and 2 threads, both modes,
against the exact float64 answer (the paths that flush regardless of the
mode: the same keys under every mode and thread count)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import localargmax
from tests.support.paths import CPU_ISA_PATHS, cpu_path_unavailable, flushes_denormals
from tests.support.problems import integer_problem
from tests.support.reference import ref_logits, ref_topk

SCALE = 2.0**-70  # |h|, |w| <= 3 times 2^-70: products and sums are exact denormals (multiples of 2^-140)


@contextlib.contextmanager
def caller_mode(flush: bool, threads: int):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.set_flush_denormal(flush)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(saved)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_denormal_logits_under_either_flush_mode_and_thread_count(gen, dtype):
    """Logits that are all denormal (exact multiples of 2^-140, ties
    planted), a bias of exact denormals, enough vocabulary tiles for every
    thread to take some: ids and top-k ids equal float64's (the logits are
    exact) under both modes with 1 and 2 threads; the caller's own mode is
    restored after the call."""
    if not torch.set_flush_denormal(True):
        torch.set_flush_denormal(False)
        pytest.skip("torch.set_flush_denormal is not supported on this CPU (no SSE3 / not x86)")
    torch.set_flush_denormal(False)
    hidden, weight, _ = integer_problem(gen, 6, 3000, 40)
    hidden, weight = (hidden * SCALE).to(dtype), (weight * SCALE).to(dtype)
    assert torch.equal(hidden.double() / SCALE, (hidden.double() / SCALE).round())  # the scaling was exact
    logits = ref_logits(hidden, weight)
    assert 0 < logits.abs().max() < 2.0**-126  # every nonzero logit is a float32 denormal
    want_ids, want_top = logits.argmax(dim=1), ref_topk(logits, 4)
    for name in ("auto", *CPU_ISA_PATHS):
        if cpu_path_unavailable(name) is not None and name != "auto":
            continue
        seen = {}
        for flush in (False, True):
            for threads in (1, 2):
                with caller_mode(flush, threads):
                    keys = localargmax.shard_argmax(hidden, weight, path=name)
                    top = localargmax.shard_topk(hidden, weight, 4, path=name)
                    if flush:  # the calling thread still flushes: its mode was restored
                        assert torch.tensor([2.0**-140]).mul(1.0).item() == 0.0
                seen[flush, threads] = (localargmax.decode_keys(keys)[0], localargmax.decode_keys(top)[0])
        ctx = (name, str(dtype))
        first = seen[False, 1]
        for mode, (ids, top_ids) in seen.items():
            assert torch.equal(ids, first[0]) and torch.equal(top_ids, first[1]), (ctx, mode)
            if not flushes_denormals(name, dtype):
                assert torch.equal(ids, want_ids), (ctx, mode, ids.tolist(), want_ids.tolist())
                assert torch.equal(top_ids, want_top), (ctx, mode)
