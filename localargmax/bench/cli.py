"""``localargmax-bench`` / ``python -m localargmax.bench``: compare the fused
local-argmax step with what engines do today, on real and engine-sized
lm_heads. Run with ``--help`` for what is measured and examples."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys

from .. import envs

DESCRIPTION = """\
Benchmark token selection from a vocab-parallel lm_head under tensor
parallelism (TP): greedy ids (--op argmax, the default), top-k (--op topk) or
sampling (--op sample). Spawns --tp ranks on this machine (gloo on CPU, NCCL
with --device cuda), or runs as one rank under torchrun. Each rank holds a
zero-padded [rows, H] shard (localargmax.shard_vocab, pad_to=64).

--op argmax methods (one step = hidden [B, H] in, ids [B] out, identical on
every rank; default: all four):
  full-gather      torch matmul -> local logits [B, rows] in the weight dtype,
                   all-gather of the logits to [B, tp*rows], argmax
                   (localargmax.baselines.full_gather_argmax; today's path)
  unfused-local    torch matmul + max over the shard, all-gather of
                   (value, index) float32 pairs, pick the best rank
                   (localargmax.baselines.unfused_local_argmax; vLLM's
                   LogitsProcessor.get_top_tokens sends the same bytes)
  fused            one fused kernel (matmul + argmax, logits never stored) ->
                   one packed int64 key per row, all-gather of tp keys, merge
                   (localargmax.lm_head_argmax, reduce="all_gather")
  fused-allreduce  the same with an all-reduce MAX of the keys
                   (localargmax.lm_head_argmax, reduce="all_reduce")

--op topk --k K methods (ids [B, K], best first; K in 1..64, default 8):
  full-gather      all-gather of the logits as above, torch.topk(K)
                   (localargmax.baselines.full_gather_topk)
  fused            fused top-K kernel -> K packed keys per row, all-gather of
                   tp*K keys, merge (localargmax.lm_head_topk)

--op sample --temperature T methods (ids [B] ~ softmax(logits / T); T >= 0,
default 1.0, 0 = greedy):
  full-gather      all-gather of the logits as above, softmax(logits.float()/T),
                   torch.multinomial with a generator seeded with --seed on
                   every rank (localargmax.baselines.full_gather_sample)
  batch-sharded    vLLM 0.34's enable_batch_sharded_sampling: an all-to-all
                   gives rank r the full-vocab logits of the rows it owns
                   (b % tp == r), it samples them (vLLM's exponential race),
                   then the ids are all-gathered
                   (localargmax.bench.filtered.batch_sharded_sample)
  fused            Gumbel-max inside the fused kernel, Philox noise keyed by
                   (--seed, offset 0 + row, global vocab index), one key per
                   row (localargmax.lm_head_sample). Every timed step uses the
                   same seed and offset.

--op sample with --top-k K / --top-p P / --min-p M (vLLM's SamplingParams
meaning, each off unless given: temperature, then min-p relative to the row's
maximum, top-k, top-p over what they kept; DESIGN.md "Filtered sampling"):
  full-gather      all-gather of the logits, vLLM's PyTorch filters (min-p
                   mask, one sort for top-k / top-p), vLLM's exponential race
                   probs / q (localargmax.bench.filtered.gather_filter_sample)
  batch-sharded    the all-to-all as above, then vLLM's filters and race on
                   the owned rows
  fused            lm_head_sample(..., top_k=, top_p=, min_p=): each rank's
                   top-64 candidates and log-partition in one exchange
                   (8*payload_length(B, 64, True) bytes); a row whose allowed
                   set the candidates do not decide is recomputed from its
                   gathered float32 logits (JSON fallback_share: the share
                   of such rows in the run, decided from the run's shards;
                   their gather is counted in sent_B).
  agree (fused)    the share of rows whose id equals the same gather + filters
                   sampled with the kernels' Gumbel noise instead of the
                   exponential race (the same noise: equal but at float32
                   near-ties); JSON top_k, top_p, min_p on every row.

columns (the first line of each is the legend printed under the table):
  median_us, p90_us   {median_us}.
                      Every timed step starts after a barrier (not timed);
                      the time is rank 0's wall time until its ids are ready
                      (CUDA: after synchronize). All methods end in a
                      collective, so this includes waiting for every rank.
  sent_B              {sent_B}
                      (JSON bytes_sent_per_rank): the payload it contributes
                      to the collective: full-gather B*rows*itemsize;
                      unfused-local 8*B (two float32); fused and
                      fused-allreduce 8*B+24 (one key per row and the
                      step's 3-word header); fused topk 8*K*B+24.
  recv_B              {recv_B}
                      (JSON bytes_recv_per_rank). all-gather: (tp-1)*payload.
                      all-reduce: the ring-algorithm ESTIMATE
                      2*(tp-1)/tp*payload (the real traffic depends on the
                      backend's algorithm).
  vllm_B              {vllm_B}
                      (JSON bytes_sent_vllm), the same for every method of
                      a (batch, op): argmax 8*B (get_top_tokens: float32
                      value + index); topk (itemsize+8)*K*B (values in the
                      weight dtype + int64 ids: 12*K*B for float32); sample
                      B*rows*itemsize (vLLM samples from gathered logits).
  speedup             {speedup}.
  agree               {agree},
                      on every rank. The reference: logits of the full unpadded
                      lm_head in float64 (inputs first rounded to --dtype),
                      torch.argmax, then d2t. Synthetic shapes: rank 0
                      regenerates the weight block by block from the seed and
                      keeps the first maximum across blocks (torch.argmax
                      rule), independent of the kernels under test.
                      --op topk:
                      {agree_topk}
                      (the float64 reference top-K: larger logit first, ties
                      to the smaller index, a stable sort, mapped by d2t).
                      --op sample: "-" (another random stream, not comparable).
  k                   --op topk only: K.
  path                {path}:
                      on CPU, the fused rows (--kernel-only: fused-kernel
                      runs --cpu-path, lm-head-step auto); "-" for rows
                      that do not run our CPU kernel.
  tp_inv              {tp_inv}
                      (JSON tp_invariance; --op sample, fused only): the
                      one-rank sample is lm_head_sample on rank 0 with
                      group=None on the whole unpadded lm_head in --dtype, same
                      seed and offset; the sample must not depend on tp.
                      "-" when the full matrix does not fit in memory.
                      (JSON: sample rows also hold ranks_agree, the fraction
                      of rows whose sample is the same on every rank.)
 --kernel-only columns:
  median_us, p90_us   {kernel_median_us}.
  GB/s                {gbps}.
  of_stream           {of_stream}.
                      The stream-read row is the bandwidth bound of the same
                      run: the faster of two torch reads of the same bytes
                      (an int64 sum, and on CPU a float32 mv with a ones
                      vector, on CUDA a float32 sum at the weight's dtype;
                      JSON stream_method).
  vs_torch            {vs_torch};
                      --op topk: {vs_torch_topk}.
  agree_vllm          {agree_vllm}: with vLLM's noise both score the same
                      float32 fl(x / T) + g, so ids differ only where the two
                      logits' float32 rounding crosses a near-tie.

Under the table, after its legend: one verdict line per shape and batch, the
fastest method and fused against full-gather (--kernel-only: fused-kernel
against the op's first torch baseline), as a ratio of their medians where
their notches (median +- 1.57 IQR / sqrt(steps)) separate, else "within noise"
with about how many --steps would separate them. The methods run interleaved
(step i of each before step i + 1 of any), so load reaches them alike; JSON
rows carry p25_us / p75_us beside median_us.

--kernel-only: the local step alone in one process (no ranks) for --op argmax,
topk or sample, on the rank-0 shard of each --tp (comma list, default 1; e.g.
--tp 1,2,4,8) or on --rows rows, batches 1,2,4,...,256 unless --batch; with
--log-probs, every row also computes log-probabilities (JSON log_probs: the
fused log-partition, return_log_probs=True, a logsumexp in the baselines;
no forced mma / gemm rows). Rows:
  fused-kernel        the fused op (shard_argmax/shard_topk/shard_sample) on
                      the path it picks (JSON cuda_path); lm-head-step: the
                      whole lm_head_* step, world-size-1 group. On CUDA with
                      bf16/fp16 also each forced path (the ops' path=...):
                      fused-simt, fused-mma, gemm-keys (cuBLAS float32
                      logits, then keys; argmax and sample)
  baselines           argmax: torch-matmul-max; topk: torch-matmul-topk;
                      sample (FlashSampling's baselines): gumbel-logits (torch
                      matmul -> logits -> Gumbel-max argmax(l/T + g), noise
                      from torch's generator, torch.compile'd),
                      compiled-multinomial (matmul + softmax + multinomial),
                      flashinfer (cuBLAS logits + FlashInfer
                      sampling_from_logits = FlashSampling's "FI2"; a row
                      with skip_reason when flashinfer cannot run); --no-compile
                      times them eagerly; --noise vllm adds vllm-gumbel-logits
                      (vLLM 0.34's gumbel_sample on the shard's logits: the
                      per-rank work of the target sampler's shard-logits
                      route; the fused rows then draw vLLM's noise)
  yardsticks          gemm-peak (large square GEMM of the dtype: TFLOP/s),
                      stream-read (read-only pass over the shard's bytes: int64
                      sum, or on CPU a float32 mv, on CUDA a sum at the dtype,
                      whichever is faster),
                      d2d-copy (copy of the shard, read + write bytes counted)
  columns             GB/s = weight bytes / median; of_stream = GB/s over
                      stream-read's; of_roof (fraction_of_roofline) =
                      max(bytes / stream-read bandwidth, 2*B*rows*H / GEMM
                      rate) / median; vs_* = baseline median / this median;
                      FS_* = FlashSampling's published H200 bf16 ratio for the
                      same (shape, batch, baseline) where the paper gives one
                      (tp 1, --op sample; JSON flashsampling_h200 with the
                      source). Our figures are of this run's device (CPU
                      figures are CPU, not H200).
  --json PATH also writes PATH with .png (unless --no-plot): median time vs
  batch per method, with each shard's roofline (matplotlib).

models (shape names in the rows):
  minilm (default)    real all-MiniLM-L6-v2 [30522, 384] word embeddings as the
                      lm_head, hidden states of its encoder over English
                      docstrings of Python stdlib modules. Two shapes: "minilm"
                      (full vocab) and "minilm-d2t8192" (EAGLE-3 draft vocab of
                      the 8192 most frequent tokens of that text, with d2t).
  qwen3, llama3, llama3-70b, deepseek-v3   synthetic 151936x4096, 128256x4096,
                      128256x8192, 129280x7168 (qwen3 and llama3-70b are
                      FlashSampling's published shapes)
  synthetic           synthetic --vocab V --hidden H
  Synthetic weights are N(0,1)/sqrt(H) from --seed, generated per block.
"""

EPILOG = """\
examples:
  localargmax-bench                                   # tp=2 gloo, minilm, fp32, B=1,8,64
  localargmax-bench --json /tmp/minilm.json         # the table, and the rows as JSON
  localargmax-bench --model qwen3 --batch 1,8 --steps 5
  localargmax-bench --model synthetic --vocab 262144 --hidden 2048 --methods full-gather,fused
  localargmax-bench --op topk --k 8 --json /tmp/minilm_topk8.json
  localargmax-bench --op sample --temperature 0.7 --model qwen3 --batch 8 --steps 5
  localargmax-bench --op sample --temperature 0.7 --top-k 50 --top-p 0.9 --json /tmp/minilm_filtered.json
  localargmax-bench --op sample --min-p 0.05 --batch 64 --steps 10 --json /tmp/minilm_min_p.json
  localargmax-bench --kernel-only --cpu-path generic --json /tmp/generic.json   # forced CPU path; slow (below)
  localargmax-bench --device cuda --tp 8 --model deepseek-v3 --json -
  torchrun --nproc-per-node 8 -m localargmax.bench --device cuda --model qwen3
  localargmax-bench --kernel-only --model qwen3 --rows 75968 --dtype bfloat16
  localargmax-bench --kernel-only --op sample --model qwen3 --batch 1,64,256 --tp 8
  localargmax-bench --kernel-only --op topk --k 8 --log-probs --model qwen3 --batch 1,8,64 --tp 8
  localargmax-bench --kernel-only --op sample --device cuda --model llama3-70b --tp 1,2,4,8 --json out.json
  localargmax-bench --smoke --json out.json           # tiny, for tests (or LOCALARGMAX_BENCH_SMOKE=1)

slow runs (on CPU these take minutes, not seconds):
  --kernel-only        every row at 9 batch sizes (1 to 256) with 100 steps
                       each on minilm; a forced slow path takes longer still
                       (--kernel-only --cpu-path generic: 5 min 23 s on an
                       AMX Xeon); shorter with --batch 1,8 --steps 10
  qwen3, llama3, llama3-70b, deepseek-v3 on CPU: minutes per batch size
                       (10 steps each); --batch 1 --steps 3 for a first look
  --smoke is the quick check that everything runs (seconds).

from a checkout of the repository (not installed with the package):
  python -m bench.predict_cli --help                  # the bandwidth model: PREDICTED H200 times, no GPU
  python -m bench.tune --help                         # GPU: time the paths, write a MEASURED dispatch table
"""

CHECKOUT_TOOLS = {
    "--predict": "python -m bench.predict_cli",
    "--tune": "python -m bench.tune",
}
"""Options of earlier versions whose tools now run from a checkout: the command each names."""

MODELS = ("minilm", "synthetic", "qwen3", "llama3", "llama3-70b", "deepseek-v3")
SMOKE_ENV = "LOCALARGMAX_BENCH_SMOKE"
CPU_PATH_CHOICES = ("auto", "generic", "avx2", "avx512", "avx512_bf16", "brgemm")
SMOKE_SHAPE = (1003, 64)  # a tiny synthetic vocab that does not divide by 64


class UsageError(ValueError):
    """A bad combination of command-line options."""


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser (its --help is the user documentation)."""
    from .report import DEFINITIONS
    from .runner import DTYPES, NOISES, OP_METHODS, OPS

    description = DESCRIPTION.format(**DEFINITIONS)
    p = argparse.ArgumentParser(
        prog=prog, description=description, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", choices=MODELS, default="minilm", help="lm_head and inputs (default: minilm)")
    p.add_argument("--vocab", type=_int_at_least(1), help="vocabulary size, with --model synthetic")
    p.add_argument("--hidden", type=_int_at_least(1), help="hidden size, with --model synthetic")
    p.add_argument(
        "--draft-vocab",
        type=_int_at_least(0),
        help="minilm: size K of the d2t draft-vocab shape (default 8192; 0 skips it)",
    )
    p.add_argument(
        "--tp",
        help="ranks (default 2; under torchrun: WORLD_SIZE); --kernel-only: comma-separated tp sizes "
        "whose rank-0 shard is timed (default 1)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (gloo) or cuda (NCCL); default cpu")
    p.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        help="weight/hidden dtype (default: float32 for minilm, bfloat16 for synthetic)",
    )
    p.add_argument("--batch", help="comma-separated batch sizes (default 1,8,64; --kernel-only 1,2,4,...,256)")
    p.add_argument(
        "--op",
        choices=OPS,
        help="what a step computes: argmax (greedy, default), topk (--k ids per row) or "
        "sample (softmax(logits / --temperature))",
    )
    p.add_argument("--k", type=_int_at_least(1), help="--op topk: ids per row, 1..64 (default 8)")
    p.add_argument(
        "--temperature", type=_float_at_least(0.0), help="--op sample: temperature T >= 0 (default 1.0; 0 = greedy)"
    )
    p.add_argument(
        "--top-k", type=_int_at_least(-1), help="--op sample: keep the K largest logits (0 or -1 = off, the default)"
    )
    p.add_argument(
        "--top-p",
        type=_top_p,
        help="--op sample: keep the smallest set of mass >= P, in (0, 1] (1 = off, the default)",
    )
    p.add_argument(
        "--min-p",
        type=_fraction,
        help="--op sample: keep ids of probability >= M * the largest, in [0, 1] (0 = off, the default)",
    )
    p.add_argument(
        "--cpu-path",
        choices=CPU_PATH_CHOICES,
        default="auto",
        help="--kernel-only on CPU: force the fused kernel's CPU path (the ops' path=); default auto, the one "
        "localargmax picks per dtype (JSON cpu_path on each fused row names the path run)",
    )
    p.add_argument(
        "--noise",
        choices=NOISES,
        help="--kernel-only --op sample: the fused rows' noise. philox (default): the kernels' own; vllm: vLLM "
        "0.34's gumbel_sample noise (localargmax.vllm_noise; row b's seed --seed + b, position b), beside the "
        "vllm-gumbel-logits baseline (vLLM's work on a shard with that noise: logits in the weight dtype, / T in "
        "float32, + the noise, argmax; JSON agree_vllm: the share of rows whose id equals it); CUDA: the gemm "
        "path, the only one that takes vLLM's noise",
    )
    p.add_argument(
        "--log-probs",
        action="store_true",
        help="--kernel-only: the ops with their fused log-partition (log_partition=True; the lm_head step with "
        "return_log_probs=True; the torch baseline adds a logsumexp); CUDA: no forced mma / gemm rows",
    )
    methods_help = "; ".join(f"{op}: {','.join(m)}" for op, m in OP_METHODS.items())
    p.add_argument(
        "--methods", help=f"comma-separated subset of the --op's methods (default: all of them; {methods_help})"
    )
    for flag, least, default, text in (  # the integer options: (flag, smallest value, default, help)
        ("--steps", 1, None, "timed steps per row (default: 100 minilm, 10 big shapes on CPU; 200 on CUDA)"),
        ("--warmup", 0, None, "untimed steps before them (default: 10 minilm, 2 big shapes on CPU; 20 on CUDA)"),
        (
            "--threads",
            1,
            None,
            "torch threads per rank (default max(1, cpu_count // tp); --kernel-only: cpu_count - 1)",
        ),
        ("--seed", 0, 0, "seed of sampled positions, synthetic weights and --op sample's noise (default 0)"),
    ):
        p.add_argument(flag, type=_int_at_least(least), default=default, help=text)
    p.add_argument(
        "--timeout",
        type=_float_above(0.0),
        default=60.0,
        metavar="SECONDS",
        help="every collective this run starts fails after this long instead of hanging, e.g. when a "
        "rank dies (default 60)",
    )
    p.add_argument(
        "--json", metavar="PATH", help="write {env, rows, command} as JSON to PATH ('-' = stdout, table to stderr)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--kernel-only",
        action="store_true",
        help="time the local step alone on one process, beside the "
        "op's baselines and the roofline yardsticks (see above)",
    )
    p.add_argument(
        "--rows",
        type=_int_at_least(1),
        help="--kernel-only: time a shard of this many rows instead of the --tp shards; --host-time: the shard's "
        "rows (default 64)",
    )
    p.add_argument(
        "--host-time",
        action="store_true",
        help="what the step costs around the kernel: one process, world size 1, a tiny shard (--rows x --hidden, "
        "default 64 x 64 float32): µs per call and dispatched ops per call (host path, and device path as on "
        "CUDA) of the bare fused op, the planned step (StepPlan.run), the step (lm_head_argmax) and vLLM's own "
        "local argmax, interleaved over --repeats (--batch default 1,8; --steps default 2000 calls per repeat)",
    )
    p.add_argument("--repeats", type=_int_at_least(1), default=7, help="--host-time: interleaved repeats (default 7)")
    p.add_argument("--no-plot", action="store_true", help="--kernel-only: no PNG beside the --json file")
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="--kernel-only --op sample: time the baselines eagerly (no torch.compile)",
    )
    p.add_argument(
        "--max-seconds",
        type=_float_at_least(0.0),
        default=10.0,
        help="--kernel-only: cut timed calls to fit this many seconds per row (default 10; 0 = no cut)",
    )
    for flag, command in CHECKOUT_TOOLS.items():
        p.add_argument(flag, action="store_true", help=f"runs from a checkout of the repository: {command} --help")
    p.add_argument(
        "--smoke",
        action="store_true",
        help=f"tiny fast run for tests (also {SMOKE_ENV}=1): B=1,4, 3 steps, plus a tiny synthetic shape",
    )
    return p


def _int_at_least(low: int):
    """argparse type: an int >= ``low`` (else exit 2 naming the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.below = low - 1  # a value it refuses (tests/test_bench_cli.py walks every numeric option)
    return parse


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _finite_float(low: float, inclusive: bool):
    """argparse type: a finite float >= ``low`` (``inclusive``) or > ``low``."""

    def parse(text: str) -> float:
        value = _float(text)
        if value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {low:g}, got {text}")
        return value

    parse.below = low - 1.0 if inclusive else low
    return parse


def _top_p(text: str) -> float:
    """argparse type of --top-p: a float in (0, 1]."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (1 = off), got {text}")
    return value


_top_p.below = 0.0


def _fraction(text: str) -> float:
    """argparse type of --min-p: a float in [0, 1]."""
    value = _float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1] (0 = off), got {text}")
    return value


_fraction.below = -1.0


def _float_at_least(low: float):
    return _finite_float(low, inclusive=True)


def _float_above(low: float):
    return _finite_float(low, inclusive=False)


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{what} must be integers >= 1, got {text!r}")
    return values


def make_config(args, command: list[str]):
    """Check the options and return ``(RunConfig, shape_builder, smoke)``; the
    builder is called later (it may load the model). Raises UsageError."""
    import torch

    from .. import MAX_TOPK
    from .runner import OP_METHODS, RunConfig

    smoke = args.smoke or envs.LOCALARGMAX_BENCH_SMOKE
    synthetic = args.model != "minilm"
    if (args.vocab or args.hidden) and args.model != "synthetic":
        raise UsageError("--vocab/--hidden go with --model synthetic")
    if args.model == "synthetic" and not smoke and not (args.vocab and args.hidden):
        raise UsageError("--model synthetic needs --vocab V and --hidden H (both >= 1)")
    if synthetic and args.draft_vocab:
        raise UsageError("--draft-vocab applies to --model minilm only")
    op = args.op or "argmax"
    if args.k is not None and op != "topk":
        raise UsageError("--k goes with --op topk")
    if args.temperature is not None and op != "sample":
        raise UsageError("--temperature goes with --op sample")
    given = [f for f in ("top_k", "top_p", "min_p") if getattr(args, f) is not None]
    if given and op != "sample":
        raise UsageError(f"{'/'.join('--' + f.replace('_', '-') for f in given)}: only with --op sample")
    if given and args.kernel_only:
        raise UsageError("--top-k / --top-p / --min-p: the multi-rank run only (not --kernel-only)")
    if args.cpu_path != "auto":
        if not args.kernel_only or args.device != "cpu":
            raise UsageError("--cpu-path goes with --kernel-only on --device cpu (the ops' path=)")
        import torch

        from ..paths import kernel_path

        try:
            kernel_path(torch.float32, "cpu", args.cpu_path)
        except ValueError as exc:
            raise UsageError(f"--cpu-path {args.cpu_path}: {exc}") from None
    k = 8 if args.k is None else args.k
    if not 1 <= k <= MAX_TOPK:
        raise UsageError(f"--k must be in 1..{MAX_TOPK}, got {k}")
    # (numeric ranges: the argparse types of build_parser)
    temperature = 1.0 if args.temperature is None else args.temperature
    noise = args.noise or "philox"
    if args.noise is not None and (op != "sample" or not args.kernel_only):
        raise UsageError("--noise goes with --kernel-only --op sample")
    if noise == "vllm" and args.log_probs:
        raise UsageError("--noise vllm and --log-probs: the vllm-gumbel-logits baseline has no log-probabilities")
    if args.log_probs and not args.kernel_only:
        raise UsageError("--log-probs goes with --kernel-only")
    if op == "sample" and not 0 <= args.seed < 2**63:
        raise UsageError(f"--op sample needs 0 <= --seed < 2**63, got {args.seed}")
    op_methods = OP_METHODS[op]
    methods = list(op_methods) if args.methods is None else [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if all(m not in ms for ms in OP_METHODS.values())]
    if unknown or not methods:
        raise UsageError(f"unknown method(s) {unknown or args.methods!r}; choose from {', '.join(op_methods)}")
    unavailable = [m for m in methods if m not in op_methods]
    if unavailable:
        raise UsageError(
            f"method(s) {', '.join(unavailable)} not available with --op {op}; choose from {', '.join(op_methods)}"
        )
    if args.device == "cuda":
        from .. import WITH_CUDA

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: torch.cuda.is_available() is False (no GPU or a CPU-only torch)")
        if not WITH_CUDA:
            raise UsageError("--device cuda: this build of localargmax has no CUDA kernels (rebuild with CUDA)")
    tps = _int_list(args.tp, "--tp") if args.tp is not None else None
    if args.kernel_only and tps is not None and args.rows is not None:
        raise UsageError("--kernel-only: give --tp (shards of the lm_head) or --rows (one shard), not both")
    if not args.kernel_only and tps is not None and len(tps) != 1:
        raise UsageError("--tp takes one number (a list only with --kernel-only)")
    if (args.no_compile or args.no_plot) and not args.kernel_only:
        raise UsageError("--no-compile and --no-plot go with --kernel-only")
    torchrun = envs.torchrun_rank()
    if torchrun is not None and not args.kernel_only:
        world = torchrun.world_size
        if tps not in (None, [world]):
            raise UsageError(f"--tp {args.tp} but torchrun started WORLD_SIZE={world} ranks")
        tp = world
    else:
        tp = 1 if args.kernel_only else (tps[0] if tps is not None else 2)
    if args.device == "cuda" and torchrun is None and tp > torch.cuda.device_count():
        raise UsageError(f"--tp {tp} needs {tp} GPUs, this machine has {torch.cuda.device_count()}")
    big = synthetic and not smoke
    cuda = args.device == "cuda"
    steps = args.steps if args.steps is not None else (3 if smoke else 200 if cuda else 10 if big else 100)
    warmup = args.warmup if args.warmup is not None else (1 if smoke else 20 if cuda else 2 if big else 10)
    cores = os.cpu_count() or 1
    if args.threads is not None:
        threads = args.threads
    elif args.kernel_only:  # one process: leave a core for the rest of the machine (timer, OS)
        threads = max(1, cores - 1)
    else:
        threads = max(1, cores // tp)
    if args.batch is not None:
        batches = _int_list(args.batch, "--batch")
    else:
        from .rival import DEFAULT_KERNEL_BATCHES

        batches = [1, 4] if smoke else list(DEFAULT_KERNEL_BATCHES) if args.kernel_only else [1, 8, 64]
    dtype = args.dtype or ("bfloat16" if synthetic else "float32")
    as_given = ("device", "seed", "timeout", "log_probs", "top_k", "top_p", "min_p", "cpu_path")  # flags as they are
    cfg = RunConfig(
        tp=tp, dtype=dtype, batches=batches, methods=methods, steps=steps, warmup=warmup, threads=threads,
        json_path=args.json, command=command, progress=not args.no_progress, op=op, k=k, temperature=temperature,
        noise=noise, **{name: getattr(args, name) for name in as_given},
    )  # fmt: skip
    draft_vocab = 8192 if args.draft_vocab is None else args.draft_vocab
    if draft_vocab < 0:
        raise UsageError("--draft-vocab must be >= 0")
    for name in ("vocab", "hidden"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1")

    def build_shapes():
        from . import data

        tiny = data.synthetic_shape("synthetic", *SMOKE_SHAPE, seed=args.seed)
        if smoke:  # minilm (both shapes) + the tiny synthetic shape; kernel-only / synthetic: tiny only
            real = (
                [] if (args.kernel_only or synthetic) else data.minilm_shapes(draft_vocab, max(batches), seed=args.seed)
            )
            return real + [tiny]
        if args.model == "minilm":
            return data.minilm_shapes(0 if args.kernel_only else draft_vocab, max(batches), seed=args.seed)
        return [data.synthetic_shape(args.model, args.vocab, args.hidden, seed=args.seed)]

    return cfg, build_shapes, smoke


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the benchmark; returns the process exit code (0 ok, 1 a rank
    failed, 2 usage error, 130 interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or "localargmax-bench"
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    for flag, command in CHECKOUT_TOOLS.items():
        if getattr(args, flag[2:]):
            print(
                f"{prog}: {flag} is not part of the installed package; from a checkout of the repository "
                f"(its root folder) run: {command} --help",
                file=sys.stderr,
            )
            return 2
    if args.host_time:
        from .host_time import run_host_time

        if args.kernel_only or args.op not in (None, "argmax"):
            print(f"{prog}: error: --host-time times the greedy step alone (no --kernel-only, --op)", file=sys.stderr)
            return 2
        return run_host_time(args, shlex.split(prog) + argv)
    try:
        cfg, build_shapes, smoke = make_config(args, shlex.split(prog) + argv)
        shapes = build_shapes()
        if cfg.op == "topk":
            for shape in shapes:
                if cfg.k > shape.lm_rows:
                    raise UsageError(f"--k {cfg.k} is more than the {shape.name} lm_head's {shape.lm_rows} rows")
        if args.kernel_only:
            shards = kernel_shards(args, shapes[0])
    except (UsageError, RuntimeError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    try:
        if args.kernel_only:
            from .kernel import run_kernel_only
            from .report import finish

            rows = run_kernel_only(
                cfg, shapes[0], shards, 0.0 if smoke else args.max_seconds, compile_baselines=not args.no_compile
            )
            finish(rows, cfg, kernel_only=True)
            if not args.no_plot:
                write_plot(rows, cfg)
            return 0
        from .runner import launch

        return launch(cfg, shapes)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def kernel_shards(args, shape) -> list[tuple]:
    """``[(tp, rows)]`` of ``--kernel-only``: ``--rows`` as one shard (tp None),
    else for each ``--tp`` (default 1) the valid rows of rank 0's shard in the
    standard layout (``shard_vocab(lm_rows, 0, tp, pad_to=64).num_valid``)."""
    from ..layout import shard_vocab

    if args.rows is not None:
        if args.rows < 1:
            raise UsageError("--rows must be >= 1")
        if shape.weight is not None and args.rows > shape.lm_rows:
            raise UsageError(f"--rows {args.rows} is more than the {shape.name} lm_head's {shape.lm_rows} rows")
        return [(None, args.rows)]
    tps = _int_list(args.tp, "--tp") if args.tp is not None else [1]
    return [(tp, shard_vocab(shape.lm_rows, 0, tp, pad_to=64).num_valid) for tp in tps]


def write_plot(rows: list[dict], cfg) -> None:
    """The PNG of the kernel-only rows beside the JSON file (``x.json`` ->
    ``x.png``); a message instead when matplotlib is missing."""
    from .report import device_label
    from .rival import plot_kernel_rows, plot_path

    path = plot_path(cfg.json_path)
    if path is None or not rows:
        return
    out = sys.stderr if cfg.json_path == "-" else sys.stdout
    why_not = plot_kernel_rows(rows, path, device_label(cfg.device))
    print(f"plot not written: {why_not}" if why_not else f"wrote the plot to {path}", file=out)


if __name__ == "__main__":
    sys.exit(main())
