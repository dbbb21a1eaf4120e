"""Operator registration, torch.library.opcheck (schema, fake tensors, AOT
dispatch) and torch.compile(fullgraph=True) on the CPU."""
from __future__ import annotations

import pytest
import torch

import localargmax

OPS = ["localargmax::shard_argmax", "localargmax::merge_keys"]


@pytest.mark.parametrize("name", OPS)
def test_ops_exist_with_cpu_kernel(name):
    ns, op = name.split("::")
    packet = getattr(getattr(torch.ops, ns), op)
    assert hasattr(packet, "default")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU"), f"{name} has no CPU kernel"


def test_schemas():
    """The schemas of csrc/ops.cpp: integer outputs, no aliasing, no mutation."""
    assert str(torch.ops.localargmax.shard_argmax.default._schema) == (
        "localargmax::shard_argmax(Tensor hidden, Tensor weight, Tensor? bias, int vocab_start, int num_valid, "
        'str path="auto") -> Tensor'
    )
    assert str(torch.ops.localargmax.merge_keys.default._schema) == (
        "localargmax::merge_keys(Tensor keys, Tensor? d2t) -> (Tensor, Tensor)"
    )


def test_with_cuda_flag_is_bool():
    assert isinstance(localargmax.WITH_CUDA, bool)


@pytest.mark.parametrize("name", OPS)
def test_cuda_kernel_registered_when_built_with_cuda(name):
    if not localargmax.WITH_CUDA:
        pytest.skip("built without CUDA (torch CPU-only or nvcc not found or LOCALARGMAX_CUDA=0)")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA"), f"{name} has no CUDA kernel"


def _shard_samples(gen):
    samples = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        hidden = torch.randn(5, 19, generator=gen).to(dtype)
        weight = torch.randn(70, 19, generator=gen).to(dtype)
        samples.append((hidden, weight, None, 0, 70))
        samples.append((hidden, weight, torch.randn(70, generator=gen), 1000, 65))
        samples.append((hidden, weight, torch.randn(70, generator=gen).to(dtype), 7, 0))
    samples.append((torch.randn(0, 4, generator=gen), torch.randn(3, 4, generator=gen), None, 0, 3))
    return samples


def test_opcheck_shard_argmax(gen):
    for args in _shard_samples(gen):
        torch.library.opcheck(torch.ops.localargmax.shard_argmax.default, args)


def test_opcheck_merge_keys(gen):
    hidden = torch.randn(6, 11, generator=gen)
    keys = torch.stack(
        [localargmax.shard_argmax(hidden, torch.randn(50, 11, generator=gen), vocab_start=r * 50) for r in range(3)]
    )
    d2t = torch.randint(0, 1000, (150,), generator=gen)
    for args in [(keys, None), (keys, d2t), (keys[0], None), (keys[1], d2t), (keys[:, :0], None)]:
        torch.library.opcheck(torch.ops.localargmax.merge_keys.default, args)


def test_fake_kernels_give_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        hidden = torch.empty(9, 16, dtype=torch.bfloat16)
        weight = torch.empty(128, 16, dtype=torch.bfloat16)
        keys = torch.ops.localargmax.shard_argmax.default(hidden, weight, None, 0, 100)
        assert keys.shape == (9,) and keys.dtype == torch.int64
        ids, values = torch.ops.localargmax.merge_keys.default(torch.empty(4, 9, dtype=torch.int64), None)
        assert ids.shape == (9,) and ids.dtype == torch.int64
        assert values.shape == (9,) and values.dtype == torch.float32
        # the fake kernel checks arguments too
        with pytest.raises(ValueError, match="num_valid"):
            torch.ops.localargmax.shard_argmax.default(hidden, weight, None, 0, 129)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(gen, backend):
    torch._dynamo.reset()
    vocab = 300
    hidden = torch.randn(6, 40, generator=gen)
    weight = torch.randn(320, 40, generator=gen)
    weight[vocab:] = float("nan")  # padding
    bias = torch.randn(320, generator=gen)
    d2t = torch.randint(0, 50, (vocab,), generator=gen)

    def step(h, w, b, d):
        return localargmax.lm_head_argmax(h, w, vocab_start=0, num_valid=vocab, bias=b, d2t=d)

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    eager = step(hidden, weight, bias, d2t)
    got = compiled(hidden, weight, bias, d2t)
    assert torch.equal(got, eager)
    # a second batch size (recompile or dynamic shapes), no d2t
    hidden2 = torch.randn(3, 40, generator=gen)
    assert torch.equal(compiled(hidden2, weight, bias, d2t), step(hidden2, weight, bias, d2t))
    compiled_plain = torch.compile(
        lambda h, w: localargmax.lm_head_argmax(h, w, num_valid=vocab), fullgraph=True, backend=backend
    )
    assert torch.equal(compiled_plain(hidden, weight), localargmax.lm_head_argmax(hidden, weight, num_valid=vocab))
