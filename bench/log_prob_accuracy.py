"""Accuracy of the fused log-probabilities (DESIGN.md, "Log-probabilities"):
max |fused - float64| of lm_head_topk / lm_head_sample(return_log_probs=True)
on 4 simulated TP ranks (the CPU kernel; padding that would dominate the sum
if counted), float32 and bfloat16 weights, with and without scale / soft-cap.

    PYTHONPATH=. python bench/log_prob_accuracy.py V H      # e.g. 32000 512
"""

import sys

import torch

from tests.support.problems import make_shards, simulated_sample_log_probs, simulated_topk_log_probs
from tests.support.reference import ref_log_probs, ref_logits

V, H, B, TP = int(sys.argv[1]), int(sys.argv[2]), 16, 4
for dtype in (torch.float32, torch.bfloat16):
    gen = torch.Generator().manual_seed(1)
    hidden = (torch.randn(B, H, generator=gen) * 2).to(dtype)
    weight = (torch.randn(V, H, generator=gen) / H**0.5).to(dtype)
    logits = ref_logits(hidden, weight)
    shards = make_shards(weight, None, TP, 64, hidden=hidden)
    for lp in ({}, {"logit_scale": 0.5}, {"soft_cap": 5.0, "logit_scale": 1.3}):
        scale, cap = lp.get("logit_scale", 1.0), lp.get("soft_cap")
        ids, got = simulated_topk_log_probs(hidden, shards, 8, **lp)
        err = (got.double() - ref_log_probs(logits, scale, cap).gather(1, ids)).abs().max()
        t = torch.tensor([0.0, 0.7, 1.0, 1.5] * (B // 4))
        s_ids, s_lp = simulated_sample_log_probs(hidden, shards, t, 3, 0, **lp)
        s_err = (s_lp.double() - ref_log_probs(logits, scale, cap, t).gather(1, s_ids[:, None])[:, 0]).abs().max()
        print(
            f"{str(dtype):15} V={V} H={H} B={B} tp={TP} {lp}: top-8 max err {float(err):.2e}, "
            f"sample {float(s_err):.2e}, |logit| max {float(logits.abs().max()):.1f}"
        )
