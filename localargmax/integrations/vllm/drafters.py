"""Local argmax for vLLM drafters that have ``compute_logits`` but no
``get_top_tokens`` (DeepSeekMTP, the other MTP classes, DFlashLaguna, ...).

vLLM's ``DraftModelSpeculator._validate_local_argmax_reduction`` refuses
``use_local_argmax_reduction`` for a draft model without ``get_top_tokens``.
:func:`install` wraps that check: before it runs, the loaded draft model
(heads already shared with the target) is probed on a small batch and, if
its ``compute_logits`` returns what its one ``LogitsProcessor`` call returns,
unchanged, it gets ``get_top_tokens(hidden_states, spec_step_idx=0)``
(:func:`_top_tokens_method`): the model's own ``compute_logits`` runs (its head
choice by ``spec_step_idx``, its norm before the head) with that processor
call answered by ``LogitsProcessor.get_top_tokens`` (the fused op while the
plugin is active) instead of computing logits. A model whose
``compute_logits`` does more (a remap, a mask, a scale after the processor,
more than one processor call) keeps no method: one WARNING names the class
and why, and vLLM's own ValueError follows.

The answer is verified at load, on every TP rank, for every draft step the
speculator can ask for: per probe row, the fused id must be one where vLLM's
``compute_logits`` has the row's maximum, or float64's argmax (the
processor's input times the head shard in float64, the shards' best
exchanged). Ranks all-reduce both verdicts; a disagreement raises
``RuntimeError`` naming the class, never a silently different draft.
vLLM calls no model-level top-k in the drafters: tree / candidate drafters
(DFlash2, LiLiCorr) call ``LogitsProcessor.get_top_k_tokens``, which
the plugin's processor methods already serve.
"""

from __future__ import annotations

import inspect
import threading
import types

import torch

from . import patching, versions
from .counters import logger

PROBE_ROWS = 8
"""Rows of the load-time probe batch (the same on every rank: a fixed seed)."""

_LP = "vllm.model_executor.layers.logits_processor:LogitsProcessor"
PROBES = (  # what this module patches (checked with inspect on every vLLM; the same on 0.34 and 0.33)
    f"{_LP}.forward(self, lm_head, hidden_states, embedding_bias, skip_gather)",
    "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator._validate_local_argmax_reduction(self)",
)
_VLLM_FORWARD = [None]  # vLLM's LogitsProcessor.forward (read on every call: no ledger lookup)
_STATE = threading.local()  # .mode: None, "record" or "answer"; .calls: the recorded processor calls; .ids


def install() -> None:
    """Wrap ``LogitsProcessor.forward`` (a pass-through unless a drafter's
    ``get_top_tokens`` or the probe is running) and
    ``DraftModelSpeculator._validate_local_argmax_reduction`` (idempotent)."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    if patching.patched("drafters"):
        return
    differs = versions.differences(PROBES)
    if differs:
        logger.warning("localargmax: drafters without get_top_tokens stay as vLLM has them: %s", "; ".join(differs))
        return
    _VLLM_FORWARD[0] = LogitsProcessor.__dict__["forward"]
    patching.patch("drafters", LogitsProcessor, "forward", _forward)
    patching.patch("drafters", DraftModelSpeculator, "_validate_local_argmax_reduction", _validate)


def uninstall() -> None:
    """Put vLLM's two functions back (models already given the method keep it)."""
    patching.undo("drafters")


def _forward(self, lm_head, hidden_states, embedding_bias=None, skip_gather=False):
    """``LogitsProcessor.forward``: vLLM's, except inside a probed model's ``get_top_tokens``
    (answered by ``self.get_top_tokens``) and inside the probe (recorded)."""
    mode = getattr(_STATE, "mode", None)
    if mode is None:
        return _VLLM_FORWARD[0](self, lm_head, hidden_states, embedding_bias, skip_gather)
    _STATE.mode = None  # a processor call nested in the answer runs as vLLM's
    try:
        if mode == "answer" and not skip_gather:
            _STATE.ids = self.get_top_tokens(lm_head, hidden_states, embedding_bias)
            return _STATE.ids
        out = _VLLM_FORWARD[0](self, lm_head, hidden_states, embedding_bias, skip_gather)
        kept = out.clone() if isinstance(out, torch.Tensor) else out
        _STATE.calls.append((self, lm_head, hidden_states, embedding_bias, skip_gather, out, kept))
        return out
    finally:
        _STATE.mode = mode


def _logits(model, hidden_states, spec_step_idx, takes_step: bool):
    """``model.compute_logits``, with the step where it takes one."""
    if takes_step:
        return model.compute_logits(hidden_states, spec_step_idx=spec_step_idx)
    return model.compute_logits(hidden_states)


def _takes_step(model) -> bool:
    try:
        return "spec_step_idx" in inspect.signature(model.compute_logits).parameters
    except (TypeError, ValueError):
        return False


def _top_tokens_method(takes_step: bool):
    """The ``get_top_tokens`` a probed draft model gets (``takes_step``: its
    ``compute_logits`` takes ``spec_step_idx``, read once at load)."""

    def get_top_tokens(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        """``[B]`` int64 ids, the argmax of what ``self.compute_logits(hidden_states,
        spec_step_idx)`` returns (the step passed only where it takes one),
        from its ``LogitsProcessor`` call answered by ``LogitsProcessor.get_top_tokens``."""
        _STATE.mode, _STATE.ids = "answer", None
        try:
            out = _logits(self, hidden_states, spec_step_idx, takes_step)
        finally:
            _STATE.mode = None
        ids, _STATE.ids = _STATE.ids, None
        if ids is None or out is not ids:
            raise RuntimeError(
                f"localargmax: {type(self).__name__}.compute_logits did not return its LogitsProcessor's output "
                "unchanged in this call (the load-time probe saw it do so)"
            )
        return ids

    return get_top_tokens


def _validate(self) -> None:
    """``DraftModelSpeculator._validate_local_argmax_reduction``, after giving
    a draft model without ``get_top_tokens`` the method where the probe
    allows (:func:`prepare`). A model without ``compute_logits`` is not a
    drafter of this kind: vLLM's own check refuses it."""
    if (
        self.use_local_argmax_reduction
        and self.speculative_config.draft_sample_method != "probabilistic"
        and not hasattr(self.model, "get_top_tokens")
        and callable(getattr(self.model, "compute_logits", None))
    ):
        prepare(self.model, self.hidden_size, self.dtype, self.device, _steps_asked(self))
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    return patching.original(DraftModelSpeculator, "_validate_local_argmax_reduction")(self)


def _steps_asked(speculator) -> range:
    """The ``spec_step_idx`` values ``speculator`` passes to the draft's
    ``get_top_tokens``: 0 only through ``DraftModelSpeculator``'s own
    ``get_draft_top_tokens`` (it passes no step: an MTP layer reused for every
    draft step), every draft step through an override (the multi-module MTP
    speculator's)."""
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    if type(speculator).get_draft_top_tokens is DraftModelSpeculator.get_draft_top_tokens:
        return range(1)
    return range(max(1, int(speculator.num_speculative_steps)))


def prepare(model, hidden_size: int, dtype: torch.dtype, device, steps=(0,)) -> str | None:
    """Probe ``model`` (a loaded vLLM draft model without ``get_top_tokens``)
    on every TP rank and give it ``get_top_tokens`` if its ``compute_logits``
    returns its one ``LogitsProcessor`` call's output unchanged at every step
    in ``steps``, and the fused ids agree with vLLM's there.

    hidden_size, dtype, device: the hidden states ``compute_logits`` takes
    (the speculator's). Returns None (the method was given) or why not (also
    logged once at WARNING). Raises RuntimeError naming the class when the
    fused ids disagree with vLLM's ``compute_logits`` on any rank.
    Collective: every TP rank must call it (an all-reduce per step and one
    more on the TP group's CPU group, an all-gather per step for float64)."""
    install()
    name = type(model).__name__
    takes_step = _takes_step(model)
    steps = steps if takes_step else (0,)
    if not patching.patched("drafters"):
        return "this vLLM's LogitsProcessor or speculator differs from what the drafter hook was checked against"
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(PROBE_ROWS, hidden_size, generator=gen).to(dtype=dtype, device=device)
    records = []
    with torch.no_grad():
        for step in steps:  # a verdict per step, all-reduced: no rank runs a collective the others skip
            record, reason = record_logits(model, hidden, step, takes_step)
            if any_rank(reason is not None):
                reason = reason or "another TP rank's probe found its compute_logits differs"
                logger.warning(
                    "localargmax: draft model %s keeps no get_top_tokens (use_local_argmax_reduction stays "
                    "refused by vLLM): %s",
                    name,
                    reason,
                )
                return reason
            records.append((step, record))
        model.get_top_tokens = types.MethodType(_top_tokens_method(takes_step), model)
        bad = []
        for step, (lp, lm_head, processor_input, bias, logits) in records:
            ids = model.get_top_tokens(hidden, step)
            best = _float64_argmax(lp, lm_head, processor_input, bias)
            bad += [(step, *row) for row in _disagreements(ids, logits, best)]
        if any_rank(bool(bad)):
            del model.get_top_tokens
            raise RuntimeError(
                f"localargmax: draft model {name}: the fused ids disagree with vLLM's compute_logits on the "
                f"load-time probe (step, row, fused id, float64 id; empty: another rank): {bad[:4]}"
            )
    logger.info("localargmax: draft model %s drafts through the fused op (get_top_tokens given)", name)
    return None


def record_logits(model, hidden, step, takes_step):
    """One ``compute_logits`` with its processor calls recorded: ((processor,
    head, processor input, bias, logits), None) or (None, why not). The
    load-time probe of drafters here and of the target sampler
    (target_sampler.py)."""
    _STATE.mode, _STATE.calls = "record", []
    try:
        out = _logits(model, hidden, step, takes_step)
    except Exception as e:  # noqa: BLE001 - any failure leaves the model as vLLM has it
        return None, f"compute_logits failed on a [{hidden.shape[0]}, {hidden.shape[1]}] probe: {e!r}"
    finally:
        _STATE.mode, calls = None, _STATE.calls
        _STATE.calls = []
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    if len(calls) != 1:
        return None, f"compute_logits (step {step}) calls a LogitsProcessor {len(calls)} times, not once"
    lp, lm_head, processor_input, bias, skip_gather, logits, kept = calls[0]
    if skip_gather:
        return None, "compute_logits asks its LogitsProcessor for shard logits (skip_gather)"
    if not isinstance(lm_head, VocabParallelEmbedding):  # a ParallelLMHead, or a tied embedding
        return None, f"its LogitsProcessor's head is a {type(lm_head).__name__}, not a vocab-parallel head"
    if lp.logits_as_input:
        return None, "its LogitsProcessor takes logits as input"
    if out is not logits:
        return None, "compute_logits returns something other than its LogitsProcessor's output (a remap or a mask)"
    if logits is not None and not torch.equal(torch.nan_to_num(logits), torch.nan_to_num(kept)):
        return None, "compute_logits changes its LogitsProcessor's output in place (a mask or a scale after it)"
    return (lp, lm_head, processor_input, bias, logits), None


def _tp_group():
    from vllm.distributed import get_tp_group

    return get_tp_group()


def any_rank(flag: bool) -> bool:
    """``flag`` of any TP rank (a MAX all-reduce on the TP group's CPU group)."""
    group = _tp_group()
    t = torch.tensor([int(flag)])
    if group.world_size > 1:
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=group.cpu_group)
    return bool(t.item())


def _float64_argmax(lp, lm_head, hidden, bias, chunk: int = 4096) -> torch.Tensor:
    """``[B]`` int64: the argmax over the processor's vocabulary of ``hidden @
    W.T + bias`` in float64, W the full head (each rank its shard, chunked;
    the shards' (value, id) exchanged on the CPU group; ties to the smallest id)."""
    idx = lm_head.shard_indices
    start = int(idx.org_vocab_start_index)
    end = min(int(idx.org_vocab_end_index), int(lp.org_vocab_size))
    h = hidden.detach().double().reshape(-1, hidden.shape[-1])
    best = torch.full((h.shape[0],), -torch.inf, dtype=torch.float64, device=h.device)
    best_id = torch.full((h.shape[0],), 2**62, dtype=torch.int64, device=h.device)
    for lo in range(0, max(end - start, 0), chunk):
        hi = min(lo + chunk, end - start)
        x = h @ lm_head.weight[lo:hi].detach().double().T
        if bias is not None:
            x = x + bias[lo:hi].double()
        value, at = x.max(dim=1)
        better = value > best
        best, best_id = torch.where(better, value, best), torch.where(better, at + start + lo, best_id)
    group = _tp_group()
    if group.world_size == 1 or lm_head.tp_size == 1:
        return best_id.cpu()
    pairs = torch.stack([best.cpu(), best_id.cpu().double()])  # ids < 2**53: exact in float64
    gathered = [torch.empty_like(pairs) for _ in range(group.world_size)]
    torch.distributed.all_gather(gathered, pairs, group=group.cpu_group)
    values = torch.stack([g[0] for g in gathered])  # [tp, B]
    ids = torch.stack([g[1] for g in gathered]).to(torch.int64)
    top = values.max(dim=0).values
    return torch.where(values == top, ids, 2**62).min(dim=0).values


def _disagreements(ids, logits, best) -> list[tuple[int, int, int]]:
    """Rows (row, fused id, float64 id) where the fused id is neither at the
    row's maximum of vLLM's logits nor float64's (vLLM's logits: None on a
    rank vLLM gathers none to: then float64 alone judges)."""
    ids, best = ids.cpu(), best.cpu()
    out = []
    for row in range(ids.shape[0]):
        fused = int(ids[row])
        if fused == int(best[row]):
            continue
        if logits is not None and 0 <= fused < logits.shape[-1]:
            r = logits[row].float().cpu()
            if r[fused] == r.max():
                continue
        out.append((row, fused, int(best[row])))
    return out
