"""The bad-input check: a call raises, naming the argument, and leaves its
tensor inputs bit-for-bit unmodified (nothing half-written)."""

from __future__ import annotations

import pytest
import torch


def _tensors(x, out):
    if isinstance(x, torch.Tensor):
        out.append((x, x.detach().clone()))
    elif isinstance(x, (list, tuple, dict)):
        for y in x.values() if isinstance(x, dict) else x:
            _tensors(y, out)
    return out


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8) if t.numel() else t


def raises_cleanly(exc, match, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` raises ``exc`` matching ``match`` and modifies no input tensor."""
    saved = _tensors((args, kwargs), [])
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)
    for live, copy in saved:
        assert live.shape == copy.shape and live.dtype == copy.dtype
        assert torch.equal(_bytes(live), _bytes(copy)), f"{getattr(fn, '__name__', fn)} modified an input tensor"
