"""Property tests (hypothesis) of shard_argmax, merge_keys, decode_keys,
lm_head_argmax / lm_head_topk on simulated ranks, against the float64
reference, on data where the comparison is exact.

Exactness: every hidden value is m * 2**eh and every weight value m * 2**ew
with |m| <= 7 (exact in float32, bfloat16 and float16 for the exponent ranges
drawn), eh + ew >= -149 and H <= 48, so every product and every partial sum is
a multiple of 2**(eh + ew) below 2**24 of them: the float32 accumulation is
exact in any order, and so is the float64 reference. Ties, NaN, +-inf, -0.0
and denormals (eh + ew near -149) are then decided by DESIGN.md's rules alone
and must match exactly, not within a bound.

Random tensors come from a torch generator whose seed hypothesis draws (so a
failure shrinks to small shapes and a small seed, and hypothesis prints it).
"""
from __future__ import annotations

import math
import struct

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import localargmax  # noqa: E402
from fault_helpers import (  # noqa: E402
    PAD_KINDS,
    allreduce_max,
    full_bias,
    make_shards,
    python_unsigned_max,
    ref_topk,
    shard_keys,
    simulated_argmax,
    simulated_topk,
)
from helpers import py_pack_key, ref_argmax, ref_logits, to_int64, to_uint64  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# exponent e of m * 2**e, |m| <= 7, exactly representable (subnormals included)
EXP_RANGE = {torch.float32: (-149, 120), torch.bfloat16: (-133, 120), torch.float16: (-24, 12)}
SPECIALS = ("w_nan", "w_inf", "w_ninf", "h_inf", "h_ninf", "h_nan", "b_nan", "b_inf", "b_ninf", "dup", "dup",
            "dup_far", "zero_hidden_row", "all_neg_inf_bias", "neg_zero_weight_row")

PROPS = settings(max_examples=1200, deadline=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Problem:
    def __init__(self, hidden, weight, bias, desc):
        self.hidden, self.weight, self.bias, self.desc = hidden, weight, bias, desc

    def __repr__(self):
        return f"Problem({self.desc})"


@st.composite
def problems(draw, max_batch=6, max_vocab=260, max_h=48, min_batch=0):
    dtype = draw(st.sampled_from(DTYPES))
    batch = draw(st.integers(min_batch, max_batch))
    vocab = draw(st.integers(1, max_vocab))
    hsize = draw(st.integers(1, max_h))
    lo, hi = EXP_RANGE[dtype]
    eh = draw(st.integers(lo, hi))
    ew = draw(st.integers(max(lo, -149 - eh), min(hi, 100 - eh)))
    seed = draw(st.integers(0, 2**32 - 1))
    bias_kind = draw(st.sampled_from([None, "float32", "weight"]))
    specials = draw(st.lists(st.tuples(st.sampled_from(SPECIALS), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)),
                             max_size=4))
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.randint(-7, 8, (batch, hsize), generator=gen).double() * 2.0**eh).to(dtype)
    weight = (torch.randint(-7, 8, (vocab, hsize), generator=gen).double() * 2.0**ew).to(dtype)
    # few distinct rows: exact ties are common
    if vocab > 4 and seed % 3 == 0:
        weight = weight[torch.randint(0, max(1, vocab // 4), (vocab,), generator=gen)]
    bias = None
    if bias_kind is not None:
        b64 = torch.randint(-64, 65, (vocab,), generator=gen).double() * 2.0 ** (eh + ew)
        bias = b64.float()
        if bias_kind == "weight" and torch.equal(b64.to(dtype).double(), b64):
            bias = b64.to(dtype)

    def pick(frac, n):
        return min(n - 1, int(frac * n))

    for kind, fa, fb, fc in specials:
        if kind.startswith("w_") or kind.startswith("dup") or kind == "neg_zero_weight_row":
            i, j = pick(fa, vocab), pick(fb, hsize)
            if kind == "w_nan":
                weight[i, j] = float("nan")
            elif kind == "w_inf":
                weight[i, j] = float("inf")
            elif kind == "w_ninf":
                weight[i, j] = float("-inf")
            elif kind == "dup":
                weight[pick(fc, vocab)] = weight[i]
            elif kind == "dup_far":
                weight[vocab - 1 - pick(fc, max(1, vocab // 8))] = weight[i]
            else:
                weight[i] = -0.0
        elif kind.startswith("h_") or kind == "zero_hidden_row":
            if batch == 0:
                continue
            b, j = pick(fa, batch), pick(fb, hsize)
            if kind == "zero_hidden_row":
                hidden[b] = 0.0
            else:
                hidden[b, j] = {"h_inf": math.inf, "h_ninf": -math.inf, "h_nan": math.nan}[kind]
        else:
            if bias is None:
                bias = torch.zeros(vocab)
            if kind == "all_neg_inf_bias":
                bias[:] = -math.inf
            else:
                bias[pick(fa, vocab)] = {"b_nan": math.nan, "b_inf": math.inf, "b_ninf": -math.inf}[kind]
    desc = (f"B={batch} V={vocab} H={hsize} {dtype} eh={eh} ew={ew} seed={seed} bias={bias_kind}"
            f"{'/' + str(bias.dtype) if bias is not None else ''} specials={[s[0] for s in specials]}")
    return Problem(hidden, weight, bias, desc)


@st.composite
def layouts(draw):
    return draw(st.integers(1, 4)), draw(st.integers(1, 128)), draw(st.sampled_from(PAD_KINDS))


def _same_values(got: torch.Tensor, want64: torch.Tensor) -> bool:
    """float32 values equal to the (exact) float64 ones; NaN matches NaN."""
    want = want64.float()
    both_nan = got.isnan() & want.isnan()
    return bool((both_nan | (got == want)).all())


def _d2t_for(gen_seed: int, vocab: int):
    gen = torch.Generator().manual_seed(gen_seed)
    target = vocab + int(torch.randint(0, 3 * vocab + 1, (1,), generator=gen))
    d2t = localargmax.build_d2t(torch.randint(0, 50, (target,), generator=gen), vocab)
    localargmax.validate_d2t(d2t, vocab, target)
    return d2t


# -----------------------------------------------------------------------------
# shard_argmax on one shard: exact id and exact value
# -----------------------------------------------------------------------------


@PROPS
@given(p=problems(), start_frac=st.floats(0, 1), pad_rows=st.integers(0, 70), pad=st.sampled_from(PAD_KINDS))
def test_shard_argmax_exact(p, start_frac, pad_rows, pad):
    vocab = p.weight.shape[0]
    vocab_start = int(start_frac * (localargmax.MAX_GLOBAL_INDEX - vocab + 1))
    # one shard of vocab + pad_rows rows: the padding would win if evaluated
    rows = vocab + pad_rows
    (w, b, s), = make_shards(p.weight, p.bias, 1, rows, hidden=p.hidden, pad=pad)
    assert s.rows == rows and s.num_valid == vocab
    keys = localargmax.shard_argmax(p.hidden, w, vocab_start=vocab_start, num_valid=vocab, bias=b)
    b_full = full_bias(p.bias, [(w, b, s)], vocab)
    want = ref_argmax(p.hidden, p.weight, b_full)
    if p.hidden.shape[0] == 0:
        assert keys.shape == (0,)
        return
    ids, values = localargmax.decode_keys(keys)
    assert torch.equal(ids, want + vocab_start), p
    logits = ref_logits(p.hidden, p.weight, b_full)
    assert _same_values(values, logits[torch.arange(len(want)), want]), p


# -----------------------------------------------------------------------------
# sharded: merge_keys, lm_head_argmax (all-gather and all-reduce), d2t
# -----------------------------------------------------------------------------


@PROPS
@given(p=problems(), layout=layouts(), use_d2t=st.booleans(), perm_seed=st.integers(0, 1000))
def test_sharded_argmax_exact(p, layout, use_d2t, perm_seed):
    tp, pad_to, pad = layout
    vocab = p.weight.shape[0]
    shards = make_shards(p.weight, p.bias, tp, pad_to, hidden=p.hidden, pad=pad)
    b_full = full_bias(p.bias, shards, vocab)
    d2t = _d2t_for(perm_seed, vocab) if use_d2t else None
    want = ref_argmax(p.hidden, p.weight, b_full, d2t)
    keys = shard_keys(p.hidden, shards)
    ids, _ = localargmax.merge_keys(keys, d2t)
    assert torch.equal(ids, want), p
    # the order of the ranks' keys does not matter (max is commutative)
    perm = torch.randperm(tp, generator=torch.Generator().manual_seed(perm_seed))
    assert torch.equal(localargmax.merge_keys(keys[perm], d2t)[0], want)
    # all-reduce MAX (sign flip) == unsigned max == all-gather + merge
    if p.hidden.shape[0]:
        assert torch.equal(allreduce_max(keys), python_unsigned_max(keys))
    for reduce in ("all_gather", "all_reduce"):
        assert torch.equal(simulated_argmax(p.hidden, shards, d2t=d2t, reduce=reduce), want), (p, reduce)


# -----------------------------------------------------------------------------
# lm_head_topk: exact order (NaN first, larger value, smaller index) and values
# -----------------------------------------------------------------------------


@settings(PROPS, max_examples=600)
@given(p=problems(max_vocab=200), layout=layouts(), k_frac=st.floats(0, 1), use_d2t=st.booleans())
def test_lm_head_topk_exact(p, layout, k_frac, use_d2t):
    tp, pad_to, pad = layout
    vocab = p.weight.shape[0]
    k = 1 + int(k_frac * (min(vocab, localargmax.MAX_TOPK) - 1))
    shards = make_shards(p.weight, p.bias, tp, pad_to, hidden=p.hidden, pad=pad)
    b_full = full_bias(p.bias, shards, vocab)
    logits = ref_logits(p.hidden, p.weight, b_full)
    want = ref_topk(logits, k)
    d2t = _d2t_for(k, vocab) if use_d2t else None
    if p.hidden.shape[0] == 0:
        return  # lm_head_topk with B = 0: see test_bad_inputs_all.py
    ids, values = simulated_topk(p.hidden, shards, k, d2t=d2t)
    assert torch.equal(ids, want if d2t is None else want + d2t[want]), p
    assert _same_values(values, logits.gather(1, want)), p


# -----------------------------------------------------------------------------
# merge_keys / decode_keys on raw keys
# -----------------------------------------------------------------------------


def _py_decode(u: int):
    """(index, float) of an unsigned key, DESIGN.md's format inverted."""
    o, low = u >> 32, u & 0xFFFFFFFF
    bits = (o & 0x7FFFFFFF) if (o & 0x80000000) else (o ^ 0xFFFFFFFF)
    return 0xFFFFFFFF - low, struct.unpack("<f", struct.pack("<I", bits))[0]


raw_keys = st.one_of(
    st.just(0),
    st.tuples(st.integers(0, 2**32 - 1), st.integers(1, 2**32 - 1)).map(lambda t: (t[0] << 32) | t[1]),
    st.tuples(st.floats(width=32, allow_nan=True, allow_infinity=True), st.integers(0, 2**32 - 2)).map(
        lambda t: py_pack_key(t[0], t[1])),
)


@settings(PROPS, max_examples=800)
@given(data=st.data(), tp=st.integers(1, 5), batch=st.integers(0, 8))
def test_merge_keys_is_unsigned_max(data, tp, batch):
    cols = []
    for _ in range(batch):
        col = data.draw(st.lists(raw_keys, min_size=tp, max_size=tp))
        if all(k == 0 for k in col):
            col[data.draw(st.integers(0, tp - 1))] = data.draw(raw_keys.filter(lambda k: k != 0))
        cols.append(col)
    keys = torch.tensor([[to_int64(cols[b][r]) for b in range(batch)] for r in range(tp)], dtype=torch.int64)
    keys = keys.view(tp, batch)
    ids, values = localargmax.merge_keys(keys)
    for b in range(batch):
        index, value = _py_decode(max(cols[b]))
        assert int(ids[b]) == index, (cols[b], int(ids[b]))
        got = float(values[b])
        assert (math.isnan(got) and math.isnan(value)) or got == value, (cols[b], got, value)
    if batch:
        assert torch.equal(allreduce_max(keys), python_unsigned_max(keys))
        # associativity: merging halves first, then the winners, is the same
        if tp > 1:
            half = tp // 2
            parts = [python_unsigned_max(keys[:half]), python_unsigned_max(keys[half:])]
            again, _ = localargmax.merge_keys(torch.cat(parts))
            assert torch.equal(again, ids)


@settings(PROPS, max_examples=2000)
@given(value=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
       index=st.one_of(st.integers(0, 2**32 - 2), st.sampled_from([0, 1, 2**24 - 1, 2**24, 2**24 + 1, 2**31,
                                                                  2**32 - 3, 2**32 - 2])))
def test_decode_and_kernel_encoding(value, index):
    """decode_keys inverts the Python model of the key, and the kernel's own
    key of a one-entry shard (H = 1, hidden 1.0) is that model's key."""
    key = py_pack_key(value, index)
    ids, values = localargmax.decode_keys(torch.tensor([to_int64(key)]))
    assert int(ids[0]) == index
    got = float(values[0])
    if math.isnan(value):
        assert math.isnan(got)
    else:
        assert got == value and (value != 0 or math.copysign(1, got) == 1.0)  # -0.0 decodes as +0.0
    kernel = localargmax.shard_argmax(torch.ones(1, 1), torch.tensor([[value]]), vocab_start=index)
    assert to_uint64(int(kernel[0])) == key


# -----------------------------------------------------------------------------
# lm_head_argmax with real d2t tables, world size 1 and simulated ranks
# -----------------------------------------------------------------------------


@settings(PROPS, max_examples=500)
@given(p=problems(min_batch=1), tp=st.integers(1, 4), d2t_seed=st.integers(0, 2**16))
def test_d2t_maps_exactly(p, tp, d2t_seed):
    vocab = p.weight.shape[0]
    d2t = _d2t_for(d2t_seed, vocab)
    target = localargmax.draft_to_target_ids(d2t)
    assert bool((target[1:] > target[:-1]).all())
    want = ref_argmax(p.hidden, p.weight, p.bias, d2t)
    assert torch.equal(localargmax.lm_head_argmax(p.hidden, p.weight, bias=p.bias, d2t=d2t), want), p
    shards = make_shards(p.weight, p.bias, tp, 64, hidden=p.hidden)
    assert torch.equal(simulated_argmax(p.hidden, shards, d2t=d2t), want), p
