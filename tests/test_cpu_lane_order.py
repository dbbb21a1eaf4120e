"""The bit-exact CPU paths' arithmetic, modelled independently (DESIGN.md,
"CPU paths"): per (weight row, batch row) 8 float32 lanes, lane l holding
k = l (mod 8), one correctly rounded fused multiply-add per step in
increasing k over the zero-padded hidden size, then the tree
((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)), then + bias. The model computes each
FMA exactly in float64 (the product of two float32 is exact there; the sum
rounded to odd, then to float32, is the correctly rounded result), so a
register-tiled kernel that changed any lane's order, the tree, or which
logit a key carries fails here, at every batch size 1..70 (every batch
tail of every tile shape) and every row position of every tile. The
fast epilogue (the argmax's and top-k's screens: only logits that can
still enter the kept keys make keys; sampling's screen by a bound of the
noise; the vectorised log-partition) is compared with the scalar epilogue
(``_C._scalar_epilogue``: every logit through emit) on every path, brgemm
included, with ties, NaN, -inf, signed zeros and denormal logits under the
caller's flush-to-zero mode; the top-k also against the model's k largest
keys."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import localargmax
from localargmax import _C
from tests.support.paths import CPU_ISA_PATHS, cpu_path_unavailable

LANE_EXACT = ("generic", "avx2", "avx512")
U32 = 0xFFFFFFFF


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32(a * b + c) rounded once, from float32-valued float64 tensors."""
    p = a * b  # exact: 24 + 24 bits
    s = p + c
    bp = s - c  # TwoSum: s + e == p + c exactly
    e = (p - bp) + (c - (s - bp))
    e = torch.where(torch.isfinite(s), e, torch.zeros_like(e))
    bits = s.view(torch.int64)
    # round to odd: an inexact s with an even last bit moves one ulp towards the exact value
    step = torch.where((e > 0) == (s > 0), 1, -1)
    odd = torch.where((e != 0) & (bits & 1 == 0), bits + step, bits).view(torch.float64)
    return odd.to(torch.float32).to(torch.float64)


def lane_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """[B, V] float32 logits in the bit-exact paths' order."""
    H = hidden.shape[1]
    pad = (H + 7) // 8 * 8
    h = torch.zeros(hidden.shape[0], pad, dtype=torch.float64)
    h[:, :H] = hidden.float().double()
    w = torch.zeros(weight.shape[0], pad, dtype=torch.float64)
    w[:, :H] = weight.float().double()
    acc = torch.zeros(h.shape[0], w.shape[0], 8, dtype=torch.float64)
    for k in range(0, pad, 8):
        acc = _fma32(w[None, :, k : k + 8], h[:, None, k : k + 8], acc)
    a = acc.float()
    logits = ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + ((a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7]))
    return logits + bias if bias is not None else logits


def best_keys(logits: torch.Tensor, vocab_start: int) -> torch.Tensor:
    """Per batch row the largest packed key (DESIGN.md), as the ops' int64."""
    u = logits.contiguous().view(torch.int32).long() & U32
    u = torch.where(u == 0x80000000, 0, u)  # -0.0 as +0.0
    o = torch.where(u & 0x80000000 != 0, u ^ U32, u | 0x80000000)
    o = torch.where(torch.isnan(logits), U32, o)
    index = torch.arange(logits.shape[1]) + vocab_start
    signed = ((o - 2**31) << 32) | (U32 - index)  # key ^ (1 << 63): signed max = unsigned max
    return signed.max(dim=1).values ^ -(2**63)


def topk_keys(logits: torch.Tensor, vocab_start: int, k: int) -> torch.Tensor:
    """Per batch row the k largest packed keys, descending, as the ops' int64."""
    u = logits.contiguous().view(torch.int32).long() & U32
    u = torch.where(u == 0x80000000, 0, u)
    o = torch.where(u & 0x80000000 != 0, u ^ U32, u | 0x80000000)
    o = torch.where(torch.isnan(logits), U32, o)
    index = torch.arange(logits.shape[1]) + vocab_start
    signed = ((o - 2**31) << 32) | (U32 - index)
    return signed.topk(k, dim=1).values ^ -(2**63)


def _paths(names):
    return [pytest.param(n, marks=pytest.mark.skipif(cpu_path_unavailable(n) is not None, reason=n)) for n in names]


def test_model_is_the_fma():
    """The model's FMA against cases where rounding the float64 sum directly
    to float32 double-rounds (a halfway float32 value plus a tiny tail)."""
    # a * b = 1 - 2^-30; c + a * b lies just below 2^24 + 3, halfway between float32s 2^24 + 2 and 2^24 + 4
    a = torch.tensor([1.0 + 2.0**-15], dtype=torch.float64)
    b = torch.tensor([1.0 - 2.0**-15], dtype=torch.float64)
    c = torch.tensor([2.0**24 + 2], dtype=torch.float64)
    assert _fma32(a, b, c).item() == 2.0**24 + 2  # rounded once
    assert (a * b + c).float().item() == 2.0**24 + 4  # float64 first: 2^24 + 3, then ties to even
    assert _fma32(-a, b, -c).item() == -(2.0**24 + 2)
    assert _fma32(a, b, torch.tensor([1.0], dtype=torch.float64)).item() == 2.0  # 2 - 2^-30: nearest float32


def _tiled_with_ties(gen, dtype, hsize, tie_last_row=False):
    """``(hidden [70, hsize], weight [205, hsize], bias [205])``: 3 full tiles
    and a tail, identical rows planted (3 = 64, 129 = 130; also 204 with
    ``tie_last_row``), tied bias entries, and batch row 5 all zero (every
    logit +-0)."""
    weight = (torch.randn(205, hsize, generator=gen) / hsize**0.5).to(dtype)
    weight[64] = weight[3]
    if tie_last_row:
        weight[204] = weight[3]
    weight[130] = weight[129]
    hidden = torch.randn(70, hsize, generator=gen).to(dtype)
    hidden[5] = 0.0
    bias = torch.randn(205, generator=gen)
    bias[64] = bias[204] = bias[3]
    return hidden, weight, bias


@pytest.mark.parametrize("name", _paths(LANE_EXACT))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hsize", [13, 40, 136])
def test_keys_equal_the_lane_model_at_every_batch_size(gen, name, dtype, hsize):
    """Batch 1..70 (each a prefix of one batch: every batch-tail shape),
    205 rows (3 full tiles and a tail; row groups of every size at every
    position), identical rows planted (exact ties), with and without bias:
    the keys are the model's argmax keys, bit for bit."""
    vocab_start = 1000
    hidden, weight, bias = _tiled_with_ties(gen, dtype, hsize, tie_last_row=True)  # hidden[5] = 0: the first row wins
    for b in (None, bias):
        want = best_keys(lane_logits(hidden, weight, b), vocab_start)
        assert int(localargmax.decode_keys(want[5:6])[0]) == vocab_start + (int(b.argmax()) if b is not None else 0)
        for batch in range(1, 71):
            got = localargmax.shard_argmax(hidden[:batch], weight, bias=b, vocab_start=vocab_start, path=name)
            assert torch.equal(got, want[:batch]), (name, hsize, batch, b is not None)


def _planted(gen, dtype, hsize=24, rows=150, batch=21):
    weight = (torch.randn(rows, hsize, generator=gen) / hsize**0.5).to(dtype)
    hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
    bias = torch.randn(rows, generator=gen)
    bias[70] = bias[71] = 50.0  # rows 70 and 71 identical and ahead: a tie
    weight[71] = weight[70]
    hidden[1] = 0.0  # all +-0 (the bias decides)
    hidden[2, 0] = math.inf  # +-inf / NaN logits in batch row 2
    return hidden, weight, bias


@pytest.mark.parametrize("name", _paths(CPU_ISA_PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("flush", [False, True], ids=["keep", "ftz"])
def test_screen_equals_every_logit_emitted(gen, name, dtype, flush):
    """The argmax's screened keys equal those of the scalar epilogue (every
    logit packed and compared) and shard_sample's at temperature 0 on every
    row (greedy keys) on every path, brgemm's emit_block included: ties, a NaN row
    (planted at each position), an all -inf row, zero hidden states, and
    denormal logits under either flush mode of the caller."""
    hidden, weight, bias = _planted(gen, dtype)
    zero_t = torch.zeros(hidden.shape[0])
    tiny = (weight.float() * 2.0**-70).to(dtype)

    def both(h, w, bias=None, **kw):
        fast, slow = _fast_and_scalar(lambda: localargmax.shard_argmax(h, w, bias=bias, path=name, **kw), flush)
        torch.set_flush_denormal(flush)
        try:
            greedy = localargmax.shard_sample(h, w, zero_t[: h.shape[0]], 3, 0, bias=bias, path=name, **kw)
        finally:
            torch.set_flush_denormal(False)
        assert torch.equal(fast, slow) and torch.equal(fast, greedy), (name, kw)
        return fast

    keys = both(hidden, weight, bias, vocab_start=7)
    assert int(localargmax.decode_keys(keys[0:1])[0]) == 7 + 70
    for nan_row in (0, 69, 71, 149):
        w = weight.clone()
        w[nan_row, 3] = math.nan
        ids = localargmax.decode_keys(both(hidden, w, bias))[0]
        assert ids.eq(nan_row).all(), (nan_row, ids.tolist())
    all_inf = torch.full_like(bias, -math.inf)
    ids = localargmax.decode_keys(both(hidden, weight, all_inf, num_valid=140))[0]
    assert ids[:2].eq(0).all() and ids[3:].eq(0).all()  # batch row 2: inf + -inf = NaN wins
    both(hidden, weight, -bias)
    both(hidden * 2.0**-70, tiny)  # denormal logits (or flushed, where the path flushes whatever the mode)


@pytest.mark.parametrize("name", _paths(LANE_EXACT))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("k", [2, 8, 64])
def test_topk_keys_equal_the_lane_model(gen, name, dtype, k):
    """The top-k's screened keys are the model's k largest keys, bit for bit,
    at batch sizes of every tail shape, 205 rows (tiles and a tail), exact
    ties planted, with and without bias."""
    vocab_start = 1000
    hidden, weight, bias = _tiled_with_ties(gen, dtype, 40)  # hidden[5] = 0: the first k rows
    for b in (None, bias):
        want = topk_keys(lane_logits(hidden, weight, b), vocab_start, k)
        for batch in (1, 7, 8, 9, 16, 17, 33, 64, 70):
            got = localargmax.shard_topk(hidden[:batch], weight, k, bias=b, vocab_start=vocab_start, path=name)
            assert torch.equal(got, want[:batch]), (name, k, batch, b is not None)


@contextlib.contextmanager
def scalar_epilogue():
    """Every logit through the CPU ops' scalar emit (no screen, no vectorised
    log-partition: ``_C._scalar_epilogue``), the reference of the fast epilogue."""
    was = _C._scalar_epilogue(True)
    try:
        yield
    finally:
        _C._scalar_epilogue(was)


def _fast_and_scalar(call, flush):
    torch.set_flush_denormal(flush)
    try:
        fast = call()
        with scalar_epilogue():
            slow = call()
    finally:
        torch.set_flush_denormal(False)
    return fast, slow


def _bits(x):
    return x.view(torch.int32) if x.dtype == torch.float32 else x


@pytest.mark.parametrize("name", _paths(CPU_ISA_PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("flush", [False, True], ids=["keep", "ftz"])
def test_topk_screen_equals_every_logit_emitted(gen, name, dtype, flush):
    """The top-k's screened keys equal those of the scalar epilogue (every
    logit packed and inserted) on every path, brgemm's emit_block included:
    ties, NaN rows, an all -inf bias (fewer finite logits than k), denormal
    logits under either flush mode, k from 1 to 64."""
    hidden, weight, bias = _planted(gen, dtype)
    tiny = (weight.float() * 2.0**-70).to(dtype)

    def both(h, w, k, bias=None, **kw):
        fast, slow = _fast_and_scalar(lambda: localargmax.shard_topk(h, w, k, bias=bias, path=name, **kw), flush)
        assert torch.equal(fast, slow), (name, k, kw)
        return fast

    for k in (1, 3, 8, 64):
        keys = both(hidden, weight, k, bias, vocab_start=7)
        if k >= 2:
            assert localargmax.decode_keys(keys[0, :2])[0].tolist() == [7 + 70, 7 + 71]  # the tie: smaller id first
        w = weight.clone()
        w[69, 3] = math.nan
        w[149, 0] = math.nan
        both(hidden, w, k, bias)
        both(hidden, weight, k, torch.full_like(bias, -math.inf), num_valid=140)
        both(hidden, weight, k, -bias)
        both(hidden * 2.0**-70, tiny, k)


@pytest.mark.parametrize("name", _paths(CPU_ISA_PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("flush", [False, True], ids=["keep", "ftz"])
def test_sample_screen_is_the_scalar_epilogue(gen, name, dtype, flush):
    """shard_sample's screened epilogue (Philox words for kScreen batch rows at
    once, each logit screened by its noise's bucket bound) gives the scalar
    emit's keys bit for bit on every path: batch sizes of every lane tail,
    temperatures below 1, at 1, above 1 and 0 (greedy) mixed in one batch,
    offsets whose rows pass 2**32 (Philox's high counter word), seeds past
    2**32, ties, NaN rows, an all -inf bias, +-inf and denormal logits under
    either flush mode; a row's key does not depend on the batch around it."""
    hidden, weight, bias = _planted(gen, dtype, rows=530, batch=70)  # 8 tiles and a tail; past brgemm's 32-row block
    batch = hidden.shape[0]
    t = torch.rand(batch, generator=gen) * 2.5
    t[::4] = 0.0
    t[1::5] = 1.0
    t[2::7] = 1e-3
    w_nan = weight.clone()
    w_nan[69, 3] = math.nan
    cases = [
        dict(bias=bias, seed=3, offset=0, vocab_start=7),
        dict(bias=bias, seed=2**40 + 5, offset=2**32 - 30),
        dict(bias=torch.full_like(bias, -math.inf), num_valid=140, seed=9, offset=1),
        dict(weight=w_nan, bias=-bias, seed=11, offset=2**63 - 100),
        dict(hidden=hidden * 2.0**-70, weight=(weight.float() * 2.0**-70).to(dtype), seed=1, offset=5),
        dict(hidden=hidden * 30.0, seed=4, offset=0),  # logits far apart: most screened out
    ]
    # Batch row 0's noised scores planted within 1e-4 of each other (hidden row 0 zero, the bias
    # cancelling the noise at T = 1 and T = 0.5): its best moves by tiny steps, which a bound looser
    # by more than the noise's own rounding lets slip.
    rows, flat = weight.shape[0], hidden.clone()
    flat[0] = 0.0
    for t0, offset in ((1.0, 17), (0.5, 2**32 + 3)):
        g = torch.ops.localargmax.gumbel_noise(21, torch.full((rows,), offset), torch.arange(rows))
        eps = torch.rand(rows, generator=gen) * 1e-4
        cases.append(dict(hidden=flat, bias=-(g * t0) + eps, seed=21, offset=offset, t0=t0))
    for case in cases:
        h, w = case.pop("hidden", hidden), case.pop("weight", weight)
        seed, offset = case.pop("seed"), case.pop("offset")
        tc = t.clone()
        tc[0] = case.pop("t0", float(t[0]))
        full = None
        for b in (batch, 1, 7, 8, 9, 16, 17, 33):

            def call(b=b):
                return localargmax.shard_sample(h[:b], w, tc[:b], seed, offset, path=name, **case)

            fast, slow = _fast_and_scalar(call, flush)
            assert torch.equal(fast, slow), (name, b, seed, offset, list(case))
            full = fast if full is None else full
            assert torch.equal(fast, full[:b]), (name, b)


@pytest.mark.parametrize("name", _paths(CPU_ISA_PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("flush", [False, True], ids=["keep", "ftz"])
def test_vectorised_log_partition_is_the_scalar_one(gen, name, dtype, flush):
    """The log-partition ops' vectorised epilogue (kScreen batch rows per
    vector, ieee_expf in every lane) gives the scalar emit's keys and pairs
    bit for bit on every path, at batch sizes of every lane tail, with a
    scale, a per-row temperature of the sums, ties, NaN rows, an all -inf
    bias, +-inf logits and denormal logits under either flush mode; a row's
    pair does not depend on the batch around it."""
    hidden, weight, bias = _planted(gen, dtype, rows=530, batch=70)  # 8 tiles and a tail; past brgemm's 32-row block
    t = torch.rand(hidden.shape[0], generator=gen) * 2 + 0.05
    w_nan = weight.clone()
    w_nan[69, 3] = math.nan
    cases = [
        dict(bias=bias, vocab_start=7),
        dict(bias=bias, scale=0.37),
        dict(bias=torch.full_like(bias, -math.inf), num_valid=140),
        dict(bias=-bias, temperature=t),
        dict(weight=w_nan, bias=bias, scale=3.0),
        dict(hidden=hidden * 2.0**-70, weight=(weight.float() * 2.0**-70).to(dtype)),
    ]
    for case in cases:
        h, w = case.pop("hidden", hidden), case.pop("weight", weight)
        full = None
        for batch in (hidden.shape[0], 1, 7, 8, 9, 16, 17, 33):
            kw = dict(case, temperature=case["temperature"][:batch]) if "temperature" in case else case
            for k in (None, 1, 5):

                def call(kw=kw, k=k, batch=batch):
                    if k is None:
                        return localargmax.shard_argmax(h[:batch], w, path=name, log_partition=True, **kw)
                    kw = {key: v for key, v in kw.items() if key != "temperature"}
                    return localargmax.shard_topk(h[:batch], w, k, path=name, log_partition=True, **kw)

                (fk, fp), (sk, sp) = _fast_and_scalar(call, flush)
                assert torch.equal(fk, sk), (name, batch, k, list(kw))
                assert torch.equal(_bits(fp), _bits(sp)), (name, batch, k, list(kw))
                if k is None:  # batch row b's pair, whatever the batch around it
                    full = fp if full is None else full
                    assert torch.equal(_bits(fp), _bits(full[:batch])), (name, batch, list(kw))
