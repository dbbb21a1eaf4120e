// Baseline-ISA build of the CPU tile kernel (see shard_argmax_tiles.h), for
// CPUs without AVX2. Same arithmetic, same results, slower. It also holds
// emit_block, the epilogue the brgemm path shares, which runs the widest
// ISA build of it the CPU has (all give the same keys).
#define LAM_TILES_FN shard_argmax_tiles_generic
#define LAM_EMIT_BLOCK_FN emit_block_generic
#include "shard_argmax_tiles_impl.inc"

namespace localargmax {
namespace cpu {

void emit_block(const ShardArgmaxProblem& p, const float* dots, int64_t ld, int64_t row0, int64_t rows, int64_t b0,
                int64_t nb, uint64_t* best_keys) {
  static const EmitBlockFn fn = __builtin_cpu_supports("avx512f")                                      ? emit_block_avx512
                                : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? emit_block_avx2
                                                                                                   : emit_block_generic;
  fn(p, dots, ld, row0, rows, b0, nb, best_keys);
}

}  // namespace cpu
}  // namespace localargmax
