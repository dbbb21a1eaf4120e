"""The allowed set S of filtered sampling (DESIGN.md, "Filtered sampling")
against vLLM 0.34's own masks on the same logits: ``apply_min_p``
(v1/worker/gpu/sample/min_p.py, a Triton kernel, interpreted on the CPU)
then ``apply_top_k_top_p_pytorch`` (v1/sample/ops/topk_topp_sampler.py), S
being the ids those leave above -inf; ours is :func:`filter_sorted` (vLLM's
semantics on the full row in float64). vLLM runs in a subprocess, since
``TRITON_INTERPRET`` and the CPU platform must be set before triton / vLLM
are imported (tests/support/vllm_common.py). vLLM's Triton top-k / top-p
kernel (topk_topp_triton.py) runs interpreted too, its loop variable given
as the tensor compiled Triton gives (see ``VLLM_MASKS``). The
one-exchange step's own allowed set (``decide_rows`` from the candidates, the
gather fallback for the rest) is read back on each row's head and compared."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch

from localargmax.sampling import filter_sorted
from tests.support.vllm_common import NO_TRITON_REASON, RANK_ENV, vllm_cpu_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.skipif(vllm_cpu_build(), reason=NO_TRITON_REASON),
]

VLLM_MASKS = r"""
import sys, torch
from tests.support.vllm_common import patch_interpreted_tl_range

patch_interpreted_tl_range()  # the loop variable compiled Triton gives (topk_topp_triton.py:128)

from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
from vllm.v1.sample.ops.topk_topp_triton import apply_top_k_top_p_triton
from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample
from vllm.v1.worker.gpu.sample.min_p import apply_min_p
d = torch.load(sys.argv[1])
y, k, p, mp = d["y"].clone(), d["k"], d["p"], d["mp"]
rows = torch.arange(y.shape[0], dtype=torch.int32)
apply_min_p(y, rows, mp)  # in place, as sampler.py does
masked = apply_top_k_top_p_pytorch(y.clone(), k, p)
out = {"torch": masked > -float("inf"), "triton": None, "triton_error": ""}
# sampler.py's _sample_random after the filters: gumbel_sample, the temperature already applied (T = 1 here)
out["sampled"] = gumbel_sample(masked.clone(), rows, torch.ones(y.shape[0]), d["seed"], d["pos"],
                               apply_temperature=False, is_drafting=False)
try:
    out["triton"] = apply_top_k_top_p_triton(y.clone(), k, p) > -float("inf")
except Exception as e:  # the reason goes into the report
    out["triton_error"] = repr(e)[:300]
torch.save(out, sys.argv[1])
"""

B, V = 96, 1999
TIE_ROWS = 24
P_MARGIN = 2 * V * 2.0**-24
"""A top-p decision closer than this to p (as a share of the row's kept mass)
is a near-tie: vLLM's float32 softmax and cumsum over V terms err by up to
about V ulps of 1 (``2**-24`` each), doubled for the softmax."""
MP_MARGIN = 1e-5
"""A value this close (absolute) to the min-p threshold is a near-tie:
vLLM's float32 ``max + log(min_p)`` rounds within an ulp of values <= 30."""


def _problem(gen):
    """Tempered float32 logits ``y`` [B, V] (temperature applied in float32,
    as vLLM's sampler does before its masks, so both sides see the same
    values) and per-row top_k / top_p / min_p; the last TIE_ROWS rows have
    top-k alone with exact ties planted across the k-th value."""
    x = torch.randn(B, V, generator=gen) * 3
    t = torch.tensor([0.7, 1.0, 1.5])[torch.randint(0, 3, (B,), generator=gen)]
    y = (x / t[:, None]).float()
    k = torch.randint(1, 60, (B,), generator=gen)
    kind = torch.randint(0, 4, (B,), generator=gen)
    k = torch.where(kind == 0, 0, torch.where(kind == 1, V + 3, k))  # 0 and > V: off (states.py:49-51)
    p = torch.where(torch.rand(B, generator=gen) < 0.3, 1.0, 0.5 + 0.49 * torch.rand(B, generator=gen))
    mp = torch.where(torch.rand(B, generator=gen) < 0.5, 0.0, 0.01 + 0.2 * torch.rand(B, generator=gen))
    tie = torch.arange(B) >= B - TIE_ROWS
    k[tie], p[tie], mp[tie] = torch.randint(2, 40, (TIE_ROWS,), generator=gen), 1.0, 0.0
    for b in tie.nonzero()[:, 0].tolist():  # the k-th value shared by ids above and below it in the order
        order = y[b].argsort(descending=True)
        kk = int(k[b])
        y[b, order[kk - 2 : kk + 2]] = y[b, order[kk - 1]].item()
    return y, k, p, mp, tie


def _noise_inputs():
    """vLLM's per-row seeds (past 2**32) and positions (past 2**31) for the sampled ids."""
    gen = torch.Generator().manual_seed(57)
    return torch.randint(-(2**62), 2**62, (B,), generator=gen), torch.randint(2**31 - 8, 2**33, (B,), generator=gen)


def _vllm_masks(tmp_path, y, k, p, mp):
    """vLLM's kept masks (min-p, then the torch top-k / top-p; the Triton one or why it failed)."""
    path = tmp_path / "masks.pt"
    kv = torch.where((k <= 0) | (k > V), V, k).to(torch.int32)  # states.py:49-51: off is V
    seed, pos = _noise_inputs()
    torch.save({"y": y, "k": kv, "p": p.float(), "mp": mp.float(), "seed": seed, "pos": pos}, path)
    env = {**os.environ, **RANK_ENV}
    run = subprocess.run(
        [sys.executable, "-c", VLLM_MASKS, str(path)], env=env, capture_output=True, text=True, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(path)


def _ours(y, k, p, mp):
    """Our allowed set [B, V] bool by id, and which rows sit within a margin of a decision."""
    ys, ids, keep, a = filter_sorted(y, torch.ones(B), k, p.double(), mp.double())
    ours = torch.zeros(B, V, dtype=torch.bool).scatter_(1, ids, keep)
    thr = a + torch.log(torch.where(mp > 0, mp.double(), 1.0))[:, None]
    near = ((mp > 0)[:, None] & ((ys - thr).abs() < MP_MARGIN)).any(dim=1)
    pos = torch.arange(V)[None]
    pre = (pos < torch.where(k > 0, k, V)[:, None]) & ((ys >= thr) | (mp <= 0)[:, None])  # min-p and top-k
    kth = ys.gather(1, (torch.where((k > 0) & (k < V), k, 1) - 1)[:, None])
    kth_tie = ((k > 0) & (k < V)) & (ys.gather(1, torch.where((k > 0) & (k < V), k, 0)[:, None]) == kth)[:, 0]
    w = torch.where(pre, torch.exp(ys - a), 0.0)
    share = (w.cumsum(dim=1) - w) / w.sum(dim=1, keepdim=True)  # mass strictly before each id
    near |= (p < 1) & (pre & ((share - p.double()[:, None]).abs() < P_MARGIN)).any(dim=1)
    return ours, near, kth_tie, kth[:, 0]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    gen = torch.Generator().manual_seed(2026)
    y, k, p, mp, tie = _problem(gen)
    got = _vllm_masks(tmp_path_factory.mktemp("vllm"), y, k, p, mp)
    ours, near, kth_tie, kth = _ours(y, k, p, mp)
    ties = tie | kth_tie  # a chance tie at the k-th value in a random row counts as one
    compared = ~ties & ~near
    assert int(compared.sum()) >= 0.8 * (B - TIE_ROWS), f"only {int(compared.sum())} rows away from near-ties"
    return y, k, p, mp, tie, ties, got, ours, near, kth, compared


def test_min_p_then_torch_top_k_top_p_match(case):
    y, k, p, mp, tie, ties, got, ours, near, kth, compared = case
    bad = (got["torch"] != ours)[compared].any(dim=1).nonzero()[:, 0]
    assert not bad.numel(), f"vLLM's mask differs on rows {compared.nonzero()[bad, 0].tolist()}"
    # Exact ties at the k-th value (DESIGN: vLLM's torch path keeps every id equal to it; we keep exactly k,
    # the smaller ids first): ours has k ids, inside vLLM's, which is exactly {y >= the k-th value}; what
    # only vLLM keeps equals the k-th value and lies at larger ids than every tied id we keep.
    checked = 0
    for b in ties.nonzero()[:, 0].tolist():
        if bool(near[b]) or not (0 < k[b] < V):
            continue
        mine, theirs = ours[b], got["torch"][b]
        assert int(mine.sum()) == int(k[b]) and bool((mine <= theirs).all()), f"row {b}"
        v = y[b].double()
        pre = (v >= v.max() + math.log(float(mp[b]))) if mp[b] > 0 else torch.ones(V, dtype=torch.bool)
        assert torch.equal(theirs, pre & (v >= kth[b])), f"row {b}: vLLM torch kept {int(theirs.sum())}"
        extra = (theirs & ~mine).nonzero()[:, 0]
        kept_tied = (mine & (v == kth[b])).nonzero()[:, 0]
        assert bool((v[extra] == kth[b]).all()), f"row {b}"
        if extra.numel():
            assert int(extra.min()) > int(kept_tied.max()), f"row {b}: a tie kept out of id order"
        checked += 1
    assert checked >= TIE_ROWS and any((got["torch"][b] & ~ours[b]).any() for b in range(B - TIE_ROWS, B))


def test_triton_top_k_top_p_matches(case):
    y, k, p, mp, tie, ties, got, ours, near, kth, compared = case
    assert got["triton"] is not None, f"vLLM's Triton top-k/top-p kernel failed: {got['triton_error']}"
    rows = compared | (tie & ~near)  # the Triton kernel keeps exactly k at a tie, smaller ids first (as ours)
    # Where min-p left -inf entries and the nucleus needs every id min-p kept, the kernel's standalone top-p
    # (a pivot search over "outliers" above an estimated pivot) may keep all but the smallest of them, where
    # vLLM's torch path and ours keep them all (DESIGN, "Filtered sampling"). Only that one divergence is allowed.
    yd = y.double()
    minp_set = yd >= yd.max(dim=1, keepdim=True).values + torch.log(mp.double().clamp(min=1e-300))[:, None]
    whole = (mp > 0) & (p < 1) & (ours == minp_set).all(dim=1) & (ours.sum(dim=1) > 1)
    for b in (rows & whole).nonzero()[:, 0].tolist():
        missing = (ours[b] & ~got["triton"][b]).nonzero()[:, 0]
        assert bool((got["triton"][b] <= ours[b]).all()) and missing.numel() <= 1, f"row {b}"
        if missing.numel():
            smallest = torch.where(ours[b], y[b], math.inf).argmin()
            assert int(missing[0]) == int(smallest), f"row {b}: dropped id {int(missing[0])}, not the smallest kept"
    rest = rows & ~whole
    bad = (got["triton"] != ours)[rest].any(dim=1).nonzero()[:, 0]
    assert not bad.numel(), f"vLLM's Triton mask differs on rows {rest.nonzero()[bad, 0].tolist()}"
    assert int(rest.sum()) >= 0.7 * B, f"only {int(rest.sum())} rows compared exactly"


HEAD = 32
"""Top ids per row whose membership in the step's allowed set is read back."""


def test_one_exchange_allowed_set_matches(case, monkeypatch):
    """The allowed set the step decides from the candidates (``decide_rows``, and
    the gather fallback for the rows it leaves): noise of 1e6 at one id and 0
    elsewhere makes the step return that id iff it is allowed. Read for each
    row's HEAD largest ids (hidden = the logits, weight = I: the same float32
    logits), compared with vLLM's mask there on the rows away from near-ties."""
    import localargmax
    from localargmax.sampling import filters

    y, k, p, mp, tie, ties, got, ours, near, kth, compared = case
    # Rows with every filter off (top_k 0, top_p 1, min_p 0) are sampled by the kernels' own noise (the
    # unfiltered step's: tests/test_filtered_sampling_mixed.py); their allowed set is the vocabulary.
    off = (k == 0) & (p >= 1) & (mp <= 0)
    compared = compared & ~off
    assert bool(got["torch"][off].all()), "vLLM restricts a row with every filter off"
    target = torch.zeros(B, dtype=torch.int64)
    monkeypatch.setattr(filters, "gumbel_noise", lambda seed, rows, ids: (ids == target[rows]).float() * 1e6)
    head = y.argsort(dim=1, descending=True, stable=True)[:, :HEAD]
    allowed = torch.zeros(B, HEAD, dtype=torch.bool)
    eye = torch.eye(V)
    for j in range(HEAD):
        target[:] = head[:, j]
        ids = localargmax.lm_head_sample(y, eye, temperature=1.0, seed=1, top_k=k, top_p=p, min_p=mp)
        allowed[:, j] = ids == head[:, j]
    vllm_head = got["torch"].gather(1, head)
    assert allowed[~off, 0].all()
    bad = (allowed != vllm_head)[compared].any(dim=1).nonzero()[:, 0]
    assert not bad.numel(), f"the step's allowed set differs from vLLM's on rows {compared.nonzero()[bad, 0].tolist()}"
    assert torch.equal(allowed[tie & ~near], ours.gather(1, head)[tie & ~near])  # exactly k at a tie, as ours


def test_vllm_noise_samples_vllms_id(case):
    """End to end (issue #57 item 1): lm_head_sample(..., top_k, top_p, min_p,
    noise=vllm_noise(seed, pos)) on the same float32 logits (hidden = the
    logits, weight = I, T = 1) gives the id vLLM 0.34's sampler draws there
    (min-p, top-k / top-p, then gumbel_sample with its noise), on every row
    away from a near-tie of the masks, an exact tie at the k-th value and a
    near-tie of the noised scores (within 4 float32 ulps, where the float32
    log can differ from the interpreter's)."""
    import localargmax

    y, k, p, mp, tie, ties, got, ours, near, kth, compared = case
    seed, pos = _noise_inputs()
    noise = localargmax.vllm_noise(seed, pos)
    ids = localargmax.lm_head_sample(y, torch.eye(V), temperature=1.0, seed=0, top_k=k, top_p=p, min_p=mp, noise=noise)
    theirs = got["sampled"]
    g = localargmax.vllm_gumbel_noise(seed[:, None], pos[:, None], torch.arange(V)[None])
    score = torch.where(got["torch"], y + g, -math.inf)
    top, second = score.topk(2, dim=1).values.unbind(1)
    ulp = torch.nextafter(top.abs(), torch.tensor(math.inf)) - top.abs()
    clear = compared & ((top - second) > 4 * ulp)
    assert torch.equal(theirs[clear], score.argmax(dim=1)[clear]), "vLLM's id is not the argmax of the same noise"
    bad = (ids != theirs) & clear
    assert not bool(bad.any()), f"rows {bad.nonzero()[:, 0].tolist()}: ours {ids[bad]} vLLM {theirs[bad]}"
    assert int(clear.sum()) >= 0.7 * B, f"only {int(clear.sum())} rows compared"
    assert int((ids[clear] != y[clear].argmax(dim=1)).sum()) > 0.2 * B  # sampled, not the argmax


# --- top-p alone on widely spread logits (issue 67 item 3) ---

SPREAD = torch.tensor([40.0, 40.0, 60.0, 25.0, 3.0, 5.0, 40.0, 3.0])
"""Per row: the spread (std) of the logits. From 25 up, vLLM's monolithic Triton top-p underflows (below)."""
CPU_TILE = 256
"""The Triton kernel's BLOCK_SIZE on the CPU (topk_topp_triton.py: 256 on CPU, 8192 on CUDA)."""


def _triton_top_p_underflows(y, tile=CPU_TILE):
    """The condition of docs/vllm.md: vLLM's standalone top-p (the monolithic kernel) estimates the row's maximum
    as ``avg + 10 std`` of its first tile's finite logits and sums ``exp(x - estimate)`` in float32; when every
    logit lies more than 103.98 below it, each term is 0 (float32 ``exp`` underflows), the probabilities are
    0 / 0 and the kernel masks nothing."""
    first = y[:, :tile].double()
    finite = first > -math.inf
    n = finite.sum(dim=1)
    avg = torch.where(finite, first, 0.0).sum(dim=1) / n
    std = (torch.where(finite, first, 0.0).square().sum(dim=1) / n - avg.square()).clamp(min=0).sqrt()
    return y.double().max(dim=1).values - (avg + 10 * std) < -103.98


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    gen = torch.Generator().manual_seed(67)
    rows = SPREAD.numel()
    y = (torch.randn(rows, V, generator=gen, dtype=torch.float64) * SPREAD[:, None]).float()
    k = torch.zeros(rows, dtype=torch.int64)  # top-p alone: top-k off (vLLM: V), min-p off
    p = torch.tensor([0.5, 0.9, 0.3, 0.7, 0.5, 0.9, 0.99, 0.7])
    mp = torch.zeros(rows)
    got = _vllm_masks(tmp_path_factory.mktemp("spread"), y, k, p, mp)
    _, ids, keep, _ = filter_sorted(y, torch.ones(rows), k, p.double(), mp.double())
    ours = torch.zeros(rows, V, dtype=torch.bool).scatter_(1, ids, keep)
    return y, k, p, mp, got, ours


def test_top_p_alone_on_widely_spread_logits(spread):
    """Rows with top-p alone whose logits spread widely (std 25-60 over 1999
    ids): vLLM's Triton kernel keeps every id there (the underflow of
    ``_triton_top_p_underflows``, the condition docs/vllm.md states), where
    vLLM's PyTorch path and ours keep the exact nucleus; the step samples the
    float64 reference's id on every row. On the narrow rows (std 3-5) the three
    masks agree."""
    import localargmax
    from tests.test_filtered_sampling import reference

    y, k, p, mp, got, ours = spread
    under = _triton_top_p_underflows(y)
    assert torch.equal(under, SPREAD >= 25), (under, SPREAD)  # the construction: the condition holds where meant
    assert got["triton"] is not None, f"vLLM's Triton top-k/top-p kernel failed: {got['triton_error']}"
    assert bool(got["triton"][under].all()), "vLLM's Triton top-p masked ids on a row where it underflows"
    assert torch.equal(got["triton"][~under], ours[~under])
    assert bool((ours[under].sum(dim=1) < V // 4).all())  # the nucleus is small: the difference is real
    assert torch.equal(got["torch"], ours)  # vLLM's PyTorch fallback: a max-subtracted softmax, no underflow
    t, seed = torch.ones(y.shape[0]), 12345
    ids = localargmax.lm_head_sample(y, torch.eye(V), temperature=t, seed=seed, offset=3, top_k=k, top_p=p, min_p=mp)
    want = reference(y.double(), t, k.tolist(), p, mp, seed, 3)
    assert not any(near for _, near in want)
    assert ids.tolist() == [i for i, _ in want]
    assert bool(ours.gather(1, ids[:, None]).all())
