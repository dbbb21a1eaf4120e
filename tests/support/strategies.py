"""Hypothesis strategies: exact problems (every float32 accumulation order
gives the float64 reference's value, IEEE specials planted), layouts, d2t
tables; and ``given`` / ``settings`` / ``st`` for the property tests (skipped
where hypothesis is not installed)."""

from __future__ import annotations

import math

import pytest
import torch

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # e.g. a GPU machine with pytest only: the property tests skip, every other test runs

    class _Absent:
        def __getattr__(self, name):
            return self

        def __call__(self, *args, **kwargs):
            return self

    st = _Absent()

    def given(*args, **kwargs):
        return pytest.mark.skip(reason="hypothesis is not installed")

    def settings(*args, **kwargs):
        return lambda fn: fn


import localargmax
from tests.support.paths import flushes_denormals
from tests.support.problems import PAD_KINDS

EXACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
EXP_RANGE = {torch.float32: (-149, 120), torch.bfloat16: (-133, 120), torch.float16: (-24, 12)}
"""Exponents e of m * 2**e, |m| <= 7, exactly representable (subnormals included)."""
NORMAL_EXP = {torch.float32: -126, torch.bfloat16: -126, torch.float16: -14}
"""The smallest e for which every nonzero m * 2**e, |m| <= 7, is a normal number of the dtype."""


def lowest_exponents(dtype: torch.dtype, path: str = "auto", cpu_flags: str | None = None) -> tuple[int, int]:
    """``(input, product)``: the smallest exponent e of an exact problem's
    inputs ``m * 2**e`` and the smallest ``eh + ew`` of its products for
    weights of ``dtype`` run on CPU path ``path`` (``"auto"``: the path it
    resolves to for ``dtype`` on this CPU, or on one with ``cpu_flags``).
    Subnormal inputs, products and sums where the path keeps them; where it
    flushes them (tests.support.paths.flushes_denormals: AMX tiles,
    vdpbf16ps) only normal ones, so the exact answer is still float64's (the
    flushing itself: tests/test_cpu_paths.py, tests/test_cpu_denormals.py)."""
    if flushes_denormals(path, dtype, cpu_flags):
        return NORMAL_EXP[dtype], -126
    return EXP_RANGE[dtype][0], -149


SPECIALS = tuple(
    "w_nan w_inf w_ninf h_inf h_ninf h_nan b_nan b_inf "
    "b_ninf dup dup dup_far zero_hidden_row all_neg_inf_bias neg_zero_weight_row".split()
)


class Problem:
    def __init__(self, hidden, weight, bias, desc):
        self.hidden, self.weight, self.bias, self.desc = hidden, weight, bias, desc

    def __repr__(self):
        return f"Problem({self.desc})"


def _plant_special(kind, fa, fb, fc, hidden, weight, bias):
    batch, vocab, hsize = hidden.shape[0], weight.shape[0], weight.shape[1]

    def pick(frac, n):
        return min(n - 1, int(frac * n))

    if kind.startswith("w_") or kind.startswith("dup") or kind == "neg_zero_weight_row":
        i, j = pick(fa, vocab), pick(fb, hsize)
        if kind.startswith("w_"):
            weight[i, j] = {"w_nan": math.nan, "w_inf": math.inf, "w_ninf": -math.inf}[kind]
        elif kind == "dup":
            weight[pick(fc, vocab)] = weight[i]
        elif kind == "dup_far":
            weight[vocab - 1 - pick(fc, max(1, vocab // 8))] = weight[i]
        else:
            weight[i] = -0.0
    elif kind.startswith("h_") or kind == "zero_hidden_row":
        if batch:
            b, j = pick(fa, batch), pick(fb, hsize)
            if kind == "zero_hidden_row":
                hidden[b] = 0.0
            else:
                hidden[b, j] = {"h_inf": math.inf, "h_ninf": -math.inf, "h_nan": math.nan}[kind]
    else:
        bias = torch.zeros(vocab) if bias is None else bias
        if kind == "all_neg_inf_bias":
            bias[:] = -math.inf
        else:
            bias[pick(fa, vocab)] = {"b_nan": math.nan, "b_inf": math.inf, "b_ninf": -math.inf}[kind]
    return bias


@st.composite
def exact_problems(draw, max_batch=6, max_vocab=260, max_h=48, min_batch=0, path="auto", cpu_flags=None):
    """Problems whose float32 accumulation is exact in any order: hidden values
    m * 2**eh, weights m * 2**ew (|m| <= 7, eh + ew >= -149, H <= 48), so every
    partial sum is a multiple of 2**(eh + ew) below 2**24 of them, and so is the
    float64 reference. Ties, NaN, +-inf, -0.0 and denormals are then decided by
    DESIGN.md's rules alone. Denormals only where CPU path ``path`` (the ops'
    ``path=``; ``"auto"``: the path it resolves to for the drawn dtype on this
    CPU, or on one with ``cpu_flags``) keeps them (:func:`lowest_exponents`).
    Tensors come from a torch generator whose seed hypothesis draws (a
    failure shrinks to small shapes and a small seed)."""
    dtype = draw(st.sampled_from(EXACT_DTYPES))
    batch = draw(st.integers(min_batch, max_batch))
    vocab = draw(st.integers(1, max_vocab))
    hsize = draw(st.integers(1, max_h))
    (lo, low_product), hi = lowest_exponents(dtype, path, cpu_flags), EXP_RANGE[dtype][1]
    eh = draw(st.integers(lo, hi))
    ew = draw(st.integers(max(lo, low_product - eh), min(hi, 100 - eh)))
    seed = draw(st.integers(0, 2**32 - 1))
    bias_kind = draw(st.sampled_from([None, "float32", "weight"]))
    specials = draw(
        st.lists(st.tuples(st.sampled_from(SPECIALS), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1)), max_size=4)
    )
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.randint(-7, 8, (batch, hsize), generator=gen).double() * 2.0**eh).to(dtype)
    weight = (torch.randint(-7, 8, (vocab, hsize), generator=gen).double() * 2.0**ew).to(dtype)
    if vocab > 4 and seed % 3 == 0:  # few distinct rows: exact ties are common
        weight = weight[torch.randint(0, max(1, vocab // 4), (vocab,), generator=gen)]
    bias = None
    if bias_kind is not None:
        b64 = torch.randint(-64, 65, (vocab,), generator=gen).double() * 2.0 ** (eh + ew)
        bias = b64.float()
        if bias_kind == "weight" and torch.equal(b64.to(dtype).double(), b64):
            bias = b64.to(dtype)
    for kind, fa, fb, fc in specials:
        bias = _plant_special(kind, fa, fb, fc, hidden, weight, bias)
    desc = (
        f"B={batch} V={vocab} H={hsize} {dtype} eh={eh} ew={ew} (>= {lo}, sum >= {low_product}: path {path!r}) "
        f"seed={seed} bias={bias_kind}"
        f"{'/' + str(bias.dtype) if bias is not None else ''} specials={[s[0] for s in specials]}"
    )
    return Problem(hidden, weight, bias, desc)


@st.composite
def layouts(draw):
    """(tp, pad_to, pad kind)."""
    return draw(st.integers(1, 4)), draw(st.integers(1, 128)), draw(st.sampled_from(PAD_KINDS))


def d2t_for(seed: int, vocab: int) -> torch.Tensor:
    """A valid build_d2t table for a draft vocabulary of ``vocab`` ids."""
    gen = torch.Generator().manual_seed(seed)
    target = vocab + int(torch.randint(0, 3 * vocab + 1, (1,), generator=gen))
    d2t = localargmax.build_d2t(torch.randint(0, 50, (target,), generator=gen), vocab)
    localargmax.validate_d2t(d2t, vocab, target)
    return d2t
