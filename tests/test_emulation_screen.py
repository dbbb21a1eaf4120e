"""The CUDA kernels' sampling noise screen (DESIGN.md, "The noise screen"),
run by the host emulation: a Philox sampling row's logit takes the double
logs of its Gumbel noise only when a float upper bound of its key can still
beat a floor the row's best is known to reach; the draws stay the CPU
kernel's bit for bit. Checked here: the float bounds against the exact noise,
the keys on hard rows (every path and config, blocks in scrambled orders so
that the floor from other blocks differs), and the fraction of logits that
take the logs on realistic rows (the emulation runs blocks one after
another, so the floor other blocks leave is as high as it gets; a GPU runs
them at once). The emulation cannot time."""

from __future__ import annotations

import pytest
import torch

from tests.support import emulation
from tests.support.emulation_cases import EVERY_PATH_AND_CONFIG, assert_keys_equal, cpu_keys, exact_problem

pytestmark = pytest.mark.skipif(not emulation.have_compiler(), reason="g++ / objcopy not found")


def test_float_noise_bounds_hold_on_every_kind_of_word(emu):
    """gumbel_estimate(x) is within a small part of gumbel_slack of
    gumbel_of_word(x): on 4.2 million words spread over the range and on
    every word near the ends, near 2**31 (where the estimate changes
    formula) and near u = 1/e (noise near 0); the largest word's noise,
    22.87, among them."""
    ranges = [
        (0, 1021, 2**32 // 1021 + 1),  # the whole range
        (0, 1, 1 << 16),  # u near 0: noise near -3.1
        (2**32 - (1 << 16), 1, 1 << 16),  # u near 1: noise up to 22.87
        (2**31 - (1 << 15), 1, 1 << 16),  # the switch from logf to log1pf
        (int(0.36787944 * 2**32) - (1 << 15), 1, 1 << 16),  # noise near 0
    ]
    worst, top = 0.0, float("-inf")
    for first, stride, n in ranges:
        w, t = emu.noise_bounds(first, stride, n)
        worst, top = max(worst, w), max(top, t)
    assert worst < 1 / 16, f"the float estimate's error is {worst:.3g} of the slack"
    assert 22.8 < top < 22.9, top


def _hard_problem(gen, dtype, batch, rows):
    """Exact logits with the screen's hard cases planted: whole runs of rows
    with equal logits (the noise alone decides), a NaN row, +inf and -inf
    biases, and a shard whose every logit is -inf for the last batch rows'
    temperatures to face."""
    h, w, _ = exact_problem(gen, batch, rows, 16, dtype)
    w[64:200] = w[64]  # equal logits across blocks
    w[300] = float("nan")  # NaN in every batch row
    b = torch.zeros(rows, dtype=torch.float32)
    b[7] = float("inf")
    b[8:40] = float("-inf")
    return h, w, b


@pytest.mark.parametrize("path,dtype", EVERY_PATH_AND_CONFIG)
def test_screened_draws_equal_the_cpu_kernel_on_hard_rows(emu, gen, path, dtype):
    """Every path and forced config, blocks in two scrambled orders: the keys
    of sampling rows (temperatures 0 to 7, with a batch past one n-tile and
    ids past 2**24) equal the CPU kernel's draws."""
    batch, rows = 11, 420
    h, w, b = _hard_problem(gen, dtype, batch, rows)
    temperature = torch.tensor([1.0, 0.5, 2.0, 1e-3, 7.0, 0.0, 1.0, 0.7, 1.3, 0.9, 1.0])
    for order_seed in (1, 2):
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        for name, bias in (("nan/inf planted", b), ("no bias", None)):
            start = 2**24 + 5
            got = emu.shard(
                h, w, bias, start, rows, path=path, temperature=temperature, seed=seed, offset=3, scramble=True,
                order_seed=order_seed,
            )  # fmt: skip
            want = cpu_keys(h, w, bias, start, rows, temperature=temperature, seed=seed, offset=3)
            assert_keys_equal(got, want, f"{path} {name} order {order_seed}")
    # a shard of -inf logits only: every sampling row's best is -inf with the smallest id
    minus = torch.full((rows,), float("-inf"))
    got = emu.shard(h, w, minus, 0, rows, path=path, temperature=temperature, seed=5, offset=0)
    assert_keys_equal(got, cpu_keys(h, w, minus, 0, rows, temperature=temperature, seed=5, offset=0), path)


def _realistic_problem(gen, dtype, batch, rows):
    """Exact logits spread like a language model's (standard deviation about
    2.5): hidden in -3..3, weight in -8/16..8/16, hidden size 16."""
    h = torch.randint(-3, 4, (batch, 16), generator=gen).to(dtype)
    w = (torch.randint(-8, 9, (rows, 16), generator=gen).float() / 16).to(dtype)
    return h, w


@pytest.mark.parametrize(
    "path,dtype",
    [("simt", torch.float32), ("simt", torch.bfloat16), ("mma", torch.bfloat16), ("mma/n16_r64", torch.float16),
     ("mma/n1_r64_tma", torch.bfloat16), ("gemm", torch.bfloat16)],
)  # fmt: skip
def test_few_logits_take_the_logs_on_realistic_rows(emu, gen, path, dtype):
    """Batch 8, a shard of 4096 rows, temperatures 0.7 and 1.0: the draws are
    the CPU kernel's, and fewer than 2% of the logits take the double logs
    (before the screen: every one). The fraction is in the failure message."""
    batch, rows = 8, 4096
    h, w = _realistic_problem(gen, dtype, batch, rows)
    temperature = torch.tensor([0.7, 1.0] * 4)
    got = emu.shard(h, w, None, 1000, rows, path=path, temperature=temperature, seed=77, offset=0)
    stats = emu.stats()
    assert_keys_equal(got, cpu_keys(h, w, None, 1000, rows, temperature=temperature, seed=77, offset=0), path)
    logs, words = stats["noise_logs"] / (batch * rows), stats["noise_words"] / (batch * rows)
    print(f"{path}: {logs:.3%} of the logits took the logs, {words:.1%} drew a Philox word")
    assert 0 < logs < 0.02, f"{path}: {logs:.2%} of the logits took the logs ({words:.1%} drew a Philox word)"


def test_the_screen_counts_logs_only_on_sampling_rows(emu, gen):
    """Greedy rows (temperature 0) and argmax calls take no noise: the
    counters stay at zero; a sampling call counts."""
    h, w = _realistic_problem(gen, torch.bfloat16, 4, 512)
    emu.shard(h, w, None, 0, 512, path="mma", temperature=torch.zeros(4), seed=1)
    assert emu.stats()["noise_words"] == 0 and emu.stats()["noise_logs"] == 0
    emu.shard(h, w, None, 0, 512, path="simt")
    assert emu.stats()["noise_logs"] == 0
    emu.shard(h, w, None, 0, 512, path="simt", temperature=torch.ones(4), seed=1)
    assert emu.stats()["noise_logs"] >= 4  # at least each row's winner
