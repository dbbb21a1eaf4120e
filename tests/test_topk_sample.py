"""Local top-k and tp-invariant Gumbel-max sampling (shard_topk, shard_sample,
lm_head_topk, lm_head_sample) against independent references: exact float64
top-k ordering (ties to the smallest index, NaN first), an independent Python
Philox 4x32-10 checked on Random123's known-answer vectors, and a chi-square
test of the sampled distribution against softmax(logits / T)."""
import math
import struct

import pytest
import torch

import localargmax
from helpers import run_ranks, stack_frames

# ------------------------------------------------------------------ references

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


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
    u = (x + 0.5) / 2.0**32
    g = -math.log(-math.log(u))
    return struct.unpack("<f", struct.pack("<f", g))[0]  # rounded to float32, like the kernel


def ref_topk(logits64: torch.Tensor, k: int):
    """Per row: the k best indices by (NaN first, larger value, smaller index)."""
    out = []
    for row in logits64.tolist():
        order = sorted(range(len(row)), key=lambda v: (0, 0, v) if math.isnan(row[v]) else (1, -row[v], v))
        out.append(order[:k])
    return torch.tensor(out, dtype=torch.int64).view(len(out), k)


def integer_problem(gen, batch, vocab, hsize, dtype=torch.float32):
    """Small-integer hidden/weight: float32 and float64 logits are both exact,
    so ties are exact and every comparison with the reference is exact."""
    weight = torch.randint(-3, 4, (vocab, hsize), generator=gen).to(dtype)
    hidden = torch.randint(-3, 4, (batch, hsize), generator=gen).to(dtype)
    # plant exact ties: copies of random rows elsewhere in the vocabulary (also across shards)
    src = torch.randint(0, vocab, (vocab // 5,), generator=gen)
    dst = torch.randint(0, vocab, (vocab // 5,), generator=gen)
    weight[dst] = weight[src]
    return hidden, weight


def shards_of(weight, tp, pad_to, bias=None, pad_fill=1e4):
    """Standard-layout shards; padding rows filled to win if they were read."""
    vocab, hsize = weight.shape
    out = []
    for r in range(tp):
        start, rows, valid = localargmax.shard_vocab(vocab, r, tp, pad_to)
        w = torch.full((rows, hsize), pad_fill, dtype=weight.dtype)
        w[:valid] = weight[start:start + valid]
        b = None
        if bias is not None:
            b = torch.full((rows,), pad_fill, dtype=bias.dtype)
            b[:valid] = bias[start:start + valid]
        out.append((w, b, start, valid))
    return out


def simulated_topk(hidden, weight, k, tp, pad_to, bias=None, d2t=None):
    """lm_head_topk on every simulated rank, the key exchange done by a callable."""
    shards = shards_of(weight, tp, pad_to, bias)
    keys = stack_frames([localargmax.shard_topk(hidden, w, k, vocab_start=s, num_valid=n, bias=b) for w, b, s, n in shards],
                        [(s, n) for _, _, s, n in shards])
    results = [localargmax.lm_head_topk(hidden, w, k, vocab_start=s, num_valid=n, bias=b, d2t=d2t, group=lambda x: keys)
               for w, b, s, n in shards]
    for ids, values in results[1:]:
        assert torch.equal(ids, results[0][0])
    return results[0]


def simulated_sample(hidden, weight, tp, pad_to, temperature, seed, offset=0, d2t=None, reduce="all_gather"):
    shards = shards_of(weight, tp, pad_to)
    t = temperature if isinstance(temperature, torch.Tensor) else torch.full((hidden.shape[0],), float(temperature))
    keys = stack_frames([localargmax.shard_sample(hidden, w, t, seed, offset, vocab_start=s, num_valid=n)
                         for w, b, s, n in shards], [(s, n) for _, _, s, n in shards])
    ids = [localargmax.lm_head_sample(hidden, w, temperature=temperature, seed=seed, offset=offset, vocab_start=s,
                                      num_valid=n, d2t=d2t, group=lambda x: keys) for w, b, s, n in shards]
    for i in ids[1:]:
        assert torch.equal(i, ids[0])
    return ids[0]


# ----------------------------------------------------------------------- Philox


def test_python_philox_matches_random123_known_answers():
    assert py_philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert py_philox4x32_10((MASK,) * 4, (MASK, MASK)) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    assert py_philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == (
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)


def test_kernel_noise_is_the_specified_philox_gumbel(gen):
    """With zero hidden states every logit is 0, so a one-row shard's key value
    is exactly the noise g(seed, offset + b, v)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    offset = int(torch.randint(0, 2**40, (1,), generator=gen))
    batch = 5
    hidden = torch.zeros(batch, 8)
    for v in [0, 1, 63, 2**31 + 5, 0xFFFFFFFE] + torch.randint(0, 2**32 - 1, (5,), generator=gen).tolist():
        keys = localargmax.shard_sample(hidden, torch.randn(1, 8, generator=gen), torch.ones(batch), seed, offset,
                                        vocab_start=v, num_valid=1)
        ids, values = localargmax.decode_keys(keys)
        assert ids.tolist() == [v] * batch
        assert values.tolist() == [py_gumbel(seed, offset + b, v) for b in range(batch)]


# ------------------------------------------------------------------------ top-k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_topk_matches_exact_reference_with_ties_padding_and_empty_shards(gen, dtype, tp):
    vocab = int(torch.randint(70, 400, (1,), generator=gen))
    hidden, weight = integer_problem(gen, 6, vocab, 13, dtype)
    k = int(torch.randint(1, 65, (1,), generator=gen))
    for pad_to in (1, 64, 256):  # 256: later ranks hold only padding for small vocabularies
        ids, values = simulated_topk(hidden, weight, k, tp, pad_to)
        logits = hidden.double() @ weight.double().T
        want = ref_topk(logits, k)
        assert torch.equal(ids, want), (pad_to, k)
        assert torch.equal(values.double(), logits.gather(1, want))


def test_topk_nan_bias_and_d2t(gen):
    hidden, weight = integer_problem(gen, 4, 300, 9)
    bias = torch.randint(-2, 3, (300,), generator=gen).float()
    bias[[17, 250]] = float("nan")  # NaN logits on two ranks: both first, smaller index first
    d2t = localargmax.build_d2t(torch.rand(1000, generator=gen), 300)
    ids, values = simulated_topk(hidden, weight, 8, 3, 64, bias=bias, d2t=d2t)
    logits = hidden.double() @ weight.double().T + bias.double()
    want = ref_topk(logits, 8)
    assert torch.equal(ids, want + d2t[want])
    assert ids[:, 0].tolist() == [17 + int(d2t[17])] * 4 and ids[:, 1].tolist() == [250 + int(d2t[250])] * 4
    assert values[:, :2].isnan().all()


def test_topk_k_errors(gen):
    hidden, weight = integer_problem(gen, 2, 10, 4)
    for k in (0, 65, -1):
        with pytest.raises(ValueError, match=r"k must be an int in \[1, 64\]"):
            localargmax.shard_topk(hidden, weight, k)
    with pytest.raises(ValueError, match="exceeds the valid vocabulary"):
        localargmax.lm_head_topk(hidden, weight, 11)
    with pytest.raises(ValueError, match="exceeds the valid vocabulary"):  # across ranks: 10 valid in total
        simulated_topk(hidden, weight, 12, 2, 1)
    with pytest.raises(ValueError, match="all_reduce"):
        localargmax.exchange_keys(localargmax.shard_topk(hidden, weight, 3), None, "all_reduce")


# --------------------------------------------------------------------- sampling


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampling_is_tp_invariant(gen, dtype):
    vocab = int(torch.randint(100, 3000, (1,), generator=gen))
    hidden = torch.randn(16, 24, generator=gen).to(dtype)
    weight = torch.randn(vocab, 24, generator=gen).to(dtype)
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    temperature = torch.rand(16, generator=gen) * 2
    temperature[3] = 0.0
    d2t = localargmax.build_d2t(torch.rand(5000, generator=gen), vocab)
    base = simulated_sample(hidden, weight, 1, 1, temperature, seed, 7, d2t=d2t)
    for tp in (1, 2, 3, 4):
        for pad_to in (1, 7, 64):
            assert torch.equal(simulated_sample(hidden, weight, tp, pad_to, temperature, seed, 7, d2t=d2t), base)
    # all-reduce MAX gives the same sample
    assert torch.equal(localargmax.lm_head_sample(hidden, weight, temperature=temperature, seed=seed, offset=7,
                                                  d2t=d2t, reduce="all_reduce"), base)
    # greedy row and the noise changes with the seed
    assert int(base[3]) == int(localargmax.lm_head_argmax(hidden[3:4], weight, d2t=d2t)[0])
    other = simulated_sample(hidden, weight, 2, 64, temperature, seed + 1, 7, d2t=d2t)
    assert not torch.equal(other, base)


def test_temperature_to_zero_is_greedy(gen):
    hidden = torch.randn(32, 16, generator=gen)
    weight = torch.randn(500, 16, generator=gen)
    greedy = localargmax.lm_head_argmax(hidden, weight)
    assert torch.equal(localargmax.lm_head_sample(hidden, weight, temperature=0.0, seed=1), greedy)
    # the float64 top-2 gaps here exceed 1e-3, so T = 1e-6 makes the noise (|g| < 25) irrelevant
    logits = hidden.double() @ weight.double().T
    top2 = logits.topk(2, dim=1).values
    keep = (top2[:, 0] - top2[:, 1]) > 1e-3
    sampled = localargmax.lm_head_sample(hidden, weight, temperature=1e-6, seed=5)
    assert keep.sum() > 20 and torch.equal(sampled[keep], greedy[keep])


CHI2_CRITICAL_P001_DF7 = 24.322  # chi-square 0.999 quantile, 7 degrees of freedom


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sampled_distribution_matches_softmax(temperature):
    """8-entry vocabulary, 40,000 draws (rows = independent Philox subsequences,
    over 4 seeds); Pearson chi-square against softmax(logits / T). Fixed seeds:
    the generator is deterministic, so the statistic is too (reported)."""
    hsize, vocab, rows = 4, 8, 10_000
    weight = torch.tensor([[0.0, 0, 0, 0], [0.5, 0, 0, 0], [1.0, 0, 0, 0], [1.5, 0, 0, 0],
                           [-1.0, 0, 0, 0], [2.0, 0, 0, 0], [0.25, 0, 0, 0], [1.0, 0.5, 0, 0]])
    hidden = torch.tensor([[1.0, 1.0, 0, 0]]).expand(rows, hsize).contiguous()
    logits = (hidden[0].double() @ weight.double().T)
    probs = torch.softmax(logits / temperature, dim=0)
    counts = torch.zeros(vocab, dtype=torch.float64)
    for seed in (11, 12, 13, 14):
        ids = simulated_sample(hidden, weight, 2, 1, temperature, seed, offset=0)
        counts += torch.bincount(ids, minlength=vocab).double()
    expected = probs * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    print(f"T={temperature}: chi2={chi2:.2f} (df=7, critical 0.001 = {CHI2_CRITICAL_P001_DF7}); counts={counts.tolist()}")
    assert chi2 < CHI2_CRITICAL_P001_DF7


def test_sample_bad_input(gen):
    hidden = torch.randn(3, 4, generator=gen)
    weight = torch.randn(10, 4, generator=gen)
    with pytest.raises(ValueError, match="temperature must be"):
        localargmax.lm_head_sample(hidden, weight, temperature=-1.0, seed=0)
    with pytest.raises(ValueError, match="temperature must be"):
        localargmax.lm_head_sample(hidden, weight, temperature=torch.tensor([1.0, -1.0, 1.0]), seed=0)
    with pytest.raises(ValueError, match=r"temperature must be 1-D \[batch=3\]"):
        localargmax.shard_sample(hidden, weight, torch.ones(4), 0)
    with pytest.raises(TypeError, match="temperature must be float32"):
        localargmax.shard_sample(hidden, weight, torch.ones(3, dtype=torch.float64), 0)
    with pytest.raises(ValueError, match="seed must be"):
        localargmax.shard_sample(hidden, weight, torch.ones(3), -1)
    with pytest.raises(ValueError, match="offset must be"):
        localargmax.shard_sample(hidden, weight, torch.ones(3), 0, -5)
    with pytest.raises(ValueError, match="temperature"):  # the C++ check, through the raw op
        torch.ops.localargmax.shard_sample(hidden, weight, None, 0, 10, torch.ones(2), 0, 0)
    with pytest.raises(ValueError, match="k must be in"):
        torch.ops.localargmax.shard_topk(hidden, weight, None, 0, 10, 65)


def test_opcheck_topk_and_sample(gen):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        hidden = torch.randn(3, 20, generator=gen).to(dtype)
        weight = torch.randn(150, 20, generator=gen).to(dtype)
        bias = torch.randn(150, generator=gen)
        torch.library.opcheck(torch.ops.localargmax.shard_topk.default, (hidden, weight, None, 10, 140, 5))
        torch.library.opcheck(torch.ops.localargmax.shard_topk.default, (hidden, weight, bias, 0, 150, 64))
        torch.library.opcheck(torch.ops.localargmax.shard_sample.default,
                              (hidden, weight, bias, 3, 100, torch.tensor([0.0, 1.0, 2.0]), 42, 9))


# ------------------------------------------------------------ real gloo ranks


def _topk_sample_worker(rank, world_size, seed):
    import torch.distributed as dist

    gen = torch.Generator().manual_seed(seed)
    hidden, weight = integer_problem(gen, 5, 333, 11)
    start, rows, valid = localargmax.shard_vocab(333, rank, world_size, 64)
    shard = torch.full((rows, 11), 1e4)
    shard[:valid] = weight[start:start + valid]
    g = dist.group.WORLD
    ids, values = localargmax.lm_head_topk(hidden, shard, 16, vocab_start=start, num_valid=valid, group=g)
    t = torch.rand(5, generator=gen) + 0.5
    sampled = localargmax.lm_head_sample(hidden.float(), shard, temperature=t, seed=seed, offset=3,
                                         vocab_start=start, num_valid=valid, group=g)
    single = localargmax.lm_head_sample(hidden.float(), weight, temperature=t, seed=seed, offset=3)
    want = ref_topk(hidden.double() @ weight.double().T, 16)
    return ids.tolist(), want.tolist(), sampled.tolist(), single.tolist()


def test_topk_and_sample_on_gloo_ranks(seed):
    for ids, want, sampled, single in run_ranks(_topk_sample_worker, 3, seed):
        assert ids == want
        assert sampled == single
