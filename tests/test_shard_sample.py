"""shard_sample and lm_head_sample: tp-invariant Gumbel-max sampling, against
an independent Python Philox 4x32-10 (checked on Random123's known-answer
vectors) and a chi-square test of the sampled distribution against
softmax(logits / T); the temperature, seed and offset checks. (The shard
arguments are checked in test_shard_argmax_bad_input.py for every fused op.)"""

from __future__ import annotations

import math
import struct

import pytest
import torch

import localargmax
from localargmax.reference import reference_argmax
from tests.support.checks import raises_cleanly
from tests.support.paths import CPU_PATHS, on, path_keyword, use_path
from tests.support.problems import make_shards, random_problem, simulated_sample, stack_frames
from tests.support.reference import ref_logits, ref_transform

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF
H, ROWS, B = 8, 6, 3


def py_philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & MASK, p1 & MASK, ((p0 >> 32) ^ c3 ^ k1) & MASK, p0 & MASK
        k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
    return c0, c1, c2, c3


def py_gumbel(seed, row, index):
    x = py_philox4x32_10((index & MASK, index >> 32, row & MASK, row >> 32), (seed & MASK, seed >> 32))[0]
    g = -math.log(-math.log((x + 0.5) / 2.0**32))
    return struct.unpack("<f", struct.pack("<f", g))[0]  # rounded to float32, like the kernel


def test_python_philox_matches_random123_known_answers():
    assert py_philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert py_philox4x32_10((MASK,) * 4, (MASK, MASK)) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    want = (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)
    assert py_philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == want


def test_shard_sample_correctness(gen, path):
    """On every path: the noise is exactly the specified Philox Gumbel (zero
    hidden states make every logit 0, so a one-row shard's key value is the
    noise g(seed, offset + b, v)); samples agree with the default CPU kernel
    except within rounding of two perturbed scores; opcheck."""
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    offset = int(torch.randint(0, 2**40, (1,), generator=gen))
    hidden = on(path, torch.zeros(5, 8))
    for v in [0, 1, 63, 2**31 + 5, 0xFFFFFFFE] + torch.randint(0, 2**32 - 1, (5,), generator=gen).tolist():
        row, t = on(path, torch.randn(1, 8, generator=gen), torch.ones(5))
        keys = localargmax.shard_sample(hidden, row, t, seed, offset, vocab_start=v, num_valid=1)
        ids, values = localargmax.decode_keys(keys.cpu())
        assert ids.tolist() == [v] * 5 and values.tolist() == [py_gumbel(seed, offset + b, v) for b in range(5)]
    hidden, weight, _ = random_problem(gen, 70, 3000, 64, torch.bfloat16)
    t = torch.rand(70, generator=gen) + 0.1
    t[::5] = 0  # greedy rows
    with use_path(CPU_PATHS[0]):
        cpu = localargmax.lm_head_sample(hidden, weight, temperature=t, seed=9, offset=4)
    got = localargmax.lm_head_sample(*on(path, hidden, weight), temperature=on(path, t), seed=9, offset=4)
    assert (got.cpu() == cpu).float().mean() >= 0.95, "more than rounding-level disagreement"
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        hidden, weight = on(
            path, torch.randn(3, 20, generator=gen).to(dtype), torch.randn(150, 20, generator=gen).to(dtype)
        )
        bias, t = on(path, torch.randn(150, generator=gen), torch.tensor([0.0, 1.0, 2.0]))
        kw = {"path": path_keyword(path, "shard_sample", 20, dtype)}
        torch.library.opcheck(torch.ops.localargmax.shard_sample.default, (hidden, weight, bias, 3, 100, t, 42, 9), kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampling_is_tp_invariant(gen, dtype):
    vocab = int(torch.randint(100, 3000, (1,), generator=gen))
    hidden = torch.randn(16, 24, generator=gen).to(dtype)
    weight = torch.randn(vocab, 24, generator=gen).to(dtype)
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    temperature = torch.rand(16, generator=gen) * 2
    temperature[3] = 0.0
    d2t = localargmax.build_d2t(torch.rand(5000, generator=gen), vocab)

    def sample(tp, pad_to, seed=seed):
        return simulated_sample(
            hidden, make_shards(weight, None, tp, pad_to, hidden=hidden), temperature, seed, 7, d2t=d2t
        )

    base = sample(1, 1)
    for tp in (1, 2, 3, 4):
        for pad_to in (1, 7, 64):
            assert torch.equal(sample(tp, pad_to), base), (tp, pad_to)
    all_reduce = localargmax.lm_head_sample(
        hidden, weight, temperature=temperature, seed=seed, offset=7, d2t=d2t, reduce="all_reduce"
    )
    assert torch.equal(all_reduce, base)
    assert int(base[3]) == int(localargmax.lm_head_argmax(hidden[3:4], weight, d2t=d2t)[0])  # T = 0 is greedy
    assert not torch.equal(sample(2, 64, seed + 1), base)  # the noise changes with the seed


def test_temperature_to_zero_is_greedy(gen):
    hidden, weight = torch.randn(32, 16, generator=gen), torch.randn(500, 16, generator=gen)
    greedy = localargmax.lm_head_argmax(hidden, weight)
    assert torch.equal(localargmax.lm_head_sample(hidden, weight, temperature=0.0, seed=1), greedy)
    # where the float64 top-2 gap exceeds 1e-3, T = 1e-6 makes the noise (|g| < 25) irrelevant
    top2 = (hidden.double() @ weight.double().T).topk(2, dim=1).values
    keep = (top2[:, 0] - top2[:, 1]) > 1e-3
    sampled = localargmax.lm_head_sample(hidden, weight, temperature=1e-6, seed=5)
    assert keep.sum() > 20 and torch.equal(sampled[keep], greedy[keep])


CHI2_CRITICAL_P001_DF7 = 24.322  # chi-square 0.999 quantile, 7 degrees of freedom


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sampled_distribution_matches_softmax(temperature):
    """8-entry vocabulary, 40,000 draws (rows = independent Philox subsequences,
    over 4 seeds); Pearson chi-square against softmax(logits / T). Fixed seeds:
    the generator is deterministic, so the statistic is too (reported)."""
    weight = torch.zeros(8, 4)
    weight[:, 0] = torch.tensor([0.0, 0.5, 1.0, 1.5, -1.0, 2.0, 0.25, 1.0])
    weight[7, 1] = 0.5
    hidden = torch.tensor([[1.0, 1.0, 0, 0]]).expand(10_000, 4).contiguous()
    probs = torch.softmax((hidden[0].double() @ weight.double().T) / temperature, dim=0)
    shards = make_shards(weight, None, 2, 1, hidden=hidden)
    counts = torch.zeros(8, dtype=torch.float64)
    for seed in (11, 12, 13, 14):
        counts += torch.bincount(simulated_sample(hidden, shards, temperature, seed), minlength=8).double()
    expected = probs * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    print(
        f"T={temperature}: chi2={chi2:.2f} (df=7, critical 0.001 = {CHI2_CRITICAL_P001_DF7}); counts={counts.tolist()}"
    )
    assert chi2 < CHI2_CRITICAL_P001_DF7


# ----------------------------------------------------------------------------- bad input

BAD_TEMPERATURE_TENSOR = {  # shard_sample's temperature [B] float32 tensor
    "list": ([1.0] * B, TypeError, "temperature"),
    "2d": (torch.ones(B, 1), ValueError, "temperature must be 1-D"),
    "wrong_length": (torch.ones(B + 1), ValueError, r"temperature must be 1-D \[batch=3\]"),
    "float64": (torch.ones(B, dtype=torch.float64), TypeError, "temperature must be float32"),
    "int32": (torch.ones(B, dtype=torch.int32), TypeError, "temperature must be float32"),
    "negative": (torch.full((B,), -1.0), ValueError, "temperature"),  # T < 0 samples from softmax(-logits / |T|)
    "nan": (torch.tensor([1.0, float("nan"), 1.0]), ValueError, "temperature"),
}


@pytest.mark.parametrize("case", list(BAD_TEMPERATURE_TENSOR))
def test_shard_sample_rejects_bad_temperature(case):
    temp, exc, match = BAD_TEMPERATURE_TENSOR[case]
    raises_cleanly(exc, match, localargmax.shard_sample, torch.randn(B, H), torch.randn(ROWS, H), temp, 7)


BAD_TEMPERATURE = [
    -1.0,
    float("nan"),
    "1",
    None,
    True,
    [1.0],
    torch.full((B,), -1.0),
    torch.tensor([1.0, math.nan, 1.0]),
    torch.tensor(-0.5),
    torch.ones(B + 1),
    torch.ones(B, 2),
    torch.tensor([1.0, math.inf, 1.0], dtype=torch.float64),
    torch.tensor([1.0, -1.0, 1.0], dtype=torch.float16),
]
FILTERS = {"none": {}, "top_k": {"top_k": 2}, "top_p": {"top_p": 0.9}, "min_p": {"min_p": 0.1}}


@pytest.mark.parametrize("filters", list(FILTERS))
@pytest.mark.parametrize("temp", BAD_TEMPERATURE, ids=[f"t{i}" for i in range(len(BAD_TEMPERATURE))])
def test_lm_head_sample_rejects_bad_temperature(temp, filters):
    """Unfiltered and filtered alike (the filtered step runs no shard_sample:
    a NaN / negative / inf row, a wrong shape or device was once sampled or
    failed in a broadcast)."""
    h, w = torch.randn(B, H), torch.randn(ROWS, H)
    raises_cleanly(
        ValueError, "temperature", localargmax.lm_head_sample, h, w, temperature=temp, seed=1, **FILTERS[filters]
    )


@pytest.mark.parametrize("filters", list(FILTERS))
def test_lm_head_sample_rejects_temperature_on_another_device(filters):
    h, w = torch.randn(B, H), torch.randn(ROWS, H)
    with pytest.raises(ValueError, match="temperature is on meta but hidden is on cpu"):
        localargmax.lm_head_sample(h, w, temperature=torch.ones(B, device="meta"), seed=1, **FILTERS[filters])


def _sample(entry, **kwargs):
    """Call shard_sample or lm_head_sample with a valid problem and ``kwargs``."""
    h, w = torch.randn(B, H), torch.randn(ROWS, H)
    if entry == "shard_sample":
        return localargmax.shard_sample(h, w, torch.ones(B), **{"seed": 7, **kwargs})
    return localargmax.lm_head_sample(h, w, **{"temperature": 1.0, "seed": 7, **kwargs})


@pytest.mark.parametrize("name", ["seed", "offset"])
@pytest.mark.parametrize("value", [-1, 2**63, 1.5, True, "0", None])
@pytest.mark.parametrize("entry", ["shard_sample", "lm_head_sample"])
def test_sample_rejects_bad_seed_and_offset(entry, name, value):
    with pytest.raises(ValueError, match=f"{name} must be" if entry == "shard_sample" else name):
        _sample(entry, **{name: value})


BAD_STEP_ARGS = {
    "reduce": ({"reduce": "max"}, ValueError, "reduce must be one of"),
    "group": ({"group": 3}, TypeError, "group must be"),
    "d2t_int32": ({"d2t": torch.zeros(ROWS, dtype=torch.int32)}, TypeError, "d2t"),
    "d2t_float": ({"d2t": torch.zeros(ROWS)}, TypeError, "d2t"),
}


@pytest.mark.parametrize("case", list(BAD_STEP_ARGS))
def test_lm_head_sample_rejects_bad_reduce_group_d2t(case):
    kwargs, exc, match = BAD_STEP_ARGS[case]
    raises_cleanly(exc, match, _sample, "lm_head_sample", **kwargs)


BAD_OP = {  # raw op calls: (vocab_start, temperature) -> message
    "temp_shape": ((0, torch.ones(B + 1)), "temperature"),
    "temp_dtype": ((0, torch.ones(B, dtype=torch.float64)), "temperature"),
    "index": ((localargmax.MAX_GLOBAL_INDEX, torch.ones(B)), "vocab_start|index"),
}


@pytest.mark.parametrize("case", list(BAD_OP))
def test_shard_sample_op_rejects(case):
    """Direct torch.ops calls: the C++ checks raise, never crash."""
    (start, temp), word = BAD_OP[case]
    with pytest.raises((ValueError, TypeError, RuntimeError), match=word):
        torch.ops.localargmax.shard_sample.default(
            torch.randn(B, H), torch.randn(ROWS, H), None, start, ROWS, temp, 1, 0
        )


# ------------------------------------------ temperature edges (tiny, infinite, negative, NaN; eager and compiled)

TINY_TEMPERATURES = (1e-30, 1e-37, 1e-38, 1e-40, 1e-45)


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
def test_tiny_temperature_gives_the_greedy_id(temperature):
    """Logits [10, 20] and [-20, -10] (and their mirrors)
    at a temperature so small that logit / T overflows float32."""
    hidden = torch.tensor([[1.0]])
    cases = [([10.0, 20.0], 1), ([-20.0, -10.0], 1), ([-5.0, 3.0], 1)]  # logits, the greedy id
    for logits, want in cases + [(logits[::-1], 1 - want) for logits, want in cases]:  # and their mirrors
        weight = torch.tensor(logits).view(2, 1)
        for seed in range(4):
            ids = localargmax.lm_head_sample(hidden, weight, temperature=temperature, seed=seed)
            assert ids.tolist() == [want], (logits, temperature, seed)


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES + (1e-3,))
def test_tiny_temperature_random_logits_every_layout(gen, temperature):
    """Random rows whose logits are all positive, all negative or mixed (a
    per-row shift of +50 / -50 / 0 through an extra hidden column), with a
    clear top-1: every tiny T samples the float64 greedy id, as a float or a
    tensor temperature, on one rank and on simulated tp = 3 with an uneven
    last shard (the same score formula on every rank)."""
    batch, vocab, hsize = 24, 301, 16
    hidden = torch.cat(
        [torch.randn(batch, hsize, generator=gen), torch.tensor([50.0, -50.0, 0.0]).repeat(8)[:, None]], 1
    )
    weight = torch.cat([torch.randn(vocab, hsize, generator=gen), torch.ones(vocab, 1)], 1)
    top2 = (hidden.double() @ weight.double().T).topk(2, dim=1).values
    keep = (top2[:, 0] - top2[:, 1]) > 0.05  # far above T * |g| <= 1e-3 * 23
    greedy = reference_argmax(hidden, weight)
    ids = localargmax.lm_head_sample(hidden, weight, temperature=temperature, seed=3)
    assert torch.equal(
        ids, localargmax.lm_head_sample(hidden, weight, temperature=torch.full((batch,), temperature), seed=3)
    )
    assert keep.sum() > 15 and torch.equal(ids[keep], greedy[keep])
    rows = 128
    shards = []
    for r in range(3):
        w = torch.zeros(rows, hsize + 1)
        valid = max(0, min(rows, vocab - r * rows))
        w[:valid] = weight[r * rows : r * rows + valid]
        shards.append((w, r * rows, valid))
    t = torch.full((batch,), temperature)
    frames = stack_frames(
        [localargmax.shard_sample(hidden, w, t, 3, 0, vocab_start=s, num_valid=n) for w, s, n in shards],
        [(s, n) for _, s, n in shards],
    )
    for w, s, n in shards:
        got = localargmax.lm_head_sample(
            hidden, w, temperature=temperature, seed=3, vocab_start=s, num_valid=n, group=lambda x: frames
        )
        assert torch.equal(got, ids)


@pytest.mark.parametrize("temperature", [1e-45, 1e-3, 0.999, 1.0, 1e3, 1e30, 3e38])
def test_banned_token_never_sampled(temperature):
    """-inf logits (banned tokens) are never drawn at any accepted temperature,
    including huge finite ones where T * g or s / T could overflow."""
    vocab = 16
    weight = torch.ones(vocab, 1)
    bias = torch.zeros(vocab)
    banned = torch.tensor([0, 3, 7, 15])
    bias[banned] = -math.inf
    hidden = torch.ones(64, 1)
    for seed in range(8):
        ids = localargmax.lm_head_sample(
            hidden, weight, bias=bias, temperature=temperature, seed=seed, offset=64 * seed
        )
        assert not torch.isin(ids, banned).any(), (temperature, seed, ids.tolist())
        assert ((ids >= 0) & (ids < vocab)).all()


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, -1.0, -1e-45])
def test_non_finite_or_negative_temperature_refused(bad):
    """T = +inf would turn a banned -inf logit into NaN (and NaN wins): refused,
    as a Python number, a float32 tensor (read by the CPU kernel), a 0-d
    tensor, a float64 tensor, and through shard_sample directly."""
    hidden, weight = torch.tensor([[1.0]]), torch.tensor([[1.0], [2.0]])
    bias = torch.tensor([-math.inf, 0.0])
    for t in (bad, torch.tensor([bad]), torch.tensor(bad), torch.tensor([bad], dtype=torch.float64)):
        with pytest.raises(ValueError, match="temperature must be"):
            localargmax.lm_head_sample(hidden, weight, bias=bias, temperature=t, seed=0)
    with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
        localargmax.shard_sample(hidden, weight, torch.tensor([bad], dtype=torch.float32), 0, bias=bias)
    with pytest.raises(ValueError, match="temperature must be finite and >= 0"):
        torch.ops.localargmax.shard_sample.default(hidden, weight, bias, 0, 2, torch.tensor([bad]), 0, 0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_compiled_sample_refuses_like_eager(bad):
    """torch.compile(fullgraph=True) must not give a bad temperature another
    meaning: the CPU kernel reads the values, so compiled raises too."""
    torch._dynamo.reset()
    hidden, weight = torch.tensor([[1.0]]), torch.tensor([[10.0], [20.0]])
    step = torch.compile(lambda h, w, t: localargmax.lm_head_sample(h, w, temperature=t, seed=0), fullgraph=True)
    assert step(hidden, weight, torch.tensor([1e-38])).tolist() == [1]  # and the tiny-T answer compiled
    with pytest.raises((ValueError, RuntimeError), match="temperature must be finite and >= 0"):
        step(hidden, weight, torch.tensor([bad]))


def test_shard_sample_log_partition(gen):
    """shard_sample(log_partition=True): without a transform the same keys
    as shard_sample; ref is the transformed logit of the sampled entry (bit
    for bit: the one-row shard's value), ``-log(sum)`` its float64
    log-probability under softmax(x / T) over the valid rows; T == 0 rows
    carry shard_argmax's pair; opcheck."""
    hidden, weight, bias = random_problem(gen, 6, 500, 32, bias="float32")
    hidden = hidden * 3
    t = torch.tensor([0.0, 0.3, 1.0, 2.5, 1e-4, 40.0])
    for scale, cap in ((1.0, None), (0.7, 2.0)):
        kw = dict(bias=bias, num_valid=480, log_partition=True, scale=scale, soft_cap=cap)
        keys, pairs = localargmax.shard_sample(hidden, weight, t, 9, 4, **kw)
        if cap is None:
            assert torch.equal(keys, localargmax.shard_sample(hidden, weight, t, 9, 4, bias=bias, num_valid=480))
        ids = localargmax.decode_keys(keys)[0]
        x = ref_transform(ref_logits(hidden, weight[:480], bias[:480]), scale, cap)
        tt = torch.where(t > 0, t, 1.0).double()[:, None]
        want = (x / tt - torch.logsumexp(x / tt, dim=1, keepdim=True)).gather(1, ids[:, None])[:, 0]
        # float32 logits are off by ~1e-6 of float64's; the log-prob divides that by T
        tol = 1e-5 * torch.clamp(1.0 / tt[:, 0], min=1.0)
        err = (-pairs[:, 1].double().log1p() - want).abs()  # (ref, others): ref is the sampled x
        assert bool((err <= tol).all()), (err, tol)
        greedy = localargmax.shard_argmax(
            hidden[:1], weight, bias=bias, num_valid=480, log_partition=True, scale=scale, soft_cap=cap
        )
        assert torch.equal(pairs[:1], greedy[1])
        for b, i in enumerate(ids.tolist()):
            lse = dict(log_partition=True, scale=scale, soft_cap=cap)
            one = localargmax.shard_argmax(hidden[b : b + 1], weight[i : i + 1], bias=bias[i : i + 1], **lse)
            assert torch.equal(pairs[b, 0], one[1][0, 0]), b
    op = torch.ops.localargmax.shard_sample_lse.default
    torch.library.opcheck(op, (hidden, weight, bias, 0, 480, t, 9, 4))
    torch.library.opcheck(op, (hidden, weight, None, 3, 300, t, 1, 0, 2.0, 30.0), {"path": "generic"})


def test_shard_sample_takes_a_soft_cap_without_log_partition(gen):
    """A scale or soft-cap changes the sampled ids, so shard_sample takes it
    without ``log_partition`` (one rule with lm_head_sample): the keys equal
    the log-partition call's, and the sampled ids are float64's Gumbel-max of
    the transformed logits with the specified noise (rows whose top two
    scores lie within float32 rounding are not judged)."""
    hidden, weight = torch.randn(6, H, generator=gen), torch.randn(40, H, generator=gen) * 4
    t = torch.tensor([0.5, 1.0, 1.0, 2.0, 1.0, 0.7])
    seed, offset, scale, cap = 11, 3, 0.8, 2.0
    keys = localargmax.shard_sample(hidden, weight, t, seed, offset, vocab_start=7, scale=scale, soft_cap=cap)
    with_pairs, _ = localargmax.shard_sample(
        hidden, weight, t, seed, offset, vocab_start=7, scale=scale, soft_cap=cap, log_partition=True
    )
    assert torch.equal(keys, with_pairs)
    plain = localargmax.shard_sample(hidden, weight, t, seed, offset, vocab_start=7)
    x = cap * torch.tanh(hidden.double() @ weight.double().T / cap) * scale
    noise = torch.tensor(
        [[py_gumbel(seed, offset + b, 7 + v) for v in range(40)] for b in range(6)], dtype=torch.float64
    )
    scores = x / t.double()[:, None] + noise
    top2 = scores.topk(2, dim=1).values
    ids, _ = localargmax.decode_keys(keys)
    judged = (top2[:, 0] - top2[:, 1]) > 1e-4
    assert judged.sum() >= 3
    assert torch.equal(ids[judged], scores.argmax(1)[judged] + 7)
    assert not torch.equal(keys, plain)  # the transform reached the scores
