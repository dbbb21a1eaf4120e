"""The packed key (DESIGN.md, "The packed key"), the wire format between ranks:
the worked-example table through the kernel, the decoder and the Python model;
the kernel's keys against the Python model on many values; key order equals
torch.argmax order; the C++ unit test of csrc/common/packed_key.h."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from tests.support.cpp import check_cpp_test, needs_gxx, run_against_mutation
from tests.support.keys import bits_f32, decoded_bits, f32_bits, pack_key, to_int64, to_uint64, value_bits
from tests.support.strategies import given, settings, st

INF, NAN = math.inf, math.nan

# DESIGN.md's table: (value, global index) -> key as uint64. The only hard-coded answers in the suite.
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
TABLE_IDS = [f"{v}@{i}" for v, i, _ in DESIGN_TABLE]


def _key(hidden, weight, index, **kw) -> int:
    return to_uint64(int(localargmax.shard_argmax(hidden, weight, vocab_start=index, num_valid=1, **kw)[0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("value,index,key", DESIGN_TABLE, ids=TABLE_IDS)
def test_design_table_through_shard_argmax(value, index, key, dtype):
    if dtype != torch.float32 and value == 1e-45:
        pytest.skip("1e-45 is not representable in 16-bit floats")
    hidden = torch.tensor([[1.0]], dtype=dtype)
    weight = torch.tensor([[value]], dtype=dtype)
    assert _key(hidden, weight, index) == key, f"DESIGN.md says 0x{key:016X}"
    assert _key(hidden, weight, index, bias=torch.zeros(1)) == key  # a bias of +0.0
    hidden9, weight9 = torch.zeros((1, 9), dtype=dtype), torch.zeros((1, 9), dtype=dtype)
    hidden9[0, 4], weight9[0, 4] = 1.0, value
    assert _key(hidden9, weight9, index) == key  # zero-padded larger hidden size
    if math.isinf(value):  # an inf weight meeting a zero hidden entry: 0 * inf = NaN
        weight9[0, 3] = value
        assert _key(hidden9, weight9, index) == pack_key(NAN, index)


@pytest.mark.parametrize("value,index,key", DESIGN_TABLE, ids=TABLE_IDS)
def test_design_table_decode(value, index, key):
    keys = torch.tensor([to_int64(key)], dtype=torch.int64)
    assert pack_key(value, index) == key  # the Python model agrees with the table
    for ids, values in (
        localargmax.decode_keys(keys),
        localargmax.merge_keys(keys),
        localargmax.merge_keys(keys[None]),
    ):
        assert ids.dtype == torch.int64 and values.dtype == torch.float32
        assert int(ids[0]) == index and value_bits(values) == [decoded_bits(value)]


def special_and_random_floats(gen: torch.Generator, n: int) -> torch.Tensor:
    specials = [0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38, 1.17549435e-38]
    specials += [3.4028235e38, -3.4028235e38, 2.5, -2.5]
    bits = torch.randint(-(2**31), 2**31, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
    sign = torch.randint(0, 2, (n // 4,), generator=gen, dtype=torch.int32) << 31
    denormals = (torch.randint(0, 2**23, (n // 4,), generator=gen, dtype=torch.int32) | sign).view(torch.float32)
    halves = torch.randint(-8, 9, (n // 4,), generator=gen).float() * 0.5  # many exact duplicates
    return torch.cat([torch.tensor(specials), bits.view(torch.float32), denormals, halves])


@pytest.mark.parametrize("vocab_start", [0, 1, 77777, 2**31 - 1, 2**31, 2**32 - 2])
def test_keys_match_python_model(gen, vocab_start):
    """hidden = x (one column), weight = [[1.0]]: the logit of batch row b is
    exactly x[b], so every key is checkable against the Python model."""
    x = special_and_random_floats(gen, 4000)
    keys = localargmax.shard_argmax(x.view(-1, 1), torch.ones((1, 1)), vocab_start=vocab_start, num_valid=1)
    want = [to_int64(pack_key(v, vocab_start)) for v in x.tolist()]
    bad = [(i, float(x[i]), hex(to_uint64(int(keys[i])))) for i, w in enumerate(want) if int(keys[i]) != w]
    assert not bad, f"{len(bad)} keys differ from the model, e.g. {bad[:5]}"
    ids, values = localargmax.decode_keys(keys)
    assert bool((ids == vocab_start).all())
    assert value_bits(values) == [decoded_bits(v) for v in x.tolist()]


@pytest.mark.parametrize("vocab_start", [0, 77777, 2**31, 2**32 - 2])
def test_sampling_pack_keys_is_the_kernels(gen, vocab_start):
    """packed_key.pack_keys (the filtered step's keys from given shard logits)
    gives the fused kernel's key for every value: specials (NaN, -0.0,
    +-inf, denormals), random bits, duplicates, and ids up to the largest."""
    from localargmax.packed_key import pack_keys

    x = special_and_random_floats(gen, 4000)
    keys = localargmax.shard_argmax(x.view(-1, 1), torch.ones((1, 1)), vocab_start=vocab_start, num_valid=1)
    got = pack_keys(x, torch.full_like(x, vocab_start, dtype=torch.int64))
    bad = [(float(x[i]), hex(to_uint64(int(got[i])))) for i in (got != keys).nonzero()[:, 0].tolist()]
    assert not bad, f"{len(bad)} keys differ from the kernel's, e.g. {bad[:5]}"


def test_keys_sort_like_argmax(gen):
    """Unsigned key order == torch.argmax order: the max key over a set of
    entries is torch.argmax's answer over the same set."""
    x = special_and_random_floats(gen, 2000)
    for _ in range(200):
        vals = x[torch.randint(0, x.numel(), (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen)]
        keys = localargmax.shard_argmax(vals.view(-1, 1), torch.ones((1, 1)), num_valid=1)
        # "one key per batch row at index 0" -> the same value at index i
        entries = [to_int64((to_uint64(k) & ~0xFFFFFFFF) | (0xFFFFFFFF - i)) for i, k in enumerate(keys.tolist())]
        ids, _ = localargmax.merge_keys(torch.tensor(entries).view(-1, 1))
        assert int(ids[0]) == int(vals.double().argmax()), f"values {vals.tolist()}"


def test_largest_index_boundary():
    """Global indices up to 2**32 - 2 round-trip; near the top of the index
    range the winner is still decided by value, then by the smaller index."""
    top = localargmax.MAX_GLOBAL_INDEX
    assert top == 2**32 - 2
    weight = torch.tensor([[2.0], [3.0], [3.0]])
    keys = localargmax.shard_argmax(torch.tensor([[1.0], [-1.0]]), weight, vocab_start=top - 2, num_valid=3)
    ids, values = localargmax.decode_keys(keys)
    assert ids.tolist() == [top - 1, top - 2] and values.tolist() == [3.0, -2.0]
    keys = localargmax.shard_argmax(torch.tensor([[-5.0]]), torch.tensor([[INF]]), vocab_start=top, num_valid=1)
    assert int(keys[0]) != 0
    assert localargmax.decode_keys(keys)[0].tolist() == [top] and localargmax.decode_keys(keys)[1].tolist() == [-INF]


def test_bits_helpers_roundtrip():
    for u in (0, 1, 0x7F800000, 0x80000000, 0x3F800000):
        assert f32_bits(bits_f32(u)) == u


@settings(max_examples=2000, deadline=None)
@given(
    value=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    index=st.one_of(st.integers(0, 2**32 - 2), st.sampled_from([0, 1, 2**24 - 1, 2**24, 2**24 + 1, 2**31, 2**32 - 2])),
)
def test_decode_and_kernel_encoding(value, index):
    """decode_keys inverts the Python model of the key, and the kernel's own
    key of a one-entry shard (H = 1, hidden 1.0) is that model's key."""
    key = pack_key(value, index)
    ids, values = localargmax.decode_keys(torch.tensor([to_int64(key)]))
    assert int(ids[0]) == index and value_bits(values) == [decoded_bits(value)]  # -0.0 decodes as +0.0
    assert _key(torch.ones(1, 1), torch.tensor([[value]]), index) == key


@needs_gxx
def test_packed_key_cpp(tmp_path, seed):
    """tests/cpp/test_packed_key.cpp: the table, ordering and round-trip properties in C++."""
    check_cpp_test("test_packed_key", tmp_path, seed)


PACKED_KEY_MUTATIONS = {  # id: (text of csrc/common/packed_key.h, broken replacement)
    "no_negative_zero_fold": ("if (u == 0x80000000u) u = 0u;", ""),
    "nan_not_canonical": ("return 0xFFFFFFFFu;  // any NaN", "return u;"),
    "index_not_inverted": (
        "(0xFFFFFFFFu - static_cast<uint32_t>(global_index))",
        "(static_cast<uint32_t>(global_index))",
    ),
}


@needs_gxx
@pytest.mark.parametrize("mutation", list(PACKED_KEY_MUTATIONS))
def test_cpp_test_catches_broken_encoding(tmp_path, mutation):
    """The C++ test can fail: it does against a broken copy of packed_key.h."""
    run_against_mutation("test_packed_key", "packed_key.h", *PACKED_KEY_MUTATIONS[mutation], tmp_path)
