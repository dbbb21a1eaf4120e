"""The rank body of tests/test_vllm_engine.py's bit test: adversarial int64
words through every all-gather route vLLM's CPU build takes (its shared-memory
``shm_all_gather`` where its extension has the shared-memory ops, and gloo),
compared word for word."""

from __future__ import annotations

import itertools
import os

import torch

# float32 bit patterns an all-gather must not touch: quiet and signalling NaNs (both signs, payloads),
# infinities, zeros, denormals, the largest finite, 1.0
HALVES = [
    0x7FC00000, 0x7FC00001, 0x7F800001, 0x7FBFFFFF, 0xFFC00001, 0xFF800001, 0xFFFFFFFF, 0x7FFFFFFF,
    0x7F800000, 0xFF800000, 0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x80000001, 0x807FFFFF,
    0x7F7FFFFF, 0x3F800000,
]  # fmt: skip
LENGTHS = (1, 2, 3, 17, len(HALVES) ** 2 + 1, (1 << 18) + 3)  # words; the last is 2 MiB, past one shm chunk


def words(rank: int, length: int, seed: int) -> torch.Tensor:
    """``[length]`` int64 of rank ``rank``: every pair of :data:`HALVES` as
    (low, high), then random words; rank-dependent (every other word's bits
    rotated by the rank), the same on every rank for a given rank."""
    pairs = [(hi << 32) | lo for lo, hi in itertools.product(HALVES, HALVES)]
    pairs = [p - (1 << 64) if p >= 1 << 63 else p for p in pairs]
    out = torch.tensor(pairs, dtype=torch.int64)
    extra = torch.randint(
        -(2**63), 2**63 - 1, (length,), dtype=torch.int64, generator=torch.Generator().manual_seed(seed)
    )
    out = torch.cat([out, extra])[:length].clone()
    if rank:
        out[1::2] = ~out[1::2]
        out = out.roll(rank)
    return out


def worker(rank: int, world_size: int, seed: int) -> dict:
    os.environ["VLLM_DIST_IDENT"] = f"localargmax-test-{seed}"  # vLLM's CPU worker sets it before its groups
    from vllm.platforms import current_platform

    from tests.support.vllm_common import vllm_setup

    current_platform.import_kernels()  # vLLM's kernels (its shm ops among them), as its CPU worker loads them
    ctx, _ = vllm_setup(rank, world_size)
    try:
        from vllm.distributed import get_tp_group

        from localargmax.integrations.vllm import collective

        coordinator = get_tp_group()
        communicator = coordinator.device_communicator
        out = {
            # vLLM's AVX-512 extension has the shared-memory ops, its AVX2 one (AVX2-only CPUs) does not
            "shm ops": hasattr(torch.ops._C, "init_shm_manager"),
            "communicator": type(communicator).__name__,
            "dist_module": type(getattr(communicator, "dist_module", None)).__name__,
            "payload_dtype": str(collective.payload_dtype(communicator)),
            "mismatches": {},
            "refused": {},
        }
        plugin_gather = collective.coordinator_all_gather(coordinator)
        routes = {
            "plugin": plugin_gather,
            "coordinator float32": lambda x: coordinator.all_gather(x.view(torch.float32), dim=0),
            "coordinator int32": lambda x: coordinator.all_gather(x.view(torch.int32), dim=0),
        }
        for dtype in (torch.int32, torch.float32, torch.int64):

            def gloo(x, dtype=dtype):
                x = x.view(dtype)
                result = x.new_empty(world_size * x.numel())
                torch.distributed.all_gather_into_tensor(result, x, group=coordinator.device_group)
                return result

            routes[f"gloo {str(dtype).split('.')[-1]}"] = gloo
        for name, route in routes.items():
            for length in LENGTHS:
                mine = words(rank, length, seed + length)
                want = torch.stack([words(r, length, seed + length) for r in range(world_size)])
                try:
                    got = route(mine.clone())
                except (NotImplementedError, RuntimeError) as e:
                    out["refused"][name] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                    break
                got = got.contiguous().view(torch.int64).reshape(world_size, -1)[:, :length]
                bad = (got != want).sum().item()
                if bad:
                    out["mismatches"][f"{name} L={length}"] = bad
            else:
                out.setdefault("ran", []).append(name)
        return out
    finally:
        ctx.__exit__(None, None, None)
