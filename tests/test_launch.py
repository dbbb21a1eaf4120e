"""The multi-rank test launcher (tests/support/launch.py) itself: how it
reports a rank that fails, raises or hangs, and that it leaves no process
behind."""

from __future__ import annotations

import math
import os
import time

import pytest
import torch
import torch.distributed as dist

from tests.support.launch import RankFailure, run_ranks

# ----------------------------------------------------------------------------- the launcher itself


def _raise_on_rank_1(rank, world):
    if rank == 1:
        raise ValueError("boom from rank 1")
    dist.barrier()  # rank 0 would wait here forever
    return rank


def _exit_without_reporting(rank, world):
    os._exit(3)


def _hang(rank, world):
    time.sleep(1000)


LAUNCHER_FAULTS = {  # id: (worker, world size, launch timeout, RankFailure message, seconds it may take)
    "propagates_rank_exception": (_raise_on_rank_1, 2, 120, r"(?s)rank 1 error.*ValueError: boom from rank 1", 100),
    "reports_a_crashed_rank": (_exit_without_reporting, 1, 120, "rank 0 exited with code 3", 120),
    "times_out_on_hang": (_hang, 1, 4, r"(?s)rank 0 hung.*did not finish within", 40),
}


@pytest.mark.parametrize("case", list(LAUNCHER_FAULTS))
def test_launcher(case):
    worker, world, timeout, match, bound = LAUNCHER_FAULTS[case]
    start = time.monotonic()
    with pytest.raises(RankFailure, match=match):
        run_ranks(worker, world, timeout=timeout)
    assert time.monotonic() - start < bound


def test_frame_keys_with_log_partition_pairs(gen):
    """The framed payload with pairs: the header whose size word carries
    PAIRS_FLAG, the keys, then one int64 word per row holding the bits of its
    float32 (ref, sum) in memory order: 8·n + 8·B + 24 bytes; specials survive."""
    from localargmax.collective import PAIRS_FLAG, frame_keys, pairs_to_words, words_to_pairs

    keys = torch.randint(0, 2**62, (5, 3), generator=gen)
    pairs = torch.randn(5, 2, generator=gen)
    pairs[0] = torch.tensor([-math.inf, 0.0])
    pairs[1] = torch.tensor([math.nan, math.nan])
    pairs[2, 0] = math.inf
    frame = frame_keys(keys, 77, pairs)
    assert frame.dtype == torch.int64 and frame.numel() * 8 == 8 * 15 + 8 * 5 + 24
    assert frame[:3].tolist() == [16 + PAIRS_FLAG, -(16 + PAIRS_FLAG), 77]  # the header at a fixed offset
    assert torch.equal(frame[3:18], keys.reshape(-1))
    bits = pairs.view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # (ref, sum) bits; little-endian words
    assert frame[18:].tolist() == [(int(r) | int(s) << 32) - ((int(s) >> 31) << 64) for r, s in bits]
    back = words_to_pairs(frame[18:])
    assert torch.equal(back.view(torch.int32), pairs.view(torch.int32))
    assert frame_keys(keys, 77)[:3].tolist() == [16, -16, 77]
    for bad in (pairs.double(), pairs[:, :1], pairs.reshape(-1)):
        with pytest.raises(ValueError, match=r"pairs must be a \[batch, 2\] float32"):
            pairs_to_words(bad)
