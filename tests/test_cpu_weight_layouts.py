"""Every CPU path takes every weight layout the checks accept (issue 54):
rows need only ``stride(1) == 1``, so a row stride below H (a broadcast row,
stride 0, as a tied embedding row expanded; overlapping rows, strides 1, 7
and H - 1) is as valid as a contiguous or padded one. Per path (auto and
every named one this CPU has) x row stride x dtype: shard_argmax,
shard_topk, lm_head_argmax and filtered lm_head_sample against float64 on
the full matrix, with ``num_valid % 64 != 0`` (brgemm's zero-padded tail
tile) and whole tiles before it."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from tests.support.paths import CPU_ISA_PATHS, KernelPath, cpu_path_unavailable, use_path
from tests.support.reference import check_against_reference, ref_argmax, ref_logits, ref_topk
from tests.test_filtered_sampling import mixed_rows, reference

H = 40
STRIDES = (0, 1, 7, H - 1, H, H + 5)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(params=("default",) + CPU_ISA_PATHS)
def cpu_path(request):
    reason = cpu_path_unavailable(request.param) if request.param != "default" else None
    if reason:
        pytest.skip(reason)
    with use_path(KernelPath("cpu", request.param)) as path:
        yield path


def strided_weight(gen, vocab, stride, dtype, integer):
    """``[vocab, H]`` rows ``stride`` elements apart in one storage (small
    integers, or Gaussian rows scaled to ~unit logits)."""
    n = (vocab - 1) * stride + H
    base = torch.randint(-3, 4, (n,), generator=gen) if integer else torch.randn(n, generator=gen) / math.sqrt(H)
    weight = torch.as_strided(base.to(dtype), (vocab, H), (stride, 1))
    assert weight.stride() == (stride, 1)
    return weight


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stride", STRIDES)
def test_shard_ops_take_every_row_stride(gen, cpu_path, stride, dtype):
    """Exact integer logits (ties everywhere at stride 0: the integer bias
    and the smaller index decide): argmax and top-5 ids equal float64's;
    Gaussian ones: argmax within the float32 bound."""
    vocab, num_valid, batch = 203, 198, 37  # 3 whole tiles, then 6 rows: num_valid % 64 != 0
    sign = torch.randint(0, 2, (batch, H), generator=gen) * 2 - 1
    hidden = (torch.randint(1, 4, (batch, H), generator=gen) * sign).to(dtype)
    weight = strided_weight(gen, vocab, stride, dtype, integer=True)
    bias = torch.randint(-4, 5, (vocab,), generator=gen).float()
    kw = dict(bias=bias, num_valid=num_valid, vocab_start=5)
    ids = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, **kw))[0]
    assert torch.equal(ids - 5, ref_argmax(hidden, weight[:num_valid], bias[:num_valid]))
    top = localargmax.decode_keys(localargmax.shard_topk(hidden, weight, 5, **kw))[0]
    assert torch.equal(top - 5, ref_topk(ref_logits(hidden, weight[:num_valid], bias[:num_valid]), 5))

    hidden = torch.randn(batch, H, generator=gen).to(dtype)
    weight = strided_weight(gen, vocab, stride, dtype, integer=False)
    bias = torch.randn(vocab, generator=gen)  # distinct logits at stride 0 too
    if stride == 0:  # the bias alone picks every row's winner: its top 0.1 clear (its top two fell within the
        # float32 bound, every row a near-tie, for 4 in 20000 seeds, x 18 stride-0 cases)
        bias[bias[:num_valid].argmax()] += 0.1
    ids = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, bias=bias, num_valid=num_valid))[0]
    check_against_reference(ids, hidden, weight[:num_valid], bias[:num_valid], context=f"stride {stride}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stride", STRIDES)
def test_steps_take_every_row_stride(seed, cpu_path, stride, dtype):
    """lm_head_argmax's ids within the float32 bound of float64; filtered
    lm_head_sample (mixed greedy / top-k / top-p / min-p rows, some past the
    candidates) the float64 filter + Gumbel-max id on every row that is no
    near-tie."""
    gen = torch.Generator().manual_seed(seed)
    vocab, num_valid, batch = 331, 331, 24  # 5 whole tiles, then 11 rows
    hidden = (torch.randn(batch, H, generator=gen) * 3.0).to(dtype)
    weight = strided_weight(gen, vocab, stride, dtype, integer=False)
    bias = torch.randn(vocab, generator=gen)
    if stride == 0:  # the bias alone spreads the logits: as wide as other strides' (sd ~3), its top 0.1 clear
        # (sd 1: >= 8 of 24 rows were near-ties for 1 in 16000 seeds, every row for 4 in 20000, x 18 cases;
        # 8000 seeds now leave at most 3 near-ties of the 7 allowed, every row clear)
        bias = bias * 3
        bias[bias.argmax()] += 0.1
    ids = localargmax.lm_head_argmax(hidden, weight, bias=bias, num_valid=num_valid)
    check_against_reference(ids, hidden, weight, bias, context=f"stride {stride}")

    t, k, p, mp = mixed_rows(gen, batch)
    got = localargmax.lm_head_sample(
        hidden, weight, bias=bias, num_valid=num_valid, temperature=t, seed=seed, offset=9, top_k=k, top_p=p, min_p=mp
    )
    logits = ref_logits(hidden, weight, bias)
    want = reference(logits, t, k.tolist(), p, mp, seed, 9)
    exact = [b for b, (_, near) in enumerate(want) if not near]
    assert len(exact) >= 0.7 * batch, f"too many near-ties: {batch - len(exact)} of {batch}"
    assert [int(got[b]) for b in exact] == [want[b][0] for b in exact]
