"""shard_argmax, the fused kernel: one correctness body and opcheck on every
kernel path; random, planted and sharded problems against the float64
reference; DESIGN.md's rules 1-5 (ties, NaN, all -inf, padding, identical
rows), signed zeros and denormals. The CPU ISA variants, threads and
log-partition pairs: test_shard_argmax_cpu.py; the CUDA paths and the
tensor-core variants: test_shard_argmax_cuda.py; the argument checks of every
fused op: test_shard_argmax_bad_input.py."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from tests.support.keys import same_float32
from tests.support.paths import (
    on,
    path_keyword,
)
from tests.support.problems import (
    PAD_KINDS,
    full_bias,
    integer_problem,
    make_shards,
    planted_problem,
    random_problem,
    shard_keys,
    sharded_argmax,
    simulated_argmax,
    simulated_topk,
)
from tests.support.reference import (
    check_against_reference,
    error_bound,
    min_gap,
    ref_argmax,
    ref_logits,
    ref_topk,
)
from tests.support.shard_argmax_common import (
    BIAS_IDS,
    BIASES,
    DTYPE_IDS,
    DTYPES,
    blas_reference,
    ids_of,
    logit_at,
    randint,
)
from tests.support.strategies import exact_problems, given, settings, st

# ----------------------------------------------------------------------------- one body, every path


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_shard_argmax_correctness(gen, path, dtype):
    """Planted winners, every tp / padding layout, against the float64
    reference (ids and decoded values, at vocab_start 0 and 123); opcheck."""
    cuda = path.device == "cuda"
    for hsize in (1, 2, 3, 31, 33, 127, 129, 4095, 4097) if cuda else (1, 3, 33):
        for batch, vocab in [(1, 1), (3, 129), (17, 1001)] + ([(64, 20000)] if cuda else []):
            hidden, weight, _ = random_problem(gen, batch, vocab, hsize, dtype)
            winners = torch.randint(0, vocab, (batch,), generator=gen)
            weight[winners] = (hidden.float() * 3).to(dtype)
            bias = torch.randn(vocab, generator=gen) * 0.01
            # a plant 3|h|^2 need not win for small H: judged against float64 with the float32 error bound
            reference = blas_reference(hidden, weight, bias)
            for tp in (1, 3):
                ids, _ = sharded_argmax(on(path, hidden), weight, bias, tp=tp, pad="nan" if tp == 3 else "huge")
                ctx = f"{path} H={hsize} B={batch} V={vocab} tp={tp}"
                check_against_reference(
                    ids, hidden, weight, bias, min_clear_fraction=0.8, context=ctx, reference=reference
                )
            # at vocab_start 123: the ids (clear rows exact, near-ties within the bound) and each row's value
            # within the float32 error bound of its float64 logit (the paths sum in other orders: other bits)
            keys = localargmax.shard_argmax(*on(path, hidden, weight), vocab_start=123, bias=on(path, bias)).cpu()
            ids, values = localargmax.decode_keys(keys)
            check_against_reference(ids - 123, hidden, weight, bias, min_clear_fraction=0.8, reference=reference)
            logits, err = reference
            rows = torch.arange(batch)
            col = ids - 123
            off = (values.double() - logits[rows, col]).abs() - err[rows, col]
            assert bool((off <= 0).all()), f"{path} H={hsize} B={batch}: values past the bound by {off.max():.3g}"
    hidden, weight = on(path, torch.randn(5, 19, generator=gen).to(dtype), torch.randn(70, 19, generator=gen).to(dtype))
    bias32, biasw = on(path, torch.randn(70, generator=gen), torch.randn(70, generator=gen).to(dtype))
    for args in [
        (hidden, weight, None, 0, 70),
        (hidden, weight, bias32, 1000, 65),
        (hidden, weight, biasw, 7, 0),
        (hidden[:0], weight, None, 0, 3),
    ]:
        torch.library.opcheck(
            torch.ops.localargmax.shard_argmax.default, args, {"path": path_keyword(path, hidden_size=19, dtype=dtype)}
        )


# ----------------------------------------------------------------------------- random and planted data


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", BIASES, ids=BIAS_IDS)
@pytest.mark.parametrize("hsize", [1, 7, 33, 100])
def test_random_single_shard_vs_reference(gen, dtype, bias, hsize):
    """Pure random data, one shard at a random vocab_start: clear winners must
    match exactly, other rows only within the float32 error bound; the decoded
    value is the winner's logit within the bound."""
    for _ in range(3):
        batch, vocab, vocab_start = randint(gen, 1, 37), randint(gen, 1, 3000), randint(gen, 0, 10**6)
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, bias)
        ids, values = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, vocab_start=vocab_start, bias=b))
        ctx = f"B={batch} V={vocab} H={hsize} start={vocab_start}"
        check_against_reference(ids - vocab_start, hidden, weight, b, min_clear_fraction=0.85, context=ctx)
        rows = torch.arange(batch)
        exact = ref_logits(hidden, weight, b)[rows, ids - vocab_start]
        tol = error_bound(hidden, weight, b)[rows, ids - vocab_start]
        assert bool(((values.double() - exact).abs() <= tol + 1e-300).all()), ctx


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("bias", BIASES, ids=BIAS_IDS)
@pytest.mark.parametrize("hsize", [33, 100, 256])
def test_planted_winners_match_exactly(gen, dtype, bias, hsize):
    """One planted winner per batch row, clear by a wide margin: the sharded
    result (every tp / pad_to layout) equals the float64 reference exactly."""
    batch = randint(gen, 1, 64)
    hidden, weight, b, winners = planted_problem(gen, batch, randint(gen, max(batch, 50), 3000), hsize, dtype, bias)
    assert min_gap(hidden, weight, b) > 0.02  # the planting worked
    for tp in (1, 2, 3, 4):
        for pad_to in (1, 64):
            ids, _ = sharded_argmax(hidden, weight, b, tp=tp, pad_to=pad_to)
            assert torch.equal(ids, winners), f"tp={tp} pad_to={pad_to} B={batch}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("pad", PAD_KINDS)
def test_random_sharded_vs_reference(gen, dtype, pad):
    """Random data over tp = 1..4 shards with padding that would win; H not a
    multiple of 8; vocab not divisible by tp."""
    for _ in range(2):
        hsize = [1, 7, 9, 33, 65][randint(gen, 0, 4)]
        batch, vocab = randint(gen, 1, 20), randint(gen, 1, 2000)
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, "float32")
        for tp in (1, 2, 3, 4):
            for pad_to in (1, 8, 64, 128):
                ids, _ = sharded_argmax(hidden, weight, b, tp=tp, pad_to=pad_to, pad=pad)
                ctx = f"tp={tp} pad_to={pad_to} V={vocab} B={batch} H={hsize}"
                check_against_reference(ids, hidden, weight, b, min_clear_fraction=0.8, context=ctx)


@settings(max_examples=1200, deadline=None)
@given(p=exact_problems(), start_frac=st.floats(0, 1), pad_rows=st.integers(0, 70), pad=st.sampled_from(PAD_KINDS))
def test_shard_argmax_exact(p, start_frac, pad_rows, pad):
    """Exact data, one shard of vocab + pad_rows rows (padding that would win)
    at any vocab_start: the exact id and the exact value."""
    vocab = p.weight.shape[0]
    vocab_start = int(start_frac * (localargmax.MAX_GLOBAL_INDEX - vocab + 1))
    ((w, b, s),) = make_shards(p.weight, p.bias, 1, vocab + pad_rows, hidden=p.hidden, pad=pad)
    assert s.rows == vocab + pad_rows and s.num_valid == vocab
    keys = localargmax.shard_argmax(p.hidden, w, vocab_start=vocab_start, num_valid=vocab, bias=b)
    if p.hidden.shape[0] == 0:
        assert keys.shape == (0,)
        return
    b_full = full_bias(p.bias, [(w, b, s)], vocab)
    want = ref_argmax(p.hidden, p.weight, b_full)
    ids, values = localargmax.decode_keys(keys)
    assert torch.equal(ids, want + vocab_start), p
    exact = ref_logits(p.hidden, p.weight, b_full)[torch.arange(len(want)), want].float()
    assert bool(((values.isnan() & exact.isnan()) | (values == exact)).all()), p


def test_large_rows_many_chunks(gen):
    """Enough rows for many 64-row tiles and parallel chunks, odd batch."""
    hidden, weight, b, winners = planted_problem(gen, 13, 9000, 40, torch.float32, "float32")
    assert torch.equal(ids_of(hidden, weight, bias=b), winners)


# ----------------------------------------------------------------------------- rule 1: ties to the smallest index


def _tie_problem(gen, batch, vocab, hsize, dtype, copies):
    """Random lm_head with one winning row u at the global indices ``copies``
    (positive hidden: u wins every batch row by a wide margin)."""
    hidden = (0.5 + torch.rand(batch, hsize, generator=gen)).to(dtype)
    weight = (torch.randn(vocab, hsize, generator=gen) / math.sqrt(hsize)).to(dtype)
    weight[copies] = (torch.full((hsize,), 10.0 / math.sqrt(hsize)) + 0.1 * torch.randn(hsize, generator=gen)).to(dtype)
    bias = torch.randn(vocab, generator=gen) * 0.1
    bias[copies] = 0.375
    return hidden, weight, bias


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [1, 7, 64])
def test_exact_ties_smallest_index_wins(gen, dtype, hsize):
    vocab, batch = randint(gen, 300, 1500), randint(gen, 1, 11)
    for tp in (1, 2, 3, 4):
        for pad_to in (1, 64):
            # one copy in every non-empty shard, more in each: a tile boundary, the last valid row
            copies = set()
            for s in (localargmax.shard_vocab(vocab, r, tp, pad_to) for r in range(tp)):
                if s.num_valid:
                    copies |= {s.vocab_start + randint(gen, 0, s.num_valid - 1), s.vocab_start + s.num_valid - 1}
                    if s.num_valid > 64:
                        copies |= {s.vocab_start + 63, s.vocab_start + 64}
            copies = sorted(copies)
            for bias_on in (False, True):
                hidden, weight, bias = _tie_problem(gen, batch, vocab, hsize, dtype, copies)
                bias = bias if bias_on else None
                ids, _ = sharded_argmax(hidden, weight, bias, tp=tp, pad_to=pad_to)
                ctx = f"tp={tp} pad_to={pad_to} copies={copies} bias={bias_on}"
                assert ids.tolist() == [copies[0]] * batch, ctx
                assert torch.equal(ref_argmax(hidden, weight, bias), ids), ctx
                cut = copies[0] + 1  # without the first copy the next one wins
                ids2, _ = sharded_argmax(
                    hidden, weight[cut:], None if bias is None else bias[cut:], tp=tp, pad_to=pad_to
                )
                assert ids2.tolist() == [copies[1] - cut] * batch, ctx


def test_ties_merge_independent_of_rank_order(gen):
    """merge_keys takes the smallest index on ties whatever the order of the
    ranks' keys (a non-standard layout where rank 0 holds the higher ids)."""
    row = torch.randn(1, 16, generator=gen)
    hidden = row * (0.5 + torch.rand(6, 1, generator=gen)) + 0.01 * torch.randn(6, 16, generator=gen)
    k_low = localargmax.shard_argmax(hidden, torch.cat([torch.randn(9, 16, generator=gen) * 0.01, row]), vocab_start=10)
    k_high = localargmax.shard_argmax(
        hidden, torch.cat([row, torch.randn(5, 16, generator=gen) * 0.01]), vocab_start=1000
    )
    assert torch.equal(k_high >> 32, k_low >> 32), "identical rows must give identical values (rule 5)"
    for order in ([k_high, k_low], [k_low, k_high], [k_high, k_high, k_low]):
        assert localargmax.merge_keys(torch.stack(order))[0].tolist() == [19] * 6


# ----------------------------------------------------------------------------- rules 2-4: NaN, -inf, padding


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_in_bias_on_several_shards(gen, dtype):
    vocab, batch = randint(gen, 200, 900), randint(gen, 1, 9)
    hidden, weight, _ = random_problem(gen, batch, vocab, 24, dtype)
    for tp in (1, 2, 3, 4):
        for bias_dtype in (torch.float32, dtype):
            bias = torch.randn(vocab, generator=gen).to(bias_dtype)
            nans = sorted(set(torch.randint(vocab // 3, vocab, (tp + 1,), generator=gen).tolist()))
            bias[nans] = float("nan")
            ids, values = sharded_argmax(hidden, weight, bias, tp=tp, pad_to=64)
            assert ids.tolist() == [nans[0]] * batch and torch.isnan(values).all(), f"tp={tp} nans={nans}"
            assert torch.equal(ref_argmax(hidden, weight, bias), ids)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_and_inf_from_weights(gen, dtype):
    """An inf weight meets a zero hidden entry (0 * inf = NaN) in some batch
    rows only; other rows get +inf or -inf from it; a NaN weight row poisons
    every batch row; +inf ties go to the smaller index."""
    hidden, weight, _ = random_problem(gen, 8, 700, 12, dtype)
    hidden[:, 0] = torch.tensor([0.0, 1.0, -1.0, 0.0, 2.0, -0.5, 1.0, 0.0]).to(dtype)
    weight[650, 0] = float("inf")  # NaN for rows 0, 3, 7; +inf for 1, 4, 6; -inf for 2, 5
    weight[400, 0] = float("inf")  # same, smaller index
    weight[500, 0] = float("-inf")  # +inf for 2, 5
    weight[520, 0] = float("-inf")
    assert ref_argmax(hidden, weight).tolist() == [400, 400, 500, 400, 400, 500, 400, 400]
    for tp in (1, 2, 3, 4):
        assert torch.equal(sharded_argmax(hidden, weight, None, tp=tp, pad_to=8)[0], ref_argmax(hidden, weight)), tp
    weight[600, 5] = float("nan")  # NaN logit everywhere; 400 still the first NaN for rows 0, 3, 7
    for tp in (1, 3):
        ids, _ = sharded_argmax(hidden, weight, None, tp=tp, pad_to=1)
        assert ids.tolist() == [400, 600, 600, 400, 600, 600, 600, 400]
        assert torch.equal(ids, ref_argmax(hidden, weight))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_all_neg_inf_gives_first_valid_index(gen, dtype):
    vocab = randint(gen, 1, 500)
    hidden, weight, _ = random_problem(gen, 5, vocab, 10, dtype)
    for bias_dtype in (torch.float32, dtype):
        bias = torch.full((vocab,), float("-inf"), dtype=bias_dtype)
        for tp in (1, 2, 3, 4):
            for pad_to in (1, 64, 256):
                for pad in ("huge", "nan", "inf_bias"):
                    ids, values = sharded_argmax(hidden, weight, bias, tp=tp, pad_to=pad_to, pad=pad)
                    assert ids.tolist() == [0] * 5, f"tp={tp} pad_to={pad_to} fill={pad} V={vocab}"
                    assert (values == float("-inf")).all()
        assert ids_of(hidden, weight, vocab_start=123, bias=bias).tolist() == [123] * 5  # one shard, at an offset


@pytest.mark.parametrize("pad", PAD_KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_padding_rows_never_win(gen, dtype, pad):
    """Fault family: padding rows that would win (the fill really does win when
    evaluated as vocabulary) never win, for every shard_vocab layout of many
    vocab sizes, tp 1..4 and pad_to values: through shard_argmax + merge_keys,
    lm_head_argmax on simulated ranks (all-gather and all-reduce) and
    lm_head_topk; planted float data as well as exact integer data."""
    layouts = padded = 0
    for vocab in (1, 2, 5, 63, 64, 65, 127, 129, 1000, 1003):
        exact = vocab != 65
        if exact:
            hidden, weight, bias = integer_problem(gen, 5, vocab, 16, dtype, bias=vocab % 2 == 1)
        else:
            hidden, weight, bias, _ = planted_problem(gen, 5, vocab, 40, dtype, "float32")
        k = min(3, vocab)
        for tp in (1, 2, 3, 4):
            for pad_to in (1, 3, 64, 128):
                shards = make_shards(weight, bias, tp, pad_to, hidden=hidden, pad=pad)
                b_full = full_bias(bias, shards, vocab)
                want = ref_argmax(hidden, weight, b_full)
                ctx = f"{pad} V={vocab} tp={tp} pad_to={pad_to} layouts={[tuple(s) for *_, s in shards]}"
                layouts += 1
                padded += sum(s.rows - s.num_valid for *_, s in shards)
                assert torch.equal(localargmax.merge_keys(shard_keys(hidden, shards))[0], want), ctx
                if exact:
                    assert torch.equal(simulated_argmax(hidden, shards), want), ctx
                    assert torch.equal(simulated_argmax(hidden, shards, reduce="all_reduce"), want), ctx
                    assert torch.equal(
                        simulated_topk(hidden, shards, k)[0], ref_topk(ref_logits(hidden, weight, b_full), k)
                    ), ctx
                for w, b, s in [sh for sh in shards if sh[2].rows > sh[2].num_valid][:1]:  # read as vocabulary, it wins
                    cheat = ids_of(hidden, w, vocab_start=s.vocab_start, num_valid=s.rows, bias=b)
                    assert bool((cheat >= s.vocab_start + s.num_valid).any()), f"{ctx}: the fill would not win"
    print(f"{layouts} layouts, {padded} padding rows that would have won")
    assert padded > 1000


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_empty_shard_keys_are_zero(gen, dtype):
    hidden, weight, _ = random_problem(gen, 7, 64, 9, dtype)
    weight[:] = float("nan")
    for b in (None, torch.full((64,), float("inf"))):
        keys = localargmax.shard_argmax(hidden, weight, vocab_start=5000, num_valid=0, bias=b)
        assert keys.dtype == torch.int64 and keys.shape == (7,) and keys.eq(0).all()
    keys = localargmax.shard_argmax(hidden, weight[:0], vocab_start=0, num_valid=0)  # a [0, H] shard too
    assert keys.shape == (7,) and keys.eq(0).all()
    real = localargmax.shard_argmax(hidden, torch.randn(3, 9, generator=gen).to(dtype), vocab_start=0)
    ids, _ = localargmax.merge_keys(torch.stack([real, keys, keys]))  # zero keys merge without winning
    assert torch.equal(ids, localargmax.decode_keys(real)[0])


def test_vocab_not_divisible_by_tp_has_empty_last_shards(gen):
    """V=10, pad_to=64, tp=4: rank 0 holds everything, ranks 1-3 are all padding."""
    hidden, weight, b = random_problem(gen, 5, 10, 16, torch.float32, "float32")
    shards = make_shards(weight, b, 4, 64, hidden=hidden, pad="nan")
    assert [s.num_valid for _, _, s in shards] == [10, 0, 0, 0]
    keys = shard_keys(hidden, shards)
    assert keys[1:].eq(0).all()
    check_against_reference(localargmax.merge_keys(keys)[0], hidden, weight, b, min_clear_fraction=0.8)


# ----------------------------------------------------------------------------- signed zeros and denormals


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_zero_hidden_ties_at_first_valid_index(gen, dtype):
    """A zero hidden state (padded batch slot): products are -0.0 or +0.0,
    all logits compare equal, so the first valid index wins (torch.argmax)."""
    hidden = torch.zeros((4, 20), dtype=dtype)
    hidden[1] = -0.0
    hidden[2, ::2] = -0.0
    weight = torch.randn(300, 20, generator=gen).to(dtype)
    weight[0] = -weight[0].abs() - 0.5  # row 0: all products -0.0 for hidden +0
    bias = torch.zeros(300)
    bias[::3] = -0.0
    for tp in (1, 2, 3, 4):
        ids, values = sharded_argmax(hidden, weight, None, tp=tp, pad_to=64, pad="nan")
        assert ids.tolist() == [0] * 4 and values.view(torch.int32).eq(0).all(), f"tp={tp}: decoded zero is +0.0"
        assert sharded_argmax(hidden, weight, bias, tp=tp, pad_to=1)[0].tolist() == [0] * 4
    assert ref_argmax(hidden, weight).tolist() == [0] * 4


def test_negative_zero_logit_ties_positive_zero():
    """Only a -0.0 and a +0.0 entry: they tie, the smaller index wins, in either order and across shards."""
    hidden, neg, pos = torch.tensor([[1.0]]), torch.tensor([[-0.0]]), torch.tensor([[0.0]])
    k_neg = localargmax.shard_argmax(hidden, neg, vocab_start=3, bias=torch.tensor([-0.0]))
    k_pos = localargmax.shard_argmax(hidden, pos, vocab_start=5)
    assert torch.equal(k_neg >> 32, k_pos >> 32)
    for pair in ([k_neg, k_pos], [k_pos, k_neg]):
        assert localargmax.merge_keys(torch.stack(pair))[0].tolist() == [3]
    pair = [localargmax.shard_argmax(hidden, neg, vocab_start=7), localargmax.shard_argmax(hidden, pos, vocab_start=2)]
    assert localargmax.merge_keys(torch.stack(pair))[0].tolist() == [2]


def test_denormal_logits_pick_the_right_winner(gen):
    """Logits that are float32 denormals: flushing them to zero would make
    everything tie at index 0. Every value is exact, so the decoded value is
    checked bit-exact too."""
    hsize, vocab, h = 8, 200, 2.0**-70
    hidden = torch.full((2, hsize), h)
    hidden[1] = -h
    coeff = torch.randperm(vocab, generator=gen).float() + 1.0  # distinct 1..V
    weight = (coeff * 2.0**-70).view(-1, 1).expand(vocab, hsize).contiguous()
    exact = torch.tensor([coeff.max() * hsize * 2.0**-140, -coeff.min() * hsize * 2.0**-140], dtype=torch.float64)
    for tp in (1, 2, 3):
        ids, values = sharded_argmax(hidden, weight, None, tp=tp, pad_to=64, pad="nan")
        assert ids.tolist() == [int(coeff.argmax()), int(coeff.argmin())] == ref_argmax(hidden, weight).tolist()
        assert torch.equal(values.double(), exact) and 0 < abs(float(values[0])) < 1.1754943508222875e-38
    d = 2.0**-149  # H = 1: the smallest denormal weights themselves, both signs, beside -0.0 / +0.0
    w1 = torch.tensor([-d, -0.0, 0.0, d, 3 * d, 2 * d, -2 * d]).view(-1, 1)
    ids, values = localargmax.decode_keys(localargmax.shard_argmax(torch.tensor([[1.0], [-1.0]]), w1))
    assert ids.tolist() == [4, 6] and values.tolist() == [3 * d, 2 * d]


def test_float16_subnormal_weights(gen, path):
    """fp16 subnormal weights (the half -> float conversion's subnormal path):
    the exact winner and its exact value; H >= 8 so the AVX2 path converts
    with F16C and the tail in software."""
    vocab, hsize = 300, 11
    k = torch.randperm(1023, generator=gen)[:vocab] + 1  # distinct subnormal mantissas
    sub = (k.double() * 2.0**-24).to(torch.float16)
    assert bool((sub.float() < 2.0**-14).all()) and bool((sub.double() == k.double() * 2.0**-24).all())
    weight, hidden = torch.zeros((vocab, hsize), dtype=torch.float16), torch.zeros((2, hsize), dtype=torch.float16)
    col = int(torch.randint(0, hsize, (1,), generator=gen))
    weight[:, col], weight[:, (col + 3) % hsize] = sub, -sub
    hidden[0, col], hidden[1, (col + 3) % hsize] = 1.0, 2.0
    ids, values = localargmax.decode_keys(localargmax.shard_argmax(*on(path, hidden, weight)))
    assert ids.cpu().tolist() == ref_argmax(hidden, weight).tolist() == [int(k.argmax()), int(k.argmin())]
    assert values.cpu().double().tolist() == [float(k.max()) * 2.0**-24, -2.0 * float(k.min()) * 2.0**-24]


# ----------------------------------------------------------------------------- rule 5: identical rows, identical logits


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [5, 8, 37, 300])
def test_identical_rows_identical_logits(gen, dtype, hsize):
    hidden = torch.randn(7, hsize, generator=gen).to(dtype)
    weight = torch.randn(203, hsize, generator=gen).to(dtype)
    u = torch.randn(hsize, generator=gen).to(dtype)
    positions = [0, 1, 3, 4, 62, 63, 64, 65, 127, 128, 199, 200, 201, 202]
    weight[positions] = u
    ref = logit_at(hidden, weight, positions[0])
    for p in positions[1:]:
        assert same_float32(logit_at(hidden, weight, p), ref), f"row {p} differs from row {positions[0]}"
    for other_rows, pos, start in ((1, 0, 10**6), (5, 4, 77), (130, 129, 3), (64, 17, 0)):  # other shards
        w = torch.randn(other_rows, hsize, generator=gen).to(dtype)
        w[pos] = u
        assert same_float32(logit_at(hidden, w, pos, start), ref), f"shard of {other_rows} rows, row {pos}"
    for b in range(7):  # the same hidden row at any batch position gives the same logit
        assert same_float32(logit_at(hidden[b : b + 1].repeat(6, 1), weight, 64), ref[b].repeat(6)), f"batch row {b}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hsize", [29, 40])  # 40: rows read in place (fp32, bf16), blocked by batch size
def test_same_hidden_row_same_key_at_any_batch_position(gen, dtype, hsize):
    """The CPU kernel blocks rows and batch rows differently by batch size
    (8 / 4 rows at batch 1, 3 rows x 4 batch rows and tails of 1-3 above): a
    key must not depend on the blocking."""
    hidden_row = torch.randn(1, hsize, generator=gen).to(dtype)
    weight = torch.randn(517, hsize, generator=gen).to(dtype)
    alone = int(localargmax.shard_argmax(hidden_row, weight)[0])
    for batch in (1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13):
        hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
        where = int(torch.randint(0, batch, (1,), generator=gen))
        hidden[where] = hidden_row[0]
        assert int(localargmax.shard_argmax(hidden, weight)[where]) == alone, f"batch={batch} position={where}"
