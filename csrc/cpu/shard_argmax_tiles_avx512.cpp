// AVX-512F build of the CPU tile kernel (see shard_argmax_tiles.h): two
// weight rows per zmm, bit-identical to the generic and AVX2 builds.
// CMake compiles this file with -mavx2 -mfma -mf16c -mavx512f -ffp-contract=off.
#define LAM_TILES_FN shard_argmax_tiles_avx512
#define LAM_EMIT_BLOCK_FN emit_block_avx512
#define LAM_FMA_PEAK_FN fma_peak_avx512
#include "shard_argmax_tiles_impl.inc"
