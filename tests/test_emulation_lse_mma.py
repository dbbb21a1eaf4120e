"""The host emulation (see tests/test_emulation.py) of the tensor-core
kernel's log-partition epilogue (fused_keys_mma.cuh, lse): every cp.async
config forced and auto's choice, against an exact model of the documented
merge tree (DESIGN.md, "Log-probabilities"), the float64 logsumexp, the
CPU kernel's keys and the same config's plain keys; and C++ auto's path
choice, the same for the log-partition ops as for the plain ones."""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import pytest
import torch

import localargmax
from localargmax import _C
from localargmax._validation import MMA_CONFIGS
from tests.support import emulation
from tests.support.emulation_cases import HALF, assert_keys_equal, exact_problem, ops
from tests.support.keys import pack_key
from tests.test_emulation_lse import _ref_partition

pytestmark = pytest.mark.skipif(not emulation.have_compiler(), reason="g++ / objcopy not found")

LSE_CONFIGS = [name for name, c in MMA_CONFIGS.items() if not c.tma]


# --- an exact model of the epilogue's order: float32 operations one by one, the host's ieee_expf ---
# (a float32 +, *, / of float32 operands is the double result rounded once: f32(a op b))

INF = math.inf


def f32(v: float) -> float:
    return ctypes.c_float(v).value


def ieee_expf(x):
    """csrc/common/log_partition.h's ieee_expf (the host's exp of the pairs), operation by operation."""
    x = min(max(x, -104.0), 89.0) if x == x else x
    if x != x:
        return x
    n = f32(f32(f32(x * f32(1.44269504088896341)) + 12582912.0) - 12582912.0)
    r = f32(f32(x - f32(n * 0.693359375)) - f32(n * f32(-2.12194440e-4)))
    y = f32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        y = f32(f32(y * r) + f32(c))
    y = f32(f32(f32(y * f32(r * r)) + r) + 1.0)
    k = int(n)
    return f32(f32(y * 2.0 ** (k >> 1)) * 2.0 ** (k - (k >> 1)))


def test_ieee_expf_model_is_within_an_ulp_of_exp():
    """The model (and so the C++ function, which the pairs below match bit for
    bit) is within 1 ulp of exp over its range, with its edges: 0 below
    exp's float32 range, inf above, NaN kept, subnormal results."""
    gen = torch.Generator().manual_seed(55)
    edges = torch.tensor([0.0, -0.0, 88.72, -87.4, -103.9])
    xs = torch.cat([torch.empty(4000).uniform_(-104, 88.7, generator=gen), edges])
    for x in xs.tolist():
        want = math.exp(x)
        ulp = max(2.0 ** (math.frexp(want)[1] - 24), 2.0**-149)  # float32's ulp at want
        assert abs(ieee_expf(x) - want) <= ulp, (x, ieee_expf(x), want)
    assert ieee_expf(-INF) == 0.0 and ieee_expf(-105.0) == 0.0 and ieee_expf(89.5) == INF
    assert math.isnan(ieee_expf(math.nan))


def _term(x, ref, t):  # partition_term
    if x == -INF:
        return 0.0
    if x == ref:
        return 1.0
    return ieee_expf(f32(f32(x - ref) / t))


def _add(s, x, key, t):  # partition_add; s = [best_key, ref, others]
    if key > s[0]:
        s[2] = f32(f32(s[2] + 1.0) * _term(s[1], x, t))
        s[1], s[0] = x, key
    else:
        s[2] = f32(s[2] + _term(x, s[1], t))


def _merge(a, b, t):  # partition_merge
    if b[0] > a[0]:
        a[2] = f32(f32(f32(a[2] + 1.0) * _term(a[1], b[1], t)) + b[2])
        a[1], a[0] = b[1], b[0]
    else:
        a[2] = f32(a[2] + f32(f32(b[2] + 1.0) * _term(b[1], a[1], t)))


def _init():
    return [0, -INF, 0.0]


def model_pairs(x, vocab_start, num_valid, config, temperature=None):
    """The pairs [B, 2] the LSE epilogue of `config` must give for the float32
    transformed logits x [B, rows] (exact): per lane its rows (m-tile, then g,
    g + 8), the xor butterfly over g (offsets 4, 8, 16), the block's warps in
    order, then the blocks in order (merge_partition_kernel)."""
    c = MMA_CONFIGS[config]
    x = x.tolist()
    rows_per_block = c.wm * c.mt * 16
    blocks = (num_valid + rows_per_block - 1) // rows_per_block
    out = []
    for b, xb in enumerate(x):
        tb = 1.0 if temperature is None else float(temperature[b])
        t = tb if tb > 0 else 1.0
        total = _init()
        for bx in range(blocks):
            block = _init()
            for w in range(c.wm):
                base = bx * rows_per_block + w * c.mt * 16
                lanes = []
                for g in range(8):
                    s = _init()
                    for mt in range(c.mt):
                        for row in (base + 16 * mt + g, base + 16 * mt + g + 8):
                            if row < num_valid:
                                _add(s, xb[row], pack_key(xb[row], vocab_start + row), t)
                    lanes.append(s)
                for offset in (1, 2, 4):  # lane offsets 4, 8, 16 are g offsets 1, 2, 4
                    for g in range(8):
                        if not g & offset:
                            _merge(lanes[g], lanes[g + offset], t)
                            lanes[g + offset] = list(lanes[g])
                _merge(block, lanes[0], t)
            _merge(total, block, t)
        out.append((total[1], total[1] if math.isnan(total[1]) else total[2]))
    return torch.tensor(out, dtype=torch.float32).reshape(len(x), 2)


def assert_same_float32(got, want, what):
    """Bit for bit, NaN where NaN (its payload is not part of the contract)."""
    nan = got.isnan()
    assert torch.equal(nan, want.isnan()), f"{what}: NaN at other places"
    bad = ((got.view(torch.int32) != want.view(torch.int32)) & ~nan).nonzero().tolist()
    assert not bad, f"{what}: log-partition pairs differ from the model at {bad[:6]}: {got[nan.logical_not()][:4]}"


def _logits(h, w, b, num_valid, scale=1.0):
    x = h.double() @ w.double().T + (0.0 if b is None else b.double())  # exact: small integers
    return x.float() * scale


# --- the log-partition on the tensor-core kernel ---


@pytest.mark.parametrize("config", LSE_CONFIGS)
@pytest.mark.parametrize("shape", [(1, 70, 8), (9, 300, 40), (19, 515, 72)], ids=str)
def test_mma_log_partition_is_the_documented_tree(emu, gen, config, shape):
    """Each cp.async config with the log-partition: keys bit-equal to the same
    config's plain keys and the CPU kernel's (exact data), pairs bit-equal to
    the model of the merge tree (batch row 0's best tied at the last valid
    row, so x == ref counts 1; another exact tie across blocks; padding that
    would win; row and batch tails, k tails of H % 32 != 0) and ref +
    log1p(others) within the float32 bound of the float64 logsumexp; the
    same at a per-row temperature (rows with T <= 0 or 1: the T = 1 pairs)."""
    batch, rows, hidden_size = shape
    dtype = HALF[LSE_CONFIGS.index(config) % 2]
    # entries of -1 .. 1: logits close enough that another grouping of the sums changes their bits
    h, w, b = exact_problem(gen, batch, rows, hidden_size, dtype, "f", lo=-1, hi=1)
    num_valid = rows - 3
    w[num_valid:] = 3  # padding: the largest logits if counted
    best = int(_logits(h, w, b, num_valid)[0, :num_valid].argmax())
    w[num_valid - 1], b[num_valid - 1] = w[best], b[best]  # batch row 0's best, tied at the last valid row
    if num_valid > 200:
        w[200], b[200] = w[3], b[3]  # an exact tie with row 3, another block
    path = f"mma/{config}"
    for scale in (1.0, 0.5):
        keys, pairs = emu.shard(h, w, b, 11, num_valid, path=path, log_partition=True, scale=scale)
        want_keys = ops.shard_argmax_lse(h, w, b, 11, num_valid, scale, 0.0, "generic")[0]
        assert_keys_equal(keys, want_keys, f"{config} lse keys, scale {scale}")
        if scale == 1.0:
            assert_keys_equal(keys, emu.shard(h, w, b, 11, num_valid, path=path), f"{config}: lse keys vs plain")
        x = _logits(h, w, b, num_valid, scale)
        assert_same_float32(pairs, model_pairs(x, 11, num_valid, config), f"{config} scale {scale}")
        ref = torch.logsumexp(_ref_partition(h, w, b, num_valid, scale), 1)
        err = (pairs[:, 0].double() + pairs[:, 1].double().log1p() - ref).abs().max()
        assert float(err) <= 1e-5 * max(1.0, float(ref.abs().max()) * 2.0**-10), f"log-partition error {err:.3g}"
    t = torch.tensor([0.7, 0.0, 2.0, 1.0, 0.05, -1.0, 3.5] * 3)[:batch]
    keys_t, pairs_t = emu.shard(h, w, b, 11, num_valid, path=path, log_partition=True, partition_temperature=t)
    assert_keys_equal(keys_t, emu.shard(h, w, b, 11, num_valid, path=path), f"{config}: keys at T vs plain")
    assert_same_float32(pairs_t, model_pairs(_logits(h, w, b, num_valid), 11, num_valid, config, t), "at T")
    plain = emu.shard(h, w, b, 11, num_valid, path=path, log_partition=True)[1]
    same = (t == 1) | (t <= 0)
    assert torch.equal(pairs_t[same], plain[same]), "sums at T: rows with T <= 0 or 1 differ from T = 1"


@pytest.mark.parametrize("config", ["n1_r64", "n4_r128", "n8_r192", "n16_r64"])
def test_mma_log_partition_sampling(emu, gen, config):
    """Sampling with the log-partition on the tensor cores: keys bit-equal to
    the plain sample's (and the CPU's), the pair's ref the sampled entry's
    x, -log1p(others) its log-probability under softmax(x / T) within 1e-5
    of float64; greedy rows (T = 0) carry the argmax's pairs."""
    h, w, b = exact_problem(gen, 21, 300, 40, torch.bfloat16, "f")
    t = torch.tensor([0.0, 0.5, 1.0, 2.0, 1e-3, 7.0, 0.9] * 3)
    path = f"mma/{config}"
    keys, pairs = emu.shard(h, w, b, 7, 297, path=path, temperature=t, seed=5, offset=3, log_partition=True)
    assert_keys_equal(keys, emu.shard(h, w, b, 7, 297, path=path, temperature=t, seed=5, offset=3), "lse vs plain")
    assert_keys_equal(keys, ops.shard_sample(h, w, b, 7, 297, t, 5, 3, "generic"), "sample keys vs the CPU")
    ids = localargmax.decode_keys(keys)[0] - 7
    assert torch.equal(pairs[:, 0].double(), _ref_partition(h, w, b, 297).gather(1, ids[:, None])[:, 0])
    x = _ref_partition(h, w, b, 297, temperature=t)
    want = x.gather(1, ids[:, None])[:, 0] - torch.logsumexp(x, 1)
    assert float((-pairs[:, 1].double().log1p() - want).abs().max()) <= 1e-5
    greedy = emu.shard(h, w, b, 7, 297, path=path, log_partition=True)[1]
    assert torch.equal(pairs[t == 0], greedy[t == 0])


def test_mma_log_partition_specials(emu, gen):
    """NaN, +inf and -inf entries through the tensor-core epilogue: a NaN
    makes others NaN, two +inf give (inf, 1), an all -inf shard (-inf, 0);
    the model agrees bit for bit; an empty shard and a batch of 0 launch
    nothing; a forced TMA config has no log-partition (ValueError)."""
    h, w, _ = exact_problem(gen, 4, 200, 8, torch.bfloat16)
    b = torch.full((200,), -math.inf)
    b[150] = math.nan
    for config in ("n1_r64", "n8_r256"):
        kw = dict(path=f"mma/{config}", log_partition=True)
        b[150] = math.nan
        keys, pairs = emu.shard(h, w, b, 0, 200, **kw)
        assert pairs[:, 1].isnan().all() and torch.equal(keys, ops.shard_argmax(h, w, b, 0, 200, "generic"))
        b[150] = -math.inf
        assert emu.shard(h, w, b, 0, 200, **kw)[1].tolist() == [[-math.inf, 0.0]] * 4
        b[70] = b[190] = math.inf
        keys, pairs = emu.shard(h, w, b, 0, 200, **kw)
        assert pairs.tolist() == [[math.inf, 1.0]] * 4
        assert_same_float32(pairs, model_pairs(_logits(h, w, b, 200), 0, 200, config), config)
        b[70] = b[190] = -math.inf
        keys, pairs = emu.shard(h, w, b, 0, 0, **kw)
        assert (keys == 0).all() and pairs.tolist() == [[-math.inf, 0.0]] * 4
        assert emu.shard(h[:0], w, b, 0, 200, **kw)[1].shape == (0, 2)
    with pytest.raises(ValueError, match="TMA.*no log-partition"):
        emu.shard(h, w, b, log_partition=True, path="mma/n1_r64_tma")


# --- which kernel auto runs for the log-partition ops ---


def test_cuda_auto_takes_the_same_path_with_the_log_partition():
    """C++ auto's path (choose_cuda_path, the one function pick_path asks
    for the plain and the log-partition ops): the tensor cores for bf16 /
    fp16 argmax and sample below the gemm batch where the kernel takes the
    inputs; gemm from it; top-k on the tensor cores at every batch (gemm has
    none); simt for float32 and inputs mma cannot take."""
    for batch in (0, 1, 8, 9, 32, 33, 64, 65, 4096):
        want = "gemm" if batch >= localargmax.dispatch.CPP_GEMM_MIN_BATCH else "mma"
        assert _C._choose_cuda_path(True, False, True, batch, 151936) == want, batch
        assert _C._choose_cuda_path(True, False, False, batch, 151936) == ("simt" if want == "mma" else "gemm"), batch
        assert _C._choose_cuda_path(False, False, False, batch, 151936) == "simt"
        assert _C._choose_cuda_path(True, True, True, batch, 151936) == "mma"
        assert _C._choose_cuda_path(True, True, True, batch, 2**21 + 1) == "mma"
        assert _C._choose_cuda_path(True, True, False, batch, 151936) == "simt"
        assert _C._choose_cuda_path(False, True, True, batch, 151936) == "simt"


@pytest.mark.parametrize("batch", [1, 9, 17, 33, 64])
def test_mma_auto_runs_the_same_config_with_the_log_partition(emu, gen, batch):
    """launch_mma's own choice with the log-partition is the plain call's
    config, in the same instantiation (one build per config: the
    log-partition is its run-time flag), so the keys are the plain keys bit
    for bit and the pairs are that config's tree."""
    h, w, b = exact_problem(gen, batch, 700, 40, torch.float16, "f")
    emu.launched = []
    plain = emu.shard(h, w, b, 5, 690, path="mma")
    plain_kernels = [k for k in emu.launched if "mma_pipe" in k]
    emu.launched = []
    keys, pairs = emu.shard(h, w, b, 5, 690, path="mma", log_partition=True)
    lse_kernels = [k for k in emu.launched if "mma_pipe" in k]
    assert len(set(plain_kernels)) == 1 and plain_kernels[0].endswith(", false>"), plain_kernels  # (cp.async)
    assert set(lse_kernels) == set(plain_kernels), (plain_kernels, lse_kernels)
    assert_keys_equal(keys, plain, "auto: lse keys vs plain")
    config = emu.mma_config(40, 690, batch)
    assert_same_float32(pairs, model_pairs(_logits(h, w, b, 690), 5, 690, config), f"auto ({config})")
