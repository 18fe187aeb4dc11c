// The AVX2 tile of the 5-bit and K-quant formats (Q5, Q50, Q4K, Q5K; layouts:
// ../../formats.h). The integer work per block of 32 inputs is the 4-bit tile's (q4_q8.h)
// with the fifth bit ORed into the nibbles first; what differs is the scale of each block:
// float16 d, m per block (Q5), or float16 super-block d, m times the uint8 sub-scales (Q4K,
// Q5K), multiplied in float32 for 8 rows at once.
#pragma once

#include "common.h"

namespace zs_qgemm {

// RM activation rows x one group of 16 output rows, as tile_avx2 (two halves of 8 rows).
template <int FMT, int RM, typename T>
ZS_AVX2 void tile_kq_avx2(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead = {}) {
  using L = Layout<FMT>;
  const int64_t nb = w.nb, N = w.N;
  const __m256i nib = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);
  __m256 facc[RM][2];
  for (int i = 0; i < RM; ++i) facc[i][0] = facc[i][1] = _mm256_setzero_ps();
  __m256 du[2], mu[2];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = sub_block<FMT>(w, g, b);
    if (x.prefetch && i0 == 0) prefetch_block_ahead<L::SBB>(wb);
    ahead.fetch(b);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    __m256i iacc[RM][2];
    for (int h = 0; h < 2; ++h) {
      __m256i hb = _mm256_setzero_si256();
      if constexpr (L::HI) hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256 + h * 32));
      // int16 sums: 4-bit: 16 products of <= 15 * 127 per lane fit; 5-bit: 8 of <= 31 * 127
      __m256i acc16[RM], acc32[RM];
      for (int i = 0; i < RM; ++i) acc16[i] = acc32[i] = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k * 64 + h * 32));
        __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        if constexpr (L::HI) {
          lo = _mm256_or_si256(lo, hbit_avx2(hb, 2 * k, bit4));
          hi = _mm256_or_si256(hi, hbit_avx2(hb, 2 * k + 1, bit4));
        }
        for (int i = 0; i < RM; ++i) {
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(xb[i] + 4 * k))),
                                             _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(xb[i] + 16 + 4 * k))));
          acc16[i] = _mm256_add_epi16(acc16[i], p);
        }
        if (L::HI && k % 2 == 1)
          for (int i = 0; i < RM; ++i) {
            acc32[i] = _mm256_add_epi32(acc32[i], _mm256_madd_epi16(acc16[i], ones));
            acc16[i] = _mm256_setzero_si256();
          }
      }
      for (int i = 0; i < RM; ++i) iacc[i][h] = L::HI ? acc32[i] : _mm256_madd_epi16(acc16[i], ones);
    }
    if (L::SUPER && b % 8 == 0)
      for (int h = 0; h < 2; ++h) {
        const int64_t u = unit_of<FMT>(w, g, b) * GR + 8 * h;
        du[h] = load8_f16(w.d + u);
        mu[h] = load8_f16(w.m + u);
      }
    for (int h = 0; h < 2; ++h) {
      __m256 dw, mw = _mm256_setzero_ps();
      if constexpr (L::SUPER) {
        const uint8_t* sc = block_scales<FMT>(w, g, b) + 8 * h;
        dw = _mm256_mul_ps(du[h], u8x8_to_ps(sc));
        mw = _mm256_mul_ps(mu[h], u8x8_to_ps(sc + 128));
      } else {
        dw = load8_f16(w.d + (g * nb + b) * GR + 8 * h);
        if constexpr (L::M) mw = load8_f16(w.m + (g * nb + b) * GR + 8 * h);
      }
      for (int i = 0; i < RM; ++i) {
        const __m256 dx = _mm256_set1_ps(x.d[(i0 + i) * nb + b]);
        if constexpr (L::M) {
          facc[i][h] = _mm256_fmadd_ps(dw, _mm256_mul_ps(_mm256_cvtepi32_ps(iacc[i][h]), dx), facc[i][h]);
          facc[i][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.s[(i0 + i) * nb + b]), facc[i][h]);
        } else {  // d (dx dot - offset s)
          const __m256 u = _mm256_fmsub_ps(_mm256_cvtepi32_ps(iacc[i][h]), dx,
                                           _mm256_set1_ps(static_cast<float>(L::R.offset) * x.s[(i0 + i) * nb + b]));
          facc[i][h] = _mm256_fmadd_ps(dw, u, facc[i][h]);
        }
      }
    }
  }
  store_tile_avx2(facc, out, N, i0, g);
}

}  // namespace zs_qgemm
