"""merge_keys and decode_keys: the unsigned max over ranks, the exact decode,
the d2t mapping, and their errors. Expected answers come from torch.argmax's
rules applied to the (value, index) entries directly, not from the key
encoding."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from tests.support.keys import allreduce_max, decoded_bits, pack_key, to_int64, unpack_key, unsigned_max, value_bits
from tests.support.paths import on
from tests.support.strategies import given, settings, st

POOL = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 2.0**-149, -(2.0**-149), 3.5, -2.5]


def random_entries(gen, tp, batch, *, empty_prob=0.2, tie_prob=0.3):
    """[tp][batch] of (value, index) or None (no entry: key 0); every batch row has an entry."""

    def draw():
        if float(torch.rand(1, generator=gen)) < tie_prob:
            value = POOL[int(torch.randint(0, len(POOL), (1,), generator=gen))]
        else:
            value = float(torch.randn(1, generator=gen).float())
        index = int(torch.randint(0, 2**32 - 1, (1,), generator=gen, dtype=torch.int64))
        if float(torch.rand(1, generator=gen)) < 0.3:
            index = int(torch.randint(0, 8, (1,), generator=gen))  # index ties across ranks too
        return value, index

    entries = [
        [None if float(torch.rand(1, generator=gen)) < empty_prob else draw() for _ in range(batch)] for _ in range(tp)
    ]
    for b in range(batch):
        if all(entries[r][b] is None for r in range(tp)):
            entries[0][b] = (float(torch.randn(1, generator=gen)), 5)
    return entries


def winner(cands):
    """torch.argmax's rule over (value, index) pairs: NaN above everything, -0 == +0, ties to the smaller index."""
    return max(cands, key=lambda e: (math.isnan(e[0]), 0.0 if math.isnan(e[0]) else e[0], -e[1]))


def keys_of(entries):
    return torch.tensor([[0 if e is None else to_int64(pack_key(*e)) for e in row] for row in entries])


def test_merge_keys_correctness(gen, path):
    """The correctness body of merge_keys on every device, and its opcheck."""
    for tp in (1, 2, 3, 4, 8):
        entries = random_entries(gen, tp, 300)
        keys = on(path, keys_of(entries))
        ids, values = localargmax.merge_keys(keys)
        assert ids.dtype == torch.int64 and values.dtype == torch.float32 and ids.shape == values.shape == (300,)
        want = [winner([row[b] for row in entries if row[b] is not None]) for b in range(300)]
        assert ids.tolist() == [i for _, i in want]
        assert value_bits(values.cpu()) == [decoded_bits(v) for v, _ in want]
        # rank order does not matter (max is commutative); non-contiguous keys are fine
        ids_p, values_p = localargmax.merge_keys(keys[torch.randperm(tp, generator=gen).to(keys.device)])
        assert torch.equal(ids_p, ids) and value_bits(values_p.cpu()) == value_bits(values.cpu())
        assert torch.equal(localargmax.merge_keys(keys.t().contiguous().t())[0], ids)
    d2t = on(path, torch.randint(0, 1000, (150,), generator=gen))
    keys = on(path, keys_of([[(float(v), int(i)) for v, i in zip(torch.randn(6), torch.randint(0, 150, (6,)))]] * 3))
    for args in [(keys, None), (keys, d2t), (keys[0], None), (keys[1], d2t), (keys[:, :0], None)]:
        torch.library.opcheck(torch.ops.localargmax.merge_keys.default, args)


def test_merge_compares_unsigned():
    """1.0's key has the top bit set (negative as int64), -1.0's does not: a signed max would pick -1.0."""
    k_pos, k_neg = to_int64(pack_key(1.0, 5)), to_int64(pack_key(-1.0, 0))
    assert k_pos < 0 < k_neg
    for order in ([k_pos, k_neg], [k_neg, k_pos]):
        ids, values = localargmax.merge_keys(torch.tensor(order).view(2, 1))
        assert ids.tolist() == [5] and values.tolist() == [1.0]


def test_one_dimensional_keys(gen):
    entries = random_entries(gen, 1, 100, empty_prob=0.0)[0]
    keys = keys_of([entries])[0]
    ids, values = localargmax.merge_keys(keys)
    assert ids.tolist() == [e[1] for e in entries]
    assert value_bits(values) == [decoded_bits(e[0]) for e in entries]
    ids2, values2 = localargmax.merge_keys(keys.view(1, -1))
    assert torch.equal(ids, ids2) and value_bits(values) == value_bits(values2)


@pytest.mark.parametrize("tp", [1, 3])
def test_d2t_maps_winning_draft_id(gen, tp):
    draft, target, batch = 500, 4000, 64
    target_ids = torch.sort(torch.randperm(target, generator=gen)[:draft]).values
    d2t = target_ids - torch.arange(draft)
    entries = [
        [
            (float(torch.randn(1, generator=gen)), int(torch.randint(0, draft, (1,), generator=gen)))
            for _ in range(batch)
        ]
        for _ in range(tp)
    ]
    keys = keys_of(entries)
    ids, values = localargmax.merge_keys(keys, d2t)
    plain, plain_values = localargmax.merge_keys(keys)
    assert torch.equal(values, plain_values)
    for b in range(batch):
        k = winner([row[b] for row in entries])[1]
        assert int(plain[b]) == k and int(ids[b]) == k + int(d2t[k]) == int(target_ids[k])
    d2t_strided = torch.stack([d2t, torch.zeros_like(d2t)], dim=1)[:, 0]  # a non-contiguous view
    assert not d2t_strided.is_contiguous() and torch.equal(localargmax.merge_keys(keys, d2t_strided)[0], ids)


def test_empty_batch():
    for shape in [(0,), (3, 0), (0, 0)]:
        ids, values = localargmax.merge_keys(torch.empty(shape, dtype=torch.int64))
        assert ids.shape == (0,) and values.shape == (0,)
        assert ids.dtype == torch.int64 and values.dtype == torch.float32


def test_merge_of_shard_argmax_keys_matches_one_big_shard(gen):
    """Merging the keys of any split of the vocabulary gives the key of the
    unsplit shard (the max is associative); values bit-exact."""
    hidden = torch.randn(9, 21, generator=gen)
    weight = torch.randn(700, 21, generator=gen)
    bounds = [0, *sorted(set(torch.randint(1, 700, (4,), generator=gen).tolist())), 700]
    parts = [
        localargmax.shard_argmax(hidden, weight[a:b].contiguous(), vocab_start=a) for a, b in zip(bounds, bounds[1:])
    ]
    ids, values = localargmax.merge_keys(torch.stack(parts))
    ids_w, values_w = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight))
    assert torch.equal(ids, ids_w) and value_bits(values) == value_bits(values_w)


raw_keys = st.one_of(
    st.just(0),
    st.tuples(st.integers(0, 2**32 - 1), st.integers(1, 2**32 - 1)).map(lambda t: (t[0] << 32) | t[1]),
    st.tuples(st.floats(width=32), st.integers(0, 2**32 - 2)).map(lambda t: pack_key(t[0], t[1])),
)


@settings(max_examples=800, deadline=None)
@given(data=st.data(), tp=st.integers(1, 5), batch=st.integers(0, 8))
def test_merge_keys_is_unsigned_max(data, tp, batch):
    """On raw keys: merge_keys == the unsigned max decoded by the Python model;
    all-reduce MAX of sign-flipped keys == unsigned max; merging is associative."""
    cols = []
    for _ in range(batch):
        col = data.draw(st.lists(raw_keys, min_size=tp, max_size=tp))
        if all(k == 0 for k in col):
            col[data.draw(st.integers(0, tp - 1))] = data.draw(raw_keys.filter(lambda k: k != 0))
        cols.append(col)
    keys = torch.tensor([[to_int64(cols[b][r]) for b in range(batch)] for r in range(tp)], dtype=torch.int64)
    ids, values = localargmax.merge_keys(keys.view(tp, batch))
    for b in range(batch):
        index, value = unpack_key(max(cols[b]))
        assert int(ids[b]) == index, cols[b]
        assert (math.isnan(value) and math.isnan(float(values[b]))) or float(values[b]) == value, cols[b]
    if batch:
        assert torch.equal(allreduce_max(keys), unsigned_max(keys))
        if tp > 1:
            halves = torch.cat([unsigned_max(keys[: tp // 2]), unsigned_max(keys[tp // 2 :])])
            assert torch.equal(localargmax.merge_keys(halves)[0], ids)


# ----------------------------------------------------------------------------- decode_keys


def test_decode_keys_shapes_and_round_trip(gen):
    values = torch.cat([torch.tensor(POOL), torch.randn(600, generator=gen)])[:600]
    index = torch.randint(0, 2**32 - 1, (600,), generator=gen, dtype=torch.int64)
    keys = torch.tensor([to_int64(pack_key(v, i)) for v, i in zip(values.tolist(), index.tolist())]).view(20, 30)
    ids, vals = localargmax.decode_keys(keys)
    assert ids.shape == vals.shape == (20, 30) and torch.equal(ids.flatten(), index)
    assert value_bits(vals) == [decoded_bits(v) for v in values.tolist()]
    ids_t, vals_t = localargmax.decode_keys(keys.t())  # non-contiguous input decodes the same
    assert torch.equal(ids_t, ids.t()) and value_bits(vals_t) == value_bits(vals.t())
    empty_ids, empty_vals = localargmax.decode_keys(torch.empty((0, 3), dtype=torch.int64))
    assert empty_ids.shape == empty_vals.shape == (0, 3)


# ----------------------------------------------------------------------------- bad input

KEY = torch.tensor([[to_int64(pack_key(1.0, 5))]])
ONE = to_int64(pack_key(1.0, 3))
BAD_MERGE = {  # (keys, d2t) -> exception, message; through the wrapper and the raw op
    "keys_3d": ((KEY.view(1, 1, 1), None), ValueError, "keys must be"),
    "keys_0d": ((KEY.view(()), None), ValueError, "keys must be"),
    "keys_int32": ((torch.ones(2, 3, dtype=torch.int32), None), TypeError, "keys must be int64"),
    "keys_float": ((torch.ones(2, 3), None), TypeError, "keys must be int64"),
    "keys_uint64": ((torch.ones(2, 3, dtype=torch.uint64), None), TypeError, "keys must be int64"),
    "keys_zero_ranks": ((torch.empty(0, 3, dtype=torch.int64), None), ValueError, "0 ranks"),
    "d2t_2d": ((KEY, torch.zeros(8, 1, dtype=torch.int64)), ValueError, "d2t must be 1-D"),
    "d2t_int32": ((KEY, torch.zeros(8, dtype=torch.int32)), TypeError, "d2t must be int64"),
    "d2t_float": ((KEY, torch.zeros(8)), TypeError, "d2t must be int64"),
    "no_valid_entry": ((torch.tensor([[ONE, 0], [0, 0]]), None), ValueError, "no valid"),
    "id_outside_d2t": (
        (torch.tensor([ONE, to_int64(pack_key(1.0, 10))]), torch.zeros(10, dtype=torch.int64)),
        ValueError,
        "outside d2t",
    ),
    "id_outside_empty_d2t": ((torch.tensor([ONE]), torch.zeros(0, dtype=torch.int64)), ValueError, "outside d2t"),
}


@pytest.mark.parametrize("via", ["wrapper", "op"])
@pytest.mark.parametrize("case", list(BAD_MERGE))
def test_merge_keys_rejects(case, via):
    (keys, d2t), exc, match = BAD_MERGE[case]
    fn = localargmax.merge_keys if via == "wrapper" else torch.ops.localargmax.merge_keys.default
    with pytest.raises(exc, match=match):
        fn(keys, d2t)


def test_zero_key_beside_a_real_one_is_fine():
    """An all-padding rank's key 0 takes part in the merge without winning; d2t long enough is fine."""
    assert localargmax.merge_keys(torch.tensor([[ONE], [0]]))[0].tolist() == [3]
    assert localargmax.merge_keys(torch.tensor([ONE]), torch.zeros(10, dtype=torch.int64))[0].tolist() == [3]


BAD_DECODE = {
    "no_entry_key": (torch.tensor([ONE, 0]), ValueError, "no valid"),
    "int32": (torch.tensor([1, 2], dtype=torch.int32), TypeError, "keys"),
    "list": ([1, 2], TypeError, "keys"),
}


@pytest.mark.parametrize("case", list(BAD_DECODE))
def test_decode_keys_rejects(case):
    keys, exc, match = BAD_DECODE[case]
    with pytest.raises(exc, match=match):
        localargmax.decode_keys(keys)


def test_non_tensor_arguments():
    with pytest.raises(TypeError, match="keys"):
        localargmax.merge_keys([1, 2])
    with pytest.raises(TypeError, match="d2t"):
        localargmax.merge_keys(torch.ones(2, dtype=torch.int64), d2t=[0, 0])
