"""noise=vllm_noise(...) (DESIGN.md, "vLLM's noise"): the sampling ops with
vLLM 0.34's Gumbel noise against vLLM's own Triton code, interpreted on the
CPU (``TRITON_INTERPRET=1``, in a subprocess as tests/support/vllm_common.py
sets it up): its ``murmur3_hash32`` / ``murmur3_uniform32`` /
``_log1p_neg_stable`` helpers on ids past 2**16 and 2**24, positions past
2**31, seeds past 2**32; its ``gumbel_sample`` on full logits against
``lm_head_sample`` (tp 1) and ``shard_sample`` + ``merge_keys`` (tp 2 and 3,
uneven, with padding rows that would win), temperatures in (0, 2], drafting
and the speculative step, planted exact score ties. The hash, the uniform and
the series are compared bit for bit; the noise to within the ulps two float32
``log`` implementations differ by (numpy's in the interpreter, glibc's here),
and the sampled ids exactly wherever both noises agree at the competing ids.
A pure-Python murmur3 written here checks the C++ op and the torch fallback
bit for bit (float32 via numpy, the logs via glibc's logf / log). The CUDA
kernels: their source under the host emulation, against the CPU kernel."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import localargmax
from localargmax import merge_keys, shard_sample, vllm_gumbel_noise, vllm_noise
from localargmax.sampling import noise as vg
from tests.support.paths import cpu_path_unavailable, cuda_only
from tests.support.vllm_common import NO_TRITON_REASON, RANK_ENV, vllm_cpu_build

M32 = 0xFFFFFFFF
F32 = np.float32

# -- the independent reference: MurmurHash3 in Python ints, float32 by numpy ---------------------------

_libm = ctypes.CDLL("libm.so.6")
_libm.logf.restype, _libm.logf.argtypes = ctypes.c_float, [ctypes.c_float]
_libm.log.restype, _libm.log.argtypes = ctypes.c_double, [ctypes.c_double]


def _rotl(x, s):
    return ((x << s) | (x >> (32 - s))) & M32


def _mix(h, k):
    k = (k * 0xCC9E2D51) & M32
    k = (_rotl(k, 15) * 0x1B873593) & M32
    return (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & M32


def ref_hash(seed, pos, token, domain=0):
    seed, pos = seed & (2**64 - 1), pos & (2**64 - 1)
    h = domain
    for word in (seed & M32, seed >> 32, pos & M32, token & M32):
        h = _mix(h, word)
    h ^= 16
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def ref_uniform32(r):
    return F32(r >> 16) * F32(2.0**-16) + (F32(r & 0xFFFF) + F32(0.5)) * F32(2.0**-32)


def ref_series(u):
    p = F32(1 / 8)
    for n in (7, 6, 5, 4, 3, 2):
        p = F32(1 / n) + u * p
    return -u * (F32(1) + u * p)


def ref_noise32(seed, pos, token):
    """vLLM's float32 noise, each step a numpy float32 operation, glibc's logf for the logs."""
    u = ref_uniform32(ref_hash(seed, pos, token))
    s = ref_series(u) if u < F32(0.25) else F32(_libm.logf(max(F32(1) - u, F32(5.960464477539063e-08))))
    return F32(-_libm.logf(-s))


def ref_noise64(seed, pos, token):
    lo, hi = ref_hash(seed, pos, token), ref_hash(seed, pos, token, 0x9E3779B9)
    u = (float(((hi << 32) | lo) >> 11) + 0.5) * 2.0**-53
    u = u - 2.0**-53 if u == 1.0 else u
    return -_libm.log(-_libm.log(u))


def _draws(n, gen):
    """seeds past 2**32 (and negative: all 64 bits), positions past 2**31 and 2**32, ids past 2**16 and 2**24."""
    seeds = torch.randint(-(2**62), 2**62, (n,), generator=gen)
    seeds[: n // 4] = torch.randint(0, 2**31, (n // 4,), generator=gen)
    pos = torch.randint(0, 2**40, (n,), generator=gen)
    pos[: n // 3] = torch.randint(2**31 - 50, 2**31 + 50, (n // 3,), generator=gen)
    ids = torch.randint(0, 2**31, (n,), generator=gen)
    ids[: n // 3] = torch.randint(2**16 - 10, 2**16 + 10**5, (n // 3,), generator=gen)
    ids[n // 3 : n // 2] = torch.randint(2**24 - 10, 2**24 + 10, (n // 2 - n // 3,), generator=gen)
    return seeds, pos, ids


def test_noise_against_python_murmur3():
    gen = torch.Generator().manual_seed(57)
    seeds, pos, ids = _draws(3000, gen)
    h = vg.murmur3_hash32(seeds, pos, ids)
    want_h = [ref_hash(int(s), int(p), int(v)) for s, p, v in zip(seeds, pos, ids)]
    assert h.tolist() == want_h
    ours = vllm_gumbel_noise(seeds, pos, ids)
    want = np.array([ref_noise32(int(s), int(p), int(v)) for s, p, v in zip(seeds, pos, ids)], dtype=F32)
    assert ours.dtype == torch.float32
    assert np.array_equal(ours.numpy().view(np.uint32), want.view(np.uint32))
    ours64 = vllm_gumbel_noise(seeds, pos, ids, fp64=True)
    want64 = np.array([ref_noise64(int(s), int(p), int(v)) for s, p, v in zip(seeds, pos, ids)])
    assert np.array_equal(ours64.numpy().view(np.uint64), want64.view(np.uint64))
    # the torch formula (CUDA tensors' path): the same hash and uniform; its float32 log is torch's
    u_t = vg.torch_gumbel32(h)
    ulps = (u_t.double() - ours.double()).abs() / (ours.abs().clamp(min=1.0).double() * 2.0**-23)
    assert float(ulps.max()) <= 2.0, float(ulps.max())  # DESIGN.md, "vLLM's noise": 1 ulp of max(|g|, 1) measured


def test_noise_argument_errors():
    s = torch.zeros(4, dtype=torch.int64)
    op = torch.ops.localargmax.vllm_gumbel_noise.default  # the C++ op names the argument too
    for args, error, match in [
        ((s.int(), s, s), TypeError, "seeds must be int64"),
        ((s, s.float(), s), TypeError, "pos must be int64"),
        ((s, s, s[:3]), ValueError, r"seeds \[4\] and ids \[3\] must have one shape"),
        ((s, s, s - 1), ValueError, "ids must be >= 0"),
    ]:
        with pytest.raises(error, match=match):
            op(*args)
    with pytest.raises(ValueError, match="pos must be int64"):
        vllm_noise(s, s.int())
    with pytest.raises(ValueError, match="seed must be 1-D"):
        vllm_noise(s[None], s[None])
    with pytest.raises(ValueError, match="pos must have the seed's shape"):
        vllm_noise(s, s[:3])
    with pytest.raises(ValueError, match="spec_step"):
        vllm_noise(s, s, spec_step=1.5)
    for bad in (-1, 1 << 31, 1 << 40, torch.tensor([0, -3, 0, 1]), torch.tensor([0, 1 << 31, 0, 1])):
        with pytest.raises(ValueError, match=r"spec_step must be in \[0, 2\*\*31\)"):
            vllm_noise(s, s, spec_step=bad)
    assert torch.equal(vllm_noise(s, s, spec_step=(1 << 31) - 1).seed, s ^ (((1 << 31) - 1) << 32))
    with pytest.raises(ValueError, match="ids must be an int64"):
        vllm_gumbel_noise(s, s, s.float())
    h, w, t = torch.randn(4, 8), torch.randn(16, 8), torch.ones(4)
    with pytest.raises(ValueError, match="noise.seed must be"):
        shard_sample(h, w, t, 0, noise=localargmax.VllmNoise(s[:3], s[:3]))
    with pytest.raises(ValueError, match="noise.pos must be int64"):
        localargmax.lm_head_sample(h, w, temperature=t, seed=0, noise=localargmax.VllmNoise(s, s.float()))
    with pytest.raises(ValueError, match="noise must be None or a VllmNoise"):
        shard_sample(h, w, t, 0, noise=(s, s))
    with pytest.raises(ValueError, match=r"noise.pos must be \[B=4\]"):  # the filtered step checks it too
        localargmax.lm_head_sample(h, w, temperature=t, seed=0, noise=localargmax.VllmNoise(s, s[:3]), top_k=3)
    with pytest.raises(ValueError, match="noise_seed and noise_pos come together"):
        torch.ops.localargmax.shard_sample(h, w, None, 0, 16, t, 0, 0, "auto", s, None)


def test_drafting_salt_and_spec_step():
    s, p = torch.tensor([5, 2**40 + 3]), torch.tensor([7, 2**31 + 1])
    n = vllm_noise(s, p, drafting=True, spec_step=3)
    assert n.pos.tolist() == [7 + 2**30, 2**31 + 1 + 2**30]
    assert n.seed.tolist() == [5 ^ (3 << 32), (2**40 + 3) ^ (3 << 32)]
    n = vllm_noise(s, p, spec_step=torch.tensor([1, 2]))
    assert n.seed.tolist() == [5 ^ (1 << 32), (2**40 + 3) ^ (2 << 32)]


# -- against vLLM's Triton code, interpreted ------------------------------------------------------------

VLLM_SCRIPT = r"""
import sys, torch, triton, triton.language as tl
from vllm.v1.worker.gpu.sample import gumbel as G

@triton.jit
def probe(seed_ptr, pos_ptr, id_ptr, h_ptr, u_ptr, s_ptr, g_ptr, g64_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    seed = tl.load(seed_ptr + i, mask=m, other=0)
    pos = tl.load(pos_ptr + i, mask=m, other=0)
    ids = tl.load(id_ptr + i, mask=m, other=0)
    h = G.murmur3_hash32(seed, pos, ids)
    u = G.murmur3_uniform32(seed, pos, ids)
    s = G._log1p_neg_stable(u)
    tl.store(h_ptr + i, h.to(tl.int64), mask=m)
    tl.store(u_ptr + i, u, mask=m)
    tl.store(s_ptr + i, s, mask=m)
    tl.store(g_ptr + i, -tl.log(-s), mask=m)
    u64 = G.murmur3_uniform64(seed, pos, ids)
    tl.store(g64_ptr + i, -tl.log(-tl.log(u64)), mask=m)

def noise(seed, pos, ids):
    n = ids.numel()
    out = [torch.empty(n, dtype=d) for d in (torch.int64, torch.float32, torch.float32, torch.float32, torch.float64)]
    probe[(triton.cdiv(n, 4096),)](seed, pos, ids, *out, n, BLOCK=4096)
    return dict(zip(("h", "u", "s", "g", "g64"), out))

d = torch.load(sys.argv[1])
res = {"probe": noise(*d["probe"]), "cases": []}
for c in d["cases"]:
    logits, t, seed, pos, drafting = c["logits"], c["t"], c["seed"], c["pos"], c["drafting"]
    B, V = logits.shape
    sampled = G.gumbel_sample(logits.clone(), torch.arange(B, dtype=torch.int32), t, seed, pos,
                              apply_temperature=True, is_drafting=drafting)
    hp = pos + (1 << 30) if drafting else pos
    g = noise(seed[:, None].expand(B, V).reshape(-1), hp[:, None].expand(B, V).reshape(-1),
              torch.arange(V).repeat(B))["g"].view(B, V)
    res["cases"].append({"sampled": sampled, "g": g})
torch.save(res, sys.argv[1] + ".out")
"""

_VLLM_MARKS = [
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or importlib.util.find_spec("vllm.v1.worker.gpu.sample") is None,
        reason="vLLM 0.34 (vllm.v1.worker.gpu.sample.gumbel) is not importable: put its source on PYTHONPATH",
    ),
    pytest.mark.skipif(vllm_cpu_build(), reason=NO_TRITON_REASON),
]


def vllm_only(test):
    for mark in _VLLM_MARKS:
        test = mark(test)
    return test


V = 70_000  # ids past 2**16 in vLLM's own sampler
B = 8
TEMPS = [1.0, 0.5, 2.0, 0.7, 1.3, 0.05, 1.9999, 0.0]  # (0, 2] and one greedy row


def _plant_nan(logits):
    """NaN logits (vLLM's Sampler drops them; so must the sample under its
    noise), whole ids (the tests run ``hidden = eye``, so a NaN weight entry
    makes its id NaN in every row): one per 20,000-id span (every shard of the
    tp2 / tp3 bounds below), greedy row 7's argmax, and every other id of
    [100, 3000) (no block of vLLM's kernel all NaN: its interpreted
    ``tl.max`` raises on an all-NaN slice)."""
    logits[:, ::20_000] = float("nan")
    logits[:, logits[7].argmax()] = float("nan")
    logits[:, 100:3000:2] = float("nan")


def _case(gen, drafting, spec_step=None, plant_ties=False, plant_nan=False):
    seed = torch.randint(-(2**62), 2**62, (B,), generator=gen)
    seed[0] = 12345
    pos = torch.randint(2**31 - 4, 2**33, (B,), generator=gen)
    noise = vllm_noise(seed, pos, drafting=drafting, spec_step=spec_step)
    logits = (torch.randn(B, V, generator=gen) * 2).float()
    t = torch.tensor(TEMPS, dtype=torch.float32)
    if plant_ties:  # rows 0..3 (T = 1, 0.5, 2, 0.7): ids i < j whose float32 scores tie under our noise
        for b in range(4):
            logits[b] -= 40
            i, j = sorted(torch.randint(0, V, (2,), generator=gen).tolist())
            j = j if j != i else i + 1
            g = vllm_gumbel_noise(noise.seed[b].expand(2), noise.pos[b].expand(2), torch.tensor([i, j]))
            ti = t[b].item()
            si = F32(F32(3.0) / F32(ti)) + F32(g[0].item())
            xj = F32((si - F32(g[1].item())) * F32(ti))  # x_j / T + g_j == s_i where that rounds back
            logits[b, i], logits[b, j] = 3.0, float(xj)
    if plant_nan:
        _plant_nan(logits)
    return {"logits": logits, "t": t, "seed": noise.seed, "pos": pos, "drafting": drafting, "noise": noise}


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    gen = torch.Generator().manual_seed(1957)
    probe = _draws(20_000, gen)
    cases = [_case(gen, False), _case(gen, True, spec_step=2), _case(gen, False, plant_ties=True)]
    cases.append(_case(gen, False, plant_nan=True))  # case 3
    path = tmp_path_factory.mktemp("vllm_noise") / "in.pt"
    torch.save({"probe": probe, "cases": [{k: v for k, v in c.items() if k != "noise"} for c in cases]}, path)
    env = {**os.environ, **RANK_ENV}
    run = subprocess.run([sys.executable, "-c", VLLM_SCRIPT, str(path)], env=env, capture_output=True, text=True)
    if run.returncode != 0 and "No module named 'vllm" in run.stderr:
        pytest.skip("vLLM 0.34 is not importable in a subprocess")
    assert run.returncode == 0, run.stderr[-3000:]
    return probe, cases, torch.load(str(path) + ".out")


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ia, ib = a.view(torch.int32).to(torch.int64), b.view(torch.int32).to(torch.int64)
    ia = torch.where(ia < 0, -(2**31) - ia, ia)
    ib = torch.where(ib < 0, -(2**31) - ib, ib)
    return (ia - ib).abs()


@vllm_only
def test_noise_against_vllm_triton(vllm_run, record_property):
    (seeds, pos, ids), _, out = vllm_run
    p = out["probe"]
    assert p["h"].tolist() == vg.murmur3_hash32(seeds, pos, ids).tolist()  # the hash: bit for bit
    u = torch.from_numpy(np.array([ref_uniform32(int(r)) for r in p["h"]], dtype=F32))
    assert torch.equal(p["u"].view(torch.int32), u.view(torch.int32))  # the uniform: bit for bit
    low = p["u"] < 0.25
    series = torch.from_numpy(np.array([ref_series(x) for x in p["u"][low].numpy()], dtype=F32))
    assert torch.equal(p["s"][low].view(torch.int32), series.view(torch.int32))  # the series: bit for bit
    ours = vllm_gumbel_noise(seeds, pos, ids)
    differ = ours != p["g"]
    record_property("noise values differing from the interpreter's", f"{int(differ.sum())} of {ours.numel()}")
    # log(-s) near -s = 1 (g near 0) has an absolute, not a relative, error: ulps of max(|g|, 1)
    m = p["g"].abs().clamp(min=1.0)
    assert bool(((ours - p["g"]).abs() <= 4 * (torch.nextafter(m, torch.tensor(np.inf)) - m)).all())
    ours64 = vllm_gumbel_noise(seeds, pos, ids, fp64=True)
    assert torch.allclose(ours64, p["g64"], rtol=1e-14, atol=1e-14)


def _check_ids(ours, case, got, label):
    """ours: our sampled ids; vLLM's: got['sampled'], its noise got['g']. Our ids must be the argmax of our
    own float32 scores exactly; vLLM's where both noises agree at its id and ours (else within ulps).
    NaN logits never win (vLLM's gumbel_sample drops them): they score as -inf here."""
    logits, t = case["logits"], case["t"]
    assert not bool(logits.isnan()[torch.arange(B), ours].any()), f"{label}: a NaN logit was sampled"
    assert not bool(logits.isnan()[torch.arange(B), got["sampled"]].any()), f"{label}: vLLM sampled a NaN logit"
    logits = logits.masked_fill(logits.isnan(), -float("inf"))
    n = case["noise"]
    g_ours = vllm_gumbel_noise(n.seed[:, None].expand(B, V), n.pos[:, None].expand(B, V), torch.arange(V).expand(B, V))
    greedy = t == 0
    tt = torch.where(greedy, 1.0, t)[:, None]
    score_ours = torch.where(greedy[:, None], logits, logits / tt + g_ours)
    assert torch.equal(ours, score_ours.argmax(dim=1)), f"{label}: not the argmax of our own scores"
    vl = got["sampled"]
    score_v = torch.where(greedy[:, None], logits, logits / tt + got["g"])
    assert torch.equal(vl, score_v.argmax(dim=1)), f"{label}: vLLM's sample is not its noise's argmax"
    rows = torch.arange(B)
    same_noise = (g_ours[rows, ours] == got["g"][rows, ours]) & (g_ours[rows, vl] == got["g"][rows, vl])
    agree = ours == vl
    assert bool((agree | ~same_noise).all()), f"{label}: ids differ where the noise is the same: {ours} {vl}"
    top = score_v[rows, vl]
    assert bool((agree | (_ulps(top, score_v[rows, ours]) <= 4)).all()), f"{label}: differ beyond a near-tie"
    return int((~agree).sum())


@vllm_only
def test_lm_head_sample_against_vllm_gumbel_sample(vllm_run):
    _, cases, out = vllm_run
    eye = torch.eye(B)
    for ci, (case, got) in enumerate(zip(cases, out["cases"])):
        ids = localargmax.lm_head_sample(eye, case["logits"].T.contiguous(), temperature=case["t"], seed=0,
                                         noise=case["noise"])  # fmt: skip
        # planted ties (case 2, rows 0-3): the first id wins in both where the noise is the same at both ids
        # (_check_ids); where the two logs differ by an ulp at one of them, the other id may win in one
        differ = _check_ids(ids, case, got, f"case {ci}")
        assert differ == 0 if ci != 2 else torch.equal(ids[4:], got["sampled"][4:])


@vllm_only
@pytest.mark.parametrize("bounds", [(0, 33_333, V), (0, 20_000, 50_001, V)], ids=["tp2", "tp3"])
def test_sharded_merge_against_vllm(vllm_run, bounds):
    _, cases, out = vllm_run
    eye = torch.eye(B)
    pad = 64
    for ci, (case, got) in enumerate(zip(cases, out["cases"])):
        weight = case["logits"].T.contiguous()
        keys = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            w = torch.cat([weight[lo:hi], torch.full((pad, B), 1e4)])  # padding rows that would win
            keys.append(shard_sample(eye, w, case["t"], 0, vocab_start=lo, num_valid=hi - lo, noise=case["noise"]))
        ids, _ = merge_keys(torch.stack(keys))
        differ = _check_ids(ids, case, got, f"case {ci} {bounds}")
        assert differ == 0 if ci != 2 else torch.equal(ids[4:], got["sampled"][4:])
        # the log-partition variant samples the same ids
        keys_lse = [
            shard_sample(eye, weight[lo:hi], case["t"], 0, vocab_start=lo, noise=case["noise"], log_partition=True)[0]
            for lo, hi in zip(bounds[:-1], bounds[1:])
        ]
        assert torch.equal(merge_keys(torch.stack(keys_lse))[0], ids)


# -- the kernels at ids past 2**24, every CPU path, and the CUDA kernels under the host emulation -------


def _problem(gen, vocab_start, rows=300, batch=5):
    seed = torch.randint(-(2**62), 2**62, (batch,), generator=gen)
    pos = torch.randint(2**31 - 2, 2**34, (batch,), generator=gen)
    weight = torch.randn(rows, batch, generator=gen)
    t = torch.tensor([1.0, 0.3, 2.0, 0.0, 1.5][:batch])
    # NaN logits (dropped under vLLM's noise): at row 0's and greedy row 3's argmax, and every
    # third id of row 4 (with hidden = eye, each NaN id is NaN in every row)
    for b in (0, 3):
        weight[weight[:, b].argmax(), b] = float("nan")
    weight[2:-1:3, 4] = float("nan")
    return torch.eye(batch), weight, t, vllm_noise(seed, pos, drafting=True)


def _expected_keys(weight, t, noise, vocab_start):
    """The best (score, id) per row, by the float32 formula and the C++ noise op."""
    rows, batch = weight.shape
    ids = torch.arange(vocab_start, vocab_start + rows)
    g = vllm_gumbel_noise(noise.seed[:, None].expand(batch, rows), noise.pos[:, None].expand(batch, rows),
                          ids.expand(batch, rows))  # fmt: skip
    # hidden = eye: a NaN weight entry makes its id NaN in every row; NaN never wins under vLLM's noise
    x = weight.T.masked_fill(weight.isnan().any(dim=1)[None], -float("inf"))
    tt = torch.where(t > 0, t, 1.0)[:, None]
    score = torch.where((t > 0)[:, None], x / tt + g, x)
    return score.argmax(dim=1) + vocab_start, score.max(dim=1).values


@pytest.mark.parametrize("vocab_start", [0, 2**16 - 100, 2**24 - 150, 2**31 - 400])
def test_cpu_paths_at_large_ids(vocab_start):
    from localargmax._validation import CPU_PATHS

    gen = torch.Generator().manual_seed(vocab_start)
    eye, weight, t, noise = _problem(gen, vocab_start)
    want_ids, want_vals = _expected_keys(weight, t, noise, vocab_start)
    ran = []
    for path in CPU_PATHS:
        if cpu_path_unavailable(path) is not None:  # a path this CPU or build lacks (the op's own refusal)
            continue
        keys = shard_sample(eye, weight, t, 0, vocab_start=vocab_start, noise=noise, path=path)
        ran.append(path)
        ids, vals = localargmax.decode_keys(keys)
        assert torch.equal(ids, want_ids), path
        assert torch.equal(vals.view(torch.int32), want_vals.view(torch.int32)), path
    assert "generic" in ran, ran


def test_cuda_kernels_under_emulation(emu):
    """vLLM's noise on CUDA runs on the gemm path (cuBLAS logits, then
    logits_to_keys_kernel, the one kernel whose key_of evaluates it); the
    fused kernels refuse it, as pick_path does."""
    gen = torch.Generator().manual_seed(5757)
    path = "gemm"
    for vocab_start in (0, 2**24 - 100):
        eye, weight, t, noise = _problem(gen, vocab_start, rows=200, batch=5)
        h = torch.zeros(eye.shape[0], 64, dtype=torch.bfloat16)
        h[:, : eye.shape[1]] = eye
        w = torch.zeros(weight.shape[0], 64, dtype=torch.bfloat16)
        w[:, : weight.shape[1]] = weight
        want = shard_sample(h, w, t, 0, vocab_start=vocab_start, noise=noise)
        got = emu.shard(h, w, None, vocab_start, None, path=path, temperature=t, noise_seed=noise.seed,
                        noise_pos=noise.pos)  # fmt: skip
        assert torch.equal(got, want), path
        keys, pairs = emu.shard(h, w, None, vocab_start, None, path=path, temperature=t, noise_seed=noise.seed,
                                noise_pos=noise.pos, log_partition=True)  # fmt: skip
        want_k, want_p = shard_sample(h, w, t, 0, vocab_start=vocab_start, noise=noise, log_partition=True)
        assert torch.equal(keys, want_k), path
        assert torch.allclose(pairs, want_p, rtol=1e-5, equal_nan=True), path  # NaN ids: NaN sums
        for fused in ("simt", "mma"):
            with pytest.raises(ValueError, match="noise_seed.*'gemm'"):
                emu.shard(h, w, None, vocab_start, None, path=fused, temperature=t, noise_seed=noise.seed,
                          noise_pos=noise.pos)  # fmt: skip
        # without the noise tensors the emulation is back on Philox
        philox = emu.shard(h, w, None, vocab_start, None, path=path, temperature=t, seed=3, offset=1)
        assert torch.equal(philox, shard_sample(h, w, t, 3, 1, vocab_start=vocab_start))


@cuda_only
def test_cuda_takes_the_gemm_path():
    """On a GPU: "auto" and "gemm" sample with vLLM's noise (cuBLAS logits,
    logits_to_keys_kernel) and give the CPU kernel's ids, the values within the
    logs' ulps (DESIGN.md, "vLLM's noise"); the fused paths and float32 weights
    raise ValueError naming noise_seed, as pick_path rules."""
    gen = torch.Generator().manual_seed(5758)
    eye, weight, t, noise = _problem(gen, 2**24 - 100, rows=300, batch=5)
    h = torch.zeros(eye.shape[0], 64, dtype=torch.bfloat16)
    h[:, : eye.shape[1]] = eye
    w = torch.zeros(weight.shape[0], 64, dtype=torch.bfloat16)
    w[:, : weight.shape[1]] = weight
    want_ids, want_vals = localargmax.decode_keys(shard_sample(h, w, t, 0, vocab_start=2**24 - 100, noise=noise))
    cuda_noise = vllm_noise(noise.seed.cuda(), noise.pos.cuda())
    hc, wc, tc = h.cuda(), w.cuda(), t.cuda()
    for path in ("auto", "gemm"):
        keys = shard_sample(hc, wc, tc, 0, vocab_start=2**24 - 100, noise=cuda_noise, path=path)
        ids, vals = localargmax.decode_keys(keys.cpu())
        assert torch.equal(ids, want_ids), path
        assert torch.allclose(vals, want_vals, rtol=1e-6, atol=1e-6), path
    for path in ("simt", "mma"):
        with pytest.raises(ValueError, match="noise_seed"):
            shard_sample(hc, wc, tc, 0, noise=cuda_noise, path=path)
    with pytest.raises(ValueError, match="noise_seed.*bfloat16 or float16"):
        shard_sample(hc.float(), wc.float(), tc, 0, noise=cuda_noise)
