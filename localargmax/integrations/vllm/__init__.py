"""vLLM general plugin: ``LogitsProcessor.get_top_tokens`` and
``get_top_k_tokens`` on the fused op, and adaptive verification with local
argmax. Supported: vLLM 0.34 and 0.33 (versions.py holds what differs).

vLLM drafts greedily, under ``SpeculativeConfig.use_local_argmax_reduction``,
through ``LocalArgmaxMixin.get_top_tokens`` -> ``LogitsProcessor.get_top_tokens``
(per-rank argmax over materialised logits, then an all-gather of float32
(value, index) pairs), and tree/parallel drafters call
``LogitsProcessor.get_top_k_tokens``. :func:`register` (the entry point of
group ``vllm.general_plugins``, loaded by vLLM in every process) replaces those
two methods (logits.py) with ones that run :func:`localargmax.lm_head_argmax` /
:func:`localargmax.lm_head_topk` on vLLM's own ``ParallelLMHead`` over the
vocabulary that vLLM version masks, exchanging through the TP
``GroupCoordinator.all_gather`` (collective.py; docs/vllm.md says which
collective that is in each vLLM mode). vLLM's ``LocalArgmaxMixin`` still
applies ``d2t`` unchanged. Everything the fused op does not cover runs vLLM's
original method (:func:`unsupported_reason`), decided from values every TP
rank shares.

Adaptive verification (adaptive.py): the plugin lifts vLLM's two refusals of
``enable_adaptive_verification`` with ``use_local_argmax_reduction`` and
writes vLLM's estimator state from the fused pass's exact log-odds
(:func:`write_estimator_state`).

On a vLLM minor not in versions.py the plugin checks the signatures and
attributes it relies on (``inspect``) and runs with the newest matching
release's rules, or stays off; either way one WARNING says which and why.

Check it is active: :func:`is_active` (and :func:`adaptive_verification_active`),
or the counters of :func:`stats`. ``LOCALARGMAX_VLLM_PLUGIN=0`` keeps vLLM's
own methods.
"""

from __future__ import annotations

import sys

from . import adaptive, drafters, logits, target_sampler, versions
from .adaptive import write_estimator_state
from .collective import PAYLOAD_ALIGN_BYTES, payload_dtype
from .counters import STATS, logger
from .logits import unsupported_reason

__all__ = [
    "PAYLOAD_ALIGN_BYTES",
    "adaptive_verification_active",
    "install",
    "is_active",
    "payload_dtype",
    "register",
    "install_target_sampler",
    "stats",
    "uninstall",
    "unsupported_reason",
    "write_estimator_state",
]


def register() -> None:
    """Entry point (``vllm.general_plugins``): install unless
    ``LOCALARGMAX_VLLM_PLUGIN=0``."""
    from ... import envs

    if not envs.LOCALARGMAX_VLLM_PLUGIN:
        logger.info("localargmax vLLM plugin disabled by LOCALARGMAX_VLLM_PLUGIN=0")
        return
    install()


def install() -> None:
    """Replace ``LogitsProcessor.get_top_tokens`` / ``get_top_k_tokens`` and
    lift the adaptive-verification refusals, by the rules of the running
    vLLM's release (versions.py); idempotent. A vLLM whose signatures or
    attributes differ keeps its own methods (or refusals), with one WARNING
    naming what differs."""
    import vllm

    if is_active():
        return
    release, note = versions.select(vllm.__version__, "logits")
    if note is not None:  # (WARNING: vLLM shows nothing lower from our logger)
        logger.warning("localargmax: %s%s", note, "" if release else "; vLLM's own LogitsProcessor methods run")
    if release is None:
        return
    logits.install(release)
    logger.info("localargmax: vLLM LogitsProcessor.get_top_tokens / get_top_k_tokens run on the fused op")
    drafters.install()  # drafters with compute_logits and no get_top_tokens: given one at load (drafters.py)
    install_target_sampler()
    release, note = versions.select(vllm.__version__, "adaptive")
    if release is None:
        logger.warning("localargmax: adaptive verification with use_local_argmax_reduction stays refused: %s", note)
        return
    adaptive.install(release)
    logger.info(
        "localargmax: vLLM's adaptive verification runs with use_local_argmax_reduction (the estimator reads the "
        "fused op's exact log-odds)"
    )


def install_target_sampler() -> bool:
    """Under ``LOCALARGMAX_VLLM_TARGET_SAMPLER=1``, wrap vLLM 0.34's
    ``GPUModelRunner.sample`` (target_sampler.py); on a vLLM without that
    Model Runner V2 sampler (0.33, 0.32) or with different signatures, one
    WARNING says so and vLLM's sampling stays. Returns whether it is active."""
    from ... import envs

    if not envs.LOCALARGMAX_VLLM_TARGET_SAMPLER:
        return target_sampler.active()
    import vllm

    release, note = versions.select(vllm.__version__, "target")
    if release is None:
        logger.warning("localargmax: LOCALARGMAX_VLLM_TARGET_SAMPLER=1, but vLLM's own target sampling runs: %s", note)
        return False
    if note is not None:
        logger.warning("localargmax: target sampler: %s", note)
    target_sampler.install(release)
    logger.info(
        "localargmax: GPUModelRunner.sample draws steps with temperature, top-k, top-p, min-p and raw logprobs "
        "from the lm_head shards (vLLM's noise; other steps run vLLM's Sampler)"
    )
    return True


def uninstall() -> None:
    """Put vLLM's own methods and refusals back."""
    target_sampler.uninstall()
    adaptive.uninstall()
    drafters.uninstall()
    logits.uninstall()


def is_active() -> bool:
    """Whether vLLM's ``LogitsProcessor`` currently runs on this plugin in this
    process: False when vLLM is not installed, and False outside a vLLM
    process until vLLM loads its plugins (``vllm.plugins.load_general_plugins()``,
    which every vLLM engine and worker process calls) or :func:`install` runs."""
    module = sys.modules.get("vllm.model_executor.layers.logits_processor")  # install() imports it
    if module is None:
        return False
    return getattr(module.LogitsProcessor.get_top_tokens, "_localargmax", False)


def adaptive_verification_active() -> bool:
    """Whether vLLM's refusals of adaptive verification with local argmax are
    lifted in this process."""
    return adaptive.active()


def stats() -> dict:
    """Calls in this process: ``{"fused": n, "fused with log-odds": n,
    "fallback: <reason>": n, "collective: GroupCoordinator.all_gather (<vLLM
    device communicator>, <payload view>)": n}`` (the last: exchanges of the
    fused path at TP > 1, by the communicator class vLLM's coordinator
    dispatched to and :func:`payload_dtype`)."""
    return dict(STATS)
