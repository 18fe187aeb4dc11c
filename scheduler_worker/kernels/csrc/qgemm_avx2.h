// AVX2 path of the quantized linears (maddubs + madd): activation quantization and the
// tile kernel. Compiled into qgemm.cpp under its target attribute.
#pragma once

#include "qgemm_common.h"

namespace zs_qgemm {

#define ZS_AVX2 __attribute__((target("avx2,fma,f16c")))

ZS_AVX2 inline __m256 load8_avx2(const float* x) { return _mm256_loadu_ps(x); }
ZS_AVX2 inline __m256 load8_avx2(const c10::BFloat16* x) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ZS_AVX2 inline __m256 load8_f16(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
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

// RM activation rows x one group of 16 output rows. A group's 64-byte register k is two
// 32-byte halves here, rows 0-7 and rows 8-15. AVX2 has no dpbusd: maddubs (u8 x s8 pairs
// -> int16) then madd with ones (-> int32) give the same 4-product sums per 32-bit lane.
// 4-bit weights are the unsigned operand as they are; 8-bit ones (stored + 128) are made
// signed again and their signs moved onto x, so no int16 pair can saturate.
// An RM-row tile's sums (two halves of 8 a row: one group of 16 outputs) into out's rows
// [i0, i0 + RM), outputs from g * 16 on (the last group of N may be short): every AVX2
// GEMM tile's result store.
template <int RM, typename T>
ZS_AVX2 inline void store_tile_avx2(__m256 (&facc)[RM][2], T* out, int64_t N, int64_t i0, int64_t g) {
  const int64_t n0 = g * 16, take = std::min<int64_t>(16, N - n0);
  for (int i = 0; i < RM; ++i) {
    alignas(32) float tmp[16];
    _mm256_store_ps(tmp, facc[i][0]);
    _mm256_store_ps(tmp + 8, facc[i][1]);
    T* o = out + (i0 + i) * N + n0;
    for (int64_t j = 0; j < take; ++j) store(o + j, tmp[j]);
  }
}

template <int FMT, int RM, typename T>
ZS_AVX2 void tile_avx2(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead = {}) {
  constexpr int64_t BB = group_block_bytes<FMT>();
  const int64_t nb = w.nb, N = w.N;
  const uint8_t* wq = w.q;
  const c10::Half *wd = w.d, *wm = w.m;
  const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 facc[RM][2];
  for (int i = 0; i < RM; ++i) facc[i][0] = facc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = wq + (g * nb + b) * BB;
    if (x.prefetch && i0 == 0) prefetch_block_ahead<BB>(wb);
    ahead.fetch(b);
    __m256i iacc[RM][2];
    for (int i = 0; i < RM; ++i) iacc[i][0] = iacc[i][1] = _mm256_setzero_si256();
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    if constexpr (FMT == Q8) {
      for (int k = 0; k < 8; ++k)
        for (int h = 0; h < 2; ++h) {
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
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k * 64 + h * 32));
          const __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
          for (int i = 0; i < RM; ++i) {
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(xb[i] + 4 * k))),
                                               _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(xb[i] + 16 + 4 * k))));
            acc16[i][h] = _mm256_add_epi16(acc16[i][h], p);
          }
        }
      for (int i = 0; i < RM; ++i)
        for (int h = 0; h < 2; ++h) iacc[i][h] = _mm256_madd_epi16(acc16[i][h], ones);
    }
    const int64_t at = (g * nb + b) * 16;
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = load8_f16(wd + at + 8 * h);
      for (int i = 0; i < RM; ++i) {
        const __m256 dot = _mm256_mul_ps(_mm256_cvtepi32_ps(iacc[i][h]), _mm256_set1_ps(x.d[(i0 + i) * nb + b]));
        facc[i][h] = _mm256_fmadd_ps(dw, dot, facc[i][h]);
        if constexpr (FMT == Q4)
          facc[i][h] = _mm256_fmadd_ps(load8_f16(wm + at + 8 * h), _mm256_set1_ps(x.s[(i0 + i) * nb + b]), facc[i][h]);
      }
    }
  }
  store_tile_avx2(facc, out, N, i0, g);
}

}  // namespace zs_qgemm
