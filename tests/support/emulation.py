"""Driver of the host SIMT emulation of the CUDA kernels (csrc/emu/): builds
the kernels' unmodified source with g++ into a small shared library (cached
under the system's temporary folder, keyed by the sources and flags) and runs the CUDA launchers'
choices on torch CPU tensors through ctypes. Used by tests/test_emulation*.py.

Every tensor a kernel reads or writes is copied into a checked arena region of
exactly its extent (its alignment kept), so an access outside it fails the
launch; see csrc/emu/simt_emu.h for what else is checked.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

import torch

from localargmax._validation import MMA_CONFIGS

ROOT = pathlib.Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
# The built libraries, keyed by sources and flags, in the system's temporary
# folder (the suite writes nothing into the checkout).
BUILD = pathlib.Path(tempfile.gettempdir()) / f"localargmax-emu-{os.getuid()}"
MAX_GRID_Y = 65535
DEFAULT_SM_COUNT = 132  # kDefaultSmCount of shard_launch.cuh (H200)
DEFAULT_SMEM_LIMIT = 227 * 1024  # kDefaultSmemLimit: opt-in shared memory per block (H100 / H200)
_KERNEL_FLAGS = ["-O1", "-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0"]
_COMMON_FLAGS = [
    "-std=c++20",
    "-fPIC",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-Wall",
    "-Wextra",
    "-Wno-unknown-pragmas",
    "-Wno-unused-parameter",
    "-Werror",
]
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
SIGN = -(2**63)

# The C ABI of csrc/emu (emu_kernels.cpp, simt_emu.cpp): entry point -> (restype, argtypes).
_p, _i64, _u64, _i32, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_int, ctypes.c_float
_ENTRY_POINTS = {
    "lam_emu_alloc": (_p, [ctypes.c_char_p, _u64, _u64, _i32]),
    "lam_emu_reset": (None, [_i32, _u64]),
    "lam_emu_last_error": (ctypes.c_char_p, []),
    "lam_emu_launched": (ctypes.c_char_p, []),
    "lam_emu_stats": (None, [ctypes.POINTER(_u64)]),
    "lam_emu_bytes_loaded": (_u64, [ctypes.c_char_p]),  # bytes the kernels loaded from the tensors of that name
    "lam_emu_smem_probe": (_i32, [_i32, _i32, _i32, _i32]),  # static_bytes, dynamic_bytes, raw, opt_in
    "lam_emu_launch_features": (_i32, [_i32, _i32, _i32]),  # ptx_version, binary_version, device_major
    # dtype, path, topk_mode, hidden, ldh, weight, ldw, bias_t, bias_f, batch, hidden_size, num_valid,
    # vocab_start, keys, block_topk, topk, temperature, seed, offset, max_grid_y, sm_count, config, smem_limit,
    # blocks (int64 out)
    "lam_emu_shard": (
        _i32,
        [_i32, _i32, _i32, _p, _i64, _p, _i64, _p, _p, *[_i64] * 4, _p, _p, _i32, _p, _u64, _u64]
        + [_i64, _i32, _i32, _i32, ctypes.POINTER(_i64)],
    ),
    "lam_emu_mma_config": (_i32, [_i64, _i64, _i64, _i32, _i32, _i32]),  # ..., smem_limit, topk
    "lam_emu_num_mma_configs": (_i32, []),
    "lam_emu_mma_config_name": (ctypes.c_char_p, [_i32]),
    # ... as lam_emu_shard, then states, scale, soft_cap, partition_temperature, blocks (int64 out)
    "lam_emu_shard_lse": (
        _i32,
        [_i32, _i32, _i32, _p, _i64, _p, _i64, _p, _p, *[_i64] * 4, _p, _p, _i32, _p, _u64, _u64]
        + [_i64, _i32, _i32, _i32, _p, _f32, _f32, _p, ctypes.POINTER(_i64)],
    ),
    "lam_emu_merge_partition": (_i32, [_p, _i64, _i64, _p, _p]),
    "lam_emu_set_noise": (None, [_p, _p]),  # noise=vllm_noise(...): [batch] int64 seeds, positions (or both None)
    # dtype, logits, ldl, rows, b0, bias_t, bias_f, batch, num_valid, vocab_start, keys, temperature, seed,
    # offset, max_grid_y, states, scale, soft_cap, partition_temperature
    "lam_emu_logits_to_keys": (
        _i32,
        [_i32, _p, _i64, _i64, _i64, _p, _p, _i64, _i64, _i64, _p, _p, _u64, _u64] + [_i64, _p, _f32, _f32, _p],
    ),
    "lam_emu_merge_keys": (_i32, [_p, _i64, _i64, _i32, _p, _i64, _p, _p]),
    "lam_emu_frame_init": (_i32, [_p, _i64, _i32, _i64, _i64]),  # frame, n, pairs, vocab_end, zero_words
    # frames, tp, stride, batch, k, pairs, flipped, mode, d2t, d2t_len, target_vocab, temperature,
    # ids, values, log_probs, log_odds, valid
    "lam_emu_merge_frames": (
        _i32,
        [_p, _i64, _i64, _i64, _i64, _i32, _i32, _i32, _p, _i64, _i64, _p, _p, _p, _p, _p, _p],
    ),
    "lam_emu_log_probs_from_pairs": (_i32, [_p, _p, _p, _i64, _i64, _i64, _p]),  # values, pairs, t, tp, batch, k, out
    # first word, stride, count, out: max noise -> worst |estimate - exact| / slack (the noise screen's bounds)
    "lam_emu_noise_bounds": (ctypes.c_double, [ctypes.c_uint32, ctypes.c_uint32, _u64, ctypes.POINTER(_f32)]),
}


class EmuError(AssertionError):
    """A checked failure of an emulated launch (out-of-bounds access, shared
    memory race or poisoned read, divergent barrier or shuffle, deadlock)."""


def sources(csrc: pathlib.Path = CSRC) -> list[pathlib.Path]:
    return sorted(
        [
            *(csrc / "emu").glob("*"),
            *(csrc / "cuda").glob("*.cuh"),
            *(csrc / "cuda").glob("*.h"),
            *(csrc / "common").glob("*.h"),
        ]
    )


def have_compiler() -> bool:
    return shutil.which("g++") is not None and shutil.which("objcopy") is not None


def _digest(files, flags) -> str:
    h = hashlib.sha256(" ".join(flags).encode())
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"building the emulation failed:\n{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def _runtime_object(csrc: pathlib.Path) -> pathlib.Path:
    """simt_emu.cpp (not instrumented), shared by every build of the same runtime."""
    files = [csrc / "emu" / n for n in ("simt_emu.cpp", "simt_emu.h", "simt_emu_runtime.h")]
    obj = BUILD / "runtime" / f"{_digest(files, _COMMON_FLAGS)}.o"
    if not obj.exists():
        obj.parent.mkdir(parents=True, exist_ok=True)
        tmp = obj.with_suffix(f".{os.getpid()}.tmp.o")
        _run(["g++", *_COMMON_FLAGS, "-O2", f"-I{csrc}", "-c", str(files[0]), "-o", str(tmp)])
        os.replace(tmp, obj)
    return obj


def build(csrc: pathlib.Path = CSRC, tag: str = "main", bf16_only: bool = False) -> pathlib.Path:
    """libemu.so of the kernels under `csrc` (a mutated copy for the mutation
    tests); compiled once per content, under BUILD (a temporary folder). bf16_only: only the
    bfloat16 instantiations (faster to compile)."""
    flags = [*_COMMON_FLAGS, *_KERNEL_FLAGS, *(["-DLAM_EMU_BF16_ONLY"] if bf16_only else [])]
    out_dir = BUILD / f"{tag}-{_digest(sources(csrc), flags)}"
    lib = out_dir / "libemu.so"
    if lib.exists():
        return lib
    runtime = _runtime_object(csrc)
    tmp = out_dir / f"tmp-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    kernels = tmp / "kernels.o"
    _run(["g++", *flags, f"-I{csrc}", "-c", str(csrc / "emu" / "emu_kernels.cpp"), "-o", str(kernels)])
    # The kernel translation unit's .bss holds nothing but the __shared__ statics.
    _run(["objcopy", "--rename-section", ".bss=lam_emu_shared", str(kernels)])
    _run(
        [
            "g++",
            "-shared",
            "-Wl,-Bsymbolic",
            "-Wl,--no-undefined",
            str(kernels),
            str(runtime),
            "-o",
            str(tmp / "libemu.so"),
        ]
    )
    os.replace(tmp / "libemu.so", lib)
    shutil.rmtree(tmp, ignore_errors=True)
    return lib


def _row_stride(t: torch.Tensor) -> int:
    return t.stride(0) if t.size(0) > 1 else t.size(1)


class PlacedWeight:
    """A [rows, hidden_size] weight with row stride ldw placed in the arena by
    Emulator.alloc_weight_view (shape, strides and dtype as a tensor's)."""

    def __init__(self, ptr: int, rows: int, hidden_size: int, ldw: int, dtype: torch.dtype):
        self.ptr, self.shape, self.ldw, self.dtype = ptr, (rows, hidden_size), ldw, dtype

    def size(self, dim: int) -> int:
        return self.shape[dim]

    def stride(self, dim: int) -> int:
        return (self.ldw, 1)[dim]


class Emulator:
    """One loaded build. Methods mirror the CUDA ops' launchers
    (csrc/cuda/shard_ops_cuda.cu, merge_keys_cuda.cu) step by step."""

    def __init__(self, lib: pathlib.Path):
        self.path = lib
        self.lib = ctypes.CDLL(str(lib))
        for name, (restype, argtypes) in _ENTRY_POINTS.items():
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        self.launched: list[str] = []

    def smem_launch(self, static_bytes: int, dynamic_bytes: int, raw: bool = False, opt_in: int = 0) -> str | None:
        """A launch of a kernel built for the purpose with this much shared
        memory: through the emulation's launch functor (the launchers' opt-in
        rule), or with ``raw`` straight to the emulated runtime with the
        kernel's MaxDynamicSharedMemorySize at ``opt_in`` (0: the default).
        Returns None when it launched, else the refusal."""
        self._reset(False, 0)
        if self.lib.lam_emu_smem_probe(static_bytes, dynamic_bytes, int(raw), opt_in) == 0:
            return None
        return self.lib.lam_emu_last_error().decode()

    def launch_features(self, ptx_version: int, binary_version: int, device_major: int) -> dict:
        """launch_features of shard_launch.cuh: ``{"pdl": bool, "tma": bool}``."""
        bits = self.lib.lam_emu_launch_features(ptx_version, binary_version, device_major)
        return {"pdl": bool(bits & 1), "tma": bool(bits & 2)}

    # -- arena --
    def _reset(self, scramble: bool, seed: int) -> None:
        self.lib.lam_emu_reset(int(scramble), seed)

    def _place(self, name: str, t: torch.Tensor | None, writable: bool = False) -> int | None:
        """Copies t's storage span (first to last element) into a checked
        region at the same address modulo 4096; returns the data pointer."""
        if t is None:
            return None
        assert t.dim() <= 2 and (t.dim() < 2 or t.stride(1) == 1 or t.size(1) <= 1)
        if t.numel() == 0:
            nbytes = 0
        elif t.dim() == 2:
            nbytes = ((t.size(0) - 1) * t.stride(0) + t.size(1)) * t.element_size()
        else:
            nbytes = ((t.size(0) - 1) * t.stride(0) + 1) * t.element_size()
        ptr = self.lib.lam_emu_alloc(name.encode(), nbytes, t.data_ptr() % 4096, int(writable))
        assert ptr, f"arena allocation of {nbytes} bytes for {name} failed"
        if nbytes:
            ctypes.memmove(ptr, t.data_ptr(), nbytes)
        return ptr

    def _alloc(self, name: str, nbytes: int, fill: int = 0) -> int:
        ptr = self.lib.lam_emu_alloc(name.encode(), nbytes, 0, 1)
        assert ptr, f"arena allocation of {nbytes} bytes for {name} failed"
        ctypes.memset(ptr, fill, nbytes)
        return ptr

    @staticmethod
    def _read(ptr: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype)
        ctypes.memmove(out.data_ptr(), ptr, out.numel() * out.element_size())
        return out

    def _place_bias_and_temperature(self, bias, weight, temperature):
        """The bias (as ``bias_t`` in the weight dtype or ``bias_f`` float32, as the
        CUDA launcher splits it) and the temperature, placed in the arena."""
        bias_t = bias_f = None
        if bias is not None:
            if bias.dtype == torch.float32 and weight.dtype != torch.float32:
                bias_f = bias.contiguous()
            else:
                bias_t = bias.contiguous()
        temp = temperature.contiguous() if temperature is not None else None
        return self._place("bias", bias_t), self._place("bias", bias_f), self._place("temperature", temp)

    def _place_noise(self, noise_seed, noise_pos):
        """noise=vllm_noise(...)'s [B] int64 seeds and positions, placed in the arena for
        the next launches (None, None: the Philox noise)."""
        assert (noise_seed is None) == (noise_pos is None)
        if noise_seed is None:
            self.lib.lam_emu_set_noise(None, None)
            return
        self.lib.lam_emu_set_noise(
            self._place("noise_seed", noise_seed.contiguous()), self._place("noise_pos", noise_pos.contiguous())
        )

    def _gemm_keys(self, hidden, weight, gemm_chunk, keys_args, partition_args):
        """The gemm path: float32 logits per batch chunk (torch matmul stands in
        for cuBLAS; chunk as shard_gemm.cu), then logits_to_keys_kernel on
        each: ``keys_args`` = (bias_t, bias_f, batch, num_valid, vocab_start,
        keys, temperature, seed, offset, max_grid_y), ``partition_args`` =
        (states or None, scale, soft_cap, partition_temperature or None)."""
        batch, w32 = hidden.size(0), weight.float()
        chunk = gemm_chunk or max(1, (1 << 30) // 4 // weight.size(0))
        for b0 in range(0, batch, chunk):
            rows = min(chunk, batch - b0)
            logits = hidden[b0 : b0 + rows].float() @ w32.T
            lp = self._place("logits", logits)
            stride = logits.stride(0) if rows > 1 else logits.size(1)
            self._check(
                self.lib.lam_emu_logits_to_keys(
                    _DTYPES[weight.dtype], lp, stride, rows, b0, *keys_args, *partition_args
                )
            )

    def _check(self, rc: int) -> None:
        self.launched += [s for s in self.lib.lam_emu_launched().decode().split(";") if s]
        if rc == 2:
            raise ValueError("the mma kernel does not take this problem (mma_takes)")
        if rc == 3:
            raise ValueError("this emulation build has no kernels for the dtype (bf16_only)")
        if rc == 4:
            raise ValueError("no such mma config")
        if rc == 5:
            raise ValueError("the forced mma config's shared memory exceeds the device's limit")
        if rc == 6:
            raise ValueError("log_partition: the forced mma config (TMA) has no log-partition")
        if rc == 7:
            raise ValueError("shard_topk: the forced mma config has no top-k")
        if rc != 0:
            raise EmuError(self.lib.lam_emu_last_error().decode())

    # -- the shard ops --
    def shard(
        self,
        hidden,
        weight,
        bias=None,
        vocab_start=0,
        num_valid=None,
        *,
        path="simt",
        k=None,
        temperature=None,
        seed=0,
        offset=0,
        max_grid_y=MAX_GRID_Y,
        scramble=False,
        order_seed=1,
        gemm_chunk=None,
        sm_count=DEFAULT_SM_COUNT,
        config=None,
        smem_limit=DEFAULT_SMEM_LIMIT,
        log_partition=False,
        scale=1.0,
        soft_cap=None,
        partition_temperature=None,
        noise_seed=None,
        noise_pos=None,
    ):
        """shard_argmax (k None, temperature None), shard_topk (k) or
        shard_sample (temperature) through the emulated kernel of `path`
        ("simt", "mma", "mma/<config name>" or "gemm"). weight: a tensor, or a PlacedWeight (a
        view too large to copy, already in the arena). mma: `config` (a name of
        csrc/cuda/mma_configs.h) forces a config, else launch_mma chooses for a
        device of `sm_count` SMs and `smem_limit` bytes of opt-in shared memory
        per block (a forced config past it raises ValueError naming it, its
        bytes and the limit, as run_mma does). log_partition: the *_lse op
        (simt, mma or gemm, as on CUDA): returns (keys, pairs [B, 2]);
        partition_temperature: shard_argmax_lse's [B] float32 T > 0 of the sums.
        noise_seed, noise_pos: shard_sample's noise=vllm_noise(...) tensors ([B] int64 each):
        on the gemm path alone, as pick_path (shard_ops_cuda.cu) rules; others
        raise ValueError as it does."""
        if noise_seed is not None and path != "gemm":
            raise ValueError(f"shard_sample: noise_seed (vLLM's noise) takes path 'gemm' on CUDA, got {path!r}")
        if path.startswith("mma/"):  # "mma/<name>": that config
            path, config = "mma", path[4:]
        row = self._config_row(config, smem_limit, log_partition)
        if log_partition:
            args = (k, temperature, seed, offset, max_grid_y, scramble, order_seed, scale, soft_cap or 0.0)
            launch = (sm_count, row, smem_limit)
            return self._shard_lse(
                hidden,
                weight,
                bias,
                vocab_start,
                num_valid,
                *args,
                path,
                gemm_chunk,
                partition_temperature,
                launch,
                noise=(noise_seed, noise_pos),
            )
        weight_ptr = weight.ptr if isinstance(weight, PlacedWeight) else None
        num_valid = weight.size(0) if num_valid is None else num_valid
        batch = hidden.size(0)
        topk = k is not None
        if batch == 0 or num_valid == 0:  # the launchers return before launching
            return torch.zeros((batch, k) if topk else (batch,), dtype=torch.int64)
        if weight_ptr is None:  # (alloc_weight_view reset the arena already)
            self._reset(scramble, order_seed)
        hidden = hidden if hidden.stride(1) == 1 else hidden.contiguous()
        dtype = _DTYPES[weight.dtype]
        bt, bf, tp = self._place_bias_and_temperature(bias, weight, temperature)
        self._place_noise(noise_seed, noise_pos)
        if path == "gemm":
            assert not topk and weight.dtype != torch.float32
            keys = self._alloc("keys", batch * 8)
            keys_args = [bt, bf, batch, num_valid, vocab_start, keys, tp, seed, offset, max_grid_y]
            self._gemm_keys(hidden, weight, gemm_chunk, keys_args, [None, 1.0, 0.0, None])
            return self._read(keys, (batch,), torch.int64)
        hp = self._place("hidden", hidden)
        wp = weight_ptr if weight_ptr is not None else self._place("weight", weight)
        blocks_x = (num_valid + 63) // 64
        if topk:
            block_topk = self._alloc("block_topk", blocks_x * batch * k * 8, fill=0xA5)  # at::empty: garbage
            keys = None
        else:
            keys = self._alloc("keys", batch * 8)  # zeroed on the stream
            block_topk = None
        used = ctypes.c_int64(-1)
        self._check(
            self.lib.lam_emu_shard(
                dtype,
                {"simt": 0, "mma": 1}[path],
                int(topk),
                hp,
                _row_stride(hidden),
                wp,
                _row_stride(weight),
                bt,
                bf,
                batch,
                hidden.size(1),
                num_valid,
                vocab_start,
                keys,
                block_topk,
                k or 1,
                tp,
                seed,
                offset,
                max_grid_y,
                sm_count,
                row,
                smem_limit,
                ctypes.byref(used),
            )
        )
        if not topk:
            return self._read(keys, (batch,), torch.int64)
        return self._merge_lists(block_topk, blocks_x, used.value, batch, k)

    def _merge_lists(self, block_topk, blocks_x, used, batch, k):
        """shard_op's host step for top-k: torch.topk over the lists of the
        ``used`` blocks the launch wrote (of the ``blocks_x`` allocated, the rest
        left as at::empty left them)."""
        assert 0 < used <= blocks_x, (used, blocks_x)  # (shard_ops_cuda.cu's check)
        lists = self._read(block_topk, (blocks_x, batch, k), torch.int64)[:used]
        flipped = lists.permute(1, 0, 2).reshape(batch, used * k) ^ SIGN
        return flipped.topk(k, 1, True, True).values ^ SIGN

    def mma_config(
        self,
        hidden_size: int,
        num_valid: int,
        batch: int,
        sm_count: int = DEFAULT_SM_COUNT,
        smem_limit: int = DEFAULT_SMEM_LIMIT,
        topk: bool = False,
    ) -> str:
        """launch_mma's auto choice (choose_mma_config; topk: for shard_topk): a config's name."""
        row = self.lib.lam_emu_mma_config(hidden_size, num_valid, batch, sm_count, smem_limit, int(topk))
        return self.mma_configs[row]

    def _config_row(self, config, smem_limit, log_partition) -> int:
        """The row of a forced config (-1: none; past the table: rc 4), after
        run_mma's checks: its shared memory under the limit, and a cp.async
        config with the log-partition (ValueError naming it, as on CUDA)."""
        known = self.mma_configs
        row = -1 if config is None else known.index(config) if config in known else len(known)
        if config in MMA_CONFIGS and MMA_CONFIGS[config].smem > smem_limit:
            raise ValueError(
                f"shard_argmax: mma config '{config}' needs {MMA_CONFIGS[config].smem} bytes of shared memory "
                f"per block; this device allows {smem_limit} (cudaDevAttrMaxSharedMemoryPerBlockOptin)"
            )
        if log_partition and config in MMA_CONFIGS and MMA_CONFIGS[config].tma:
            raise ValueError(f"log_partition: mma config '{config}' (TMA) has no log-partition")
        return row

    @functools.cached_property
    def mma_configs(self) -> list[str]:
        """The config names in table order, as this emulation library compiled them."""
        return [self.lib.lam_emu_mma_config_name(i).decode() for i in range(self.lib.lam_emu_num_mma_configs())]

    def _shard_lse(
        self, hidden, weight, bias, vocab_start, num_valid, k, temperature, seed, offset, max_grid_y, scramble,
        order_seed, scale, soft_cap, path="simt", gemm_chunk=None, partition_temperature=None,
        launch=(DEFAULT_SM_COUNT, -1, DEFAULT_SMEM_LIMIT), noise=(None, None),
    ):  # fmt: skip
        """The *_lse ops' CUDA launcher (shard_ops_cuda.cu) step by step:
        the simt or mma kernel (or, path "gemm", the logits then the keys
        kernel) with per-block states, then merge_partition_kernel over the
        blocks the kernel wrote. launch: (sm_count, config row, smem_limit) of mma."""
        num_valid = weight.size(0) if num_valid is None else num_valid
        batch = hidden.size(0)
        topk = k is not None
        if batch == 0 or num_valid == 0:
            keys = torch.zeros((batch, k) if topk else (batch,), dtype=torch.int64)
            return keys, torch.tensor([[-math.inf, 0.0]] * batch).reshape(batch, 2)
        self._reset(scramble, order_seed)
        hidden = hidden if hidden.stride(1) == 1 else hidden.contiguous()
        bt, bf, tp = self._place_bias_and_temperature(bias, weight, temperature)
        self._place_noise(*noise)
        own_t = partition_temperature is not None
        pt = self._place("partition_temperature", partition_temperature.contiguous()) if own_t else None
        merge_t = pt if own_t else tp  # the temperature the merge uses, as shard_ops_cuda.cu picks it
        blocks_x = (num_valid + 63) // 64
        keys = None if topk else self._alloc("keys", batch * 8)
        states = self._alloc("partition_states", blocks_x * batch * 16, fill=0xA5)  # at::empty: garbage
        pairs = self._alloc("pairs", batch * 8, fill=0xA5)
        if path == "gemm":
            assert not topk and weight.dtype != torch.float32
            keys_args = [bt, bf, batch, num_valid, vocab_start, keys, tp, seed, offset, max_grid_y]
            self._gemm_keys(hidden, weight, gemm_chunk, keys_args, [states, scale, soft_cap, pt])
            used = (num_valid + 4095) // 4096  # keys_blocks
            self._check(self.lib.lam_emu_merge_partition(states, used, batch, merge_t, pairs))
            return self._read(keys, (batch,), torch.int64), self._read(pairs, (batch, 2), torch.float32)
        hp, wp = self._place("hidden", hidden), self._place("weight", weight)
        block_topk = self._alloc("block_topk", blocks_x * batch * k * 8, fill=0xA5) if topk else None
        used = ctypes.c_int64(-1)
        self._check(
            self.lib.lam_emu_shard_lse(
                _DTYPES[weight.dtype],
                {"simt": 0, "mma": 1}[path],
                *[int(topk), hp, _row_stride(hidden), wp, _row_stride(weight), bt, bf],
                *[batch, hidden.size(1), num_valid, vocab_start, keys, block_topk, k or 1, tp, seed, offset],
                *[max_grid_y, *launch, states, scale, soft_cap, pt, ctypes.byref(used)],
            )
        )
        assert 0 < used.value <= blocks_x, (used.value, blocks_x)  # (shard_ops_cuda.cu's check)
        self._check(self.lib.lam_emu_merge_partition(states, used.value, batch, merge_t, pairs))
        out_pairs = self._read(pairs, (batch, 2), torch.float32)
        if not topk:
            return self._read(keys, (batch,), torch.int64), out_pairs
        return self._merge_lists(block_topk, blocks_x, used.value, batch, k), out_pairs

    def merge_keys(self, keys: torch.Tensor, d2t: torch.Tensor | None = None):
        keys = (keys.unsqueeze(0) if keys.dim() == 1 else keys).contiguous()
        tp, batch = keys.shape
        if batch == 0:
            return torch.empty(0, dtype=torch.int64), torch.empty(0)
        self._reset(False, 1)
        kp = self._place("keys", keys)
        dp = self._place("d2t", d2t.contiguous()) if d2t is not None else None
        ids = self._alloc("ids", batch * 8, fill=0xA5)
        values = self._alloc("values", batch * 4, fill=0xA5)
        self._check(
            self.lib.lam_emu_merge_keys(
                kp, tp, batch, int(d2t is not None), dp, d2t.size(0) if d2t is not None else 0, ids, values
            )
        )
        return self._read(ids, (batch,), torch.int64), self._read(values, (batch,), torch.float32)

    def frame_init(self, words: int, n: int, pairs: bool, vocab_end: int, zero_words: int) -> torch.Tensor:
        """frame_init_kernel on a frame of ``words`` int64 words filled with
        0xA5 bytes: the frame afterwards."""
        self._reset(False, 1)
        frame = self._alloc("frame", words * 8, fill=0xA5)
        self._check(self.lib.lam_emu_frame_init(frame, n, int(pairs), vocab_end, zero_words))
        return self._read(frame, (words,), torch.int64)

    def merge_frames(self, frames, batch, k, pairs, mode, d2t, target_vocab, temperature, log_probs, log_odds,
                     flipped=False):  # fmt: skip
        """merge_frames_kernel over ``frames`` [tp, words], with the outputs
        of ``torch.ops.localargmax.merge_frames`` (ids, values, log_probs,
        log_odds, ok); outputs are 0xA5-filled before the launch."""
        frames = frames.contiguous()
        tp, stride = frames.shape
        shape = (batch, k) if mode == 1 else (batch,)
        n = batch * k
        self._reset(False, 1)
        fp = self._place("frames", frames)
        dp = self._place("d2t", d2t.contiguous()) if d2t is not None else None
        tpp = self._place("temperature", temperature.contiguous()) if temperature is not None else None
        ids = self._alloc("ids", max(n, 1) * 8, fill=0xA5)
        values = self._alloc("values", max(n, 1) * 4, fill=0xA5)
        lp = self._alloc("log_probs", max(n, 1) * 4, fill=0xA5) if log_probs else None
        lo = self._alloc("log_odds", max(batch, 1) * 4, fill=0xA5) if log_odds else None
        valid = self._alloc("valid", 1, fill=0xA5)
        self._check(
            self.lib.lam_emu_merge_frames(
                fp, tp, stride, batch, k, int(pairs), int(flipped), mode, dp, 0 if d2t is None else d2t.numel(),
                target_vocab, tpp, ids, values, lp, lo, valid,
            )
        )  # fmt: skip
        out = self._read(ids, shape, torch.int64), self._read(values, shape, torch.float32)
        lp_out = self._read(lp, shape, torch.float32) if log_probs else torch.empty(0)
        lo_out = self._read(lo, (batch,), torch.float32) if log_odds else torch.empty(0)
        return (*out, lp_out, lo_out, bool(self._read(valid, (1,), torch.uint8)[0] != 0))

    def log_probs_from_pairs(self, values, pairs, temperature):
        """log_probs_from_pairs_kernel: values [B] or [B, k], pairs [tp, B, 2],
        temperature [B] or None (float32) -> the log-probabilities (values'
        shape); the output is 0xA5-filled before the launch."""
        batch, k = values.shape[0], values.shape[1] if values.dim() == 2 else 1
        self._reset(False, 1)
        vp = self._place("values", values.contiguous())
        pp = self._place("pairs", pairs.contiguous().view(pairs.shape[0], -1))
        tpp = self._place("temperature", temperature.contiguous()) if temperature is not None else None
        out = self._alloc("log_probs", max(batch * k, 1) * 4, fill=0xA5)
        self._check(self.lib.lam_emu_log_probs_from_pairs(vp, pp, tpp, pairs.shape[0], batch, k, out))
        return self._read(out, tuple(values.shape), torch.float32)

    def alloc_weight_view(
        self, rows: int, ldw: int, hidden_size: int, dtype: torch.dtype, fill: torch.Tensor
    ) -> PlacedWeight:
        """A [rows, ldw] weight placed in the arena without copying its
        (possibly many GB of untouched) storage: only rows[:, :hidden_size]
        are written from `fill` [rows, hidden_size]."""
        es = torch.empty(0, dtype=dtype).element_size()
        self._reset(False, 1)
        ptr = self.lib.lam_emu_alloc(b"weight", ((rows - 1) * ldw + hidden_size) * es, 0, 0)
        assert ptr
        fill = fill.to(dtype).contiguous()
        for r in range(rows):
            ctypes.memmove(ptr + r * ldw * es, fill[r].data_ptr(), hidden_size * es)
        return PlacedWeight(ptr, rows, hidden_size, ldw, dtype)

    def weight_passes(self, op: str, hidden: torch.Tensor, weight: torch.Tensor, path: str, k: int = 4) -> float:
        """Run ``op`` ("argmax", "topk" with ``k``, "sample" at temperature
        0.8, "lse": the log-partition) through ``path`` and return the weight
        bytes it requested over the shard's bytes (1.0: one pass)."""
        kw = {
            "argmax": {},
            "topk": {"k": k},
            "sample": {"temperature": torch.full((hidden.shape[0],), 0.8)},
            "lse": {"log_partition": True},
        }[op]
        self.shard(hidden, weight, path=path, **kw)
        return self.bytes_loaded("weight") / (weight.numel() * weight.element_size())

    def noise_bounds(self, first: int, stride: int, n: int) -> tuple[float, float]:
        """The sampling noise screen's float estimate against the exact noise on
        the ``n`` Philox words ``first + i * stride`` (mod 2**32): (the largest
        error over the slack, below 1 where the bounds hold; the largest noise)."""
        top = ctypes.c_float()
        worst = self.lib.lam_emu_noise_bounds(first, stride, n, ctypes.byref(top))
        return float(worst), top.value

    def bytes_loaded(self, name: str = "weight") -> int:
        """Bytes the launches since the last reset loaded from the tensors
        named ``name`` (every global load, cp.async and TMA source: what the
        kernels request, before any cache; the emulation cannot time)."""
        return int(self.lib.lam_emu_bytes_loaded(name.encode()))

    def stats(self) -> dict:
        """Counts: blocks run, barriers, warp collectives (since the library
        loaded), the shared bytes of the kernel unit, and the sampling noise
        screen's logits that drew a Philox word / took the double logs, and the
        warp-wide mma.sync m16n8k16 instructions (these three since the last
        launch's reset)."""
        out = (ctypes.c_uint64 * 7)()
        self.lib.lam_emu_stats(out)
        keys = ("blocks", "barriers", "collectives", "shared_bytes", "noise_words", "noise_logs", "mma")
        return dict(zip(keys, out))
