// AVX-512 VNNI path of the quantized linears (dpbusd): the 8-bit tile (two blocks per
// register) and the 4-bit tile (four blocks per 64-byte load, activations in group order).
#pragma once

#include "qgemm_avx2.h"

namespace zs_qgemm {

#define ZS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

ZS_AVX512 inline float hsum_avx512(__m512 v) { return _mm512_reduce_add_ps(v); }

ZS_AVX512 inline __m512i load64_avx512(const void* p, bool two) {
  return two ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, p);
}

// [a0 x8, a1 x8] from two consecutive floats (a1 = 0 when `two` is false)
ZS_AVX512 inline __m512 pair_avx512(const float* p, bool two) {
  const __m128 t = _mm_maskz_loadu_ps(two ? 0x3 : 0x1, p);
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(t));
}

// 8-bit weights, two blocks per 64-byte register (the signs of w moved onto x, as dpbusd
// multiplies unsigned by signed bytes).
template <int FMT, int RM, int RN, typename T>
ZS_AVX512 void tile_avx512(const Problem& p, T* out, int64_t i0, int64_t n0) {
  static_assert(FMT == Q8, "4-bit weights take tile_avx512_q4g");
  __m512 acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < p.nb; b += 2) {
    const bool two = b + 1 < p.nb;
    __m512i w[RN];
    __mmask64 neg[RN];
    __m512 dw[RN];
    for (int r = 0; r < RN; ++r) {
      const uint8_t* row = p.w.q + (n0 + r) * p.w.row_bytes;
      const __m512i ws = load64_avx512(row + b * QK, two);
      neg[r] = _mm512_movepi8_mask(ws);
      w[r] = _mm512_abs_epi8(ws);
      dw[r] = pair_avx512(p.w.d + (n0 + r) * p.nb + b, two);
    }
    for (int i = 0; i < RM; ++i) {
      const __m512i x = load64_avx512(p.x.q + (i0 + i) * p.nb * QK + b * QK, two);
      const __m512 dx = pair_avx512(p.x.d + (i0 + i) * p.nb + b, two);
      for (int r = 0; r < RN; ++r) {
        const __m512i xs = _mm512_mask_sub_epi8(x, neg[r], _mm512_setzero_si512(), x);
        const __m512 t = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w[r], xs));
        acc[i][r] = _mm512_fmadd_ps(t, _mm512_mul_ps(dw[r], dx), acc[i][r]);
      }
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) store(out + (i0 + i) * p.N + n0 + r, hsum_avx512(acc[i][r]));
}

// 4-bit weights, four blocks per step. A 64-byte load holds four blocks' nibbles: its low
// nibbles are elements 0-15 of each block, its high nibbles elements 16-31, so two ANDs
// and a shift unpack 128 weights. The activations of a 4-bit AVX-512 call are stored to
// match (see group_row): per group of up to four blocks, first every block's elements
// 0-15, then every block's 16-31. Each dpbusd pair leaves four int32 lanes per block,
// scaled by [d_b x4 | d_b+1 x4 | ...]. A short last group is loaded with masks.
template <int RM, int RN, typename T>
ZS_AVX512 void tile_avx512_q4g(const Problem& p, T* out, int64_t i0, int64_t n0) {
  __m512 acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) acc[i][r] = _mm512_setzero_ps();
  const __m512i idx4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < p.nb; b += 4) {
    const int64_t nt = std::min<int64_t>(4, p.nb - b);
    const __mmask64 bytes = nt == 4 ? ~0ull : (1ull << (16 * nt)) - 1;
    const __mmask8 lanes = static_cast<__mmask8>((1u << nt) - 1);
    __m512i lo[RN], hi[RN];
    __m512 dw[RN];
    for (int r = 0; r < RN; ++r) {
      const __m512i v = _mm512_maskz_loadu_epi8(bytes, p.w.q + (n0 + r) * p.w.row_bytes + b * 16);
      lo[r] = _mm512_and_si512(v, nib);
      hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      dw[r] = _mm512_permutexvar_ps(idx4, _mm512_zextps128_ps512(_mm_maskz_loadu_ps(lanes, p.w.d + (n0 + r) * p.nb + b)));
    }
    for (int i = 0; i < RM; ++i) {
      const int8_t* xr = p.x.q + (i0 + i) * p.nb * QK + b * QK;
      const __m512i xlo = _mm512_maskz_loadu_epi8(bytes, xr);
      const __m512i xhi = _mm512_maskz_loadu_epi8(bytes, xr + 16 * nt);
      const __m512 dx = _mm512_permutexvar_ps(idx4, _mm512_zextps128_ps512(_mm_maskz_loadu_ps(lanes, p.x.d + (i0 + i) * p.nb + b)));
      for (int r = 0; r < RN; ++r) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[r], xlo), hi[r], xhi);
        acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], dx), acc[i][r]);
      }
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) {
      const float v = hsum_avx512(acc[i][r]) + dot_f32_avx2(p.w.m + (n0 + r) * p.nb, p.x.s + (i0 + i) * p.nb, p.nb);
      store(out + (i0 + i) * p.N + n0 + r, v);
    }
}

// One quantized activation row, rearranged for tile_avx512_q4g: per group of up to four
// blocks, the first halves of its blocks, then their second halves.
inline void group_row(int8_t* q, int64_t nb) {
  int8_t tmp[4 * QK];
  for (int64_t b = 0; b < nb; b += 4) {
    const int64_t nt = std::min<int64_t>(4, nb - b);
    int8_t* g = q + b * QK;
    for (int64_t j = 0; j < nt; ++j) {
      std::memcpy(tmp + j * 16, g + j * QK, 16);
      std::memcpy(tmp + nt * 16 + j * 16, g + j * QK + 16, 16);
    }
    std::memcpy(g, tmp, static_cast<size_t>(nt * QK));
  }
}

}  // namespace zs_qgemm
