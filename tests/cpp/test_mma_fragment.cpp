// Checks csrc/common/mma_fragment.h (how the tensor-core kernel feeds
// mma.sync m16n8k16) on the CPU: a warp's register contents are built exactly
// as fused_keys_mma.cuh builds them (16-byte loads at k = 8t, words
// picked by mma_a_word / mma_a_row_half / mma_b_word), an emulated mma.sync
// multiplies them, written from the PTX ISA fragment tables independently of
// the header, and the result is compared with the direct product over the
// 32-element chunk. Values are small integers, so every sum is exact.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "common/mma_fragment.h"

using namespace localargmax;

namespace {

// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type",
// 16-bit A / B, 32-bit C. Lane l: groupID = l >> 2, threadID_in_group = l % 4.
// A: a_i for i in 0..7, register i / 2, half i % 2:
//   row = groupID for a0,a1,a4,a5 and groupID + 8 for a2,a3,a6,a7
//   col = threadID_in_group * 2 + (i & 1) for a0..a3, + 8 for a4..a7
// B: b_i for i in 0..3: row = threadID_in_group * 2 + (i & 1) (+ 8 for b2, b3), col = groupID
// C: c_i for i in 0..3: row = groupID (+ 8 for c2, c3), col = threadID_in_group * 2 + (i & 1)
void ptx_mma(const uint32_t a[32][4], const uint32_t b[32][2], long long c[32][4]) {
  long long A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int gid = l >> 2, tig = l % 4;
    for (int i = 0; i < 8; ++i) {
      const uint32_t reg = a[l][i / 2];
      const long long v = (i % 2) ? (reg >> 16) : (reg & 0xFFFFu);
      const int row = gid + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0);
      const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = v;
    }
    for (int i = 0; i < 4; ++i) {
      const uint32_t reg = b[l][i / 2];
      const long long v = (i % 2) ? (reg >> 16) : (reg & 0xFFFFu);
      B[tig * 2 + (i & 1) + (i >= 2 ? 8 : 0)][gid] = v;
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int gid = l >> 2, tig = l % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = gid + (i >= 2 ? 8 : 0), col = tig * 2 + (i & 1);
      long long s = 0;
      for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
      c[l][i] += s;
    }
  }
}

uint32_t word(const uint16_t* p, int i) { return uint32_t(p[2 * i]) | (uint32_t(p[2 * i + 1]) << 16); }

int fail(const char* what, int a, int b, long long got, long long want) {
  std::printf("FAIL %s (%d, %d): got %lld want %lld\n", what, a, b, got, want);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937 rng(argc > 1 ? std::atoi(argv[1]) : 1);
  std::uniform_int_distribution<int> dist(0, 255);
  for (int trial = 0; trial < 200; ++trial) {
    uint16_t W[16][kMmaChunkK], X[8][kMmaChunkK];  // 16 weight rows, 8 hidden rows, one chunk
    for (auto& r : W) for (auto& v : r) v = static_cast<uint16_t>(dist(rng));
    for (auto& r : X) for (auto& v : r) v = static_cast<uint16_t>(dist(rng));
    long long C[32][4] = {};
    for (int s = 0; s < 2; ++s) {
      uint32_t a[32][4], b[32][2];
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        // the lane's 16-byte loads: rows g and g + 8 of W, row g of X, at k = 8t
        const uint16_t* wrow[2] = {&W[g][8 * t], &W[g + 8][8 * t]};
        for (int reg = 0; reg < 4; ++reg) a[l][reg] = word(wrow[mma_a_row_half(reg)], mma_a_word(s, reg));
        for (int reg = 0; reg < 2; ++reg) b[l][reg] = word(&X[g][8 * t], mma_b_word(s, reg));
        // mma_chunk_k names the real k of each A element this lane feeds
        for (int reg = 0; reg < 4; ++reg)
          for (int j = 0; j < 2; ++j) {
            const int col = 2 * t + 8 * (reg / 2) + j, row = g + 8 * (reg % 2);
            const uint32_t v = j ? a[l][reg] >> 16 : a[l][reg] & 0xFFFFu;
            if (v != W[row][mma_chunk_k(t, s, col)]) return fail("mma_chunk_k", row, col, v, W[row][mma_chunk_k(t, s, col)]);
          }
      }
      ptx_mma(a, b, C);
    }
    for (int l = 0; l < 32; ++l)
      for (int r = 0; r < 4; ++r) {
        const int row = mma_c_row(l, r), col = mma_c_col(l, r);
        long long want = 0;
        for (int k = 0; k < kMmaChunkK; ++k) want += (long long)W[row][k] * X[col][k];
        if (C[l][r] != want) return fail("logit", row, col, C[l][r], want);
      }
  }
  std::printf("OK\n");
  return 0;
}
