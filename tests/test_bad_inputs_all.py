"""Bad input at every public entry point that tests/test_bad_input.py does not
cover: shard_topk, shard_sample, lm_head_topk, lm_head_sample,
VocabParallelLMHead (constructor and from_full), validate_d2t, build_d2t,
exchange_keys, indices past 2**32 - 2 and empty tensors.

Each bad call raises an exception whose message names the argument, and
leaves its tensor inputs bit-for-bit unmodified (nothing half-written)."""
from __future__ import annotations

import re

import pytest
import torch

import localargmax
from helpers import stack_frames

H = 8
ROWS = 6
B = 3
BIG = localargmax.MAX_GLOBAL_INDEX  # 2**32 - 2


def _t(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape) * 31)
    return torch.randn(*shape, generator=g).to(dtype)


def _snapshot(args):
    tensors = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            tensors.append((x, x.detach().clone()))
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    walk(args)
    return tensors


def _assert_unchanged(snap, ctx):
    for live, saved in snap:
        assert live.shape == saved.shape and live.dtype == saved.dtype, ctx
        a = live.detach().reshape(-1).contiguous().view(torch.uint8) if live.numel() else live
        b = saved.reshape(-1).contiguous().view(torch.uint8) if saved.numel() else saved
        assert torch.equal(a, b), f"{ctx}: an input tensor was modified by the failed call"


def _check(fn, args, kwargs, exc, match):
    snap = _snapshot((args, kwargs))
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)
    _assert_unchanged(snap, f"{getattr(fn, '__name__', fn)}")


# (id, fn, args builder -> (args, kwargs), exception, regex naming the argument)
S = localargmax.shard_topk
SS = localargmax.shard_sample
LT = localargmax.lm_head_topk
LS = localargmax.lm_head_sample


def _shard_bad(name):
    """The malformed-shard inputs, shared by every fused entry point."""
    return {
        "hidden_1d": ((_t(H), _t(ROWS, H)), {}, ValueError, "hidden must be 2-D"),
        "weight_3d": ((_t(B, H), _t(2, ROWS, H)), {}, ValueError, "weight must be 2-D"),
        "dtype_mismatch": ((_t(B, H), _t(ROWS, H, dtype=torch.bfloat16)), {}, TypeError, "hidden dtype"),
        "int_weight": ((torch.ones(B, H, dtype=torch.int32), torch.ones(ROWS, H, dtype=torch.int32)), {}, TypeError,
                       "weight dtype"),
        "hidden_size": ((_t(B, H + 1), _t(ROWS, H)), {}, ValueError, "hidden_size"),
        "weight_column_strided": ((_t(B, H), _t(ROWS, 2 * H)[:, ::2]), {}, ValueError, "contiguous"),
        "num_valid_gt_rows": ((_t(B, H), _t(ROWS, H)), {"num_valid": ROWS + 1}, ValueError, "num_valid"),
        "num_valid_negative": ((_t(B, H), _t(ROWS, H)), {"num_valid": -1}, ValueError, "num_valid"),
        "num_valid_float": ((_t(B, H), _t(ROWS, H)), {"num_valid": 2.0}, TypeError, "num_valid"),
        "vocab_start_negative": ((_t(B, H), _t(ROWS, H)), {"vocab_start": -1}, ValueError, "vocab_start"),
        "index_past_2pow32m2": ((_t(B, H), _t(ROWS, H)), {"vocab_start": BIG - ROWS + 2}, ValueError,
                                r"vocab_start \+ num_valid - 1"),
        "index_far_past": ((_t(B, H), _t(ROWS, H)), {"vocab_start": 2**40, "num_valid": 1}, ValueError,
                           r"vocab_start \+ num_valid - 1"),
        "bias_wrong_length": ((_t(B, H), _t(ROWS, H)), {"bias": _t(ROWS + 1)}, ValueError, r"bias must be 1-D"),
        "bias_f64": ((_t(B, H), _t(ROWS, H)), {"bias": torch.zeros(ROWS, dtype=torch.float64)}, TypeError,
                     "bias dtype"),
        "hidden_list": (([[1.0] * H], _t(ROWS, H)), {}, TypeError, "hidden"),
    }


def _entry(name, args, kwargs):
    """Call entry point `name` with the shard arguments (hidden, weight) + extras."""
    hidden, weight = args
    if name == "shard_topk":
        return S, (hidden, weight, 1), kwargs
    if name == "shard_sample":
        return SS, (hidden, weight, torch.ones(B), 7), kwargs
    if name == "lm_head_topk":
        return LT, (hidden, weight, 1), kwargs
    return LS, (hidden, weight), dict(kwargs, temperature=1.0, seed=7)


ENTRY_POINTS = ("shard_topk", "shard_sample", "lm_head_topk", "lm_head_sample")
SHARD_CASES = [(e, c) for e in ENTRY_POINTS for c in _shard_bad(e)]


@pytest.mark.parametrize("entry,case", SHARD_CASES, ids=[f"{e}-{c}" for e, c in SHARD_CASES])
def test_fused_entry_points_reject_malformed_shards(entry, case):
    args, kwargs, exc, match = _shard_bad(entry)[case]
    if entry == "shard_sample" and case == "hidden_1d":
        match = "hidden must be 2-D|temperature"
    fn, full_args, full_kwargs = _entry(entry, args, kwargs)
    _check(fn, full_args, full_kwargs, exc, match)


OP_CASES = {
    "shard_topk_k0": (lambda: torch.ops.localargmax.shard_topk.default(_t(B, H), _t(ROWS, H), None, 0, ROWS, 0), "k"),
    "shard_topk_k65": (lambda: torch.ops.localargmax.shard_topk.default(_t(B, H), _t(ROWS, H), None, 0, ROWS, 65), "k"),
    "shard_topk_num_valid": (lambda: torch.ops.localargmax.shard_topk.default(_t(B, H), _t(ROWS, H), None, 0, ROWS + 1, 2),
                             "num_valid"),
    "shard_topk_index": (lambda: torch.ops.localargmax.shard_topk.default(_t(B, H), _t(ROWS, H), None, BIG, ROWS, 2),
                         "vocab_start|index"),
    "shard_sample_temp_shape": (lambda: torch.ops.localargmax.shard_sample.default(
        _t(B, H), _t(ROWS, H), None, 0, ROWS, torch.ones(B + 1), 1, 0), "temperature"),
    "shard_sample_temp_dtype": (lambda: torch.ops.localargmax.shard_sample.default(
        _t(B, H), _t(ROWS, H), None, 0, ROWS, torch.ones(B, dtype=torch.float64), 1, 0), "temperature"),
    "shard_sample_index": (lambda: torch.ops.localargmax.shard_sample.default(
        _t(B, H), _t(ROWS, H), None, BIG, ROWS, torch.ones(B), 1, 0), "vocab_start|index"),
}


@pytest.mark.parametrize("case", list(OP_CASES))
def test_ops_reject_malformed_arguments(case):
    """Direct torch.ops calls (no Python wrapper): the C++ checks raise, never crash."""
    call, word = OP_CASES[case]
    with pytest.raises((ValueError, TypeError, RuntimeError), match=word):
        call()


# ----------------------------------------------------------------------------- k, temperature, seed, offset

@pytest.mark.parametrize("k", [0, 65, -1, 1.5, True, "3", None])
@pytest.mark.parametrize("entry", ["shard_topk", "lm_head_topk"])
def test_topk_rejects_bad_k(entry, k):
    fn = S if entry == "shard_topk" else LT
    _check(fn, (_t(B, H), _t(ROWS, H), k), {}, ValueError, "k must be an int in")


def test_lm_head_topk_k_past_valid_vocabulary():
    _check(LT, (_t(B, H), _t(ROWS, H), ROWS + 1), {}, ValueError, "exceeds the valid vocabulary")
    _check(LT, (_t(B, H), _t(ROWS, H), 3), {"num_valid": 2}, ValueError, "exceeds the valid vocabulary")
    keys = stack_frames([localargmax.shard_topk(_t(B, H), _t(ROWS, H), 4, num_valid=1, vocab_start=r) for r in range(2)],
                        [(0, 1), (1, 1)])
    _check(LT, (_t(B, H), _t(ROWS, H), 4), {"num_valid": 1, "group": lambda k: keys}, ValueError,
           "exceeds the valid vocabulary")


TEMPERATURES = {
    "list": ([1.0] * B, TypeError, "temperature"),
    "2d": (torch.ones(B, 1), ValueError, "temperature must be 1-D"),
    "wrong_length": (torch.ones(B + 1), ValueError, "temperature must be 1-D"),
    "float64": (torch.ones(B, dtype=torch.float64), TypeError, "temperature must be float32"),
    "int32": (torch.ones(B, dtype=torch.int32), TypeError, "temperature must be float32"),
}


@pytest.mark.parametrize("case", list(TEMPERATURES))
def test_shard_sample_rejects_malformed_temperature(case):
    temp, exc, match = TEMPERATURES[case]
    _check(SS, (_t(B, H), _t(ROWS, H), temp, 7), {}, exc, match)


@pytest.mark.parametrize("temp", [-1.0, float("nan"), "1", None, True, [1.0]])
def test_lm_head_sample_rejects_bad_temperature_value(temp):
    _check(LS, (_t(B, H), _t(ROWS, H)), {"temperature": temp, "seed": 1}, ValueError, "temperature")


@pytest.mark.parametrize("temp", [torch.full((B,), -1.0), torch.tensor([1.0, float("nan"), 1.0]), torch.tensor(-0.5),
                                  torch.ones(B + 1), torch.ones(B, 2)])
def test_lm_head_sample_rejects_bad_temperature_tensor(temp):
    _check(LS, (_t(B, H), _t(ROWS, H)), {"temperature": temp, "seed": 1}, ValueError, "temperature")


@pytest.mark.parametrize("temp", [torch.full((B,), -1.0), torch.tensor([1.0, float("nan"), 1.0])])
def test_shard_sample_rejects_negative_or_nan_temperature(temp):
    """shard_sample's docstring asks for T >= 0; lm_head_sample refuses a
    negative or NaN CPU temperature, the op wrapper must too (T < 0 turns
    Gumbel-max sampling into sampling from softmax(-logits / |T|))."""
    _check(SS, (_t(B, H), _t(ROWS, H), temp, 7), {}, ValueError, "temperature")


@pytest.mark.parametrize("name", ["seed", "offset"])
@pytest.mark.parametrize("value", [-1, 2**63, 1.5, True, "0", None])
@pytest.mark.parametrize("entry", ["shard_sample", "lm_head_sample"])
def test_sample_rejects_bad_seed_and_offset(entry, name, value):
    kwargs = {"seed": 7, "offset": 0, name: value}
    if entry == "shard_sample":
        _check(SS, (_t(B, H), _t(ROWS, H), torch.ones(B)), kwargs, ValueError, name)
    else:
        _check(LS, (_t(B, H), _t(ROWS, H)), dict(kwargs, temperature=1.0), ValueError, name)


def test_lm_head_sample_rejects_bad_reduce_group_d2t():
    h, w = _t(B, H), _t(ROWS, H)
    _check(LS, (h, w), {"temperature": 1.0, "seed": 1, "reduce": "max"}, ValueError, "reduce must be one of")
    _check(LS, (h, w), {"temperature": 1.0, "seed": 1, "group": 3}, TypeError, "group must be")
    _check(LS, (h, w), {"temperature": 1.0, "seed": 1, "d2t": torch.zeros(ROWS, dtype=torch.int32)}, TypeError, "d2t")
    _check(LS, (h, w), {"temperature": 1.0, "seed": 1, "d2t": torch.zeros(ROWS)}, TypeError, "d2t")


# ----------------------------------------------------------------------------- d2t through lm_head_topk

D2T_BAD = {
    "float": (torch.zeros(ROWS), TypeError),
    "int32": (torch.zeros(ROWS, dtype=torch.int32), TypeError),
    "2d": (torch.zeros(ROWS, 1, dtype=torch.int64), ValueError),
    "too_short": (torch.zeros(2, dtype=torch.int64), ValueError),
}


@pytest.mark.parametrize("case", list(D2T_BAD))
def test_lm_head_topk_rejects_bad_d2t(case):
    """lm_head_argmax and lm_head_sample refuse these d2t tables (merge_keys
    checks them); lm_head_topk must as well, naming d2t, instead of returning
    float ids or raising a bare IndexError."""
    d2t, exc = D2T_BAD[case]
    _check(LT, (_t(B, H), _t(ROWS, H), 2), {"d2t": d2t}, exc, "d2t")


@pytest.mark.parametrize("case", list(D2T_BAD))
def test_lm_head_argmax_rejects_bad_d2t(case):
    d2t, exc = D2T_BAD[case]
    hidden, weight = _t(B, H), _t(ROWS, H)
    if case == "too_short":  # the winning id must fall outside the table
        weight = weight.clone()
        weight[ROWS - 1] = hidden.sum(0) * 100
    _check(localargmax.lm_head_argmax, (hidden, weight), {"d2t": d2t}, exc, "d2t")


# ----------------------------------------------------------------------------- VocabParallelLMHead

FROM_FULL_BAD = {
    "weight_list": (([[1.0] * H] * ROWS, 0, 1), {}, (ValueError, TypeError), "weight"),
    "weight_1d": ((_t(ROWS), 0, 1), {}, (ValueError, TypeError), "weight"),
    "weight_3d": ((_t(2, ROWS, H), 0, 1), {}, (ValueError, TypeError), "weight"),
    "weight_empty": ((torch.zeros(0, H), 0, 1), {}, ValueError, "vocab_size|weight"),
    "bias_wrong_length": ((_t(ROWS, H), 0, 1), {"bias": _t(ROWS + 1)}, ValueError, "bias"),
    "bias_2d": ((_t(ROWS, H), 0, 1), {"bias": _t(ROWS, 1)}, ValueError, "bias"),
    "bias_list": ((_t(ROWS, H), 0, 1), {"bias": [0.0] * ROWS}, (ValueError, TypeError), "bias"),
    "rank_negative": ((_t(ROWS, H), -1, 2), {}, ValueError, "rank"),
    "rank_too_big": ((_t(ROWS, H), 2, 2), {}, ValueError, "rank"),
    "world_size_0": ((_t(ROWS, H), 0, 0), {}, ValueError, "world_size"),
    "pad_to_0": ((_t(ROWS, H), 0, 1), {"pad_to": 0}, ValueError, "pad_to"),
    "pad_to_float": ((_t(ROWS, H), 0, 1), {"pad_to": 64.0}, ValueError, "pad_to"),
}


@pytest.mark.parametrize("case", list(FROM_FULL_BAD))
def test_from_full_rejects(case):
    args, kwargs, exc, match = FROM_FULL_BAD[case]
    _check(localargmax.VocabParallelLMHead.from_full, args, kwargs, exc, match)


CONSTRUCT_OR_FORWARD = {
    # refused at construction or, at the latest, at the first forward, naming the argument
    "int_weight": (lambda: localargmax.VocabParallelLMHead.from_full(torch.ones(ROWS, H, dtype=torch.int64), 0, 1),
                   torch.ones(B, H, dtype=torch.int64), (TypeError, ValueError), "dtype"),
    "reduce_bogus": (lambda: localargmax.VocabParallelLMHead.from_full(_t(ROWS, H), 0, 1, reduce="sum"),
                     _t(B, H), ValueError, "reduce"),
    "group_str": (lambda: localargmax.VocabParallelLMHead.from_full(_t(ROWS, H), 0, 1, group="world"),
                  _t(B, H), TypeError, "group"),
}


@pytest.mark.parametrize("case", list(CONSTRUCT_OR_FORWARD))
def test_lm_head_module_refuses_at_construction_or_first_forward(case):
    build, hidden, exc, match = CONSTRUCT_OR_FORWARD[case]
    try:
        head = build()
    except exc as e:
        assert re.search(match, str(e)), str(e)
        return
    with pytest.raises(exc, match=match):
        head(hidden)


@pytest.mark.parametrize("kwargs,match", [
    ({"vocab_size": 0, "hidden_size": H}, "vocab_size"),
    ({"vocab_size": 10.0, "hidden_size": H}, "vocab_size"),
    ({"vocab_size": 10, "hidden_size": -1}, "hidden_size"),
    ({"vocab_size": 10, "hidden_size": H, "world_size": 2, "rank": 5}, "rank"),
])
def test_lm_head_constructor_rejects(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        localargmax.VocabParallelLMHead(**kwargs)


# ----------------------------------------------------------------------------- validate_d2t / build_d2t

VALIDATE_BAD = {
    "list": (([0, 0], 2, 5), TypeError, "d2t"),
    "int32": ((torch.zeros(2, dtype=torch.int32), 2, 5), TypeError, "d2t must be int64"),
    "float": ((torch.zeros(2), 2, 5), TypeError, "d2t must be int64"),
    "2d": ((torch.zeros(2, 1, dtype=torch.int64), 2, 5), ValueError, "d2t must be 1-D"),
    "wrong_length": ((torch.zeros(3, dtype=torch.int64), 2, 5), ValueError, "draft_vocab_size=2"),
    "negative_target": ((torch.tensor([0, -2]), 2, 5), ValueError, "draft id 1"),
    "target_too_big": ((torch.tensor([5, 0]), 2, 5), ValueError, "draft id 0"),
    "empty_target_vocab": ((torch.zeros(1, dtype=torch.int64), 1, 0), ValueError, "target_vocab_size"),
}


@pytest.mark.parametrize("case", list(VALIDATE_BAD))
def test_validate_d2t_rejects(case):
    args, exc, match = VALIDATE_BAD[case]
    _check(localargmax.validate_d2t, args, {}, exc, match)


BUILD_BAD = {
    "counts_2d": ((torch.ones(3, 2), 1), ValueError, "token_counts"),
    "counts_list": (([1, 2, 3], 1), ValueError, "token_counts"),
    "counts_empty": ((torch.ones(0), 1), ValueError, "draft_vocab_size"),
    "k_zero": ((torch.ones(3), 0), ValueError, "draft_vocab_size"),
    "k_too_big": ((torch.ones(3), 4), ValueError, "draft_vocab_size"),
    "k_bool": ((torch.ones(3), True), ValueError, "draft_vocab_size"),
    "k_float": ((torch.ones(3), 2.0), ValueError, "draft_vocab_size"),
    "counts_nan": ((torch.tensor([1.0, float("nan"), 3.0]), 2), ValueError, "token_counts"),
}


@pytest.mark.parametrize("case", list(BUILD_BAD))
def test_build_d2t_rejects(case):
    args, exc, match = BUILD_BAD[case]
    _check(localargmax.build_d2t, args, {}, exc, match)


# ----------------------------------------------------------------------------- exchange_keys

KEYS = torch.tensor([5, -7, 9], dtype=torch.int64)


@pytest.mark.parametrize("reduce", ["sum", "MAX", "allgather", None, 0])
@pytest.mark.parametrize("group", [None, "callable"])
def test_exchange_keys_unknown_reduce(reduce, group):
    g = (lambda k: k.unsqueeze(0)) if group == "callable" else None
    _check(localargmax.exchange_keys, (KEYS, g, reduce), {}, ValueError, "reduce must be one of")
    _check(localargmax.exchange_keys, (KEYS.view(3, 1), g, reduce), {}, ValueError, "reduce must be one of")


def test_exchange_keys_all_reduce_needs_top1_keys():
    topk = torch.ones(B, 4, dtype=torch.int64)
    _check(localargmax.exchange_keys, (topk, None, "all_reduce"), {}, ValueError, r"all_reduce.*\[B\]")
    _check(localargmax.exchange_keys, (topk, lambda k: k[None], "all_reduce"), {}, ValueError, r"all_reduce")


def test_exchange_keys_callable_misuse():
    _check(localargmax.exchange_keys, (KEYS, lambda k: k[None], "all_reduce"), {}, ValueError, "callable")
    for bad in (lambda k: k, lambda k: k.tolist(), lambda k: k[None, :2], lambda k: None):
        _check(localargmax.exchange_keys, (KEYS, bad), {}, ValueError, "group callable must return")
    _check(localargmax.exchange_keys, (KEYS, 3), {}, TypeError, "group must be")


@pytest.mark.parametrize("keys", [[5, -7, 9], torch.tensor([1.0, 2.0]), torch.tensor([1, 2], dtype=torch.int32)],
                         ids=["list", "float32", "int32"])
def test_exchange_keys_rejects_non_int64_keys(keys):
    """Packed keys are int64; anything else is a caller bug that must not
    travel through a collective (or come back as a float 'key')."""
    _check(localargmax.exchange_keys, (keys, None), {}, TypeError, "keys")


# ----------------------------------------------------------------------------- empty tensors

def test_empty_batch_everywhere(gen):
    """B = 0 is legal at every fused entry point and returns empty results."""
    h, w = torch.empty(0, H), _t(ROWS, H)
    assert localargmax.shard_argmax(h, w).shape == (0,)
    assert localargmax.shard_topk(h, w, 2).shape == (0, 2)
    assert localargmax.shard_sample(h, w, torch.ones(0), 1).shape == (0,)
    assert localargmax.lm_head_argmax(h, w).shape == (0,)
    assert localargmax.lm_head_argmax(h, w, reduce="all_reduce").shape == (0,)
    assert localargmax.lm_head_sample(h, w, temperature=1.0, seed=1).shape == (0,)
    assert localargmax.merge_keys(torch.empty(3, 0, dtype=torch.int64))[0].shape == (0,)
    assert localargmax.decode_keys(torch.empty(0, dtype=torch.int64))[0].shape == (0,)


def test_empty_batch_lm_head_topk():
    ids, values = localargmax.lm_head_topk(torch.empty(0, H), _t(ROWS, H), 2)
    assert ids.shape == (0, 2) and values.shape == (0, 2)


def test_zero_hidden_size_is_bias_argmax():
    """H = 0: every logit is the bias (or 0): the argmax of the bias, ties to index 0."""
    h, w = torch.empty(B, 0), torch.empty(ROWS, 0)
    bias = torch.tensor([0.5, 2.0, -1.0, 2.0, 0.0, 1.0])
    assert localargmax.lm_head_argmax(h, w, bias=bias).tolist() == [1] * B
    assert localargmax.lm_head_argmax(h, w).tolist() == [0] * B
    assert torch.equal(localargmax.lm_head_topk(h, w, 2, bias=bias)[0], torch.tensor([[1, 3]] * B))


def test_no_valid_vocabulary_names_num_valid():
    h = _t(B, H)
    for w, kwargs in ((torch.empty(0, H), {}), (_t(ROWS, H), {"num_valid": 0})):
        assert localargmax.shard_argmax(h, w, **kwargs).eq(0).all()  # key 0: "no valid entry"
        _check(localargmax.lm_head_argmax, (h, w), kwargs, ValueError, "num_valid")
        _check(localargmax.lm_head_sample, (h, w), dict(kwargs, temperature=1.0, seed=1), ValueError, "num_valid")
        _check(localargmax.lm_head_topk, (h, w, 1), kwargs, ValueError, "exceeds the valid vocabulary")
    with pytest.raises(ValueError, match="no valid"):
        localargmax.decode_keys(torch.zeros(2, dtype=torch.int64))


def test_empty_d2t_names_d2t():
    h, w = _t(B, H), _t(ROWS, H)
    _check(localargmax.lm_head_argmax, (h, w), {"d2t": torch.empty(0, dtype=torch.int64)}, ValueError, "d2t")


def test_largest_index_accepted_everywhere():
    """The boundary itself: the last legal index 2**32 - 2 works at every entry point."""
    h = _t(B, H)
    w = torch.zeros(ROWS, H)
    w[ROWS - 1] = h.sum(0) * 0 + 1.0
    h = h.abs() + 0.1
    start = BIG - ROWS + 1
    assert localargmax.lm_head_argmax(h, w, vocab_start=start).tolist() == [BIG] * B
    assert localargmax.lm_head_topk(h, w, 1, vocab_start=start)[0].flatten().tolist() == [BIG] * B
    assert localargmax.lm_head_sample(h, w, temperature=0.0, seed=1, vocab_start=start).tolist() == [BIG] * B
