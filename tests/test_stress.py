"""Stress (marker ``slow``, deselected by default): 10,000 random
sharded-argmax cases across tp = 1..4 with planted hard cases, against the
float64 reference; 400 random layouts of random data; a real-gloo round of
random cases (both reduce modes) with misbehaving ranks mixed in.

Run with ``python -m pytest -m slow -s`` (prints the counts). Set
``LOCALARGMAX_TEST_SEED`` to replay a run; ``LOCALARGMAX_STRESS_CASES`` to
change the number of in-process cases (default 10,000).
"""

from __future__ import annotations

import faulthandler
import math
import os
import random
import time
from collections import Counter

import pytest
import torch

import localargmax
from localargmax import envs
from tests.support.keys import allreduce_max, unsigned_max
from tests.support.launch import launch, live_descendants, timed
from tests.support.problems import (
    PAD_KINDS,
    full_bias,
    layout_kwargs,
    make_shards,
    random_problem,
    shard_keys,
    sharded_argmax,
    simulated_argmax,
)
from tests.support.reference import check_against_reference, error_bound, judge, ref_logits
from tests.support.strategies import lowest_exponents

pytestmark = pytest.mark.slow

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
EXP_HIGH = {torch.float32: 60, torch.bfloat16: 60, torch.float16: 10}
"""The largest exponent of an exact case's inputs (the smallest: strategies.lowest_exponents)."""
FAULTS = tuple(
    "padding_would_win nan_later_rank nan_two_ranks pos_inf all_neg_inf ties_across_ranks "
    "zero_hidden_row index_above_2pow24 denormal_logits smallest_normal_logits d2t empty_shards neg_zero_rows".split()
)


def _case(rng: random.Random, tp: int):
    """One random problem. Returns (hidden, weight, bias, shards, offset, d2t,
    exact, faults): ``exact`` when the data makes float32 and float64 logits
    identical (small integers times powers of two), so ids must match
    exactly; otherwise Gaussian data checked with the near-tie rule."""
    gen = torch.Generator().manual_seed(rng.getrandbits(62))
    dtype = rng.choice(DTYPES)
    batch = rng.randint(1, 16)
    vocab = max(1, int(math.exp(rng.uniform(0, math.log(2500)))))
    hsize = rng.choice([1, 2, 3, 7, 8, 16, 31, 33, 64, 65, 100, 160]) if rng.random() < 0.7 else rng.randint(1, 160)
    pad_to = rng.choice([1, 2, 8, 64, 128, rng.randint(1, 128)])
    pad = rng.choice(PAD_KINDS)
    exact = rng.random() < 0.7
    faults = []
    if exact:
        # subnormal inputs and products only where auto's path for this dtype keeps them (AMX tiles
        # flush them): there the smallest normal ones instead, under their own fault name
        (lo, low_product), hi = lowest_exponents(dtype), EXP_HIGH[dtype]
        if rng.random() < 0.1:
            eh = lo
            ew = max(lo, low_product - eh)
            faults.append("denormal_logits" if low_product < -126 else "smallest_normal_logits")
        else:
            eh = rng.randint(max(lo, -20), min(hi, 20))
            ew = rng.randint(max(lo, low_product - eh, -20), min(hi, 20))
        hidden = (torch.randint(-7, 8, (batch, hsize), generator=gen).double() * 2.0**eh).to(dtype)
        weight = (torch.randint(-7, 8, (vocab, hsize), generator=gen).double() * 2.0**ew).to(dtype)
        bias = None
        if rng.random() < 0.5:
            bias = (torch.randint(-64, 65, (vocab,), generator=gen).double() * 2.0 ** (eh + ew)).float()
    else:
        hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
        weight = (torch.randn(vocab, hsize, generator=gen) / math.sqrt(hsize)).to(dtype)
        bias = (torch.randn(vocab, generator=gen) * 0.5) if rng.random() < 0.5 else None
        if hsize >= 32 and vocab >= batch:  # planted clear winners
            winners = torch.randperm(vocab, generator=gen)[:batch]
            h = hidden.float()
            weight[winners] = (6.0 * h / (h * h).sum(dim=1, keepdim=True)).to(dtype)
            if bias is not None:
                bias[winners] = bias.max()
    layouts = [localargmax.shard_vocab(vocab, r, tp, pad_to) for r in range(tp)]
    nonempty = [s for s in layouts if s.num_valid]
    # ---- planted hard cases
    if rng.random() < 0.25 and len(nonempty) > 1:  # exact ties: batch row 0's winner copied into other shards
        src = int(ref_logits(hidden[:1], weight, bias).argmax())
        for s in rng.sample(nonempty, k=min(len(nonempty), 3)):
            weight[s.vocab_start + rng.randrange(s.num_valid)] = weight[src]
        faults.append("ties_across_ranks")
    if rng.random() < 0.1:
        bias = torch.zeros(vocab) if bias is None else bias.clone()
        last = nonempty[-1]
        bias[last.vocab_start + rng.randrange(last.num_valid)] = float("nan")
        faults.append("nan_later_rank")
        if len(nonempty) > 1 and rng.random() < 0.5:
            mid = nonempty[len(nonempty) // 2 - 1]
            bias[mid.vocab_start + rng.randrange(mid.num_valid)] = float("nan")
            faults.append("nan_two_ranks")
    if rng.random() < 0.08:
        bias = torch.zeros(vocab) if bias is None else bias.clone()
        bias[rng.randrange(vocab)] = float("inf")
        faults.append("pos_inf")
    if rng.random() < 0.04:
        bias = torch.full((vocab,), float("-inf"))
        faults.append("all_neg_inf")
    if rng.random() < 0.1:
        hidden[rng.randrange(batch)] = 0.0
        faults.append("zero_hidden_row")
    if rng.random() < 0.05:
        weight[rng.randrange(vocab)] = -0.0
        faults.append("neg_zero_rows")
    shards = make_shards(weight, bias, tp, pad_to, hidden=hidden, pad=pad)
    if any(s.rows > s.num_valid for *_, s in shards):
        faults.append("padding_would_win")
    if any(s.num_valid == 0 for *_, s in shards):
        faults.append("empty_shards")
    offset = 0
    if rng.random() < 0.15:
        span = tp * shards[0][2].rows
        offset = rng.randint(2**24 + 1, localargmax.MAX_GLOBAL_INDEX - span + 1)
        shards = [(w, b, s._replace(vocab_start=s.vocab_start + offset)) for w, b, s in shards]
        faults.append("index_above_2pow24")
    d2t = None
    if offset == 0 and rng.random() < 0.15:
        d2t = localargmax.build_d2t(torch.randint(0, 100, (vocab + rng.randint(0, 3 * vocab),), generator=gen), vocab)
        faults.append("d2t")
    b_full = full_bias(bias, shards, vocab)
    return hidden, weight, b_full, shards, offset, d2t, exact, faults


def _judge(ids, hidden, weight, bias, exact):
    """(wrong, near_tie_rows): ``wrong`` counts rows that break the contract."""
    logits = ref_logits(hidden, weight, bias)
    if exact:
        return int((ids != logits.argmax(dim=1)).sum()), 0
    out_of_range = (ids < 0) | (ids >= logits.shape[1])
    if bool(out_of_range.any()):
        return int(out_of_range.sum()), 0
    err = error_bound(hidden, weight, bias)
    clear, wrong, too_far = judge(ids, logits, torch.where(torch.isfinite(logits), err, torch.zeros_like(err)))
    return int(wrong.sum() + too_far.sum()), int((~clear).sum())


def test_stress_random_layouts(gen):
    """400 random (dtype, H, B, V, tp, pad_to, bias, padding fill) problems of
    random data, each against the float64 reference."""
    dtypes, biases = (torch.float32, torch.bfloat16, torch.float16), (None, "float32", "weight")

    def pick(seq):
        return seq[int(torch.randint(0, len(seq), (1,), generator=gen))]

    for it in range(400):
        dtype, bias, pad = pick(dtypes), pick(biases), pick(PAD_KINDS)
        hsize, batch, vocab, tp = (int(torch.randint(1, n + 1, (1,), generator=gen)) for n in (160, 40, 4000, 8))
        pad_to = pick([1, 2, 8, 64, 128])
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, bias)
        ids, _ = sharded_argmax(hidden, weight, b, tp=tp, pad_to=pad_to, pad=pad)
        ctx = f"it={it} {dtype} H={hsize} B={batch} V={vocab} bias={bias} tp={tp} pad_to={pad_to} fill={pad}"
        check_against_reference(ids, hidden, weight, b, min_clear_fraction=0.5, context=ctx)


def test_stress_random_cases(seed):
    n_cases = envs.LOCALARGMAX_STRESS_CASES
    rng = random.Random(seed)
    stats = Counter()
    fault_counts = Counter()
    worst = 0.0
    t_start = time.monotonic()
    try:
        for i in range(n_cases):
            faulthandler.dump_traceback_later(300, exit=True)  # a case that hangs aborts with a traceback
            tp = 1 + i % 4
            t0 = time.monotonic()
            hidden, weight, bias, shards, offset, d2t, exact, faults = _case(rng, tp)
            fault_counts.update(faults)
            try:
                keys = shard_keys(hidden, shards)
                ids_gather, _ = localargmax.merge_keys(keys)
                # the all-reduce semantic: sign-flipped signed max == unsigned max
                reduced = allreduce_max(keys)
                if i % 50 == 0:
                    assert torch.equal(reduced, unsigned_max(keys)), f"case {i}"
                ids_reduce, _ = localargmax.merge_keys(reduced)
                # the public step on every simulated rank, both reduce modes
                ids_step = simulated_argmax(hidden, shards, reduce=rng.choice(("all_gather", "all_reduce")), d2t=d2t)
                draft = ids_gather - offset
                wrong, near = _judge(draft, hidden, weight, bias, exact)
                if not torch.equal(ids_reduce, ids_gather):
                    wrong += int((ids_reduce != ids_gather).sum())
                want_step = ids_gather if d2t is None else ids_gather + d2t[ids_gather]
                if not torch.equal(ids_step, want_step):
                    wrong += int((ids_step != want_step).sum())
            except Exception as e:  # noqa: BLE001 - an exception is a wrong answer too
                stats["errors"] += 1
                wrong, near = hidden.shape[0], 0
                ids_gather = torch.full((hidden.shape[0],), -1)
                if stats["errors"] <= 3:
                    print(f"case {i} raised {type(e).__name__}: {e}")
            stats["cases"] += 1
            stats["rows"] += hidden.shape[0]
            stats["exact_cases"] += int(exact)
            stats[f"tp{tp}"] += 1
            stats["near_tie_rows"] += near
            stats["wrong_ids"] += wrong
            if wrong:
                stats["failing_cases"] += 1
                if stats["failing_cases"] <= 5:
                    print(
                        f"case {i} (seed {seed}) WRONG: tp={tp} V={weight.shape[0]} H={weight.shape[1]} "
                        f"B={hidden.shape[0]} {hidden.dtype} exact={exact} faults={faults} offset={offset} "
                        f"layouts={[tuple(s) for *_, s in shards]} ids={ids_gather.tolist()}"
                    )
            worst = max(worst, time.monotonic() - t0)
    finally:
        faulthandler.cancel_dump_traceback_later()
    elapsed = time.monotonic() - t_start
    print(f"\nstress (seed {seed}): {dict(stats)}")
    print(f"faults injected: {sum(fault_counts.values())} {dict(fault_counts)}")
    print(f"hangs: 0 (slowest case {worst:.2f} s); wrong ids: {stats['wrong_ids']}; {elapsed:.1f} s")
    assert stats["cases"] == n_cases
    assert stats["wrong_ids"] == 0, (
        f"{stats['failing_cases']} cases with wrong ids or errors ({stats['errors']} raised) (seed {seed})"
    )


# -----------------------------------------------------------------------------
# Real gloo ranks: random cases through lm_head_argmax, both reduce modes,
# and now and then a rank that disagrees (LOCALARGMAX_DEBUG=1 refuses it on
# every rank, and the group goes on).
# -----------------------------------------------------------------------------

GLOO_CASES_PER_TP = 250


def _gloo_cases(seed: int, tp: int):
    rng = random.Random(seed * 10 + tp)
    return [_case(rng, tp) for _ in range(GLOO_CASES_PER_TP)]


def _gloo_worker(rank, world, seed):
    import torch.distributed as dist

    groups = {tp: (dist.group.WORLD if tp == world else dist.new_group(list(range(tp)))) for tp in range(1, world + 1)}
    out = {}
    for tp in range(1, world + 1):
        cases = _gloo_cases(seed, tp)  # every rank builds the same cases
        if rank >= tp:
            continue
        for i, (hidden, _weight, _bias, shards, _offset, d2t, _exact, _faults) in enumerate(cases):
            w, layout = shards[rank][0], layout_kwargs(shards[rank])
            # one rank holding a shard past id 0 (the case's offset) says so: a one-rank group is refused there
            layout["group"] = localargmax.LOCAL_SHARD if tp == 1 and layout["vocab_start"] > 0 else groups[tp]
            for reduce in ("all_gather", "all_reduce"):
                out[(tp, i, reduce)] = timed(
                    lambda: localargmax.lm_head_argmax(hidden, w, d2t=d2t, reduce=reduce, **layout)
                )
            if tp > 1 and i % 10 == 0:  # a rank with another batch size, caught by the debug check
                os.environ["LOCALARGMAX_DEBUG"] = "1"
                try:
                    h = hidden if rank != tp - 1 else torch.cat([hidden, hidden[:1]])
                    out[(tp, i, "debug")] = timed(lambda: localargmax.lm_head_argmax(h, w, **layout))
                finally:
                    del os.environ["LOCALARGMAX_DEBUG"]
    return out


def test_stress_real_gloo(seed):
    result = launch(_gloo_worker, 4, seed, pg_timeout=60.0, wall_timeout=540.0)
    left = live_descendants(result.pids)
    hangs = sum(r.status == "hung" for r in result.ranks)
    assert hangs == 0 and not left, (hangs, left)
    for r, o in enumerate(result.ranks):
        assert o.status == "ok", f"rank {r}: {o.value}"
    per_rank = [o.value for o in result.ranks]
    stats = Counter()
    for tp in range(1, 5):
        for i, (hidden, weight, bias, _shards, offset, d2t, exact, faults) in enumerate(_gloo_cases(seed, tp)):
            stats["faults_injected"] += len(faults)
            for reduce in ("all_gather", "all_reduce"):
                got = [per_rank[r][(tp, i, reduce)] for r in range(tp)]
                stats["calls"] += tp
                assert all(g["ok"] for g in got), f"tp={tp} case {i} {reduce}: {got}"
                stats["slow_calls"] += sum(g["elapsed"] > 30 for g in got)
                ids = torch.tensor(got[0]["value"], dtype=torch.int64)
                if any(g["value"] != got[0]["value"] for g in got):
                    stats["rank_disagreements"] += 1
                draft = ids - offset
                if d2t is not None:
                    target = localargmax.draft_to_target_ids(d2t)
                    draft = torch.searchsorted(target, ids)
                wrong, _ = _judge(draft, hidden, weight, bias, exact)
                stats["wrong_ids"] += wrong
            if (tp, i, "debug") in per_rank[0]:
                stats["rank_faults_injected"] += 1
                for r in range(tp):
                    res = per_rank[r][(tp, i, "debug")]
                    ok = (not res["ok"]) and "ranks disagree on batch size" in res["error"]
                    stats["rank_fault_refusals"] += int(ok)
                    stats["rank_fault_misses"] += int(not ok)
    print(f"\nreal gloo stress (seed {seed}): {dict(stats)}, wall {result.wall_s:.1f} s, hangs {hangs}")
    assert stats["wrong_ids"] == 0 and stats["rank_disagreements"] == 0
    assert stats["rank_fault_misses"] == 0 and stats["slow_calls"] == 0
