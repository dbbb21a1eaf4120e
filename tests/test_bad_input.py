"""Malformed inputs raise a clear ValueError / TypeError naming the argument,
through the Python wrappers and through direct torch.ops.localargmax.* calls
(the C++ checks must raise, never crash or read out of bounds)."""
from __future__ import annotations

import pytest
import torch

import localargmax
from helpers import ref_argmax, stack_frames

H = 8
ROWS = 6
BIG = localargmax.MAX_GLOBAL_INDEX  # 2**32 - 2


def _h(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


# (id, builder -> (hidden, weight, bias, vocab_start, num_valid), exception, regex)
SHARD_CASES = [
    ("hidden_1d", lambda: (_h(H), _h(ROWS, H), None, 0, ROWS), ValueError, "hidden must be 2-D"),
    ("hidden_3d", lambda: (_h(2, 3, H), _h(ROWS, H), None, 0, ROWS), ValueError, "hidden must be 2-D"),
    ("weight_1d", lambda: (_h(2, H), _h(H), None, 0, 0), ValueError, "weight must be 2-D"),
    ("weight_3d", lambda: (_h(2, H), _h(2, ROWS, H), None, 0, ROWS), ValueError, "weight must be 2-D"),
    ("bias_2d", lambda: (_h(2, H), _h(ROWS, H), _h(ROWS, 1), 0, ROWS), ValueError, "bias must be 1-D"),
    ("bias_wrong_length", lambda: (_h(2, H), _h(ROWS, H), _h(ROWS - 1), 0, ROWS), ValueError, r"bias must be 1-D \[rows=6\]"),
    ("bias_f16_for_f32", lambda: (_h(2, H), _h(ROWS, H), _h(ROWS, dtype=torch.float16), 0, ROWS), TypeError, "bias dtype"),
    ("bias_int", lambda: (_h(2, H), _h(ROWS, H), torch.zeros(ROWS, dtype=torch.int32), 0, ROWS), TypeError, "bias dtype"),
    ("bias_f64", lambda: (_h(2, H), _h(ROWS, H), torch.zeros(ROWS, dtype=torch.float64), 0, ROWS), TypeError, "bias dtype"),
    ("dtype_mismatch", lambda: (_h(2, H), _h(ROWS, H, dtype=torch.bfloat16), None, 0, ROWS), TypeError, "hidden dtype"),
    ("dtype_mismatch_f16", lambda: (_h(2, H, dtype=torch.float16), _h(ROWS, H), None, 0, ROWS), TypeError, "hidden dtype"),
    ("int_weight", lambda: (torch.ones(2, H, dtype=torch.int32), torch.ones(ROWS, H, dtype=torch.int32), None, 0, ROWS), TypeError, "weight dtype"),
    ("f64_weight", lambda: (_h(2, H, dtype=torch.float64), _h(ROWS, H, dtype=torch.float64), None, 0, ROWS), TypeError, "weight dtype"),
    ("int_weight_f32_hidden", lambda: (_h(2, H), torch.ones(ROWS, H, dtype=torch.int64), None, 0, ROWS), TypeError, "weight dtype"),
    ("hidden_size_mismatch", lambda: (_h(2, H + 1), _h(ROWS, H), None, 0, ROWS), ValueError, "hidden_size"),
    ("weight_transposed", lambda: (_h(2, H), _h(H, H).t(), None, 0, H), ValueError, "contiguous"),
    ("weight_column_strided", lambda: (_h(2, H), _h(ROWS, 2 * H)[:, ::2], None, 0, ROWS), ValueError, "contiguous"),
    ("num_valid_gt_rows", lambda: (_h(2, H), _h(ROWS, H), None, 0, ROWS + 1), ValueError, "num_valid"),
    ("num_valid_negative", lambda: (_h(2, H), _h(ROWS, H), None, 0, -1), ValueError, "num_valid"),
    ("vocab_start_negative", lambda: (_h(2, H), _h(ROWS, H), None, -1, ROWS), ValueError, "vocab_start"),
    ("index_past_2pow32m2", lambda: (_h(2, H), _h(ROWS, H), None, BIG - ROWS + 2, ROWS), ValueError, r"vocab_start \+ num_valid - 1"),
    ("index_far_past", lambda: (_h(2, H), _h(ROWS, H), None, 2**40, 1), ValueError, r"vocab_start \+ num_valid - 1"),
]


@pytest.mark.parametrize("build,exc,match", [c[1:] for c in SHARD_CASES], ids=[c[0] for c in SHARD_CASES])
def test_shard_argmax_wrapper_rejects(build, exc, match):
    hidden, weight, bias, vocab_start, num_valid = build()
    with pytest.raises(exc, match=match):
        localargmax.shard_argmax(hidden, weight, vocab_start=vocab_start, num_valid=num_valid, bias=bias)
    with pytest.raises(exc, match=match):
        localargmax.lm_head_argmax(hidden, weight, vocab_start=vocab_start, num_valid=num_valid, bias=bias)


@pytest.mark.parametrize("build,exc,match", [c[1:] for c in SHARD_CASES], ids=[c[0] for c in SHARD_CASES])
def test_shard_argmax_op_rejects(build, exc, match):
    hidden, weight, bias, vocab_start, num_valid = build()
    with pytest.raises(exc, match=match):
        torch.ops.localargmax.shard_argmax.default(hidden, weight, bias, vocab_start, num_valid)


def test_largest_legal_index_is_accepted():
    keys = localargmax.shard_argmax(_h(2, H), _h(ROWS, H), vocab_start=BIG - ROWS + 1, num_valid=ROWS)
    assert bool((localargmax.decode_keys(keys)[0] <= BIG).all())
    # num_valid == 0: vocab_start is never used as an index
    assert localargmax.shard_argmax(_h(2, H), _h(ROWS, H), vocab_start=2**40, num_valid=0).eq(0).all()


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"vocab_start": 1.5}, TypeError, "vocab_start"),
        ({"num_valid": 2.0}, TypeError, "num_valid"),
        ({"num_valid": True}, TypeError, "num_valid"),
        ({"vocab_start": "0"}, TypeError, "vocab_start"),
    ],
)
def test_shard_argmax_wrapper_rejects_non_int_layout(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        localargmax.shard_argmax(_h(2, H), _h(ROWS, H), **kwargs)


def test_non_tensor_arguments():
    with pytest.raises(TypeError, match="hidden"):
        localargmax.shard_argmax([[1.0] * H], _h(ROWS, H))
    with pytest.raises(TypeError, match="weight"):
        localargmax.shard_argmax(_h(2, H), [[1.0] * H])
    with pytest.raises(TypeError, match="bias"):
        localargmax.shard_argmax(_h(2, H), _h(ROWS, H), bias=[0.0] * ROWS)
    with pytest.raises(TypeError, match="keys"):
        localargmax.merge_keys([1, 2])
    with pytest.raises(TypeError, match="d2t"):
        localargmax.merge_keys(torch.ones(2, dtype=torch.int64), d2t=[0, 0])


KEY = torch.tensor([[-4647714815446351878]], dtype=torch.int64)  # value 1.0, index 5 (DESIGN.md)

MERGE_CASES = [
    ("keys_3d", lambda: (KEY.view(1, 1, 1), None), ValueError, "keys must be"),
    ("keys_0d", lambda: (KEY.view(()), None), ValueError, "keys must be"),
    ("keys_int32", lambda: (torch.ones(2, 3, dtype=torch.int32), None), TypeError, "keys must be int64"),
    ("keys_float", lambda: (torch.ones(2, 3), None), TypeError, "keys must be int64"),
    ("keys_uint64", lambda: (torch.ones(2, 3, dtype=torch.uint64), None), TypeError, "keys must be int64"),
    ("keys_zero_ranks", lambda: (torch.empty(0, 3, dtype=torch.int64), None), ValueError, "0 ranks"),
    ("d2t_2d", lambda: (KEY, torch.zeros(8, 1, dtype=torch.int64)), ValueError, "d2t must be 1-D"),
    ("d2t_int32", lambda: (KEY, torch.zeros(8, dtype=torch.int32)), TypeError, "d2t must be int64"),
    ("d2t_float", lambda: (KEY, torch.zeros(8)), TypeError, "d2t must be int64"),
]


@pytest.mark.parametrize("build,exc,match", [c[1:] for c in MERGE_CASES], ids=[c[0] for c in MERGE_CASES])
def test_merge_keys_wrapper_rejects(build, exc, match):
    keys, d2t = build()
    with pytest.raises(exc, match=match):
        localargmax.merge_keys(keys, d2t)


@pytest.mark.parametrize("build,exc,match", [c[1:] for c in MERGE_CASES], ids=[c[0] for c in MERGE_CASES])
def test_merge_keys_op_rejects(build, exc, match):
    keys, d2t = build()
    with pytest.raises(exc, match=match):
        torch.ops.localargmax.merge_keys.default(keys, d2t)


def test_d2t_int32_rejected_through_lm_head_argmax():
    with pytest.raises(TypeError, match="d2t must be int64"):
        localargmax.lm_head_argmax(_h(2, H), _h(ROWS, H), d2t=torch.zeros(ROWS, dtype=torch.int32))


def test_unknown_reduce_mode():
    for reduce in ("sum", "max", "ALL_GATHER", None):
        with pytest.raises(ValueError, match="reduce must be one of"):
            localargmax.lm_head_argmax(_h(2, H), _h(ROWS, H), reduce=reduce)
        with pytest.raises(ValueError, match="reduce must be one of"):
            localargmax.exchange_keys(torch.zeros(2, dtype=torch.int64), None, reduce)


def test_bad_group_type():
    for group in ("world", 2, object()):
        with pytest.raises(TypeError, match="group must be"):
            localargmax.lm_head_argmax(_h(2, H), _h(ROWS, H), group=group)


def test_callable_group_misuse():
    hidden, weight = _h(3, H), _h(ROWS, H)
    with pytest.raises(ValueError, match="callable"):
        localargmax.lm_head_argmax(hidden, weight, group=lambda k: k.unsqueeze(0), reduce="all_reduce")
    for bad in (lambda k: k, lambda k: k.view(1, 1, -1), lambda k: k.unsqueeze(0)[:, :2], lambda k: k.tolist()):
        with pytest.raises(ValueError, match="group callable must return"):
            localargmax.lm_head_argmax(hidden, weight, group=bad)


def test_callable_group_all_gather(gen):
    """A callable group that plays all other ranks in-process: the ids are the
    argmax over the concatenation of every rank's shard."""
    hidden = torch.randn(5, H, generator=gen)
    shards = [torch.randn(ROWS, H, generator=gen) for _ in range(3)]
    keys = [localargmax.shard_argmax(hidden, w, vocab_start=r * ROWS) for r, w in enumerate(shards)]
    ids = localargmax.lm_head_argmax(
        hidden, shards[1], vocab_start=ROWS, group=lambda k: stack_frames(keys, [(r * ROWS, ROWS) for r in range(3)])
    )
    assert torch.equal(ids, ref_argmax(hidden, torch.cat(shards)))


def test_single_row_column_strided_weight(gen):
    """A [1, H] weight view with stride(1) == 2 is not row-contiguous: it must
    be refused like any other column-strided weight, or read correctly."""
    hidden = torch.randn(3, H, generator=gen)
    base = torch.randn(1, 2 * H, generator=gen)
    weight = base[:, ::2]
    assert weight.shape == (1, H) and weight.stride(1) == 2
    bias = torch.randn(1, generator=gen)
    want = (hidden.double() @ weight.double().T).flatten() + bias.double()
    for call in (
        lambda: localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, bias=bias))[1],
        lambda: localargmax.decode_keys(torch.ops.localargmax.shard_argmax.default(hidden, weight, bias, 0, 1))[1],
    ):
        try:
            values = call()
        except ValueError as e:
            assert "contiguous" in str(e)
            continue
        assert torch.allclose(values.double(), want, rtol=1e-5, atol=1e-5), (
            f"[1, H] weight with stride(1)=2 read wrongly: logits {values.tolist()}, want {want.tolist()}"
        )


def test_accepted_layouts_give_the_same_answer(gen):
    """Non-contiguous hidden / bias / d2t and a row-strided weight (rows
    contiguous, stride(0) > H) are fine and give the same ids."""
    hidden = torch.randn(7, H, generator=gen)
    weight = torch.randn(40, H, generator=gen)
    bias = torch.randn(40, generator=gen)
    want = localargmax.shard_argmax(hidden, weight, bias=bias)
    hidden_t = hidden.t().contiguous().t()
    weight_rs = torch.cat([weight, torch.randn(40, 3, generator=gen)], dim=1)[:, :H]
    bias_s = torch.stack([bias, bias], dim=1)[:, 0]
    assert not hidden_t.is_contiguous() and weight_rs.stride() == (H + 3, 1) and not bias_s.is_contiguous()
    assert torch.equal(localargmax.shard_argmax(hidden_t, weight_rs, bias=bias_s), want)
    assert torch.equal(torch.ops.localargmax.shard_argmax.default(hidden_t, weight_rs, bias_s, 0, 40), want)
