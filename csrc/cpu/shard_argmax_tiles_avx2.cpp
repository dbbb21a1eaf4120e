// AVX2 + FMA + F16C build of the CPU tile kernel (see shard_argmax_tiles.h).
// CMake compiles this file with -mavx2 -mfma -mf16c -ffp-contract=off.
#define LAM_TILES_FN shard_argmax_tiles_avx2
#define LAM_EMIT_BLOCK_FN emit_block_avx2
#define LAM_FMA_PEAK_FN fma_peak_avx2
#include "shard_argmax_tiles_impl.inc"
