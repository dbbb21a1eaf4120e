"""The rank body of tests/test_vllm_plugin.py: vLLM's own classes (0.34 or 0.33) on 2
gloo ranks (CPU), every case in one launch (each spawned rank pays for
importing vLLM once). Returns plain data; the tests assert on it.

Each case builds vLLM's ``ParallelLMHead`` (loaded with its own
``weight_loader``) and ``LogitsProcessor`` and calls, on the same inputs,
vLLM's original ``get_top_tokens`` / ``get_top_k_tokens`` and the methods the
plugin installed (reached through ``LogitsProcessor``, i.e. vLLM's call path).
"""

from __future__ import annotations

import logging
import os

import torch

from tests.support.reference import ref_logits, ref_transform
from tests.support.vllm_adaptive_cases import config_case, special_rows_case, speculator_case, version_cases
from tests.support.vllm_common import WarningLog, both, head_of, processor, random_case, vllm_method, vllm_setup
from tests.support.vllm_proposer_cases import eagle3_case, proposer_case

TP = 2
SCALE_SOFTCAP, LOG_PROBS = {"scale": 2.0, "soft_cap": 3.0}, {"log_probs": True}
ARGMAX_CASES = {  # name: (vocab, hidden size, batch, dtype, keywords of _argmax_case)
    "f32": (1000, 32, 7, torch.float32, {}),
    "f32_bias": (1000, 32, 7, torch.float32, {"bias": True}),
    "f32_scale_softcap": (777, 24, 6, torch.float32, {"scale": 0.5, "soft_cap": 30.0}),
    "bf16": (999, 64, 8, torch.bfloat16, {}),
    "bf16_head_fp32": (999, 64, 8, torch.bfloat16, {"head_dtype": torch.float32}),
    "f16_bias": (515, 48, 5, torch.float16, {"bias": True}),
    "tiny_vocab": (70, 8, 3, torch.float32, {}),
    "batch_zero": (300, 8, 0, torch.float32, {}),
}
TOPK_CASES = {  # name: (vocab, hidden size, batch, k, dtype, keywords of _topk_case); logprobs: fused log-probabilities
    "f32_k1": (1000, 32, 6, 1, torch.float32, {}),
    "f32_k8": (1000, 32, 6, 8, torch.float32, {}),
    "f32_k8_bias": (1000, 32, 6, 8, torch.float32, {"bias": True}),
    "f32_k5_scale_softcap": (777, 24, 4, 5, torch.float32, SCALE_SOFTCAP),
    "bf16_k4": (999, 64, 8, 4, torch.bfloat16, {}),
    "f32_k8_logprobs": (1001, 32, 6, 8, torch.float32, LOG_PROBS),
    "f32_k5_bias_scale_softcap_logprobs": (777, 24, 4, 5, torch.float32, {"bias": True, **LOG_PROBS, **SCALE_SOFTCAP}),
    "bf16_k4_scale_logprobs": (999, 64, 8, 4, torch.bfloat16, {"scale": 0.5, "log_probs": True}),
}


_RAW_COLLECTIVES = ("all_gather_into_tensor", "all_gather", "all_reduce", "all_gather_object", "broadcast", "gather")
_FUNCOL = ("all_gather_tensor", "all_gather_single", "all_reduce", "wait_tensor")


def _collective_case(plugin, gen, rank, seed):
    """The fused path's exchange: through vLLM's ``GroupCoordinator.all_gather``
    and no raw torch.distributed call outside it (both spied on); the ids of
    get_top_tokens and get_top_k_tokens(return_log_probs=True) against float64;
    the 16-byte padding round-trips for every batch 0-9, k and the log-probs flag."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from vllm.distributed import get_tp_group
    from vllm.distributed.parallel_state import GroupCoordinator

    import localargmax
    from localargmax.integrations.vllm.collective import coordinator_all_gather

    calls = {"coordinator": 0, "raw_outside": [], "dtypes": set()}
    depth = [0]
    saved = {("dist", n): getattr(dist, n) for n in _RAW_COLLECTIVES}
    # torch 2.11 has no funcol.all_gather_single
    saved.update({("funcol", n): getattr(funcol, n) for n in _FUNCOL if hasattr(funcol, n)})
    saved[("coordinator", "all_gather")] = GroupCoordinator.all_gather

    def coordinator_gather(self, input_, dim=-1):
        calls["coordinator"] += 1
        calls["dtypes"].add(str(input_.dtype))
        depth[0] += 1
        try:
            return saved[("coordinator", "all_gather")](self, input_, dim)
        finally:
            depth[0] -= 1

    def spy(module, name):
        def call(*args, **kwargs):
            if depth[0] == 0:
                calls["raw_outside"].append(f"{module}.{name}")
            return saved[(module, name)](*args, **kwargs)

        return call

    vocab, hsize = 1000, 32
    full = torch.randn(vocab, hsize, generator=gen)
    hidden = torch.randn(6, hsize, generator=gen)
    head, lp = head_of(full), processor(vocab)
    GroupCoordinator.all_gather = coordinator_gather
    for module, obj, names in (("dist", dist, _RAW_COLLECTIVES), ("funcol", funcol, _FUNCOL)):
        for n in names:
            if (module, n) in saved:
                setattr(obj, n, spy(module, n))
    try:
        ids = lp.get_top_tokens(head, hidden)
        top_ids, log_probs = lp.get_top_k_tokens(head, hidden, 4, return_log_probs=True)
    finally:
        GroupCoordinator.all_gather = saved[("coordinator", "all_gather")]
        for (module, n), f in saved.items():
            if module != "coordinator":
                setattr(dist if module == "dist" else funcol, n, f)
    logits = ref_logits(hidden, full)
    top2 = logits.topk(2, dim=1).values
    gather = coordinator_all_gather(get_tp_group())
    bad = []
    cases = 0
    for batch in range(10):
        for k in (1, 2, 3, 5, 8):
            for log_probs_flag in (False, True):
                length = localargmax.payload_length(batch, k, log_probs_flag)
                mine, theirs = (
                    torch.randint(-(2**63), 2**63 - 1, (length,), dtype=torch.int64,
                                  generator=torch.Generator().manual_seed(seed + 7919 * r + 31 * length + k))
                    for r in (rank, 1 - rank)
                )  # fmt: skip
                mine[:1] = 0x7FC00001 | (0x7F800001 << 32)  # NaN bit patterns in both float32 halves
                theirs[:1] = mine[:1]
                want = torch.stack([mine, theirs] if rank == 0 else [theirs, mine])
                cases += 1
                if not torch.equal(gather(mine), want):
                    bad.append((batch, k, log_probs_flag))
    return {
        "coordinator_calls": calls["coordinator"],
        "payload_dtypes": sorted(calls["dtypes"]),
        "raw_outside": calls["raw_outside"],
        "ids": ids.tolist(),
        "ref": logits.argmax(dim=1).tolist(),
        "gap": (top2[:, 0] - top2[:, 1]).tolist(),
        "topk_ids": top_ids.tolist(),
        "ref_topk_ids": logits.topk(4, dim=1).indices.tolist(),
        "log_probs_err": float((log_probs.double() - torch.log_softmax(logits, 1).gather(1, top_ids)).abs().max()),
        "padding_cases": cases,
        "padding_bad": bad,
        "collective_stat": sorted(k for k in plugin.stats() if k.startswith("collective: ")),
    }


def _amx_forced_case(plugin, gen):
    """The set-up and the plugin on a CPU whose AMX tiles vLLM sees (forced
    here on a CPU without them, as vLLM reads them: torch.cpu's checks): a
    bf16 head small enough for vLLM's sgl-kernel path; the ids are float64's."""
    saved = torch.cpu._is_amx_tile_supported, torch.cpu._is_amx_fp16_supported
    torch.cpu._is_amx_tile_supported = torch.cpu._is_amx_fp16_supported = lambda: True
    try:
        from vllm.model_executor.layers.utils import check_cpu_sgl_kernel

        full = (torch.randn(999, 64, generator=gen) / 8).to(torch.bfloat16)
        hidden = torch.randn(8, 64, generator=gen).to(torch.bfloat16)
        head = head_of(full)
        ours = processor(999).get_top_tokens(head, hidden)
        logits = ref_logits(hidden, full)
        top2 = logits.topk(2, dim=1).values
        return {
            "sgl_path_chosen": check_cpu_sgl_kernel(*head.weight.shape, head.weight.dtype),
            "ours": ours.tolist(),
            "ref": logits.argmax(dim=1).tolist(),
            "gap": (top2[:, 0] - top2[:, 1]).tolist(),
        }
    finally:
        torch.cpu._is_amx_tile_supported, torch.cpu._is_amx_fp16_supported = saved


def _argmax_case(plugin, gen, vocab, hsize, batch, dtype, *, bias=False, scale=1.0, soft_cap=None, head_dtype=None):
    full, hidden, bias_full, head, lp, eb = random_case(gen, vocab, hsize, batch, dtype, bias, scale, soft_cap)
    if head_dtype is not None:
        lp.head_dtype = head_dtype
    before = plugin.stats().get("fused", 0)
    theirs, ours = both(plugin, lp, head, hidden, "get_top_tokens", eb)
    ref = ref_transform(ref_logits(hidden, full, bias_full), scale, soft_cap)
    top2 = ref.topk(2, dim=1).values
    return {
        "vllm": theirs.tolist(),
        "ours": ours.tolist(),
        "ref": ref.argmax(dim=1).tolist(),
        "dtype": str(ours.dtype),
        "fused": plugin.stats().get("fused", 0) - before,
        "gap": (top2[:, 0] - top2[:, 1]).tolist(),
    }


def _topk_case(plugin, gen, vocab, hsize, batch, k, dtype, *, bias=False, scale=1.0, soft_cap=None, log_probs=False):
    full, hidden, bias_full, head, lp, eb = random_case(gen, vocab, hsize, batch, dtype, bias, scale, soft_cap)
    before = plugin.stats().get("fused", 0)
    (tid, tval), (oid, oval) = both(plugin, lp, head, hidden, "get_top_k_tokens", k, eb, return_log_probs=log_probs)
    raw = ref_logits(hidden, full, bias_full)
    rval, rid = raw.topk(k, dim=1)
    if log_probs:  # soft-cap, then scale, over the whole vocabulary; x - logsumexp(x)
        x = ref_transform(raw, scale, soft_cap)
        rval = (x - torch.logsumexp(x, dim=1, keepdim=True)).gather(1, rid)
    else:
        rval = rval * scale  # vLLM's get_top_k_tokens: scale, then soft-cap, on the k values
        if soft_cap is not None:
            rval = torch.tanh(rval / soft_cap) * soft_cap
    return {
        "vllm_ids": tid.tolist(),
        "ours_ids": oid.tolist(),
        "ref_ids": rid.tolist(),
        "vllm_values": tval.tolist(),
        "ours_values": oval.tolist(),
        "ref_values": rval.tolist(),
        "dtypes": [str(oid.dtype), str(oval.dtype)],
        "fused": plugin.stats().get("fused", 0) - before,
    }


def _past_2_24_case(plugin):
    """A winner at global id 2**24 + 1 (rank 1's shard): float32 cannot hold it."""
    vocab, hsize, winner = 2**24 + 64, 2, 2**24 + 1
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    head = ParallelLMHead(vocab, hsize, params_dtype=torch.float32)
    head.cpu_linear = torch.nn.functional.linear
    idx = head.shard_indices
    with torch.no_grad():  # fill the shard in place: the full [V, H] would cost 134 MB per rank
        head.weight.zero_()
        if idx.org_vocab_start_index <= winner < idx.org_vocab_end_index:
            head.weight[winner - idx.org_vocab_start_index] = torch.tensor([1.0, 1.0])
            head.weight[winner - 1 - idx.org_vocab_start_index] = torch.tensor([0.5, 0.5])
    hidden = torch.ones(3, hsize)
    lp = processor(vocab)
    theirs, ours = both(plugin, lp, head, hidden, "get_top_tokens")
    (tid, _), (oid, _) = both(plugin, lp, head, hidden, "get_top_k_tokens", 2)
    return {
        "vllm": theirs.tolist(),
        "ours": ours.tolist(),
        "ref": [winner] * 3,
        "vllm_topk": tid.tolist(),
        "ours_topk": oid.tolist(),
        "ref_topk": [[winner, winner - 1]] * 3,
    }


def _bf16_near_tie_case(plugin):
    """Rank 0 holds id 3 with logit 1.0, rank 1 holds id V-5 with logit
    1 + 2**-10 (exact in float32, 1.0 once rounded to bf16): vLLM's bf16 logits
    tie and its cross-rank argmax takes rank 0's id."""
    vocab, hsize = 1000, 2
    full = torch.zeros(vocab, hsize, dtype=torch.bfloat16)
    full[3] = torch.tensor([1.0, 0.0])
    full[vocab - 5] = torch.tensor([1.0, 2.0**-10])
    hidden = torch.ones(2, hsize, dtype=torch.bfloat16)
    head = head_of(full)
    lp = processor(vocab)
    theirs, ours = both(plugin, lp, head, hidden, "get_top_tokens")
    (tid, tval), (oid, oval) = both(plugin, lp, head, hidden, "get_top_k_tokens", 2)
    ref = ref_logits(hidden, full)
    return {
        "vllm": theirs.tolist(),
        "ours": ours.tolist(),
        "ref": ref.argmax(dim=1).tolist(),
        "vllm_topk": tid.tolist(),
        "ours_topk": oid.tolist(),
        "ref_topk": ref.topk(2, dim=1).indices.tolist(),
        "ours_topk_values": oval.tolist(),
        "ref_topk_values": ref.topk(2, dim=1).values.tolist(),
    }


SHARED_HEAD_VOCABS = (900, 400)  # LogitsProcessor(org_vocab_size) over a 1000-row head; 400: rank 1's shard wholly past


def _shared_head_case(plugin, gen, org_vocab):
    """A 1000-row head (a head shared with a larger model) under
    ``LogitsProcessor(org_vocab)``, the best row planted at id 950 (rank 1's
    shard) in every row: vLLM's own methods and the plugin's, and float64's
    argmax / top-k / log-probs over the first ``org_vocab`` rows and over all
    1000 (which one is vLLM's differs by version)."""
    vocab, hsize, batch, k, planted = 1000, 16, 5, 4, 950
    full = torch.randn(vocab, hsize, generator=gen) / hsize**0.5
    hidden = torch.randn(batch, hsize, generator=gen)
    hidden[:, 0] = 3.0
    full[planted] = 0.0
    full[planted, 0] = 5.0  # logit 15 on every row; the others' largest ~4
    head = head_of(full)
    lp = processor(vocab)
    lp.org_vocab_size = org_vocab  # LogitsProcessor(vocab, org_vocab_size=org_vocab), the head's rows unchanged
    before = plugin.stats().get("fused", 0)
    theirs, ours = both(plugin, lp, head, hidden, "get_top_tokens")
    (tid, _), (oid, oval_raw) = both(plugin, lp, head, hidden, "get_top_k_tokens", k)
    (lid, lval), (olid, olval) = both(plugin, lp, head, hidden, "get_top_k_tokens", k, return_log_probs=True)
    x = ref_logits(hidden, full)
    out = {
        "fused": plugin.stats().get("fused", 0) - before,
        "vllm": theirs.tolist(), "ours": ours.tolist(),
        "vllm_topk": tid.tolist(), "ours_topk": oid.tolist(),
        "vllm_lp_ids": lid.tolist(), "ours_lp_ids": olid.tolist(),
        "vllm_lp": lval.tolist(), "ours_lp": olval.tolist(),
        "ours_values": oval_raw.tolist(),
    }  # fmt: skip
    for name, end in (("ref_org", org_vocab), ("ref_all", vocab)):
        v = x[:, :end]
        top = v.topk(k, dim=1)
        out[name] = {
            "ids": v.argmax(dim=1).tolist(), "topk": top.indices.tolist(), "values": top.values.tolist(),
            "log_probs": torch.log_softmax(v, dim=1).gather(1, top.indices).tolist(),
        }  # fmt: skip
    return out


def _softcap_tie_case(plugin):
    """A soft-cap that saturates: logits 30 (id 100, rank 0) and 40 (id 700,
    rank 1) both cap to exactly 1.0 in float32 and float64; vLLM's argmax of
    the capped logits takes the smaller id, 100."""
    vocab, hsize = 1000, 2
    full = torch.zeros(vocab, hsize)
    full[100] = torch.tensor([30.0, 0.0])
    full[700] = torch.tensor([40.0, 0.0])
    hidden = torch.tensor([[1.0, 0.0], [1.0, 5.0]])
    head, lp = head_of(full), processor(vocab, soft_cap=1.0)
    theirs, ours = both(plugin, lp, head, hidden, "get_top_tokens")
    x = torch.tanh(ref_logits(hidden, full) / 1.0) * 1.0
    return {"vllm": theirs.tolist(), "ours": ours.tolist(), "ref": x.argmax(dim=1).tolist()}


class _FakeQuantMethod:
    """Stands in for a quantized lm_head's method (not an Unquantized* method)."""

    def apply(self, layer, x, bias=None):
        return torch.nn.functional.linear(x, layer.weight, bias)


def _fallback_cases(plugin, gen):
    """Inputs the fused op does not take: vLLM's own method must run, with its result or error."""
    vocab, hsize, batch = 700, 16, 4
    full = torch.randn(vocab, hsize, generator=gen)
    hidden = torch.randn(batch, hsize, generator=gen)
    out = {}

    def run(name, lp, head, method, *args, **kwargs):
        before = dict(plugin.stats())
        try:
            theirs = vllm_method(method)(lp, head, hidden, *args, **kwargs)
        except Exception as e:  # noqa: BLE001
            theirs = f"{type(e).__name__}: {e}"
        try:
            ours = getattr(lp, method)(head, hidden, *args, **kwargs)
        except Exception as e:  # noqa: BLE001
            ours = f"{type(e).__name__}: {e}"
        after = plugin.stats()
        delta = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}

        def as_data(r):
            return (
                [t.tolist() for t in r] if isinstance(r, tuple) else (r.tolist() if isinstance(r, torch.Tensor) else r)
            )

        out[name] = {"vllm": as_data(theirs), "ours": as_data(ours), "stats": delta}

    head = head_of(full)
    run("logits_as_input", processor(vocab, logits_as_input=True), head, "get_top_tokens")
    run("non_positive_scale", processor(vocab, scale=-1.0), head, "get_top_tokens")
    run("non_positive_scale_topk", processor(vocab, scale=0.0), head, "get_top_k_tokens", 3)
    run(
        "return_log_probs_logits_as_input",
        processor(vocab, logits_as_input=True),
        head,
        "get_top_k_tokens",
        3,
        return_log_probs=True,
    )
    bias2d = torch.randn(1, head.weight.shape[0], generator=gen)
    run("bias_other_shape", processor(vocab), head, "get_top_tokens", bias2d)
    run("k_over_64", processor(vocab), head, "get_top_k_tokens", 65)
    quant = head_of(full)
    quant.quant_method = _FakeQuantMethod()
    run("quantized_lm_head", processor(vocab), quant, "get_top_tokens")
    lora = head_of(torch.randn(vocab + 10, hsize, generator=gen), org_vocab=vocab)
    run("added_vocab", processor(vocab + 10), lora, "get_top_tokens")
    return out


def _bytes_case(plugin, gen):
    """Bytes one rank sends per step: vLLM's collectives vs our one exchange."""
    from vllm.distributed.parallel_state import GroupCoordinator

    from localargmax.plan import StepPlan

    sent = {"vllm": 0, "ours": 0, "ours_wire": 0}
    orig_gather, orig_exchange = GroupCoordinator.all_gather, StepPlan._exchange
    inside = [False]  # in our exchange: its coordinator all-gather is "ours_wire" (padded to 16 bytes)

    def count_gather(self, input_, dim=-1):
        sent["ours_wire" if inside[0] else "vllm"] += input_.numel() * input_.element_size()
        return orig_gather(self, input_, dim)

    def count_exchange(plan, frame, *args):
        sent["ours"] += frame.numel() * frame.element_size()
        inside[0] = True
        try:
            return orig_exchange(plan, frame, *args)
        finally:
            inside[0] = False

    rows = []
    GroupCoordinator.all_gather, StepPlan._exchange = count_gather, count_exchange
    try:
        for dtype in (torch.float32, torch.bfloat16):
            full = torch.randn(1000, 32, generator=gen).to(dtype)
            head, lp = head_of(full), processor(1000)
            for batch in (1, 8, 64):
                hidden = torch.randn(batch, 32, generator=gen).to(dtype)
                for method, args, kw in (
                    ("get_top_tokens", (), {}),
                    ("get_top_k_tokens", (8,), {}),
                    ("get_top_k_tokens", (8,), {"return_log_probs": True}),
                ):
                    sent.update(vllm=0, ours=0, ours_wire=0)
                    both(plugin, lp, head, hidden, method, *args, **kw)
                    rows.append(
                        {
                            "dtype": str(dtype).split(".")[1],
                            "batch": batch,
                            "method": method,
                            "k": args[0] if args else 1,
                            "log_probs": bool(kw),
                            "vllm": sent["vllm"],
                            "ours": sent["ours"],
                            "ours_wire": sent["ours_wire"],
                        }
                    )
    finally:
        GroupCoordinator.all_gather, StepPlan._exchange = orig_gather, orig_exchange
    return rows


def _agreement_sweep(plugin, gen, batch=256, vocab=4000, hsize=64):
    """Random data, many rows: how often each path's argmax equals float64's."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        full = (torch.randn(vocab, hsize, generator=gen) / hsize**0.5).to(dtype)
        hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
        head, lp = head_of(full), processor(vocab)
        theirs, ours = both(plugin, lp, head, hidden, "get_top_tokens")
        logits = ref_logits(hidden, full)
        ref, top2 = logits.argmax(dim=1), logits.topk(2, dim=1).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-4  # rows away from float32-accumulation near-ties
        out[str(dtype).split(".")[1]] = {
            "rows": batch,
            "vllm_right": int((theirs == ref).sum()),
            "ours_right": int((ours == ref).sum()),
            "ours_wrong_clear": int(((ours != ref) & clear).sum()),
        }
    return out


def _bad_input_case(plugin, gen):
    """A hidden size that does not match the head: both methods raise on every rank, ours naming the argument."""
    head = head_of(torch.randn(500, 16, generator=gen))
    hidden = torch.randn(3, 17, generator=gen)
    out = {}
    for name, fn in (("vllm", vllm_method("get_top_tokens")), ("ours", type(processor(500)).get_top_tokens)):
        try:
            fn(processor(500), head, hidden)
            out[name] = "no error"
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {e}"
    return out


def _switch_case(plugin):
    """register() honours LOCALARGMAX_VLLM_PLUGIN=0; uninstall() restores vLLM's methods."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    out = {}
    plugin.uninstall()
    out["uninstalled_restores_vllm"] = not plugin.is_active() and LogitsProcessor.get_top_tokens.__module__.startswith(
        "vllm."
    )
    os.environ["LOCALARGMAX_VLLM_PLUGIN"] = "0"
    plugin.register()
    out["disabled_by_env"] = not plugin.is_active()
    del os.environ["LOCALARGMAX_VLLM_PLUGIN"]
    plugin.register()
    plugin.register()  # idempotent
    out["reinstalled"] = plugin.is_active() and vllm_method("get_top_tokens").__module__.startswith("vllm.")
    return out


def worker(rank: int, world_size: int, seed: int):
    ctx, cfg = vllm_setup(rank, world_size)
    from vllm.plugins import load_general_plugins

    import localargmax.integrations.vllm as plugin

    warnings = WarningLog("own LogitsProcessor method runs for")  # the fallbacks' line
    logging.getLogger("localargmax.integrations.vllm").addHandler(warnings)
    load_general_plugins()  # vLLM's own entry-point loader, as in every vLLM process
    import vllm

    out = {"active_after_vllm_loader": plugin.is_active(), "vllm": vllm.__version__}
    if not out["active_after_vllm_loader"]:
        plugin.install()  # still exercise the methods; the test reports the missing entry point
    gen = torch.Generator().manual_seed(seed)
    out["argmax"] = {name: _argmax_case(plugin, gen, *args, **kw) for name, (*args, kw) in ARGMAX_CASES.items()}
    out["topk"] = {name: _topk_case(plugin, gen, *args, **kw) for name, (*args, kw) in TOPK_CASES.items()}
    out["past_2_24"] = _past_2_24_case(plugin)
    out["bf16_near_tie"] = _bf16_near_tie_case(plugin)
    out["fallback"] = _fallback_cases(plugin, gen)
    out["bytes"] = _bytes_case(plugin, gen)
    out["shared_head"] = {org: _shared_head_case(plugin, gen, org) for org in SHARED_HEAD_VOCABS}
    out["softcap_tie"] = _softcap_tie_case(plugin)
    out["proposer"] = proposer_case(plugin, gen, cfg)
    out["eagle3"] = eagle3_case(plugin, gen, cfg)
    out["bad_input"] = _bad_input_case(plugin, gen)
    out["sweep"] = _agreement_sweep(plugin, gen)
    out["amx_forced"] = _amx_forced_case(plugin, gen)
    out["collective"] = _collective_case(plugin, gen, rank, seed)
    out["adaptive_config"] = config_case(plugin)
    out["versions"] = version_cases(plugin)
    out["adaptive_special_rows"] = special_rows_case(plugin, gen, cfg)
    out["adaptive_speculator"] = speculator_case(plugin, gen, cfg)
    out["fallback_warnings"] = {
        reason: sum(reason in m for _, m in warnings.records) for reason in sorted(set(warnings.reasons))
    }
    out["stats"] = plugin.stats()
    out["switch"] = _switch_case(plugin)
    from vllm.distributed import destroy_model_parallel

    destroy_model_parallel()
    ctx.__exit__(None, None, None)
    return out
