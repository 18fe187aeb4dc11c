// What the AVX2 kernels (maddubs + madd) share: loads, conversions and the result store
// of a tile. Every function carries the AVX2 target attribute; the library is compiled
// for baseline x86-64 and runs these only where the CPU has AVX2 (zs_isa.h).
#pragma once

#include <cstdint>
#include <vector>

#include "../../kernel.h"

namespace zs_qgemm {

#define ZS_AVX2 __attribute__((target("avx2,fma,f16c")))

// Keeps an accumulator in its register: without it GCC reassociates a tile's chains of
// integer adds into trees and spills every partial product to the stack.
#define ZS_KEEP(v) asm("" : "+x"(v))

// A thread's scratch of `bytes` from a 64-byte boundary (a std::vector's data is 16-byte
// aligned, even of __m256i: a 32-byte load at a 16-byte offset splits a cache line).
inline uint8_t* aligned_scratch(std::vector<uint8_t>& v, int64_t bytes) {
  v.resize(bytes + 64);
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t{63});
}

ZS_AVX2 inline __m256 load8_avx2(const float* x) { return _mm256_loadu_ps(x); }
ZS_AVX2 inline __m256 load8_avx2(const c10::BFloat16* x) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ZS_AVX2 inline __m256 load8_f16(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// An RM-row tile's sums (two halves of 8 a row: one group of 16 outputs) into out's rows
// [i0, i0 + RM), outputs from g * 16 on (the last group of N may be short): every AVX2
// GEMM tile's result store.
// Halves [H0, H1) only: a tile of one half (rows 8 * H0 on) of its group.
template <int RM, int H0 = 0, int H1 = 2, typename T>
ZS_AVX2 inline void store_tile_avx2(__m256 (&facc)[RM][2], T* out, int64_t N, int64_t i0, int64_t g) {
  const int64_t n0 = g * 16 + 8 * H0, take = std::min<int64_t>(8 * (H1 - H0), N - n0);
  if constexpr (std::is_same_v<T, float>)
    if (take == 8 * (H1 - H0)) {  // a whole tile of float32: stored as it is (the copy below became a memcpy call)
      for (int i = 0; i < RM; ++i)
        for (int h = H0; h < H1; ++h) _mm256_storeu_ps(out + (i0 + i) * N + n0 + 8 * (h - H0), facc[i][h]);
      return;
    }
  for (int i = 0; i < RM; ++i) {
    alignas(32) float tmp[16];
    for (int h = H0; h < H1; ++h) _mm256_store_ps(tmp + 8 * (h - H0), facc[i][h]);
    T* o = out + (i0 + i) * N + n0;
    for (int64_t j = 0; j < take; ++j) store(o + j, tmp[j]);
  }
}

ZS_AVX2 inline __m256 u8x8_to_ps(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// bit `from` of every byte of h moved to bit 4, the rest cleared
ZS_AVX2 inline __m256i hbit_avx2(__m256i h, int from, __m256i bit4) {
  const __m256i s = from <= 4 ? _mm256_slli_epi16(h, 4 - from) : _mm256_srli_epi16(h, from - 4);
  return _mm256_and_si256(s, bit4);
}

// bits 2k, 2k + 1 of every byte of h moved to bits 4, 5 (the others: junk, masked after)
ZS_AVX2 ZS_INLINE __m256i q6_top_avx2(__m256i h, int k) {
  return k == 0 ? _mm256_slli_epi16(h, 4) : k == 1 ? _mm256_slli_epi16(h, 2) : k == 2 ? h : _mm256_srli_epi16(h, 2);
}

ZS_AVX2 inline __m256 i8x8_to_ps(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
}  // namespace zs_qgemm
