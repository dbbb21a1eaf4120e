"""The vLLM proposer cases of the plugin's rank body (tests/support/vllm_ranks.py):
Model Runner V2's DraftModelSpeculator (vLLM 0.34 and 0.33) on a
LocalArgmaxMixin draft and on vLLM's own Eagle3LlamaForCausalLM: its
load_model's check that the draft has get_top_tokens and sample_draft's
local-argmax branch, unmodified."""

from __future__ import annotations

import torch

from tests.support.vllm_adaptive_cases import speculator
from tests.support.vllm_common import after_loading, head_of, processor, vllm_method


def _draft_greedily(spec, hidden):
    """``sample_draft``'s local-argmax branch (no draft logits, no estimator), one row per request."""
    batch = hidden.shape[0]
    return spec.sample_draft(hidden, None, torch.arange(batch), spec.temperature, None, torch.tensor(0), None)


def proposer_case(plugin, gen, cfg):
    """The seed's switch through vLLM's own speculator code: a draft model with
    vLLM's LocalArgmaxMixin (ParallelLMHead, LogitsProcessor, d2t Parameter);
    ``DraftModelSpeculator.load_model`` (its ``_validate_local_argmax_reduction``:
    the check that the draft has get_top_tokens when use_local_argmax_reduction
    is set) and ``sample_draft`` (which calls model.get_top_tokens) run unmodified."""
    from vllm.config import SpeculativeConfig
    from vllm.model_executor.models.interfaces import LocalArgmaxMixin

    import localargmax

    draft_vocab, target_vocab, hsize, batch = 600, 5000, 24, 5

    class Draft(LocalArgmaxMixin, torch.nn.Module):
        has_own_lm_head = True

        def __init__(self):
            super().__init__()
            self.lm_head = head_of(torch.randn(draft_vocab, hsize, generator=gen))
            self.logits_processor = processor(draft_vocab)
            d2t = localargmax.build_d2t(torch.rand(target_vocab, generator=gen), draft_vocab)
            self.draft_id_to_target_id = torch.nn.Parameter(d2t, requires_grad=False)

    class NoTopTokens(torch.nn.Module):
        """A draft without get_top_tokens whose logits come from no LogitsProcessor
        (the drafter hook of #47 leaves it alone): vLLM's own check refuses it."""

        has_own_lm_head = True

        def __init__(self):
            super().__init__()
            self.weight = torch.randn(draft_vocab, hsize, generator=gen)

        def compute_logits(self, hidden_states):
            return hidden_states @ self.weight.T

    draft = Draft()
    spec = speculator(draft, cfg, adaptive=False, hidden_size=hsize)
    spec.load_model(None)
    out = {"switch_field_default": SpeculativeConfig.__dataclass_fields__["use_local_argmax_reduction"].default}

    hidden = torch.randn(batch, hsize, generator=gen)
    before = plugin.stats().get("fused", 0)
    ours = _draft_greedily(spec, hidden)
    out["fused_calls"] = plugin.stats().get("fused", 0) - before
    theirs = vllm_method("get_top_tokens")(draft.logits_processor, draft.lm_head, hidden)
    theirs = theirs + draft.draft_id_to_target_id[theirs]
    # the reference needs the full draft matrix: gather the shards back
    from vllm.distributed import tensor_model_parallel_all_gather

    full = tensor_model_parallel_all_gather(draft.lm_head.weight.detach().clone(), dim=0)[:draft_vocab]
    ref = (hidden.double() @ full.double().T).argmax(dim=1)
    ref = ref + draft.draft_id_to_target_id[ref]
    out.update(ours=ours.tolist(), vllm=theirs.tolist(), ref=ref.tolist())

    class NoLogits(torch.nn.Module):  # nor compute_logits: the hook must leave vLLM's refusal to vLLM
        has_own_lm_head = True

    for key, model in (("missing_check", NoTopTokens()), ("no_logits_check", NoLogits())):
        try:
            speculator(model, cfg, adaptive=False, hidden_size=hsize).load_model(None)
            out[key] = "no error"
        except Exception as e:  # vLLM's ValueError; anything else (an AttributeError of the hook) fails the test
            out[key] = f"{type(e).__name__}: {e}"
    return out


class _Stub:
    """A config stand-in: the given attributes, None for any other (vLLM reads many optional ones)."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def eagle3_case(plugin, gen, cfg):
    """vLLM's own EAGLE-3 draft class (Eagle3LlamaForCausalLM: LlamaForCausalLM
    with LocalArgmaxMixin, a 600-token draft vocabulary, a d2t Parameter)
    built on CPU at TP = 2, its lm_head and d2t loaded by its own
    load_weights, drafting through DraftModelSpeculator.sample_draft. vLLM
    needs a ModelConfig / SpeculativeConfig made from a checkpoint to build it;
    stand-ins carry what the constructor reads (layer count, vocab sizes, the
    transformers LlamaConfig). The draft's forward (attention) is not run:
    hidden states are random."""
    from transformers import LlamaConfig
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

    import localargmax

    target_vocab, draft_vocab, hsize = 5000, 600, 64
    hf = LlamaConfig(
        vocab_size=target_vocab,
        hidden_size=hsize,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        draft_vocab_size=draft_vocab,
    )
    saved = cfg.model_config, cfg.speculative_config
    object.__setattr__(
        cfg,
        "model_config",
        _Stub(
            get_total_num_hidden_layers=lambda: 2,
            get_vocab_size=lambda: target_vocab,
            hf_config=hf,
            dtype=torch.float32,
            is_moe=False,
        ),
    )
    object.__setattr__(
        cfg, "speculative_config", _Stub(draft_model_config=_Stub(hf_config=hf), parallel_drafting=False)
    )
    try:
        model = Eagle3LlamaForCausalLM(vllm_config=cfg)
    finally:
        object.__setattr__(cfg, "model_config", saved[0])
        object.__setattr__(cfg, "speculative_config", saved[1])
    full = torch.randn(draft_vocab, hsize, generator=gen)
    d2t = localargmax.build_d2t(torch.rand(target_vocab, generator=gen), draft_vocab)
    model.load_weights([("lm_head.weight", full), ("d2t", d2t)])
    after_loading(model.lm_head)

    spec = speculator(model, cfg, adaptive=False, hidden_size=hsize)
    spec.load_model(None)
    hidden = torch.randn(6, hsize, generator=gen)
    before = plugin.stats().get("fused", 0)
    ours = _draft_greedily(spec, hidden)
    fused = plugin.stats().get("fused", 0) - before
    theirs = vllm_method("get_top_tokens")(model.logits_processor, model.lm_head, hidden)
    ref = (hidden.double() @ full.double().T).argmax(dim=1)
    return {
        "class": type(model).__name__,
        "kept_own_head": model.lm_head.weight.shape[0] < target_vocab,
        "d2t_loaded": torch.equal(model.draft_id_to_target_id.data, d2t),
        "fused_calls": fused,
        "ours": ours.tolist(),
        "vllm": (theirs + d2t[theirs]).tolist(),
        "ref": (ref + d2t[ref]).tolist(),
    }
