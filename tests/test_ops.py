"""ops.py's registrations that span the ops: autograd. The ops are
autograd-free (DESIGN.md); no output may carry a gradient path that silently
drops the gradient: an output either does not require grad, or a backward
through it raises naming the op."""

from __future__ import annotations

import pytest
import torch

import localargmax
from localargmax.ops import FUSED_OPS, STEP_OPS


def _calls(h, w):
    """Every registered op with float inputs that require grad: name -> outputs."""
    t = torch.full((h.shape[0],), 0.9, requires_grad=True)
    b = torch.randn(w.shape[0], requires_grad=True)
    ops = torch.ops.localargmax
    keys = ops.shard_argmax(h, w, b, 0, w.shape[0])
    frame = ops.step_frame(h.detach(), w.detach(), None, 0, w.shape[0], 2, 1, t.detach(), 1, 0, 1.0, 0.0, True, True,
                           False)  # fmt: skip
    return {
        "shard_argmax": (keys,),
        "shard_topk": (ops.shard_topk(h, w, b, 0, w.shape[0], 3),),
        "shard_sample": (ops.shard_sample(h, w, b, 0, w.shape[0], t, 1, 0),),
        "shard_argmax_lse": ops.shard_argmax_lse(h, w, b, 0, w.shape[0]),
        "shard_topk_lse": ops.shard_topk_lse(h, w, b, 0, w.shape[0], 3),
        "shard_sample_lse": ops.shard_sample_lse(h, w, b, 0, w.shape[0], t, 1, 0),
        "merge_keys": ops.merge_keys(keys[None], None),
        "gumbel_noise": (ops.gumbel_noise(1, torch.arange(h.shape[0]), torch.arange(h.shape[0])),),
        "vllm_gumbel_noise": (ops.vllm_gumbel_noise(*(torch.arange(h.shape[0]),) * 3),),
        "step_frame": (ops.step_frame(h, w, b, 0, w.shape[0], 2, 1, t, 1, 0, 1.0, 0.0, True, True, False),),
        "merge_frames": ops.merge_frames(frame, h.shape[0], 1, True, 2, None, 0, t, True, False, False, True),
        "log_probs_from_pairs": (ops.log_probs_from_pairs(h[:, 0], torch.stack([h[:, :2]] * 2), t),),
    }


def test_every_op_is_walked():
    assert set(_calls(torch.randn(2, 8), torch.randn(20, 8))) == set(FUSED_OPS) | set(STEP_OPS)
    registered = {name for name in dir(torch.ops.localargmax) if not name.startswith("_")} - {"name"}
    assert registered == set(FUSED_OPS) | set(STEP_OPS), "an op of csrc/ops.cpp is missing from FUSED_OPS / STEP_OPS"


@pytest.mark.parametrize("op", FUSED_OPS + STEP_OPS)
def test_no_output_drops_a_gradient(op, gen):
    hidden = torch.randn(3, 8, generator=gen, requires_grad=True)
    weight = torch.randn(50, 8, generator=gen, requires_grad=True)
    outputs = _calls(hidden, weight)[op]
    for out in outputs:
        if not out.requires_grad:
            assert not out.is_floating_point() or out.grad_fn is None
            continue
        # FUSED_OPS: ops.py's message; STEP_OPS: C++'s autograd fallback's
        with pytest.raises(RuntimeError, match=rf"localargmax::{op} is not (differentiable|implemented)"):
            (out[:, 0] + out[:, 1].log()).sum().backward() if out.dim() == 2 else out.sum().backward()
    assert hidden.grad is None and weight.grad is None


@pytest.mark.parametrize("make", ["argmax", "topk", "sample"])
def test_public_log_partition_pairs_raise_on_backward(make, gen):
    """The issue's input: ``(pairs[:, 0] + pairs[:, 1].log()).sum().backward()``
    used to complete with ``X.grad is None``."""
    x = torch.randn(3, 8, generator=gen, requires_grad=True)
    w = torch.randn(50, 8, generator=gen)
    _, pairs = {
        "argmax": lambda: localargmax.shard_argmax(x, w, log_partition=True),
        "topk": lambda: localargmax.shard_topk(x, w, 2, log_partition=True),
        "sample": lambda: localargmax.shard_sample(x, w, torch.ones(3), 1, 0, log_partition=True),
    }[make]()
    with pytest.raises(RuntimeError, match="is not differentiable"):
        (pairs[:, 0] + pairs[:, 1].log()).sum().backward()
    assert x.grad is None
    # the step's log-probabilities travel as int64 bits: no gradient path at all
    _, log_probs = localargmax.lm_head_argmax(x, w, return_log_probs=True)
    assert not log_probs.requires_grad
