"""Argument checks of the ops (localargmax/ops.py), shared by the public
wrappers and the fake (meta) kernels. Each raises TypeError / ValueError
naming the argument and what it must be; the C++ kernels check the same
things again (csrc/checks.h) so that direct ``torch.ops.localargmax.*`` calls
can never crash or read out of bounds."""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch

from ._ext import _C
from .packed_key import MAX_GLOBAL_INDEX

MAX_TOPK = 64
"""Largest k of :func:`localargmax.shard_topk`."""


class CpuPath(NamedTuple):
    """One CPU path (csrc/cpu/cpu_path.h, read from ``_C._cpu_paths()``): the
    ``/proc/cpuinfo`` features it ``needs``, whether its keys are
    ``bit_exact`` with generic's for every dtype (the paths ``auto`` may
    take), and what its ``inner_loop`` is."""

    name: str
    needs: tuple[str, ...]
    bit_exact: bool
    inner_loop: str


CPU_PATHS: dict[str, CpuPath] = {row[0]: CpuPath(*row) for row in _C._cpu_paths()}
"""The CPU paths by name, in listing order (the C++ table itself)."""

PATHS = {"cpu": ("auto", *CPU_PATHS), "cuda": ("auto", "simt", "mma", "gemm")}
"""The kernel paths the ops' ``path`` argument names, per device type."""


class MmaConfig(NamedTuple):
    """One named config of the tensor-core kernel (csrc/cuda/mma_configs.h,
    read from ``_C._mma_configs()``): ``nt`` n-tiles of 8 batch rows per warp,
    ``wn`` warps along the batch sharing each weight stage (``batch_rows`` =
    ``8 * nt * wn`` batch rows per pass: one read of the weight each),
    ``rows`` = ``wm * mt * 16`` weight rows per block, ``wm * wn * sk`` warps
    (``sk``-way split-K), ``kc`` 32-element chunks per stage (= float32 partial
    sums per logit: configs of equal ``kc`` give the same bits), ``st`` stages,
    ``minb`` the launch bounds' blocks per SM, ``tma`` weight tiles by bulk
    tensor copy (sm_90+); ``regs90`` the registers per thread of its bf16
    sm_90a build (nvcc 13.0, the bandwidth model's fallback); shared memory
    per block in bytes; ``topk``: the config takes top-k (a cp.async config
    of at most 16 mma tiles a warp)."""

    name: str
    nt: int
    mt: int
    wm: int
    wn: int
    sk: int
    kc: int
    st: int
    minb: int
    tma: bool
    regs90: int
    rows: int
    threads: int
    static_smem: int
    dynamic_smem: int
    batch_rows: int
    topk: bool

    @property
    def smem(self) -> int:
        """Static + dynamic shared memory per block (bytes): what must fit the device's opt-in limit."""
        return self.static_smem + self.dynamic_smem

    @property
    def order(self) -> str:
        """The summation-order class (DESIGN.md rule 5): configs of one class give the same bits."""
        return f"KC={self.kc}"


MMA_CONFIGS: dict[str, MmaConfig] = {row[0]: MmaConfig(*row) for row in _C._mma_configs()}
"""The tensor-core kernel's configs by name, in the table's order (the C++
table itself: nothing mirrors it)."""


def mma_config_path(path, config, device: torch.device) -> str:
    """The op's ``path`` string for the public ``path`` and the private
    ``_mma_config`` keyword: ``path`` itself when ``config`` is None, else
    ``"mma/<config>"`` (CUDA only; ``path`` must be ``"auto"`` or ``"mma"``).
    ValueError names the argument and the configs there are."""
    check_path_arg(path, device)
    if config is None:
        return path
    if device.type != "cuda":
        raise ValueError(
            f"_mma_config names a tensor-core config, which exists on CUDA only; the weight is on {device}"
        )
    if path not in ("auto", "mma"):
        raise ValueError(
            f"_mma_config={config!r} forces the tensor-core path; path must be 'auto' or 'mma', got {path!r}"
        )
    if config not in MMA_CONFIGS:
        raise ValueError(f"_mma_config must be one of {tuple(MMA_CONFIGS)}, got {config!r}")
    return f"mma/{config}"


def op_kwargs(name: str) -> dict:
    """The inverse of :func:`mma_config_path` for the tools: ``shard_argmax`` /
    ``shard_sample`` keywords that run the path or config ``name`` (``"simt"``,
    ``"gemm"``, ``"mma"`` as ``path``; ``"mma/<config>"`` through ``_mma_config``)."""
    if name.startswith("mma/"):
        return {"path": "mma", "_mma_config": name[4:]}
    return {"path": name}


_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_tensor(name: str, value, dims: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {dims}, got {type(value).__name__}")


def check_shard_argmax_args(hidden, weight, bias, vocab_start, num_valid) -> None:
    """Raise ValueError/TypeError naming the argument if the shard_argmax inputs
    are malformed. Shared by the public wrapper and the fake kernel."""
    _check_tensor("hidden", hidden, "[batch, hidden_size]")
    check_weight_args(weight, bias, vocab_start, num_valid)
    check_hidden_arg(hidden, weight)


def check_hidden_arg(hidden, weight) -> None:
    """``hidden`` against a checked ``weight`` (:func:`check_weight_args`): 2-D
    ``[batch, hidden_size]``, the weight's dtype, hidden size and device
    (what a planned step checks per call)."""
    _check_tensor("hidden", hidden, "[batch, hidden_size]")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be 2-D [batch, hidden_size], got shape {tuple(hidden.shape)}")
    if hidden.dtype != weight.dtype:
        raise TypeError(f"hidden dtype ({hidden.dtype}) must equal weight dtype ({weight.dtype})")
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden is {tuple(hidden.shape)} and weight is {tuple(weight.shape)}: "
            "their last dimension (hidden_size) must match"
        )
    if hidden.device != weight.device:
        raise ValueError(f"hidden is on {hidden.device} but weight is on {weight.device}; both must be on one device")


def check_weight_args(weight, bias, vocab_start, num_valid) -> None:
    """The shard's own arguments (what a planned step checks once): ``weight``
    ``[rows, hidden_size]`` float32 / bfloat16 / float16 with contiguous
    rows, ``vocab_start``, ``num_valid``, ``bias``."""
    _check_tensor("weight", weight, "[rows, hidden_size]")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [rows, hidden_size], got shape {tuple(weight.shape)}")
    if weight.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"weight dtype must be float32, bfloat16 or float16, got {weight.dtype}")
    if weight.shape[1] > 1 and weight.stride(1) != 1:
        raise ValueError(
            f"weight rows must be contiguous (stride(1) == 1), got strides {weight.stride()}; "
            "call weight.contiguous() once at load time"
        )
    for name, value in (("vocab_start", vocab_start), ("num_valid", num_valid)):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if vocab_start < 0:
        raise ValueError(f"vocab_start must be >= 0, got {vocab_start}")
    rows = weight.shape[0]
    if not 0 <= num_valid <= rows:
        raise ValueError(f"num_valid must be in [0, rows={rows}], got {num_valid}")
    if num_valid > 0 and vocab_start + num_valid - 1 > MAX_GLOBAL_INDEX:
        raise ValueError(
            f"global indices up to vocab_start + num_valid - 1 = {vocab_start + num_valid - 1} exceed "
            f"{MAX_GLOBAL_INDEX}, the largest index a packed key holds (32 bits)"
        )
    if bias is not None:
        _check_tensor("bias", bias, f"[rows={rows}]")
        if bias.dim() != 1 or bias.shape[0] != rows:
            raise ValueError(f"bias must be 1-D [rows={rows}], got shape {tuple(bias.shape)}")
        if bias.dtype not in (torch.float32, weight.dtype):
            raise TypeError(f"bias dtype must be float32 or the weight dtype ({weight.dtype}), got {bias.dtype}")
        if bias.device != weight.device:
            raise ValueError(f"bias is on {bias.device} but weight is on {weight.device}")


def check_merge_keys_args(keys, d2t) -> None:
    """Raise ValueError/TypeError naming the argument if merge_keys inputs are malformed."""
    _check_tensor("keys", keys, "[tp, batch] or [batch]")
    if keys.dim() not in (1, 2):
        raise ValueError(f"keys must be [tp, batch] or [batch], got shape {tuple(keys.shape)}")
    if keys.dtype != torch.int64:
        raise TypeError(f"keys must be int64 packed keys, got {keys.dtype}")
    if keys.dim() == 2 and keys.shape[0] == 0 and keys.shape[1] > 0:
        raise ValueError(f"keys has 0 ranks (shape {tuple(keys.shape)})")
    if d2t is not None:
        check_d2t_arg(d2t, keys.device)


def check_d2t_arg(d2t, device) -> None:
    """Per-step d2t checks (dtype, rank, device); its contents are checked once
    at load time by :func:`localargmax.validate_d2t`."""
    _check_tensor("d2t", d2t, "[draft_vocab] int64")
    if d2t.dim() != 1:
        raise ValueError(f"d2t must be 1-D [draft_vocab], got shape {tuple(d2t.shape)}")
    if d2t.dtype != torch.int64:
        raise TypeError(f"d2t must be int64, got {d2t.dtype}")
    if d2t.device != device:
        raise ValueError(f"d2t is on {d2t.device} but the keys are on {device}")


def check_topk_arg(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, torch.SymInt)) or not 1 <= k <= MAX_TOPK:
        raise ValueError(f"k must be an int in [1, {MAX_TOPK}], got {k!r}")


class RowRule(NamedTuple):
    """What a per-row parameter (a temperature, a filter) may hold: integers
    or floats in ``[low, high]`` (``(low, high]`` with ``low_open``; an
    infinite bound means "finite"), and what the edge value ``means``, said in
    every message about it."""

    integer: bool
    low: float
    high: float = math.inf
    low_open: bool = False
    means: str = ""

    def words(self, number: bool) -> str:
        """The allowed values in words: for a number (``a finite float >= 0``)
        or for a tensor's values (``finite and >= 0``)."""
        if self.high == math.inf:
            bound = "" if self.low == -math.inf else f"{'>' if self.low_open else '>='} {_bound(self.low)}"
            if number:
                return f"a finite {'integer' if self.integer else 'float'}" + (f" {bound}" if bound else "")
            return "finite" + (f" and {bound}" if bound else "")
        interval = f"{'(' if self.low_open else '['}{_bound(self.low)}, {_bound(self.high)}]"
        return f"{'an integer' if self.integer else 'a float'} in {interval}" if number else f"in {interval}"

    def holds(self, value):
        """Whether ``value`` (a number, or a tensor elementwise) is allowed; NaN never is."""
        above = value > self.low if self.low_open else value >= self.low
        return above & (value <= self.high) & (value < math.inf)


def _bound(v) -> str:
    return f"{'-' if v < 0 else ''}2**62" if abs(v) == 2**62 else f"{v:g}"


TEMPERATURE = RowRule(False, 0.0, means="0 = greedy")
"""The sampling steps' temperature: finite, ``>= 0``; 0 is greedy."""
LOG_ODDS_TEMPERATURE = RowRule(False, -math.inf, low_open=True, means="T <= 0 means 1")
"""``lm_head_argmax``'s log-odds temperature: finite; ``T <= 0`` uses 1 (vLLM's rule)."""
TOP_K = RowRule(True, -(2**62), 2**62, means="<= 0 = off")
TOP_P = RowRule(False, 0.0, 1.0, low_open=True, means="1 = off")
MIN_P = RowRule(False, 0.0, 1.0, means="0 = off")


def host_checks(t: torch.Tensor) -> bool:
    """Whether a check may read ``t`` on the host: CPU tensors outside
    torch.compile. Elsewhere checks are folded into one device-side assert."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def check_row_number(value, name: str, rule: RowRule):
    """A per-row parameter given as one number (numpy scalars too), checked
    against ``rule``: returns it as an int or float, else ValueError."""
    kind = numbers.Integral if rule.integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or not rule.holds(value):
        raise ValueError(f"{name} must be {rule.words(True)} ({rule.means}) or a tensor [B], got {value!r}")
    return int(value) if rule.integer else float(value)


def row_param(value, name: str, hidden, rule: RowRule, *, optional: bool = True) -> torch.Tensor | None:
    """A per-row parameter (temperature, top_k, top_p, min_p) as the ``[B]``
    tensor the steps take (int64 or float32; None stays None if ``optional``): a number
    (:func:`check_row_number`) or a ``[B]`` / ``[]`` tensor of an integer or
    floating dtype on ``hidden``'s device. Values are checked against
    ``rule`` where they are on the host (:func:`host_checks`), before the cast
    (a tiny negative float64 would round to -0.0); elsewhere the kernels or the
    step's device-side assert see them. The one parser of every per-row
    parameter: its rule, and so its message, is the argument."""
    _check_tensor("hidden", hidden, "[batch, hidden_size]")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be 2-D [batch, hidden_size], got shape {tuple(hidden.shape)}")
    if value is None and optional:
        return None
    batch, dtype = hidden.shape[0], torch.int64 if rule.integer else torch.float32
    if not isinstance(value, torch.Tensor):
        return torch.full((batch,), check_row_number(value, name, rule), dtype=dtype, device=hidden.device)
    if value.dim() == 0:
        value = value.reshape(1).expand(batch)
    check_row_tensor(name, value, hidden)
    is_int = not value.is_floating_point() and not value.is_complex() and value.dtype != torch.bool
    if not (is_int if rule.integer else value.is_floating_point()):
        kind = "an integer" if rule.integer else "a float32"
        raise TypeError(f"{name} must be {kind} tensor [batch={batch}], got {value.dtype}")
    if rule.integer:  # int64 first: an int32 tensor cannot be compared with the 2**62 bounds
        value = value.to(dtype)
    if host_checks(value) and not bool(rule.holds(value).all()):
        raise ValueError(f"{name} must be {rule.words(False)} ({rule.means}), got {value.tolist()}")
    return value.to(dtype).contiguous()


class FilterRows(NamedTuple):
    """The filtered step's per-row parameters, parsed once at its entry
    (:func:`filter_rows`): ``t`` float32, ``k`` int64 (``<= 0``: off), ``p``
    and ``mp`` float64 (1 and 0: off), each ``[B]``; ``off`` bool ``[B]``,
    the rows with ``T > 0`` and every filter off (the unfiltered sample
    decides them); ``sample_off``, whether the step runs the sampling kernel
    for those rows (:func:`_some_row_off`)."""

    t: torch.Tensor
    k: torch.Tensor
    p: torch.Tensor
    mp: torch.Tensor
    off: torch.Tensor
    sample_off: bool

    @property
    def filters(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(t, k, p, mp)``, in the order the decisions take them
        (``sampling.decide_rows``, ``sampling.filter_and_sample``)."""
        return self.t, self.k, self.p, self.mp

    def take(self, idx: torch.Tensor) -> FilterRows:
        """The record of the rows ``idx`` (the fallback's rows)."""
        return FilterRows(self.t[idx], self.k[idx], self.p[idx], self.mp[idx], self.off[idx], self.sample_off)


def filter_rows(hidden, temperature, top_k, top_p, min_p) -> FilterRows:
    """The filtered step's per-row parameters (:class:`FilterRows`), each
    parsed by :func:`row_param` with its rule, the filters that are None
    filled with their off values."""
    t = row_param(temperature, "temperature", hidden, TEMPERATURE, optional=False)
    k = row_param(top_k, "top_k", hidden, TOP_K)
    p = row_param(top_p, "top_p", hidden, TOP_P)
    mp = row_param(min_p, "min_p", hidden, MIN_P)
    zero = torch.zeros(hidden.shape[0], dtype=torch.float64, device=hidden.device)
    k = zero.to(torch.int64) if k is None else k
    p = zero + 1.0 if p is None else p.to(torch.float64)
    mp = zero if mp is None else mp.to(torch.float64)
    off = (t > 0) & (k <= 0) & (p >= 1) & (mp <= 0)
    return FilterRows(t, k, p, mp, off, _some_row_off(off, temperature, top_k, top_p, min_p))


def _some_row_off(off, temperature, top_k, top_p, min_p) -> bool:
    """Whether the step runs the sampling kernel for the rows with every
    filter off (``off``): on the host, whether there is one; elsewhere (no
    synchronisation) unless the arguments show there is none (a number that
    turns a filter on, or a greedy temperature, for every row). The ranks
    hold the same arguments, so they decide alike (and their payloads have
    the same length either way)."""
    if host_checks(off):
        return bool(off.any())
    num = lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)  # noqa: E731
    return not (
        (num(temperature) and temperature == 0)
        or (num(top_k) and top_k > 0)
        or (num(top_p) and top_p < 1)
        or (num(min_p) and min_p > 0)
    )


def check_row_tensor(name: str, value, hidden, op: str = "") -> None:
    """A per-row tensor's shape and device: ``[B]`` on ``hidden``'s device
    (``op``, if given, prefixes the message)."""
    where = f"{op}: " if op else ""
    if value.dim() != 1 or value.shape[0] != hidden.shape[0]:
        raise ValueError(f"{where}{name} must be 1-D [batch={hidden.shape[0]}], got shape {tuple(value.shape)}")
    if value.device != hidden.device:
        raise ValueError(f"{where}{name} is on {value.device} but hidden is on {hidden.device}")


def check_temperature_arg(op: str, hidden, temperature) -> None:
    """The ops' per-row temperature, as the kernels take it: ``[B]`` float32
    on ``hidden``'s device (its values: csrc/checks.h, by :data:`TEMPERATURE`'s rule)."""
    if not isinstance(temperature, torch.Tensor):  # format the batch only to raise: formatting specialises it
        _check_tensor("temperature", temperature, f"[batch={hidden.shape[0]}] float32")
    if temperature.dim() != 1 or temperature.shape[0] != hidden.shape[0]:
        check_row_tensor("temperature", temperature, hidden, op)
    if temperature.dtype != torch.float32:
        raise TypeError(f"{op}: temperature must be float32, got {temperature.dtype}")
    if temperature.device != hidden.device:
        check_row_tensor("temperature", temperature, hidden, op)


def check_sample_args(hidden, temperature, seed, offset) -> None:
    check_temperature_arg("shard_sample", hidden, temperature)
    check_seed_offset(seed, offset)


def check_seed_offset(seed, offset) -> None:
    """``seed`` and ``offset``: Python ints in ``[0, 2**63)`` (ValueError otherwise)."""
    for name, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or not 0 <= value < 2**63:
            raise ValueError(f"{name} must be an int in [0, 2**63), got {value!r}")


def check_path_arg(path, device: torch.device) -> None:
    """``path`` must be one of :data:`PATHS` for the device type (whether the
    path can take the inputs is decided by the kernel, which raises
    ValueError naming the path rather than falling back)."""
    allowed = PATHS.get(device.type, ("auto",))
    if isinstance(path, str) and path in allowed:
        return
    raise ValueError(f"path must be one of {allowed} on {device.type}, got {path!r}")


_FLOAT32_MAX = 3.4028234663852886e38


_FLOAT32_MIN_NORMAL = 2.0**-126
"""The smallest normal float32. A smaller scale or soft-cap is subnormal (or
zero) in float32, where the kernels' products would depend on the caller's
flush-to-zero mode: refused. A plain comparison: traceable by
torch.compile with a symbolic float."""


def check_transform_args(scale, soft_cap, scale_name: str = "scale") -> None:
    """The logit transform of the log-partition ops: ``scale`` a finite float
    ``>= 2**-126`` (normal in float32), ``soft_cap`` None or such a float
    (the ops take 0 for none). ``scale_name``: the keyword the caller was
    given it as (the ops' ``scale``, the steps' ``logit_scale``: DESIGN.md,
    "Log-probabilities")."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= _FLOAT32_MAX:
        raise ValueError(f"{scale_name} must be a finite float > 0 (the logit scale), got {scale!r}")
    if scale < _FLOAT32_MIN_NORMAL:
        raise ValueError(
            f"{scale_name} must be >= 2**-126, a normal float32 (a subnormal one's products would follow "
            f"the caller's flush-to-zero mode), got {scale!r}"
        )
    if soft_cap is None:
        return
    if isinstance(soft_cap, bool) or not isinstance(soft_cap, (int, float)) or not 0 < soft_cap <= _FLOAT32_MAX:
        raise ValueError(f"soft_cap must be None or a finite float > 0, got {soft_cap!r}")
    if soft_cap < _FLOAT32_MIN_NORMAL:
        raise ValueError(f"soft_cap must be >= 2**-126, a normal float32 (or None), got {soft_cap!r}")


def check_op_transform_args(scale, soft_cap) -> None:
    """As :func:`check_transform_args`, for the raw ops' ``soft_cap`` (0 = none)."""
    check_transform_args(scale, None if soft_cap == 0 else soft_cap)


class VllmNoise(NamedTuple):
    """vLLM's noise for a batch: per row the hash's seed and position, as
    vLLM's kernel hashes them (the draft salt and the speculative step
    already folded in; build it with :func:`localargmax.vllm_noise`).

    Attributes:
        seed: ``[B]`` int64, vLLM's ``seeds[req_state_idx]`` (mixed with
            the speculative step where vLLM mixes it).
        pos: ``[B]`` int64, vLLM's ``pos`` (plus ``DRAFT_SALT`` when
            drafting). Only its low 32 bits enter the hash, as in vLLM.
    """

    seed: torch.Tensor
    pos: torch.Tensor


def int64_rows(value, name: str, like: torch.Tensor | None = None) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be an int64 tensor [B], got {type(value).__name__}")
    if value.dtype != torch.int64:
        raise ValueError(f"{name} must be int64, got {value.dtype}")
    if value.dim() != 1:
        raise ValueError(f"{name} must be 1-D [B], got shape {tuple(value.shape)}")
    if like is not None:
        if value.shape != like.shape:
            raise ValueError(f"{name} must have the seed's shape {tuple(like.shape)}, got {tuple(value.shape)}")
        if value.device != like.device:
            raise ValueError(f"{name} is on {value.device} but seed is on {like.device}")
    return value


def check_noise(noise, hidden: torch.Tensor) -> VllmNoise:
    """``noise`` for a batch of ``hidden``'s rows: a :class:`VllmNoise` of
    ``[B]`` int64 tensors on ``hidden``'s device (ValueError naming the
    field otherwise)."""
    if not isinstance(noise, VllmNoise):
        raise ValueError(f"noise must be None or a VllmNoise (localargmax.vllm_noise(seed, pos)), got {noise!r}")
    batch = hidden.shape[0]
    for name, t in (("noise.seed", noise.seed), ("noise.pos", noise.pos)):
        int64_rows(t, name)
        if t.shape[0] != batch:
            raise ValueError(f"{name} must be [B={batch}], got shape {tuple(t.shape)}")
        if t.device != hidden.device:
            raise ValueError(f"{name} is on {t.device} but hidden is on {hidden.device}")
    return noise
