"""The sampling steps' Philox noise and the filters' Gumbel-max
(localargmax.sampling.noise, localargmax.sampling.filters): the noise bit for
bit as the kernels draw it, the op's shapes, threads, compile and bad input;
the fallback's Gumbel-max evaluating the noise only where it can win, exact
against evaluating it everywhere."""

from __future__ import annotations

import math

import pytest
import torch

import localargmax
from localargmax.sampling import filters, gumbel_noise
from localargmax.sampling import noise as nf
from tests.test_filtered_sampling import mixed_rows


def test_noise_is_the_kernels_bit_for_bit(seed):
    """gumbel_noise at (seed, row, id) equals the sampling kernel's noise:
    a one-row shard at id ``v`` with logit 0 and T = 1 scores exactly ``g``."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(64, 8, generator=gen)
    s = int(torch.randint(0, 2**62, (1,), generator=gen)) * 2 + 1
    for start in (0, 1, 4097, 2**31 + 5, 2**32 - 2):
        for offset in (0, 2**32 - 7, 2**62 + 3, 2**63 - 5):  # the last: offset + b past 2**63 - 1 (uint64)
            keys = localargmax.shard_sample(hidden, torch.zeros(1, 8), torch.ones(64), s, offset, vocab_start=start)
            got = gumbel_noise(s, torch.arange(64) + offset, torch.full((64,), start))
            assert torch.equal(localargmax.decode_keys(keys)[1].view(torch.int32), got.view(torch.int32))
            whole = nf._gumbel(nf._philox(s, torch.arange(64) + offset, torch.full((64,), start)))
            assert torch.equal(whole.view(torch.int32), got.view(torch.int32))  # the torch formula (other devices)


def test_noise_op_shapes_threads_compile_and_bad_input(seed):
    """The CPU op localargmax::gumbel_noise: broadcast [n, 1] x [1, m] rows
    and ids (64-bit, beyond 2**32) equal the torch formula bit for bit, on
    1 and 2 threads and compiled; opcheck; a negative seed, row or id, a
    dtype or a shape mismatch raise naming it."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 2**62, (37, 1), generator=gen)
    ids = torch.randint(0, 2**33, (1, 5003), generator=gen)
    want = nf._gumbel(nf._philox(seed, *torch.broadcast_tensors(rows, ids)))
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert torch.equal(gumbel_noise(seed, rows, ids).view(torch.int32), want.view(torch.int32)), n
    finally:
        torch.set_num_threads(threads)
    compiled = torch.compile(lambda r, i: gumbel_noise(seed, r, i), fullgraph=True)
    assert torch.equal(compiled(rows, ids).view(torch.int32), want.view(torch.int32))
    op = torch.ops.localargmax.gumbel_noise.default
    torch.library.opcheck(op, (seed, rows.expand(37, 64).contiguous(), ids[:, :64].expand(37, 64).contiguous()))
    assert gumbel_noise(seed, rows[:0], ids).shape == (0, 5003)
    one = torch.zeros(3, dtype=torch.int64)
    for args, match in [
        ((-1, one, one), "seed must be >= 0"),
        ((seed, one, one - 1), "ids must be >= 0"),
        ((seed, one.int(), one), "must be int64"),
        ((seed, one, torch.zeros(4, dtype=torch.int64)), "one shape"),
        ((seed, one, one.to("meta")), "one device"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            op(*args)
    for args, error, match in [  # the wrapper, on any device
        ((-1, one, one), ValueError, r"seed must be an int in \[0, 2\*\*63\)"),
        ((2**63, one, one), ValueError, "seed must be"),
        ((True, one, one), ValueError, "seed must be"),
        ((torch.tensor(1.5), one, one), ValueError, "seed must be"),
        ((seed, one.int(), one), TypeError, "must be int64"),
        ((seed, one, one.float().to("meta")), TypeError, "must be int64"),
        ((seed, one, one.to("meta")), ValueError, "one device"),
        ((seed, one.to("meta"), one.to("meta") + 1), None, None),  # meta: no data, no check of values
        ((seed, one, torch.zeros(4, dtype=torch.int64)), ValueError, r"rows \(3,\) and ids \(4,\) must broadcast"),
    ]:
        if error is None:
            assert gumbel_noise(*args).device.type == "meta"
            continue
        with pytest.raises(error, match=match):
            gumbel_noise(*args)
    wrapped = torch.tensor([-(2**63), -1])  # uint64 rows 2**63 and 2**64 - 1: the torch formula's bits
    assert torch.equal(gumbel_noise(seed, wrapped, one[:2]), nf._gumbel(nf._philox(seed, wrapped, one[:2])))


def _argmax_everywhere(ys, ids, keep, seed, rows):
    """The fallback's argmax with the noise at every id (its former method)."""
    g = gumbel_noise(seed, rows[:, None], ids).to(torch.float64)
    return torch.where(keep, ys + g, -math.inf).argmax(dim=1, keepdim=True)


def _tied_rows_with_gaps(gen, n, vocab):
    """``(logits [n, vocab] float32, scale [n, 1])``: rows of mixed sharpness
    ``scale``, with value ties with a head id (ids 700..899 equal id 3) and
    NaN gaps between shards (ids 100..299 of every fifth row)."""
    scale = torch.tensor([0.05, 0.5, 3.0, 30.0])[torch.randint(4, (n, 1), generator=gen)]
    logits = torch.randn(n, vocab, generator=gen) * scale
    logits[:, 700:900] = logits[:, 3:4]
    logits[::5, 100:300] = math.nan
    return logits, scale


@pytest.mark.parametrize("dense", [0.0, 2.0], ids=["dense-noise", "indexed-noise"])
def test_fallback_noise_where_it_can_win_is_exact(seed, dense, monkeypatch):
    """filter_and_sample evaluates the noise only where an id can beat the
    best of the first _HEAD sorted ids (g <= 22.87): the same ids and
    log-probs as evaluating it at every id, on wide and narrow top-p / min-p
    / top-k sets, flat and sharp rows, value ties and NaN gaps; and
    _gumbel_argmax keeps the first of planted exact score ties past the head,
    also with holes in the allowed set and none of it in the head. The noise
    evaluated everywhere at once and at the needed entries alone."""
    monkeypatch.setattr(filters, "_DENSE_NOISE", dense)
    gen = torch.Generator().manual_seed(seed)
    n, vocab = 40, 1500
    logits, scale = _tied_rows_with_gaps(gen, n, vocab)
    t, k, p, mp = mixed_rows(gen, n)
    t, p = torch.where(t > 0, t, 1.5), torch.where(torch.arange(n) % 4 == 0, 0.99, p)
    mp = torch.where(torch.arange(n) % 7 == 0, 0.001, mp)
    k = torch.where(torch.arange(n) % 6 == 0, 1200, k)
    args = (logits, t, k, p.double(), mp.double(), seed, torch.arange(n) + 2**40)
    ys, ids, keep, a = filters.filter_sorted(*args[:5])
    assert int(keep.sum(dim=1).max()) > 1000 and int(keep.sum(dim=1).min()) <= 5, "wide and narrow sets planted"
    best = _argmax_everywhere(ys, ids, keep, seed, args[-1])
    got_ids, got_lp = filters.filter_and_sample(*args)
    assert torch.equal(got_ids, ids.gather(1, best)[:, 0])
    w = torch.where(keep, torch.exp(ys - a), 0.0)
    want_lp = (ys.gather(1, best) - a)[:, 0] - torch.log(w.sum(dim=1))
    torch.testing.assert_close(got_lp, want_lp, rtol=1e-12, atol=1e-12)  # min-p rows sum in id order

    ys = torch.randn(n, vocab, generator=gen, dtype=torch.float64) * scale.double()  # unsorted: any order
    keep = torch.rand(n, vocab, generator=gen) < 0.7
    keep[::4, : filters._HEAD] = False  # no allowed id in the head: every allowed id is evaluated
    rows = torch.arange(n) + seed
    g = gumbel_noise(seed, rows[:, None], ids).to(torch.float64)
    i, j = (
        torch.randint(filters._HEAD, vocab // 2, (n,), generator=gen),
        torch.randint(vocab // 2, vocab, (n,), generator=gen),
    )
    top = (ys + 30.0).max(dim=1).values.floor()  # a multiple of 1: S - g and (S - g) + g are exact
    for pos in (i, j):
        ys[torch.arange(n), pos] = top - g[torch.arange(n), pos]
    keep[torch.arange(n), j] = True
    keep[1::3][torch.arange(len(range(1, n, 3))), i[1::3]] = False  # the later tie wins where the first is not allowed
    assert ((ys + g).gather(1, i[:, None]) == (ys + g).gather(1, j[:, None])).all()
    want = _argmax_everywhere(ys, ids, keep, seed, rows)
    assert torch.equal(filters._gumbel_argmax(ys, ids, keep, seed, rows), want)
    assert torch.equal(want[:, 0], torch.where(keep[torch.arange(n), i], i, j))


@pytest.mark.parametrize("dense", [0.0, 2.0], ids=["dense-noise", "indexed-noise"])
def test_min_p_rows_skip_the_sort_with_the_same_result(seed, dense, monkeypatch):
    """Rows whose only filter is min-p (or none) take the id-order path
    (_filter_by_id): the same ids and log-probs as the sorted path with the
    noise at every id, alone and mixed with sorted rows in one call; and its
    argmax breaks planted exact score ties as the sorted order does (the
    larger value first, then the smaller id), with the head's ids not allowed."""
    monkeypatch.setattr(filters, "_DENSE_NOISE", dense)
    gen = torch.Generator().manual_seed(seed)
    n, vocab = 48, 1500
    logits, scale = _tied_rows_with_gaps(gen, n, vocab)
    t = torch.tensor([0.5, 1.0, 1.7])[torch.randint(3, (n,), generator=gen)]
    mp = torch.tensor([0.0, 1e-4, 0.05, 0.3])[torch.randint(4, (n,), generator=gen)].double()
    k = torch.where(torch.arange(n) % 3 == 0, vocab + 7, 0)  # k > V and k = 0: both off
    p = torch.where(torch.arange(n) % 4 == 1, 0.9, 1.0).double()  # a quarter of the rows sorted (top-p)
    rows = torch.arange(n) + 2**33
    ys, ids, keep, a = filters.filter_sorted(logits, t, k, p, mp)
    best = _argmax_everywhere(ys, ids, keep, seed, rows)
    w = torch.where(keep, torch.exp(ys - a), 0.0)
    want_ids, want_lp = ids.gather(1, best)[:, 0], (ys.gather(1, best) - a)[:, 0] - torch.log(w.sum(dim=1))
    assert int(keep.sum(dim=1).max()) > 1000 and int(keep.sum(dim=1).min()) <= 5, "wide and narrow sets planted"
    unsorted = p >= 1
    for rows_of in (unsorted, torch.ones(n, dtype=torch.bool)):  # the min-p rows alone, then mixed
        got_ids, got_lp = filters.filter_and_sample(
            logits[rows_of], t[rows_of], k[rows_of], p[rows_of], mp[rows_of], seed, rows[rows_of]
        )
        assert torch.equal(got_ids, want_ids[rows_of])
        torch.testing.assert_close(got_lp, want_lp[rows_of], rtol=1e-12, atol=1e-12)  # the sum's order differs

    y = torch.randn(n, vocab, generator=gen, dtype=torch.float64) * scale.double()
    allowed = torch.rand(n, vocab, generator=gen) < 0.7
    allowed[::4] &= y[::4] < y[::4].topk(filters._HEAD, dim=1).values[:, -1:]  # no allowed id in the head
    g = gumbel_noise(seed, rows[:, None], torch.arange(vocab)[None]).to(torch.float64)
    top = (y + 30.0).max(dim=1).values.floor()
    i = torch.randint(0, vocab // 2, (n,), generator=gen)
    j = torch.randint(vocab // 2, vocab, (n,), generator=gen)
    r = torch.arange(n)
    for pos in (i, j):
        y[r, pos] = top - g[r, pos]
        allowed[r, pos] = True
    assert ((y + g)[r, i] == (y + g)[r, j]).all() and (y[r, i] != y[r, j]).all()
    order = torch.sort(y, dim=1, descending=True, stable=True)
    want = order.indices.gather(
        1, _argmax_everywhere(order.values, order.indices, allowed.gather(1, order.indices), seed, rows)
    )
    assert torch.equal(filters._gumbel_argmax_by_id(y, allowed, seed, rows), want)
    assert torch.equal(want[:, 0], torch.where(y[r, i] > y[r, j], i, j))  # the larger value wins the tie
