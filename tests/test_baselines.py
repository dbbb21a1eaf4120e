"""The baselines engines ship today (localargmax.baselines): same answers as
the float64 reference on well-separated data, in one process and across gloo
ranks; unfused_local_argmax refuses vocabularies whose float32 index would be
inexact."""
from __future__ import annotations

import pytest
import torch

from helpers import build_shards, min_gap, planted_problem, ref_argmax
from localargmax import build_d2t
from localargmax.baselines import FLOAT32_EXACT_INDEX_LIMIT, full_gather_argmax, unfused_local_argmax
from multirank import BASELINES, SCENARIO_NAMES, TPS, check_case

BASELINE_FNS = {"full_gather_argmax": full_gather_argmax, "unfused_local_argmax": unfused_local_argmax}


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("bias", [None, "float32", "weight"], ids=["nobias", "bias_f32", "bias_wdtype"])
def test_single_rank_well_separated(gen, baseline, dtype, bias):
    fn = BASELINE_FNS[baseline]
    batch, vocab, hsize = 9, 1100, 64
    hidden, weight, b, winners = planted_problem(gen, batch, vocab, hsize, dtype, bias)
    # separated far beyond 16-bit rounding of the logits (these baselines
    # compute logits in the weight dtype)
    assert min_gap(hidden, weight, b) > 0.02
    d2t = build_d2t(torch.randint(0, 1000, (3000,), generator=gen), vocab)
    # one shard (world size 1) padded to 1152 rows with rows that would win
    (w, bb, layout), = build_shards(weight, b, 1, 128, hidden=hidden, pad_fill="huge")
    assert layout.rows == 1152 and layout.num_valid == vocab
    got = fn(hidden, w, num_valid=layout.num_valid, bias=bb)
    assert torch.equal(got, winners)
    assert torch.equal(got, ref_argmax(hidden, weight, b))
    got_t = fn(hidden, w, num_valid=layout.num_valid, bias=bb, d2t=d2t)
    assert torch.equal(got_t, ref_argmax(hidden, weight, b, d2t))


@pytest.mark.parametrize("baseline", BASELINES)
def test_single_rank_nan_and_all_neg_inf(gen, baseline):
    fn = BASELINE_FNS[baseline]
    hidden = torch.randn(4, 16, generator=gen)
    weight = torch.randn(200, 16, generator=gen)
    bias = torch.randn(200, generator=gen)
    bias[[150, 170]] = float("nan")
    assert fn(hidden, weight, bias=bias).tolist() == [150] * 4
    neg = torch.full((200,), float("-inf"))
    assert fn(hidden, weight, num_valid=120, bias=neg).tolist() == [0] * 4


def test_unfused_refuses_inexact_float32_index():
    """tp * rows > 2**24: the float32 index would be silently wrong."""
    hidden = torch.randn(2, 4)
    too_many = torch.zeros(1, 4).expand(FLOAT32_EXACT_INDEX_LIMIT + 1, 4)  # no memory: stride 0 rows
    with pytest.raises(ValueError, match="2\\*\\*24"):
        unfused_local_argmax(hidden, too_many)
    with pytest.raises(ValueError, match="2\\*\\*24"):
        unfused_local_argmax(hidden, too_many, num_valid=100)


def test_unfused_refuses_inexact_float32_index_multirank(multirank_run):
    """tp = 4 ranks of 2**22 + 1 rows each: every rank raises ValueError."""
    _, _, per_rank = multirank_run
    for rank, results in enumerate(per_rank):
        got = results[(4, "too_big", "unfused_local_argmax")]
        assert got.startswith("ValueError:") and "2**24" in got, f"rank {rank}: {got}"


@pytest.mark.parametrize("baseline", BASELINES)
def test_baselines_reject_bad_layout_and_group(baseline):
    fn = BASELINE_FNS[baseline]
    hidden, weight = torch.randn(2, 4), torch.randn(8, 4)
    with pytest.raises(ValueError, match="vocab_start"):
        fn(hidden, weight, vocab_start=3)
    with pytest.raises(TypeError, match="group"):
        fn(hidden, weight, group="world")
    with pytest.raises(TypeError, match="dtype"):
        fn(hidden, weight.bfloat16())


@pytest.mark.parametrize("baseline", BASELINES)
@pytest.mark.parametrize("name", SCENARIO_NAMES)
@pytest.mark.parametrize("tp", TPS)
def test_baselines_multirank(multirank_run, tp, name, baseline):
    """Same scenarios as test_lm_head_argmax_multirank, where the data is clear
    enough for logits rounded to the weight dtype (and not built on exact ties
    of float32 GEMM results, which these baselines do not promise)."""
    _, scenarios, _ = multirank_run
    if not scenarios[name].baselines:
        pytest.skip(f"{name}: near-ties / exact ties are outside what the baselines promise")
    check_case(multirank_run, tp, name, baseline)
