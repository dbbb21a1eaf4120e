"""localargmax.reference (the float64 reference the benchmark's ``agree``
column uses) against the suite's own fixed-order float64 reference."""

from __future__ import annotations

import torch

from localargmax.reference import reference_argmax, reference_logits
from tests.support.problems import planted_problem, random_problem
from tests.support.reference import ref_argmax, ref_logits


def test_reference_logits_close_to_fixed_order_float64(gen):
    hidden, weight, bias = random_problem(gen, 11, 700, 37, torch.bfloat16, "float32")
    got = reference_logits(hidden, weight, bias)
    assert got.dtype == torch.float64 and got.shape == (11, 700)
    assert torch.allclose(got, ref_logits(hidden, weight, bias), rtol=1e-12, atol=1e-12)


def test_reference_argmax_on_clear_data(gen):
    hidden, weight, bias, winners = planted_problem(gen, 20, 2000, 64, torch.float32, "float32")
    d2t = torch.randint(0, 5, (2000,), generator=gen)
    assert torch.equal(reference_argmax(hidden, weight, bias), winners)
    assert torch.equal(reference_argmax(hidden, weight, bias, d2t), winners + d2t[winners])
    assert torch.equal(ref_argmax(hidden, weight, bias, d2t), winners + d2t[winners])


def test_reference_argmax_breaks_exact_ties_to_smallest_index(gen):
    """DESIGN.md: tests that build exact ties (duplicated rows) must match
    rule 1 exactly, so the float64 reference must give identical rows identical
    logits. With every row identical, the answer is index 0 for every batch row."""
    wrong = []
    for vocab in (5, 9, 17, 33, 100, 431):
        for hsize in (16, 64, 256):
            hidden = torch.randn(8, hsize, generator=gen)
            weight = torch.randn(1, hsize, generator=gen).expand(vocab, hsize).contiguous()
            assert ref_argmax(hidden, weight).tolist() == [0] * 8  # the suite's own reference
            got = reference_argmax(hidden, weight)
            if got.tolist() != [0] * 8:
                wrong.append(f"V={vocab} H={hsize}: {got.tolist()}")
    assert not wrong, "reference_argmax broke exact ties of identical rows towards larger indices:\n" + "\n".join(wrong)
