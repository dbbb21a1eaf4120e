"""The argument checks of every fused op (shared by all six entry points): a
malformed shard raises naming the argument and leaves the inputs untouched;
the accepted layouts give the same answer."""

from __future__ import annotations

import pytest
import torch

import localargmax
from tests.support.checks import raises_cleanly

# ----------------------------------------------------------------------------- bad input (every fused entry point)

H, ROWS_, B = 8, 6, 3
BIG, PAST_BIG, I32 = localargmax.MAX_GLOBAL_INDEX, r"vocab_start \+ num_valid - 1", torch.int32


def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) * 31)).to(dtype)


# the shard arguments every fused op checks: id -> (hidden, weight, {layout kwargs}, exception, message)
BAD_SHARD = {
    "hidden_1d": (_t(H), _t(ROWS_, H), {}, ValueError, "hidden must be 2-D"),
    "hidden_3d": (_t(2, B, H), _t(ROWS_, H), {}, ValueError, "hidden must be 2-D"),
    "weight_1d": (_t(B, H), _t(H), {}, ValueError, "weight must be 2-D"),
    "weight_3d": (_t(B, H), _t(2, ROWS_, H), {}, ValueError, "weight must be 2-D"),
    "bias_2d": (_t(B, H), _t(ROWS_, H), {"bias": _t(ROWS_, 1)}, ValueError, "bias must be 1-D"),
    "bias_wrong_length": (_t(B, H), _t(ROWS_, H), {"bias": _t(ROWS_ - 1)}, ValueError, r"bias must be 1-D \[rows=6\]"),
    "bias_f16_for_f32": (_t(B, H), _t(ROWS_, H), {"bias": _t(ROWS_, dtype=torch.float16)}, TypeError, "bias dtype"),
    "bias_int": (_t(B, H), _t(ROWS_, H), {"bias": torch.zeros(ROWS_, dtype=torch.int32)}, TypeError, "bias dtype"),
    "bias_f64": (_t(B, H), _t(ROWS_, H), {"bias": torch.zeros(ROWS_, dtype=torch.float64)}, TypeError, "bias dtype"),
    "dtype_mismatch": (_t(B, H), _t(ROWS_, H, dtype=torch.bfloat16), {}, TypeError, "hidden dtype"),
    "dtype_mismatch_f16": (_t(B, H, dtype=torch.float16), _t(ROWS_, H), {}, TypeError, "hidden dtype"),
    "int_weight": (torch.ones(B, H, dtype=I32), torch.ones(ROWS_, H, dtype=I32), {}, TypeError, "weight dtype"),
    "f64_weight": (_t(B, H, dtype=torch.float64), _t(ROWS_, H, dtype=torch.float64), {}, TypeError, "weight dtype"),
    "int_weight_f32_hidden": (_t(B, H), torch.ones(ROWS_, H, dtype=torch.int64), {}, TypeError, "weight dtype"),
    "hidden_size_mismatch": (_t(B, H + 1), _t(ROWS_, H), {}, ValueError, "hidden_size"),
    "weight_transposed": (_t(B, H), _t(H, H).t(), {}, ValueError, "contiguous"),
    "weight_column_strided": (_t(B, H), _t(ROWS_, 2 * H)[:, ::2], {}, ValueError, "contiguous"),
    "num_valid_gt_rows": (_t(B, H), _t(ROWS_, H), {"num_valid": ROWS_ + 1}, ValueError, "num_valid"),
    "num_valid_negative": (_t(B, H), _t(ROWS_, H), {"num_valid": -1}, ValueError, "num_valid"),
    "vocab_start_negative": (_t(B, H), _t(ROWS_, H), {"vocab_start": -1}, ValueError, "vocab_start"),
    "index_past_2pow32m2": (_t(B, H), _t(ROWS_, H), {"vocab_start": BIG - ROWS_ + 2}, ValueError, PAST_BIG),
    "index_far_past": (_t(B, H), _t(ROWS_, H), {"vocab_start": 2**40, "num_valid": 1}, ValueError, PAST_BIG),
}
BAD_SHARD_WRAPPER_ONLY = {  # Python-level types the raw op cannot even receive
    "num_valid_float": (_t(B, H), _t(ROWS_, H), {"num_valid": 2.0}, TypeError, "num_valid"),
    "num_valid_bool": (_t(B, H), _t(ROWS_, H), {"num_valid": True}, TypeError, "num_valid"),
    "vocab_start_float": (_t(B, H), _t(ROWS_, H), {"vocab_start": 1.5}, TypeError, "vocab_start"),
    "vocab_start_str": (_t(B, H), _t(ROWS_, H), {"vocab_start": "0"}, TypeError, "vocab_start"),
    "hidden_list": ([[1.0] * H], _t(ROWS_, H), {}, TypeError, "hidden"),
    "weight_list": (_t(B, H), [[1.0] * H], {}, TypeError, "weight"),
    "bias_list": (_t(B, H), _t(ROWS_, H), {"bias": [0.0] * ROWS_}, TypeError, "bias"),
}
ENTRY_POINTS = {  # name -> (fn, extra positional args, extra keyword args)
    "shard_argmax": (localargmax.shard_argmax, (), {}),
    "lm_head_argmax": (localargmax.lm_head_argmax, (), {}),
    "shard_topk": (localargmax.shard_topk, (1,), {}),
    "lm_head_topk": (localargmax.lm_head_topk, (1,), {}),
    "shard_sample": (localargmax.shard_sample, (torch.ones(B), 7), {}),
    "lm_head_sample": (localargmax.lm_head_sample, (), {"temperature": 1.0, "seed": 7}),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("case", list(BAD_SHARD) + list(BAD_SHARD_WRAPPER_ONLY))
def test_fused_ops_reject_malformed_shards(entry, case):
    """Every fused entry point refuses a malformed shard with an error naming
    the argument, and leaves its inputs unmodified."""
    hidden, weight, kwargs, exc, match = {**BAD_SHARD, **BAD_SHARD_WRAPPER_ONLY}[case]
    fn, extra, extra_kw = ENTRY_POINTS[entry]
    if entry == "shard_sample" and case == "hidden_1d":
        match = "hidden must be 2-D|temperature"
    raises_cleanly(exc, match, fn, hidden, weight, *extra, **{**extra_kw, **kwargs})


@pytest.mark.parametrize("case", list(BAD_SHARD))
def test_shard_argmax_op_rejects(case):
    """The raw op (no Python wrapper): the C++ checks raise, never crash."""
    hidden, weight, kwargs, exc, match = BAD_SHARD[case]
    layout = {"vocab_start": 0, "num_valid": weight.shape[0] if weight.dim() == 2 else 0, **kwargs}
    with pytest.raises(exc, match=match):
        torch.ops.localargmax.shard_argmax.default(
            hidden, weight, layout.get("bias"), layout["vocab_start"], layout["num_valid"]
        )


def test_largest_legal_index_is_accepted():
    keys = localargmax.shard_argmax(_t(2, H), _t(ROWS_, H), vocab_start=BIG - ROWS_ + 1, num_valid=ROWS_)
    assert bool((localargmax.decode_keys(keys)[0] <= BIG).all())
    # num_valid == 0: vocab_start is never used as an index
    assert localargmax.shard_argmax(_t(2, H), _t(ROWS_, H), vocab_start=2**40, num_valid=0).eq(0).all()


def test_single_row_column_strided_weight(gen):
    """A [1, H] weight view with stride(1) == 2 is not row-contiguous: it must
    be refused like any other column-strided weight, or read correctly."""
    hidden = torch.randn(3, H, generator=gen)
    weight = torch.randn(1, 2 * H, generator=gen)[:, ::2]
    assert weight.shape == (1, H) and weight.stride(1) == 2
    bias = torch.randn(1, generator=gen)
    want = (hidden.double() @ weight.double().T).flatten() + bias.double()
    for call in (
        lambda: localargmax.shard_argmax(hidden, weight, bias=bias),
        lambda: torch.ops.localargmax.shard_argmax.default(hidden, weight, bias, 0, 1),
    ):
        try:
            values = localargmax.decode_keys(call())[1]
        except ValueError as e:
            assert "contiguous" in str(e)
            continue
        assert torch.allclose(values.double(), want, rtol=1e-5, atol=1e-5), f"read wrongly: {values.tolist()}"


def test_accepted_layouts_give_the_same_answer(gen):
    """Non-contiguous hidden / bias and a row-strided weight (rows contiguous,
    stride(0) > H) are fine and give the same keys."""
    hidden, weight, bias = (
        torch.randn(7, H, generator=gen),
        torch.randn(40, H, generator=gen),
        torch.randn(40, generator=gen),
    )
    want = localargmax.shard_argmax(hidden, weight, bias=bias)
    hidden_t = hidden.t().contiguous().t()
    weight_rs = torch.cat([weight, torch.randn(40, 3, generator=gen)], dim=1)[:, :H]
    bias_s = torch.stack([bias, bias], dim=1)[:, 0]
    assert not hidden_t.is_contiguous() and weight_rs.stride() == (H + 3, 1) and not bias_s.is_contiguous()
    assert torch.equal(localargmax.shard_argmax(hidden_t, weight_rs, bias=bias_s), want)
    assert torch.equal(torch.ops.localargmax.shard_argmax.default(hidden_t, weight_rs, bias_s, 0, 40), want)
