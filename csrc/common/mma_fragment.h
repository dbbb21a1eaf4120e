// Which k of a 32-element chunk sits in which half of which mma.sync register,
// for the tensor-core shard-argmax kernel (cuda/fused_keys_mma.cuh).
// LAM_HD (host and device) so tests/cpp/test_mma_fragment.cpp (driven by
// tests/test_mma_fragment_cpp.py) can check it on the CPU against an
// emulation of mma.sync written from the PTX ISA's fragment tables.
//
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} (PTX ISA, "Matrix
// Fragments for mma.m16n8k16 with floating point type"); lane l, group
// g = l / 4, thread-in-group t = l % 4; a 32-bit register holds two 16-bit
// elements, the lower column / row in the low half:
//   A (16 x 16, row major): reg r = 0..3 holds A[g + 8*(r%2)][2t + 8*(r/2) + {0,1}]
//   B (16 x 8, column major): reg r = 0..1 holds B[2t + 8r + {0,1}][g]
//   C (16 x 8, float32):      reg r = 0..3 holds C[g + 8*(r/2)][2t + r%2]
//
// Our use: A = 16 weight rows, B = 8 batch rows of hidden (transposed), C =
// the logits. A sum over k may visit k in any order as long as A and B agree,
// so each lane loads 16 contiguous bytes (8 elements, k = kc + 8t .. kc + 8t + 7)
// of its weight rows g and g + 8 and of its hidden row g, as 4 words w0..w3,
// and feeds them to two mma steps s = 0, 1:
//   A regs {w[2s] of row g, w[2s] of row g+8, w[2s+1] of row g, w[2s+1] of row g+8}
//   B regs {w[2s] of hidden row g, w[2s+1] of hidden row g}
// so mma column 2t + 8h + j (h, j in {0,1}) of step s is real k
// kc + 8t + 4s + 2h + j, the same for A and B. Every weight row goes through the
// same chunks in the same order with the same positions, so the logit of a row
// does not depend on where the row sits (DESIGN.md rule 5).
#pragma once

#include "host_device.h"

namespace localargmax {

constexpr int kMmaChunkK = 32;  // k elements per chunk: 2 mma steps of k16

// Offset in [0, 32) of the element that mma step s feeds at mma k-column
// `col` (0..15) for a lane with thread-in-group t: the inverse of the load
// pattern above. Lanes with the same t own the same k.
LAM_HD int mma_chunk_k(int t, int s, int col) {
  // col = 2t' + 8h + j; only lanes with t' == t hold it, so t is implied.
  const int h = col / 8;
  const int j = col % 2;
  return 8 * t + 4 * s + 2 * h + j;
}

// The word (0..3) of a lane's 16-byte load that feeds register `reg` of A
// (reg 0..3) or of B (reg 0..1) in mma step s.
LAM_HD int mma_a_word(int s, int reg) { return 2 * s + reg / 2; }
LAM_HD int mma_a_row_half(int reg) { return reg % 2; }  // 0: row g, 1: row g + 8
LAM_HD int mma_b_word(int s, int reg) { return 2 * s + reg; }

// Row (0..15) and column (0..7) of accumulator register r (0..3) of lane l.
LAM_HD int mma_c_row(int lane, int r) { return lane / 4 + 8 * (r / 2); }
LAM_HD int mma_c_col(int lane, int r) { return 2 * (lane % 4) + r % 2; }

}  // namespace localargmax
