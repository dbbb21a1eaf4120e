"""Plain helpers shared by the test modules (and importable by spawned ranks).

Fixtures live in conftest.py; everything here is an ordinary function so that
``torch.multiprocessing`` children (spawn start method) can import it.

Nothing here trusts the library under test: the key encoder is a separate
Python implementation of DESIGN.md's format, and answers come from the float64
reference (full, unsharded logits, then ``torch.argmax``).
"""
from __future__ import annotations

import math
import multiprocessing
import os
import queue
import socket
import struct
import time
import traceback
from datetime import timedelta
from typing import Callable, List, Optional, Tuple

import torch

import localargmax
from localargmax import shard_vocab

U32 = 0xFFFFFFFF
FLOAT32_UNIT_ROUNDOFF = 2.0**-24

# ----------------------------------------------------------------------------
# An independent Python model of the packed key (DESIGN.md, "The packed key").
# ----------------------------------------------------------------------------


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(u: int) -> float:
    return struct.unpack("<f", struct.pack("<I", u))[0]


def py_ordered(x: float) -> int:
    if math.isnan(x):
        return U32
    u = f32_bits(x)
    if u == 0x80000000:
        u = 0
    return (u ^ U32) if (u & 0x80000000) else (u | 0x80000000)


def py_pack_key(value: float, index: int) -> int:
    """Unsigned 64-bit key of (value, global index)."""
    assert 0 <= index <= 0xFFFFFFFE
    return (py_ordered(value) << 32) | (U32 - index)


def to_int64(u: int) -> int:
    """The int64 holding the bits of the uint64 ``u`` (what the ops return)."""
    u &= (1 << 64) - 1
    return u - (1 << 64) if u >= (1 << 63) else u


def to_uint64(s: int) -> int:
    return s & ((1 << 64) - 1)


def same_float32(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality of two float32 tensors (NaN == NaN with equal bits)."""
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


# ----------------------------------------------------------------------------
# Shards in the standard layout, with padding rows that would win if read.
# ----------------------------------------------------------------------------

PAD_FILLS = ("nan", "huge", "inf_bias")


def fill_winning_padding(pad: torch.Tensor, hidden: torch.Tensor, scale: float = 1e4) -> None:
    """Fill padding rows ``pad [P, H]`` in place with ``scale`` x hidden rows
    (cycling over the batch): each would be the largest logit of some batch
    row, by far, if a kernel evaluated it (DESIGN.md rule 4)."""
    idx = torch.arange(pad.shape[0]) % hidden.shape[0]
    pad.copy_((hidden.to(torch.float32)[idx] * scale).to(pad.dtype))


def build_shards(
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    tp: int,
    pad_to: int = 64,
    *,
    hidden: Optional[torch.Tensor] = None,
    pad_fill: str = "huge",
):
    """Split the full ``[V, H]`` lm_head (and ``[V]`` bias) into the ``tp``
    shards of :func:`localargmax.shard_vocab`, each padded to ``rows`` rows.

    Padding rows are filled so that they would win if the kernel evaluated them:
    ``"nan"`` (NaN weights), ``"huge"`` (1e4 times a hidden row: the largest
    logit of that batch row, by far; needs ``hidden``), ``"inf_bias"`` (bias +inf
    and NaN alternately; weights huge as well). Returns a list of
    ``(weight_shard, bias_shard_or_None, VocabShard)``.
    """
    assert pad_fill in PAD_FILLS
    vocab, hsize = weight.shape
    out = []
    for rank in range(tp):
        layout = shard_vocab(vocab, rank, tp, pad_to)
        w = torch.empty((layout.rows, hsize), dtype=weight.dtype)
        nv = layout.num_valid
        w[:nv] = weight[layout.vocab_start : layout.vocab_start + nv]
        pad = w[nv:]
        if pad.shape[0]:
            if pad_fill == "nan":
                pad.fill_(float("nan"))
            else:
                if hidden is not None and hidden.shape[0] > 0 and hsize > 0:
                    fill_winning_padding(pad, hidden)
                else:
                    pad.fill_(1e4)
        b = None
        if bias is not None:
            b = torch.empty((layout.rows,), dtype=bias.dtype)
            b[:nv] = bias[layout.vocab_start : layout.vocab_start + nv]
            if pad_fill == "inf_bias":
                b[nv:] = float("inf")
                b[nv + 1 :: 2] = float("nan")
            else:
                b[nv:] = 1e30 if bias.dtype == torch.float32 else 1e4
        out.append((w, b, layout))
    return out


def sharded_keys(hidden, shards) -> torch.Tensor:
    """``[tp, B]`` keys: :func:`localargmax.shard_argmax` on every shard."""
    keys = [
        localargmax.shard_argmax(hidden, w, vocab_start=s.vocab_start, num_valid=s.num_valid, bias=b)
        for (w, b, s) in shards
    ]
    return torch.stack(keys) if keys else torch.empty((0, hidden.shape[0]), dtype=torch.int64)


def sharded_argmax(hidden, weight, bias=None, tp=1, pad_to=64, d2t=None, pad_fill="huge"):
    """ids of the full problem computed shard by shard, merged by merge_keys."""
    shards = build_shards(weight, bias, tp, pad_to, hidden=hidden, pad_fill=pad_fill)
    ids, values = localargmax.merge_keys(sharded_keys(hidden, shards), d2t)
    return ids, values


# ----------------------------------------------------------------------------
# The float64 reference and the near-tie rule.
# ----------------------------------------------------------------------------


def ref_logits(hidden, weight, bias=None) -> torch.Tensor:
    """[B, V] float64 logits of the full, unsharded problem, computed inline
    (independent of localargmax.reference).

    The sum runs over k in a fixed order with elementwise ops, so identical
    weight rows give bit-identical float64 logits wherever they sit. (A float64
    GEMM does not: MKL's dgemm rounds the last rows of a block differently, so
    ``argmax(h.double() @ w.double().T)`` can break an exact tie towards a
    larger index; see test_reference.py.)
    """
    h = hidden.detach().cpu().double()
    w = weight.detach().cpu().double()
    logits = torch.zeros((h.shape[0], w.shape[0]), dtype=torch.float64)
    for k in range(h.shape[1]):
        logits += h[:, k : k + 1] * w[:, k]
    if bias is not None:
        logits = logits + bias.detach().cpu().double()
    return logits


def ref_argmax(hidden, weight, bias=None, d2t=None) -> torch.Tensor:
    """[B] int64: torch.argmax of :func:`ref_logits`, then ``k + d2t[k]``."""
    ids = ref_logits(hidden, weight, bias).argmax(dim=1)
    if d2t is not None:
        ids = ids + d2t.cpu()[ids]
    return ids


def error_bound(hidden, weight, bias=None) -> torch.Tensor:
    """[B, V] bound on |float32-accumulated logit - exact logit|: the standard
    worst case of an H-term float32 dot product (any summation order) plus the
    bias add, gamma = (H + 2) * u applied to sum_k |h_k w_k| + |bias|."""
    hsize = hidden.shape[1]
    mag = hidden.double().abs() @ weight.double().abs().T
    if bias is not None:
        mag = mag + bias.double().abs()
    gamma = (hsize + 2) * FLOAT32_UNIT_ROUNDOFF
    return gamma / (1 - gamma) * mag


def reference_logits_and_error(hidden, weight, bias=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(:func:`ref_logits`, :func:`error_bound` with 0 at non-finite logits):
    what :func:`check_against_reference` compares with; compute it once and
    pass it as ``reference=`` to check several results of the same problem."""
    logits = ref_logits(hidden, weight, bias)
    err = error_bound(hidden, weight, bias)
    return logits, torch.where(torch.isfinite(logits), err, torch.zeros_like(err))


def check_against_reference(
    ids: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    d2t: Optional[torch.Tensor] = None,
    *,
    min_clear_fraction: float = 0.9,
    context: str = "",
    reference: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
):
    """Compare ``ids`` with the float64 reference (DESIGN.md, "Semantics").

    Rows whose reference winner beats every other entry by more than the float32
    error bound (or rows containing a non-finite logit, decided by rules 1-3)
    must match exactly; on other rows (near-ties) our winner's exact logit must
    lie within the error bound of the reference maximum. At least
    ``min_clear_fraction`` of the rows must be of the first kind, so the check
    can never pass vacuously (one near-tie row is tolerated beyond that).
    """
    ids = ids.cpu()
    logits, err = reference if reference is not None else reference_logits_and_error(hidden, weight, bias)
    batch, vocab = logits.shape
    assert ids.shape == (batch,), f"{context}: ids shape {tuple(ids.shape)} != ({batch},)"
    ref = logits.argmax(dim=1) if vocab else torch.zeros(batch, dtype=torch.int64)
    draft_ids = ids
    if d2t is not None:
        target = torch.arange(d2t.shape[0]) + d2t
        ref_t = target[ref]
        # ids are target ids; map back (target ids are unique when d2t is from build_d2t)
        inverse = {int(t): k for k, t in enumerate(target.tolist())}
        bad = [int(i) for i in ids if int(i) not in inverse]
        assert not bad, f"{context}: ids {bad[:5]} are not targets of any draft id"
        draft_ids = torch.tensor([inverse[int(i)] for i in ids], dtype=torch.int64)
    else:
        ref_t = ref
    if batch == 0:
        return
    assert bool(((draft_ids >= 0) & (draft_ids < vocab)).all()), f"{context}: ids out of range: {ids.tolist()[:10]}"
    rows = torch.arange(batch)
    best = logits[rows, ref]
    # Rows decided by non-finite values alone (a NaN, a +inf maximum, or all
    # -inf) follow rules 1-3 exactly.
    decided = torch.isnan(logits).any(dim=1) | (best == math.inf) | (logits == -math.inf).all(dim=1)
    lower = best - err[rows, ref]
    upper = logits + err
    upper[rows, ref] = -math.inf
    clear = decided | (lower > upper.max(dim=1).values)
    mismatch = clear & (ids != ref_t)
    assert not bool(mismatch.any()), (
        f"{context}: {int(mismatch.sum())} clear-winner rows differ from the float64 reference; "
        f"rows {mismatch.nonzero().flatten().tolist()[:10]}: got {ids[mismatch].tolist()[:10]}, "
        f"want {ref_t[mismatch].tolist()[:10]}"
    )
    ours = logits[rows, draft_ids]
    slack = err[rows, ref] + err[rows, draft_ids]
    too_far = (~clear) & ~(best - ours <= slack)
    assert not bool(too_far.any()), (
        f"{context}: rows {too_far.nonzero().flatten().tolist()[:10]} picked an id whose float64 logit is "
        f"further below the maximum than the float32 error bound allows"
    )
    # one near-tie row is always allowed (random data has them, rarely)
    n_clear = int(clear.sum())
    assert n_clear + 1 >= min_clear_fraction * batch, (
        f"{context}: only {n_clear} of {batch} rows have a clear winner (test data too tie-prone to be a real check)"
    )


def random_problem(gen: torch.Generator, batch: int, vocab: int, hsize: int, dtype=torch.float32, bias=None):
    """Gaussian hidden [B, H], weight [V, H] (rows scaled to ~unit logits),
    bias None / "float32" / "weight" dtype."""
    hidden = torch.randn(batch, hsize, generator=gen).to(dtype)
    scale = 1.0 / math.sqrt(max(hsize, 1))
    weight = (torch.randn(vocab, hsize, generator=gen) * scale).to(dtype)
    if hsize == 1 and dtype in (torch.bfloat16, torch.float16) and vocab > 1:
        # one column of 16-bit values would repeat the maximum all the time;
        # draw distinct bit patterns (magnitudes ~1e-3 .. 30, both signs)
        lo, hi = (0x3A00, 0x4200) if dtype == torch.bfloat16 else (0x1400, 0x4F00)
        pick = torch.randperm(2 * (hi - lo), generator=gen)[:vocab]
        bits = (lo + pick % (hi - lo)) | ((pick >= (hi - lo)).to(torch.int64) << 15)
        weight = bits.to(torch.int32).to(torch.int16).view(dtype).view(vocab, 1).clone()
    b = None
    if bias == "float32":
        b = torch.randn(vocab, generator=gen) * 0.5
    elif bias == "weight":
        b = (torch.randn(vocab, generator=gen) * 0.5).to(dtype)
    return hidden, weight, b


def planted_problem(gen: torch.Generator, batch: int, vocab: int, hsize: int, dtype=torch.float32, bias=None):
    """Like random_problem, with one planted winner per batch row:
    weight[t_b] = 6 * hidden[b] / |hidden[b]|^2 gives row b a logit near 6,
    far above the ~N(0, 1) others (needs hsize >= 32 to keep planted rows of
    other batch rows out of the way). Returns (hidden, weight, bias, winners)."""
    assert hsize >= 32 and vocab >= batch
    # Another batch row's planted weights can, rarely (a ~5 sigma overlap of two
    # random hidden states at small hsize), outscore a row's own plant: such a
    # draw is not the planted problem it claims to be, so draw again (the
    # float64 reference decides; the code under test is not involved).
    for _ in range(20):
        hidden, weight, b = random_problem(gen, batch, vocab, hsize, dtype, bias)
        winners = torch.randperm(vocab, generator=gen)[:batch]
        h = hidden.float()
        planted = 6.0 * h / (h * h).sum(dim=1, keepdim=True)
        weight[winners] = planted.to(dtype)
        if b is not None:
            b[winners] = b.max()
        if torch.equal(ref_argmax(hidden, weight, b), winners):
            return hidden, weight, b, winners
    raise AssertionError("could not plant clear winners in 20 draws")


def min_gap(hidden, weight, bias=None) -> float:
    """Smallest (top-1 - top-2) / |top-1| over rows of the float64 logits."""
    logits = ref_logits(hidden, weight, bias)
    top = logits.topk(2, dim=1).values
    return float(((top[:, 0] - top[:, 1]) / top[:, 0].abs()).min())


# ----------------------------------------------------------------------------
# A gloo multi-rank launcher: spawned processes, a free port, exceptions and
# crashes of any rank propagated, and a timeout so a hang fails the test.
# ----------------------------------------------------------------------------


class RankFailure(AssertionError):
    """One or more ranks raised, crashed, or did not finish in time."""


def stack_frames(keys, layouts) -> torch.Tensor:
    """What a real all-gather returns in a step's exchange: every simulated
    rank's framed payload (its keys plus the 3-word header of
    ``localargmax.collective.frame_keys``), stacked rank-major. For callable
    groups that play the other ranks in one process. ``layouts``: each
    rank's ``(vocab_start, num_valid)``."""
    from localargmax.collective import frame_keys

    return torch.stack([frame_keys(k, int(s) + int(n) if n else 0) for k, (s, n) in zip(keys, layouts)])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_in_group(worker, rank, world_size, port, results, args, pg_timeout: float = 120.0, barrier=None):
    """One rank's body: init a gloo group over 127.0.0.1:``port``, run
    ``worker(rank, world_size, *args)``, put ``(rank, "ok", value)`` or
    ``(rank, "error", traceback)`` on ``results``, tear the group down.
    ``barrier`` (optional) is passed before the rendezvous. Shared by
    :func:`run_ranks` and tests/fault_helpers.py."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        if barrier is not None:
            barrier.wait(timeout=120)  # every rank is up before a short-timeout rendezvous starts
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=pg_timeout),
        )
        value = worker(rank, world_size, *args)
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        # report before tearing the group down: the other ranks then fail with
        # "connection closed", and the root cause must arrive first
        results.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass


def _rank_main(worker, rank, world_size, port, results, args):
    rank_in_group(worker, rank, world_size, port, results, args)


def run_ranks(worker: Callable, world_size: int, *args, timeout: float = 240.0) -> List:
    """Run ``worker(rank, world_size, *args)`` on ``world_size`` spawned gloo
    ranks (a process group over 127.0.0.1 is initialised first) and return the
    list of their return values (plain picklable Python data), by rank.

    Raises RankFailure naming the rank and carrying its traceback as soon as a
    rank raises or dies, or when not all ranks report within ``timeout``
    seconds; the remaining processes are then killed, so a hang fails instead of
    hanging the suite. ``worker`` must be a module-level function.
    """
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(worker, rank, world_size, port, results, args), daemon=True)
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    values = {}
    failure = None
    errors = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) < world_size and failure is None:
            try:
                rank, status, value = results.get(timeout=0.5)
            except queue.Empty:
                dead = [
                    (r, p.exitcode) for r, p in enumerate(procs) if r not in values and p.exitcode not in (None, 0)
                ]
                if dead:
                    # drain a late message first: a rank may have reported then exited
                    time.sleep(0.5)
                    try:
                        while True:
                            r, s, v = results.get_nowait()
                            if s == "ok":
                                values[r] = v
                            else:
                                failure = f"rank {r} raised:\n{v}"
                    except queue.Empty:
                        pass
                    if failure is None:
                        failure = "rank(s) died without reporting: " + ", ".join(
                            f"rank {r} exit code {c}" for r, c in dead if r not in values
                        )
                    break
                if time.monotonic() > deadline:
                    missing = [r for r in range(world_size) if r not in values]
                    failure = f"ranks {missing} of {world_size} did not finish within {timeout:.0f} s (hang?)"
                continue
            if status == "ok":
                values[rank] = value
            else:
                errors[rank] = value
                # collect the other ranks' reports for a moment: all of them go
                # into the message, the first one reported first
                grace = time.monotonic() + 3.0
                while len(values) + len(errors) < world_size and time.monotonic() < grace:
                    try:
                        r, s, v = results.get(timeout=0.2)
                    except queue.Empty:
                        continue
                    if s == "ok":
                        values[r] = v
                    else:
                        errors[r] = v
                failure = "\n".join(f"rank {r} raised:\n{v}" for r, v in errors.items())
    finally:
        for p in procs:
            if p.is_alive() and (failure is not None or len(values) < world_size):
                p.kill()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
    if failure is not None:
        raise RankFailure(failure)
    return [values[r] for r in range(world_size)]
