"""Shared constants and helpers of the shard_argmax test files
(tests/test_shard_argmax*.py)."""

from __future__ import annotations

import torch

import localargmax
from localargmax.reference import reference_logits
from tests.support.reference import error_bound, ref_logits, ref_transform

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["f32", "bf16", "f16"]
BIASES = [None, "float32", "weight"]
BIAS_IDS = ["nobias", "bias_f32", "bias_wdtype"]
HALF = [torch.bfloat16, torch.float16]


def randint(gen, lo, hi):
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def ids_of(hidden, weight, **kw):
    """The global ids of ``shard_argmax``'s keys, on the CPU."""
    return localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, **kw))[0].cpu()


def blas_reference(hidden, weight, bias=None):
    """``reference_logits_and_error`` (tests/support/reference.py) with the
    float64 logits of a BLAS matmul (fast at large H; its rounding, ~1e-16
    relative, is far below the float32 bound), for
    ``check_against_reference(reference=...)``."""
    logits = reference_logits(hidden, weight, bias)
    err = error_bound(hidden, weight, bias)
    return logits, torch.where(torch.isfinite(logits), err, torch.zeros_like(err))


def dominant_padding(hidden, weight, num_valid):
    """Padding rows whose logits (~1024 |h|^2) would decide the sum if counted."""
    h = hidden.float()
    weight[num_valid:] = (1024 * h[torch.arange(weight.shape[0] - num_valid) % h.shape[0]]).to(weight.dtype)


def log_partition_error(pairs, hidden, weight, bias, num_valid, scale=1.0, soft_cap=None) -> float:
    """Largest |ref + log1p(others) - float64 logsumexp of the valid rows' transformed logits|."""
    b = None if bias is None else bias[:num_valid]
    x = ref_transform(ref_logits(hidden, weight[:num_valid], b), scale, soft_cap)
    got = pairs[:, 0].double() + pairs[:, 1].double().log1p()
    return float((got - torch.logsumexp(x, dim=1)).abs().max())


def logit_at(hidden, weight, row, vocab_start=0):
    """The float32 logit of local ``row`` alone: every other row gets bias -inf."""
    bias = torch.full((weight.shape[0],), float("-inf"))
    bias[row] = 0.0
    ids, values = localargmax.decode_keys(localargmax.shard_argmax(hidden, weight, vocab_start=vocab_start, bias=bias))
    assert ids.eq(vocab_start + row).all()
    return values
