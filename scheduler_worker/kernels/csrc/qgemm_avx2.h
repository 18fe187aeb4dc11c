// AVX2 path of the quantized linears (maddubs + madd, 32 inputs per op): activation
// quantization and the tile kernel. Compiled into qgemm.cpp under its target attribute.
#pragma once

#include "qgemm_common.h"

namespace zs_qgemm {

#define ZS_AVX2 __attribute__((target("avx2,fma,f16c")))

ZS_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

ZS_AVX2 inline float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
  float r = hsum_avx2(acc);
  for (; k < n; ++k) r += a[k] * b[k];
  return r;
}

ZS_AVX2 inline __m256 load8_avx2(const float* x) { return _mm256_loadu_ps(x); }
ZS_AVX2 inline __m256 load8_avx2(const c10::BFloat16* x) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <typename T>
ZS_AVX2 void quantize_row_avx2(const T* x, int64_t nb, int8_t* q, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < nb; ++b) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = load8_avx2(x + b * QK + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float db = _mm_cvtss_f32(m4) / 127.f;
    const __m256 id = _mm256_set1_ps(db > 0.f ? 1.f / db : 0.f);
    __m256i i32[4];
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      i32[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      sum = _mm256_add_epi32(sum, i32[j]);
    }
    // pack 4 x 8 int32 -> 32 int8; packs work per 128-bit lane, the permute restores order
    __m256i p16a = _mm256_packs_epi32(i32[0], i32[1]);
    __m256i p16b = _mm256_packs_epi32(i32[2], i32[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * QK), p8);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    d[b] = db;
    s[b] = db * static_cast<float>(_mm_cvtsi128_si32(s4));
  }
}

ZS_AVX2 inline __m256i unpack_q4_avx2(const uint8_t* p) {  // 16 bytes -> 32 values in order
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

ZS_AVX2 inline __m256 dot_u8s8_avx2(__m256i u, __m256i s) {  // 32 u8*s8 -> 8 float partials
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

template <int FMT, int RM, int RN, typename T>
ZS_AVX2 void tile_avx2(const Problem& p, T* out, int64_t i0, int64_t n0) {
  __m256 acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) acc[i][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < p.nb; ++b) {
    __m256i w[RN], ws[RN];  // unsigned weight bytes; for Q8 |w| and w (for its signs)
    __m256 dw[RN];
    for (int r = 0; r < RN; ++r) {
      const uint8_t* row = p.w.q + (n0 + r) * p.w.row_bytes;
      if constexpr (FMT == Q4) {
        w[r] = unpack_q4_avx2(row + b * 16);
      } else {
        ws[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * QK));
        w[r] = _mm256_sign_epi8(ws[r], ws[r]);
      }
      dw[r] = _mm256_set1_ps(p.w.d[(n0 + r) * p.nb + b]);
    }
    for (int i = 0; i < RM; ++i) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.x.q + (i0 + i) * p.nb * QK + b * QK));
      const __m256 dx = _mm256_set1_ps(p.x.d[(i0 + i) * p.nb + b]);
      for (int r = 0; r < RN; ++r) {
        const __m256 t = FMT == Q4 ? dot_u8s8_avx2(w[r], x) : dot_u8s8_avx2(w[r], _mm256_sign_epi8(x, ws[r]));
        acc[i][r] = _mm256_fmadd_ps(t, _mm256_mul_ps(dw[r], dx), acc[i][r]);
      }
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) {
      float v = hsum_avx2(acc[i][r]);
      if constexpr (FMT == Q4) v += dot_f32_avx2(p.w.m + (n0 + r) * p.nb, p.x.s + (i0 + i) * p.nb, p.nb);
      store(out + (i0 + i) * p.N + n0 + r, v);
    }
}

}  // namespace zs_qgemm
