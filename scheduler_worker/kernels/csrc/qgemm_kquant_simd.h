// AVX2 and AVX-512 VNNI tiles of the 5-bit and K-quant formats (layouts: qgemm_kquant.h).
// The integer work per sub-block of 32 inputs is the 4-bit kernel's (qgemm_avx2.h,
// qgemm_vnni.h) with the fifth bit ORed into the nibbles first; what differs is the scale
// of each sub-block: float16 d, m per block (q5), or float16 super-block d, m times the
// uint8 sub-scales (q4k / q5k), multiplied in float32 for 16 rows at once.
#pragma once

#include "qgemm_kquant.h"
#include "qgemm_vnni.h"

namespace zs_qgemm {

template <int FMT>
struct KLayout {
  static constexpr bool HI = FMT != Q4K;            // 5-bit: a high-bit plane per sub-block
  static constexpr bool SUPER = FMT == Q4K || FMT == Q5K;  // super-blocks of 8 sub-blocks
  static constexpr bool M = FMT != Q50;             // a stored m (Q5_0's is -16 d)
  static constexpr int64_t SBB = HI ? 320 : 256;    // bytes per group and sub-block
  static constexpr int64_t UK = SUPER ? 8 : 1;      // sub-blocks per unit
  static constexpr int64_t UB = SUPER ? 256 + 8 * SBB : SBB;  // bytes per group and unit
};

struct KPacked {
  const uint8_t* q;    // [groups, units, UB]
  const c10::Half* d;  // [groups, units, 16]
  const c10::Half* m;  // [groups, units, 16]; null for q50
  int64_t nb;          // blocks of 32 per row (K / 32)
  int64_t N;           // output rows
};

// Sub-block b (of 32 inputs) of group g; its unit, and for K-quants its scale bytes.
template <int FMT>
inline const uint8_t* kq_sub(const KPacked& w, int64_t g, int64_t b) {
  using L = KLayout<FMT>;
  if constexpr (L::SUPER) return w.q + (g * (w.nb / 8) + b / 8) * L::UB + 256 + (b % 8) * L::SBB;
  else return w.q + (g * w.nb + b) * L::SBB;
}
template <int FMT>
inline int64_t kq_unit(const KPacked& w, int64_t g, int64_t b) {
  return g * (w.nb / KLayout<FMT>::UK) + b / KLayout<FMT>::UK;
}
template <int FMT>
inline const uint8_t* kq_sc(const KPacked& w, int64_t g, int64_t b) {  // sc; mn at + 128
  return w.q + kq_unit<FMT>(w, g, b) * KLayout<FMT>::UB + (b % 8) * GR;
}

// ------------------------------------------------------------------------------- AVX2

ZS_AVX2 inline __m256 u8x8_to_ps(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// bit `from` of every byte of h moved to bit 4, the rest cleared
ZS_AVX2 inline __m256i hbit_avx2(__m256i h, int from, __m256i bit4) {
  const __m256i s = from <= 4 ? _mm256_slli_epi16(h, 4 - from) : _mm256_srli_epi16(h, from - 4);
  return _mm256_and_si256(s, bit4);
}

// RM activation rows x one group of 16 output rows, as tile_avx2 (two halves of 8 rows).
template <int FMT, int RM, typename T>
ZS_AVX2 void tile_kq_avx2(const Act& x, const KPacked& w, T* out, int64_t i0, int64_t g, const Ahead& ahead = {}) {
  using L = KLayout<FMT>;
  const int64_t nb = w.nb, N = w.N;
  const __m256i nib = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10), ones = _mm256_set1_epi16(1);
  __m256 facc[RM][2];
  for (int i = 0; i < RM; ++i) facc[i][0] = facc[i][1] = _mm256_setzero_ps();
  __m256 du[2], mu[2];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = kq_sub<FMT>(w, g, b);
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
        const int64_t u = kq_unit<FMT>(w, g, b) * GR + 8 * h;
        du[h] = load8_f16(w.d + u);
        mu[h] = load8_f16(w.m + u);
      }
    for (int h = 0; h < 2; ++h) {
      __m256 dw, mw = _mm256_setzero_ps();
      if constexpr (L::SUPER) {
        const uint8_t* sc = kq_sc<FMT>(w, g, b) + 8 * h;
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
        } else {  // d (dx dot - 16 s)
          const __m256 u = _mm256_fmsub_ps(_mm256_cvtepi32_ps(iacc[i][h]), dx, _mm256_set1_ps(16.f * x.s[(i0 + i) * nb + b]));
          facc[i][h] = _mm256_fmadd_ps(dw, u, facc[i][h]);
        }
      }
    }
  }
  store_tile_avx2(facc, out, N, i0, g);
}

// ------------------------------------------------------------------------ AVX-512 VNNI

ZS_AVX512 inline __m512 u8x16_to_ps(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// RM activation rows x RG groups, as tile_vnni: one dpbusd per 4 inputs, 16 rows at once.
template <int FMT, int RM, int RG, typename T>
ZS_AVX512 void tile_kq_vnni(const Act& x, const KPacked& w, T* out, int64_t i0, int64_t g0, const Ahead& ahead = {}) {
  using L = KLayout<FMT>;
  const int64_t nb = w.nb, N = w.N;
  const __m512i nib = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  __m512 facc[RM][RG];
  zero_tile(facc);
  __m512 du[RG], mu[RG];
  for (int64_t b = 0; b < nb; ++b) {
    __m512i iacc[RM][RG];
    zero_tile(iacc);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    const uint8_t* wb[RG];
    __m512i hb[RG];
    for (int g = 0; g < RG; ++g) {
      wb[g] = kq_sub<FMT>(w, g0 + g, b);
      if constexpr (L::HI) hb[g] = _mm512_loadu_si512(wb[g] + 256);
      if (x.prefetch && i0 == 0) prefetch_block_ahead<L::SBB>(wb[g]);
    }
    ahead.fetch(b);
    for (int k = 0; k < 4; ++k) {
      __m512i lo[RG], hi[RG];
      for (int g = 0; g < RG; ++g) {
        const __m512i v = _mm512_loadu_si512(wb[g] + k * 64);
        lo[g] = _mm512_and_si512(v, nib);
        hi[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        if constexpr (L::HI) {  // + 16 where the fifth bit is set
          lo[g] = _mm512_mask_add_epi8(lo[g], _mm512_test_epi8_mask(hb[g], _mm512_set1_epi8(static_cast<char>(1 << (2 * k)))), lo[g], bit4);
          hi[g] = _mm512_mask_add_epi8(hi[g], _mm512_test_epi8_mask(hb[g], _mm512_set1_epi8(static_cast<char>(2 << (2 * k)))), hi[g], bit4);
        }
      }
      for (int i = 0; i < RM; ++i) {
        const __m512i xl = _mm512_set1_epi32(load_i32(xb[i] + 4 * k));
        const __m512i xh = _mm512_set1_epi32(load_i32(xb[i] + 16 + 4 * k));
        for (int g = 0; g < RG; ++g) iacc[i][g] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(iacc[i][g], lo[g], xl), hi[g], xh);
      }
    }
    for (int g = 0; g < RG; ++g) {
      __m512 dw, mw = _mm512_setzero_ps();
      if constexpr (L::SUPER) {
        if (b % 8 == 0) {
          const int64_t u = kq_unit<FMT>(w, g0 + g, b) * GR;
          du[g] = load16_f16(w.d + u);
          mu[g] = load16_f16(w.m + u);
        }
        const uint8_t* sc = kq_sc<FMT>(w, g0 + g, b);
        dw = _mm512_mul_ps(du[g], u8x16_to_ps(sc));
        mw = _mm512_mul_ps(mu[g], u8x16_to_ps(sc + 128));
      } else {
        dw = load16_f16(w.d + ((g0 + g) * nb + b) * GR);
        if constexpr (L::M) mw = load16_f16(w.m + ((g0 + g) * nb + b) * GR);
      }
      for (int i = 0; i < RM; ++i) {
        const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * nb + b]);
        if constexpr (L::M) {
          facc[i][g] = _mm512_fmadd_ps(dw, _mm512_mul_ps(_mm512_cvtepi32_ps(iacc[i][g]), dx), facc[i][g]);
          facc[i][g] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.s[(i0 + i) * nb + b]), facc[i][g]);
        } else {  // d (dx dot - 16 s)
          const __m512 u = _mm512_fmsub_ps(_mm512_cvtepi32_ps(iacc[i][g]), dx, _mm512_set1_ps(16.f * x.s[(i0 + i) * nb + b]));
          facc[i][g] = _mm512_fmadd_ps(dw, u, facc[i][g]);
        }
      }
    }
  }
  store_tile(facc, out, N, i0, g0 * GR);
}

template <int FMT, int RM, int RG, typename T>
ZS_AVX512 void rows_kq_vnni(const Act& x, const KPacked& w, int64_t M, T* out, int64_t g0, const Ahead& ahead) {
  auto last = [&](int64_t end) { return end == M ? ahead : Ahead{}; };  // the last tile asks
  int64_t i = 0;
  for (; i + RM <= M; i += RM) tile_kq_vnni<FMT, RM, RG>(x, w, out, i, g0, last(i + RM));
  if constexpr (RM > 4) {
    if (M - i >= 4) {
      tile_kq_vnni<FMT, 4, RG>(x, w, out, i, g0, last(i + 4));
      i += 4;
    }
  }
  const int64_t left = M - i;
  if (left == 3) tile_kq_vnni<FMT, 3, RG>(x, w, out, i, g0, ahead);
  else if (left == 2) tile_kq_vnni<FMT, 2, RG>(x, w, out, i, g0, ahead);
  else if (left == 1) tile_kq_vnni<FMT, 1, RG>(x, w, out, i, g0, ahead);
}

}  // namespace zs_qgemm
