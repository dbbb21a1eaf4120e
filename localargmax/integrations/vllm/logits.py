"""vLLM general plugin: ``LogitsProcessor.get_top_tokens`` and
``get_top_k_tokens`` on the fused op.

vLLM 0.33 drafts greedily, under ``SpeculativeConfig.use_local_argmax_reduction``,
through ``LocalArgmaxMixin.get_top_tokens`` -> ``LogitsProcessor.get_top_tokens``
(per-rank argmax over materialised logits, then an all-gather of float32
(value, index) pairs), and tree/parallel drafters call
``LogitsProcessor.get_top_k_tokens``. :func:`register` (the entry point of
group ``vllm.general_plugins``, loaded by vLLM in every process) replaces those
two methods with :func:`get_top_tokens` / :func:`get_top_k_tokens`, which run
:func:`localargmax.lm_head_argmax` / :func:`localargmax.lm_head_topk` on vLLM's
own ``ParallelLMHead`` (its weight and ``shard_indices``), exchanging through
the TP ``GroupCoordinator.all_gather`` (docs/vllm.md says which collective
that is in each vLLM mode). vLLM's ``LocalArgmaxMixin`` still applies ``d2t`` (``top + d2t[top]``)
unchanged.

Everything the fused op does not cover runs vLLM's original method
(:func:`unsupported_reason` lists the cases). The decision uses only values
every TP rank shares (vLLM config, layer attributes, shapes and dtypes of the
replicated hidden states, ``k``), so no rank takes the fused collective while
another takes vLLM's.

Adaptive verification (``enable_adaptive_verification``) with
``use_local_argmax_reduction``: vLLM 0.33 refuses the pair (its estimator
reads draft logits that local argmax never materialises). On vLLM
:data:`ADAPTIVE_VERIFICATION_VLLM` the plugin lifts both refusals and the
local-argmax branch of ``DraftModelSpeculator.sample_draft`` gets the argmax's
exact log-odds from the fused pass (:func:`localargmax.lm_head_argmax`,
``return_log_odds=True``) at each request's temperature and writes vLLM's
estimator state from them (:func:`write_estimator_state`); vLLM's online fit
is unchanged. On other vLLM versions the refusals stay (one log line says why).

Check it is active: ``localargmax.integrations.vllm.is_active()`` (and
:func:`adaptive_verification_active`), or the counters of :func:`stats`
(fused calls, and fallbacks by reason). Set ``LOCALARGMAX_VLLM_PLUGIN=0`` to
keep vLLM's own methods.
"""

from __future__ import annotations

import collections
import logging
import math
import sys
import threading
import weakref

import torch

from ..collective import padded_words

logger = logging.getLogger("localargmax.integrations.vllm")

_ORIGINAL = {}  # method name -> vLLM's original function
_STATS: collections.Counter[str] = collections.Counter()
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def register() -> None:
    """Entry point (``vllm.general_plugins``): install unless
    ``LOCALARGMAX_VLLM_PLUGIN=0``."""
    from .. import envs

    if not envs.LOCALARGMAX_VLLM_PLUGIN:
        logger.info("localargmax vLLM plugin disabled by LOCALARGMAX_VLLM_PLUGIN=0")
        return
    install()


def install() -> None:
    """Replace ``LogitsProcessor.get_top_tokens`` / ``get_top_k_tokens``, and
    on vLLM :data:`ADAPTIVE_VERIFICATION_VLLM` lift the adaptive-verification
    refusals (idempotent)."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    if is_active():
        return
    for name, new in (("get_top_tokens", get_top_tokens), ("get_top_k_tokens", get_top_k_tokens)):
        _ORIGINAL[name] = getattr(LogitsProcessor, name)
        setattr(LogitsProcessor, name, new)
    logger.info("localargmax: vLLM LogitsProcessor.get_top_tokens / get_top_k_tokens run on the fused op")
    _install_adaptive_verification()


def uninstall() -> None:
    """Put vLLM's own methods back."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    for name, original in _ORIGINAL.items():
        setattr(LogitsProcessor, name, original)
    _ORIGINAL.clear()
    _uninstall_adaptive_verification()


def is_active() -> bool:
    """Whether vLLM's ``LogitsProcessor`` currently runs on this plugin in this
    process: False when vLLM is not installed, and False outside a vLLM
    process until vLLM loads its plugins (``vllm.plugins.load_general_plugins()``,
    which every vLLM engine and worker process calls) or :func:`install` runs."""
    module = sys.modules.get("vllm.model_executor.layers.logits_processor")  # install() imports it
    if module is None:
        return False
    return getattr(module.LogitsProcessor.get_top_tokens, "_localargmax", False)


def stats() -> dict:
    """Calls in this process: ``{"fused": n, "fallback: <reason>": n,
    "collective: GroupCoordinator.all_gather (<vLLM device communicator>)": n}``
    (the last: exchanges of the fused path at TP > 1, by the communicator
    class vLLM's coordinator dispatched to)."""
    return dict(_STATS)


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

    from .. import WITH_CUDA

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
        from .. import MAX_TOPK

        if not isinstance(k, int) or not 1 <= k <= MAX_TOPK:
            return f"k outside [1, {MAX_TOPK}]"
        if k > lp.org_vocab_size or k > weight.shape[0]:
            return "k larger than the vocabulary or the shard"
    return None


def _fallback(reason: str) -> None:
    """Count a call that runs vLLM's own method, and log each reason once at WARNING."""
    key = "fallback: " + reason
    if key not in _STATS:
        logger.warning(
            "localargmax: vLLM's own LogitsProcessor method runs for %s (logged once per reason; "
            "localargmax.integrations.vllm.stats() counts the calls)",
            reason,
        )
    _STATS[key] += 1


PAYLOAD_ALIGN_BYTES = 16
"""The exchange's payload is padded to this many bytes (vLLM's custom one-shot
all-gather takes fp16 / bf16 / fp32 in 16-byte multiples): the same rule on
every rank, ``localargmax.payload_length(..., align_bytes=16)``."""


def _coordinator_all_gather(coordinator):
    """The step's collective on vLLM's ``GroupCoordinator``: a callable group
    (``[L]`` int64 -> ``[tp, L]``) that pads the payload to
    :data:`PAYLOAD_ALIGN_BYTES`, bit-casts it to float32 (an all-gather moves
    bits; no arithmetic touches them) and calls ``coordinator.all_gather(x,
    dim=0)``, so vLLM's device communicator picks its collective (pynccl, also
    under CUDA-graph capture; NCCL symmetric memory where enabled; gloo / shared
    memory on CPU) — never raw torch.distributed on the group. Built once per
    coordinator (a step reuses it: no closure per call)."""
    try:
        found = _GATHERS.get(coordinator)
    except TypeError:  # a coordinator that takes no weak reference: built per call
        found = None
    if found is not None:
        return found
    tp = coordinator.world_size
    name = f"collective: GroupCoordinator.all_gather ({type(coordinator.device_communicator).__name__})"

    def all_gather(payload: torch.Tensor) -> torch.Tensor:
        length = payload.shape[0]
        words = padded_words(length, PAYLOAD_ALIGN_BYTES)
        if words != length:
            payload = torch.cat([payload, payload.new_zeros(words - length)])
        gathered = coordinator.all_gather(payload.view(torch.float32), dim=0)
        _STATS[name] += 1
        return gathered.view(torch.int64).view(tp, words)[:, :length]

    try:
        _GATHERS[coordinator] = all_gather
    except TypeError:
        pass
    return all_gather


_GATHERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # coordinator -> its all_gather


def _layout(lm_head):
    """(vocab_start, num_valid, group) of a vLLM ParallelLMHead: the group is
    None at TP 1, else the TP ``GroupCoordinator``'s all-gather."""
    idx = lm_head.shard_indices
    start, end = int(idx.org_vocab_start_index), int(idx.org_vocab_end_index)
    if lm_head.tp_size == 1:
        return start, end - start, None
    coordinator = getattr(lm_head, "parallel_group", None)
    if coordinator is None:
        from vllm.distributed import get_tp_group

        coordinator = get_tp_group()
    return start, end - start, _coordinator_all_gather(coordinator)


def get_top_tokens(self, lm_head, hidden_states: torch.Tensor, embedding_bias: torch.Tensor | None = None):
    """``LogitsProcessor.get_top_tokens`` on :func:`localargmax.lm_head_argmax`:
    ``[B]`` int64 global (draft) ids, ``torch.argmax`` of the full unpadded
    float32 logits (ties to the smallest id, exact past 2**24). Inside an
    adaptive-verification draft step (:func:`_sample_draft`) it also leaves
    the argmax's log-odds for the estimator (then the ids are those of the
    soft-capped, scaled logits the estimator sees: the same ids, but where a
    saturating soft-cap ties two logits)."""
    reason = unsupported_reason(self, lm_head, hidden_states, embedding_bias)
    if reason is not None:
        _fallback(reason)
        return _ORIGINAL["get_top_tokens"](self, lm_head, hidden_states, embedding_bias)
    from ..step import lm_head_argmax

    _STATS["fused"] += 1
    start, num_valid, group = _layout(lm_head)
    kw = {"vocab_start": start, "num_valid": num_valid, "bias": embedding_bias, "group": group}
    temperature = getattr(_LOG_ODDS, "request", None)
    if temperature is None:
        return lm_head_argmax(hidden_states, lm_head.weight, **kw)
    # a draft step of adaptive verification (_sample_draft): the log-odds of the logits vLLM's estimator sees
    cap = None if self.soft_cap is None else float(self.soft_cap)
    ids, _LOG_ODDS.log_odds = lm_head_argmax(
        hidden_states, lm_head.weight, **kw, return_log_odds=True, temperature=temperature,
        logit_scale=float(self.scale), soft_cap=cap,
    )  # fmt: skip
    _STATS["fused with log-odds"] += 1
    return ids


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
    ``(ids [B, k] int64, values [B, k] float32)``. The values are the exact
    float32 logits, then, as vLLM's method does, multiplied by ``scale`` and
    soft-capped (in that order). With ``return_log_probs=True`` the logits are
    soft-capped, then scaled (vLLM's order there), and the values are their
    log-probabilities ``x - logsumexp(x)`` over the full unpadded vocabulary,
    computed by the fused kernel's log-partition (one more int64 word per row
    per rank in the same exchange instead of vLLM's extra all-gather)."""
    reason = unsupported_reason(self, lm_head, hidden_states, embedding_bias, k, return_log_probs)
    if reason is not None:
        _fallback(reason)
        return _ORIGINAL["get_top_k_tokens"](
            self, lm_head, hidden_states, k, embedding_bias, return_log_probs=return_log_probs
        )
    from ..step import lm_head_topk

    _STATS["fused"] += 1
    start, num_valid, group = _layout(lm_head)
    if return_log_probs:
        return lm_head_topk(
            hidden_states,
            lm_head.weight,
            k,
            vocab_start=start,
            num_valid=num_valid,
            bias=embedding_bias,
            group=group,
            return_log_probs=True,
            logit_scale=float(self.scale),
            soft_cap=None if self.soft_cap is None else float(self.soft_cap),
        )
    ids, values = lm_head_topk(
        hidden_states, lm_head.weight, k, vocab_start=start, num_valid=num_valid, bias=embedding_bias, group=group
    )
    if self.scale != 1.0:
        values = values * self.scale
    if self.soft_cap is not None:
        values = torch.tanh(values / self.soft_cap) * self.soft_cap
    return ids, values


get_top_k_tokens._localargmax = True


# ----------------------------------------------------------------------------- adaptive verification

ADAPTIVE_VERIFICATION_VLLM = "0.33.0"
"""The vLLM version whose adaptive-verification code (``SpeculativeConfig``'s
and ``DraftModelSpeculator.load_model``'s refusals, ``sample_draft``,
``OnlineAcceptanceEstimator``) the patch below was checked against; on any
other version the refusals stay and one line says why."""

_AV_ORIGINAL = {}  # "Class.method" -> (the class, vLLM's original function)
_LOG_ODDS = threading.local()  # .request: the temperature [B] a draft step asks log-odds at; .log_odds: the answer


def _install_adaptive_verification() -> None:
    """Lift vLLM's two refusals of ``enable_adaptive_verification`` with
    ``use_local_argmax_reduction`` and feed its estimator from the fused
    op's log-odds (:func:`_sample_draft`); only on
    :data:`ADAPTIVE_VERIFICATION_VLLM`."""
    import vllm

    if vllm.__version__ != ADAPTIVE_VERIFICATION_VLLM:  # (WARNING: vLLM shows nothing lower from our logger)
        logger.warning(
            "localargmax: adaptive verification with use_local_argmax_reduction stays refused: this vLLM is %s, "
            "the patch was checked against %s",
            vllm.__version__,
            ADAPTIVE_VERIFICATION_VLLM,
        )
        return
    from vllm.config.speculative import SpeculativeConfig
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    for cls, name, new in (
        (SpeculativeConfig, "__post_init__", _config_post_init),
        (DraftModelSpeculator, "load_model", _load_model),
        (DraftModelSpeculator, "sample_draft", _sample_draft),
    ):
        _AV_ORIGINAL[f"{cls.__name__}.{name}"] = (cls, cls.__dict__[name])
        setattr(cls, name, new)
    logger.info(
        "localargmax: vLLM's adaptive verification runs with use_local_argmax_reduction (the estimator reads the "
        "fused op's exact log-odds)"
    )


def _uninstall_adaptive_verification() -> None:
    for key, (cls, original) in _AV_ORIGINAL.items():
        setattr(cls, key.split(".", 1)[1], original)
    _AV_ORIGINAL.clear()


def adaptive_verification_active() -> bool:
    """Whether vLLM's refusals of adaptive verification with local argmax are
    lifted in this process (the plugin installed on vLLM
    :data:`ADAPTIVE_VERIFICATION_VLLM`)."""
    return bool(_AV_ORIGINAL)


def _config_post_init(self):
    """``SpeculativeConfig.__post_init__`` with the pair allowed: vLLM's own
    checks run with ``enable_adaptive_verification`` off for that one test,
    then it is restored (nothing else in ``__post_init__`` reads it)."""
    lift = bool(self.enable_adaptive_verification and self.use_local_argmax_reduction)
    if lift:
        self.enable_adaptive_verification = False
    try:
        return _AV_ORIGINAL["SpeculativeConfig.__post_init__"][1](self)
    finally:
        if lift:
            self.enable_adaptive_verification = True


class _EstimatorOff:
    """``use_acceptance_estimator`` while vLLM's ``load_model`` runs: false, and
    distinguishable from a ``False`` the draft model set itself."""

    def __bool__(self) -> bool:
        return False


def _load_model(self, target_model) -> None:
    """``DraftModelSpeculator.load_model`` without its refusal of the pair: the
    original runs with the estimator off, then the estimator is built as vLLM
    builds it, with one spare request row that padded batch rows
    (``idx_mapping == -1``) write into (so no write needs a mask: capturable)."""
    original = _AV_ORIGINAL["DraftModelSpeculator.load_model"][1]
    if not (self.use_acceptance_estimator and self.use_local_argmax_reduction):
        return original(self, target_model)
    from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator

    off = _EstimatorOff()  # falsy; a draft that turns the estimator off itself (DSpark's confidence head) replaces it
    self.use_acceptance_estimator = off
    try:
        original(self, target_model)
    finally:
        wanted = self.use_acceptance_estimator is off
        if wanted:
            self.use_acceptance_estimator = True
    if not wanted:
        return
    estimator = OnlineAcceptanceEstimator(self.max_num_reqs + 1, self.num_speculative_steps, self.device)
    estimator.localargmax_rows = (estimator.features, estimator.predictions)  # [max_num_reqs + 1, steps]
    estimator.features = estimator.features[: self.max_num_reqs]
    estimator.predictions = estimator.predictions[: self.max_num_reqs]
    self.acceptance_estimator = estimator


def _sample_draft(
    self, hidden_states, sample_src_positions, idx_mapping, temperature, seeds, draft_step, draft_logits,
    spec_step_idx: int = 0, num_steps: int = 1,
):  # fmt: skip
    """``DraftModelSpeculator.sample_draft``; its local-argmax branch (greedy
    drafts, no draft logits) with an estimator asks the fused op for the
    argmax's log-odds at each request's temperature and writes the
    estimator's state from them (:func:`write_estimator_state`). Where vLLM's
    own ``get_top_tokens`` ran instead (a fallback), vLLM's estimator reads
    the logits it computes, as without the plugin."""
    original = _AV_ORIGINAL["DraftModelSpeculator.sample_draft"][1]
    estimator = self.acceptance_estimator
    if not (draft_logits is None and self.use_local_argmax_reduction and estimator is not None):
        return original(
            self, hidden_states, sample_src_positions, idx_mapping, temperature, seeds, draft_step, draft_logits,
            spec_step_idx, num_steps,
        )  # fmt: skip
    rows = idx_mapping[: hidden_states.shape[0]].to(torch.int64)
    _LOG_ODDS.request, _LOG_ODDS.log_odds = self.temperature[rows.clamp(min=0)], None
    try:
        ids = self.get_draft_top_tokens(hidden_states, spec_step_idx)
        log_odds = _LOG_ODDS.log_odds
    finally:
        _LOG_ODDS.request = _LOG_ODDS.log_odds = None
    if log_odds is None or getattr(estimator, "localargmax_rows", None) is None:
        self._maybe_predict_acceptance(self.compute_draft_logits(hidden_states, spec_step_idx), idx_mapping, draft_step)
    else:
        write_estimator_state(estimator, log_odds, rows, draft_step, self.draft_token_confidence_probs)
    return ids


def write_estimator_state(estimator, log_odds, rows, draft_step, confidence_probs) -> None:
    """What vLLM's ``_predict_kernel`` writes, from exact log-odds instead of
    ``-log(total - 1)`` of per-block partials: ``feature = clamp(log_odds,
    ±40)`` at ``features[rows[b], step]``, ``p = sigmoid(slope · feature +
    intercepts[step])`` at ``predictions[rows[b], step]`` and
    ``confidence_probs[batch row, step]``; a NaN log-odds (a NaN, +inf or
    all -inf row) is written as +40, as vLLM's kernel writes there. ``draft_step``: a 0-d step shared
    by every row, or ``[B]`` per row (then each request owns
    ``num_speculative_steps`` consecutive rows, as vLLM's kernel assumes).
    Rows with ``rows[b] < 0`` (CUDA-graph padding) change nothing vLLM reads:
    their features go to the spare row, their confidences stay. No host
    synchronisation."""
    from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import _MAX_LOG_ODDS

    batch = log_odds.shape[0]
    arange = torch.arange(batch, device=log_odds.device)
    if draft_step.dim() > 0:
        step, batch_idx = draft_step[:batch].to(torch.int64), arange // estimator.num_speculative_steps
    else:
        step, batch_idx = draft_step.to(torch.int64).expand(batch), arange
    # NaN (a NaN / all -inf row): vLLM's kernel clamps total - 1 at 0 there, so its feature is +40
    feature = torch.nan_to_num(log_odds, nan=_MAX_LOG_ODDS).clamp(-_MAX_LOG_ODDS, _MAX_LOG_ODDS)
    prob = torch.sigmoid(estimator.slope * feature + estimator.intercepts[step])
    features, predictions = estimator.localargmax_rows
    valid = rows >= 0
    slot = torch.where(valid, rows, features.shape[0] - 1)  # the spare row
    features.index_put_((slot, step), feature)
    predictions.index_put_((slot, step), prob)
    confidence_probs.index_put_((batch_idx, step), torch.where(valid, prob, confidence_probs[batch_idx, step]))
