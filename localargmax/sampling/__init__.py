"""Sampling over a vocab-parallel lm_head, in one home: the draft-side step
(:mod:`.step`: :func:`lm_head_sample`, :func:`filtered_sample`), vLLM's
filters (:mod:`.filters`), the noise of both kinds (:mod:`.noise`: Philox,
vLLM's murmur3) and the log-probabilities every step and vLLM's target
sampler share (:mod:`.logprobs`)."""

from .filters import decide_rows, filter_and_sample, filter_sorted, vllm_scores
from .logprobs import log_odds_from_pairs, log_probs_from_pairs
from .noise import gumbel_noise, vllm_gumbel_noise, vllm_noise
from .step import CANDIDATES, FALLBACKS, fallback_payload_length, filtered_sample, lm_head_sample

__all__ = [
    "CANDIDATES",
    "FALLBACKS",
    "decide_rows",
    "fallback_payload_length",
    "filter_and_sample",
    "filter_sorted",
    "filtered_sample",
    "gumbel_noise",
    "lm_head_sample",
    "log_odds_from_pairs",
    "log_probs_from_pairs",
    "vllm_gumbel_noise",
    "vllm_noise",
    "vllm_scores",
]
