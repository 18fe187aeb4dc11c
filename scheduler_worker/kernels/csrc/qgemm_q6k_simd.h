// AVX2 and AVX-512 VNNI tiles of Q6_K (layout and math: qgemm_q6k.h). The integer work per
// piece of 16 inputs is the 4-bit kernels' (qgemm_avx2.h, qgemm_vnni.h) with the top two
// bits of each value ORed in above its nibble first; the piece's dot starts at the
// activations' -32 * sum and is scaled by d * sc in float32, 16 (or 8) rows at once.
#pragma once

#include "qgemm_q6k.h"
#include "qgemm_vnni.h"

namespace zs_qgemm {

// ------------------------------------------------------------------------------- AVX2

// bits 2k, 2k + 1 of every byte of h moved to bits 4, 5 (the others: junk, masked after)
ZS_AVX2 ZS_INLINE __m256i q6_top_avx2(__m256i h, int k) {
  return k == 0 ? _mm256_slli_epi16(h, 4) : k == 1 ? _mm256_slli_epi16(h, 2) : k == 2 ? h : _mm256_srli_epi16(h, 2);
}

ZS_AVX2 inline __m256 i8x8_to_ps(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// RM activation rows x one group of 16 output rows, as tile_kq_avx2 (two halves of 8 rows).
template <int RM, typename T>
ZS_AVX2 void tile_q6_avx2(const Q6Act& x, const Q6Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead = {}) {
  const int64_t nb = w.nsb * 8, N = w.N;
  const __m256i nib = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
  __m256 facc[RM][2];
  for (int i = 0; i < RM; ++i) facc[i][0] = facc[i][1] = _mm256_setzero_ps();
  __m256 dv[2];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = q6_sub(w, g, b);
    if (x.prefetch && i0 == 0) prefetch_block_ahead<Q6_SB>(wb);
    ahead.fetch(b);
    const int8_t* sc = q6_sc(w, g, b);
    if (b % 8 == 0)
      for (int h = 0; h < 2; ++h) dv[h] = load8_f16(q6_d(w, g, b) + 8 * h);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h + 7
      __m256 t[RM];
      for (int p = 0; p < 2; ++p) {  // the sub-block's two pieces
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256 + 64 * p + 32 * h));
        __m256i acc[RM];
        for (int i = 0; i < RM; ++i) acc[i] = _mm256_set1_epi32(x.off[((i0 + i) * nb + b) * 2 + p]);
#pragma GCC unroll 2
        for (int k = 0; k < 4; k += 2) {
          __m256i q[2];
#pragma GCC unroll 2
          for (int kk = 0; kk < 2; ++kk) {
            __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * (k + kk) + 32 * h));
            if (p) v = _mm256_srli_epi16(v, 4);
            q[kk] = _mm256_or_si256(_mm256_and_si256(v, nib), _mm256_and_si256(q6_top_avx2(hb, k + kk), top));
          }
          // int16: two products of <= 63 * 127 per maddubs lane, two maddubs: <= 32004
          for (int i = 0; i < RM; ++i) {
            const int8_t* xp = xb[i] + 16 * p + 4 * k;
            const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(q[0], _mm256_set1_epi32(load_i32(xp))),
                                                 _mm256_maddubs_epi16(q[1], _mm256_set1_epi32(load_i32(xp + 4))));
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(p16, ones));
          }
        }
        const __m256 ds = _mm256_mul_ps(dv[h], i8x8_to_ps(sc + 16 * p + 8 * h));
        for (int i = 0; i < RM; ++i) {
          const __m256 f = _mm256_cvtepi32_ps(acc[i]);
          t[i] = p == 0 ? _mm256_mul_ps(f, ds) : _mm256_fmadd_ps(f, ds, t[i]);
        }
      }
      for (int i = 0; i < RM; ++i)
        facc[i][h] = _mm256_fmadd_ps(t[i], _mm256_set1_ps(x.d[(i0 + i) * nb + b]), facc[i][h]);
    }
  }
  store_tile_avx2(facc, out, N, i0, g);
}

// ------------------------------------------------------------------------ AVX-512 VNNI

ZS_AVX512 ZS_INLINE __m512i q6_top_vnni(__m512i h, int k) {
  return k == 0 ? _mm512_slli_epi16(h, 4) : k == 1 ? _mm512_slli_epi16(h, 2) : k == 2 ? h : _mm512_srli_epi16(h, 2);
}

ZS_AVX512 inline __m512 i8x16_to_ps(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// RM activation rows x RG groups, as tile_kq_vnni: one dpbusd per 4 inputs, 16 rows at once.
template <int RM, int RG, typename T>
ZS_AVX512 void tile_q6_vnni(const Q6Act& x, const Q6Packed& w, T* out, int64_t i0, int64_t g0, const Ahead& ahead = {}) {
  const int64_t nb = w.nsb * 8, N = w.N;
  const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  __m512 facc[RM][RG];
  zero_tile(facc);
  __m512 dv[RG];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb[RG];
    for (int g = 0; g < RG; ++g) {
      wb[g] = q6_sub(w, g0 + g, b);
      if (b % 8 == 0) dv[g] = load16_f16(q6_d(w, g0 + g, b));
      if (x.prefetch && i0 == 0) prefetch_block_ahead<Q6_SB>(wb[g]);
    }
    ahead.fetch(b);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    __m512 t[RM][RG];
    for (int p = 0; p < 2; ++p) {  // the sub-block's two pieces
      __m512i iacc[RM][RG], hb[RG];
      for (int i = 0; i < RM; ++i) {
        const __m512i o = _mm512_set1_epi32(x.off[((i0 + i) * nb + b) * 2 + p]);
        for (int g = 0; g < RG; ++g) iacc[i][g] = o;
      }
      for (int g = 0; g < RG; ++g) hb[g] = _mm512_loadu_si512(wb[g] + 256 + 64 * p);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        __m512i q[RG];
        for (int g = 0; g < RG; ++g) {
          __m512i v = _mm512_loadu_si512(wb[g] + 64 * k);
          if (p) v = _mm512_srli_epi16(v, 4);
          // nibble | (top bits & 0x30): ternary-logic function a | (b & c)
          q[g] = _mm512_ternarylogic_epi32(_mm512_and_si512(v, nib), q6_top_vnni(hb[g], k), top, 0xF8);
        }
        for (int i = 0; i < RM; ++i) {
          const __m512i xv = _mm512_set1_epi32(load_i32(xb[i] + 16 * p + 4 * k));
          for (int g = 0; g < RG; ++g) iacc[i][g] = _mm512_dpbusd_epi32(iacc[i][g], q[g], xv);
        }
      }
      for (int g = 0; g < RG; ++g) {
        const __m512 ds = _mm512_mul_ps(dv[g], i8x16_to_ps(q6_sc(w, g0 + g, b) + 16 * p));
        for (int i = 0; i < RM; ++i) {
          const __m512 f = _mm512_cvtepi32_ps(iacc[i][g]);
          t[i][g] = p == 0 ? _mm512_mul_ps(f, ds) : _mm512_fmadd_ps(f, ds, t[i][g]);
        }
      }
    }
    for (int i = 0; i < RM; ++i) {
      const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * nb + b]);
      for (int g = 0; g < RG; ++g) facc[i][g] = _mm512_fmadd_ps(t[i][g], dx, facc[i][g]);
    }
  }
  store_tile(facc, out, N, i0, g0 * GR);
}

// Activation rows in tiles of RM (the bulk, then the remainder) for RG groups: the groups'
// weights stay in cache across the row tiles.
template <int RM, int RG, typename T>
ZS_AVX512 void rows_q6_vnni(const Q6Act& x, const Q6Packed& w, int64_t M, T* out, int64_t g0, const Ahead& ahead) {
  int64_t i = 0;
  for (; i + RM <= M; i += RM) tile_q6_vnni<RM, RG>(x, w, out, i, g0, i + RM == M ? ahead : Ahead{});
  const int64_t left = M - i;
  if (left == 3) tile_q6_vnni<3, RG>(x, w, out, i, g0, ahead);
  else if (left == 2) tile_q6_vnni<2, RG>(x, w, out, i, g0, ahead);
  else if (left == 1) tile_q6_vnni<1, RG>(x, w, out, i, g0, ahead);
}

}  // namespace zs_qgemm
