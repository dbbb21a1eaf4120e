"""Which CUDA path ``path="auto"`` takes: C++'s own choice, unless a
measured dispatch table is set.

A measured table (``python -m bench.tune --write-table PATH`` on the GPU,
from a checkout) maps (arch, dtype, hidden size, shard rows, batch) to a path
(``"simt"``, ``"mma"``, ``"gemm"``) and, for mma, the named config its
launcher runs there. ``LOCALARGMAX_DISPATCH_TABLE=PATH`` makes ``shard_argmax`` /
``shard_sample`` on CUDA with ``path="auto"`` follow it (:func:`cuda_path`);
where it has no entry (another arch, float32, top-k), or when no table is
set, the C++ op's ``auto`` decides. No table ships with the package.

The table is keyed by the shard's *rows* (``weight.shape[0]``, padding
included), which every rank of a vocab-parallel layout shares, so every rank
takes the same path (DESIGN.md, CUDA rules); every rank must be given the
same table.
"""

from __future__ import annotations

import functools
import json
import os
from typing import NamedTuple

import torch

from . import envs
from ._ext import _C
from ._validation import MMA_CONFIGS

SCHEMA = "localargmax.dispatch_table/3"
PATHS = ("simt", "mma", "gemm")
LIMIT = 2**31
CPP_GEMM_MIN_BATCH = 17
"""C++ ``auto`` takes gemm from this batch (kDefaultGemmMinBatch in
csrc/cuda; tests/test_dispatch.py checks they agree). Below it, C++ ``auto``
takes mma where the mma kernel takes the inputs, else simt."""
MEMO_SIZE = 4096
"""Cells :meth:`DispatchTable.choose` remembers per table (an engine sees a
handful of (H, rows, batch) keys; a lookup then costs one dict access)."""


class Choice(NamedTuple):
    """One cell of the table: the path, the tensor-core config's name for
    ``"mma"`` (a key of :data:`localargmax._validation.MMA_CONFIGS`, the C++
    table of csrc/cuda/mma_configs.h; None for simt / gemm, whose launchers
    size themselves by the batch), and ``"predicted"`` or ``"measured"``."""

    path: str
    config: str | None
    source: str

    @property
    def op_path(self) -> str:
        """The C++ op's ``path`` string that runs this choice: ``"mma/<name>"``, ``"simt"``, ``"gemm"``."""
        return f"mma/{self.config}" if self.path == "mma" and self.config is not None else self.path


class DispatchTable:
    """A validated table; :meth:`choose` looks a cell up."""

    def __init__(self, doc: dict):
        validate(doc)
        self.doc = doc
        self.source = doc["source"]
        self._cells = {}
        self._memo = {}  # (arch, dtype, hidden_size, rows, batch) -> Choice, filled by eager calls
        for t in doc["tables"]:
            edges = t["edges"]
            cells = {}
            for e in t["entries"]:
                idx = tuple(edges[k].index(e[k][0]) for k in ("hidden", "rows", "batch"))
                cells[idx] = Choice(e["path"], e["config"], e["source"])
            for dtype in t["dtypes"]:
                self._cells[(t["arch"], dtype)] = (edges, cells)

    def choose(self, arch: str, dtype: str, hidden_size: int, rows: int, batch: int) -> Choice | None:
        """The cell of (arch, dtype, hidden_size, rows, batch); None when the
        table has no entry for the arch and dtype. ``rows`` is the shard's
        row count (``weight.shape[0]``), not ``num_valid``."""
        key = (arch, dtype, hidden_size, rows, batch)
        eager = not torch.compiler.is_compiling()  # traced calls remember nothing
        if eager and key in self._memo:  # one dict lookup per repeated call
            return self._memo[key]
        found = self._cells.get((arch, dtype))
        if found is None:
            return None
        edges, cells = found
        for name, value in (("hidden_size", hidden_size), ("rows", rows), ("batch", batch)):
            if not 0 <= value < LIMIT:
                raise ValueError(f"choose: {name} must be in [0, 2**31), got {value}")
        h, r, b = _bucket(edges["hidden"], hidden_size), _bucket(edges["rows"], rows), _bucket(edges["batch"], batch)
        choice = cells[(h, r, b)]
        if eager and len(self._memo) < MEMO_SIZE:
            self._memo[key] = choice
        return choice


def _bucket(edges: list, value: int) -> int:
    """Index i with edges[i] <= value < edges[i + 1] (a plain loop: torch.compile traces it)."""
    i = 0
    while edges[i + 1] <= value:
        i += 1
    return i


def validate(doc: dict) -> None:
    """Raise ValueError unless ``doc`` is a well-formed table: the schema,
    a source, and per arch a grid of buckets whose entries cover every
    (hidden, rows, batch) in ``[0, 2**31)`` exactly once with a known path."""
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"dispatch table: schema must be {SCHEMA!r}, got {doc.get('schema')!r}")
    if doc.get("source") not in ("predicted", "measured"):
        raise ValueError(f"dispatch table: source must be 'predicted' or 'measured', got {doc.get('source')!r}")
    seen = set()
    for t in doc.get("tables") or []:
        for dtype in t["dtypes"]:
            if (t["arch"], dtype) in seen:
                raise ValueError(f"dispatch table: {t['arch']} {dtype} appears twice")
            seen.add((t["arch"], dtype))
        edges = t["edges"]
        for k in ("hidden", "rows", "batch"):
            e = edges[k]
            if e[0] != 0 or e[-1] != LIMIT or any(a >= b for a, b in zip(e, e[1:])):
                raise ValueError(f"dispatch table {t['arch']}: {k} edges must rise from 0 to 2**31, got {e}")
        want = {(h, r, b) for h in edges["hidden"][:-1] for r in edges["rows"][:-1] for b in edges["batch"][:-1]}
        got = []
        for e in t["entries"]:
            for k in ("hidden", "rows", "batch"):
                lo, hi = e[k]
                i = edges[k].index(lo) if lo in edges[k] else -1
                if i < 0 or i + 1 >= len(edges[k]) or edges[k][i + 1] != hi:
                    raise ValueError(f"dispatch table {t['arch']}: entry {k} {e[k]} is not one bucket of {edges[k]}")
            if e["path"] not in PATHS or e["source"] not in ("predicted", "measured"):
                raise ValueError(f"dispatch table {t['arch']}: bad path or source in {e}")
            want_config = e["path"] == "mma"
            if (e.get("config") is not None) != want_config or (
                want_config and (not isinstance(e["config"], str) or e["config"] not in MMA_CONFIGS)
            ):
                raise ValueError(
                    f"dispatch table {t['arch']}: config must name an mma config ({', '.join(MMA_CONFIGS)}) for "
                    f"path 'mma', null otherwise, in {e}"
                )
            got.append((e["hidden"][0], e["rows"][0], e["batch"][0]))
        if len(got) != len(set(got)) or set(got) != want:
            missing, extra = len(want - set(got)), len(got) - len(set(got))
            raise ValueError(f"dispatch table {t['arch']}: {missing} cells missing, {extra} duplicated")
    if not seen:
        raise ValueError("dispatch table: no tables")


def load(path: str | os.PathLike) -> DispatchTable:
    """The table at ``path``, validated (ValueError naming the file if not)."""
    try:
        with open(path) as f:
            return DispatchTable(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"dispatch table {os.fspath(path)!r}: {e}") from None


_loaded: dict[str, DispatchTable] = {}  # path -> table, read once per path
_current: DispatchTable | None = None  # the table of the last eager lookup: what traced calls use


def table() -> DispatchTable | None:
    """The measured table ``path="auto"`` follows: the file
    ``LOCALARGMAX_DISPATCH_TABLE`` names (read once per path), None when it
    is unset. Raises ValueError for a file that is not a valid measured
    table. Under torch.compile tracing no file or variable is read: the
    table of the last eager lookup is used (None before any)."""
    global _current
    if torch.compiler.is_compiling():
        return _current
    path = envs.LOCALARGMAX_DISPATCH_TABLE
    if path is None:
        _current = None
        return None
    if path not in _loaded:
        t = load(path)
        if t.source != "measured":
            raise ValueError(
                f"LOCALARGMAX_DISPATCH_TABLE={path!r} is a {t.source!r} table; path='auto' follows only a "
                "measured one (python -m bench.tune --write-table PATH on the GPU)"
            )
        _loaded[path] = t
    _current = _loaded[path]
    return _current


@functools.cache
def _arch_of(index: int | None) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


_arch = torch.compiler.assume_constant_result(_arch_of)  # a constant of the device under torch.compile

_DTYPE_NAMES = {"torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def cuda_path(hidden, weight) -> str:
    """The ``path`` to pass to the C++ op for ``path="auto"`` (argmax and
    sample, CUDA): the measured table's choice where one is set, has the cell
    and the op can take it without a fallback, else ``"auto"`` (C++ decides;
    also for a gemm cell past the gemm path's 2**21-row shard limit).

    A table ``"mma"`` cell names a config: ``"mma/<name>"`` is passed when the
    tensor-core kernel takes the inputs (``H`` and the weight's row stride
    multiples of 8, its data 16-byte aligned; a misaligned ``hidden`` is
    copied by the op), else ``"auto"`` (C++ takes simt for inputs the mma
    kernel cannot take). Under torch.compile tracing (the data pointer is not
    readable there) an mma cell passes ``"auto"``: the table names only
    configs of C++ auto's summation order at that batch
    (``bench/predict.py``'s ``mma_candidates``), so compiled and eager
    calls differ in speed, not in bits. The inputs of the choice are
    shared by every rank (dtype, ``H``, ``weight.shape[0]``, batch, arch,
    the weight's layout), never ``num_valid``."""
    dtype = _DTYPE_NAMES.get(str(weight.dtype))
    batch, hidden_size, rows = hidden.shape[0], weight.shape[1], weight.shape[0]
    if dtype is None or not all(isinstance(x, int) for x in (batch, hidden_size, rows)):
        return "auto"
    measured = table()
    if measured is None:
        return "auto"
    choice = measured.choose(_arch(weight.device.index), dtype, hidden_size, rows, batch)
    if choice is None:
        return "auto"
    if choice.path == "gemm" and _C._choose_cuda_path(True, False, True, CPP_GEMM_MIN_BATCH, rows) != "gemm":
        return "auto"  # past the gemm path's shard limit (kGemmMaxRows): C++ auto takes mma there
    if choice.path != "mma":
        return choice.path
    if torch.compiler.is_compiling():  # the data pointer is not readable while tracing
        return "auto"
    if hidden_size % 8 or (rows > 1 and weight.stride(0) % 8) or weight.data_ptr() % 16:
        return "auto"
    return choice.op_path
