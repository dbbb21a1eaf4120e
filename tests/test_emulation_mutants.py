"""Mutation check of the host emulation suite: deliberately broken copies of
the kernel source (a missing barrier, off-by-one tails, a wrong shuffle mask,
32-bit offsets, a cp.async stage read before its wait or refilled before
every thread is done with it, a split-K partial dropped, a launch passing one
stage too few bytes of dynamic shared memory, a TMA weight stage read before
its mbarrier wait or refilled without the proxy fence, ...) are built with the emulation and run through a slice of
tests/test_emulation.py; each must be caught (a checked failure or a wrong
answer), and the same slice must pass on the real source."""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests import test_emulation as suite
from tests import test_emulation_edges as edges
from tests import test_emulation_lse as lse
from tests import test_emulation_lse_mma as lse_mma
from tests.support import emulation
from tests.support.emulation import CSRC, Emulator

pytestmark = pytest.mark.skipif(not emulation.have_compiler(), reason="g++ / objcopy not found")

B16 = torch.bfloat16  # the mutants are built for bfloat16 only

# (id, how it must be caught (regex of the failure), file under csrc/cuda (or ../common), text, broken text)
MUTANTS = [
    (
        "simt_missing_barrier",
        "never written in this block|shared race",
        "fused_keys_simt.cuh",
        "block_best[warp][j] = best[j];\n      }\n      __syncthreads();\n",
        "block_best[warp][j] = best[j];\n      }\n",
    ),
    (
        "simt_topk_missing_barrier",
        "shared race",
        "fused_keys_simt.cuh",
        "candidates[i / NB][i % NB] = kNoEntryKey;\n      __syncthreads();\n",
        "candidates[i / NB][i % NB] = kNoEntryKey;\n",
    ),
    (
        "mma_topk_missing_barrier",  # the lists read the candidates before every warp wrote its tile's keys
        "shared race|shared read .* never written",
        "fused_keys_mma.cuh",
        "out) >> 32);\n          }\n      }\n    }\n    __syncthreads();\n",
        "out) >> 32);\n          }\n      }\n    }\n",
    ),
    (
        "pipe_missing_barrier_before_the_fold",
        "shared race",
        "fused_keys_mma.cuh",
        "    __syncthreads();\n    // (block_best is written again only after",
        "    // (block_best is written again only after",
    ),
    (
        "simt_row_tail_off_by_one",
        "out-of-bounds global load",
        "fused_keys_simt.cuh",
        "min(row_begin + kRowsPerBlock, static_cast<int>(num_valid))",
        "min(row_begin + kRowsPerBlock, static_cast<int>(num_valid) + 1)",
    ),
    (
        "keys_column_tail_off_by_one",
        "out-of-bounds global load",
        "logits_to_keys_kernel.cuh",
        "if (col < num_valid) {",
        "if (col <= num_valid) {",
    ),
    (
        "merge_batch_tail_off_by_one",
        "out-of-bounds global load",
        "merge_keys_kernel.cuh",
        "if (b >= batch) return;",
        "if (b > batch) return;",
    ),
    (
        "mma_wrong_shuffle_mask",
        "mask 0x0000ffff excludes it",
        "fused_keys_mma.cuh",
        "__shfl_xor_sync(0xFFFFFFFFu, best[j].best_key, offset)",
        "__shfl_xor_sync(0x0000FFFFu, best[j].best_key, offset)",
    ),
    (
        "simt_short_butterfly",
        "differ from the CPU kernel",
        "fused_keys_simt.cuh",
        "for (int offset = 16; offset > 0; offset /= 2) s = __fadd_rn",
        "for (int offset = 16; offset > 1; offset /= 2) s = __fadd_rn",
    ),
    (
        "simt_32bit_row_offset",
        "out-of-bounds global load",
        "fused_keys_simt.cuh",
        "weight + static_cast<int64_t>(row) * ldw;",
        "weight + row * static_cast<int>(ldw);",
    ),
    # the cp.async pipeline of shard_argmax_mma_pipe_kernel
    (
        "pipe_wait_group_off_by_one",
        "cp.async into it is in flight",
        "fused_keys_mma.cuh",
        "cp_async_wait<ST - 2>();",
        "cp_async_wait<ST - 1>();",
    ),
    (
        "pipe_refill_before_the_barrier",
        "shared race: cp.async into shared offset \\d+, read by thread|in flight",
        "fused_keys_mma.cuh",
        "      __syncthreads();\n      const int next = step + ST - 1;\n      if (next < num_steps) {\n"
        "        load_weight(next % ST, next);\n        load_hidden(next % ST, next);\n      }\n",
        "      const int next = step + ST - 1;\n      if (next < num_steps) {\n"
        "        load_weight(next % ST, next);\n        load_hidden(next % ST, next);\n      }\n"
        "      __syncthreads();\n",
    ),
    (
        "pipe_no_barrier_after_the_wait",
        "never written in this block|in flight|shared race",
        "fused_keys_mma.cuh",
        "      cp_async_wait<ST - 2>();\n      __syncthreads();\n",
        "      cp_async_wait<ST - 2>();\n",
    ),
    (
        "pipe_partials_over_stages_still_read",
        "shared race",
        "fused_keys_mma.cuh",
        "    __syncthreads();  // every stage read: free for the partials and the next batch chunk\n",
        "",
    ),
    (
        "pipe_split_k_partials_unsynchronised",
        "shared race|never written in this block",
        "fused_keys_mma.cuh",
        "              for (int r = 0; r < 4; ++r) part_at(a * SK + ks, mt, nt, r) = acc[a][mt][nt][r];\n      }\n"
        "      __syncthreads();\n",
        "              for (int r = 0; r < 4; ++r) part_at(a * SK + ks, mt, nt, r) = acc[a][mt][nt][r];\n      }\n",
    ),
    (
        "pipe_split_k_partial_dropped",
        "differ from the CPU kernel",
        "fused_keys_mma.cuh",
        "for (int c = 1; c < KC; ++c)",
        "for (int c = 1; c < KC - 1; ++c)",
    ),
    (
        "pipe_row_tail_off_by_one",
        "out-of-bounds global load",
        "fused_keys_mma.cuh",
        "const bool ok = k < hidden_size && row < num_valid;",
        "const bool ok = k < hidden_size && row <= num_valid;",
    ),
    (
        "pipe_k_tail_off_by_one",
        "out-of-bounds global load",
        "fused_keys_mma.cuh",
        "const bool ok = k < hidden_size && b < batch;",
        "const bool ok = k <= hidden_size && b < batch;",
    ),
    (
        "pipe_32bit_row_offset",
        "out-of-bounds global load",
        "fused_keys_mma.cuh",
        "static_cast<int64_t>(row) * ldw + k",
        "row * static_cast<int>(ldw) + k",
    ),
    (
        "pipe_last_step_skipped",
        "differ from the CPU kernel",
        "fused_keys_mma.cuh",
        "for (int step = 0; step < num_steps; ++step) {",
        "for (int step = 0; step + 1 < num_steps; ++step) {",
    ),
    (
        "pipe_hidden_read_before_the_dependency_wait",
        "tensor 'hidden' before griddepcontrol.wait",
        "fused_keys_mma.cuh",
        "    grid_dependency_wait();\n#pragma unroll\n    for (int st = 0; st < ST - 1; ++st) {\n"
        "      if (st < num_steps) load_hidden(st, st);\n      cp_async_commit();\n    }\n",
        "#pragma unroll\n    for (int st = 0; st < ST - 1; ++st) {\n"
        "      if (st < num_steps) load_hidden(st, st);\n      cp_async_commit();\n    }\n"
        "    grid_dependency_wait();\n",
    ),
    (
        "pipe_dynamic_smem_one_stage_short",
        r"past the launch's \d+ bytes of dynamic shared memory",
        "mma_configs.h",
        "return st * kc * (rows() + batch_rows()) * 64 + (tma ? 8 * st : 0);",
        "return (st - 1) * kc * (rows() + batch_rows()) * 64 + (tma ? 8 * st : 0);",
    ),
    # the TMA variants' weight stages (bulk tensor copy + mbarrier)
    (
        "tma_stage_read_before_its_mbarrier_wait",
        "before this thread observed the completion of the bulk tensor copy",
        "fused_keys_mma.cuh",
        "        mbarrier_wait_parity(&weight_full[step % ST], (weight_parity >> (step % ST)) & 1u);\n",
        "",
    ),
    (
        "tma_wait_for_the_wrong_parity",
        "before this thread observed the completion of the bulk tensor copy|deadlock",
        "fused_keys_mma.cuh",
        "(weight_parity >> (step % ST)) & 1u);",
        "((weight_parity >> (step % ST)) & 1u) ^ 1u);",
    ),
    (
        "tma_refill_without_the_proxy_fence",
        "without a fence.proxy.async",
        "fused_keys_mma.cuh",
        "          fence_proxy_async_shared();\n",
        "",
    ),
    (
        "tma_expect_tx_one_box_short",
        r"expects only \d+ more",
        "fused_keys_mma.cuh",
        "mbarrier_arrive_expect_tx(&weight_full[st], KC * kRows * 64);",
        "mbarrier_arrive_expect_tx(&weight_full[st], (KC - 1) * kRows * 64 + 64);",
    ),
    (
        "tma_mbarrier_init_not_synchronised",
        "initialised after the last __syncthreads|uninitialised mbarrier",
        "fused_keys_mma.cuh",
        "    __syncthreads();  // ... and to every thread\n",
        "",
    ),
    (
        "simt_lse_missing_barrier",
        "never written in this block|shared race",
        "fused_keys_simt.cuh",
        "  __syncthreads();\n  if (threadIdx.x < N && b0 + threadIdx.x < batch) {",
        "  if (threadIdx.x < N && b0 + threadIdx.x < batch) {",
    ),
    (
        "simt_lse_warp_dropped",
        "log-partition",
        "fused_keys_simt.cuh",
        "for (int w = 0; w < W; ++w) partition_merge(",
        "for (int w = 0; w < W - 1; ++w) partition_merge(",
    ),
    (
        "keys_lse_short_butterfly",
        "log-partition",
        "logits_to_keys_kernel.cuh",
        "  for (int offset = 16; offset > 0; offset /= 2) {\n    const PartitionState other",
        "  for (int offset = 16; offset > 1; offset /= 2) {\n    const PartitionState other",
    ),
    (
        "partition_old_best_dropped",  # a new best: the old one must join the others
        "log-partition",
        "../common/log_partition.h",
        "s.others = (s.others + 1.0f) * partition_term(s.ref, x, t);",
        "s.others = s.others * partition_term(s.ref, x, t);",
    ),
    (
        "partition_merge_loser_best_dropped",
        "log-partition",
        "../common/log_partition.h",
        "a.others = a.others + (b.others + 1.0f) * partition_term(b.ref, a.ref, t);",
        "a.others = a.others + b.others * partition_term(b.ref, a.ref, t);",
    ),
    (
        "partition_temperature_ignored",
        "sums at T",
        "fused_keys_simt.cuh",
        "const float* tp = out.partition_temperature;",
        "const float* tp = out.temperature;",
    ),
    (
        "sample_wrong_temperature_row",
        "differ from the CPU kernel",
        "fused_keys_simt.cuh",
        "const float t = out.temperature[b];",
        "const float t = out.temperature[0];",
    ),
    (
        "mma_lse_butterfly_short",  # a dropped partial: lanes g 4-7 never merged
        "differ from the model|differ from the CPU kernel|log-partition",
        "fused_keys_mma.cuh",
        "      for (int offset = 4; offset < 32; offset *= 2) {\n        const unsigned long long other_key",
        "      for (int offset = 4; offset < 16; offset *= 2) {\n        const unsigned long long other_key",
    ),
    (
        "mma_lse_wrong_rescale_temperature",  # a new best rescaled at batch column 0's T
        "differ from the model",
        "fused_keys_mma.cuh",
        "partition_add(best[r % 2], s, key, t_sum[r % 2]);",
        "partition_add(best[r % 2], s, key, t_sum[0]);",
    ),
    (
        "mma_lse_butterfly_order",  # a merge in the wrong order: ((g0 g4)(g2 g6))((g1 g5)(g3 g7))
        "differ from the model",
        "fused_keys_mma.cuh",
        "      for (int offset = 4; offset < 32; offset *= 2) {\n        const unsigned long long other_key",
        "      for (int offset = 16; offset >= 4; offset /= 2) {\n        const unsigned long long other_key",
    ),
]

# A slice of tests/test_emulation*.py: (test function, its parameters), bf16.
SLICE = [
    (suite.test_simt_argmax, dict(dtype=B16, batch=130, rows=70, hidden_size=16)),
    (suite.test_simt_argmax, dict(dtype=B16, batch=5, rows=63, hidden_size=7)),
    (suite.test_simt_argmax, dict(dtype=B16, batch=8, rows=129, hidden_size=4104)),
    (suite.test_mma_argmax, dict(dtype=B16, batch=65, rows=130, hidden_size=24)),
    (suite.test_mma_argmax, dict(dtype=B16, batch=16, rows=300, hidden_size=40)),
    (suite.test_gemm_keys, dict(dtype=B16, batch=7, rows=300, hidden_size=40)),
    (suite.test_topk_in_torch_topk_order, dict(path="simt", dtype=B16, batch=17, rows=200, hidden_size=16, k=64)),
    (
        suite.test_topk_in_torch_topk_order,
        dict(path="mma/n16_r64_w2", dtype=B16, batch=17, rows=200, hidden_size=16, k=64),
    ),
    (suite.test_sample_equals_cpu_draws, dict(path="simt", dtype=B16, batch=5, rows=300, hidden_size=40)),
    (suite.test_every_mma_config_against_the_cpu_kernel, dict(dtype=B16, path="mma/n1_r64")),
    (suite.test_every_mma_config_against_the_cpu_kernel, dict(dtype=B16, path="mma/n1_r64_sk2")),
    (suite.test_every_mma_config_against_the_cpu_kernel, dict(dtype=B16, path="mma/n16_r64")),
    (suite.test_every_mma_config_against_the_cpu_kernel, dict(dtype=B16, path="mma/n1_r64_tma")),
    (suite.test_every_mma_config_against_the_cpu_kernel, dict(dtype=B16, path="mma/n8_r256_tma")),
    (edges.test_grid_y_loop, dict(path="mma/n1_r64_tma", max_grid_y=1)),
    (edges.test_grid_y_loop, dict(path="simt", max_grid_y=1)),
    (edges.test_grid_y_loop, dict(path="mma", max_grid_y=1)),
    (edges.test_grid_y_loop, dict(path="mma/n1_r64", max_grid_y=1)),
    (edges.test_padding_rows_never_win, dict(path="simt", dtype=B16)),
    (edges.test_padding_rows_never_win, dict(path="mma", dtype=B16)),
    (edges.test_merge_keys_with_d2t_and_an_empty_shard, {}),
    (edges.test_weight_offsets_beyond_2_31_elements, dict(path="simt")),
    (edges.test_weight_offsets_beyond_2_31_elements, dict(path="mma")),
    (edges.test_weight_offsets_beyond_2_31_elements, dict(path="mma/n1_r64")),
    (lse.test_log_partition_against_float64, dict(path="simt", dtype=B16, shape=(9, 300, 40))),
    (lse.test_log_partition_against_float64, dict(path="gemm", dtype=B16, shape=(7, 300, 40))),
    (lse.test_log_partition_at_a_temperature, dict(path="simt", dtype=B16, shape=(9, 300, 40))),
    (lse_mma.test_mma_log_partition_is_the_documented_tree, dict(config="n1_r64_sk2", shape=(9, 300, 40))),
    (lse_mma.test_mma_log_partition_is_the_documented_tree, dict(config="n8_r192", shape=(19, 515, 72))),
]


def run_slice(emu: Emulator, seed: int, stop_at: str | None = None) -> list[str]:
    """The slice's checks that fail, with the first line of why; stop_at: stop
    at the first failure matching this regex."""
    failures = []
    for fn, kwargs in SLICE:
        gen = torch.Generator().manual_seed(seed)
        try:
            fn(emu, gen, **kwargs)
        except AssertionError as e:  # EmuError is one
            first = str(e).strip().splitlines()[0] if str(e).strip() else "assertion"
            failures.append(f"{fn.__name__}{kwargs}: {first[:300]}")
            if stop_at is not None and re.search(stop_at, first):
                break
    return failures


def _build_mutant(tmp_root, mutant):
    name, _, file, old, new = mutant
    root = tmp_root / name
    for d in ("common", "cuda", "emu"):
        shutil.copytree(CSRC / d, root / d)
    path = root / "cuda" / file
    text = path.read_text()
    assert text.count(old) >= 1, f"mutation anchor of {name} not found in {file} (update this test)"
    path.write_text(text.replace(old, new))
    return emulation.build(root, tag=f"mutant-{name}", bf16_only=True)


@pytest.fixture(scope="module")
def mutant_libs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mutants")
    with ThreadPoolExecutor(max_workers=2) as pool:  # g++ runs in subprocesses
        libs = list(pool.map(lambda m: _build_mutant(root, m), MUTANTS))
    return {m[0]: lib for m, lib in zip(MUTANTS, libs)}


def test_slice_passes_on_the_real_kernels(seed):
    emu = Emulator(emulation.build())
    assert run_slice(emu, seed) == []


@pytest.mark.parametrize("mutant", [m[0] for m in MUTANTS])
def test_mutant_is_caught(mutant_libs, mutant, seed):
    reason = next(m[1] for m in MUTANTS if m[0] == mutant)
    failures = run_slice(Emulator(mutant_libs[mutant]), seed, stop_at=reason)
    assert failures, f"the broken kernel '{mutant}' passed every check of the slice"
    assert re.search(reason, failures[-1]), f"'{mutant}' was not caught as /{reason}/: {failures}"
    if "global" in reason:  # compute-sanitizer style: kernel, block, thread, offset
        assert re.search(r"_kernel block \(\d+,\d+\) thread \d+ .*(byte offset|bytes before)", failures[-1])
    print(f"\n{mutant}: caught by {failures[-1]}")
