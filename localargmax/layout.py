"""The standard vocab-parallel layout of an lm_head across TP ranks."""

from __future__ import annotations

from typing import NamedTuple


class VocabShard(NamedTuple):
    """One TP rank's slice of a vocab-parallel lm_head.

    Attributes:
        vocab_start: global vocabulary index of the shard's local row 0.
        rows: rows the shard holds (equal on every rank; includes padding).
        num_valid: rows ``[0, num_valid)`` are vocabulary; the rest is padding
            (``0 <= num_valid <= rows``; 0 for a shard that is all padding).
    """

    vocab_start: int
    rows: int
    num_valid: int


def shard_vocab(vocab_size: int, rank: int, world_size: int, pad_to: int = 64) -> VocabShard:
    """The standard vocab-parallel layout (vLLM's ``VocabParallelEmbedding``).

    The vocabulary is padded up to a multiple of ``pad_to``, then split into
    ``world_size`` equal shards of ``rows = ceil(padded / world_size)`` rows;
    rank ``r`` holds global rows ``[r * rows, (r + 1) * rows)``. Padding sits at
    the end, so the last shards may be partly or wholly padding. When
    ``world_size`` divides the padded size this is exactly vLLM's layout.

    Example::

        shard = shard_vocab(151936, rank=3, world_size=8)  # vocab_start 56976, 18992 rows
        weight = full[shard.vocab_start : shard.vocab_start + shard.num_valid]

    Args:
        vocab_size: number of real vocabulary entries (>= 1).
        rank: this TP rank, ``0 <= rank < world_size``.
        world_size: TP world size (>= 1).
        pad_to: padding granularity of the whole vocabulary (>= 1).

    Returns:
        VocabShard(vocab_start, rows, num_valid).

    Raises:
        ValueError naming the argument for out-of-range values.
    """
    for name, value in (("vocab_size", vocab_size), ("world_size", world_size), ("pad_to", pad_to)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
    padded = -(-vocab_size // pad_to) * pad_to
    rows = -(-padded // world_size)
    vocab_start = rank * rows
    num_valid = max(0, min(rows, vocab_size - vocab_start))
    return VocabShard(vocab_start, rows, num_valid)


def check_layouts(shard: VocabShard, hidden_size: int, group, *, rank: int | None = None,
                  world_size: int | None = None) -> None:  # fmt: skip
    """Check once, at construction, that the TP ranks of ``group`` hold a
    consistent vocab-parallel layout; one ``all_gather_object`` of the layouts.

    Consistent means: equal ``rows`` and ``hidden_size`` on every rank, the
    valid ranges ``[vocab_start, vocab_start + num_valid)`` disjoint, and
    (where given) each rank's ``world_size`` the group's size and its ``rank``
    its rank in the group. Every rank sees the same gathered data and so
    raises the same error: no rank is left waiting in a later collective.

    Args:
        shard: this rank's VocabShard.
        hidden_size: this rank's H.
        group: a ``torch.distributed.ProcessGroup``; ``None`` checks nothing.
        rank, world_size: the TP rank and world size this rank's layout was
            built for (optional).

    Raises:
        ValueError naming the ranks that disagree.
    """
    if group is None:
        return
    import torch.distributed as dist

    claimed = (-1 if rank is None else int(rank), -1 if world_size is None else int(world_size))
    mine = (int(shard.vocab_start), int(shard.rows), int(shard.num_valid), int(hidden_size))
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (mine, claimed), group=group)
    layouts = [layout for layout, _ in gathered]
    problems = []
    for r, (_, (their_rank, their_world)) in enumerate(gathered):
        if their_world not in (-1, len(gathered)):
            problems.append(f"rank {r} was built for world_size {their_world}, the group has {len(gathered)} ranks")
        if their_rank not in (-1, r):
            problems.append(f"group rank {r} was built as TP rank {their_rank}")
    for field, index in (("rows", 1), ("hidden_size", 3)):
        values = {}
        for rank, layout in enumerate(layouts):
            values.setdefault(layout[index], []).append(rank)
        if len(values) > 1:
            problems.append(
                f"{field} differs across ranks: " + "; ".join(f"ranks {r} have {v}" for v, r in values.items())
            )
    spans = sorted((start, start + valid, rank) for rank, (start, _, valid, _) in enumerate(layouts) if valid > 0)
    for (_, e0, r0), (s1, e1, r1) in zip(spans, spans[1:]):
        if s1 < e0:
            problems.append(f"ranks {r0} and {r1} both hold vocabulary ids [{s1}, {min(e0, e1)})")
    if problems:
        raise ValueError(
            "inconsistent vocab-parallel layouts: "
            + " | ".join(problems)
            + f" (all layouts (vocab_start, rows, num_valid, hidden_size) by rank: {layouts})"
        )
