// What the AVX-512 VNNI kernels share: loads, conversions, a tile's zeroing and result
// store, and the 8-bit block dot (the Q8 tile's and the 5-bit panel's). Every function
// carries the AVX-512 target attribute; the library runs them only where the CPU has
// AVX-512 VNNI (zs_isa.h).
#pragma once

#include "../../kernel.h"

namespace zs_qgemm {

#define ZS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

ZS_AVX512 inline __m512 load16_f16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The first `take` of a row's 16 outputs from their float32 accumulator.
template <typename T>
ZS_AVX512 inline void store16(T* o, __m512 v, int64_t take) {
  if constexpr (std::is_same_v<T, float>) {
    _mm512_mask_storeu_ps(o, static_cast<__mmask16>((1u << take) - 1), v);
  } else {
    alignas(64) float tmp[GR];
    _mm512_store_ps(tmp, v);
    for (int64_t j = 0; j < take; ++j) store(o + j, tmp[j]);
  }
}

// An RM x RG tile's sums into out's rows [i0, i0 + RM), groups of GR outputs from n0 on
// (the last group of N may be short; a group past N stores nothing): every AVX-512 GEMM
// tile's result store.
template <int RM, int RG, typename T>
ZS_AVX512 inline void store_tile(__m512 (&facc)[RM][RG], T* out, int64_t N, int64_t i0, int64_t n0) {
  for (int g = 0; g < RG; ++g) {
    const int64_t n = n0 + g * GR, take = std::min<int64_t>(GR, N - n);
    if (take <= 0) continue;
    for (int i = 0; i < RM; ++i) store16(out + (i0 + i) * N + n, facc[i][g], take);
  }
}

// Every accumulator of a tile (float or integer) set to zero.
template <int RM, int RG>
ZS_AVX512 ZS_INLINE void zero_tile(__m512 (&acc)[RM][RG]) {
  for (int i = 0; i < RM; ++i)
    for (int g = 0; g < RG; ++g) acc[i][g] = _mm512_setzero_ps();
}
template <int RM, int RG>
ZS_AVX512 ZS_INLINE void zero_tile(__m512i (&acc)[RM][RG]) {
  for (int i = 0; i < RM; ++i)
    for (int g = 0; g < RG; ++g) acc[i][g] = _mm512_setzero_si512();
}

// iacc[i][g] += the dot of activation block xb[i] (32 int8) with the block of bytes at
// wb[g] in the 8-bit layout (8 registers of 4 inputs x 16 rows): one dpbusd per register,
// row and group. The 8-bit tile's block, and the 5-bit panel's (panel.h).
template <int RM, int RG>
ZS_AVX512 ZS_INLINE void dot_block8(__m512i (&iacc)[RM][RG], const uint8_t* const (&wb)[RG],
                                    const int8_t* const (&xb)[RM]) {
  for (int k = 0; k < 8; ++k) {
    __m512i wv[RG];
    for (int g = 0; g < RG; ++g) wv[g] = _mm512_loadu_si512(wb[g] + k * 64);
    for (int i = 0; i < RM; ++i) {
      const __m512i xv = _mm512_set1_epi32(load_i32(xb[i] + 4 * k));
      for (int g = 0; g < RG; ++g) iacc[i][g] = _mm512_dpbusd_epi32(iacc[i][g], wv[g], xv);
    }
  }
}


ZS_AVX512 inline __m512 u8x16_to_ps(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}


ZS_AVX512 ZS_INLINE __m512i q6_top_vnni(__m512i h, int k) {
  return k == 0 ? _mm512_slli_epi16(h, 4) : k == 1 ? _mm512_slli_epi16(h, 2) : k == 2 ? h : _mm512_srli_epi16(h, 2);
}

ZS_AVX512 inline __m512 i8x16_to_ps(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}


}  // namespace zs_qgemm
