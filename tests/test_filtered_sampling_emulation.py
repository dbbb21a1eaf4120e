"""Filtered sampling on the CUDA side, in the host emulation (tests/support/
emulation.py): the emulated top-K + log-partition kernel (shard_topk_lse's
CUDA auto path: the tensor-core kernel for bf16, the CUDA-core one for
float32) of each shard feeds the filtered
decision (localargmax.sampling.decide_rows) as the exchange would; the ids, with
the fallback rows recomputed as the gather does, are the float64
reference's on every row but near-ties (tests/test_filtered_sampling.py)."""

from __future__ import annotations

import pytest
import torch

import localargmax
from localargmax import sampling
from tests.support import emulation
from tests.support.problems import make_shards
from tests.test_filtered_sampling import check, mixed_rows, problem

pytestmark = pytest.mark.skipif(not emulation.have_compiler(), reason="g++ / objcopy not found")


def emulated_sample(emu, hidden, weight, tp, t, k, p, mp, seed, offset):
    """lm_head_sample's filtered path with every rank's keys and pairs from
    the emulated CUDA kernel (its noised best keys, the sampling kernel's,
    for the rows with every filter off); returns (ids, need) with the rows
    ``need`` (not decided by the candidates) recomputed from the full float32
    logits."""
    keys, pairs, best = [], [], []
    path = "simt" if weight.dtype == torch.float32 else "mma"  # (CUDA auto's top-k path)
    for w, _, s in make_shards(weight, None, tp, 64, hidden=hidden):
        kk, pp = emu.shard(
            hidden, w, None, s.vocab_start, s.num_valid, path=path, k=sampling.CANDIDATES, log_partition=True
        )
        keys.append(kk)
        pairs.append(pp)
        best.append(emu.shard(hidden, w, None, s.vocab_start, s.num_valid, temperature=t, seed=seed, offset=offset))
    gathered, pairs = torch.stack(keys), torch.stack(pairs)
    rows = torch.arange(hidden.shape[0]) + offset
    draft, _, need = sampling.decide_rows(gathered, pairs, t, k, p.double(), mp.double(), seed, rows, weight.shape[0])
    merged = lambda keys: localargmax.decode_keys((keys ^ emulation.SIGN).max(dim=0).values ^ emulation.SIGN)[0]  # noqa: E731
    off = (t > 0) & (k <= 0) & (p >= 1) & (mp <= 0)
    ids = torch.where(off, merged(torch.stack(best)), torch.where(draft >= 0, draft, merged(gathered[..., 0])))
    if bool(need.any()):
        idx = need.nonzero()[:, 0]
        logits = hidden[idx].float() @ weight.float().T
        fb, _ = sampling.filter_and_sample(logits, t[idx], k[idx], p[idx].double(), mp[idx].double(), seed, rows[idx])
        ids[idx] = fb
    return ids, need


@pytest.mark.parametrize("tp", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_emulated_cuda_candidates_give_the_reference_ids(emu, seed, tp, dtype):
    """Mixed greedy / unfiltered / top-k / top-p / min-p rows over uneven
    padded shards (tp 8: some empty) whose padding would win; both the rows
    the candidates decide and the fallback rows occur."""
    gen = torch.Generator().manual_seed(seed)
    hidden, weight = problem(gen, batch=24, vocab=900 if tp < 8 else 450)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    t, k, p, mp = mixed_rows(gen, hidden.shape[0])
    t[0], k[0], p[0], mp[0] = 1.0, 5, 1.0, 0.0  # decided by the candidates
    t[1], k[1], p[1], mp[1] = 1.0, 3 * sampling.CANDIDATES, 1.0, 0.0  # beyond them (tp 1, 3): the fallback
    ids, need = emulated_sample(emu, hidden, weight, tp, t, k, p, mp, seed, 11)
    assert not bool(need[0]) and (tp == 8 or bool(need[1])), need.tolist()
    check(ids, hidden, weight, t, k, p.double(), mp.double(), seed, 11)
