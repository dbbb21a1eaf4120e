"""The multi-rank scenarios of lm_head_argmax and the argmax baselines: built
once in the parent, run by one launch of 4 gloo ranks that covers tp = 1..4
with process subgroups (every rank pays for its imports once), and checked
one (tp, scenario, method) at a time by test_step.py and test_baselines.py.
"""

from __future__ import annotations

import math
import traceback
from typing import NamedTuple

import torch

from tests.support.problems import layout_kwargs, make_shards, planted_problem, random_problem
from tests.support.reference import check_against_reference, ref_argmax

WORLD = 4
TPS = (1, 2, 3, 4)
REDUCES = ("all_gather", "all_reduce")
BASELINES = ("full_gather_argmax", "unfused_local_argmax")


class Scenario(NamedTuple):
    name: str
    hidden: torch.Tensor
    weight: torch.Tensor  # full [V, H]
    bias: torch.Tensor | None
    d2t: torch.Tensor | None
    pad_to: int
    pad: str
    exact: bool  # True: ids must equal the float64 reference exactly
    baselines: bool  # True: data clear enough for the weight-dtype baselines too
    expected: list[int] | None  # an answer fixed by construction (rules 1-3), if any


SCENARIO_NAMES = (
    "planted_f32_bias",
    "planted_bf16_d2t",
    "planted_f16_inf_bias_pad",
    "ties_across_ranks",
    "nan_on_later_rank",
    "all_neg_inf",
    "padding_would_win_bf16",
    "tiny_vocab",
    "batch_equals_tp",
    "batch_zero",
    "random_near_ties",
    "mixed_sign_ranks",
)


def make_scenarios(seed: int) -> list[Scenario]:
    from localargmax import build_d2t

    gen = torch.Generator().manual_seed(seed)
    out = []
    h, w, b, _ = planted_problem(gen, 5, 1000, 33, torch.float32, "float32")
    out.append(Scenario("planted_f32_bias", h, w, b, None, 64, "huge", True, True, None))
    h, w, b, _ = planted_problem(gen, 7, 777, 48, torch.bfloat16, "weight")
    d2t = build_d2t(torch.randint(0, 10_000, (5000,), generator=gen), 777)
    out.append(Scenario("planted_bf16_d2t", h, w, b, d2t, 8, "nan", True, True, None))
    h, w, b, _ = planted_problem(gen, 6, 193, 40, torch.float16, "float32")
    out.append(Scenario("planted_f16_inf_bias_pad", h, w, b, None, 64, "inf_bias", True, True, None))
    # one winning row copied into several shards; rank 0's part (< 256) has none
    vocab, hsize, batch, copies = 999, 16, 6, [300, 520, 700, 998]
    h = 0.5 + torch.rand(batch, hsize, generator=gen)
    w = torch.randn(vocab, hsize, generator=gen) / math.sqrt(hsize)
    w[copies] = 10.0 / math.sqrt(hsize) + 0.1 * torch.randn(hsize, generator=gen)
    b = torch.randn(vocab, generator=gen) * 0.1
    b[copies] = 0.25
    out.append(Scenario("ties_across_ranks", h, w, b, None, 64, "huge", True, False, [300] * batch))
    # NaN logits only in the last part of the vocabulary (a later rank), +inf early
    h, w, b = random_problem(gen, 5, 1000, 16, torch.float32, "float32")
    b[10] = math.inf
    b[[990, 995]] = math.nan
    out.append(Scenario("nan_on_later_rank", h, w, b, None, 64, "huge", True, True, [990] * 5))
    h, w, _ = random_problem(gen, 4, 130, 12, torch.float32)
    out.append(Scenario("all_neg_inf", h, w, torch.full((130,), -math.inf), None, 64, "inf_bias", True, True, [0] * 4))
    h, w, b, _ = planted_problem(gen, 3, 70, 40, torch.bfloat16, "float32")
    out.append(Scenario("padding_would_win_bf16", h, w, b, None, 64, "huge", True, True, None))
    h, w, b, _ = planted_problem(gen, 2, 3, 32, torch.float32, None)
    out.append(Scenario("tiny_vocab", h, w, b, None, 1, "nan", True, True, None))
    h, w, b, _ = planted_problem(gen, 4, 501, 36, torch.float32, "float32")
    d2t = build_d2t(torch.randint(0, 100, (2000,), generator=gen), 501)
    out.append(Scenario("batch_equals_tp", h, w, b, d2t, 64, "nan", True, True, None))
    h, w, b = random_problem(gen, 0, 100, 8, torch.float32, "float32")
    out.append(Scenario("batch_zero", h, w, b, None, 64, "huge", True, True, []))
    h, w, b = random_problem(gen, 16, 1500, 7, torch.float32, "float32")
    out.append(Scenario("random_near_ties", h, w, b, None, 64, "huge", False, False, None))
    # positive logits only in [0, 100) (rank 0), negative elsewhere: rank 0's keys
    # have the top bit set, the others' not, so a signed max without the sign flip
    # would pick a later rank
    h, w, b = random_problem(gen, 5, 800, 24, torch.float32, "float32")
    b[100:] = -1000.0
    out.append(Scenario("mixed_sign_ranks", h, w, b, None, 64, "huge", False, False, None))
    assert tuple(s.name for s in out) == SCENARIO_NAMES
    return out


def _call(fn):
    try:
        return fn().tolist()
    except Exception as e:  # noqa: BLE001 - reported per case by the tests
        return f"error: {type(e).__name__}: {e}\n{traceback.format_exc()}"


def worker(rank: int, world: int, path: str) -> dict:
    """Every scenario, every tp this rank is part of, both reduce modes and
    both baselines; then unfused_local_argmax on a vocabulary too large for
    float32 indices. Returns {(tp, name, method): ids or error text}."""
    import torch.distributed as dist

    import localargmax
    from localargmax.baselines import FLOAT32_EXACT_INDEX_LIMIT, full_gather_argmax, unfused_local_argmax

    scenarios = [Scenario(*s) for s in torch.load(path)]
    groups = {tp: dist.group.WORLD if tp == world else dist.new_group(list(range(tp))) for tp in TPS}  # same order
    results = {}
    for tp in (tp for tp in TPS if rank < tp):
        for sc in scenarios:
            shard = make_shards(sc.weight, sc.bias, tp, sc.pad_to, hidden=sc.hidden, pad=sc.pad)[rank]
            w, common = shard[0], dict(layout_kwargs(shard), d2t=sc.d2t, group=groups[tp])
            for reduce in REDUCES:
                results[(tp, sc.name, reduce)] = _call(
                    lambda: localargmax.lm_head_argmax(sc.hidden, w, reduce=reduce, **common)
                )
            if sc.baselines:
                results[(tp, sc.name, BASELINES[0])] = _call(lambda: full_gather_argmax(sc.hidden, w, **common))
                results[(tp, sc.name, BASELINES[1])] = _call(lambda: unfused_local_argmax(sc.hidden, w, **common))
    # every rank refuses tp * rows > 2**24 before any collective (no rank is left
    # waiting); stride-0 rows cost no memory
    rows = FLOAT32_EXACT_INDEX_LIMIT // 4 + 1
    too_big = torch.zeros(1, 4).expand(rows, 4)
    try:
        unfused_local_argmax(torch.randn(2, 4), too_big, vocab_start=rank * rows, group=groups[WORLD])
        results[(WORLD, "too_big", BASELINES[1])] = "no error"
    except ValueError as e:
        results[(WORLD, "too_big", BASELINES[1])] = f"ValueError: {e}"
    return results


def check_case(multirank_run, tp, name, method):
    """The ids of (tp, scenario, method): no rank failed, all ranks agree, and
    they equal the float64 reference (or lie within the float32 error bound
    of it, for the near-tie scenarios)."""
    seed, scenarios, per_rank = multirank_run
    print(f"multi-rank seed {seed} (rerun with LOCALARGMAX_TEST_SEED={seed})")
    sc = scenarios[name]
    got = [per_rank[r][(tp, name, method)] for r in range(tp)]
    for r, ids in enumerate(got):
        assert not isinstance(ids, str), f"rank {r} of {tp}: {ids}"
    assert all(ids == got[0] for ids in got), f"ranks disagree: {got}"
    ids, ctx = torch.tensor(got[0], dtype=torch.int64), f"tp={tp} {name} {method}"
    if sc.expected is not None:
        assert ids.tolist() == sc.expected, ctx
    if sc.exact:
        want = ref_argmax(sc.hidden, sc.weight, sc.bias, sc.d2t)
        assert torch.equal(ids, want), f"{ctx}: got {ids.tolist()}, float64 reference {want.tolist()}"
    else:
        check_against_reference(ids, sc.hidden, sc.weight, sc.bias, sc.d2t, min_clear_fraction=0.8, context=ctx)
