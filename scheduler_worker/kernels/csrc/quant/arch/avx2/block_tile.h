// The block loop the per-block AVX2 tiles share (kquant.h, codebook.h): per block of 32
// inputs, a format's Block gives the RM x 16 int32 dot products and the block's float
// scales of each half (8 output rows); the loop applies them to every activation row.
#pragma once

#include "common.h"

namespace zs_qgemm {

// Per half h of the group: the block's weight scale (d, or the super-block's d times the
// block's scale) and its minimum's (m; zero where the format has none).
// Bytes a block's unpacked planes take (kquant.h, kq_unpack).
constexpr int64_t KQ_PLANE_BYTES = 512;

struct Scales {
  __m256 dw, mw;
};

// RM activation rows x halves [H0, H1) of a group of 16 output rows (two halves of 8;
// gemm.cpp: one half from 4 rows on). Block<FMT, RM, H0, H1> has
//   dot(wb, xb, iacc): the int32 sums of the block at wb with each row's int8 block xb[i];
//   scales(w, g, b, h): the block's Scales for half h (it may keep a super-block's state).
// The row update: d dx dot + m s (a minimum), d (dx dot - offset s) (an offset), or d dx dot.
// A Block with U (kquant.h's unpacked one) reads its weights from `unpacked` (KQ_PLANE_BYTES a block, kquant.h)
// instead of the packed group; the scales still come from w.
template <int FMT, int RM, typename Block, int H0 = 0, int H1 = 2, typename T>
ZS_AVX2 ZS_INLINE void block_tile_avx2(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead,
                                       const uint8_t* unpacked = nullptr) {
  constexpr bool U = Block::U;
  using L = Layout<FMT>;
  const int64_t nb = w.nb;
  Block blk;
  __m256 facc[RM][2];
  for (int i = 0; i < RM; ++i) facc[i][0] = facc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = U ? unpacked + b * KQ_PLANE_BYTES : sub_block<FMT>(w, g, b);
    if (!U && x.prefetch && i0 == 0 && H0 == 0) prefetch_block_ahead<L::SBB>(wb);
    ahead.fetch(b);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    __m256i iacc[RM][2];
    blk.dot(wb, xb, iacc);
    for (int h = H0; h < H1; ++h) {
      const Scales s = blk.scales(w, g, b, h);
      for (int i = 0; i < RM; ++i) {
        const __m256 dot = _mm256_cvtepi32_ps(iacc[i][h]);
        const __m256 dx = _mm256_set1_ps(x.d[(i0 + i) * nb + b]);
        if constexpr (L::M) {
          facc[i][h] = _mm256_fmadd_ps(s.dw, _mm256_mul_ps(dot, dx), facc[i][h]);
          facc[i][h] = _mm256_fmadd_ps(s.mw, _mm256_set1_ps(x.s[(i0 + i) * nb + b]), facc[i][h]);
        } else if constexpr (L::R.offset != 0) {
          const __m256 u = _mm256_fmsub_ps(dot, dx, _mm256_set1_ps(static_cast<float>(L::R.offset) * x.s[(i0 + i) * nb + b]));
          facc[i][h] = _mm256_fmadd_ps(s.dw, u, facc[i][h]);
        } else {
          facc[i][h] = _mm256_fmadd_ps(s.dw, _mm256_mul_ps(dot, dx), facc[i][h]);
        }
      }
    }
  }
  store_tile_avx2<RM, H0, H1>(facc, out, w.N, i0, g);
}

}  // namespace zs_qgemm
