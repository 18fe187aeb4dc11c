// The AVX2 tile of the 5-bit and K-quant formats (Q5, Q50, Q4K, Q5K; layouts:
// ../../formats.h), and Q4's over planes unpacked once a group (gemm.cpp). The integer work
// per block of 32 inputs is the 4-bit tile's (q4_q8.h) with the fifth bit ORed into the
// nibbles first; what differs is the scale of each block: float16 d, m per block (Q4, Q5),
// or float16 super-block d, m times the uint8 sub-scales (Q4K, Q5K), multiplied in float32
// for 8 rows at once.
#pragma once

#include "block_tile.h"

namespace zs_qgemm {

// A block's half h (its 8 output rows) as loaded: four registers of nibbles (inputs 4k..4k+3
// low, 16 + 4k.. high, k = 0..3) and, for the 5-bit formats, the fifth-bit plane.
template <int FMT>
struct KqLines {
  __m256i vv[4], hb;
  KqLines() = default;
  ZS_AVX2 ZS_INLINE KqLines(const uint8_t* wb, int h) {
    // the block's lines in address order, the high-bit plane after the nibbles (the empty
    // asm keeps GCC from hoisting its load first): loaded first, it cost the hardware
    // prefetcher the stream (docs/benchmarks.md, "AVX2 Q5_1 at one row, ninth session")
    hb = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) vv[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k * 64 + h * 32));
    if constexpr (Layout<FMT>::HI) {
      const uint8_t* hp = wb + 256 + h * 32;
      asm("" : "+r"(hp) : "x"(vv[0]), "x"(vv[1]), "x"(vv[2]), "x"(vv[3]));
      hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hp));
    }
  }
  // register k's low and high planes (the fifth bit ORed into the nibbles): what every row
  // of a tile multiplies
  ZS_AVX2 ZS_INLINE void planes(int k, __m256i& lo, __m256i& hi) const {
    const __m256i nib = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    lo = _mm256_and_si256(vv[k], nib);
    hi = _mm256_and_si256(_mm256_srli_epi16(vv[k], 4), nib);
    if constexpr (Layout<FMT>::HI) {
      lo = _mm256_or_si256(lo, hbit_avx2(hb, 2 * k, bit4));
      hi = _mm256_or_si256(hi, hbit_avx2(hb, 2 * k + 1, bit4));
    }
  }
};

// Block b's planes, both halves, stored at u as [h][k][lo, hi] x 32 bytes (KQ_PLANE_BYTES,
// block_tile.h): the unpacked path of gemm.cpp makes a group's planes once for every tile.
template <int FMT>
ZS_AVX2 ZS_INLINE void kq_unpack(const uint8_t* wb, uint8_t* u) {
  for (int h = 0; h < 2; ++h) {
    const KqLines<FMT> lines(wb, h);
    for (int k = 0; k < 4; ++k) {
      __m256i lo, hi;
      lines.planes(k, lo, hi);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + (h * 4 + k) * 64), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + (h * 4 + k) * 64 + 32), hi);
    }
  }
}

// Group g's planes, every block's, at u (the weights' software prefetch as the first tile's).
template <int FMT>
ZS_AVX2 void kq_unpack_group(const Packed& w, int64_t g, bool prefetch, uint8_t* u) {
  for (int64_t b = 0; b < w.nb; ++b) {
    const uint8_t* wb = sub_block<FMT>(w, g, b);
    if (prefetch) prefetch_block_ahead<Layout<FMT>::SBB>(wb);
    kq_unpack<FMT>(wb, u + b * KQ_PLANE_BYTES);
  }
}

// UNPACKED: dot() reads the planes kq_unpack stored (wb: the block's KQ_PLANE_BYTES), else
// it makes them from the packed block; the integer work on them is the same.
template <int FMT, int RM, int H0, int H1, bool UNPACKED = false>
struct KQuantBlock {
  using L = Layout<FMT>;
  static constexpr bool U = UNPACKED;
  __m256 du[2], mu[2];

  ZS_AVX2 ZS_INLINE void dot(const uint8_t* wb, const int8_t* const (&xb)[RM], __m256i (&iacc)[RM][2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = H0; h < H1; ++h) {
      const KqLines<FMT> lines = UNPACKED ? KqLines<FMT>{} : KqLines<FMT>(wb, h);
      // int16 sums: 4-bit: 16 products of <= 15 * 127 per lane fit; 5-bit: 8 of <= 31 * 127
      __m256i acc16[RM], acc32[RM];
      for (int i = 0; i < RM; ++i) acc16[i] = acc32[i] = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        __m256i lo, hi;
        if constexpr (UNPACKED) {
          lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + (h * 4 + k) * 64));
          hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + (h * 4 + k) * 64 + 32));
        } else {
          lines.planes(k, lo, hi);
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

// The same tile over a group's planes unpacked at u (kq_unpack, KQ_PLANE_BYTES a block).
template <int FMT, int RM, int H0, int H1, typename T>
ZS_AVX2 void tile_kq_unpacked_avx2(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead,
                                   const uint8_t* u) {
  block_tile_avx2<FMT, RM, KQuantBlock<FMT, RM, H0, H1, true>, H0, H1>(x, w, out, i0, g, ahead, u);
}

}  // namespace zs_qgemm
