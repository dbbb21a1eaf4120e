"""The bad-input check: a call raises, naming the argument, and leaves its
tensor inputs bit-for-bit unmodified (nothing half-written); the bad ``d2t``
tables every step op refuses."""

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


BAD_D2T = {  # id: (d2t for a 6-row vocabulary, exception); every step op refuses them naming d2t
    "float": (torch.zeros(6), TypeError),
    "int32": (torch.zeros(6, dtype=torch.int32), TypeError),
    "2d": (torch.zeros(6, 1, dtype=torch.int64), ValueError),
    "too_short": (torch.zeros(2, dtype=torch.int64), ValueError),
    "empty": (torch.empty(0, dtype=torch.int64), ValueError),
}


def raises_cleanly(exc, match, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` raises ``exc`` matching ``match`` and modifies no input tensor."""
    saved = _tensors((args, kwargs), [])
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)
    for live, copy in saved:
        assert live.shape == copy.shape and live.dtype == copy.dtype
        assert torch.equal(_bytes(live), _bytes(copy)), f"{getattr(fn, '__name__', fn)} modified an input tensor"
