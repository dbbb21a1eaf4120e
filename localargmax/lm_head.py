"""Drop-in pieces for draft models: a vocab-parallel lm_head module and the
``LocalArgmaxMixin.get_top_tokens`` interface engines use for local-argmax
drafting (the interface of vLLM PR #39419)."""

from __future__ import annotations

import torch
from torch import nn

from .collective import Group, check_group
from .engine import local_logits
from .layout import VocabShard, check_layouts, shard_vocab
from .plan import cached_plan


class VocabParallelLMHead(nn.Module):
    """One TP rank's shard of a vocab-parallel lm_head, greedy by default.

    Holds ``weight [rows, H]`` (and optionally ``bias [rows]``) for the global
    rows ``[vocab_start, vocab_start + rows)`` of the padded vocabulary; rows at
    or past ``num_valid`` are padding and never win.

    Args:
        vocab_size: real vocabulary size V (draft vocabulary for an EAGLE-3 head).
        hidden_size: H.
        rank, world_size: this TP rank and the TP world size; the layout is
            :func:`localargmax.shard_vocab` ``(V, rank, world_size, pad_to)``.
        group: ``None`` (world size 1), a ``torch.distributed.ProcessGroup`` or a
            callable all-gather of the framed payload, ``[L] -> [tp, L]`` with
            ``L = localargmax.payload_length(B)``. With a ProcessGroup the
            ranks' layouts are all-gathered and checked once here. ``None`` or a
            group of one rank with ``world_size > 1`` (or ``rank > 0``) is refused
            (``dist.group.WORLD`` is None before ``init_process_group``).
            ``localargmax.LOCAL_SHARD``: this shard's own answer, no exchange
            (ids from this rank's rows only).
        pad_to: vocabulary padding granularity.
        bias: whether the head has a bias (held in float32, the dtype the
            kernels add it in, whatever ``dtype`` is, through every Module
            cast: ``.to(dtype)``, ``.half()``, ``to_empty``,
            ``load_state_dict(assign=True)``, a parent model's cast).
        reduce: ``"all_gather"`` or ``"all_reduce"`` for :meth:`forward`.
        dtype, device: of the parameters.

    Raises:
        ValueError on a layout inconsistent across ranks or a ProcessGroup of
        another size or rank (naming the ranks, on every rank), or a group of
        one rank (``None`` included) for ``world_size > 1`` or ``rank > 0``
        (naming ``torch.distributed.init_process_group``).
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        group: Group = None,
        pad_to: int = 64,
        bias: bool = False,
        reduce: str = "all_gather",
        dtype: torch.dtype | None = None,
        device=None,
    ):
        super().__init__()
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 0:
            raise ValueError(f"hidden_size must be an int >= 0, got {hidden_size!r}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.shard: VocabShard = shard_vocab(vocab_size, rank, world_size, pad_to)
        self.rank, self.world_size = rank, world_size
        check_group(group, world_size=world_size, rank=rank, what="VocabParallelLMHead's group")
        self.group = group
        self.reduce = reduce
        self.weight = nn.Parameter(
            torch.zeros(self.shard.rows, hidden_size, dtype=dtype, device=device), requires_grad=False
        )
        # float32 whatever the weight dtype: the kernels add the bias in float32,
        # and a bf16/fp16 copy would round a float32 bias (ids could tie and flip).
        self.bias = (
            nn.Parameter(torch.zeros(self.shard.rows, dtype=torch.float32, device=device), requires_grad=False)
            if bias
            else None
        )
        if isinstance(group, torch.distributed.ProcessGroup):
            check_layouts(self.shard, hidden_size, group, rank=rank, world_size=world_size)

    @classmethod
    def from_full(
        cls,
        weight: torch.Tensor,
        rank: int,
        world_size: int,
        *,
        group: Group = None,
        pad_to: int = 64,
        bias: torch.Tensor | None = None,
        reduce: str = "all_gather",
    ) -> VocabParallelLMHead:
        """Slice (and zero-pad) rank ``rank``'s shard out of a full lm_head.

        Args:
            weight: ``[V, H]`` full lm_head (float32 / bfloat16 / float16).
            bias: optional ``[V]`` full bias, float32 or the weight dtype (as
                :func:`localargmax.shard_argmax` takes it); kept exactly, in float32.
            Others as in the constructor.

        Raises:
            ValueError / TypeError naming ``weight`` or ``bias``.
        """
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ValueError(
                f"weight must be a 2-D tensor [vocab_size, hidden_size], got {getattr(weight, 'shape', weight)}"
            )
        vocab_size, hidden_size = weight.shape
        if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.shape[0] != vocab_size):
            raise ValueError(
                f"bias must be a 1-D tensor [vocab_size={vocab_size}], "
                f"got {getattr(bias, 'shape', type(bias).__name__)}"
            )
        if bias is not None and bias.dtype not in (torch.float32, weight.dtype):
            raise TypeError(f"bias dtype must be float32 or the weight dtype ({weight.dtype}), got {bias.dtype}")
        head = cls(
            vocab_size,
            hidden_size,
            rank=rank,
            world_size=world_size,
            group=group,
            pad_to=pad_to,
            bias=bias is not None,
            reduce=reduce,
            dtype=weight.dtype,
            device=weight.device,
        )
        start, _, valid = head.shard
        with torch.no_grad():
            head.weight[:valid].copy_(weight[start : start + valid])
            if bias is not None:
                head.bias[:valid].copy_(bias[start : start + valid])
        return head

    def _apply(self, fn, recurse=True):
        """Every Module conversion (``.to``, ``.half()``, ``.bfloat16()``,
        ``.double()``, ``.type``, ``to_empty``, a parent's cast) passes through
        here: the bias follows a device move but keeps float32 (DESIGN rule 7)."""
        bias = self.bias
        if bias is None:
            return super()._apply(fn, recurse)

        def keep_bias_float32(t):
            out = fn(t)
            if t is bias and out.dtype != torch.float32:
                out = t.to(device=out.device, dtype=torch.float32)
            return out

        return super()._apply(keep_bias_float32, recurse)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """``load_state_dict(..., assign=True)`` takes the checkpoint's tensors
        as they are: a bias saved in another dtype is held in float32 again."""
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self.bias is not None and self.bias.dtype != torch.float32:
            self.bias = nn.Parameter(self.bias.detach().float(), requires_grad=self.bias.requires_grad)

    @property
    def vocab_start(self) -> int:
        return self.shard.vocab_start

    @property
    def num_valid(self) -> int:
        return self.shard.num_valid

    def forward(self, hidden: torch.Tensor, d2t: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, H]`` hidden states -> ``[B]`` int64 greedy ids (target ids with ``d2t``).

        Raises ValueError if ``self.group`` no longer fits the layout (see the class)."""
        check_group(self.group, world_size=self.world_size, rank=self.rank, what="VocabParallelLMHead's group")
        plan = cached_plan(
            self, weight=self.weight, vocab_start=self.shard.vocab_start, num_valid=self.shard.num_valid,
            bias=self.bias, d2t=d2t, group=self.group, reduce=self.reduce,
        )  # fmt: skip
        return plan.run(hidden)

    def local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, rows]`` this shard's logits, for non-greedy paths: weight dtype
        without a bias, float32 with one (the bias is float32); columns at or
        past ``num_valid`` are padding (set to -inf)."""
        return local_logits(hidden, self.weight, self.bias, self.shard.num_valid)

    def extra_repr(self) -> str:
        s = self.shard
        return (
            f"vocab_size={self.vocab_size}, hidden_size={self.hidden_size}, rank={self.rank}, "
            f"world_size={self.world_size}, vocab_start={s.vocab_start}, "
            f"rows={s.rows}, num_valid={s.num_valid}"
        )


def _lm_head_layout(lm_head):
    """(weight, bias, vocab_start, num_valid, group) of our module or of a
    vLLM-style ``ParallelLMHead`` (``weight``, optional ``bias``,
    ``shard_indices.org_vocab_start_index / org_vocab_end_index``)."""
    if isinstance(lm_head, VocabParallelLMHead):
        return lm_head.weight, lm_head.bias, lm_head.shard.vocab_start, lm_head.shard.num_valid, lm_head.group
    missing = [a for a in ("weight", "shard_indices") if not hasattr(lm_head, a)]
    if missing:
        raise AttributeError(
            f"get_top_tokens needs self.lm_head to be a localargmax.VocabParallelLMHead or a vLLM-style "
            f"ParallelLMHead; {type(lm_head).__name__} has no attribute {missing[0]!r}"
        )
    idx = lm_head.shard_indices
    for a in ("org_vocab_start_index", "org_vocab_end_index", "num_org_vocab_padding"):
        if not hasattr(idx, a):
            raise AttributeError(f"get_top_tokens: lm_head.shard_indices ({type(idx).__name__}) has no attribute {a!r}")
    start, end = int(idx.org_vocab_start_index), int(idx.org_vocab_end_index)
    return lm_head.weight, getattr(lm_head, "bias", None), start, end - start, getattr(lm_head, "tp_group", None)


def _check_logit_scale(scale) -> None:
    """Refuse a non-positive or NaN logit scale (argmax would become argmin or
    a constant), on every call, however the scale was written (``.data``
    writes and reloads included). A Python number, or a CPU tensor outside
    torch.compile, is read on the host: ValueError at once. A tensor on a
    device (or under torch.compile) is checked by an asynchronous device-side
    assert (``torch._assert_async``: one small kernel, no host sync, capturable
    in a CUDA graph) that raises at the next synchronisation."""
    if not isinstance(scale, torch.Tensor):
        if not float(scale) > 0:
            raise ValueError(f"logit scale must be > 0 for greedy drafting by argmax, got {scale}")
        return
    if scale.device.type == "cpu" and not torch.compiler.is_compiling():
        if not bool((scale > 0).all()):
            raise ValueError(f"logit scale must be > 0 for greedy drafting by argmax, got {scale.detach().tolist()}")
        return
    torch._assert_async((scale > 0).all(), "logit scale must be > 0 for greedy drafting by argmax")


class LocalArgmaxMixin:
    """Gives a draft model ``get_top_tokens(hidden_states) -> ids [B] int64``:
    greedy ids of its vocab-parallel lm_head without gathering the logits.

    Reads from ``self``:
      * ``lm_head``: a :class:`VocabParallelLMHead`, or a vLLM-style
        ``ParallelLMHead`` (``weight``, optional ``bias``, ``shard_indices``
        with ``org_vocab_start_index``, ``org_vocab_end_index``,
        ``num_org_vocab_padding``; its group is ``lm_head.tp_group`` if set, or
        ``self.local_argmax_group``). Our head keeps its bias float32
        through the draft model's casts (``.to(torch.bfloat16)``); a vLLM-style
        head's bias is used as it holds it. A head that knows its TP size
        (``VocabParallelLMHead.world_size``, ``ParallelLMHead.tp_size``) must
        get a group of that size: ``None`` for a TP rank is refused.
      * ``draft_id_to_target_id``: ``[draft_vocab]`` int64 d2t, or ``None`` /
        absent when draft and target vocabularies are the same.
      * optionally a logit scale (``self.logit_scale`` or
        ``self.logits_processor.scale``) and a soft-cap
        (``self.logits_processor.soft_cap`` / ``self.final_logit_softcapping``):
        a positive scale and any soft-cap ``tanh(x / c) * c`` are monotonic, so
        they leave the argmax unchanged and cost nothing. A non-positive or NaN
        scale would turn argmax into argmin (or a constant): it is checked on
        every call (see ``_check_logit_scale``: ValueError for a Python number
        or CPU tensor, a device-side assert for a CUDA tensor).

    Raises:
        AttributeError naming the missing attribute; ValueError for a
        non-positive logit scale, or for a group that cannot be the head's
        (``None`` or one rank for a TP size > 1, naming
        ``torch.distributed.init_process_group``).
    """

    def get_top_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        lm_head = getattr(self, "lm_head", None)
        if lm_head is None:
            raise AttributeError(f"{type(self).__name__} uses LocalArgmaxMixin but has no attribute 'lm_head'")
        weight, bias, start, valid, group = _lm_head_layout(lm_head)
        if group is None:
            group = getattr(self, "local_argmax_group", None)
        if isinstance(lm_head, VocabParallelLMHead):
            check_group(group, world_size=lm_head.world_size, rank=lm_head.rank, what="the lm_head's group")
        elif isinstance(getattr(lm_head, "tp_size", None), int):  # a vLLM-style ParallelLMHead
            check_group(group, world_size=lm_head.tp_size, rank=getattr(lm_head, "tp_rank", None),
                        what="lm_head.tp_group / local_argmax_group")  # fmt: skip
        scale = getattr(self, "logit_scale", None)
        if scale is None:
            scale = getattr(getattr(self, "logits_processor", None), "scale", None)
        if scale is not None:
            _check_logit_scale(scale)
        d2t = getattr(self, "draft_id_to_target_id", None)
        reduce = getattr(lm_head, "reduce", "all_gather")
        plan = cached_plan(
            self, weight=weight, vocab_start=start, num_valid=valid, bias=bias, d2t=d2t, group=group, reduce=reduce
        )  # planned at the first call, reused while the head, d2t and group stay
        return plan.run(hidden_states)
