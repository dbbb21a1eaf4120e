"""Adaptive verification (``enable_adaptive_verification``) with
``use_local_argmax_reduction``: vLLM refuses the pair twice
(``SpeculativeConfig.__post_init__`` and ``DraftModelSpeculator.load_model``)
because its estimator reads draft logits that local argmax never
materialises. This module lifts both refusals and writes the estimator's
state from the fused op's exact log-odds (docs/vllm.md, "Adaptive
verification with local argmax")."""

from __future__ import annotations

import torch

from . import patching
from .logits import LOG_ODDS

_RULES = {"release": None}  # the versions.Release whose estimator conventions write_estimator_state follows


def install(release) -> None:
    """Lift the two refusals and patch ``sample_draft`` (``release``: the
    versions.Release whose adaptive probes passed)."""
    from vllm.config.speculative import SpeculativeConfig
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    _RULES["release"] = release
    patching.patch("adaptive", SpeculativeConfig, "__post_init__", _config_post_init)
    patching.patch("adaptive", DraftModelSpeculator, "load_model", _load_model)
    patching.patch("adaptive", DraftModelSpeculator, "sample_draft", _sample_draft)


def uninstall() -> None:
    patching.undo("adaptive")
    _RULES["release"] = None


def active() -> bool:
    """Whether vLLM's refusals of adaptive verification with local argmax are
    lifted in this process."""
    return patching.patched("adaptive")


def _original(cls_name: str, name: str):
    if cls_name == "SpeculativeConfig":
        from vllm.config.speculative import SpeculativeConfig as cls
    else:
        from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator as cls
    return patching.original(cls, name)


def _config_post_init(self):
    """``SpeculativeConfig.__post_init__`` with the pair allowed: vLLM's own
    checks run with ``enable_adaptive_verification`` off for that one test,
    then it is restored (nothing else in ``__post_init__`` reads it, on 0.33
    and 0.34)."""
    lift = bool(self.enable_adaptive_verification and self.use_local_argmax_reduction)
    if lift:
        self.enable_adaptive_verification = False
    try:
        return _original("SpeculativeConfig", "__post_init__")(self)
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
    original = _original("DraftModelSpeculator", "load_model")
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
    spec_step_idx: int = 0, *rest,
):  # fmt: skip
    """``DraftModelSpeculator.sample_draft`` (``rest``: 0.34's and 0.33's
    ``num_steps``, absent on 0.32); its local-argmax branch (greedy
    drafts, no draft logits) with an estimator asks the fused op for the
    argmax's log-odds at each request's temperature and writes the
    estimator's state from them (:func:`write_estimator_state`). Where vLLM's
    own ``get_top_tokens`` ran instead (a fallback), vLLM's estimator reads
    the logits it computes, as without the plugin."""
    estimator = self.acceptance_estimator
    if not (draft_logits is None and self.use_local_argmax_reduction and estimator is not None):
        return _original("DraftModelSpeculator", "sample_draft")(
            self, hidden_states, sample_src_positions, idx_mapping, temperature, seeds, draft_step, draft_logits,
            spec_step_idx, *rest,
        )  # fmt: skip
    rows = idx_mapping[: hidden_states.shape[0]].to(torch.int64)
    LOG_ODDS.request, LOG_ODDS.log_odds = self.temperature[rows.clamp(min=0)], None
    try:
        ids = self.get_draft_top_tokens(hidden_states, spec_step_idx)
        log_odds = LOG_ODDS.log_odds
    finally:
        LOG_ODDS.request = LOG_ODDS.log_odds = None
    if log_odds is None or getattr(estimator, "localargmax_rows", None) is None:
        self._maybe_predict_acceptance(self.compute_draft_logits(hidden_states, spec_step_idx), idx_mapping, draft_step)
    else:
        write_estimator_state(estimator, log_odds, rows, draft_step, self.draft_token_confidence_probs)
    return ids


def write_estimator_state(estimator, log_odds, rows, draft_step, confidence_probs, nan_feature=None) -> None:
    """What vLLM's ``_predict_kernel`` writes, from exact log-odds instead of
    its per-block partials: ``feature = clamp(log_odds, ±40)`` at
    ``features[rows[b], step]``, ``p = sigmoid(slope · feature +
    intercepts[step])`` at ``predictions[rows[b], step]`` and
    ``confidence_probs[batch row, step]``. A NaN log-odds (a row with a NaN,
    a ``+inf`` or only ``-inf`` entries) is written as ``nan_feature``
    (default: the installed release's, -40 on vLLM 0.34, +40 on 0.33, as each
    version's kernel writes there); ``+inf`` (one finite entry) as +40.
    ``log_odds``: ``[B]`` float32; ``rows``: ``[B]`` int64 request slots;
    ``draft_step``: a 0-d step shared by every row, or ``[B]`` per row (then
    each request owns ``num_speculative_steps`` consecutive rows, as vLLM's
    kernel assumes). Rows with ``rows[b] < 0`` (CUDA-graph padding) change
    nothing vLLM reads: their features go to the spare row, their
    confidences stay. No host synchronisation."""
    from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import _MAX_LOG_ODDS

    if nan_feature is None:
        nan_feature = _RULES["release"].nan_feature
    batch = log_odds.shape[0]
    arange = torch.arange(batch, device=log_odds.device)
    if draft_step.dim() > 0:
        step, batch_idx = draft_step[:batch].to(torch.int64), arange // estimator.num_speculative_steps
    else:
        step, batch_idx = draft_step.to(torch.int64).expand(batch), arange
    feature = torch.nan_to_num(log_odds, nan=nan_feature).clamp(-_MAX_LOG_ODDS, _MAX_LOG_ODDS)
    prob = torch.sigmoid(estimator.slope * feature + estimator.intercepts[step])
    features, predictions = estimator.localargmax_rows
    valid = rows >= 0
    slot = torch.where(valid, rows, features.shape[0] - 1)  # the spare row
    features.index_put_((slot, step), feature)
    predictions.index_put_((slot, step), prob)
    confidence_probs.index_put_((batch_idx, step), torch.where(valid, prob, confidence_probs[batch_idx, step]))
