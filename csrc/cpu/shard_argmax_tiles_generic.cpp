// Baseline-ISA build of the CPU tile kernel (see shard_argmax_tiles.h), for
// CPUs without AVX2. Same arithmetic, same results, slower. It also holds
// emit_block, the epilogue the brgemm path shares.
#define LAM_TILES_FN shard_argmax_tiles_generic
#define LAM_EMIT_BLOCK_FN emit_block
#include "shard_argmax_tiles_impl.inc"
