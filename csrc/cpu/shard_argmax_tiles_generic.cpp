// Baseline-ISA build of the CPU tile kernel (see shard_argmax_tiles.h), for
// CPUs without AVX2. Same arithmetic, same results, slower.
#define LAM_TILES_FN shard_argmax_tiles_generic
#include "shard_argmax_tiles_impl.inc"
