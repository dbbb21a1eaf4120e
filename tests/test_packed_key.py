"""The packed key (DESIGN.md, "The packed key") as the real ops produce and
decode it: the worked-example table, and an independent Python model of the
encoding on many random values."""
from __future__ import annotations

import math

import pytest
import torch

import localargmax
from helpers import bits_f32, f32_bits, py_pack_key, same_float32, to_int64, to_uint64

INF = math.inf
NAN = math.nan

# DESIGN.md's table: (value, global index) -> key as uint64. The only
# hard-coded answers in the suite.
DESIGN_TABLE = [
    (1.0, 5, 0xBF800000FFFFFFFA),
    (-1.0, 0, 0x407FFFFFFFFFFFFF),
    (0.0, 7, 0x80000000FFFFFFF8),
    (-0.0, 7, 0x80000000FFFFFFF8),
    (INF, 2, 0xFF800000FFFFFFFD),
    (-INF, 3, 0x007FFFFFFFFFFFFC),
    (NAN, 9, 0xFFFFFFFFFFFFFFF6),
    (1e-45, 4, 0x80000001FFFFFFFB),
    (-2.5, 100000, 0x3FDFFFFFFFFE795F),
]

CANONICAL_NAN_BITS = 0x7FC00000


def _decoded_bits(value: float) -> int:
    """What decode must give back: the value's float32 bits, -0 -> +0, NaN -> canonical."""
    if math.isnan(value):
        return CANONICAL_NAN_BITS
    bits = f32_bits(value)
    return 0 if bits == 0x80000000 else bits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("value,index,key", DESIGN_TABLE, ids=[f"{v}@{i}" for v, i, _ in DESIGN_TABLE])
def test_design_table_through_shard_argmax(value, index, key, dtype):
    if dtype != torch.float32 and value == 1e-45:
        pytest.skip("1e-45 is not representable in 16-bit floats")
    hidden = torch.tensor([[1.0]], dtype=dtype)
    weight = torch.tensor([[value]], dtype=dtype)
    got = localargmax.shard_argmax(hidden, weight, vocab_start=index, num_valid=1)
    assert got.dtype == torch.int64 and got.shape == (1,)
    assert to_uint64(int(got[0])) == key, f"key 0x{to_uint64(int(got[0])):016X}, DESIGN.md says 0x{key:016X}"
    # also with a bias of +0.0 and with a zero-padded larger hidden size
    bias = torch.zeros(1, dtype=torch.float32)
    got_b = localargmax.shard_argmax(hidden, weight, vocab_start=index, num_valid=1, bias=bias)
    assert to_uint64(int(got_b[0])) == key
    hidden9 = torch.zeros((1, 9), dtype=dtype)
    hidden9[0, 4] = 1.0
    weight9 = torch.zeros((1, 9), dtype=dtype)
    weight9[0, 4] = value
    got9 = localargmax.shard_argmax(hidden9, weight9, vocab_start=index, num_valid=1)
    assert to_uint64(int(got9[0])) == key
    # an inf weight meeting a zero hidden entry gives 0 * inf = NaN (also in float64)
    if math.isinf(value):
        weight9[0, 3] = value
        got_nan = localargmax.shard_argmax(hidden9, weight9, vocab_start=index, num_valid=1)
        assert to_uint64(int(got_nan[0])) == py_pack_key(NAN, index)


@pytest.mark.parametrize("value,index,key", DESIGN_TABLE, ids=[f"{v}@{i}" for v, i, _ in DESIGN_TABLE])
def test_design_table_decode(value, index, key):
    keys = torch.tensor([to_int64(key)], dtype=torch.int64)
    ids, values = localargmax.decode_keys(keys)
    assert ids.dtype == torch.int64 and values.dtype == torch.float32
    assert int(ids[0]) == index
    assert values.view(torch.int32)[0].item() & 0xFFFFFFFF == _decoded_bits(value)
    # merge_keys decodes the same way ([B] and [1, B])
    for k in (keys, keys.view(1, 1)):
        m_ids, m_values = localargmax.merge_keys(k)
        assert int(m_ids[0]) == index
        assert m_values.view(torch.int32)[0].item() & 0xFFFFFFFF == _decoded_bits(value)


def test_design_table_python_model():
    """The Python key model used by the other tests agrees with the table."""
    for value, index, key in DESIGN_TABLE:
        assert py_pack_key(value, index) == key


def _special_and_random_floats(gen: torch.Generator, n: int) -> torch.Tensor:
    specials = torch.tensor(
        [0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38,
         1.17549435e-38, 3.4028235e38, -3.4028235e38, 2.5, -2.5],
        dtype=torch.float32,
    )
    bits = torch.randint(-(2**31), 2**31, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
    anybits = bits.view(torch.float32)  # includes NaN payloads, denormals, infinities
    denormals = (torch.randint(0, 2**23, (n // 4,), generator=gen, dtype=torch.int32)
                 | (torch.randint(0, 2, (n // 4,), generator=gen, dtype=torch.int32) << 31)).view(torch.float32)
    halves = torch.randint(-8, 9, (n // 4,), generator=gen).float() * 0.5  # many exact duplicates
    return torch.cat([specials, anybits, denormals, halves])


@pytest.mark.parametrize("vocab_start", [0, 1, 77777, 2**31 - 1, 2**31, 2**32 - 2])
def test_keys_match_python_model(gen, vocab_start):
    """hidden = x (one column), weight = [[1.0]]: the logit of batch row b is
    exactly x[b], so every key is checkable against the Python model."""
    x = _special_and_random_floats(gen, 4000)
    keys = localargmax.shard_argmax(x.view(-1, 1), torch.ones((1, 1)), vocab_start=vocab_start, num_valid=1)
    want = [to_int64(py_pack_key(float(v), vocab_start)) for v in x.tolist()]
    mismatches = [(i, float(x[i]), hex(to_uint64(int(keys[i]))), hex(to_uint64(w)))
                  for i, w in enumerate(want) if int(keys[i]) != w]
    assert not mismatches, f"{len(mismatches)} keys differ from the model, e.g. {mismatches[:5]}"
    ids, values = localargmax.decode_keys(keys)
    assert bool((ids == vocab_start).all())
    want_bits = torch.tensor([_decoded_bits(float(v)) for v in x.tolist()], dtype=torch.int64)
    got_bits = values.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert torch.equal(got_bits, want_bits)


def test_decode_keys_shapes_and_round_trip(gen):
    values = _special_and_random_floats(gen, 600)[:600]
    index = torch.randint(0, 2**32 - 1, (600,), generator=gen, dtype=torch.int64)
    keys = torch.tensor([to_int64(py_pack_key(float(v), int(i))) for v, i in zip(values.tolist(), index.tolist())])
    ids, vals = localargmax.decode_keys(keys.view(20, 30))
    assert ids.shape == (20, 30) and vals.shape == (20, 30)
    assert torch.equal(ids.flatten(), index)
    want = torch.tensor([_decoded_bits(float(v)) for v in values.tolist()], dtype=torch.int64)
    assert torch.equal(vals.flatten().view(torch.int32).to(torch.int64) & 0xFFFFFFFF, want)
    # non-contiguous input decodes the same
    ids_t, vals_t = localargmax.decode_keys(keys.view(20, 30).t())
    assert torch.equal(ids_t, ids.t()) and same_float32(vals_t, vals.t())
    empty_ids, empty_vals = localargmax.decode_keys(torch.empty((0, 3), dtype=torch.int64))
    assert empty_ids.shape == (0, 3) and empty_vals.shape == (0, 3)


def test_decode_keys_rejects_no_entry_key_and_wrong_dtype():
    with pytest.raises(ValueError, match="no valid"):
        localargmax.decode_keys(torch.tensor([to_int64(py_pack_key(1.0, 3)), 0]))
    with pytest.raises(TypeError, match="keys"):
        localargmax.decode_keys(torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(TypeError, match="keys"):
        localargmax.decode_keys([1, 2])


def test_keys_sort_like_argmax(gen):
    """Unsigned key order == torch.argmax order on the float64 logits: the max
    key over a set of entries is torch.argmax's answer over the same set."""
    x = _special_and_random_floats(gen, 2000)
    # draw small random sets; each entry has its own index
    for _ in range(200):
        n = int(torch.randint(1, 12, (1,), generator=gen))
        pick = torch.randint(0, x.numel(), (n,), generator=gen)
        vals = x[pick]
        want = int(vals.double().argmax())
        hidden = vals.view(-1, 1)  # batch rows = entries, one vocab row of 1.0
        keys = localargmax.shard_argmax(hidden, torch.ones((1, 1)), num_valid=1)
        # turn "one key per batch row at index 0" into keys at index i
        entry_keys = [to_int64((to_uint64(int(k)) & ~0xFFFFFFFF) | (0xFFFFFFFF - i)) for i, k in enumerate(keys.tolist())]
        ids, _ = localargmax.merge_keys(torch.tensor(entry_keys).view(-1, 1))
        assert int(ids[0]) == want, f"values {vals.tolist()}: merged id {int(ids[0])}, argmax {want}"


def test_largest_index_boundary():
    """Global indices up to 2**32 - 2 round-trip; the winner near the top of the
    index range is still decided by value, then by the smaller index."""
    top = localargmax.MAX_GLOBAL_INDEX
    assert top == 2**32 - 2
    hidden = torch.tensor([[1.0], [-1.0]])
    weight = torch.tensor([[2.0], [3.0], [3.0]])
    keys = localargmax.shard_argmax(hidden, weight, vocab_start=top - 2, num_valid=3)
    ids, values = localargmax.decode_keys(keys)
    assert ids.tolist() == [top - 1, top - 2]
    assert values.tolist() == [3.0, -2.0]
    keys = localargmax.shard_argmax(torch.tensor([[-5.0]]), torch.tensor([[float("inf")]]), vocab_start=top, num_valid=1)
    assert int(keys[0]) != 0
    ids, values = localargmax.decode_keys(keys)
    assert int(ids[0]) == top and float(values[0]) == -INF


def test_bits_helpers_roundtrip():
    for u in (0, 1, 0x7F800000, 0x80000000, 0x3F800000):
        assert f32_bits(bits_f32(u)) == u
