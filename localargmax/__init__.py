"""localargmax: fused vocab-parallel lm_head argmax for greedy speculative drafting.

Each TP rank computes ``hidden @ weight_shard.T`` *and* the row-wise argmax in
one fused kernel (the logits never touch memory), the ranks exchange one
64-bit packed key per row instead of all-gathering ``[batch, vocab]`` logits,
and every rank merges the keys and maps draft ids to target ids with ``d2t``.

Public API:
    shard_argmax, merge_keys, decode_keys   the ops (torch.ops.localargmax.*)
    shard_topk, shard_sample                top-k and Gumbel-max sampling ops
    lm_head_argmax                          the whole step (kernel + collective + merge)
    StepPlan                                the same step planned once at load, run per call (few launches)
    lm_head_topk, lm_head_sample            the same for top-k and tp-invariant sampling
                                            (all three: return_log_probs=True, fused log-probabilities)
    lm_head_sample(top_k=, top_p=, min_p=)  vLLM's filters, exact, one exchange (localargmax.sampling)
    log_probs_from_pairs                    the log-probabilities' merge of the ranks' pairs
    log_odds_from_pairs                     the argmax's log-odds from them (lm_head_argmax(return_log_odds=True))
    exchange_keys                           the collective step alone
    kernel_path                             which kernel path serves a weight dtype (CPU: by its features)
    LOCAL_SHARD                             group= sentinel: one shard's own answer, no exchange (on purpose)
    payload_length                          int64 words one rank sends per step (a callable group's buffer)
    shard_vocab, VocabShard, check_layouts  the standard vocab-parallel layout
    VocabParallelLMHead, LocalArgmaxMixin   drop-in pieces for draft models
    build_d2t, validate_d2t                 EAGLE-3 draft-to-target maps
    localargmax.baselines                   full_gather_argmax, unfused_local_argmax
    localargmax.reference                   the float64 reference

The semantics and the key format are fixed in DESIGN.md.
"""

from ._ext import WITH_CUDA
from ._validation import VllmNoise
from .collective import LOCAL_SHARD, exchange_keys, payload_length
from .d2t import build_d2t, draft_to_target_ids, validate_d2t
from .layout import VocabShard, check_layouts, shard_vocab
from .lm_head import LocalArgmaxMixin, VocabParallelLMHead
from .ops import MAX_GLOBAL_INDEX, MAX_TOPK, decode_keys, merge_keys, shard_argmax, shard_sample, shard_topk
from .paths import kernel_path
from .plan import StepPlan
from .sampling import lm_head_sample, log_odds_from_pairs, log_probs_from_pairs, vllm_gumbel_noise, vllm_noise
from .step import lm_head_argmax, lm_head_topk

__version__ = "0.1.0"

__all__ = [
    "LOCAL_SHARD",
    "MAX_GLOBAL_INDEX",
    "MAX_TOPK",
    "LocalArgmaxMixin",
    "StepPlan",
    "VocabParallelLMHead",
    "VocabShard",
    "VllmNoise",
    "check_layouts",
    "WITH_CUDA",
    "build_d2t",
    "decode_keys",
    "draft_to_target_ids",
    "exchange_keys",
    "kernel_path",
    "lm_head_argmax",
    "lm_head_sample",
    "lm_head_topk",
    "log_odds_from_pairs",
    "log_probs_from_pairs",
    "merge_keys",
    "payload_length",
    "shard_argmax",
    "shard_sample",
    "shard_topk",
    "shard_vocab",
    "validate_d2t",
    "vllm_gumbel_noise",
    "vllm_noise",
]
