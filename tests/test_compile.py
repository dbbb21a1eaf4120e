"""Every public op and step under ``torch.compile(fullgraph=True)`` with
``dynamic=True``, ``False`` and ``None``, at batch 0, 1, 3 and 5: the same
answer as eager. The entry points are listed once (ENTRY_POINTS) and the list
is checked against ``localargmax.__all__``, so a new Python-level check that
dynamo cannot trace (``struct.pack`` on a symbolic float broke every op once)
fails here."""

from __future__ import annotations

import pytest
import torch

import localargmax

V, ROWS, H = 90, 96, 16  # 6 padding rows
D2T = torch.arange(V, dtype=torch.int64) % 7  # target ids k + d2t[k]


def _bias():
    return torch.linspace(-1, 1, ROWS)


ENTRY_POINTS = {  # name: f(hidden, weight) -> tensor or tuple of tensors
    "shard_argmax": lambda h, w: localargmax.shard_argmax(h, w, num_valid=V, bias=_bias()),
    "shard_argmax_log_partition": lambda h, w: localargmax.shard_argmax(
        h, w, num_valid=V, log_partition=True, scale=0.5, soft_cap=30.0
    ),
    "shard_topk": lambda h, w: localargmax.shard_topk(h, w, 3, vocab_start=64, num_valid=V),
    "shard_topk_log_partition": lambda h, w: localargmax.shard_topk(h, w, 3, num_valid=V, log_partition=True),
    "shard_sample": lambda h, w: localargmax.shard_sample(h, w, torch.full((h.shape[0],), 0.8), 5, 2, num_valid=V),
    "shard_sample_log_partition": lambda h, w: localargmax.shard_sample(
        h, w, torch.full((h.shape[0],), 0.8), 5, 2, num_valid=V, log_partition=True
    ),
    "merge_keys": lambda h, w: localargmax.merge_keys(
        torch.stack([localargmax.shard_argmax(h, w, num_valid=V)] * 2), D2T
    ),
    "decode_keys": lambda h, w: localargmax.decode_keys(localargmax.shard_topk(h, w, 2, num_valid=V)),
    "lm_head_argmax": lambda h, w: localargmax.lm_head_argmax(h, w, num_valid=V),
    "lm_head_argmax_all_reduce": lambda h, w: localargmax.lm_head_argmax(h, w, num_valid=V, reduce="all_reduce"),
    "lm_head_argmax_d2t": lambda h, w: localargmax.lm_head_argmax(h, w, num_valid=V, d2t=D2T, bias=_bias()),
    "lm_head_argmax_log_probs": lambda h, w: localargmax.lm_head_argmax(
        h, w, num_valid=V, return_log_probs=True, logit_scale=2.0, soft_cap=20.0
    ),
    "lm_head_argmax_log_odds": lambda h, w: localargmax.lm_head_argmax(
        h, w, num_valid=V, return_log_odds=True, temperature=torch.full((h.shape[0],), 0.7), return_log_probs=True
    ),
    "lm_head_topk": lambda h, w: localargmax.lm_head_topk(h, w, 4, num_valid=V),
    "lm_head_topk_d2t": lambda h, w: localargmax.lm_head_topk(h, w, 4, num_valid=V, d2t=D2T),
    "lm_head_topk_log_probs": lambda h, w: localargmax.lm_head_topk(h, w, 4, num_valid=V, return_log_probs=True),
    "lm_head_sample": lambda h, w: localargmax.lm_head_sample(h, w, temperature=0.7, seed=3, num_valid=V),
    "lm_head_sample_all_reduce": lambda h, w: localargmax.lm_head_sample(
        h, w, temperature=0.7, seed=3, num_valid=V, reduce="all_reduce"
    ),
    "lm_head_sample_d2t": lambda h, w: localargmax.lm_head_sample(
        h, w, temperature=torch.full((h.shape[0],), 1.5), seed=3, num_valid=V, d2t=D2T
    ),
    "lm_head_sample_log_probs": lambda h, w: localargmax.lm_head_sample(
        h, w, temperature=0.7, seed=3, num_valid=V, return_log_probs=True, soft_cap=5.0
    ),
    "log_probs_from_pairs": lambda h, w: localargmax.log_probs_from_pairs(
        torch.zeros(h.shape[0]), localargmax.shard_argmax(h, w, num_valid=V, log_partition=True)[1][None]
    ),
    "log_odds_from_pairs": lambda h, w: localargmax.log_odds_from_pairs(
        *(t[None] for t in localargmax.shard_argmax(h, w, num_valid=V, log_partition=True))
    ),
    "VocabParallelLMHead": lambda h, w: _HEAD(h),
    "LocalArgmaxMixin": lambda h, w: _DRAFT.get_top_tokens(h),
}
_FULL = torch.randn(V, H)
_HEAD = localargmax.VocabParallelLMHead.from_full(_FULL, 0, 1)


class _Draft(torch.nn.Module, localargmax.LocalArgmaxMixin):
    def __init__(self):
        super().__init__()
        self.lm_head = localargmax.VocabParallelLMHead.from_full(_FULL, 0, 1)
        self.draft_id_to_target_id = D2T
        self.logit_scale = 0.5


_DRAFT = _Draft()
# Public names that are no op or step (types, constants, load-time helpers run once, not per step).
NOT_STEPS = {
    "MAX_GLOBAL_INDEX", "MAX_TOPK", "WITH_CUDA", "VocabShard", "check_layouts", "shard_vocab", "build_d2t",
    "validate_d2t", "draft_to_target_ids", "exchange_keys", "payload_length",
}  # fmt: skip


def test_every_public_op_and_step_is_walked():
    walked = {name.split("_log_p")[0].split("_d2t")[0].split("_all_reduce")[0] for name in ENTRY_POINTS}
    assert set(localargmax.__all__) - NOT_STEPS <= walked, set(localargmax.__all__) - NOT_STEPS - walked


def _flat(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("dynamic", [True, False, None], ids=["dynamic", "static", "auto"])
@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_compiles_fullgraph_and_gives_eager_answer(name, dynamic, gen):
    torch._dynamo.reset()
    fn = ENTRY_POINTS[name]
    weight = torch.randn(ROWS, H, generator=gen)
    compiled = torch.compile(fn, fullgraph=True, backend="eager", dynamic=dynamic)
    for batch in (0, 1, 3, 5):
        hidden = torch.randn(batch, H, generator=gen)
        got, want = _flat(compiled(hidden, weight)), _flat(fn(hidden, weight))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, f"{name} batch {batch}"
            assert torch.equal(g, w) or (w.is_floating_point() and torch.allclose(g, w, atol=1e-6, equal_nan=True)), (
                f"{name} batch {batch}: {g} != {w}"
            )
