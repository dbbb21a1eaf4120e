"""``LogitsProcessor.get_top_tokens`` / ``get_top_k_tokens`` on the fused op,
with the running vLLM's vocabulary and tie rules (versions.py)."""

from __future__ import annotations

import math
import threading

import torch

from . import patching
from .collective import coordinator_all_gather
from .counters import STATS, fallback

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_RULES = {"release": None}  # the versions.Release installed with the methods
LOG_ODDS = threading.local()  # .request: the temperature [B] a draft step asks log-odds at; .log_odds: the answer


def install(release) -> None:
    """Replace vLLM's two methods; ``release``: the versions.Release whose rules they follow."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    _RULES["release"] = release
    patching.patch("logits", LogitsProcessor, "get_top_tokens", get_top_tokens)
    patching.patch("logits", LogitsProcessor, "get_top_k_tokens", get_top_k_tokens)


def uninstall() -> None:
    patching.undo("logits")
    _RULES["release"] = None


def _original(name: str):
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    return patching.original(LogitsProcessor, name)


def unsupported_reason(
    lp, lm_head, hidden_states, embedding_bias=None, k: int | None = None, return_log_probs: bool = False
) -> str | None:
    """Why the fused op cannot serve this call (vLLM's method will), or None.

    Every input here is the same on every TP rank: the processor's and the
    head's configuration, the replicated hidden states' shape/dtype/device,
    the bias's shape/dtype, ``k`` and ``return_log_probs``.
    """
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    from ... import WITH_CUDA

    if lp.logits_as_input:
        return "logits_as_input"
    if not isinstance(getattr(lm_head, "quant_method", None), (UnquantizedEmbeddingMethod, UnquantizedLinearMethod)):
        return "quantized lm_head"
    scale, cap = lp.scale, lp.soft_cap
    if not isinstance(scale, (int, float)) or not (0 < scale < math.inf):
        return "non-positive or non-finite scale"
    if cap is not None and (not isinstance(cap, (int, float)) or not (0 < cap < math.inf)):
        return "soft_cap not a positive number"
    if getattr(lm_head, "num_added_embeddings", 0):
        return "added (LoRA) vocabulary in the shard"
    weight = getattr(lm_head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.dtype not in _FLOAT_DTYPES:
        return "lm_head weight not a 2-D float tensor"
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2:
        return "hidden_states not 2-D"
    if hidden_states.dtype != weight.dtype:
        return "hidden_states dtype differs from the weight dtype"
    if lp.head_dtype not in (None, hidden_states.dtype, torch.float32):
        return "head_dtype other than the model dtype or float32"
    if hidden_states.device != weight.device or hidden_states.device.type not in ("cpu", "cuda"):
        return "hidden_states on another device"
    if hidden_states.device.type == "cuda" and not WITH_CUDA:
        return "localargmax built without CUDA kernels"
    if weight.stride(1) != 1:
        return "lm_head weight rows not contiguous"
    if embedding_bias is not None and (
        not isinstance(embedding_bias, torch.Tensor)
        or tuple(embedding_bias.shape) != (weight.shape[0],)
        or embedding_bias.dtype not in (torch.float32, weight.dtype)
    ):
        return "embedding_bias not a [rows] float32 / weight-dtype tensor"
    if k is not None:
        from ... import MAX_TOPK

        if not isinstance(k, int) or not 1 <= k <= MAX_TOPK:
            return f"k outside [1, {MAX_TOPK}]"
        if k > lp.org_vocab_size or k > weight.shape[0]:
            return "k larger than the vocabulary or the shard"
    return None


def vocab_end(lp, lm_head) -> int:
    """The global end of the vocabulary vLLM's methods let win, by the
    installed release's rule: the head's ``org_vocab_end_index``, and on
    vLLM 0.34 also at most the processor's ``org_vocab_size``
    (``LogitsProcessor._mask_outside_vocab``: a head shared with another
    model can have rows past this processor's vocabulary)."""
    end = int(lm_head.shard_indices.org_vocab_end_index)
    release = _RULES["release"]
    if release is not None and release.masks_past_org_vocab_size:
        end = min(end, int(lp.org_vocab_size))
    return end


def layout(lp, lm_head):
    """``(vocab_start, num_valid, group)`` of a vLLM ParallelLMHead under
    processor ``lp`` (``num_valid`` 0 for a shard wholly past the
    vocabulary): the group is None at TP 1, else the TP
    ``GroupCoordinator``'s all-gather."""
    start = int(lm_head.shard_indices.org_vocab_start_index)
    num_valid = max(0, vocab_end(lp, lm_head) - start)
    if lm_head.tp_size == 1:
        return start, num_valid, None
    coordinator = getattr(lm_head, "parallel_group", None)
    if coordinator is None:
        from vllm.distributed import get_tp_group

        coordinator = get_tp_group()
    return start, num_valid, coordinator_all_gather(coordinator)


def transform_kwargs(lp) -> dict:
    """vLLM's soft-cap and scale as the fused op's keywords (empty: none)."""
    if lp.soft_cap is None and lp.scale == 1.0:
        return {}
    return {"logit_scale": float(lp.scale), "soft_cap": None if lp.soft_cap is None else float(lp.soft_cap)}


def get_top_tokens(self, lm_head, hidden_states: torch.Tensor, embedding_bias: torch.Tensor | None = None):
    """``LogitsProcessor.get_top_tokens`` on :func:`localargmax.lm_head_argmax`:
    ``[B]`` int64 global (draft) ids, the argmax of vLLM's transformed
    logits (soft-capped, then scaled) over the running vLLM's vocabulary
    (:func:`vocab_end`), ties to the smallest id, exact past 2**24. With a
    soft-cap or a scale the keys carry the transformed logits (a saturating
    soft-cap ties distinct logits; vLLM's argmax then takes the smaller id),
    at one more word per row in the exchange. Inside an adaptive-verification
    draft step (adaptive.py) it also leaves the argmax's log-odds for the
    estimator in :data:`LOG_ODDS`."""
    reason = unsupported_reason(self, lm_head, hidden_states, embedding_bias)
    if reason is not None:
        fallback(reason)
        return _original("get_top_tokens")(self, lm_head, hidden_states, embedding_bias)
    from ...plan import cached_plan

    STATS["fused"] += 1
    start, num_valid, group = layout(self, lm_head)
    kw = {
        "weight": lm_head.weight,
        "vocab_start": start,
        "num_valid": num_valid,
        "bias": embedding_bias,
        "group": group,
    }
    transform = transform_kwargs(self)
    temperature = getattr(LOG_ODDS, "request", None)
    if temperature is not None:  # a draft step of adaptive verification: the log-odds vLLM's estimator reads
        plan = cached_plan(self, **kw, return_log_odds=True, **transform)
        ids, LOG_ODDS.log_odds = plan.run(hidden_states, temperature=temperature)
        STATS["fused with log-odds"] += 1
        return ids
    if transform:  # the keys carry the transformed logits, with their pairs
        return cached_plan(self, **kw, return_log_probs=True, **transform).run(hidden_states)[0]
    return cached_plan(self, **kw).run(hidden_states)  # planned at the first call (vLLM's warm-up), then reused


get_top_tokens._localargmax = True


def get_top_k_tokens(
    self,
    lm_head,
    hidden_states: torch.Tensor,
    k: int,
    embedding_bias: torch.Tensor | None = None,
    *,
    return_log_probs: bool = False,
):
    """``LogitsProcessor.get_top_k_tokens`` on :func:`localargmax.lm_head_topk`:
    ``(ids [B, k] int64, values [B, k] float32)`` over the running vLLM's
    vocabulary (:func:`vocab_end`). The values are the exact float32 logits,
    then, as vLLM's method does, multiplied by ``scale`` and soft-capped (in
    that order). With ``return_log_probs=True`` the logits are soft-capped,
    then scaled (vLLM's order there), and the values are their
    log-probabilities ``x - logsumexp(x)`` over that vocabulary, computed by
    the fused kernel's log-partition (one more int64 word per row per rank
    in the same exchange instead of vLLM's extra all-gather)."""
    reason = unsupported_reason(self, lm_head, hidden_states, embedding_bias, k, return_log_probs)
    if reason is not None:
        fallback(reason)
        return _original("get_top_k_tokens")(
            self, lm_head, hidden_states, k, embedding_bias, return_log_probs=return_log_probs
        )
    from ...plan import cached_plan

    STATS["fused"] += 1
    start, num_valid, group = layout(self, lm_head)
    kw = {"weight": lm_head.weight, "kind": "topk", "k": k, "vocab_start": start, "num_valid": num_valid}
    kw.update(bias=embedding_bias, group=group)
    if return_log_probs:
        return cached_plan(self, **kw, return_log_probs=True, **transform_kwargs(self)).run(hidden_states)
    ids, values = cached_plan(self, **kw).run(hidden_states)
    if self.scale != 1.0:
        values = values * self.scale
    if self.soft_cap is not None:
        values = torch.tanh(values / self.soft_cap) * self.soft_cap
    return ids, values


get_top_k_tokens._localargmax = True
