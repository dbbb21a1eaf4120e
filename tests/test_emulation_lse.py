"""The host emulation (see tests/test_emulation.py) of the log-partition:
the *_lse ops on the CUDA-core kernel and merge_partition_kernel, against the
float64 logsumexp and the CPU kernel's pairs; and the bandwidth model's C++
auto choice against choose_mma_variant."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax  # noqa: F401  (registers torch.ops.localargmax)
from localargmax.reference import reference_logits
from tests.support import emulation
from tests.support.emulation_cases import ALL, HALF, assert_keys_equal, decode, exact_problem, ops

pytestmark = pytest.mark.skipif(not emulation.have_compiler(), reason="g++ / objcopy not found")


# --- the log-partition (the *_lse ops, CUDA-core kernel + merge_partition_kernel) ---


def _ref_partition(h, w, b, num_valid, scale=1.0, soft_cap=None, temperature=None):
    """float64 logsumexp(x / T) of the valid rows' transformed logits, per row."""
    x = reference_logits(h, w[:num_valid], None if b is None else b[:num_valid]).double()
    if soft_cap is not None:
        x = torch.tanh(x / soft_cap) * soft_cap
    x = x * scale
    if temperature is not None:
        x = x / torch.where(temperature > 0, temperature, 1.0).double()[:, None]
    return x


LSE_CASES = [
    ("simt", dtype, shape)
    for dtype in ALL
    for shape in ((1, 1, 8), (3, 130, 24), (9, 300, 40), (5, 63, 7), (17, 129, 33))
] + [("gemm", dtype, shape) for dtype in HALF for shape in ((1, 1, 8), (7, 300, 40), (130, 4200, 16))]


@pytest.mark.parametrize("path,dtype,shape", LSE_CASES, ids=str)
def test_log_partition_against_float64(emu, gen, path, dtype, shape):
    """The emulated CUDA-core kernel (and the gemm path's keys kernel) with
    the log-partition: keys bit-equal to
    the CPU kernel's (exact data: the transform is the same function); ref is
    the key's value; ref + log(sum) is the float64 logsumexp of the valid
    rows within 1e-5, padding that would dominate excluded; top-k carries
    the same pairs; sampling's pair refers to the sampled entry."""
    batch, rows, hidden_size = shape
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, "f" if dtype != torch.float32 else "t")
    num_valid = max(1, rows - 5)
    w[num_valid:] = 3  # padding: the largest logits of the problem if counted
    kw = {"path": path, "gemm_chunk": 50}  # gemm: several chunks of batch rows
    for scale, cap in ((1.0, None), (0.05, 2.0)):
        keys, pairs = emu.shard(h, w, b, 7, num_valid, log_partition=True, scale=scale, soft_cap=cap, **kw)
        want_keys, want_pairs = ops.shard_argmax_lse(h, w, b, 7, num_valid, scale, cap or 0.0)
        assert_keys_equal(keys, want_keys, f"lse keys {scale} {cap}")
        assert torch.equal(pairs[:, 0], localargmax.decode_keys(keys)[1]), "log-partition ref is not the key's value"
        x = _ref_partition(h, w, b, num_valid, scale, cap)
        err = (pairs[:, 0].double() + pairs[:, 1].double().log() - torch.logsumexp(x, 1)).abs().max()
        tol = 1e-5 * max(1.0, float(x.abs().max()) * 2.0**-10)
        assert float(err) <= tol, f"log-partition error {float(err):.3g} > {tol:.3g} (scale {scale}, cap {cap})"
        assert float((pairs - want_pairs).abs().max()) <= 1e-4 * float(pairs[:, 1].max())  # vs the CPU's order
        if path == "simt":  # top-k runs on simt only
            top, top_pairs = emu.shard(h, w, b, 7, num_valid, k=3, log_partition=True, scale=scale, soft_cap=cap)
            assert torch.equal(top[:, 0], keys) and torch.equal(top_pairs, pairs)
    t = torch.tensor([0.0, 0.5, 1.0, 2.0, 1e-3, 7.0] * 22)[:batch]
    keys, pairs = emu.shard(h, w, b, 7, num_valid, temperature=t, seed=5, offset=3, log_partition=True, **kw)
    assert_keys_equal(keys, ops.shard_sample(h, w, b, 7, num_valid, t, 5, 3), "sample keys")
    ids = localargmax.decode_keys(keys)[0] - 7
    x = _ref_partition(h, w, b, num_valid, temperature=t)
    want = x.gather(1, ids[:, None])[:, 0] - torch.logsumexp(x, 1)
    assert float((-pairs[:, 1].double().log() - want).abs().max()) <= 1e-5
    greedy = emu.shard(h, w, b, 7, num_valid, log_partition=True, **kw)[1]
    assert torch.equal(pairs[t == 0], greedy[t == 0])


def test_simt_log_partition_specials_and_empty_shard(emu, gen):
    """-inf rows (ref -inf, sum 0), a NaN entry (sum NaN), a +inf entry
    (ref +inf, sum = the number of +inf entries), across blocks; an empty
    shard and a batch of 0 return (-inf, 0) without a launch; the mma path
    refuses the log-partition."""
    h, w, _ = exact_problem(gen, 4, 200, 8, torch.float32)
    b = torch.zeros(200)
    h[0] = 1.0
    w[:, 0] = 1.0
    b[:] = -math.inf  # every row -inf ...
    b[150] = math.nan  # ... but a NaN at 150 and +inf at 70 and 190
    keys, pairs = emu.shard(h, w, b, 0, 200, log_partition=True)
    assert pairs[:, 1].isnan().all() and torch.equal(keys, ops.shard_argmax(h, w, b, 0, 200))
    b[150] = -math.inf
    keys, pairs = emu.shard(h, w, b, 0, 200, log_partition=True)
    assert pairs.tolist() == [[-math.inf, 0.0]] * 4
    b[70] = b[190] = math.inf
    keys, pairs = emu.shard(h, w, b, 0, 200, log_partition=True)
    assert pairs.tolist() == [[math.inf, 2.0]] * 4 and (decode(keys) == 70).all()
    keys, pairs = emu.shard(h, w, b, 0, 0, log_partition=True)
    assert (keys == 0).all() and pairs.tolist() == [[-math.inf, 0.0]] * 4
    assert emu.shard(h[:0], w, b, 0, 200, log_partition=True)[1].shape == (0, 2)
    with pytest.raises(ValueError, match="cannot compute the log-partition"):
        emu.shard(h, w, b, log_partition=True, path="mma")


def test_the_models_mma_choice_is_choose_mma_variant(emu):
    """localargmax.bench.predict.cpp_mma_variant (the bandwidth model's C++ auto, the dispatch
    table's incumbent) = choose_mma_variant of shard_argmax_launch.cuh, around every boundary."""
    from localargmax.bench import predict as pm

    for sm_count in (1, 78, 132):
        for num_valid in (1, 64 * 4 * sm_count - 64, 64 * 4 * sm_count - 63, 64 * 4 * sm_count, 18992, 151936):
            for batch in (1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 1024):
                want = emu.mma_variant(4096, num_valid, batch, sm_count)
                assert pm.cpp_mma_variant(num_valid, batch, sm_count) == want, (sm_count, num_valid, batch)
