"""vLLM's own acceptance estimator (0.34 or 0.33), runnable on the CPU: its
Triton kernels under Triton's interpreter (``TRITON_INTERPRET=1``).

Without a GPU driver ``vllm.triton_utils`` hands out a placeholder ``triton``,
so ``vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py`` (and, on 0.33,
the one helper it takes from ``rejection_sampler_utils.py``) are executed again from
vLLM's installed files with the real ``triton`` / ``triton.language`` in the
placeholder's place, line numbers kept (the interpreter reads the kernels'
source). Nothing else changes: :func:`estimator_class` is vLLM's
``OnlineAcceptanceEstimator`` as it runs on a GPU, and ``predict`` on
gathered logits is the reference the plugin's estimator state is compared
with (tests/support/vllm_adaptive_cases.py, bench/log_odds_accuracy.py).
"""

from __future__ import annotations

import os
import re
import sys


def estimator_namespace() -> dict:
    """The re-executed module's globals (``OnlineAcceptanceEstimator``,
    ``_MAX_LOG_ODDS``, the kernels). Needs ``TRITON_INTERPRET=1`` from before
    triton's first import in this process (triton.language's own jit
    functions are decorated then); sets it if triton is not imported yet.
    Raises ImportError when vLLM or triton is missing, RuntimeError when
    triton was imported without the variable or vLLM's file does not have
    the expected import lines (another vLLM)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            raise RuntimeError(
                "vLLM's estimator runs under Triton's interpreter: set TRITON_INTERPRET=1 before triton is imported"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    import triton
    import triton.language as tl
    import vllm.v1.worker.gpu.spec_decode.acceptance_estimator as ae
    import vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils as rsu

    ns = {"triton": triton, "tl": tl, "__name__": "vllm_acceptance_estimator_interpreted"}
    with open(ae.__file__) as f:
        src = f.read()
    imports = (
        "from vllm.triton_utils import tl, triton\n",
        # 0.33 only: 0.34's estimator has its own block helper (_max_and_excl_sumexp)
        "from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import (\n    _compute_max_and_sumexp,\n)\n",
    )
    if imports[0] not in src or (imports[1] not in src and "def _max_and_excl_sumexp(" not in src):
        raise RuntimeError(f"{ae.__file__}: not a vLLM 0.33 / 0.34 acceptance estimator this loader knows")
    if imports[1] in src:
        with open(rsu.__file__) as f:
            helper_src = f.read()
        helper = re.search(r"@triton\.jit\ndef _compute_max_and_sumexp\(.*?\n\n\n", helper_src, re.S)
        if helper is None:
            raise RuntimeError(f"{rsu.__file__}: no _compute_max_and_sumexp")
        pad = "\n" * helper_src[: helper.start()].count("\n")  # the helper's own line numbers
        exec(compile(pad + helper.group(0), rsu.__file__, "exec"), ns)
    src = src.replace(imports[0], "\n").replace(imports[1], "\n\n\n")  # same line count: the interpreter reads them
    exec(compile(src, ae.__file__, "exec"), ns)
    return ns


def estimator_class():
    """vLLM's ``OnlineAcceptanceEstimator`` with interpreted kernels."""
    return estimator_namespace()["OnlineAcceptanceEstimator"]
