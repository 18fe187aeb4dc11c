// The AVX2 tile of the 4- and 8-bit formats (Q4, Q8; layout: ../../formats.h).
#pragma once

#include "common.h"

namespace zs_qgemm {

// RM activation rows x one group of 16 output rows. A group's 64-byte register k is two
// 32-byte halves here, rows 0-7 and rows 8-15. AVX2 has no dpbusd: maddubs (u8 x s8 pairs
// -> int16) then madd with ones (-> int32) give the same 4-product sums per 32-bit lane.
// 4-bit weights are the unsigned operand as they are; 8-bit ones (stored + 128) are made
// signed again and their signs moved onto x, so no int16 pair can saturate.
template <int FMT, int RM, int H0 = 0, int H1 = 2, typename T>
ZS_AVX2 void tile_avx2(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead = {}) {
  constexpr int64_t BB = Layout<FMT>::SBB;
  const int64_t nb = w.nb, N = w.N;
  const uint8_t* wq = w.q;
  const c10::Half *wd = w.d, *wm = w.m;
  const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 facc[RM][2];
  for (int i = 0; i < RM; ++i) facc[i][0] = facc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = wq + (g * nb + b) * BB;
    if (x.prefetch && i0 == 0 && H0 == 0) prefetch_block_ahead<BB>(wb);
    ahead.fetch(b);
    __m256i iacc[RM][2];
    for (int i = 0; i < RM; ++i) iacc[i][0] = iacc[i][1] = _mm256_setzero_si256();
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    if constexpr (FMT == Q8) {
      for (int k = 0; k < 8; ++k)
        for (int h = H0; h < H1; ++h) {
          const __m256i ws = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k * 64 + h * 32)), flip);
          const __m256i wa = _mm256_sign_epi8(ws, ws);
          for (int i = 0; i < RM; ++i) {
            const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(xb[i] + 4 * k)), ws);
            iacc[i][h] = _mm256_add_epi32(iacc[i][h], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xs), ones));
          }
        }
    } else {
      // a block's 16 products per int16 lane stay within 16 * 15 * 127 = 30480: summed in
      // int16 over the whole block, widened once
      __m256i acc16[RM][2];
      for (int i = 0; i < RM; ++i) acc16[i][0] = acc16[i][1] = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k)
        for (int h = H0; h < H1; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k * 64 + h * 32));
          const __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
          for (int i = 0; i < RM; ++i) {
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(xb[i] + 4 * k))),
                                               _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(xb[i] + 16 + 4 * k))));
            acc16[i][h] = _mm256_add_epi16(acc16[i][h], p);
            ZS_KEEP(acc16[i][h]);
          }
        }
      for (int i = 0; i < RM; ++i)
        for (int h = H0; h < H1; ++h) iacc[i][h] = _mm256_madd_epi16(acc16[i][h], ones);
    }
    const int64_t at = (g * nb + b) * scale_stride<FMT>(w);
    for (int h = H0; h < H1; ++h) {
      const __m256 dw = load8_f16(wd + at + 8 * h);
      for (int i = 0; i < RM; ++i) {
        const __m256 dot = _mm256_mul_ps(_mm256_cvtepi32_ps(iacc[i][h]), _mm256_set1_ps(x.d[(i0 + i) * nb + b]));
        facc[i][h] = _mm256_fmadd_ps(dw, dot, facc[i][h]);
        if constexpr (FMT == Q4)
          facc[i][h] = _mm256_fmadd_ps(load8_f16(wm + at + 8 * h), _mm256_set1_ps(x.s[(i0 + i) * nb + b]), facc[i][h]);
      }
    }
  }
  store_tile_avx2<RM, H0, H1>(facc, out, N, i0, g);
}

}  // namespace zs_qgemm
