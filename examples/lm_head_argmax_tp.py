"""The README's Python API example on several TP ranks (gloo, CPU).

Run it on 2 ranks with torchrun, or as one process (TP world size 1):

    torchrun --nproc-per-node 2 examples/lm_head_argmax_tp.py
    python examples/lm_head_argmax_tp.py

Under torchrun the process group reads torchrun's environment (env://:
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); every rank builds the same full
lm_head and hidden states from one seed, keeps its own vocabulary shard, and
all ranks print the same ids, the unsharded argmax (checked in float64).
On GPUs use the "nccl" backend and cuda tensors (one GPU per rank).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import localargmax


def problem(seed: int = 0, vocab: int = 32000, hidden_size: int = 256, batch: int = 4):
    """The same ``(full_lm_head [vocab, H], hidden [batch, H])`` float32 on every rank: one seed."""
    gen = torch.Generator().manual_seed(seed)
    full_lm_head = torch.randn(vocab, hidden_size, generator=gen) / hidden_size**0.5
    hidden = torch.randn(batch, hidden_size, generator=gen)
    return full_lm_head, hidden


def main() -> None:
    if "RANK" in os.environ:  # torchrun (or another launcher) set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        dist.init_process_group("gloo")
    else:  # one process on its own: a group of one rank
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    full_lm_head, hidden = problem()
    vocab, hidden_size = full_lm_head.shape

    # this rank's slice of a padded vocabulary (vLLM's VocabParallelEmbedding layout)
    shard = localargmax.shard_vocab(vocab_size=vocab, rank=rank, world_size=world_size)
    weight = torch.zeros(shard.rows, hidden_size)  # [rows, H]; rows past num_valid are padding
    weight[: shard.num_valid] = full_lm_head[shard.vocab_start : shard.vocab_start + shard.num_valid]

    ids = localargmax.lm_head_argmax(
        hidden, weight, vocab_start=shard.vocab_start, num_valid=shard.num_valid, group=dist.group.WORLD
    )  # [B] int64, identical on every rank
    unsharded = (hidden.double() @ full_lm_head.double().T).argmax(dim=1)
    same = torch.equal(ids, unsharded)
    print(
        f"rank {rank}/{world_size}: vocab rows [{shard.vocab_start}, {shard.vocab_start + shard.num_valid}), "
        f"ids {ids.tolist()}, identical to the unsharded argmax: {'yes' if same else 'NO'}",
        flush=True,
    )
    dist.destroy_process_group()
    if not same:
        raise SystemExit(f"rank {rank}: ids {ids.tolist()} != unsharded {unsharded.tolist()}")


if __name__ == "__main__":
    main()
