"""The whole local-argmax step of a vocab-parallel lm_head: fused local
kernel, one collective, merge, d2t."""

from __future__ import annotations

import math

import torch

from . import envs
from ._validation import check_d2t_arg, check_transform_args
from .collective import (
    HEADER_LEN,
    LOCAL_SHARD,
    PAIRS_FLAG,
    REDUCE_MODES,
    Group,
    check_group,
    check_step_consistency,
    exchange_keys,
    frame_keys,
    words_to_pairs,
)
from .ops import merge_keys, shard_argmax, shard_topk
from .packed_key import INDEX_MASK, SIGN_FLIP, key_index

PAYLOAD_INPUTS = ("batch size", "k", "return_log_probs", "return_log_odds", "reduce")
"""The inputs that change what a rank sends in a step's exchange (its size or
its collective): with ``LOCALARGMAX_DEBUG=1`` every step compares them, and
the shapes the merge assumes (:func:`_step_fields`), across the ranks first."""


def _step_fields(hidden, weight, d2t, k: int, reduce: str, log_probs: bool, log_odds: bool = False) -> dict[str, int]:
    """What every rank must agree on before the exchange, as ints: each of
    :data:`PAYLOAD_INPUTS`, then the hidden size, shard rows and d2t length."""
    shape = lambda t, d: t.shape[d] if isinstance(t, torch.Tensor) and t.dim() == 2 else -1  # noqa: E731
    return {
        "batch size": shape(hidden, 0),
        "k": k,
        "return_log_probs": int(bool(log_probs)),
        "return_log_odds": int(bool(log_odds)),
        "reduce": REDUCE_MODES.index(reduce) if reduce in REDUCE_MODES else -1,
        "hidden size": shape(hidden, 1),
        "shard rows": shape(weight, 0),
        "d2t length": d2t.shape[0] if isinstance(d2t, torch.Tensor) else -1,
    }


def _debug_check(group: Group, hidden, weight, d2t, k: int, reduce: str, log_probs: bool, log_odds=False) -> None:
    """With ``LOCALARGMAX_DEBUG=1``, all-gather what each rank was called with
    (:func:`_step_fields`) and raise ValueError on every rank if they differ
    (before the key exchange, which cannot survive ranks that disagree on its
    size). The one place every step calls."""
    if not envs.LOCALARGMAX_DEBUG:
        return
    fields = _step_fields(hidden, weight, d2t, k, reduce, log_probs, log_odds)
    names = [f"reduce ({', '.join(f'{i} = {m}' for i, m in enumerate(REDUCE_MODES))})" if n == "reduce" else n
             for n in fields]  # fmt: skip
    check_step_consistency(group, list(fields.values()), names)


def _host_checks(t: torch.Tensor) -> bool:
    """Whether a check may read ``t`` on the host: CPU tensors outside
    torch.compile. Elsewhere checks are folded into one device-side assert."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def _exchange_checked(keys: torch.Tensor, group: Group, reduce: str, vocab_end: int, d2t, pairs=None):
    """The step's exchange: this rank's keys (and, with ``pairs``, its
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

    Returns ``(keys [tp, *keys.shape], pairs [tp, B, 2] float32 or None,
    ok, vocab_total)``: on the host (CPU, eager) the checks raise ValueError
    at once, ``ok`` is None and ``vocab_total`` an int; on a device (or under
    torch.compile) ``ok`` is a bool tensor for :func:`_assert_ids` (no host
    synchronisation) and ``vocab_total`` an int64 tensor.
    """
    if pairs is not None and reduce != "all_gather":
        raise ValueError(
            f"log-probabilities need every rank's log-partition pair: use reduce='all_gather', got {reduce!r}"
        )
    n = keys.numel()
    size = n + 1 + (PAIRS_FLAG if pairs is not None else 0)
    gathered = exchange_keys(frame_keys(keys, vocab_end, pairs), group, reduce)
    # The header at a fixed offset, the keys and pairs behind it: no batch-derived index (one graph for every
    # batch size under torch.compile), and ``size`` compared as a tensor, which guards on nothing.
    header = gathered[:, :HEADER_LEN]
    body = gathered[:, HEADER_LEN : HEADER_LEN + n].reshape(gathered.shape[0], *keys.shape)
    got_pairs = words_to_pairs(gathered[:, HEADER_LEN + n :]) if pairs is not None else None
    if not _host_checks(keys):
        sizes, neg_sizes, ends = header.unbind(1)
        vocab_total = ends.max()
        out_of_range = (body != 0) & (key_index(body) >= vocab_total)
        ok = (sizes == size).all() & (neg_sizes == -size).all() & ~out_of_range.any()
        if d2t is not None:
            ok = ok & (vocab_total == d2t.shape[0])
        return body, got_pairs, ok, vocab_total
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
    return body, got_pairs, None, vocab_total


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


def log_probs_from_pairs(
    values: torch.Tensor, pairs: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    """Log-probabilities of transformed logits ``values`` from every rank's
    log-partition pair (DESIGN.md, "Log-probabilities"): with
    ``A = max_r ref_r`` and ``S = sum_r (others_r + [ref_r > -inf]) * exp((ref_r - A) / T)``
    (ranks in order 0, 1, ..., float32; a rank whose ``ref`` equals ``A``
    counts with factor 1, so ``+inf`` and all ``-inf`` rows stay exact), the
    result is ``(value - A) / T - log(S)``, i.e. ``value / T - logsumexp(x / T)``
    over the ranks' full unpadded vocabulary.

    Example::

        keys, pairs = shard_argmax(hidden, weight, log_partition=True)
        _, values = decode_keys(keys)
        log_probs = log_probs_from_pairs(values, pairs[None])  # one rank: [1, B, 2]

    Args:
        values: ``[B]`` or ``[B, k]`` float32 transformed logits.
        pairs: ``[tp, B, 2]`` float32 ``(ref, others)`` pairs, rank-major.
        temperature: optional ``[B]`` float32; rows with ``T > 0`` use ``T``,
            rows with ``T == 0`` (greedy) and ``None`` use 1.

    Returns:
        float32 log-probabilities, the shape of ``values``: NaN for a row with
        a NaN logit anywhere (as ``torch.log_softmax``), NaN for a ``+inf``
        value and ``-inf`` beside one, NaN for an all ``-inf`` row.
    """
    ref, others = pairs[..., 0], pairs[..., 1]
    top = ref.max(dim=0).values  # NaN anywhere -> NaN
    t = None if temperature is None else torch.where(temperature > 0, temperature, 1.0)
    total = torch.zeros_like(top)
    for r in range(pairs.shape[0]):  # a fixed order: the same bits on every rank
        d = ref[r] - top if t is None else (ref[r] - top) / t
        own = others[r] + (ref[r] > -math.inf).to(others.dtype)  # the rank's best entry counts 1 (0 if -inf)
        total = total + own * torch.where(ref[r] == top, 1.0, torch.exp(d))
    if values.dim() == 2:
        top, total = top[:, None], total[:, None]
        t = None if t is None else t[:, None]
    d = values - top if t is None else (values - top) / t
    return d - torch.log(total)


def log_odds_from_pairs(keys: torch.Tensor, pairs: torch.Tensor, temperature: torch.Tensor | None = None):
    """The argmax's log-odds from every rank's keys and log-partition pairs
    (DESIGN.md, "Log-odds"): ``-log Σ_{z ≠ argmax} exp((x_z - x_max) / T)``
    over the ranks' full unpadded vocabulary, with the winning rank ``w``
    (the largest key) adding its ``others`` and every other rank ``r`` its
    ``others_r + 1`` (0 for an empty or all ``-inf`` shard) times
    ``exp((ref_r - ref_w) / T)`` (1 when equal), in rank order, float32. No
    ``total - 1``: a confident row keeps its digits.

    Example::

        keys, pairs = shard_argmax(hidden, weight, log_partition=True, temperature=t)
        log_odds = log_odds_from_pairs(keys[None], pairs[None], t)  # one rank

    Args:
        keys: ``[tp, B]`` int64 packed keys (each rank's argmax), rank-major.
        pairs: ``[tp, B, 2]`` float32 ``(ref, others)`` pairs computed at ``temperature``.
        temperature: optional ``[B]`` float32 (rows with ``T <= 0``, and
            ``None``, use 1); the one the pairs were computed at.

    Returns:
        ``[B]`` float32: ``<= 0`` where the maximum is tied, ``+inf`` where
        every other entry is ``-inf`` (or the vocabulary has one id), NaN for
        a row whose maximum is NaN, ``+inf`` or ``-inf`` (a NaN logit
        anywhere, an all ``-inf`` row).
    """
    ref, others = pairs[..., 0], pairs[..., 1]
    winner = (keys ^ SIGN_FLIP).argmax(dim=0, keepdim=True)  # signed max == unsigned max: the argmax's rank
    top = ref.gather(0, winner)[0]
    t = None if temperature is None else torch.where(temperature > 0, temperature, 1.0)
    total = torch.zeros_like(top)
    ranks = torch.arange(pairs.shape[0], device=keys.device)
    for r in range(pairs.shape[0]):  # a fixed order: the same bits on every rank
        d = ref[r] - top if t is None else (ref[r] - top) / t
        own = others[r] + ((ref[r] > -math.inf) & (ranks[r] != winner[0])).to(others.dtype)
        total = total + own * torch.where(ref[r] == top, 1.0, torch.exp(d))
    return torch.where(top.isfinite(), -torch.log(total), math.nan)


def _vocab_end(weight, vocab_start: int, num_valid: int | None) -> int:
    """End of this shard's valid ids; 0 for an empty shard (it holds none)."""
    valid = weight.shape[0] if num_valid is None else num_valid
    return vocab_start + valid if valid else 0


def lm_head_argmax(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    *,
    vocab_start: int = 0,
    num_valid: int | None = None,
    bias: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    group: Group = None,
    reduce: str = "all_gather",
    return_log_probs: bool = False,
    logit_scale: float = 1.0,
    soft_cap: float | None = None,
    return_log_odds: bool = False,
    temperature=None,
):
    """Greedy token ids of a vocab-parallel lm_head, without gathering logits.

    Every TP rank calls this with its own shard: each reduces its shard to one
    packed key per row (:func:`localargmax.shard_argmax`), the ranks exchange
    ``tp`` keys per row instead of ``rows`` logits, and every rank merges them
    to the same ids (:func:`localargmax.merge_keys`).

    Example::

        shard = localargmax.shard_vocab(vocab_size, rank, world_size)
        ids = lm_head_argmax(hidden, weight, vocab_start=shard.vocab_start,
                             num_valid=shard.num_valid, group=tp_group)  # [B], same on every rank

    Args:
        hidden: ``[B, H]`` float32 / bfloat16 / float16, the same on every rank.
        weight: ``[rows, H]`` this rank's shard, rows contiguous.
        vocab_start: global index of this rank's row 0 (:func:`localargmax.shard_vocab`).
        num_valid: this rank's vocabulary rows (the rest is padding); default ``rows``.
        bias: ``[rows]`` bias shard, or None.
        d2t: ``[draft_vocab]`` int64 EAGLE-3 offsets, or None; ids are then
            ``k + d2t[k]``. Checked once at load time
            (:func:`localargmax.validate_d2t`), not per step.
        group: None (world size 1), a ``torch.distributed.ProcessGroup``, or a
            callable all-gather: handed ``[L]`` int64 (``L =
            localargmax.payload_length(B, 1, return_log_probs or return_log_odds)``), it returns
            ``[tp, L]``. None or a group of one rank with ``vocab_start > 0``
            is refused (a forgotten ``init_process_group``);
            :data:`localargmax.LOCAL_SHARD` returns this shard's own winners
            on purpose.
        reduce: ``"all_gather"`` or ``"all_reduce"`` (MAX of the keys); the same ids.
        return_log_probs: also return each id's log-probability over the full
            unpadded vocabulary, from log-partition pairs computed in the same
            pass and sent in the same exchange (one more word per row); needs
            ``"all_gather"``. Accuracy: DESIGN.md, "Log-probabilities".
        logit_scale: finite float > 0, with ``return_log_probs`` / ``return_log_odds``
            only (vLLM's order: soft-cap, then scale).
        soft_cap: None or a finite float > 0, likewise.
        return_log_odds: also return the argmax's log-odds at ``temperature``,
            ``-log Σ_{z ≠ argmax} exp((x_z - x_max) / T)`` over the full
            unpadded vocabulary of the transformed logits ``x`` (what vLLM's
            adaptive verification estimates acceptance from; DESIGN.md,
            "Log-odds"), from the same pairs and exchange as the
            log-probabilities: one word per row beside the key, with or
            without ``return_log_probs``. Needs ``"all_gather"``.
        temperature: with ``return_log_odds`` only: a finite float or a
            float32 tensor ``[B]`` (or ``[]``) on ``hidden``'s device; rows
            with ``T <= 0`` use 1 (vLLM's rule). The log-probabilities, if
            asked for too, are then under ``softmax(x / T)``. Default 1.

    Returns:
        ``[B]`` int64 ids, identical on every rank: ``torch.argmax`` of the full
        unpadded logits (ties to the smallest index, NaN wins); then, in this
        order, ``log_probs [B] float32`` with ``return_log_probs`` and
        ``log_odds [B] float32`` with ``return_log_odds`` (a tuple when
        either is asked for). Log-odds: ``<= 0`` for a tied maximum, NaN for
        a row whose maximum is NaN or infinite (an all ``-inf`` row included)
        and, on a device, for a non-finite temperature.

    Raises:
        TypeError / ValueError naming the argument for malformed inputs. After
        the exchange, from what every rank received (so all reach one
        verdict): ValueError on CPU, one ``torch._assert_async`` on CUDA, if
        the ranks sent different numbers of keys, a key decodes outside the
        vocabulary or ``d2t`` does not cover it. With ``LOCALARGMAX_DEBUG=1``,
        ValueError naming the input and the ranks that disagree, before the
        exchange. A rank that never arrives is the group's timeout. ValueError
        for a ``temperature`` without ``return_log_odds``, or a non-finite
        one known on the host; ValueError naming ``init_process_group`` for
        ``group`` None (or of one rank) with ``vocab_start > 0``.
    """
    if not isinstance(return_log_odds, bool):
        raise TypeError(f"return_log_odds must be a bool, got {type(return_log_odds).__name__}")
    t = _log_odds_temperature(temperature, hidden) if return_log_odds else None
    if temperature is not None and not return_log_odds:
        raise ValueError(
            "temperature applies to the log-odds (and with them the log-probabilities): pass return_log_odds=True "
            "(the argmax does not depend on it)"
        )
    _, gathered, got_pairs, ok = _step(
        shard_argmax, (), hidden, weight, vocab_start, num_valid, bias, d2t, group, reduce, return_log_probs,
        logit_scale, soft_cap, op_kw={"temperature": t} if t is not None else {}, odds=return_log_odds,
    )  # fmt: skip
    ids, values = _merge_checked(gathered, d2t, ok)
    if not (return_log_probs or return_log_odds):
        return ids
    out = (ids, log_probs_from_pairs(values, got_pairs, t)) if return_log_probs else (ids,)
    if return_log_odds:
        log_odds = log_odds_from_pairs(gathered, got_pairs, t)
        out = (*out, log_odds if t is None else torch.where(t.isfinite(), log_odds, math.nan))
    return out


def _log_odds_temperature(temperature, hidden) -> torch.Tensor | None:
    """``lm_head_argmax``'s ``temperature`` as the float32 ``[B]`` tensor the
    kernel takes (None: 1). Finiteness is checked where the values are on the
    host (a Python number, a CPU tensor outside torch.compile)."""
    if temperature is None:
        return None
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        return None  # the op's own checks name hidden
    if isinstance(temperature, torch.Tensor):
        if not temperature.is_floating_point():
            raise TypeError(f"temperature must be a float32 tensor [batch={hidden.shape[0]}], got {temperature.dtype}")
        if temperature.dim() == 0:
            temperature = temperature.reshape(1).expand(hidden.shape[0])
        if temperature.device != hidden.device:
            raise ValueError(f"temperature is on {temperature.device} but hidden is on {hidden.device}")
        if _host_checks(temperature) and not bool(temperature.isfinite().all()):
            raise ValueError(f"temperature must be finite (T <= 0 means 1), got {temperature.tolist()}")
        return temperature.to(torch.float32).contiguous()
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature):
        raise ValueError(
            f"temperature must be a finite float (T <= 0 means 1) or a float32 tensor [B], got {temperature!r}"
        )
    return torch.full((hidden.shape[0],), float(temperature), dtype=torch.float32, device=hidden.device)


def _step(
    op, op_args, hidden, weight, vocab_start, num_valid, bias, d2t, group, reduce, lp, scale, cap, k=1, op_kw=None,
    odds=False, sampling=False, vocab_total=False,
):  # fmt: skip
    """One rank's step up to the merge, shared by the ``lm_head_*`` ops:
    the argument checks, ``op(hidden, weight, *op_args, ...)`` (the rank's
    fused kernel, with its log-partition pairs for the log-probabilities
    ``lp`` or the log-odds ``odds``), ``d2t`` checked, the checked exchange.
    ``sampling``: the transform (``scale``, ``cap``) changes the ids, so it
    is taken without ``lp`` too (the op's ``_lse`` variant runs; its pairs
    stay home). Returns ``(keys, gathered keys, gathered pairs or None,
    ok)``, and ``vocab_total`` after them when asked (see
    :func:`_exchange_checked`)."""
    _check_log_probs_args(lp, scale, cap, reduce, odds, sampling)
    _debug_check(group, hidden, weight, d2t, k, reduce, lp, odds)
    kw = {"vocab_start": vocab_start, "num_valid": num_valid, "bias": bias, "scale": scale, "soft_cap": cap}
    kw.update(op_kw or {})
    send_pairs = lp or odds  # either needs the pairs
    lse = send_pairs or scale != 1.0 or cap is not None  # (only sampling passes a transform without pairs)
    out = op(hidden, weight, *op_args, log_partition=lse, **kw)
    check_group(group, vocab_start=vocab_start)  # after the op has checked its arguments
    keys, pairs = out if lse else (out, None)
    if d2t is not None:
        check_d2t_arg(d2t, keys.device)
    end = _vocab_end(weight, vocab_start, num_valid)
    body, got_pairs, ok, total = _exchange_checked(keys, group, reduce, end, d2t, pairs if send_pairs else None)
    return (keys, body, got_pairs, ok, total) if vocab_total else (keys, body, got_pairs, ok)


def _merge_checked(keys: torch.Tensor, d2t, ok):
    """``merge_keys(keys, d2t)`` with the ids passed through :func:`_assert_ids`."""
    ids, values = merge_keys(keys, d2t)
    return _assert_ids(ids, ok), values


def _check_log_probs_args(return_log_probs, logit_scale, soft_cap, reduce, return_log_odds=False, sampling=False):
    """The log-probability keywords. A transform without log-probabilities
    (or log-odds) is refused where it cannot change the ids (argmax, top-k);
    ``sampling`` takes it: it changes ``softmax(x / T)``, so the samples."""
    if not isinstance(return_log_probs, bool):
        raise TypeError(f"return_log_probs must be a bool, got {type(return_log_probs).__name__}")
    check_transform_args(logit_scale, soft_cap)
    transform = logit_scale != 1.0 or soft_cap is not None
    if transform and not (return_log_probs or return_log_odds or sampling):
        raise ValueError(
            f"logit_scale={logit_scale!r} and soft_cap={soft_cap!r} apply to the log-probabilities (and log-odds) "
            "only: pass return_log_probs=True (a positive scale and a soft-cap do not change the argmax or top-k ids)"
        )
    for name, wanted in (("return_log_probs", return_log_probs), ("return_log_odds", return_log_odds)):
        if wanted and reduce != "all_gather":
            raise ValueError(
                f"{name}=True needs every rank's log-partition pair: use reduce='all_gather', got {reduce!r}"
            )


def _resolve_temperature(temperature, hidden: torch.Tensor) -> torch.Tensor:
    """``temperature`` (a Python number or a tensor ``[B]`` / ``[]``) as the
    float32 ``[B]`` tensor :func:`localargmax.shard_sample` takes. Its shape
    and device are checked here, and its values wherever they are known on the
    host: a Python number, a CPU tensor outside torch.compile (before the cast
    to float32: a tiny negative float64 would round to -0.0). The filtered
    step never runs shard_sample, so these checks are its only ones; compiled,
    the CPU kernel reads the values (CUDA: the step's device-side assert)."""
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"hidden must be a torch.Tensor [batch, hidden_size], got {type(hidden).__name__}")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be 2-D [batch, hidden_size], got shape {tuple(hidden.shape)}")
    if isinstance(temperature, torch.Tensor):
        if not temperature.is_floating_point():
            raise TypeError(f"temperature must be a float32 tensor [batch={hidden.shape[0]}], got {temperature.dtype}")
        if temperature.dim() == 0:
            temperature = temperature.reshape(1).expand(hidden.shape[0])
        if temperature.dim() != 1 or temperature.shape[0] != hidden.shape[0]:
            raise ValueError(
                f"temperature must be 1-D [batch={hidden.shape[0]}] (or 0-d), got shape {tuple(temperature.shape)}"
            )
        if temperature.device != hidden.device:
            raise ValueError(f"temperature is on {temperature.device} but hidden is on {hidden.device}")
        if _host_checks(temperature) and not bool(((temperature >= 0) & temperature.isfinite()).all()):
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature.tolist()}")
        return temperature.to(torch.float32).contiguous()
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise ValueError(
            f"temperature must be a finite float >= 0 (0 = greedy) or a float32 tensor [B], got {temperature!r}"
        )
    return torch.full((hidden.shape[0],), float(temperature), dtype=torch.float32, device=hidden.device)


def lm_head_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    vocab_start: int = 0,
    num_valid: int | None = None,
    bias: torch.Tensor | None = None,
    d2t: torch.Tensor | None = None,
    group: Group = None,
    return_log_probs: bool = False,
    logit_scale: float = 1.0,
    soft_cap: float | None = None,
):
    """Global top-k of a vocab-parallel lm_head (tree drafting), without
    gathering logits: each rank's fused top-k (:func:`localargmax.shard_topk`),
    one all-gather of ``k`` keys per row per rank (``8·k·B`` bytes sent), and a
    merge that keeps the ``k`` largest keys.

    Same answer as ``torch.topk(logits, k, sorted=True)`` on the full unpadded
    logits, ties ordered by smallest index, NaN largest.

    Example::

        ids = lm_head_topk(hidden, weight, 4, vocab_start=shard.vocab_start,
                           num_valid=shard.num_valid, group=tp_group)  # [B, 4]

    Args:
        hidden, weight, vocab_start, num_valid, bias, d2t, group: as in
            :func:`lm_head_argmax` (a callable group gets ``[L]``, ``L =
            payload_length(B, k, return_log_probs)``, and returns ``[tp, L]``).
        k: ``1 <= k <= 64``, at most the valid vocabulary size.
        return_log_probs, logit_scale, soft_cap: as in :func:`lm_head_argmax`
            (``8·k·B + 8·B + 24`` bytes per rank).

    Returns:
        ``(ids [B, k] int64, values [B, k] float32)``: ids (target ids with
        ``d2t``) in descending order of their exact float32 logits ``values``.
        With ``return_log_probs``, ``values`` are the log-probabilities
        ``x - logsumexp(x)`` of the transformed logits ``x``.

    Raises:
        TypeError / ValueError for malformed inputs; ValueError when ``k``
        exceeds the valid vocabulary (on CPU; on CUDA such slots get id -1).
    """
    one_shard = group is None or group is LOCAL_SHARD
    if one_shard and isinstance(num_valid, int) and isinstance(k, int) and 1 <= k and num_valid < k:
        raise ValueError(f"k={k} exceeds the valid vocabulary (num_valid={num_valid})")
    keys, gathered, got_pairs, ok = _step(
        shard_topk, (k,), hidden, weight, vocab_start, num_valid, bias, d2t, group, "all_gather", return_log_probs,
        logit_scale, soft_cap, k,
    )  # fmt: skip
    batch = keys.shape[0]
    if batch == 0:
        return keys.new_empty((0, k)), keys.new_empty((0, k), dtype=torch.float32)
    candidates = gathered.permute(1, 0, 2).reshape(batch, -1) ^ SIGN_FLIP  # signed order == unsigned order
    merged = candidates.topk(k, dim=1, sorted=True).values ^ SIGN_FLIP
    if _host_checks(merged) and bool((merged == 0).any()):
        raise ValueError(f"k={k} exceeds the valid vocabulary summed over all ranks")
    # merge_keys of [1, B*k] decodes every kept key and applies d2t (range-checked on CPU)
    ids, values = _merge_checked(merged.reshape(1, -1), d2t, ok)
    values = values.view(batch, k)
    if return_log_probs:
        values = log_probs_from_pairs(values, got_pairs)
    return ids.view(batch, k), values
