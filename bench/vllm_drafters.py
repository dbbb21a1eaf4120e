"""Which vLLM draft classes can draft with ``use_local_argmax_reduction``:
with vLLM alone and with the localargmax plugin, read from the installed
vLLM (for 0.33: ``PYTHONPATH=/path/to/vllm033 python -m bench.vllm_drafters``).

The classes are those of vLLM's model registry for speculative decoding
(``_SPECULATIVE_DECODING_MODELS``: EAGLE, MTP, DFlash, DSpark, ...), each
imported as vLLM resolves it on this machine (a ``vllm.models`` package picks
its platform's variant). vLLM alone: vLLM's speculator refuses the flag
unless the class has ``get_top_tokens`` (own or inherited). With the plugin:
a class with vLLM's own method keeps it; a class with ``compute_logits`` and
none is given one at load by the plugin's probe
(``localargmax.integrations.vllm.drafters.prepare``); the classes this script
can build small (:data:`BUILDERS`: vLLM's own class and ``compute_logits``,
with only the submodules ``compute_logits`` uses) are probed here on one
rank, on CPU, and so are the other classes where :func:`build_auto`'s
generic skeleton suffices. A module whose import trips on something this
CPU machine lacks (a package, a compiled extension, a GPU to query, a
platform check) is imported with the narrowest stand-in for it
(:class:`_StandIns`; listed per row and in the JSON); its ``compute_logits``
runs as any other, on vLLM's own tensors. A GPU kernel a ``compute_logits``
calls before its ``LogitsProcessor`` is replaced, while that row is probed,
by vLLM's own Triton kernel for the same operation
(:data:`KERNEL_STAND_INS`, named per row). vLLM's Triton kernels run under
Triton's interpreter on the CPU: ``main`` sets ``TRITON_INTERPRET=1`` (with
vLLM's CPU platform and no visible CUDA device) before triton is imported,
unless the environment sets them.

Writes bench/results/vllm_drafters_<version>.json (rows and the command) and
prints its markdown table (``--markdown FILE``: one JSON's table);
``python bench/readme_tables.py --write`` renders every such JSON into
docs/vllm.md (kind ``vllm_drafters``; tests/test_readme.py checks it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import platform
import re
import sys
import traceback
import types
import unittest.mock
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
STAND_IN_PACKAGES = ("compressed_tensors", "torchvision")
"""Packages vLLM's pinned requirements bring and a ``--no-deps`` install lacks;
draft modules that import them are read with stand-ins."""


# ----------------------------------------------------------------------------- small builds


def skeleton(cls, **attrs):
    """An instance of vLLM's ``cls`` holding only ``attrs`` (its own methods, none of its constructor)."""
    model = object.__new__(cls)  # not cls.__new__: vLLM's SupportsQuant.__new__ reads a VllmConfig
    torch.nn.Module.__init__(model)
    for name, value in attrs.items():
        setattr(model, name, value)
    return model


def _head(gen, vocab, hsize, dtype):
    """(vLLM's ParallelLMHead loaded with a random ``[vocab, hsize]``, the full matrix)."""
    from tests.support.vllm_common import head_of

    full = (torch.randn(vocab, hsize, generator=gen) / hsize**0.5).to(dtype)
    return head_of(full), full


def _shared_head(config, prefix, gen, vocab, dtype, random_norm=True):
    """vLLM's SharedHead (an RMSNorm, then its own ParallelLMHead) in
    ``dtype``, its head loaded with a random ``[vocab, config.hidden_size]``
    and, with ``random_norm``, norm weights in [0.5, 1.5): (module, the full head)."""
    from vllm.model_executor.models.deepseek_mtp import SharedHead

    from tests.support.vllm_common import after_loading

    hsize = config.hidden_size
    shared = SharedHead(config, prefix=prefix)
    full = (torch.randn(vocab, hsize, generator=gen) / hsize**0.5).to(dtype)
    shared.head.weight.data = shared.head.weight.data.to(dtype)
    shared.head.weight.weight_loader(shared.head.weight, full)
    after_loading(shared.head)
    if random_norm:
        with torch.no_grad():
            shared.norm.weight.copy_(torch.rand(hsize, generator=gen) + 0.5)
    return shared.to(dtype), full


def build_deepseek_mtp(gen, vocab, hsize, dtype, layers=2):
    """vLLM's DeepSeekMTP: ``layers`` MTP layers, each with vLLM's SharedHead
    (an RMSNorm with random weights, then its own ParallelLMHead), chosen by
    ``spec_step_idx % layers``. Returns (model, reference) where
    ``reference(hidden, step)`` is the processor's input and the full head of that step."""
    from vllm.model_executor.models.deepseek_mtp import (
        DeepSeekMTP,
        DeepSeekMultiTokenPredictor,
        DeepSeekMultiTokenPredictorLayer,
    )

    from tests.support.vllm_common import processor

    start = 5
    config = types.SimpleNamespace(hidden_size=hsize, rms_norm_eps=1e-6, vocab_size=vocab)
    mods, fulls = {}, []
    for i in range(layers):
        shared, full = _shared_head(config, f"model.layers.{start + i}.shared_head", gen, vocab, dtype)
        mods[str(start + i)] = skeleton(DeepSeekMultiTokenPredictorLayer, shared_head=shared)
        fulls.append(full)
    predictor = skeleton(
        DeepSeekMultiTokenPredictor,
        layers=torch.nn.ModuleDict(mods),
        mtp_start_layer_idx=start,
        num_mtp_layers=layers,
        logits_processor=processor(vocab),
    )
    model = skeleton(DeepSeekMTP, model=predictor)

    def reference(hidden, step):
        shared = mods[str(start + step % layers)].shared_head
        return shared(hidden), fulls[step % layers]

    return model, reference


def build_plain(cls, **extra):
    """A builder of ``cls`` (a class, or vLLM's ``"module:Name"``) whose
    compute_logits reads ``self.logits_processor`` and ``self.lm_head``
    (+ ``extra`` attributes: values, or callables of the vocabulary size)."""

    def build(gen, vocab, hsize, dtype):
        from tests.support.vllm_common import processor

        nonlocal cls
        if isinstance(cls, str):
            module, _, name = cls.partition(":")
            cls = getattr(importlib.import_module(module), name)
        head, full = _head(gen, vocab, hsize, dtype)
        attrs = {k: (v(vocab) if callable(v) else v) for k, v in extra.items()}
        model = skeleton(cls, lm_head=head, logits_processor=processor(vocab), **attrs)
        return model, lambda hidden, step: (hidden, full)

    return build


def build_auto(cls, gen, vocab, hsize, dtype, layers=3, start=5):
    """A small ``cls`` for the table (not the tests): every attribute vLLM's
    MTP, EAGLE and DSpark drafters' ``compute_logits`` read, present:
    ``lm_head``, ``logits_processor``, ``config`` and ``model``, a skeleton of
    the module's ``*MultiTokenPredictor`` class (a plain module if none) with
    ``norm``, ``embed_tokens`` (a head: tied embeddings) and MTP layers keyed
    0 .. start + layers - 1, each with a vLLM SharedHead (an RMSNorm, then its
    own head) and a ``final_layernorm``. A class that needs anything else
    fails to build: the table says so."""
    from vllm.model_executor.layers.layernorm import RMSNorm

    from tests.support.vllm_common import processor

    config = types.SimpleNamespace(hidden_size=hsize, rms_norm_eps=1e-6, vocab_size=vocab)
    module = sys.modules[cls.__module__]
    predictors = [
        v
        for k, v in vars(module).items()
        if isinstance(v, type) and "MultiTokenPredictor" in k and "Layer" not in k and v.__module__ == module.__name__
    ]
    mods = {}
    for i in range(start + layers):
        shared, _ = _shared_head(config, f"model.layers.{i}.shared_head", gen, vocab, dtype, random_norm=False)
        mods[str(i)] = skeleton(torch.nn.Module, shared_head=shared, final_layernorm=RMSNorm(hsize))
    mods = torch.nn.ModuleDict(mods)
    model = skeleton(
        predictors[0] if predictors else torch.nn.Module,
        layers=mods,
        mtp_layers=mods,
        mtp_start_layer_idx=start,
        num_mtp_layers=layers,
        logits_processor=processor(vocab),
        norm=RMSNorm(hsize),
        embed_tokens=_head(gen, vocab, hsize, dtype)[0],
    )
    head = _head(gen, vocab, hsize, dtype)[0]
    return skeleton(cls, lm_head=head, logits_processor=processor(vocab), config=config, model=model).to(dtype)


def build_deepseek_v4_mtp(gen, vocab, hsize, dtype, cls, layers=2, hc_mult=2):
    """vLLM's DeepSeekV4MTP (``cls``: a platform variant's), its MTP layers
    holding only what ``compute_logits`` reads: the hc-multiplexed residual's
    head reduction (``hc_mult`` streams of ``hsize // hc_mult``: ``hc_head_fn``,
    ``_scale``, ``_base`` in float32 as vLLM creates them, the xpu variant's
    ``HCHeadOp``) and a SharedHead in ``dtype`` (an RMSNorm with random
    weights, then its own head), chosen by ``spec_step_idx % layers``."""
    from vllm.model_executor.layers.mhc import HCHeadOp

    from tests.support.vllm_common import processor

    width = hsize // hc_mult
    config = types.SimpleNamespace(hidden_size=width, rms_norm_eps=1e-6, vocab_size=vocab)
    start, mods = 5, {}
    for i in range(layers):
        shared, _ = _shared_head(config, f"model.layers.{start + i}.shared_head", gen, vocab, dtype)
        mods[str(start + i)] = skeleton(
            torch.nn.Module,
            config=config,
            shared_head=shared,
            hc_mult=hc_mult,
            hc_head_fn=torch.nn.Parameter(torch.randn(hc_mult, hc_mult * width, generator=gen), requires_grad=False),
            hc_head_scale=torch.nn.Parameter(torch.rand(1, generator=gen), requires_grad=False),
            hc_head_base=torch.nn.Parameter(torch.randn(hc_mult, generator=gen), requires_grad=False),
            hc_head_op=HCHeadOp(),
            rms_norm_eps=1e-6,
            hc_eps=1e-6,
        )
    predictor = skeleton(
        sys.modules[cls.__module__].DeepSeekV4MultiTokenPredictor,
        layers=torch.nn.ModuleDict(mods),
        mtp_start_layer_idx=start,
        num_mtp_layers=layers,
        logits_processor=processor(vocab),
    )
    return skeleton(cls, model=predictor), None


def triton_hc_head(hidden_states, hc_fn, hc_scale, hc_base, rms_norm_eps, hc_eps):
    """vLLM's Triton hc_head (``torch.ops.vllm.hc_head_triton``), called as
    vLLM's ``HCHeadOp.forward_hip`` calls it without TileLang: ``hidden_states``
    ``[..., hc_mult, D]`` viewed ``[T, hc_mult, D]``; ``hc_fn``
    ``[hc_mult, hc_mult * D]``, ``hc_scale`` ``[1]``, ``hc_base`` ``[hc_mult]``
    float32. Returns ``[..., D]`` bfloat16 (as vLLM's TileLang, XPU and Triton
    hc_heads do), on ``hidden_states``' device."""
    import vllm.model_executor.kernels.mhc.triton  # noqa: F401 - registers torch.ops.vllm.hc_head_triton

    hc_mult, hidden_size = hidden_states.shape[-2:]
    outer_shape = hidden_states.shape[:-2]
    hs_flat = hidden_states.view(-1, hc_mult, hidden_size)
    out = torch.empty(hs_flat.shape[0], hidden_size, dtype=torch.bfloat16, device=hidden_states.device)
    torch.ops.vllm.hc_head_triton(hs_flat, hc_fn, hc_scale, hc_base, out, hidden_size, rms_norm_eps, hc_eps, hc_mult)
    return out.view(*outer_shape, hidden_size)


KERNEL_STAND_INS = {
    # a class's module -> (module, name, stand-in, label): a GPU kernel its compute_logits calls before
    # its LogitsProcessor, replaced while its row is probed
    "vllm.models.deepseek_v4.nvidia.mtp": (
        "vllm.models.deepseek_v4.nvidia.mtp",
        "hc_head_fused_kernel_tilelang",
        triton_hc_head,
        "hc_head_fused_kernel_tilelang (TileLang): vLLM's Triton hc_head, interpreted",
    ),
    # HCHeadOp dispatches by platform: forward_xpu on an XPU, forward_cpu > hc_head_fused_cpu here
    "vllm.models.deepseek_v4.xpu.mtp": (
        "vllm.model_executor.kernels.mhc",
        "hc_head_fused_cpu",
        triton_hc_head,
        "HCHeadOp's hc_head_fused_cpu (vLLM's CPU build): vLLM's Triton hc_head, interpreted",
    ),
}
PROBE_DTYPES = {"DeepSeekV4MTP": torch.bfloat16}  # class name -> dtype: its hc_head gives bfloat16; others float32


BUILDERS = {  # class name -> builder(gen, vocab, hidden size, dtype[, cls]) -> (model, reference or None)
    "DeepSeekMTP": build_deepseek_mtp,
    "DFlashLagunaForCausalLM": build_plain("vllm.model_executor.models.laguna_dflash:DFlashLagunaForCausalLM"),
    "NemotronHMTP": build_plain("vllm.model_executor.models.nemotron_h_mtp:NemotronHMTP"),
    "ExaoneMoeMTP": build_plain("vllm.model_executor.models.exaone_moe_mtp:ExaoneMoeMTP"),
    "DeepSeekV4MTP": build_deepseek_v4_mtp,  # takes the variant's class
    "LongCatFlashMTP": build_plain("vllm.model_executor.models.longcat_flash_mtp:LongCatFlashMTP"),
    # masks its logits past the speech vocabulary after the processor: left without the method
    "Nemotron3_5TranscribeMTP": build_plain(
        "vllm.model_executor.models.nemotron3_5_transcribe:Nemotron3_5TranscribeMTP",
        config=lambda vocab: types.SimpleNamespace(speechlm_output_vocab_size=vocab // 2),
    ),
}


# ----------------------------------------------------------------------------- the inventory


class _StandIns(importlib.abc.MetaPathFinder):
    """What a draft module trips on at import on this CPU machine, each
    answered by the narrowest stand-in and named in its row (see :meth:`load`):

    - an absent package (:data:`STAND_IN_PACKAGES`, and any other non-vLLM
      package a draft module needs and this machine lacks: AMD's, NVIDIA's
      kernels), or vLLM's ``vllm_flash_attn`` without its compiled
      ``_vllm_fa2_C`` / ``_vllm_fa3_C``: mock modules;
    - ``vllm.platforms.rocm``, whose import reads the GPU's architecture
      (``torch.cuda.get_device_properties``): that call answers ``gfx942``
      while it is imported;
    - a package ``__init__`` that picks its platform's variant and raises on
      others (Mistral Large 4): an empty package, so a variant module imports;
    - a name a vLLM module defines on another platform only
      (``cannot import name``): a mock of it there while the module imports.
    """

    GCN_ARCH = "gfx942"

    def __init__(self):
        self.names = set(STAND_IN_PACKAGES)  # mocked packages (dotted prefixes)
        self.patched = {}  # module -> label: imported with torch.cuda.get_device_properties answered
        self.bare = {}  # package -> label: its __init__ not run
        self.labels = set(STAND_IN_PACKAGES)  # every stand-in's name, as rows show it
        self.all_used = set()
        self.taint: dict[str, set] = {}  # module -> stand-ins its import needed
        self._loading = None

    def _mocked(self, fullname):
        return next((n for n in self.names if fullname == n or fullname.startswith(n + ".")), None)

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.patched:
            self.taint[fullname] = {self.patched[fullname]}
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            spec.loader = _PatchedLoader(spec.loader, self.GCN_ARCH)
            return spec
        if fullname in self.bare and self._loading != fullname:
            real = importlib.machinery.PathFinder.find_spec(fullname, path)
            spec = importlib.machinery.ModuleSpec(fullname, _BareLoader(), is_package=True)
            spec.submodule_search_locations = list(real.submodule_search_locations)
            return spec
        name = self._mocked(fullname)
        if name is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MockLoader(), is_package=True)

    def _diagnose(self, e: BaseException, modname: str, names: dict) -> str | None:
        """The stand-in for what ``e`` tripped on (added), or None if there is none."""
        if isinstance(e, ModuleNotFoundError):
            root = (e.name or "").split(".")[0]
            if root and root != "vllm" and root not in self.names:
                self.names.add(root)
                self.labels.add(root)
                return root
            return None
        frames = [f.f_globals.get("__name__", "") for f, _ in traceback.walk_tb(e.__traceback__)]
        rocm = "vllm.platforms.rocm"
        if rocm in frames and rocm not in self.patched:
            self.patched[rocm] = f"torch.cuda.get_device_properties ({self.GCN_ARCH}) in {rocm}"
            return self.patched[rocm]
        if isinstance(e, ImportError) and frames[-1] == "vllm.vllm_flash_attn":
            self.names.add("vllm.vllm_flash_attn")  # its compiled _vllm_fa2_C / _vllm_fa3_C absent
            self.labels.add("vllm.vllm_flash_attn")
            for mod in [m for m in sys.modules if m.startswith("vllm.vllm_flash_attn")]:
                del sys.modules[mod]
            return "vllm.vllm_flash_attn"
        match = re.match(r"cannot import name '(\w+)' from '(vllm[\w.]*)'", str(e))
        if isinstance(e, ImportError) and match and match[2] in sys.modules and match.groups() not in names:
            names[match.groups()] = unittest.mock.MagicMock(name=f"{match[2]}.{match[1]}")
            self.labels.add(f"{match[2]}.{match[1]}")
            return f"{match[2]}.{match[1]}"
        for frame, _ in traceback.walk_tb(e.__traceback__):
            name = frame.f_globals.get("__name__", "")
            if (
                frame.f_code.co_filename.endswith("__init__.py")
                and frame.f_code.co_name == "<module>"
                and modname.startswith(name + ".")
                and name.startswith("vllm.models.")
                and name not in self.bare
            ):
                self.bare[name] = f"{name} (its platform dispatch not run)"
                return self.bare[name]
        return None

    def load(self, modname: str, name: str):
        """Import ``modname`` and read its class ``name``, answering each thing
        the import trips on by a stand-in and importing again. Returns (the
        class, None, the stand-ins of the class's modules and of the modules
        they take names from) or (None, the import error, [])."""
        before = set(sys.modules)
        names: dict[tuple[str, str], object] = {}  # (name, module) -> mock, set while importing
        sys.meta_path.insert(0, self)
        self._loading = modname
        try:
            for _ in range(12):
                for (attr, mod), value in names.items():
                    setattr(sys.modules[mod], attr, value)
                try:
                    cls = getattr(importlib.import_module(modname), name)
                except Exception as e:  # noqa: BLE001 - reported in the table
                    if self._diagnose(e, modname, names) is None:
                        return None, _message(e), []
                    continue
                finally:
                    for attr, mod in names:
                        if hasattr(sys.modules.get(mod), attr):
                            delattr(sys.modules[mod], attr)
                self._spread(set(sys.modules) - before)
                used = set().union(*(self.taint.get(k.__module__, ()) for k in cls.__mro__))
                self.all_used |= used
                return cls, None, sorted(used)
            return None, "too many stand-ins", []
        finally:
            self._loading = None
            sys.meta_path.remove(self)
            for mod in [m for m in sys.modules if self._mocked(m) or m in self.bare]:
                del sys.modules[mod]  # the next import asks again (and is recorded); imported classes keep theirs
            self.names -= {n for n in self.names if n.startswith("vllm.")}  # a vLLM module's mock serves its row only

    def _label(self, value) -> str | None:
        """The stand-in ``value`` is (a mock module or a mock of a name), or None."""
        if not isinstance(value, unittest.mock.NonCallableMock):
            return None
        name = value._extract_mock_name()
        return max((lab for lab in self.labels if name == lab or name.startswith(lab + ".")), key=len, default=None)

    def _spread(self, new: set) -> None:
        """Record, for each module ``new`` to sys.modules, the stand-ins its import
        needed: those of the names it took (a mock, or an object of a module that
        needed stand-ins), and the package whose ``__init__`` was not run."""
        direct = {}
        for mod in new:
            labels, sources = set(), set()
            for value in list(vars(sys.modules[mod]).values()) if sys.modules.get(mod) is not None else ():
                label = self._label(value)
                if label:
                    labels.add(label)
                elif isinstance(value, types.ModuleType):
                    sources.add(value.__name__)
                else:
                    try:
                        sources.add(getattr(value, "__module__", None))
                    except Exception:  # noqa: BLE001 - an object that cannot say: not a source
                        pass
            labels |= {lab for pkg, lab in self.bare.items() if mod.startswith(pkg + ".")}
            direct[mod] = (labels, sources - {mod, None})
        changed = True
        while changed:
            changed = False
            for mod, (labels, sources) in direct.items():
                spread = labels.union(*(self.taint.get(src, ()) for src in sources))
                if spread - self.taint.get(mod, set()):
                    self.taint.setdefault(mod, set()).update(spread)
                    changed = True


class _MockLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = unittest.mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
        return module

    def exec_module(self, module):
        pass


class _BareLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # a plain package module: spec's search locations, no __init__ run

    def exec_module(self, module):
        pass


class _PatchedLoader(importlib.abc.Loader):
    """``loader``, with ``torch.cuda.get_device_properties`` answering ``gcnArchName=arch`` while it runs."""

    def __init__(self, loader, arch):
        self.loader, self.arch = loader, arch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        props = types.SimpleNamespace(gcnArchName=self.arch)
        with unittest.mock.patch("torch.cuda.get_device_properties", return_value=props):
            self.loader.exec_module(module)


_PATH_DIRS = re.compile(r"(?<![:/\w])(?:/[\w.+-]+)+/")  # an absolute path's directories (not a URL's)


def _message(e: BaseException) -> str:
    """``Type: first line`` of an exception, without this machine's directories, at most 120 characters."""
    return f"{type(e).__name__}: {_PATH_DIRS.sub('', str(e).splitlines()[0] if str(e) else '')[:120]}"


def _where(e: BaseException) -> str:
    """`` (at vLLM's A > B > ...)``: the vLLM functions from ``compute_logits``'s
    call down to where ``e`` was raised ("" if it was not raised below one)."""
    frames = [(f.f_globals.get("__name__", ""), f.f_code) for f, _ in traceback.walk_tb(e.__traceback__)]
    last = max((i for i, (_, code) in enumerate(frames) if code.co_name == "compute_logits"), default=None)
    below = frames[last + 1 :] if last is not None else []
    calls = [code.co_qualname for mod, code in below if mod.startswith("vllm.") and code.co_name != "<module>"]
    return f" (at vLLM's {' > '.join(calls)})" if calls else ""


def _defined_by(cls, attr):
    for klass in cls.__mro__:
        if attr in klass.__dict__:
            return klass.__name__
    return None


def _variants(modname: str, name: str) -> list[str]:
    """The platform variants (nvidia / amd / xpu / cpu / common modules) of a
    ``vllm.models`` package that define ``class name``, found by reading the
    package's files (vLLM resolves one of them per platform)."""
    if not modname.startswith("vllm.models."):
        return []
    vllm_dir = Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations)))
    root = vllm_dir.joinpath(*modname.split(".")[1:])  # not imported: a package's __init__ may need absent packages
    if not root.is_dir():
        return []
    pattern = re.compile(rf"^class {re.escape(name)}\b", re.M)
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.name != "__init__.py" and pattern.search(path.read_text(errors="replace")):
            out.append(".".join([modname, *path.relative_to(root).with_suffix("").parts]))
    return out


def inventory(stand_ins: _StandIns) -> list[dict]:
    """One row per draft class of vLLM's registry (each platform variant of a
    ``vllm.models`` package its own row): its architectures, whether this
    machine resolves it, whether it imports here and whether it has
    ``compute_logits`` / ``get_top_tokens`` (the defining class)."""
    from vllm.model_executor.models import registry

    rows: dict[tuple[str, str], dict] = {}
    for arch, (module, name) in registry._SPECULATIVE_DECODING_MODELS.items():
        modname = module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
        for candidate in [modname, *_variants(modname, name)]:
            cls, error, used = stand_ins.load(candidate, name)
            key = (candidate, name) if cls is None else (cls.__module__, cls.__qualname__)
            row = rows.setdefault(key, {"class": name, "module": key[0], "architectures": [], "resolved_here": False})
            if arch not in row["architectures"]:
                row["architectures"].append(arch)
            row["resolved_here"] |= candidate == modname
            if "import" in row:
                continue
            row["import"] = error or "ok"
            if cls is None:
                continue
            row["stand_ins"] = used
            row["class"] = cls.__qualname__
            row["compute_logits"] = _defined_by(cls, "compute_logits")
            row["get_top_tokens"] = _defined_by(cls, "get_top_tokens")
            if row["compute_logits"]:
                row["compute_logits_takes_step"] = "spec_step_idx" in inspect.signature(cls.compute_logits).parameters
    for key, row in list(rows.items()):  # a registry module that picks no variant on this machine, its variants rows
        variants = [r for r in rows.values() if r["module"].startswith(key[0] + ".") and r["import"] == "ok"]
        if row["import"] != "ok" and variants:
            del rows[key]
            for variant in variants:
                variant["registry_module_error"] = f"{key[0]}: {row['import']}"
    return list(rows.values())


def probe_small(rows: list[dict]) -> None:
    """Build the :data:`BUILDERS` classes small (1 rank, CPU, float32 or
    :data:`PROBE_DTYPES`), with :data:`KERNEL_STAND_INS` while each is probed,
    and record the plugin's probe verdict."""
    import localargmax.integrations.vllm as plugin
    from localargmax.integrations.vllm import drafters

    plugin.install()
    for row in rows:
        if row.get("import") != "ok" or row.get("get_top_tokens") or not row.get("compute_logits"):
            continue
        gen = torch.Generator().manual_seed(1)
        cls = getattr(importlib.import_module(row["module"]), row["class"])
        build = BUILDERS.get(row["class"])
        row["built_by"] = "BUILDERS" if build else "build_auto"
        dtype = PROBE_DTYPES.get(row["class"], torch.float32)
        if dtype != torch.float32:
            row["probe_dtype"] = str(dtype).removeprefix("torch.")
        with contextlib.ExitStack() as kernels:
            if row["module"] in KERNEL_STAND_INS:
                module, name, stand_in, label = KERNEL_STAND_INS[row["module"]]
                kernels.enter_context(unittest.mock.patch.object(importlib.import_module(module), name, stand_in))
                row["stand_ins"] = sorted([*row.get("stand_ins", []), label])
            try:
                if build is None:
                    model = build_auto(cls, gen, 1000, 32, dtype)
                else:
                    per_variant = "cls" in inspect.signature(build).parameters
                    model = build(gen, 1000, 32, dtype, **({"cls": cls} if per_variant else {}))[0]
                model.compute_logits(torch.randn(4, 32, generator=gen).to(dtype))
            except Exception as e:  # noqa: BLE001 - the table says which could not be built
                row["built_by"] = None
                row["build_error"] = _message(e) + _where(e)
                continue
            try:
                reason = drafters.prepare(model, 32, dtype, torch.device("cpu"), steps=range(3))
                row["probe"] = "given" if reason is None else f"left without: {reason}"
            except RuntimeError as e:
                row["probe"] = f"error: {e}"


def verdicts(row: dict) -> tuple[str, str]:
    """(vLLM alone, with the plugin) for the table."""
    if row.get("import") != "ok":
        return "not importable here", f"not importable here ({row['import']})"
    if row["get_top_tokens"]:
        return f"yes (`{row['get_top_tokens']}`)", "yes (vLLM's method)"
    if not row["compute_logits"]:
        return "no (no `compute_logits` in this variant)", "no (not a LogitsProcessor drafter)"
    probe = row.get("probe")
    if probe == "given":
        dtype = f", {row['probe_dtype']}" if row.get("probe_dtype") else ""
        return "no", f"**yes**: given at load (probed here, `{row['built_by']}`{dtype})"
    if probe is not None:
        return "no", f"no: {probe}"
    return "no", f"at load, if the probe passes (not built here: {row.get('build_error')})"


def markdown(doc: dict) -> str:
    lines = [
        f"vLLM {doc['vllm']} (`{doc['command']}`; {doc['drafter_classes']} classes):",
        "",
        "| draft class | registry architectures | local argmax, vLLM alone | with the plugin |",
        "|---|---|---|---|",
    ]
    for row in doc["rows"]:
        alone, plugin = verdicts(row)
        archs = ", ".join(row["architectures"])
        where = row["module"].removeprefix("vllm.models.") if row["module"].startswith("vllm.models.") else ""
        if where:
            where = f" ({where}{', on this machine' if row['resolved_here'] else ''})"
        stand = f"; stand-ins for {', '.join(row['stand_ins'])}" if row.get("stand_ins") else ""
        lines.append(f"| `{row['class']}`{where}{stand} | {archs} | {alone} | {plugin} |")
    unresolved = dict.fromkeys(r["registry_module_error"] for r in doc["rows"] if r.get("registry_module_error"))
    for error in unresolved:
        module, _, message = error.partition(": ")
        lines += ["", f"On this machine vLLM's `{module}` resolves no class ({message}); its variants are rows above."]
    return "\n".join(lines)


def _single_rank_vllm():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        from tests.support.launch import free_port

        os.environ["MASTER_PORT"] = str(free_port())
    from tests.support.vllm_common import vllm_setup

    return vllm_setup(0, 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", type=Path, help="print the table of this JSON and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import: vLLM's Triton kernels on the CPU
    import vllm

    stand_ins = _StandIns()
    rows = inventory(stand_ins)
    ctx, _ = _single_rank_vllm()
    try:
        probe_small(rows)
    finally:
        ctx.__exit__(None, None, None)
    version = vllm.__version__
    for row in rows:  # a probe's message may name a file
        if isinstance(row.get("probe"), str):
            row["probe"] = _PATH_DIRS.sub("", row["probe"])
    site = str(Path(vllm.__file__).resolve().parent.parent)
    outside = site in os.environ.get("PYTHONPATH", "").split(os.pathsep)
    command = (f"PYTHONPATH=<vLLM {version} --target dir> " if outside else "") + "python -m bench.vllm_drafters"
    doc = {
        "kind": "vllm_drafters",
        "vllm": version,
        "command": command,
        "date": datetime.date.today().isoformat(),
        "cpu": platform.processor() or platform.machine(),
        "drafter_classes": len(rows),
        "stand_ins": sorted(stand_ins.all_used.union(*(row.get("stand_ins", ()) for row in rows))),
        "rows": rows,
    }
    out = RESULTS / f"vllm_drafters_{version}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
