"""shard_argmax (+ merge_keys over shards) against the float64 reference, and
the hard cases of DESIGN.md's rules 1-5, in one process (no collective)."""
from __future__ import annotations

import math

import pytest
import torch

import localargmax
from helpers import (
    PAD_FILLS,
    build_shards,
    check_against_reference,
    min_gap,
    planted_problem,
    random_problem,
    ref_argmax,
    ref_logits,
    same_float32,
    sharded_argmax,
    sharded_keys,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["f32", "bf16", "f16"]
BIASES = [None, "float32", "weight"]


def _randint(gen, lo, hi):
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


# ----------------------------------------------------------------------------
# Random and planted data vs the float64 reference
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", BIASES, ids=["nobias", "bias_f32", "bias_wdtype"])
@pytest.mark.parametrize("hsize", [1, 7, 33, 100])
def test_random_single_shard_vs_reference(gen, dtype, bias, hsize):
    """Pure random data, one shard at a random vocab_start: clear winners must
    match exactly, other rows only within the float32 error bound."""
    for _ in range(3):
        batch = _randint(gen, 1, 37)
        vocab = _randint(gen, 1, 3000)
        vocab_start = _randint(gen, 0, 10**6)
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, bias)
        keys = localargmax.shard_argmax(hidden, weight, vocab_start=vocab_start, bias=b)
        ids, values = localargmax.decode_keys(keys)
        ctx = f"B={batch} V={vocab} H={hsize} start={vocab_start}"
        # tie-prone data (H=1, 16-bit values) has many exact float64 ties
        min_clear = 0.85
        check_against_reference(ids - vocab_start, hidden, weight, b, min_clear_fraction=min_clear, context=ctx)
        # the decoded value is the float32 logit of the winner, within the bound
        exact = ref_logits(hidden, weight, b)[torch.arange(batch), ids - vocab_start]
        tol = (hsize + 2) * 2.0**-24 * (
            hidden.double().abs() @ weight.double().abs().T + (b.double().abs() if b is not None else 0)
        )[torch.arange(batch), ids - vocab_start]
        assert bool(((values.double() - exact).abs() <= tol + 1e-300).all()), ctx


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", BIASES, ids=["nobias", "bias_f32", "bias_wdtype"])
@pytest.mark.parametrize("hsize", [33, 100, 256])
def test_planted_winners_match_exactly(gen, dtype, bias, hsize):
    """One planted winner per batch row, clear by a wide margin: the sharded
    result (every tp / pad_to layout) equals the float64 reference exactly."""
    batch = _randint(gen, 1, 64)
    vocab = _randint(gen, max(batch, 50), 3000)
    hidden, weight, b, winners = planted_problem(gen, batch, vocab, hsize, dtype, bias)
    assert min_gap(hidden, weight, b) > 0.02  # the planting worked
    want = ref_argmax(hidden, weight, b)
    assert torch.equal(want, winners)
    for tp in (1, 2, 3, 4):
        for pad_to in (1, 64):
            ids, _ = sharded_argmax(hidden, weight, b, tp=tp, pad_to=pad_to)
            assert torch.equal(ids, want), f"tp={tp} pad_to={pad_to} V={vocab} B={batch}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("pad_fill", PAD_FILLS)
def test_random_sharded_vs_reference(gen, dtype, pad_fill):
    """Random data split over tp = 1..4 shards with padding that would win if
    evaluated; H not a multiple of 8; vocab not divisible by tp."""
    for _ in range(2):
        hsize = int(torch.tensor([1, 7, 9, 33, 65])[_randint(gen, 0, 4)])
        batch = _randint(gen, 1, 20)
        vocab = _randint(gen, 1, 2000)
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, "float32")
        for tp in (1, 2, 3, 4):
            for pad_to in (1, 8, 64, 128):
                ids, _ = sharded_argmax(hidden, weight, b, tp=tp, pad_to=pad_to, pad_fill=pad_fill)
                ctx = f"tp={tp} pad_to={pad_to} V={vocab} B={batch} H={hsize}"
                min_clear = 0.8
                check_against_reference(ids, hidden, weight, b, min_clear_fraction=min_clear, context=ctx)


def test_large_rows_many_chunks(gen):
    """Enough rows for many 64-row tiles and parallel chunks, odd batch."""
    hidden, weight, b, winners = planted_problem(gen, 13, 9000, 40, torch.float32, "float32")
    ids, _ = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, bias=b))
    assert torch.equal(ids, winners)


def test_same_keys_for_any_thread_count(gen):
    """The result must not depend on how the work is split over threads."""
    hidden, weight, b = random_problem(gen, 9, 5000, 19, torch.float32, "float32")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = localargmax.shard_argmax(hidden, weight, bias=b)
        torch.set_num_threads(max(2, threads))
        many = localargmax.shard_argmax(hidden, weight, bias=b)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


# ----------------------------------------------------------------------------
# Rule 1: exact ties go to the smallest global index, also across shards
# ----------------------------------------------------------------------------


def _tie_problem(gen, batch, vocab, hsize, dtype, copies):
    """Random lm_head with one winning row u duplicated at the global indices
    `copies` (it wins every batch row by a wide margin)."""
    hidden = (0.5 + torch.rand(batch, hsize, generator=gen)).to(dtype)  # positive: u wins every row
    weight = (torch.randn(vocab, hsize, generator=gen) / math.sqrt(hsize)).to(dtype)
    u = (torch.full((hsize,), 10.0 / math.sqrt(hsize)) + 0.1 * torch.randn(hsize, generator=gen)).to(dtype)
    weight[copies] = u
    bias = torch.randn(vocab, generator=gen) * 0.1
    bias[copies] = 0.375
    return hidden, weight, bias


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [1, 7, 64])
def test_exact_ties_smallest_index_wins(gen, dtype, hsize):
    vocab = _randint(gen, 300, 1500)
    batch = _randint(gen, 1, 11)
    for tp in (1, 2, 3, 4):
        for pad_to in (1, 64):
            shards = build_shards(torch.zeros(vocab, 1), None, tp, pad_to)
            # one copy in every non-empty shard, and more inside the last one:
            # different tiles, a tile boundary, the last valid row
            copies = set()
            for _, _, s in shards:
                if s.num_valid:
                    copies.add(s.vocab_start + _randint(gen, 0, s.num_valid - 1))
                    copies.add(s.vocab_start + s.num_valid - 1)
                    if s.num_valid > 64:
                        copies.add(s.vocab_start + 64)
                        copies.add(s.vocab_start + 63)
            copies = sorted(copies)
            for bias_on in (False, True):
                hidden, weight, bias = _tie_problem(gen, batch, vocab, hsize, dtype, copies)
                bias = bias if bias_on else None
                ids, values = sharded_argmax(hidden, weight, bias, tp=tp, pad_to=pad_to)
                ctx = f"tp={tp} pad_to={pad_to} copies={copies} bias={bias_on}"
                assert ids.tolist() == [copies[0]] * batch, ctx
                assert torch.equal(ref_argmax(hidden, weight, bias), ids), ctx
                # without the first copy the next one wins
                ids2, values2 = sharded_argmax(hidden, weight[copies[0] + 1 :], None if bias is None else bias[copies[0] + 1 :], tp=tp, pad_to=pad_to)
                assert ids2.tolist() == [copies[1] - copies[0] - 1] * batch, ctx


def test_ties_merge_independent_of_rank_order(gen):
    """merge_keys takes the smallest index on ties whatever the order of the
    ranks' keys (a non-standard layout where rank 0 holds the higher ids)."""
    row = torch.randn(1, 16, generator=gen)
    hidden = row * (0.5 + torch.rand(6, 1, generator=gen)) + 0.01 * torch.randn(6, 16, generator=gen)
    w_low = torch.cat([torch.randn(9, 16, generator=gen) * 0.01, row])  # the tie at global 10 + 9 = 19
    w_high = torch.cat([row, torch.randn(5, 16, generator=gen) * 0.01])  # and at global 1000
    k_high = localargmax.shard_argmax(hidden, w_high, vocab_start=1000)
    k_low = localargmax.shard_argmax(hidden, w_low, vocab_start=10)
    assert torch.equal(k_high >> 32, k_low >> 32), "identical rows must give identical values (rule 5)"
    for order in ([k_high, k_low], [k_low, k_high], [k_high, k_high, k_low]):
        ids, _ = localargmax.merge_keys(torch.stack(order))
        assert ids.tolist() == [19] * 6


# ----------------------------------------------------------------------------
# Rule 2: NaN wins, smallest NaN index first
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_in_bias_on_several_shards(gen, dtype):
    vocab = _randint(gen, 200, 900)
    batch = _randint(gen, 1, 9)
    hidden, weight, _ = random_problem(gen, batch, vocab, 24, dtype)
    for tp in (1, 2, 3, 4):
        for bias_dtype in (torch.float32, dtype):
            bias = (torch.randn(vocab, generator=gen)).to(bias_dtype)
            nans = sorted(set(torch.randint(vocab // 3, vocab, (tp + 1,), generator=gen).tolist()))
            bias[nans] = float("nan")
            ids, values = sharded_argmax(hidden, weight, bias, tp=tp, pad_to=64)
            assert ids.tolist() == [nans[0]] * batch, f"tp={tp} nans={nans}"
            assert torch.isnan(values).all()
            assert torch.equal(ref_argmax(hidden, weight, bias), ids)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_and_inf_from_weights(gen, dtype):
    """An inf weight meets a zero hidden entry (0 * inf = NaN) in some batch
    rows only; other rows get +inf or -inf from it; a NaN weight row poisons
    every batch row; +inf ties go to the smaller index."""
    vocab, hsize, batch = 700, 12, 8
    hidden, weight, _ = random_problem(gen, batch, vocab, hsize, dtype)
    hidden[:, 0] = torch.tensor([0.0, 1.0, -1.0, 0.0, 2.0, -0.5, 1.0, 0.0]).to(dtype)
    weight[650, 0] = float("inf")  # NaN for rows 0, 3, 7; +inf for 1, 4, 6; -inf for 2, 5
    weight[400, 0] = float("inf")  # same, smaller index
    weight[500, 0] = float("-inf")  # +inf for 2, 5
    weight[520, 0] = float("-inf")
    for tp in (1, 2, 3, 4):
        ids, _ = sharded_argmax(hidden, weight, None, tp=tp, pad_to=8)
        want = ref_argmax(hidden, weight)
        assert want.tolist() == [400, 400, 500, 400, 400, 500, 400, 400]
        assert torch.equal(ids, want), f"tp={tp}: {ids.tolist()}"
    weight[600, 5] = float("nan")  # NaN logit everywhere; 400 still first NaN for 0, 3, 7
    for tp in (1, 3):
        ids, _ = sharded_argmax(hidden, weight, None, tp=tp, pad_to=1)
        assert ids.tolist() == [400, 600, 600, 400, 600, 600, 600, 400]
        assert torch.equal(ids, ref_argmax(hidden, weight))


# ----------------------------------------------------------------------------
# Rules 3 and 4: all -inf rows, padding never wins, empty shards
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_all_neg_inf_gives_first_valid_index(gen, dtype):
    vocab = _randint(gen, 1, 500)
    hidden, weight, _ = random_problem(gen, 5, vocab, 10, dtype)
    for bias_dtype in (torch.float32, dtype):
        bias = torch.full((vocab,), float("-inf"), dtype=bias_dtype)
        for tp in (1, 2, 3, 4):
            for pad_to in (1, 64, 256):
                for pad_fill in PAD_FILLS:
                    ids, values = sharded_argmax(hidden, weight, bias, tp=tp, pad_to=pad_to, pad_fill=pad_fill)
                    assert ids.tolist() == [0] * 5, f"tp={tp} pad_to={pad_to} fill={pad_fill} V={vocab}"
                    assert (values == float("-inf")).all()
        # one shard alone, at an offset
        keys = localargmax.shard_argmax(hidden, weight, vocab_start=123, bias=bias)
        assert localargmax.decode_keys(keys)[0].tolist() == [123] * 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("pad_fill", PAD_FILLS)
def test_padding_never_wins_every_layout(gen, dtype, pad_fill):
    """Padding rows are filled to win if evaluated; every shard_vocab layout
    for tp = 1..4 and several pad_to must still give the reference ids."""
    hsize = 40
    for vocab in (1, 5, 63, 64, 65, _randint(gen, 66, 700)):
        batch = min(vocab, 6)
        hidden, weight, b, _ = planted_problem(gen, batch, vocab, hsize, dtype, "float32")
        want = ref_argmax(hidden, weight, b)
        for tp in (1, 2, 3, 4):
            for pad_to in (1, 3, 8, 64, 128):
                shards = build_shards(weight, b, tp, pad_to, hidden=hidden, pad_fill=pad_fill)
                ids, _ = localargmax.merge_keys(sharded_keys(hidden, shards))
                assert torch.equal(ids, want), f"V={vocab} tp={tp} pad_to={pad_to}: {ids.tolist()} != {want.tolist()}"
                # the fill really would win: evaluating the padding changes the answer
                padded = [(w, bb, s) for (w, bb, s) in shards if s.rows > s.num_valid]
                if padded:
                    w, bb, s = padded[0]
                    cheat = localargmax.decode_keys(
                        localargmax.shard_argmax(hidden, w, vocab_start=s.vocab_start, num_valid=s.rows, bias=bb)
                    )[0]
                    assert bool((cheat >= s.vocab_start + s.num_valid).any()), "padding fill would not win"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_empty_shard_keys_are_zero(gen, dtype):
    hidden, weight, _ = random_problem(gen, 7, 64, 9, dtype)
    weight[:] = float("nan")
    bias = torch.full((64,), float("inf"))
    for b in (None, bias):
        keys = localargmax.shard_argmax(hidden, weight, vocab_start=5000, num_valid=0, bias=b)
        assert keys.dtype == torch.int64 and keys.shape == (7,)
        assert keys.eq(0).all()
    # a [0, H] shard too
    keys = localargmax.shard_argmax(hidden, weight[:0], vocab_start=0, num_valid=0)
    assert keys.shape == (7,) and keys.eq(0).all()
    # zero keys take part in a merge without winning
    real = localargmax.shard_argmax(hidden, torch.randn(3, 9, generator=gen).to(dtype), vocab_start=0)
    ids, _ = localargmax.merge_keys(torch.stack([real, keys, keys]))
    assert torch.equal(ids, localargmax.decode_keys(real)[0])


def test_vocab_not_divisible_by_tp_has_empty_last_shards(gen):
    """V=10, pad_to=64, tp=4: rank 0 holds everything, ranks 1-3 are all padding."""
    hidden, weight, b = random_problem(gen, 5, 10, 16, torch.float32, "float32")
    shards = build_shards(weight, b, 4, 64, hidden=hidden, pad_fill="nan")
    assert [s.num_valid for _, _, s in shards] == [10, 0, 0, 0]
    keys = sharded_keys(hidden, shards)
    assert keys[1:].eq(0).all()
    ids, _ = localargmax.merge_keys(keys)
    check_against_reference(ids, hidden, weight, b, min_clear_fraction=0.8)


def test_batch_zero(gen):
    for dtype in DTYPES:
        hidden = torch.empty((0, 12), dtype=dtype)
        weight = torch.randn(30, 12, generator=gen).to(dtype)
        keys = localargmax.shard_argmax(hidden, weight, vocab_start=3, bias=torch.zeros(30))
        assert keys.shape == (0,) and keys.dtype == torch.int64
        ids, values = localargmax.merge_keys(torch.stack([keys, keys]))
        assert ids.shape == (0,) and values.shape == (0,) and values.dtype == torch.float32
        assert localargmax.lm_head_argmax(hidden, weight).shape == (0,)


def test_hidden_size_zero(gen):
    """H = 0: every logit is the empty sum 0 (+ bias)."""
    hidden = torch.empty((3, 0))
    weight = torch.empty((20, 0))
    ids, values = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, vocab_start=4))
    assert ids.tolist() == [4, 4, 4] and values.tolist() == [0.0] * 3
    bias = torch.randn(20, generator=gen)
    ids, _ = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, bias=bias))
    assert ids.tolist() == [int(bias.argmax())] * 3


# ----------------------------------------------------------------------------
# Signed zeros and denormals
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_zero_hidden_ties_at_first_valid_index(gen, dtype):
    """A zero hidden state (padded batch slot): products are -0.0 or +0.0,
    all logits compare equal, so the first valid index wins (torch.argmax)."""
    vocab = 300
    hidden = torch.zeros((4, 20), dtype=dtype)
    hidden[1] = -0.0
    hidden[2, ::2] = -0.0
    weight = torch.randn(vocab, 20, generator=gen).to(dtype)
    weight[0] = -weight[0].abs() - 0.5  # row 0: all products -0.0 for hidden +0
    for tp in (1, 2, 3, 4):
        ids, values = sharded_argmax(hidden, weight, None, tp=tp, pad_to=64, pad_fill="nan")
        assert ids.tolist() == [0] * 4, f"tp={tp}"
        assert values.view(torch.int32).eq(0).all(), "decoded zero must be +0.0"
        # with a bias of signed zeros
        bias = torch.zeros(vocab)
        bias[::3] = -0.0
        ids, _ = sharded_argmax(hidden, weight, bias, tp=tp, pad_to=1)
        assert ids.tolist() == [0] * 4
    assert ref_argmax(hidden, weight).tolist() == [0] * 4


def test_negative_zero_logit_ties_positive_zero():
    """Only a -0.0 and a +0.0 entry: they tie, the smaller index wins, in
    either order and across shards."""
    hidden = torch.tensor([[1.0]])
    neg = torch.tensor([[-0.0]])
    pos = torch.tensor([[0.0]])
    k_neg = localargmax.shard_argmax(hidden, neg, vocab_start=3, bias=torch.tensor([-0.0]))
    k_pos = localargmax.shard_argmax(hidden, pos, vocab_start=5)
    assert torch.equal(k_neg.view(-1) >> 32, k_pos.view(-1) >> 32)
    for pair in ([k_neg, k_pos], [k_pos, k_neg]):
        assert localargmax.merge_keys(torch.stack(pair))[0].tolist() == [3]
    k_neg7 = localargmax.shard_argmax(hidden, neg, vocab_start=7)
    k_pos2 = localargmax.shard_argmax(hidden, pos, vocab_start=2)
    assert localargmax.merge_keys(torch.stack([k_neg7, k_pos2]))[0].tolist() == [2]


def test_denormal_logits_pick_the_right_winner(gen):
    """Logits that are float32 denormals: flushing them to zero would make
    everything tie at index 0. Exact arithmetic: every value is exactly
    representable, so the decoded value is checked bit-exact too."""
    hsize = 8
    vocab = 200
    h = 2.0**-70
    hidden = torch.full((2, hsize), h)
    hidden[1] = -h
    coeff = torch.randperm(vocab, generator=gen).float() + 1.0  # distinct 1..V
    weight = (coeff * 2.0**-70).view(-1, 1).expand(vocab, hsize).contiguous()
    for tp in (1, 2, 3):
        ids, values = sharded_argmax(hidden, weight, None, tp=tp, pad_to=64, pad_fill="nan")
        want = ref_argmax(hidden, weight)
        assert torch.equal(ids, want), f"tp={tp}: {ids.tolist()} vs {want.tolist()}"
        assert int(want[0]) == int(coeff.argmax()) and int(want[1]) == int(coeff.argmin())
        exact = torch.tensor([coeff.max() * hsize * 2.0**-140, -coeff.min() * hsize * 2.0**-140], dtype=torch.float64)
        assert torch.equal(values.double(), exact), (values.tolist(), exact.tolist())
        assert 0 < abs(float(values[0])) < 1.1754943508222875e-38  # really a denormal
    # H = 1: the denormal weights themselves, both signs, beside -0.0 / +0.0
    d = 2.0**-149  # the smallest float32 denormal
    w1 = torch.tensor([-d, -0.0, 0.0, d, 3 * d, 2 * d, -2 * d]).view(-1, 1)
    ids, values = localargmax.decode_keys(localargmax.shard_argmax(torch.tensor([[1.0], [-1.0]]), w1))
    assert ids.tolist() == [4, 6]
    assert values.tolist() == [3 * d, 2 * d]


@pytest.mark.parametrize("isa", ["default", "generic"])
def test_float16_subnormal_weights(gen, monkeypatch, isa):
    """fp16 subnormal weights (the half -> float conversion's subnormal path):
    the exact winner and its exact value, H >= 8 so the AVX2 path converts
    with F16C and the tail in software."""
    path = "generic" if isa == "generic" else "auto"
    vocab, hsize = 300, 11
    k = torch.randperm(1023, generator=gen)[:vocab] + 1  # distinct subnormal mantissas
    sub = (k.double() * 2.0**-24).to(torch.float16)
    assert bool((sub.float() < 2.0**-14).all()) and bool((sub.double() == k.double() * 2.0**-24).all())
    weight = torch.zeros((vocab, hsize), dtype=torch.float16)
    col = int(torch.randint(0, hsize, (1,), generator=gen))
    weight[:, col] = sub
    weight[:, (col + 3) % hsize] = -sub
    hidden = torch.zeros((2, hsize), dtype=torch.float16)
    hidden[0, col] = 1.0
    hidden[1, (col + 3) % hsize] = 2.0
    ids, values = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, path=path))
    want = ref_argmax(hidden, weight)
    assert torch.equal(ids, want)
    assert int(want[0]) == int(k.argmax()) and int(want[1]) == int(k.argmin())
    assert values.double().tolist() == [float(k.max()) * 2.0**-24, -2.0 * float(k.min()) * 2.0**-24]


# ----------------------------------------------------------------------------
# Rule 5: identical weight rows give bit-identical logits wherever they sit
# ----------------------------------------------------------------------------


def _logit_at(hidden, weight, row, vocab_start=0, path="auto"):
    """The float32 logit of local `row` alone: every other row gets bias -inf."""
    bias = torch.full((weight.shape[0],), float("-inf"))
    bias[row] = 0.0
    keys = localargmax.shard_argmax(hidden, weight, vocab_start=vocab_start, bias=bias, path=path)
    ids, values = localargmax.decode_keys(keys)
    assert ids.eq(vocab_start + row).all()
    return values


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [5, 8, 37, 300])
def test_identical_rows_identical_logits(gen, dtype, hsize):
    batch = 7
    rows = 203
    hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
    weight = torch.randn(rows, hsize, generator=gen).to(dtype)
    u = torch.randn(hsize, generator=gen).to(dtype)
    positions = [0, 1, 3, 4, 62, 63, 64, 65, 127, 128, 199, 200, 201, 202]
    weight[positions] = u
    ref = _logit_at(hidden, weight, positions[0])
    for p in positions[1:]:
        assert same_float32(_logit_at(hidden, weight, p), ref), f"row {p} differs from row {positions[0]}"
    # in other shards: different sizes, offsets, num_valid
    for other_rows, pos, start in ((1, 0, 10**6), (5, 4, 77), (130, 129, 3), (64, 17, 0)):
        w = torch.randn(other_rows, hsize, generator=gen).to(dtype)
        w[pos] = u
        assert same_float32(_logit_at(hidden, w, pos, start), ref), f"shard of {other_rows} rows, row {pos}"
    # and the same hidden row at any batch position gives the same logit
    for b in range(batch):
        single = hidden[b : b + 1].repeat(6, 1)
        vals = _logit_at(single, weight, 64)
        assert same_float32(vals, ref[b].repeat(6)), f"batch row {b}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [29, 40])  # 40: rows read in place (fp32, bf16), blocked by batch size
def test_same_hidden_row_same_key_at_any_batch_position(gen, dtype, hsize):
    """The CPU kernel blocks rows and batch rows differently by batch size
    (8 / 4 rows at batch 1, 3 rows x 4 batch rows and tails of 1-3 above): a
    key must not depend on the blocking."""
    hidden_row = torch.randn(1, hsize, generator=gen).to(dtype)
    weight = torch.randn(517, hsize, generator=gen).to(dtype)
    for batch in (1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13):
        hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
        where = int(torch.randint(0, batch, (1,), generator=gen))
        hidden[where] = hidden_row[0]
        keys = localargmax.shard_argmax(hidden, weight)
        alone = localargmax.shard_argmax(hidden_row, weight)
        assert int(keys[where]) == int(alone[0]), f"batch={batch} position={where}"


# ----------------------------------------------------------------------------
# The two CPU ISA variants give bit-identical keys
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [1, 7, 8, 9, 33, 100])
def test_generic_isa_matches_default(gen, monkeypatch, dtype, hsize):
    batch, rows = 13, 777
    hidden, weight, _ = random_problem(gen, batch, rows, hsize, dtype)
    # specials: tiny / huge / non-finite values in a few places
    weight[5, 0] = float("inf")
    weight[9, -1] = float("nan")
    hidden[3, 0] = 0.0
    hidden[4] = hidden[4] * 1e-30 if dtype == torch.float32 else hidden[4]
    bias = torch.randn(rows, generator=gen)
    results = {}
    for isa in ("default", "generic", "default"):
        path = "generic" if isa == "generic" else "auto"
        results.setdefault(isa, []).append(
            [localargmax.shard_argmax(hidden, weight, num_valid=nv, bias=b, path=path) for nv in (rows, 600)
             for b in (None, bias)]
        )
    # also every row's own logit (not just the winner), through the bias trick
    weight = weight.clone()
    weight[5, 0] = 1.0
    weight[9, -1] = -1.0
    for row in (0, 1, 5, 9, 63, 64, 600, 776):
        vals = []
        for path in ("auto", "generic"):
            vals.append(_logit_at(hidden, weight, row, path=path))
        assert same_float32(vals[0], vals[1]), f"row {row} logit differs between ISA variants"
    default_a, default_b = results["default"]
    for got, ref_a, ref_b in zip(results["generic"][0], default_a, default_b):
        assert torch.equal(ref_a, ref_b)
        assert torch.equal(got, ref_a), "generic and default ISA keys differ"


@pytest.mark.slow
def test_stress_random_configurations(gen):
    """Many random (dtype, H, B, V, tp, pad_to, bias, padding fill) problems,
    each against the float64 reference."""
    dtypes = DTYPES
    for it in range(400):
        dtype = dtypes[_randint(gen, 0, 2)]
        hsize = _randint(gen, 1, 160)
        batch = _randint(gen, 1, 40)
        vocab = _randint(gen, 1, 4000)
        bias = BIASES[_randint(gen, 0, 2)]
        tp = _randint(gen, 1, 8)
        pad_to = [1, 2, 8, 64, 128][_randint(gen, 0, 4)]
        pad_fill = PAD_FILLS[_randint(gen, 0, 2)]
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, bias)
        ids, _ = sharded_argmax(hidden, weight, b, tp=tp, pad_to=pad_to, pad_fill=pad_fill)
        ctx = f"it={it} {dtype} H={hsize} B={batch} V={vocab} bias={bias} tp={tp} pad_to={pad_to} fill={pad_fill}"
        check_against_reference(ids, hidden, weight, b, min_clear_fraction=0.5, context=ctx)
