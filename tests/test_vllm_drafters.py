"""Local argmax for vLLM drafters without ``get_top_tokens``
(localargmax/integrations/vllm/drafters.py), on vLLM's own classes, 2 gloo
ranks on CPU: DeepSeekMTP (per-step heads behind an RMSNorm, through
vLLM's MultiModuleMTPSpeculator), DFlashLagunaForCausalLM (through vLLM's
DFlashSpeculator), Nemotron3_5TranscribeMTP (masks its logits after the
processor: left without the method) and a planted disagreement (an error).
The classes are built small by bench/vllm_drafters.py's builders (vLLM's
class and compute_logits, only the submodules compute_logits uses). One
launch of 2 spawned ranks; one more interpreter imports GPU-only draft
modules with the script's stand-ins (each named per row), and one probes
DeepSeekV4MTP's nvidia and xpu variants with vLLM's Triton hc_head
(interpreted) for their GPU-only one. Skipped, with the
reason, only when vLLM is not installed. docs/vllm.md's drafter tables are checked by tests/test_readme.py.
"""

from __future__ import annotations

import importlib.util
import types

import pytest

from tests.support.vllm_common import NO_TRITON_REASON, vllm_cpu_build

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (README 'Use it in vLLM': pip install --no-deps vllm==0.34.0)",
)

TP, VOCAB, HSIZE, ROWS, STEPS = 2, 1001, 32, 9, 3
GAP = 1e-4  # top-2 gap of the float64 logits above which ids must equal float64's
SPECULATORS = {  # class -> vLLM's speculator that drafts with it
    "DeepSeekMTP": "vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator:MultiModuleMTPSpeculator",
    "DFlashLagunaForCausalLM": "vllm.v1.worker.gpu.spec_decode.dflash.speculator:DFlashSpeculator",
}
CASES = {"DeepSeekMTP": "float32", "DFlashLagunaForCausalLM": "float32", "DeepSeekMTP_bf16": "bfloat16"}


def _speculator(path, draft, cfg, dtype=None):
    """vLLM's speculator class at ``path``, bare (vllm_adaptive_cases.speculator),
    adaptive verification off."""
    import importlib

    import torch

    from tests.support.vllm_adaptive_cases import speculator

    module, _, name = path.partition(":")
    base = getattr(importlib.import_module(module), name)
    spec = speculator(draft, cfg, adaptive=False, hidden_size=HSIZE, base=base, dtype=dtype or torch.float32)
    spec.num_speculative_steps = STEPS
    return spec


def _start(spec) -> str:
    try:
        spec.load_model(None)
        return "ok"
    except (ValueError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"


def _draft_case(case, gen, cfg, drafters):
    """vLLM's speculator start-up with the flag (refused without the plugin's
    drafter hook, passes with it), then per step its ids vs vLLM's
    compute_logits argmax and float64's (``case``: a key of :data:`CASES`)."""
    import torch

    from bench.vllm_drafters import BUILDERS

    name, dtype = case.split("_")[0], getattr(torch, CASES[case])
    model, reference = BUILDERS[name](gen, VOCAB, HSIZE, dtype)
    drafters.uninstall()
    refused = _start(_speculator(SPECULATORS[name], model, cfg, dtype))
    drafters.install()
    spec = _speculator(SPECULATORS[name], model, cfg, dtype)
    out = {"refused_without": refused, "start": _start(spec), "steps": []}
    for step in range(STEPS):
        hidden = torch.randn(ROWS, HSIZE, generator=gen).to(dtype)
        ids = spec.get_draft_top_tokens(hidden, step)
        vllm_logits = spec.compute_draft_logits(hidden, step).float()
        x, full = reference(hidden, step)
        f64 = x.double() @ full.double().T
        top2 = f64.topk(2, dim=1).values
        x_next, full_next = reference(hidden, step + 1)  # DeepSeekMTP: the other MTP layer's norm and head
        out["steps"].append(
            {
                "ids": ids.tolist(),
                "dtype": str(ids.dtype),
                "vllm": vllm_logits.argmax(-1).tolist(),
                "vllm_at_ids_is_max": (vllm_logits.gather(1, ids[:, None])[:, 0] == vllm_logits.amax(-1)).tolist(),
                "f64": f64.argmax(-1).tolist(),
                "f64_next_step_head": (x_next.double() @ full_next.double().T).argmax(-1).tolist(),
                "gap": (top2[:, 0] - top2[:, 1]).tolist(),
            }
        )
    return out


def _post_processing_classes():
    """Classes whose compute_logits does more than return the processor's
    output: vLLM's own Nemotron3_5TranscribeMTP (masks past its speech
    vocabulary in place; vLLM 0.34) or, on a vLLM without it, a
    NemotronHMTP subclass that masks the same way; and a DFlashLaguna
    subclass that scales after the processor. name -> (class, what the WARNING says)."""
    import importlib

    from vllm.model_executor.models.laguna_dflash import DFlashLagunaForCausalLM
    from vllm.model_executor.models.nemotron_h_mtp import NemotronHMTP

    class ScaledAfter(DFlashLagunaForCausalLM):
        def compute_logits(self, hidden_states):
            return super().compute_logits(hidden_states) * 2.0

    class MaskedInPlace(NemotronHMTP):
        def compute_logits(self, hidden_states):
            logits = super().compute_logits(hidden_states)
            logits[..., VOCAB // 2 :] = float("-inf")
            return logits

    try:
        module = importlib.import_module("vllm.model_executor.models.nemotron3_5_transcribe")
        masked = module.Nemotron3_5TranscribeMTP
    except ImportError:
        masked = MaskedInPlace
    return {"masked": (masked, "in place"), "scaled": (ScaledAfter, "something other")}


def _post_processing_case(gen, cfg, warnings):
    """Each post-processing class: no method, one WARNING naming it and why, vLLM's own refusal."""
    import torch

    from bench.vllm_drafters import build_plain

    out = {}
    for key, (cls, why) in _post_processing_classes().items():
        config = types.SimpleNamespace(speechlm_output_vocab_size=VOCAB // 2)
        model, _ = build_plain(cls, config=config)(gen, VOCAB, HSIZE, torch.float32)
        before = len(warnings.records)
        start = _start(_speculator("vllm.v1.worker.gpu.spec_decode.mtp.speculator:MTPSpeculator", model, cfg))
        out[key] = {
            "class": cls.__name__,
            "why": why,
            "start": start,
            "has_method": hasattr(model, "get_top_tokens"),
            "warnings": warnings.records[before:],
        }
    return out


def _planted_case(gen, cfg):
    """The processor's answer made wrong on rank 1 only: every rank raises, naming the class."""
    import torch
    from vllm.distributed import get_tp_group
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    from bench.vllm_drafters import BUILDERS

    model, _ = BUILDERS["DeepSeekMTP"](gen, VOCAB, HSIZE, torch.float32)
    right = LogitsProcessor.get_top_tokens
    wrong_here = get_tp_group().rank_in_group == 1

    def wrong(self, lm_head, hidden_states, embedding_bias=None):
        ids = right(self, lm_head, hidden_states, embedding_bias)
        return (ids + 1) % VOCAB if wrong_here else ids

    LogitsProcessor.get_top_tokens = wrong
    try:
        start = _start(_speculator(SPECULATORS["DeepSeekMTP"], model, cfg))
    finally:
        LogitsProcessor.get_top_tokens = right
    return {"start": start, "has_method": hasattr(model, "get_top_tokens")}


def worker(rank: int, world_size: int, seed: int):
    import logging

    import torch

    from tests.support.vllm_common import WarningLog, vllm_setup

    ctx, cfg = vllm_setup(rank, world_size)
    import localargmax.integrations.vllm as plugin
    from localargmax.integrations.vllm import drafters

    plugin.install()
    warnings = WarningLog("keeps no get_top_tokens")
    logging.getLogger("localargmax.integrations.vllm").addHandler(warnings)
    gen = torch.Generator().manual_seed(seed)  # the same draws on every rank: replicated hidden states
    before = plugin.stats().get("fused", 0)
    out = {case: _draft_case(case, gen, cfg, drafters) for case in CASES}
    out["fused_calls"] = plugin.stats().get("fused", 0) - before
    out["post_processing"] = _post_processing_case(gen, cfg, warnings)
    out["planted"] = _planted_case(gen, cfg)
    out["steps_asked"] = {  # the steps each speculator's get_draft_top_tokens can pass (the probe's steps)
        path.rsplit(":", 1)[1]: list(drafters._steps_asked(_speculator(path, None, cfg)))
        for path in (*SPECULATORS.values(), "vllm.v1.worker.gpu.spec_decode.mtp.speculator:MTPSpeculator")
    }
    from vllm.distributed import destroy_model_parallel

    destroy_model_parallel()
    ctx.__exit__(None, None, None)
    return out


@pytest.fixture(scope="module")
def ranks():
    from tests.conftest import draw_seed
    from tests.support.launch import run_ranks
    from tests.support.vllm_common import rank_env

    seed = draw_seed()
    print(f"\n[test_vllm_drafters] random seed {seed} (rerun with LOCALARGMAX_TEST_SEED={seed})")
    with rank_env():  # what vLLM needs on a CPU-only machine; the spawned ranks inherit it
        return run_ranks(worker, TP, seed, timeout=300, start_method="spawn")


@pytest.fixture(scope="module")
def res(ranks):
    return ranks[0]


@needs_vllm
@pytest.mark.parametrize("case", sorted(CASES))
def test_speculator_starts_with_the_flag_and_drafts_vllms_ids(ranks, case):
    """float32: the ids are vLLM's compute_logits argmax; bf16 (vLLM's logits
    rounded: ties): vLLM's logit at each id is its row's maximum. Both: float64's
    argmax of the class's own processor input and step head, away from near-ties."""
    for r in ranks:
        c = r[case]
        assert "does not implement get_top_tokens" in c["refused_without"], c["refused_without"]
        assert c["start"] == "ok", c["start"]
        for step, s in enumerate(c["steps"]):
            assert s["dtype"] == "torch.int64"
            if CASES[case] == "float32":
                assert s["ids"] == s["vllm"], f"step {step}: ours {s['ids']}, vLLM's argmax {s['vllm']}"
            assert all(s["vllm_at_ids_is_max"]), f"step {step}: {s['ids']} not at vLLM's row maxima"
            for row, (ours, ref, gap) in enumerate(zip(s["ids"], s["f64"], s["gap"])):
                if gap > GAP:
                    assert ours == ref, f"step {step} row {row}: ours {ours}, float64 {ref} (gap {gap})"
    assert ranks[0][case] == ranks[1][case]


@needs_vllm
def test_per_step_heads_are_the_classes_own(res):
    """DeepSeekMTP has 2 MTP layers (norm + head each) for 3 steps: the ids
    (equal to the step's head's, above) differ from the other layer's, so the
    head chosen by spec_step_idx % 2 is the one that answered."""
    for step, s in enumerate(res["DeepSeekMTP"]["steps"]):
        assert s["ids"] != s["f64_next_step_head"], f"step {step}: the other MTP layer's head gives the same ids"
    assert res["fused_calls"] >= 2 * STEPS  # every draft went through the fused op (plus the probes)


@needs_vllm
@pytest.mark.parametrize("key", ["masked", "scaled"])
def test_post_processing_class_is_left_without_the_method(ranks, key):
    for r in ranks:
        m = r["post_processing"][key]
        assert not m["has_method"]
        assert "does not implement get_top_tokens" in m["start"], m["start"]
        assert len(m["warnings"]) == 1, m["warnings"]
        level, message = m["warnings"][0]
        assert level == "WARNING" and m["class"] in message and m["why"] in message, message


@needs_vllm
def test_the_probe_asks_the_steps_each_speculator_passes(res):
    """The multi-module MTP speculator passes every draft step; the others
    pass none (step 0: one MTP layer reused), so a layer-per-step class is not
    probed at steps it is never asked."""
    assert res["steps_asked"] == {
        "MultiModuleMTPSpeculator": list(range(STEPS)),
        "DFlashSpeculator": [0],
        "MTPSpeculator": [0],
    }


@needs_vllm
def test_planted_disagreement_is_an_error_on_every_rank(ranks):
    for r in ranks:
        p = r["planted"]
        assert p["start"].startswith("RuntimeError") and "DeepSeekMTP" in p["start"], p["start"]
        assert not p["has_method"]


STAND_INS = r"""
import importlib.util, json, sys
import vllm  # noqa: F401
from vllm.model_executor.models import registry  # noqa: F401
from bench.vllm_drafters import _StandIns

s, out = _StandIns(), {}
for mod, name in [
    ("vllm.model_executor.models.deepseek_mtp", "DeepSeekMTP"),
    ("vllm.models.deepseek_v4.amd.dspark", "DSparkDeepseekV4ForCausalLM"),
    ("vllm.models.deepseek_v4.amd.mtp", "DeepSeekV4MTP"),
    ("vllm.models.dots3_note.nvidia.mtp", "Dots3NoteMTP"),
    ("vllm.models.mistral.mistral_large4", "MistralLarge4DSparkForCausalLM"),
    ("vllm.models.mistral.mistral_large4.nvidia.dspark", "MistralLarge4DSparkForCausalLM"),
]:
    if importlib.util.find_spec(".".join(mod.split(".")[:3])) is None:
        continue  # not in this vLLM (0.33 has no Mistral Large 4)
    cls, error, used = s.load(mod, name)
    out[mod] = {"class": cls.__name__ if cls else None, "error": error, "used": used}
out["mocked_after"] = sorted(s.names)
out["modules_after"] = [m for m in ("vllm.vllm_flash_attn", "vllm.models.mistral.mistral_large4") if m in sys.modules]
print(json.dumps(out))
"""


@needs_vllm
def test_stand_ins_import_gpu_only_modules_and_name_them_per_row():
    """bench/vllm_drafters.py's import stand-ins (in a fresh interpreter: they
    leave vllm.platforms.rocm imported): AMD modules import with the GPU-arch
    query answered and say so, the second one too though rocm was imported by
    then; Dots3Note with vllm_flash_attn mocked for its row only; Mistral
    Large 4's variant with its package's platform dispatch not run, while the
    package itself still refuses this machine; a plain class shows none."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.vllm_common import rank_env

    with rank_env():
        root = Path(__file__).resolve().parent.parent  # bench/ importable
        proc = subprocess.run([sys.executable, "-c", STAND_INS], capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    rocm = "torch.cuda.get_device_properties (gfx942) in vllm.platforms.rocm"
    assert out["vllm.model_executor.models.deepseek_mtp"] == {"class": "DeepSeekMTP", "error": None, "used": []}
    for mod in ("vllm.models.deepseek_v4.amd.dspark", "vllm.models.deepseek_v4.amd.mtp"):
        assert out[mod]["class"] and rocm in out[mod]["used"], out[mod]
    dots = out["vllm.models.dots3_note.nvidia.mtp"]
    assert dots["class"] == "Dots3NoteMTP" and "vllm.vllm_flash_attn" in dots["used"], dots
    assert not any(n.startswith("vllm.") for n in out["mocked_after"]) and not out["modules_after"], out
    if "vllm.models.mistral.mistral_large4" in out:
        assert "Mistral Large 4 is only supported" in out["vllm.models.mistral.mistral_large4"]["error"]
        variant = out["vllm.models.mistral.mistral_large4.nvidia.dspark"]
        assert variant["used"] == ["vllm.models.mistral.mistral_large4 (its platform dispatch not run)"], variant


KERNELS = r"""
import importlib, json, sys, torch
from bench import vllm_drafters as vd
import localargmax.integrations.vllm as plugin  # noqa: F401

ctx, _ = vd._single_rank_vllm()
gen, out = torch.Generator().manual_seed(int(sys.argv[1])), {}

# the stand-in against float64 hc_head (vLLM's HCHeadOp: gates from the RMS-normalised flattened residual,
# out = sum_i gate_i * residual_i), within a bound of its bfloat16 roundings (the normalised input, the output)
T, M, D, eps, hc_eps = 7, 4, 48, 1e-6, 0.125
x = torch.randn(T, M, D, generator=gen).bfloat16()
x[2] = 0  # an all-zero row: its norm is eps's
fn = torch.randn(M, M * D, generator=gen) / (M * D) ** 0.5  # mixes of order 1: gates off sigmoid's flat ends
scale, base = torch.rand(1, generator=gen) + 0.5, torch.randn(M, generator=gen)
got = vd.triton_hc_head(x.view(T, 1, M, D), fn, scale, base, eps, hc_eps).view(T, D).double()
xd, f = x.double(), fn.double()
flat = xd.flatten(1)
normed = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + eps)
gate = torch.sigmoid(normed @ f.T * scale.double() + base.double()) + hc_eps
ref = (gate[:, :, None] * xd).sum(1)
u = 2.0**-8  # bfloat16's unit roundoff; float32's error folded in by the factor 2
gate_err = 0.25 * scale.double() * u * (normed.abs() @ f.abs().T)
bound = 2 * ((gate_err[:, :, None] * xd.abs()).sum(1) + u * ref.abs()) + 1e-30
out["hc_head"] = {"dtype": str(got.dtype), "shape": [T, D], "excess": ((got - ref).abs() / bound).max().item()}
out["hc_head_dtype"] = str(vd.triton_hc_head(x, fn, scale, base, eps, hc_eps).dtype)

def rows():
    return [{"import": "ok", "module": m, "class": "DeepSeekV4MTP", "compute_logits": "DeepSeekV4MTP",
             "get_top_tokens": None} for m in ("vllm.models.deepseek_v4.nvidia.mtp", "vllm.models.deepseek_v4.xpu.mtp")]

probed = rows()
vd.probe_small(probed)
out["probed"] = probed
out["restored"] = {  # vLLM's own kernel back in place after the row's probe
    row: getattr(importlib.import_module(module), name) is not stand_in
    for row, (module, name, stand_in, _) in vd.KERNEL_STAND_INS.items()
}

from vllm.model_executor.layers.logits_processor import LogitsProcessor
right = LogitsProcessor.get_top_tokens
LogitsProcessor.get_top_tokens = lambda self, head, h, bias=None: right(self, head, h, bias) + 1  # a planted wrong id
wrong = rows()
vd.probe_small(wrong)
LogitsProcessor.get_top_tokens = right
out["planted"] = wrong

vd.KERNEL_STAND_INS.clear()
bare = rows()
vd.probe_small(bare)
out["without"] = bare
ctx.__exit__(None, None, None)
print(json.dumps(out))
"""


@needs_vllm
@pytest.mark.skipif(vllm_cpu_build(), reason=NO_TRITON_REASON)
def test_deepseek_v4_rows_probe_with_vllms_triton_hc_head():
    """DeepSeekV4MTP's nvidia and xpu variants (compute_logits: a GPU-only
    hc_head, vLLM's Triton shared-head RMSNorm, then its LogitsProcessor):
    the script's stand-in, vLLM's Triton hc_head under Triton's interpreter,
    is within its bfloat16 bound of float64's hc_head; with it each row is
    built and the plugin's probe gives the method, the stand-in named in the
    row and removed after; the probe on those rows refuses a planted wrong
    fused id; without the stand-in neither row builds."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import draw_seed
    from tests.support.vllm_common import rank_env

    seed = draw_seed()
    with rank_env():
        root = Path(__file__).resolve().parent.parent
        proc = subprocess.run(
            [sys.executable, "-c", KERNELS, str(seed)], capture_output=True, text=True, timeout=300, cwd=root
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["hc_head"]["excess"] <= 1, f"seed {seed}: {out['hc_head']}"
    assert out["hc_head_dtype"] == "torch.bfloat16"
    for row in out["probed"]:
        assert row["probe"] == "given" and row["probe_dtype"] == "bfloat16", row
        assert any("vLLM's Triton hc_head" in s for s in row["stand_ins"]), row
    assert all(out["restored"].values()), out["restored"]
    for row in out["planted"]:
        assert row["probe"].startswith("error") and "DeepSeekV4MTP" in row["probe"], row
    tilelang, cpu = out["without"]
    assert "tilelang" in tilelang["build_error"] and "probe" not in tilelang, tilelang
    assert "hc_head_fused_cpu" in cpu["build_error"] and "probe" not in cpu, cpu
