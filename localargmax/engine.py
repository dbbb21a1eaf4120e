"""The engine the steps share (:mod:`localargmax.step`'s argmax and top-k
through :class:`localargmax.StepPlan`, :mod:`localargmax.sampling`'s filtered
step): the fields the ranks compare before an exchange (:func:`step_fields`),
the checked exchange (:func:`exchange_checked`, an :class:`Exchange`), the
checked merge (:func:`merge_checked`), the winning rank of an exchange, and
the local logits of the paths that need them (the baselines, the module) and
their gather (the filtered step's fallback, :func:`gather_logits`). The group
goes one way: a step hands it to :func:`exchange_checked` (and the fallback to
:func:`gather_logits`), which hand it to :mod:`localargmax.collective`;
:func:`localargmax.collective.check_group` checks it at the step's first
exchange, before any use."""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

import torch

from . import envs
from ._validation import host_checks
from .collective import (
    HEADER_LEN,
    PAIRS_FLAG,
    REDUCE_MODES,
    Group,
    exchange_logits,
    exchange_step,
    frame_keys,
    words_to_pairs,
)
from .ops import merge_keys
from .packed_key import INDEX_MASK, SIGN_FLIP, key_index

PAYLOAD_INPUTS = ("batch size", "k", "return_log_probs", "return_log_odds", "reduce")
"""The inputs that change what a rank sends in a step's exchange (its size or
its collective): with ``LOCALARGMAX_DEBUG=1`` every step compares them, and
the shapes the merge assumes (:func:`step_fields`), across the ranks
before the key exchange (which cannot survive ranks that disagree on its size)."""


def step_fields(hidden, weight, d2t, k: int, reduce: str, log_probs: bool, log_odds: bool = False, debug=None):
    """What every rank must agree on before the exchange, as ints: each of
    :data:`PAYLOAD_INPUTS` (``reduce`` named with its codes), then the hidden
    size, shard rows and d2t length, then the caller's own per-step ``debug``
    fields (name: an int, None (0) or a ``[B]`` per-row tensor, compared by
    its :func:`fingerprint`)."""
    shape = lambda t, d: t.shape[d] if isinstance(t, torch.Tensor) and t.dim() == 2 else -1  # noqa: E731
    reduce_name = f"reduce ({', '.join(f'{i} = {m}' for i, m in enumerate(REDUCE_MODES))})"
    fields = {
        "batch size": shape(hidden, 0),
        "k": k,
        "return_log_probs": int(bool(log_probs)),
        "return_log_odds": int(bool(log_odds)),
        reduce_name: REDUCE_MODES.index(reduce) if reduce in REDUCE_MODES else -1,
        "hidden size": shape(hidden, 1),
        "shard rows": shape(weight, 0),
        "d2t length": d2t.shape[0] if isinstance(d2t, torch.Tensor) else -1,
    }
    for name, v in (debug or {}).items():
        fields[name] = 0 if v is None else fingerprint(v) if isinstance(v, torch.Tensor) else v
    return fields


def fingerprint(values: torch.Tensor) -> int:
    """An int64 fingerprint of a ``[B]`` tensor's values in row order (the
    first 8 bytes of their BLAKE2b digest): rows held in another order, or
    one value changed, give another (but with probability ``2**-64``).
    Integers as int64; floats as float64 with ``-0.0`` as ``+0.0`` (the steps
    treat them alike). Reads the values on the host (debug mode only)."""
    vals = values.detach().cpu().tolist()
    if values.is_floating_point():
        data = struct.pack(f"<{len(vals)}d", *(v + 0.0 for v in vals))
    else:
        data = struct.pack(f"<{len(vals)}q", *vals)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


class Exchange(NamedTuple):
    """What a step's checked exchange returns (:func:`exchange_checked`)."""

    keys: torch.Tensor
    """``[tp, *keys.shape]`` int64: every rank's keys, rank-major."""
    pairs: torch.Tensor | None
    """``[tp, B, 2]`` float32 log-partition pairs, or None when none were sent."""
    ok: torch.Tensor | None
    """On a device: the checks' verdict as a bool tensor for :func:`merge_checked`; on the host None (they raised)."""
    vocab_total: int | torch.Tensor
    """The end of the valid vocabulary over all ranks (an int on the host, an int64 tensor on a device)."""


def exchange_checked(keys: torch.Tensor, group: Group, reduce: str, vocab_end: int, d2t, pairs=None, *,
                     vocab_start=0, debug: dict[str, int] | None = None):  # fmt: skip
    """The step's exchange (:func:`localargmax.collective.exchange_step`: the
    group checked first, and with ``debug`` the ranks' calls compared): this rank's keys (and, with ``pairs``, its
    log-partition pairs) behind a 3-word header
    (:func:`localargmax.collective.frame_keys`), then the checks that use only
    what every rank received, so all ranks reach the same verdict and none is
    left inside a later collective:

    * every rank sent as many keys as this one (same batch size and ``k``),
      and log-partition pairs if and only if this one did;
    * every nonzero key decodes to an id below ``vocab_total``, the end of the
      valid vocabulary over all ranks (a corrupt exchange cannot yield an id
      outside the vocabulary);
    * ``d2t``, if given, has one entry per draft id: exactly ``vocab_total``.

    Returns an :class:`Exchange` ``(keys, pairs, ok, vocab_total)``: on the
    host (CPU, eager) the checks raise ValueError at once, ``ok`` is None and
    ``vocab_total`` an int; on a device (or under torch.compile) ``ok`` is a
    bool tensor for :func:`merge_checked` (no host synchronisation) and
    ``vocab_total`` an int64 tensor.
    """
    if pairs is not None and reduce != "all_gather":
        raise ValueError(
            f"log-probabilities need every rank's log-partition pair: use reduce='all_gather', got {reduce!r}"
        )
    n = keys.numel()
    size = n + 1 + (PAIRS_FLAG if pairs is not None else 0)
    gathered = exchange_step(frame_keys(keys, vocab_end, pairs), group, reduce, vocab_start=vocab_start, debug=debug)
    # The header at a fixed offset, the keys and pairs behind it: no batch-derived index (one graph for every
    # batch size under torch.compile), and ``size`` compared as a tensor, which guards on nothing.
    header = gathered[:, :HEADER_LEN]
    body = gathered[:, HEADER_LEN : HEADER_LEN + n].reshape(gathered.shape[0], *keys.shape)
    got_pairs = words_to_pairs(gathered[:, HEADER_LEN + n :]) if pairs is not None else None
    if not host_checks(keys):
        sizes, neg_sizes, ends = header.unbind(1)
        vocab_total = ends.max()
        out_of_range = (body != 0) & (key_index(body) >= vocab_total)
        ok = (sizes == size).all() & (neg_sizes == -size).all() & ~out_of_range.any()
        if d2t is not None:
            ok = ok & (vocab_total == d2t.shape[0])
        return Exchange(body, got_pairs, ok, vocab_total)
    # On the host: the headers as Python ints (one read), few tensor ops.
    header = header.tolist()
    if any(h[0] != size or h[1] != -size for h in header):
        flags = {h[0] >= PAIRS_FLAG for h in header} | {-h[1] >= PAIRS_FLAG for h in header}
        if len(flags) > 1:
            raise ValueError(
                "the TP ranks disagree on whether this step exchanges log-partition pairs: every rank must be "
                f"called with the same return_log_probs and return_log_odds (this rank sent pairs: {pairs is not None})"
            )
        sent = (
            [(h[0] - 1) % PAIRS_FLAG for h in header]
            if reduce == "all_gather"
            else f"between {(-header[0][1] - 1) % PAIRS_FLAG} and {(header[0][0] - 1) % PAIRS_FLAG}"
        )
        raise ValueError(
            f"the TP ranks disagree on the size of this step's key exchange: this rank sent {n} keys "
            f"(shape {tuple(keys.shape)}), the ranks sent {sent}; every rank must be called with the same batch size "
            "(and k). LOCALARGMAX_DEBUG=1 checks this before the collective and names the ranks."
        )
    vocab_total = max(h[2] for h in header)
    # index >= vocab_total  <=>  low half <= INDEX_MASK - vocab_total (key 0, "no entry", excluded)
    out_of_range = ((body & INDEX_MASK) <= INDEX_MASK - vocab_total) & (body != 0)
    if bool(out_of_range.any()):
        bad = int(key_index(body[out_of_range][:1]))
        raise ValueError(
            f"a received key decodes to vocabulary id {bad}, outside the valid vocabulary [0, {vocab_total}) "
            "of the TP ranks: the key exchange was corrupted (ranks out of step?)"
        )
    if d2t is not None and d2t.shape[0] != vocab_total:
        raise ValueError(
            f"d2t has {d2t.shape[0]} entries but the draft vocabulary of the TP ranks has {vocab_total} ids "
            f"[0, {vocab_total}): d2t must be 1-D [draft_vocab_size={vocab_total}], one entry per draft id, as "
            'localargmax.validate_d2t requires (DESIGN.md, "d2t")'
        )
    return Exchange(body, got_pairs, None, vocab_total)


def merge_checked(keys: torch.Tensor, d2t, ok):
    """``merge_keys(keys, d2t)`` with the ids passed through :func:`_assert_ids`."""
    ids, values = merge_keys(keys, d2t)
    return _assert_ids(ids, ok), values


def _assert_ids(ids: torch.Tensor, ok) -> torch.Tensor:
    """On a device: one asynchronous assert (no host sync) that the exchange
    checks passed and every id is valid (``merge_keys`` gives -1 on CUDA for a
    row with no valid entry or a draft id outside ``d2t``). It surfaces as a
    device-side assertion error at the next synchronisation."""
    if ok is not None:
        torch._assert_async(
            ok & (ids >= 0).all(), "localargmax: invalid key exchange or token id (see lm_head_argmax's Raises)"
        )
    return ids


def winning_rank(keys: torch.Tensor) -> torch.Tensor:
    """``[1, *rest]`` int64: per row, the rank whose key is the largest of
    ``keys [tp, *rest]`` (unsigned order: a signed argmax of the sign-flipped keys)."""
    return (keys ^ SIGN_FLIP).argmax(dim=0, keepdim=True)


def local_logits(hidden, weight, bias=None, num_valid=None, *, dtype=None, scale=1.0, soft_cap=None):
    """``[B, rows]`` logits of this shard, materialised (the paths that need
    them: :func:`localargmax.baselines`, ``VocabParallelLMHead.local_logits``,
    the filtered step's fallback): ``hidden @ weight.T`` in ``dtype`` (the
    inputs cast to it; default: as they are), ``+ bias`` (torch's type
    promotion), then vLLM's transform (``tanh(x / soft_cap) * soft_cap``,
    then ``* scale``); columns at or past ``num_valid`` set to -inf."""
    if dtype is not None:
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    if soft_cap:
        logits = torch.tanh(logits / soft_cap) * soft_cap
    if scale != 1.0:
        logits = logits * scale
    if num_valid is not None and num_valid < weight.shape[0]:
        logits[:, num_valid:] = float("-inf")
    return logits


def gather_logits(hidden, weight, *, vocab_start, num_valid, bias, group: Group, scale, soft_cap) -> torch.Tensor:
    """``[n, vocab]`` float32 logits of the rows ``hidden [n, H]`` over every
    rank (the filtered step's fallback, after its exchange has checked the
    group): this shard's :func:`local_logits` (transformed), gathered by
    :func:`localargmax.collective.exchange_logits`; NaN outside the valid
    vocabulary (the gaps between shards)."""
    shard_rows = weight.shape[0]
    logits = local_logits(hidden, weight, bias, dtype=torch.float32, scale=scale, soft_cap=soft_cap)
    debug = {"fallback rows": hidden.shape[0], "shard rows": shard_rows} if envs.LOCALARGMAX_DEBUG else None
    nv = shard_rows if num_valid is None else num_valid
    return exchange_logits(logits, group, vocab_start=vocab_start, num_valid=nv, debug=debug)


def vocab_end(weight, vocab_start: int, num_valid: int | None) -> int:
    """End of this shard's valid ids; 0 for an empty shard (it holds none)."""
    valid = weight.shape[0] if num_valid is None else num_valid
    return vocab_start + valid if valid else 0
