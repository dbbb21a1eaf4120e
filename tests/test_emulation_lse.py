"""The host emulation (see tests/test_emulation.py) of the log-partition:
the *_lse ops on the CUDA-core kernel and merge_partition_kernel, against the
float64 logsumexp and the CPU kernel's pairs; and the bandwidth model's C++
auto choice against choose_mma_config."""

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
    the key's value; ref + log1p(others) is the float64 logsumexp of the valid
    rows within 1e-5, padding that would dominate excluded; top-k carries
    the same pairs; sampling's pair refers to the sampled entry."""
    batch, rows, hidden_size = shape
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, "f" if dtype != torch.float32 else "t")
    num_valid = max(1, rows - 5)
    w[num_valid:] = 3  # padding: the largest logits of the problem if counted
    kw = {"path": path, "gemm_chunk": 50}  # gemm: several chunks of batch rows
    for scale, cap in ((1.0, None), (0.05, 2.0)):
        keys, pairs = emu.shard(h, w, b, 7, num_valid, log_partition=True, scale=scale, soft_cap=cap, **kw)
        want_keys, want_pairs = ops.shard_argmax_lse(h, w, b, 7, num_valid, scale, cap or 0.0, "generic")
        assert_keys_equal(keys, want_keys, f"lse keys {scale} {cap}")
        assert torch.equal(pairs[:, 0], localargmax.decode_keys(keys)[1]), "log-partition ref is not the key's value"
        x = _ref_partition(h, w, b, num_valid, scale, cap)
        err = (pairs[:, 0].double() + pairs[:, 1].double().log1p() - torch.logsumexp(x, 1)).abs().max()
        tol = 1e-5 * max(1.0, float(x.abs().max()) * 2.0**-10)
        assert float(err) <= tol, f"log-partition error {float(err):.3g} > {tol:.3g} (scale {scale}, cap {cap})"
        assert float((pairs - want_pairs).abs().max()) <= 1e-4 * float(pairs[:, 1].max())  # vs the CPU's order
        if path == "simt":  # top-k runs on simt only
            top, top_pairs = emu.shard(h, w, b, 7, num_valid, k=3, log_partition=True, scale=scale, soft_cap=cap)
            assert torch.equal(top[:, 0], keys) and torch.equal(top_pairs, pairs)
    t = torch.tensor([0.0, 0.5, 1.0, 2.0, 1e-3, 7.0] * 22)[:batch]
    keys, pairs = emu.shard(h, w, b, 7, num_valid, temperature=t, seed=5, offset=3, log_partition=True, **kw)
    assert_keys_equal(keys, ops.shard_sample(h, w, b, 7, num_valid, t, 5, 3, "generic"), "sample keys")
    ids = localargmax.decode_keys(keys)[0] - 7
    x = _ref_partition(h, w, b, num_valid, temperature=t)
    want = x.gather(1, ids[:, None])[:, 0] - torch.logsumexp(x, 1)
    assert float((-pairs[:, 1].double().log1p() - want).abs().max()) <= 1e-5
    greedy = emu.shard(h, w, b, 7, num_valid, log_partition=True, **kw)[1]
    assert torch.equal(pairs[t == 0], greedy[t == 0])


@pytest.mark.parametrize("path,dtype,shape", LSE_CASES, ids=str)
def test_log_partition_at_a_temperature(emu, gen, path, dtype, shape):
    """shard_argmax_lse's own temperature (the log-odds at a request's T):
    the emulated kernel keeps the argmax's keys (bit-equal to the CPU's),
    ref the key's value, and others within 1e-5 (log space) of the float64
    direct sum over the other valid rows of exp((x - ref) / T) (T <= 0: 1),
    padding that would dominate excluded; rows with T = 1 or T <= 0 give the
    pairs of no temperature, bit for bit."""
    batch, rows, hidden_size = shape
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, "f" if dtype != torch.float32 else "t")
    num_valid = max(2, rows - 5) if rows > 2 else rows
    w[num_valid:] = 3
    t = torch.tensor([0.7, 0.0, 2.0, 1.0, 0.05, -1.0] * 22)[:batch]
    kw = {"path": path, "gemm_chunk": 50}
    keys, pairs = emu.shard(h, w, b, 7, num_valid, log_partition=True, partition_temperature=t, scale=0.5, **kw)
    want_keys, want_pairs = ops.shard_argmax_lse(h, w, b, 7, num_valid, 0.5, 0.0, "generic", t)
    assert_keys_equal(keys, want_keys, "lse keys at T")
    assert torch.equal(pairs[:, 0], localargmax.decode_keys(keys)[1])
    x = _ref_partition(h, w, b, num_valid, 0.5, temperature=t)  # x / T
    ids = localargmax.decode_keys(keys)[0] - 7
    d = x - x.gather(1, ids[:, None])
    d.scatter_(1, ids[:, None], -math.inf)
    want = torch.logsumexp(d, 1)  # log of the others' sum
    normal = want > -80  # float32 sums below e^-87 are subnormal or 0: there only "tiny" is checked
    err = torch.cat([(pairs[normal, 1].double().log() - want[normal]).abs(), torch.zeros(1)])
    assert float(err.max()) <= 1e-5, f"others' sums at T: log error {float(err.max()):.3g} > 1e-5"
    assert bool((pairs[~normal, 1].double() <= math.exp(-79)).all()), "others' sums at T: not tiny"
    assert float((pairs - want_pairs).abs().max()) <= 1e-4 * max(1.0, float(pairs[:, 1].max()))  # vs the CPU's
    plain = emu.shard(h, w, b, 7, num_valid, log_partition=True, scale=0.5, **kw)[1]
    same = (t == 1) | (t <= 0)
    assert torch.equal(pairs[same], plain[same])


def test_simt_log_partition_specials_and_empty_shard(emu, gen):
    """-inf rows (ref -inf, others 0), a NaN entry (others NaN), two +inf
    entries (ref +inf, others = 1, the other +inf), across blocks; an empty
    shard and a batch of 0 return (-inf, 0) without a launch (the mma
    path's: tests/test_emulation_lse_mma.py)."""
    h, w, _ = exact_problem(gen, 4, 200, 8, torch.float32)
    b = torch.zeros(200)
    h[0] = 1.0
    w[:, 0] = 1.0
    b[:] = -math.inf  # every row -inf ...
    b[150] = math.nan  # ... but a NaN at 150 and +inf at 70 and 190
    keys, pairs = emu.shard(h, w, b, 0, 200, log_partition=True)
    assert pairs[:, 1].isnan().all() and torch.equal(keys, ops.shard_argmax(h, w, b, 0, 200, "generic"))
    b[150] = -math.inf
    keys, pairs = emu.shard(h, w, b, 0, 200, log_partition=True)
    assert pairs.tolist() == [[-math.inf, 0.0]] * 4
    b[70] = b[190] = math.inf
    keys, pairs = emu.shard(h, w, b, 0, 200, log_partition=True)
    assert pairs.tolist() == [[math.inf, 1.0]] * 4 and (decode(keys) == 70).all()  # others: the +inf at 190
    keys, pairs = emu.shard(h, w, b, 0, 0, log_partition=True)
    assert (keys == 0).all() and pairs.tolist() == [[-math.inf, 0.0]] * 4
    assert emu.shard(h[:0], w, b, 0, 200, log_partition=True)[1].shape == (0, 2)


def test_the_models_mma_choice_is_choose_mma_config(emu):
    """bench/predict.py's cpp_mma_config (the bandwidth model's C++ auto, the dispatch
    table's incumbent) = choose_mma_config of shard_launch.cuh, around every boundary."""
    from bench import predict as pm

    for sm_count in (1, 78, 132):
        for num_valid in (1, 64 * 4 * sm_count - 64, 64 * 4 * sm_count - 63, 64 * 4 * sm_count, 18992, 151936):
            for batch in (1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 1024):
                want = emu.mma_config(4096, num_valid, batch, sm_count)
                assert pm.cpp_mma_config(num_valid, batch, sm_count) == want, (sm_count, num_valid, batch)
