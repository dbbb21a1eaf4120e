"""Filtered sampling (top-k / top-p / min-p) from vocab-parallel logits
(localargmax.sampling; DESIGN.md, "Filtered sampling"): the same id as a
float64 reference on the full matrix at tp 1, 2, 3 and 8, except at float32
near-ties, whose margins the reference reports."""

from __future__ import annotations

import math
import os
import threading

import pytest
import torch

import localargmax
from localargmax import sampling, vllm_gumbel_noise, vllm_noise
from localargmax.sampling import CANDIDATES, gumbel_noise
from tests.support.launch import run_ranks
from tests.support.paths import CPU_ISA_PATHS, KernelPath, cpu_path_unavailable, use_path
from tests.support.problems import layout_kwargs, make_shards

TIE, TIE_MASS = 1e-4, 1e-5
"""Near-tie margins, in logit units and in relative mass at the top-p
boundary: float32 logits of these problems are within ~1e-6 of float64
(DESIGN.md, "Log-probabilities", Accuracy; "Filtered sampling")."""


def reference(logits, t, k, p, mp, seed, offset, noise=None):
    """Per row: the id a float64 filter + Gumbel-max on the full row picks
    (vLLM 0.34's order: temperature, min-p, top-k, top-p), and whether any
    of its decisions is within TIE of flipping. Plain Python sorts. The
    noise: the kernels' Philox noise of (seed, offset + b), or vLLM's of
    ``noise`` (a VllmNoise); equal scores go to the smaller id."""
    out = []
    for b in range(logits.shape[0]):
        x = logits[b].tolist()
        if t[b] == 0:
            out.append((max(range(len(x)), key=lambda i: (x[i], -i)), False))
            continue
        y = [v / float(t[b]) for v in x]
        order = sorted(range(len(y)), key=lambda i: (-y[i], i))
        margins = []
        if mp[b] > 0:
            thr = y[order[0]] + math.log(float(mp[b]))
            margins.append(min(abs(y[i] - thr) for i in order))
            order = [i for i in order if y[i] >= thr]
        if 0 < k[b] < len(order):
            margins.append(y[order[k[b] - 1]] - y[order[k[b]]])
            order = order[: k[b]]
        if p[b] < 1:
            w = [math.exp(y[i] - y[order[0]]) for i in order]
            z, before, n = sum(w), 0.0, 0
            for wi in w:
                margins.append(abs(before / z - float(p[b])) * TIE / TIE_MASS)
                if before >= float(p[b]) * z and n:
                    break
                before, n = before + wi, n + 1
            order = order[:n]
        if noise is None:
            row = offset + b - (2**64 if offset + b >= 2**63 else 0)  # the uint64 row in int64
            g = gumbel_noise(seed, torch.tensor([row]), torch.tensor(order)).double().tolist()
        else:
            g = vllm_gumbel_noise(noise.seed[b], noise.pos[b], torch.tensor(order)).double().tolist()
        scores = sorted(((y[i] + gi, -i) for i, gi in zip(order, g)), reverse=True)
        if len(scores) > 1:
            margins.append(scores[0][0] - scores[1][0])
        out.append((-scores[0][1], min(margins, default=1.0) < TIE))
    return out


class ThreadGroup:
    """An in-process all-gather for ``tp`` ranks run as threads: the
    callable group of rank ``r`` is ``group.member(r)``."""

    def __init__(self, tp):
        self.barrier, self.slots = threading.Barrier(tp, timeout=120), [None] * tp

    def member(self, r):
        def all_gather(words):
            self.slots[r] = words
            self.barrier.wait()
            out = torch.stack(self.slots)
            self.barrier.wait()
            return out

        return all_gather


def run_tp(hidden, weight, tp, shard_logits=False, **kw):
    """lm_head_sample on ``tp`` simulated ranks (threads; padded standard
    shards whose padding would win); checks every rank returns the same.
    ``shard_logits``: sampling.filtered_sample on each rank's float32
    logits of its valid rows instead (the engine-logits mode)."""
    shards = make_shards(weight, None, tp, 64, hidden=hidden)
    group, results, errors = ThreadGroup(tp), [None] * tp, []

    def rank(r):
        try:
            w, _, _ = shards[r]
            g = group.member(r) if tp > 1 else None
            layout = layout_kwargs(shards[r])
            if shard_logits:
                local = hidden @ w[: layout["num_valid"]].T
                results[r] = sampling.filtered_sample(hidden, w, **layout, group=g, shard_logits=local, **kw)
            else:
                results[r] = localargmax.lm_head_sample(hidden, w, **layout, group=g, **kw)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(tp)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    first = results[0][0] if isinstance(results[0], tuple) else results[0]
    for res in results[1:]:
        assert torch.equal(res[0] if isinstance(res, tuple) else res, first), "the ranks disagree"
    return results[0]


def mixed_rows(gen, batch):
    """Per-row temperature / top_k / top_p / min_p: greedy, unfiltered,
    each filter alone and together, top_k past the candidates (fallback)."""
    pick = lambda xs: torch.tensor(xs)[torch.randint(len(xs), (batch,), generator=gen)]  # noqa: E731
    t = pick([0.0, 0.5, 0.7, 1.0, 1.0, 1.3])
    k = pick([0, 0, 1, 5, 20, 50, 64, 100, 300, 5000])
    p = pick([1.0, 1.0, 0.5, 0.9, 0.95])
    mp = pick([0.0, 0.0, 0.05, 0.2])
    off = torch.rand(batch, generator=gen) < 0.2  # some rows with every filter off
    k[off], p[off], mp[off] = 0, 1.0, 0.0
    return t, k, p, mp


def problem(gen, batch=24, vocab=2003, hsize=32, sharp=3.0):
    hidden = torch.randn(batch, hsize, generator=gen) * sharp
    weight = torch.randn(vocab, hsize, generator=gen) / math.sqrt(hsize)
    return hidden, weight


def check(ids, hidden, weight, t, k, p, mp, seed, offset, share=0.7, noise=None):
    want = reference(hidden.double() @ weight.double().T, t, k.tolist(), p, mp, seed, offset, noise)
    exact = [b for b, (_, near) in enumerate(want) if not near]
    assert len(exact) >= share * len(want), f"too many near-ties: {len(want) - len(exact)} of {len(want)}"
    got = [int(ids[b]) for b in exact]
    assert got == [want[b][0] for b in exact], [(b, got[i], want[b][0]) for i, b in enumerate(exact)]


@pytest.mark.parametrize("tp", [1, 2, 3, 8])
def test_same_id_as_float64_reference(seed, tp):
    """Mixed greedy / unfiltered / filtered rows, uneven padded shards, rows
    that need the fallback: the reference's id on every row but near-ties."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen)
    t, k, p, mp = mixed_rows(gen, hidden.shape[0])
    ids = run_tp(hidden, weight, tp, temperature=t, seed=seed, offset=7, top_k=k, top_p=p, min_p=mp)
    check(ids, hidden, weight, t, k, p, mp, seed, 7)


def _vllm_noise_rows(gen, batch):
    seed = torch.randint(-(2**62), 2**62, (batch,), generator=gen)
    return vllm_noise(seed, torch.randint(2**31 - 8, 2**33, (batch,), generator=gen), drafting=False)


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_vllm_noise_same_id_as_float64_reference(seed, tp):
    """noise=vllm_noise(...) with the filters (issue #57 item 1): mixed greedy
    / unfiltered / filtered rows, fallback rows, uneven padded shards: the
    float64 reference's id under vLLM's noise on every row but near-ties;
    the same ids with the log-probabilities, and under fallback='error' where
    no row needs the gather."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen)
    t, k, p, mp = mixed_rows(gen, hidden.shape[0])
    noise = _vllm_noise_rows(gen, hidden.shape[0])
    kw = dict(temperature=t, seed=0, top_k=k, top_p=p, min_p=mp, noise=noise)
    ids = run_tp(hidden, weight, tp, **kw)
    check(ids, hidden, weight, t, k, p, mp, 0, 0, noise=noise)
    ids_lp, lp = run_tp(hidden, weight, tp, return_log_probs=True, **kw)
    assert torch.equal(ids_lp, ids) and bool(torch.isfinite(lp).all())
    fits = k < CANDIDATES  # top-k alone inside the candidates: no fallback for these rows
    rows = fits & (p >= 1) & (mp <= 0)
    sub = dict(kw, temperature=t[rows], top_k=k[rows], top_p=p[rows], min_p=mp[rows])
    sub["noise"] = vllm_noise(noise.seed[rows], noise.pos[rows])
    assert torch.equal(run_tp(hidden[rows], weight, tp, fallback="error", **sub), ids[rows])


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_shard_logits_same_id_as_float64_reference(seed, tp):
    """filtered_sample(shard_logits=) (the vLLM plugin's route for engine
    logits): mixed greedy / unfiltered / filtered rows, fallback rows (their
    gather reads the given logits), uneven padded shards (an empty one at
    tp 3 of a small vocabulary): the float64 reference's id under vLLM's
    noise on every row but near-ties; bad combinations refused."""
    gen = torch.Generator().manual_seed(seed)
    for vocab in (2003, 100):  # 100 rows at tp 3: shards of 64, 36 and 0 valid rows
        hidden, weight = problem(gen, vocab=vocab)
        t, k, p, mp = mixed_rows(gen, hidden.shape[0])
        noise = _vllm_noise_rows(gen, hidden.shape[0])
        kw = dict(temperature=t, seed=0, top_k=k, top_p=p, min_p=mp, noise=noise)
        ids = run_tp(hidden, weight, tp, shard_logits=True, **kw)
        check(ids, hidden, weight, t, k, p, mp, 0, 0, noise=noise)
    local = hidden @ weight.T
    for bad, match in (
        (dict(kw, noise=None), "needs noise=vllm_noise"),
        (dict(kw, logit_scale=0.5), "logit_scale"),
        (dict(kw, return_log_probs=True), "return_log_probs"),
    ):
        with pytest.raises(ValueError, match=match):
            sampling.filtered_sample(hidden, weight, shard_logits=local, **bad)
    with pytest.raises(ValueError, match=r"shard_logits must be \[B=24, num_valid=100\]"):
        sampling.filtered_sample(hidden, weight, shard_logits=local[:, :5], **kw)


def test_vllm_noise_scores_in_float32_ties_to_the_smaller_id():
    """vllm_scores: the float32 score fl(fl(x / T) + g), not float64's, and
    among equal float32 scores the smaller id, whatever the entries' order.
    Planted: x = fl(2 - g) at four ids, which all score 2.0 in float32 while
    float64 ranks them (its best, id 40, is not the smallest)."""
    from localargmax import VllmNoise

    noise = VllmNoise(torch.tensor([12]), torch.tensor([5]))
    ids = torch.tensor([[40, 7, 900, 3000]])
    g = vllm_gumbel_noise(noise.seed[:, None], noise.pos[:, None], ids)
    x = (2.0 - g).float()
    assert bool(((x + g) == 2.0).all()) and int(ids[0, (x.double() + g.double()).argmax()]) == 40
    allowed = torch.ones_like(ids, dtype=torch.bool)
    for want in (7, 40, 900, 3000):  # mask the winner each time: the next smaller id
        best = sampling.vllm_scores(x, torch.ones(1), ids, allowed, noise)
        assert int(ids[0, best[0, 0]]) == want
        allowed &= ids != want
    t = torch.tensor([0.5])  # the division first: fl(fl(x / T) + g)
    best = sampling.vllm_scores(x, t, ids, torch.ones_like(allowed), noise)
    s = x / t + g
    assert int(ids[0, best[0, 0]]) == int(ids[s == s.max()].min())


def test_offsets_up_to_the_last_one(seed):
    """Every offset the steps accept (< 2**63) works filtered as unfiltered:
    rows offset + b past 2**63 - 1 are the kernels' uint64 rows."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=12, vocab=600)
    t, k, p, mp = mixed_rows(gen, 12)
    offset = 2**63 - 5
    ids = run_tp(hidden, weight, 2, temperature=t, seed=seed, offset=offset, top_k=k, top_p=p, min_p=mp)
    check(ids, hidden, weight, t, k, p, mp, seed, offset)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", CPU_ISA_PATHS)
def test_every_cpu_path_gives_the_reference_id(seed, name, dtype):
    """The same float64 comparison (mixed rows, fallback rows, tp 2, padded
    shards) with the fused top-64 + log-partition pass forced onto each CPU
    path this CPU has (brgemm too: not bit-exact, within the float32 bound)."""
    why = cpu_path_unavailable(name)
    if why:
        pytest.skip(f"this CPU lacks what path {name!r} needs: {why}")
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = (x.to(dtype) for x in problem(gen, batch=20, vocab=1501))
    t, k, p, mp = mixed_rows(gen, hidden.shape[0])
    with use_path(KernelPath("cpu", name)):
        ids = run_tp(hidden, weight, 2, temperature=t, seed=seed, offset=3, top_k=k, top_p=p, min_p=mp)
    check(ids, hidden, weight, t, k, p, mp, seed, 3)


@pytest.mark.parametrize("kind", ["top_k", "top_p", "min_p", "off"])
def test_each_filter_alone_and_scalar_args(seed, kind):
    """Scalar filter arguments (as SamplingParams give them), at tp 3; every
    filter off (top_k=0) gives lm_head_sample's own id."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=16, vocab=700)
    t = torch.full((16,), 0.8)
    args = {"top_k": {"top_k": 20}, "top_p": {"top_p": 0.9}, "min_p": {"min_p": 0.1}, "off": {"top_k": 0}}[kind]
    ids = run_tp(hidden, weight, 3, temperature=t, seed=seed, **args)
    full = {"top_k": 0, "top_p": 1.0, "min_p": 0.0} | args
    row = lambda name, dt: torch.full((16,), full[name], dtype=dt)  # noqa: E731
    check(
        ids,
        hidden,
        weight,
        t,
        row("top_k", torch.int64),
        row("top_p", torch.float64),
        row("min_p", torch.float64),
        seed,
        0,
    )
    if kind == "off":
        assert torch.equal(ids, localargmax.lm_head_sample(hidden, weight, temperature=t, seed=seed))


def test_fallback_error_and_gather(seed):
    """A row whose top-k exceeds every rank's candidates: fallback='error'
    raises, 'gather' recomputes it (the reference's id); rows that fit never
    need the gather."""
    gen = torch.Generator().manual_seed(seed)
    # sharp 2 (not 0.5): the top-k boundaries' gaps 4x wider; at 0.5, 2 of the 4 rows were near-ties
    # for ~1.6e-3 of seeds (8 in 5000); at 2, 0 in 3000 (per-row rates give ~7e-5)
    hidden, weight = problem(gen, batch=4, vocab=3000, sharp=2.0)
    t = torch.ones(4)
    k = torch.tensor([5, 5, 2 * CANDIDATES + 1, 10])
    with pytest.raises(ValueError, match="fallback='gather'"):
        run_tp(hidden, weight, 2, temperature=t, seed=seed, top_k=k, fallback="error")
    ids = run_tp(hidden, weight, 2, temperature=t, seed=seed, top_k=k, fallback="gather")
    ones = torch.ones(4, dtype=torch.float64)
    check(ids, hidden, weight, t, k, ones, 0 * ones, seed, 0)
    small = run_tp(hidden, weight, 2, temperature=t, seed=seed, top_k=torch.tensor([5, 5, 7, 10]), fallback="error")
    assert small[:2].tolist() == ids[:2].tolist()


@pytest.mark.parametrize("tp", [2, 8])
def test_wide_sets_take_the_fallback(seed, tp):
    """Flat logits: min-p and top-p (T below, at and above 1) sets far wider
    than the candidates are not decided by them (fallback='error' raises) and
    come back right from the gather; unfiltered rows (4, 5) never need it."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=8, vocab=2500, sharp=0.3)
    t = torch.tensor([1.0, 0.7, 1.3, 1.0, 0.7, 1.0, 1.0, 0.5])
    k = torch.tensor([0, 0, 0, 0, 0, 0, 700, 0])
    p = torch.tensor([1.0, 0.95, 0.9, 0.95, 1.0, 1.0, 1.0, 0.99], dtype=torch.float64)
    mp = torch.tensor([0.01, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    kw = dict(temperature=t, seed=seed, top_k=k, top_p=p.float(), min_p=mp.float())
    for row in range(8):
        one = {n: v[row : row + 1] for n, v in kw.items() if isinstance(v, torch.Tensor)}
        if row in (4, 5):
            ids = run_tp(hidden[row : row + 1], weight, tp, seed=seed, offset=row, fallback="error", **one)
            assert torch.equal(
                ids, run_tp(hidden[row : row + 1], weight, tp, seed=seed, offset=row, temperature=t[row])
            )
            continue
        with pytest.raises(ValueError, match="fallback='gather'"):
            run_tp(hidden[row : row + 1], weight, tp, seed=seed, offset=row, fallback="error", **one)
    check(run_tp(hidden, weight, tp, **kw), hidden, weight, t, k, p, mp, seed, 0, share=0.4)  # flat: near-ties


def test_d2t_empty_shards_and_nan(seed):
    """tp 8 over 130 ids (two empty shards, one part-padded): ids
    through d2t are the draft ids' targets; a NaN logit makes every row
    take the NaN's id, as lm_head_sample does (NaN wins)."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=10, vocab=130)
    assert sum(s.num_valid == 0 for _, _, s in make_shards(weight, None, 8, 64)) == 2
    t, k, p, mp = mixed_rows(gen, 10)
    kw = dict(temperature=t, seed=seed, top_k=k, top_p=p, min_p=mp)
    ids = run_tp(hidden, weight, 8, **kw)
    check(ids, hidden, weight, t, k, p, mp, seed, 0)
    d2t = torch.randint(0, 1000, (130,), generator=gen)
    assert torch.equal(run_tp(hidden, weight, 8, d2t=d2t, **kw), ids + d2t[ids])
    weight[123] = math.nan
    nan_ids = run_tp(hidden, weight, 8, **kw)
    assert nan_ids.tolist() == [123] * 10
    assert torch.equal(nan_ids, localargmax.lm_head_sample(hidden, weight, temperature=t, seed=seed))


def test_log_probs_under_the_filtered_distribution(seed):
    """return_log_probs: log of the sampled id's probability under the
    filtered, renormalised softmax(x / T) (float64 on the full matrix)."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=12, vocab=500)
    t, k, p, mp = mixed_rows(gen, 12)
    t[t == 0] = 0.7
    ids, lp = run_tp(hidden, weight, 2, temperature=t, seed=seed, top_k=k, top_p=p, min_p=mp, return_log_probs=True)
    logits = hidden.double() @ weight.double().T
    want = reference(logits, t, k.tolist(), p, mp, seed, 0)
    for b in range(12):
        if want[b][1] or int(ids[b]) != want[b][0]:
            continue
        y = logits[b] / float(t[b])
        keep = _kept_set(y, int(k[b]), float(p[b]), float(mp[b]))
        ref = y[int(ids[b])] - torch.logsumexp(y[keep], 0)
        assert abs(float(lp[b]) - float(ref)) < 1e-4, (b, float(lp[b]), float(ref))


def _kept_set(y, k, p, mp):
    """The allowed ids of one row (float64), for the log-probabilities and the chi-square test."""
    order = sorted(range(len(y)), key=lambda i: (-float(y[i]), i))
    if mp > 0:
        order = [i for i in order if y[i] >= y[order[0]] + math.log(mp)]
    if 0 < k < len(order):
        order = order[:k]
    if p < 1:
        w = torch.exp(y[order] - y[order[0]])
        before = torch.cumsum(w, 0) - w
        order = [i for i, b in zip(order, (before < p * w.sum()).tolist()) if b] or order[:1]
    return torch.tensor(order)


def _gloo_worker(rank, world_size, seed):
    import torch.distributed as dist

    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=10, vocab=1501)
    t, k, p, mp = mixed_rows(gen, 10)
    t[0], k[0] = 1.0, 1000  # past every rank's candidates: the fallback gather
    w, _, s = make_shards(weight, None, world_size, 64, hidden=hidden)[rank]
    kw = dict(vocab_start=s.vocab_start, num_valid=s.num_valid, group=dist.group.WORLD, temperature=t, seed=seed)
    ids = localargmax.lm_head_sample(hidden, w, offset=3, top_k=k, top_p=p, min_p=mp, **kw)
    os.environ["LOCALARGMAX_DEBUG"] = "1"  # the fingerprints and the fallback's counts, compared
    again = localargmax.lm_head_sample(hidden, w, offset=3, top_k=k, top_p=p, min_p=mp, **kw)
    if rank == 1:
        p = p.clone()
        p[0] = 0.5 if p[0] != 0.5 else 0.6
    try:
        localargmax.lm_head_sample(hidden, w, offset=3, top_k=k, top_p=p, min_p=mp, **kw)
        refused = ""
    except ValueError as e:
        refused = str(e)
    return ids.tolist(), again.tolist(), refused


def test_real_gloo_ranks(seed):
    """The same through a real gloo all-gather (and its fallback gather) on 3
    ranks; with LOCALARGMAX_DEBUG=1 the same ids, and ranks called with
    different filters are refused on every rank before any exchange."""
    results = run_ranks(_gloo_worker, 3, seed)
    for ids, again, refused in results:
        assert ids == again == results[0][0]
        assert "ranks disagree on top_p" in refused  # LOCALARGMAX_DEBUG: one rank's top_p differs
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=10, vocab=1501)
    t, k, p, mp = mixed_rows(gen, 10)
    t[0], k[0] = 1.0, 1000
    check(torch.tensor(results[0][0]), hidden, weight, t, k, p, mp, seed, 3)


def test_masks_match_vllm(seed):
    """The allowed sets of the reference match vLLM 0.34's own top-k / top-p
    mask (apply_top_k_top_p_pytorch) on rows without ties."""
    sampler = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler", reason="needs vLLM")
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(16, 300, generator=gen, dtype=torch.float64) * 3
    k = torch.randint(1, 120, (16,), generator=gen)
    p = torch.rand(16, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    masked = sampler.apply_top_k_top_p_pytorch(logits.float().clone(), k, p.float())
    for b in range(16):
        want = set(_kept_set(logits[b], int(k[b]), float(p[b]), 0.0).tolist())
        assert set(masked[b].isfinite().nonzero()[:, 0].tolist()) == want, b


@pytest.mark.parametrize("kind", ["top_k", "top_p", "min_p"])
def test_chi_square_per_filter(seed, kind):
    """Many rows of one problem with fresh noise (offset = row): the sampled
    ids' counts against the float64 filtered softmax (tp 2, p > 1e-4)."""
    scipy_stats = pytest.importorskip("scipy.stats", reason="needs scipy")
    gen = torch.Generator().manual_seed(seed)
    n, vocab = 3000, 200
    args = {"top_k": {"top_k": 12}, "top_p": {"top_p": 0.8}, "min_p": {"min_p": 0.05}}[kind]
    # The problem is drawn again (same generator) until the test can judge it: >= 3 bins, each expected >= 5,
    # ids expected fewer than 5 times pooled into one bin (the chi-square approximation's rule; a flat row
    # under min-p keeps ~180 ids of ~0.1% each). A peaked row keeps 1-2 ids, or its pooled bin sums below 5,
    # for ~1% of draws under min-p; which draw is taken depends on the data alone, never on the sampled ids.
    for _ in range(50):
        weight = torch.randn(vocab, 16, generator=gen) / 4
        hidden = torch.randn(1, 16, generator=gen).expand(n, 16).contiguous() * 1.5
        y = (hidden[0].double() @ weight.double().T) / 0.9
        keep = _kept_set(y, args.get("top_k", 0), args.get("top_p", 1.0), args.get("min_p", 0.0))
        expected = torch.softmax(y[keep], 0) * n
        small = expected < 5
        if bool(small.any()):
            expected = torch.cat([expected[~small], expected[small].sum()[None]])
        if expected.numel() >= 3 and float(expected.min()) >= 5:
            break
    else:
        pytest.fail(f"no problem the chi-square test can judge in 50 draws ({kind})")
    ids = run_tp(hidden, weight, 2, temperature=0.9, seed=seed, **args)
    counts = torch.bincount(ids, minlength=vocab)
    assert int(counts.sum()) == int(counts[keep].sum()), "an id outside the allowed set was sampled"
    observed = counts[keep].double()
    if bool(small.any()):
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
    stat = scipy_stats.chisquare(observed.numpy(), expected.numpy())
    assert stat.pvalue > 1e-4, (kind, stat)


@pytest.mark.slow
def test_torch_compile_fullgraph_with_fallback_error(seed):
    """torch.compile(fullgraph=True) with fallback='error' (no host sync: the
    fallback check is a device-side assert) gives eager's ids, the row with
    every filter off (4) the unfiltered step's; with fallback='gather' a full
    graph is refused (~60 s of compile on 2 cores: slow)."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=6, vocab=500, sharp=0.3)
    t = torch.tensor([0.0, 0.7, 1.0, 1.3, 0.7, 1.0])
    k, p = torch.tensor([0, 5, 20, 40, 0, 3]), torch.tensor([1.0, 0.9, 1.0, 0.8, 1.0, 1.0])
    mp = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.0, 0.0])

    def step(h, w, fallback="error"):
        return localargmax.lm_head_sample(h, w, temperature=t, seed=seed, top_k=k, top_p=p, min_p=mp, fallback=fallback)

    compiled = torch.compile(step, fullgraph=True)(hidden, weight)
    assert torch.equal(compiled, step(hidden, weight))
    assert int(compiled[4]) == int(localargmax.lm_head_sample(hidden, weight, temperature=t, seed=seed)[4])
    with pytest.raises(Exception, match="fallback='gather'|Observed exception"):
        torch.compile(lambda h, w: step(h, w, "gather"), fullgraph=True)(hidden, weight)


def test_bad_arguments():
    hidden, weight = torch.randn(2, 4), torch.randn(10, 4)
    kw = dict(temperature=1.0, seed=1)
    for bad, match in (
        ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"min_p": -0.1}, "min_p"),
        ({"top_k": 2.5}, "top_k"), ({"top_k": torch.ones(3, dtype=torch.int64)}, "top_k"),
        ({"top_p": torch.ones(2, dtype=torch.int64)}, "top_p"), ({"top_k": 3, "fallback": "x"}, "fallback"),
        ({"top_k": 3, "reduce": "all_reduce"}, "all_gather"), ({"fallback": "none"}, "fallback"),
        ({"top_k": torch.ones(2, dtype=torch.bool)}, "top_k"), ({"top_k": True}, "top_k"),
        ({"top_p": float("nan")}, "top_p"), ({"top_k": 3, "seed": -1}, "seed"), ({"top_k": 3, "seed": 2**64}, "seed"),
        ({"top_p": 0.5, "seed": 1.5}, "seed"), ({"min_p": 0.1, "offset": -5}, "offset"),
    ):  # fmt: skip
        with pytest.raises((ValueError, TypeError), match=match):
            localargmax.lm_head_sample(hidden, weight, **dict(kw, **bad))
    # vLLM's own forms are taken as the numbers they hold: an int32 top_k tensor, float64 / numpy top_p
    want = localargmax.lm_head_sample(hidden, weight, **kw, top_k=3, top_p=0.5)
    for k, p in ((torch.full((2,), 3, dtype=torch.int32), 0.5), (3, torch.full((2,), 0.5, dtype=torch.float64))):
        assert torch.equal(localargmax.lm_head_sample(hidden, weight, **kw, top_k=k, top_p=p), want)
    empty = localargmax.lm_head_sample(hidden[:0], weight, **kw, top_k=3, return_log_probs=True)
    assert empty[0].shape == (0,) and empty[1].shape == (0,)
