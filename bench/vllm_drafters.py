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
generic skeleton suffices. A module that needs a package this environment
lacks is imported with stand-ins for that package (listed per row and in the
JSON); its ``compute_logits`` runs as any other.

Writes bench/results/vllm_drafters_<version>.json (rows and the command) and
prints its markdown table (``--markdown FILE``: one JSON's table);
``python bench/readme_tables.py --write`` renders every such JSON into
docs/vllm.md (kind ``vllm_drafters``; tests/test_readme.py checks it).
"""

from __future__ import annotations

import argparse
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


def build_deepseek_mtp(gen, vocab, hsize, dtype, layers=2):
    """vLLM's DeepSeekMTP: ``layers`` MTP layers, each with vLLM's SharedHead
    (an RMSNorm with random weights, then its own ParallelLMHead), chosen by
    ``spec_step_idx % layers``. Returns (model, reference) where
    ``reference(hidden, step)`` is the processor's input and the full head of that step."""
    from vllm.model_executor.models.deepseek_mtp import (
        DeepSeekMTP,
        DeepSeekMultiTokenPredictor,
        DeepSeekMultiTokenPredictorLayer,
        SharedHead,
    )

    from tests.support.vllm_common import after_loading, processor

    start = 5
    config = types.SimpleNamespace(hidden_size=hsize, rms_norm_eps=1e-6, vocab_size=vocab)
    mods, fulls = {}, []
    for i in range(layers):
        shared = SharedHead(config, prefix=f"model.layers.{start + i}.shared_head")
        full = (torch.randn(vocab, hsize, generator=gen) / hsize**0.5).to(dtype)
        shared.head.weight.data = shared.head.weight.data.to(dtype)
        shared.head.weight.weight_loader(shared.head.weight, full)
        after_loading(shared.head)
        with torch.no_grad():
            shared.norm.weight.copy_(torch.rand(hsize, generator=gen) + 0.5)
        shared.norm.to(dtype)
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
    from vllm.model_executor.models.deepseek_mtp import SharedHead

    from tests.support.vllm_common import after_loading, processor

    config = types.SimpleNamespace(hidden_size=hsize, rms_norm_eps=1e-6, vocab_size=vocab)
    module = sys.modules[cls.__module__]
    predictors = [
        v
        for k, v in vars(module).items()
        if isinstance(v, type) and "MultiTokenPredictor" in k and "Layer" not in k and v.__module__ == module.__name__
    ]
    mods = {}
    for i in range(start + layers):
        shared = SharedHead(config, prefix=f"model.layers.{i}.shared_head")
        shared.head.weight.weight_loader(shared.head.weight, torch.randn(vocab, hsize, generator=gen) / hsize**0.5)
        after_loading(shared.head)
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


BUILDERS = {  # class name -> builder(gen, vocab, hidden size, dtype) -> (model, reference)
    "DeepSeekMTP": build_deepseek_mtp,
    "DFlashLagunaForCausalLM": build_plain("vllm.model_executor.models.laguna_dflash:DFlashLagunaForCausalLM"),
    "NemotronHMTP": build_plain("vllm.model_executor.models.nemotron_h_mtp:NemotronHMTP"),
    "ExaoneMoeMTP": build_plain("vllm.model_executor.models.exaone_moe_mtp:ExaoneMoeMTP"),
    "LongCatFlashMTP": build_plain("vllm.model_executor.models.longcat_flash_mtp:LongCatFlashMTP"),
    # masks its logits past the speech vocabulary after the processor: left without the method
    "Nemotron3_5TranscribeMTP": build_plain(
        "vllm.model_executor.models.nemotron3_5_transcribe:Nemotron3_5TranscribeMTP",
        config=lambda vocab: types.SimpleNamespace(speechlm_output_vocab_size=vocab // 2),
    ),
}


# ----------------------------------------------------------------------------- the inventory


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of absent packages (:data:`STAND_IN_PACKAGES`, and any other
    non-vLLM package a draft module needs and this machine lacks: AMD's,
    NVIDIA's kernels) answered by mock modules."""

    def __init__(self):
        self.names = set(STAND_IN_PACKAGES)
        self.used = set()

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.split(".")[0]
        if root not in self.names:
            return None
        self.used.add(root)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = unittest.mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
        return module

    def exec_module(self, module):
        pass

    def load(self, modname: str, name: str):
        """(the class, None, stand-ins used) or (None, the import error, stand-ins used)."""
        before = set(self.used)
        sys.meta_path.append(self)
        try:
            for _ in range(8):
                try:
                    return getattr(importlib.import_module(modname), name), None, sorted(self.used - before)
                except ModuleNotFoundError as e:
                    root = (e.name or "").split(".")[0]
                    if not root or root == "vllm" or root in self.names:
                        return None, f"{type(e).__name__}: {e}", []
                    self.names.add(root)
                except Exception as e:  # noqa: BLE001 - reported in the table
                    return None, _message(e), []
            return None, "too many absent packages", []
        finally:
            sys.meta_path.remove(self)
            for mod in [m for m in sys.modules if m.split(".")[0] in self.names]:
                del sys.modules[mod]  # the next import asks again (and is recorded); imported classes keep theirs


_PATH_DIRS = re.compile(r"(?<![:/\w])(?:/[\w.+-]+)+/")  # an absolute path's directories (not a URL's)


def _message(e: BaseException) -> str:
    """``Type: first line`` of an exception, without this machine's directories, at most 120 characters."""
    return f"{type(e).__name__}: {_PATH_DIRS.sub('', str(e).splitlines()[0] if str(e) else '')[:120]}"


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
    return list(rows.values())


def probe_small(rows: list[dict]) -> None:
    """Build the :data:`BUILDERS` classes small (1 rank, CPU, float32) and record the plugin's probe verdict."""
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
        try:
            model = build(gen, 1000, 32, torch.float32)[0] if build else build_auto(cls, gen, 1000, 32, torch.float32)
            model.compute_logits(torch.randn(4, 32, generator=gen))
        except Exception as e:  # noqa: BLE001 - the table says which could not be built
            row["built_by"] = None
            row["build_error"] = _message(e)
            continue
        try:
            reason = drafters.prepare(model, 32, torch.float32, torch.device("cpu"), steps=range(3))
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
        return "no", f"**yes**: given at load (probed here, `{row['built_by']}`)"
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
        "stand_in_packages": sorted(stand_ins.used),
        "rows": rows,
    }
    out = RESULTS / f"vllm_drafters_{version}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
