"""The vLLM proposer cases of the plugin's rank body (tests/support/vllm_ranks.py):
vLLM's EagleProposer check and greedy sample on a LocalArgmaxMixin draft and on
vLLM's own Eagle3LlamaForCausalLM."""

from __future__ import annotations

import torch

from tests.support.vllm_common import after_loading, head_of, processor


class _Target(torch.nn.Module):
    """A target model with its own lm_head (what the proposer's _maybe_share_lm_head inspects)."""

    def __init__(self, gen, vocab, hsize):
        super().__init__()
        self.model = torch.nn.Module()
        self.lm_head = head_of(torch.randn(vocab, hsize, generator=gen))


def _proposer(draft, target):
    """vLLM's EagleProposer methods around ``draft`` (none of its GPU set-up), the switch on, the head check run."""
    from vllm.v1.spec_decode.eagle import EagleProposer

    proposer = EagleProposer.__new__(EagleProposer)
    proposer.vllm_config = _Stub(speculative_config=None)
    proposer.use_local_argmax_reduction = True
    proposer.model = draft
    proposer._maybe_share_lm_head(target)
    return proposer


def proposer_case(plugin, gen):
    """The seed's switch through vLLM's own proposer code: a draft model with
    vLLM's LocalArgmaxMixin (ParallelLMHead, LogitsProcessor, d2t Parameter);
    ``SpecDecodeBaseProposer._maybe_share_lm_head`` (the check that the draft
    has get_top_tokens when use_local_argmax_reduction is set) and
    ``_greedy_sample`` (which calls model.get_top_tokens) run unmodified."""
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
        has_own_lm_head = True

    draft = Draft()
    proposer = _proposer(draft, _Target(gen, target_vocab, hsize))
    out = {"switch_field_default": SpeculativeConfig.__dataclass_fields__["use_local_argmax_reduction"].default}

    hidden = torch.randn(batch, hsize, generator=gen)
    before = plugin.stats().get("fused", 0)
    ours = proposer._greedy_sample(hidden)
    out["fused_calls"] = plugin.stats().get("fused", 0) - before
    theirs = plugin._ORIGINAL["get_top_tokens"](draft.logits_processor, draft.lm_head, hidden)
    theirs = theirs + draft.draft_id_to_target_id[theirs]
    full = torch.empty(draft_vocab, hsize)
    # the reference needs the full draft matrix: gather the shards back
    from vllm.distributed import tensor_model_parallel_all_gather

    shards = tensor_model_parallel_all_gather(draft.lm_head.weight.detach().clone(), dim=0)
    full = shards[:draft_vocab] if shards.shape[0] >= draft_vocab else full
    ref = (hidden.double() @ full.double().T).argmax(dim=1)
    ref = ref + draft.draft_id_to_target_id[ref]
    out.update(ours=ours.tolist(), vllm=theirs.tolist(), ref=ref.tolist())

    proposer.model = NoTopTokens()
    proposer.model.lm_head = draft.lm_head
    try:
        proposer._maybe_share_lm_head(_Target(gen, target_vocab, hsize))
        out["missing_check"] = "no error"
    except ValueError as e:
        out["missing_check"] = str(e)
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
    load_weights, drafting through the proposer's _greedy_sample. vLLM 0.33
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

    proposer = _proposer(model, _Target(gen, target_vocab, hsize))
    hidden = torch.randn(6, hsize, generator=gen)
    before = plugin.stats().get("fused", 0)
    ours = proposer._greedy_sample(hidden)
    fused = plugin.stats().get("fused", 0) - before
    theirs = plugin._ORIGINAL["get_top_tokens"](model.logits_processor, model.lm_head, hidden)
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
