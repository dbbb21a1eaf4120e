"""The planned step (DESIGN.md, "The planned step"): everything fixed for a
run is checked once, when the draft model loads (:class:`StepPlan`); a call
(:meth:`StepPlan.run`) checks only what can change per call and dispatches
at most four ops: the rank's fused op writing its frame
(``localargmax::step_frame``), the collective, the merge
(``localargmax::merge_frames``: the headers checked, the winner over the
ranks, ``d2t``, log-probabilities / log-odds) and, on a device, the step's one
asynchronous validity check (``torch._assert_async``). The functional steps
(:func:`localargmax.lm_head_argmax`, :func:`localargmax.lm_head_topk`,
:func:`localargmax.lm_head_sample` without filters) build a plan and run it
once."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from . import _ext, _validation, envs  # noqa: F401  (_ext registers torch.ops.localargmax)
from ._validation import (
    LOG_ODDS_TEMPERATURE,
    TEMPERATURE,
    check_d2t_arg,
    check_hidden_arg,
    check_noise,
    check_path_arg,
    check_seed_offset,
    check_topk_arg,
    check_weight_args,
    row_param,
)
from .collective import (
    LOCAL_SHARD,
    Group,
    _is_nccl_communicator,
    check_group,
    check_step_consistency,
    exchange_keys,
    require_cupy_nccl,
)

STEP_KINDS = ("argmax", "topk", "sample")
"""What a plan computes: the greedy ids, the top-k ids, or Gumbel-max samples."""

_MODES = {"argmax": 0, "topk": 1, "sample": 2}  # csrc/common/step_merge.h's StepMode
_HEADER = 3
_INVALID = "localargmax: invalid key exchange or token id (see lm_head_argmax's Raises)"


class StepPlan:
    """One TP rank's vocab-parallel lm_head step, planned once and run per call.

    Example::

        shard = localargmax.shard_vocab(vocab_size, rank, world_size)
        plan = localargmax.StepPlan(weight, vocab_start=shard.vocab_start, num_valid=shard.num_valid,
                                    d2t=d2t, target_vocab_size=target_vocab, group=tp_group, max_batch=512)
        ids = plan.run(hidden)  # [B] int64, the same on every rank; B <= 512

    At plan time (raising TypeError / ValueError naming the argument): the
    weight's layout, the shard (``vocab_start``, ``num_valid``), the bias, the
    transform, ``d2t`` (its dtype and device; with ``target_vocab_size`` its
    contents, as :func:`localargmax.validate_d2t`), the group
    (:func:`localargmax.collective.check_group`), ``kind`` / ``k`` and the
    outputs. Per call (:meth:`run`): hidden's shape, dtype and device, the
    batch against ``max_batch``, and the per-row parameters of sampling.

    Args:
        weight: ``[rows, H]`` float32 / bfloat16 / float16 shard, rows contiguous.
        kind: ``"argmax"`` (:func:`localargmax.lm_head_argmax`), ``"topk"``
            (``k`` ids per row, :func:`localargmax.lm_head_topk`) or
            ``"sample"`` (:func:`localargmax.lm_head_sample` without filters).
        k: ``1 <= k <= 64``, top-k only.
        vocab_start, num_valid, bias, group, reduce, logit_scale, soft_cap:
            as in :func:`localargmax.lm_head_argmax`.
        d2t: ``[draft_vocab]`` int64 on the weight's device, or None.
        target_vocab_size: the target vocabulary's size, or None: with
            ``d2t``, every ``k + d2t[k]`` is checked to lie in ``[0,
            target_vocab_size)`` now (a host read of d2t, once), and each
            call's ids again in the merge. Without it a mapped id ``< 0`` is
            still an error (DESIGN.md, "d2t").
        return_log_probs, return_log_odds: the outputs, as in the steps
            (log-odds: argmax only).
        max_batch: None (each call allocates its gather buffer) or the
            largest batch: the all-gather then writes into one buffer held
            by the plan, and a larger batch is a ValueError.
        path: the kernel, as in :func:`localargmax.shard_argmax`.

    Raises:
        TypeError / ValueError naming the argument, as listed above.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        *,
        kind: str = "argmax",
        k: int = 1,
        vocab_start: int = 0,
        num_valid: int | None = None,
        bias: torch.Tensor | None = None,
        d2t: torch.Tensor | None = None,
        target_vocab_size: int | None = None,
        group: Group = None,
        reduce: str = "all_gather",
        return_log_probs: bool = False,
        return_log_odds: bool = False,
        logit_scale: float = 1.0,
        soft_cap: float | None = None,
        max_batch: int | None = None,
        path: str = "auto",
    ):
        if kind not in STEP_KINDS:
            raise ValueError(f"kind must be one of {STEP_KINDS}, got {kind!r}")
        if num_valid is None:
            num_valid = weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else 0
        check_weight_args(weight, bias, vocab_start, num_valid)
        check_path_arg(path, weight.device)
        if kind == "topk":
            check_topk_arg(k)
        elif k != 1:
            raise ValueError(f"k is top-k's (kind='topk'), got k={k!r} with kind={kind!r}")
        for name, flag in (("return_log_probs", return_log_probs), ("return_log_odds", return_log_odds)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        if return_log_odds and kind != "argmax":
            raise ValueError("return_log_odds is the argmax's (kind='argmax')")
        _validation.check_transform_args(logit_scale, soft_cap, "logit_scale")
        transform = logit_scale != 1.0 or soft_cap is not None
        if transform and not (return_log_probs or return_log_odds or kind == "sample"):
            raise ValueError(
                f"logit_scale={logit_scale!r} and soft_cap={soft_cap!r} apply to the log-probabilities (and log-odds) "
                "only: pass return_log_probs=True (a positive scale and a soft-cap do not change the argmax or top-k "
                "ids)"
            )
        if reduce not in ("all_gather", "all_reduce"):
            raise ValueError(f"reduce must be one of ('all_gather', 'all_reduce'), got {reduce!r}")
        for name, wanted in (("return_log_probs", return_log_probs), ("return_log_odds", return_log_odds)):
            if wanted and reduce != "all_gather":
                raise ValueError(
                    f"{name}=True needs every rank's log-partition pair: use reduce='all_gather', got {reduce!r}"
                )
        if reduce == "all_reduce" and kind == "topk":
            raise ValueError("reduce='all_reduce' merges top-1 keys only: top-k needs 'all_gather'")
        if d2t is not None:
            check_d2t_arg(d2t, weight.device)
            if target_vocab_size is not None:
                from .d2t import validate_d2t

                validate_d2t(d2t, d2t.shape[0], target_vocab_size)
        if target_vocab_size is not None and (
            isinstance(target_vocab_size, bool) or not isinstance(target_vocab_size, int) or target_vocab_size < 1
        ):
            raise ValueError(f"target_vocab_size must be None or an int >= 1, got {target_vocab_size!r}")
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 0):
            raise ValueError(f"max_batch must be None or an int >= 0, got {max_batch!r}")
        check_group(group, vocab_start=vocab_start)
        if kind == "topk" and (group is None or group is LOCAL_SHARD) and num_valid < k:
            raise ValueError(f"k={k} exceeds the valid vocabulary (num_valid={num_valid})")
        self.weight, self.bias, self.d2t, self.group = weight, bias, d2t, group
        self.kind, self.k, self.reduce, self.path = kind, k, reduce, path
        self.vocab_start, self.num_valid, self.target_vocab_size = vocab_start, num_valid, target_vocab_size
        self.return_log_probs, self.return_log_odds = return_log_probs, return_log_odds
        self.logit_scale, self.soft_cap, self.max_batch = logit_scale, soft_cap, max_batch
        self._mode = _MODES[kind]
        self._pairs = return_log_probs or return_log_odds
        self._lse = self._pairs or transform
        self._flip = reduce == "all_reduce"
        self._world = _world_size(group, weight)
        self._buffer: torch.Tensor | None = None  # the gathered frames' words, for max_batch rows
        self._views: dict[int, torch.Tensor] = {}  # batch -> [tp * words] view of _buffer
        self._temperatures: dict[tuple[float, int], torch.Tensor] = {}  # (T, batch) -> [batch] float32

    def frame_words(self, batch: int) -> int:
        """Int64 words one rank's frame holds for ``batch`` rows (:func:`localargmax.payload_length`)."""
        return _HEADER + batch * self.k + (batch if self._pairs else 0)

    def run(self, hidden: torch.Tensor, *, temperature=None, seed: int = 0, offset: int = 0, noise=None):
        """One step: this rank's fused op, the exchange, the merge.

        Args:
            hidden: ``[B, H]`` in the weight's dtype and on its device, ``B <=
                max_batch`` when the plan has one; the same on every rank.
            temperature: sampling: a finite float ``>= 0`` or a float32 ``[B]``
                tensor (0 = greedy); argmax with ``return_log_odds``: the
                log-odds' ``T`` (``T <= 0`` means 1), default 1; else None.
            seed, offset, noise: sampling's noise, as in :func:`localargmax.lm_head_sample`.

        Returns:
            As the step of the plan's ``kind``: ``ids`` (``[B]`` int64, top-k
            ``[B, k]``), then log-probabilities and log-odds when planned;
            top-k ``(ids, values)``.

        Raises:
            TypeError / ValueError naming the argument for a malformed
            ``hidden`` or per-row parameter; ValueError (host) or the step's
            device-side assert (device) for an exchange that fails its checks
            or an id that ``d2t`` maps outside the target vocabulary.
        """
        check_hidden_arg(hidden, self.weight)
        batch = hidden.shape[0]
        if self.max_batch is not None and batch > self.max_batch:
            raise ValueError(f"hidden has {batch} rows but this plan was made for max_batch={self.max_batch}")
        t, noise_seed, noise_pos, debug = self._row_args(hidden, temperature, seed, offset, noise)
        path = self.path
        if path == "auto" and hidden.device.type == "cuda":
            from . import dispatch

            path = dispatch.cuda_path(hidden, self.weight)
        frame = torch.ops.localargmax.step_frame.default(
            hidden, self.weight, self.bias, self.vocab_start, self.num_valid, self._mode, self.k, t, seed, offset,
            float(self.logit_scale), float(self.soft_cap or 0.0), self._lse, self._pairs, self._flip, path,
            noise_seed, noise_pos,
        )  # fmt: skip
        frames = self._exchange(frame, batch, hidden, debug)
        host = _validation.host_checks(hidden)
        merge_t = t if (self._pairs and t is not None) else None
        ids, values, log_probs, log_odds, ok = torch.ops.localargmax.merge_frames.default(
            frames, batch, self.k, self._pairs, self._mode, self.d2t, self.target_vocab_size or 0, merge_t,
            self.return_log_probs, self.return_log_odds, self._flip, host,
        )  # fmt: skip
        if not host:
            torch._assert_async(ok, _INVALID)
        if self.kind == "topk":
            return ids, log_probs if self.return_log_probs else values
        if not self._pairs:
            return ids
        out = (ids, log_probs) if self.return_log_probs else (ids,)
        return (*out, log_odds) if self.return_log_odds else out

    def _row_args(self, hidden, temperature, seed, offset, noise):
        """The per-call parameters: the temperature as ``[B]`` float32 (or
        None), vLLM's noise tensors, and the ``LOCALARGMAX_DEBUG`` fields."""
        noise_seed = noise_pos = None
        debug = {} if envs.LOCALARGMAX_DEBUG else None
        if self.kind == "sample":
            t = self._temperature(temperature, hidden)
            check_seed_offset(seed, offset)
            if debug is not None:
                debug.update({"seed": seed, "offset": offset, "fallback": 0, "temperature": t})
            if noise is not None:
                noise = check_noise(noise, hidden)
                noise_seed, noise_pos = noise.seed, noise.pos
                if debug is not None:
                    debug.update({"noise seed": noise.seed, "noise pos": noise.pos})
            return t, noise_seed, noise_pos, debug
        if noise is not None:
            raise ValueError("noise is sampling's (kind='sample')")
        if temperature is not None and not self.return_log_odds:
            raise ValueError(
                "temperature applies to the log-odds (and with them the log-probabilities): pass return_log_odds=True "
                "(the argmax does not depend on it)"
            )
        t = row_param(temperature, "temperature", hidden, LOG_ODDS_TEMPERATURE) if temperature is not None else None
        return t, None, None, debug

    def _temperature(self, temperature, hidden) -> torch.Tensor:
        """Sampling's ``[B]`` float32 temperature; a number's tensor made once per (value, batch) (eager)."""
        if isinstance(temperature, torch.Tensor) or torch.compiler.is_compiling():
            return row_param(temperature, "temperature", hidden, TEMPERATURE, optional=False)
        key = (temperature, hidden.shape[0])
        t = self._temperatures.get(key) if isinstance(temperature, (int, float)) else None
        if t is None:
            t = row_param(temperature, "temperature", hidden, TEMPERATURE, optional=False)
            if len(self._temperatures) < 64:
                self._temperatures[key] = t
        return t

    def _exchange(self, frame: torch.Tensor, batch: int, hidden, debug) -> torch.Tensor:
        """Every rank's frame: ``[tp * words]`` (or ``[tp, words]`` from a
        callable) after the collective; this rank's alone at world size 1."""
        group = self.group
        if debug is not None:
            from .engine import step_fields

            fields = step_fields(hidden, self.weight, self.d2t, self.k, self.reduce, self.return_log_probs,
                                 self.return_log_odds, debug)  # fmt: skip
            check_step_consistency(group, list(fields.values()), list(fields))
        if self._world == 1:
            return frame
        if isinstance(group, dist.ProcessGroup):
            if torch.compiler.is_compiling():
                if self._flip:
                    return funcol.wait_tensor(funcol.all_reduce(frame, "max", group))
                gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
                return funcol.wait_tensor(gather(frame, 0, group))
            if self._flip:
                dist.all_reduce(frame, dist.ReduceOp.MAX, group)
                return frame
            out = self._gather_buffer(batch, frame)
            dist.all_gather_into_tensor(out, frame, group)
            return out
        if _is_nccl_communicator(group):
            return exchange_keys(frame, group, self.reduce)
        if callable(group):
            if self._flip:
                raise ValueError("a callable group is an all-gather: use reduce='all_gather'")
            gathered = group(frame)
            if not isinstance(gathered, torch.Tensor) or gathered.dim() != 2 or gathered.shape[1] < frame.shape[0]:
                shape = tuple(gathered.shape) if isinstance(gathered, torch.Tensor) else type(gathered).__name__
                raise ValueError(
                    f"the group callable must return [tp, {frame.shape[0]}], an all-gather of the ({frame.shape[0]},) "
                    f"int64 tensor it is given, got {shape}"
                )
            return gathered
        raise TypeError(
            "group must be None, localargmax.LOCAL_SHARD, a torch.distributed.ProcessGroup, a "
            f"cupy.cuda.nccl.NcclCommunicator or a callable all_gather(keys [B]) -> [tp, B], got {type(group).__name__}"
        )

    def _gather_buffer(self, batch: int, frame: torch.Tensor) -> torch.Tensor:
        """``[tp * words]`` for ``batch`` rows: a view of the plan's buffer
        (made once per batch size) with ``max_batch``; else a new tensor."""
        view = self._views.get(batch)
        if view is not None:
            return view
        words = self._world * self.frame_words(batch)
        if self.max_batch is None:
            return frame.new_empty(words)
        if self._buffer is None:
            self._buffer = frame.new_empty(self._world * self.frame_words(self.max_batch))
        view = self._buffer[:words]
        self._views[batch] = view
        return view


def cached_plan(owner, **plan_kwargs) -> StepPlan:
    """The :class:`StepPlan` of ``plan_kwargs`` held by ``owner`` (a module, a
    draft model, vLLM's ``LogitsProcessor``): made at the first call (a
    model's first forward, before any CUDA graph is captured) and reused while
    the same tensors (the same objects, data pointers, dtypes, devices,
    shapes and strides), group and options come back; any change plans anew
    (the weight moved or cast, another d2t). At most 16 plans per owner."""
    key = tuple(_identity(v) for v in plan_kwargs.items())
    plans = owner.__dict__.setdefault("_localargmax_plans", {})
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= 16:
            plans.clear()
        plan = plans[key] = StepPlan(**plan_kwargs)
    return plan


def _identity(item):
    name, value = item
    if isinstance(value, torch.Tensor):
        return name, id(value), value.data_ptr(), value.dtype, value.device, value.shape, value.stride()
    if isinstance(value, (int, float, str, bool)) or value is None:
        return name, type(value), value
    return name, id(value)  # a group, a callable: the plan keeps it alive, so its id is not reused


def _world_size(group: Group, weight: torch.Tensor) -> int | None:
    """Ranks the step exchanges with: 1 for None, :data:`LOCAL_SHARD` and a
    group of one rank; a ProcessGroup's or communicator's size; None for a
    callable (it cannot be seen). An NCCL group with a CPU weight: ValueError."""
    if group is None or group is LOCAL_SHARD:
        return 1
    if isinstance(group, dist.ProcessGroup):
        size = dist.get_world_size(group)
        if size > 1 and str(dist.get_backend(group)) == "nccl" and weight.device.type != "cuda":
            raise ValueError(
                f"group uses the NCCL backend but the weight is on {weight.device}: use a gloo group for CPU tensors"
            )
        return size
    if _is_nccl_communicator(group):
        require_cupy_nccl()
        return int(group.size())
    if callable(group):
        return None
    raise TypeError(
        "group must be None, localargmax.LOCAL_SHARD, a torch.distributed.ProcessGroup, a "
        f"cupy.cuda.nccl.NcclCommunicator or a callable all_gather(keys [B]) -> [tp, B], got {type(group).__name__}"
    )
