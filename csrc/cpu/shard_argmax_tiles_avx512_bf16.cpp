// AVX-512-BF16 build of the CPU tile kernel (see shard_argmax_tiles.h):
// bfloat16 weights through vdpbf16ps (not bit-identical to the other builds),
// float32 / float16 weights as the AVX-512F build.
// CMake compiles this file with -mavx2 -mfma -mf16c -mavx512f -mavx512bw
// -mavx512bf16 -ffp-contract=off.
#define LAM_TILES_FN shard_argmax_tiles_avx512_bf16
#define LAM_FMA_PEAK_FN dpbf16_peak
#include "shard_argmax_tiles_impl.inc"
