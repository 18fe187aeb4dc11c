// The AVX2 tile of the 5-bit and K-quant formats (Q5, Q50, Q4K, Q5K; layouts:
// ../../formats.h). The integer work per block of 32 inputs is the 4-bit tile's (q4_q8.h)
// with the fifth bit ORed into the nibbles first; what differs is the scale of each block:
// float16 d, m per block (Q5), or float16 super-block d, m times the uint8 sub-scales (Q4K,
// Q5K), multiplied in float32 for 8 rows at once.
#pragma once

#include "block_tile.h"

namespace zs_qgemm {

template <int FMT, int RM, int H0, int H1>
struct KQuantBlock {
  using L = Layout<FMT>;
  __m256 du[2], mu[2];

  ZS_AVX2 ZS_INLINE void dot(const uint8_t* wb, const int8_t* const (&xb)[RM], __m256i (&iacc)[RM][2]) {
    const __m256i nib = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);
    for (int h = H0; h < H1; ++h) {
      // the block's lines in address order, the high-bit plane after the nibbles (the empty
      // asm keeps GCC from hoisting its load first): loaded first, it cost the hardware
      // prefetcher the stream (docs/benchmarks.md, "AVX2 Q5_1 at one row, ninth session")
      __m256i vv[4], hb = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) vv[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k * 64 + h * 32));
      if constexpr (L::HI) {
        const uint8_t* hp = wb + 256 + h * 32;
        asm("" : "+r"(hp) : "x"(vv[0]), "x"(vv[1]), "x"(vv[2]), "x"(vv[3]));
        hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hp));
      }
      // int16 sums: 4-bit: 16 products of <= 15 * 127 per lane fit; 5-bit: 8 of <= 31 * 127
      __m256i acc16[RM], acc32[RM];
      for (int i = 0; i < RM; ++i) acc16[i] = acc32[i] = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        const __m256i v = vv[k];
        __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        if constexpr (L::HI) {
          lo = _mm256_or_si256(lo, hbit_avx2(hb, 2 * k, bit4));
          hi = _mm256_or_si256(hi, hbit_avx2(hb, 2 * k + 1, bit4));
        }
        for (int i = 0; i < RM; ++i) {
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(xb[i] + 4 * k))),
                                             _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(xb[i] + 16 + 4 * k))));
          acc16[i] = _mm256_add_epi16(acc16[i], p);
          ZS_KEEP(acc16[i]);
        }
        if (L::HI && k % 2 == 1)
          for (int i = 0; i < RM; ++i) {
            acc32[i] = _mm256_add_epi32(acc32[i], _mm256_madd_epi16(acc16[i], ones));
            acc16[i] = _mm256_setzero_si256();
          }
      }
      for (int i = 0; i < RM; ++i) iacc[i][h] = L::HI ? acc32[i] : _mm256_madd_epi16(acc16[i], ones);
    }
  }

  ZS_AVX2 ZS_INLINE Scales scales(const Packed& w, int64_t g, int64_t b, int h) {
    if constexpr (L::SUPER) {
      if (b % 8 == 0) {
        const int64_t u = unit_of<FMT>(w, g, b) * scale_stride<FMT>(w) + 8 * h;
        du[h] = load8_f16(w.d + u);
        mu[h] = load8_f16(w.m + u);
      }
      const uint8_t* sc = block_scales<FMT>(w, g, b) + 8 * h;
      return {_mm256_mul_ps(du[h], u8x8_to_ps(sc)), _mm256_mul_ps(mu[h], u8x8_to_ps(sc + 128))};
    } else {
      const int64_t at = (g * w.nb + b) * scale_stride<FMT>(w) + 8 * h;
      return {load8_f16(w.d + at), L::M ? load8_f16(w.m + at) : _mm256_setzero_ps()};
    }
  }
};

template <int FMT, int RM, int H0 = 0, int H1 = 2, typename T>
ZS_AVX2 void tile_kq_avx2(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead = {}) {
  block_tile_avx2<FMT, RM, KQuantBlock<FMT, RM, H0, H1>, H0, H1>(x, w, out, i0, g, ahead);
}

}  // namespace zs_qgemm
