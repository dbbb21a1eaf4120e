// The kernels of the six fused shard ops (csrc/ops.cpp defines their schemas)
// for one dispatch key, in one list for every device:
//
//   TORCH_LIBRARY_IMPL(localargmax, CPU, m) { LOCALARGMAX_IMPL_SHARD_OPS(m, cpu, cpu); }
//
// registers cpu::shard_argmax_cpu as "shard_argmax", and so on.
#pragma once

#define LOCALARGMAX_IMPL_SHARD_OPS(m, NS, SUFFIX)                 \
  do {                                                            \
    (m).impl("shard_argmax", &NS::shard_argmax_##SUFFIX);         \
    (m).impl("shard_topk", &NS::shard_topk_##SUFFIX);             \
    (m).impl("shard_sample", &NS::shard_sample_##SUFFIX);         \
    (m).impl("shard_argmax_lse", &NS::shard_argmax_lse_##SUFFIX); \
    (m).impl("shard_topk_lse", &NS::shard_topk_lse_##SUFFIX);     \
    (m).impl("shard_sample_lse", &NS::shard_sample_lse_##SUFFIX); \
  } while (0)
