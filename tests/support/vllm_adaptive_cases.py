"""Adaptive verification with local argmax, on vLLM's own objects (0.34 or 0.33; the
plugin's rank body, tests/support/vllm_ranks.py, TP = 2 gloo): the config's
refusal lifted with the plugin and kept without it; ``DraftModelSpeculator``'s
``load_model`` and ``sample_draft`` (the real methods on a bare instance with
a LocalArgmaxMixin draft) against vLLM's own ``OnlineAcceptanceEstimator
.predict`` on the gathered logits, its Triton kernels interpreted on the CPU
(bench/vllm_estimator.py), and the float64 log-odds."""

from __future__ import annotations

import math
import types

import torch

from tests.support.reference import ref_log_odds, ref_logits
from tests.support.vllm_common import WarningLog, head_of, processor, reinstall_adaptive, vllm_method

MAX_REQS, STEPS, VOCAB, HSIZE = 12, 3, 1500, 32
# per request slot: T (0 and -1: greedy, T = 1 in the estimator), and the gap planted above the rest (logit units)
TEMPERATURES = [0.0, 0.7, 1.0, 2.0, -1.0, 0.3, 1.0, 0.5, 1.5, 1.0, 0.9, 1.2]
GAPS = [0.0, 0.0, 2.0, 5.0, 10.0, 18.0, 30.0, 30.0, 45.0, 60.0, 0.0, 60.0]


def config_case(plugin) -> dict:
    """SpeculativeConfig with enable_adaptive_verification and
    use_local_argmax_reduction: built with the plugin's patch, refused
    without it (vLLM's own message), built again once reinstalled."""
    out = {"active": plugin.adaptive_verification_active(), "with_plugin": _build_config()}
    plugin.adaptive.uninstall()
    out["without_plugin"] = _build_config()
    reinstall_adaptive(plugin)
    out["reinstalled"] = _build_config()
    return out


def _build_config() -> dict:
    from vllm.config import SpeculativeConfig

    try:
        c = SpeculativeConfig(
            method="ngram", num_speculative_tokens=3, prompt_lookup_max=3, prompt_lookup_min=1,
            enable_adaptive_verification=True, use_local_argmax_reduction=True,
        )  # fmt: skip
        return {"built": True, "flags": [c.enable_adaptive_verification, c.use_local_argmax_reduction]}
    except ValueError as e:
        return {"built": False, "error": str(e)}


def version_cases(plugin) -> dict:
    """The version probes (localargmax/integrations/vllm/versions.py), both
    outcomes: a vLLM minor not in the table whose signatures match runs with
    the newest matching release's rules; a signature that differs keeps
    vLLM's own methods (or refusals). One WARNING each, naming why."""
    import vllm
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    def attempt(changes):
        saved = {}
        handler = WarningLog("localargmax: ")
        plugin.logger.addHandler(handler)
        plugin.uninstall()
        try:
            for (owner, name), value in changes.items():
                saved[(owner, name)] = owner.__dict__[name]
                setattr(owner, name, value)
            plugin.install()
            rules = plugin.logits._RULES["release"]
            return {
                "active": plugin.is_active(),
                "adaptive": plugin.adaptive_verification_active(),
                "rules": None if rules is None else rules.key,
                "config": _build_config(),
                "records": handler.records[:],
            }
        finally:
            plugin.uninstall()
            for (owner, name), value in saved.items():
                setattr(owner, name, value)
            plugin.logger.removeHandler(handler)

    def other_top_k(self, lm_head, hidden_states, top_k):
        raise AssertionError("not called")

    def other_sample_draft(self, hidden_states, idx_mapping, temperature):
        raise AssertionError("not called")

    out = {
        "running": vllm.__version__,
        "next_minor": attempt({(vllm, "__version__"): "0.99.0"}),
        "logits_differ": attempt({(LogitsProcessor, "get_top_k_tokens"): other_top_k}),
        "adaptive_differs": attempt({(DraftModelSpeculator, "sample_draft"): other_sample_draft}),
    }
    plugin.install()
    out["restored"] = [plugin.is_active(), plugin.adaptive_verification_active(), plugin.logits._RULES["release"].key]
    return out


def special_rows_case(plugin, gen, cfg) -> dict:
    """Rows vLLM's estimator meets without digits: a NaN entry, an entry at
    +inf, every entry -inf, one finite entry (the others -inf), and two
    ordinary rows (what vLLM writes for the first three differs by version).
    vLLM's own predict on the logits beside what write_estimator_state
    writes from the fused op's log-odds of the same logits (zero hidden
    states and weight, the row as the bias: no inf * 0).
    Non-finite floats as strings (NaN != NaN would fail the ranks' check)."""
    import localargmax
    from bench.vllm_estimator import estimator_class

    logits = torch.randn(6, VOCAB, generator=gen) * 2
    logits[0, 7] = math.nan
    logits[1, 9] = math.inf
    logits[2] = -math.inf
    logits[3] = -math.inf
    logits[3, 11] = 1.0
    idx, draft_step = torch.tensor([0, 1, 2, 3, 5, 6]), torch.tensor(0)
    temperature = torch.ones(MAX_REQS)
    zeros_h, zeros_w = torch.zeros(1, HSIZE), torch.zeros(VOCAB, HSIZE)
    log_odds = torch.cat(
        [localargmax.lm_head_argmax(zeros_h, zeros_w, bias=row, return_log_odds=True)[1] for row in logits]
    )
    spec = speculator(_draft(gen, 1.0, None), cfg)
    spec.load_model(None)
    conf = torch.full((MAX_REQS, STEPS), -7.0)
    plugin.write_estimator_state(spec.acceptance_estimator, log_odds, idx, draft_step, conf)
    vllm_est = estimator_class()(MAX_REQS, STEPS, torch.device("cpu"))
    vconf = torch.full((MAX_REQS, STEPS), -7.0)
    vllm_est.predict(logits, idx, draft_step, vconf, temperature)
    features, predictions = spec.acceptance_estimator.localargmax_rows
    return {
        "log_odds": [x if math.isfinite(x) else str(x) for x in log_odds.tolist()],
        "ours": features[idx, 0].tolist(),
        "vllm": vllm_est.features[idx, 0].tolist(),
        "ours_conf": conf[:6, 0].tolist(),
        "vllm_conf": vconf[:6, 0].tolist(),
    }


def _draft(gen, scale, soft_cap):
    """A draft head with vLLM's LocalArgmaxMixin (its get_top_tokens applies d2t) and compute_logits."""
    from vllm.model_executor.models.interfaces import LocalArgmaxMixin

    import localargmax

    class Draft(LocalArgmaxMixin, torch.nn.Module):
        def __init__(self):
            super().__init__()
            full = torch.randn(VOCAB, HSIZE, generator=gen) / HSIZE**0.5
            self.full = full
            self.lm_head = head_of(full)
            self.logits_processor = processor(VOCAB, scale, soft_cap)
            d2t = localargmax.build_d2t(torch.rand(VOCAB * 3, generator=gen), VOCAB)
            self.draft_id_to_target_id = torch.nn.Parameter(d2t, requires_grad=False)

        def compute_logits(self, hidden):
            return self.logits_processor(self.lm_head, hidden)

    return Draft()


def speculator(draft, cfg, adaptive: bool = True, hidden_size: int = HSIZE, base=None, dtype=torch.float32):
    """vLLM's DraftModelSpeculator, or its subclass ``base`` (a subclass that
    only supplies the draft), bare: the attributes its load_model /
    sample_draft / get_draft_top_tokens read, none of its GPU set-up; local
    argmax on, adaptive verification on or off."""
    if base is None:
        from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator as base

    class Speculator(base):
        def load_draft_model(self, target_model, target_attn_layer_names):
            return draft

        def _gpu_only(self, *args, **kwargs):  # propose / capture / CUDA graphs: not run here
            raise NotImplementedError

        propose = capture = init_cudagraph_manager = _gpu_only

    spec = Speculator.__new__(Speculator)
    spec.vllm_config = types.SimpleNamespace(
        compilation_config=cfg.compilation_config, model_config=types.SimpleNamespace(supports_multimodal_inputs=False)
    )
    spec.speculative_config = types.SimpleNamespace(draft_sample_method="greedy")
    spec.use_local_argmax_reduction = True
    spec.enable_adaptive_verification = spec.use_acceptance_estimator = adaptive
    spec.use_draft_logits = False  # (vLLM 0.34's load_model reads it: greedy drafts keep no draft logits)
    spec.acceptance_estimator = None
    spec.max_num_reqs, spec.num_speculative_steps, spec.device = MAX_REQS, STEPS, torch.device("cpu")
    spec.hidden_size, spec.dtype = hidden_size, dtype  # (the drafter hook's load-time probe reads them)
    spec.dcp_size = 1
    spec.temperature = torch.tensor(TEMPERATURES, dtype=torch.float32)
    spec.draft_token_confidence_probs = torch.full((MAX_REQS, STEPS), -7.0)
    return spec


def _hidden_with_gaps(gen, draft, rows):
    """Hidden states whose argmax stands ``GAPS[slot]`` logits above the row's
    next largest (before the transform); the last row is CUDA-graph padding."""
    hidden = torch.randn(len(rows), HSIZE, generator=gen)
    for b, slot in enumerate(rows):
        if slot < 0 or GAPS[slot] == 0.0:
            continue
        for _attempt in range(8):  # a row `top` that cannot stand alone (another row nearly parallel): draw again
            top = int(torch.randint(0, VOCAB, (1,), generator=gen))
            w = draft.full[top]
            reach = draft.full @ w / float(w @ w)  # how far each logit moves per unit step along w (1 for `top`)
            start = hidden[b].clone()
            for _ in range(50):  # moving along w moves the other logits too: Newton steps on the runner-up
                logits = hidden[b] @ draft.full.T
                logits[top] = -torch.inf
                second = int(logits.argmax())
                miss = float(logits[second] + GAPS[slot] - hidden[b] @ w)
                if abs(miss) < 1e-3:
                    break
                hidden[b] += miss / max(float(1 - reach[second]), 0.05) * w / float(w @ w)
            if abs(miss) < 1e-3:
                break
            hidden[b] = start
        else:  # eight draws failed: the planted bands would fail
            raise AssertionError(f"row {b}: the gap {GAPS[slot]} was not reached (off by {miss:.3g})")
    return hidden


def speculator_case(plugin, gen, cfg) -> dict:
    """load_model builds the estimator despite local argmax (refused without
    the plugin); sample_draft's local-argmax branch returns vLLM's ids and
    writes features / predictions / confidences; vLLM's own predict on the
    gathered logits writes the reference state (interpreted Triton), float64
    gives the exact log-odds. Shared and per-row draft steps, padding rows."""
    from bench.vllm_estimator import estimator_class

    out = {}
    for name, (scale, cap) in {"plain": (1.0, None), "scale_softcap": (1.5, 60.0)}.items():
        draft = _draft(gen, scale, cap)
        spec = speculator(draft, cfg)
        plugin.adaptive.uninstall()
        try:
            spec.load_model(None)
            refused = "no error"
        except ValueError as e:
            refused = str(e)
        reinstall_adaptive(plugin)
        spec = speculator(draft, cfg)
        spec.load_model(None)
        vllm_est = estimator_class()(MAX_REQS, STEPS, torch.device("cpu"))
        # the first three: the per-row-step requests; slots 4 (T = -1) and 0 (T = 0) among them: taken as 1
        rows_all = [4, 0, 9, 3, 1, 8, 5, 11, 2, 6, 7, 10]
        cases = {}
        for mode in ("shared_step", "per_row_step"):
            if mode == "shared_step":
                idx = torch.tensor(rows_all[:9] + [-1])
                draft_step = torch.tensor(1)
                steps = [1] * idx.numel()
            else:  # each request owns STEPS consecutive rows
                idx = torch.tensor([r for r in rows_all[:3] for _ in range(STEPS)] + [-1] * STEPS)
                draft_step = torch.tensor([s for _ in range(4) for s in range(STEPS)])
                steps = draft_step.tolist()
            hidden = _hidden_with_gaps(gen, draft, idx.tolist())
            before = plugin.stats().get("fused with log-odds", 0)
            ids = spec.sample_draft(hidden, None, idx, spec.temperature, None, draft_step, None)
            used = plugin.stats().get("fused with log-odds", 0) - before
            theirs = vllm_method("get_top_tokens")(draft.logits_processor, draft.lm_head, hidden)
            theirs = theirs + draft.draft_id_to_target_id[theirs]
            conf = torch.full((MAX_REQS, STEPS), -7.0)
            vllm_est.predict(draft.compute_logits(hidden), idx, draft_step, conf, spec.temperature)
            x = ref_logits(hidden, draft.full)
            t = spec.temperature[idx.clamp(min=0)]
            f64 = ref_log_odds(x, x.argmax(dim=1), scale, cap, t)
            est = spec.acceptance_estimator
            rows = []
            for b, slot in enumerate(idx.tolist()):
                if slot < 0:
                    continue
                s, bi = steps[b], (b // STEPS if mode == "per_row_step" else b)
                rows.append(
                    {
                        "f64": float(f64[b]), "gap": GAPS[slot], "t": TEMPERATURES[slot], "scale": scale,
                        "x_max": float(x[b].abs().max()),  # the row's largest float64 logit (before the transform)
                        "ours": [float(est.features[slot, s]), float(est.predictions[slot, s]),
                                 float(spec.draft_token_confidence_probs[bi, s])],
                        "vllm": [float(vllm_est.features[slot, s]), float(vllm_est.predictions[slot, s]),
                                 float(conf[bi, s])],
                    }
                )  # fmt: skip
            untouched = spec.draft_token_confidence_probs.clone()
            written = conf != -7.0
            cases[mode] = {
                "ids": ids.tolist(), "vllm_ids": theirs.tolist(), "fused_calls": used, "rows": rows,
                # every confidence vLLM writes is written, and none it leaves (padding rows)
                "conf_written_same": bool(torch.equal(untouched != -7.0, written)),
                "slope": float(est.slope), "vllm_slope": float(vllm_est.slope),
            }  # fmt: skip
            spec.draft_token_confidence_probs.fill_(-7.0)
        out[name] = {"refused_without_plugin": refused, "estimator_rows": list(est.features.shape), **cases}
    return out
