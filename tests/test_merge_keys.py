"""merge_keys: unsigned max over ranks, exact decode, d2t mapping, and the CPU
errors for rows without a valid entry / ids outside d2t. Expected answers come
from torch.argmax's rules applied to the (value, index) entries directly, not
from the key encoding."""
from __future__ import annotations

import math

import pytest
import torch

import localargmax
from helpers import f32_bits, py_pack_key, to_int64

CANONICAL_NAN_BITS = 0x7FC00000


def _random_entries(gen, tp, batch, *, empty_prob=0.2, tie_prob=0.3):
    """[tp][batch] of (value, index) or None (no entry: key 0)."""
    pool = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 2.0**-149, -(2.0**-149), 3.5, -2.5]
    entries = []
    for _ in range(tp):
        row = []
        for _ in range(batch):
            r = float(torch.rand(1, generator=gen))
            if r < empty_prob:
                row.append(None)
                continue
            if float(torch.rand(1, generator=gen)) < tie_prob:
                value = pool[int(torch.randint(0, len(pool), (1,), generator=gen))]
            else:
                value = float(torch.randn(1, generator=gen).float())
            index = int(torch.randint(0, 2**32 - 1, (1,), generator=gen, dtype=torch.int64))
            if float(torch.rand(1, generator=gen)) < 0.3:
                index = int(torch.randint(0, 8, (1,), generator=gen))  # index ties across ranks too
            row.append((value, index))
        entries.append(row)
    return entries


def _winner(cands):
    """torch.argmax's rule over (value, index) pairs: NaN above everything,
    -0 == +0, ties to the smaller index."""
    def rank(e):
        value, index = e
        return (1 if math.isnan(value) else 0, 0.0 if math.isnan(value) else value, -index)

    return max(cands, key=rank)


def _keys_of(entries):
    return torch.tensor(
        [[0 if e is None else to_int64(py_pack_key(*e)) for e in row] for row in entries], dtype=torch.int64
    )


def _decoded_bits(value):
    if math.isnan(value):
        return CANONICAL_NAN_BITS
    b = f32_bits(value)
    return 0 if b == 0x80000000 else b


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_merge_matches_argmax_rules(gen, tp):
    batch = 300
    entries = _random_entries(gen, tp, batch)
    # every batch row needs at least one entry
    for b in range(batch):
        if all(entries[r][b] is None for r in range(tp)):
            entries[0][b] = (float(torch.randn(1, generator=gen)), 5)
    keys = _keys_of(entries)
    ids, values = localargmax.merge_keys(keys)
    assert ids.dtype == torch.int64 and values.dtype == torch.float32
    assert ids.shape == (batch,) and values.shape == (batch,)
    for b in range(batch):
        value, index = _winner([entries[r][b] for r in range(tp) if entries[r][b] is not None])
        assert int(ids[b]) == index, f"row {b}: {[entries[r][b] for r in range(tp)]}"
        got_bits = int(values.view(torch.int32)[b]) & 0xFFFFFFFF
        assert got_bits == _decoded_bits(value), f"row {b}: value bits {got_bits:#x}"
    # rank order does not matter (max is commutative)
    perm = torch.randperm(tp, generator=gen)
    ids_p, values_p = localargmax.merge_keys(keys[perm])
    assert torch.equal(ids_p, ids)
    assert torch.equal(values_p.view(torch.int32), values.view(torch.int32))
    # non-contiguous keys ([B, tp] transposed) give the same result
    ids_t, _ = localargmax.merge_keys(keys.t().contiguous().t())
    assert torch.equal(ids_t, ids)


def test_merge_compares_unsigned():
    """1.0's key has the top bit set (negative as int64), -1.0's does not: a
    signed max would pick -1.0."""
    k_pos = to_int64(py_pack_key(1.0, 5))
    k_neg = to_int64(py_pack_key(-1.0, 0))
    assert k_pos < 0 < k_neg
    for order in ([k_pos, k_neg], [k_neg, k_pos]):
        ids, values = localargmax.merge_keys(torch.tensor(order).view(2, 1))
        assert ids.tolist() == [5] and values.tolist() == [1.0]


def test_one_dimensional_keys(gen):
    batch = 100
    entries = _random_entries(gen, 1, batch, empty_prob=0.0)[0]
    keys = _keys_of([entries])[0]
    ids, values = localargmax.merge_keys(keys)
    assert ids.tolist() == [e[1] for e in entries]
    assert [int(v) & 0xFFFFFFFF for v in values.view(torch.int32).tolist()] == [_decoded_bits(e[0]) for e in entries]
    ids2, values2 = localargmax.merge_keys(keys.view(1, -1))
    assert torch.equal(ids, ids2) and torch.equal(values.view(torch.int32), values2.view(torch.int32))


@pytest.mark.parametrize("tp", [1, 3])
def test_d2t_maps_winning_draft_id(gen, tp):
    draft, target = 500, 4000
    target_ids = torch.sort(torch.randperm(target, generator=gen)[:draft]).values
    d2t = target_ids - torch.arange(draft)
    batch = 64
    entries = [
        [(float(torch.randn(1, generator=gen)), int(torch.randint(0, draft, (1,), generator=gen))) for _ in range(batch)]
        for _ in range(tp)
    ]
    keys = _keys_of(entries)
    ids, values = localargmax.merge_keys(keys, d2t)
    plain, plain_values = localargmax.merge_keys(keys)
    assert torch.equal(values, plain_values)
    for b in range(batch):
        k = _winner([entries[r][b] for r in range(tp)])[1]
        assert int(plain[b]) == k
        assert int(ids[b]) == k + int(d2t[k]) == int(target_ids[k])
    # a non-contiguous d2t view works the same
    d2t_strided = torch.stack([d2t, torch.zeros_like(d2t)], dim=1)[:, 0]
    assert not d2t_strided.is_contiguous()
    ids_s, _ = localargmax.merge_keys(keys, d2t_strided)
    assert torch.equal(ids_s, ids)


def test_no_valid_entry_raises():
    keys = torch.tensor([[to_int64(py_pack_key(1.0, 3)), 0], [0, 0]], dtype=torch.int64)
    with pytest.raises(ValueError, match="no valid"):
        localargmax.merge_keys(keys)
    with pytest.raises(ValueError, match="no valid"):
        torch.ops.localargmax.merge_keys.default(keys, None)
    # a zero key beside a real one is fine (an all-padding rank)
    ids, _ = localargmax.merge_keys(keys[:, :1])
    assert ids.tolist() == [3]


def test_winning_id_outside_d2t_raises():
    keys = torch.tensor([to_int64(py_pack_key(1.0, 2)), to_int64(py_pack_key(1.0, 10))], dtype=torch.int64)
    d2t = torch.zeros(10, dtype=torch.int64)
    with pytest.raises(ValueError, match="outside d2t"):
        localargmax.merge_keys(keys, d2t)
    with pytest.raises(ValueError, match="outside d2t"):
        torch.ops.localargmax.merge_keys.default(keys, d2t)
    ids, _ = localargmax.merge_keys(keys[:1], d2t)
    assert ids.tolist() == [2]
    with pytest.raises(ValueError, match="outside d2t"):
        localargmax.merge_keys(keys[:1], torch.zeros(0, dtype=torch.int64))


def test_empty_batch():
    for shape in [(0,), (3, 0), (0, 0)]:
        ids, values = localargmax.merge_keys(torch.empty(shape, dtype=torch.int64))
        assert ids.shape == (0,) and values.shape == (0,)
        assert ids.dtype == torch.int64 and values.dtype == torch.float32


def test_merge_of_shard_argmax_keys_matches_one_big_shard(gen):
    """Merging the keys of any split of the vocabulary gives the same key as
    the unsplit shard (the max is associative); values bit-exact."""
    hidden = torch.randn(9, 21, generator=gen)
    weight = torch.randn(700, 21, generator=gen)
    whole = localargmax.shard_argmax(hidden, weight)
    cuts = sorted(set(torch.randint(1, 700, (4,), generator=gen).tolist()))
    bounds = [0] + cuts + [700]
    parts = [
        localargmax.shard_argmax(hidden, weight[a:b].contiguous(), vocab_start=a) for a, b in zip(bounds, bounds[1:])
    ]
    ids, values = localargmax.merge_keys(torch.stack(parts))
    ids_w, values_w = localargmax.decode_keys(whole)
    assert torch.equal(ids, ids_w)
    assert torch.equal(values.view(torch.int32), values_w.view(torch.int32))
