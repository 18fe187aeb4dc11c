// The vector blocks of paged decode attention (decode_attention.cpp): per ISA, the scores
// of a block's keys against a KV head's query heads and the weighted sum of its values,
// and the prefetches that ask for the next block while one is computed.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "zs_isa.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

namespace zs_ops {

// Asks for n rows of `width` values, `row` values apart (a block's tokens, the task's
// heads of each), ahead of their use: the blocks lie scattered in the pool, where the
// hardware prefetchers do not follow. Into L2 (prefetcht1), not L1: a block is ~100 lines
// (SmolLM2: 16 tokens x 3 KV heads x 64 float16 = 6 KB), more than L1's miss buffers
// hold, and prefetches into L1 that wait for one stall the loads of the block in hand
// (the figures: docs/benchmarks.md, "Sixth round").
template <typename C>
ZS_INLINE void prefetch_rows(const C* p, int64_t row, int64_t n, int64_t width) {
  const int64_t bytes = width * static_cast<int64_t>(sizeof(C));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(reinterpret_cast<const char*>(p + j * row) + off, 0, 2);
}

// The vector blocks ask for the next block while they compute this one, a share at a
// time (see each_block in attend_impl): its keys [n_next g / G, n_next (g + 1) / G) at
// query head g of the scores, key i at key i of the values (the rest at the last).
template <typename C>
ZS_INLINE void prefetch_share(const C* next, int64_t row, int64_t n_next, int64_t g, int64_t G, int64_t width) {
  const int64_t a0 = n_next * g / G, a1 = n_next * (g + 1) / G;
  prefetch_rows(next + a0 * row, row, a1 - a0, width);
}
template <typename C>
ZS_INLINE void prefetch_key(const C* next, int64_t row, int64_t n_next, int64_t i, bool last, int64_t width) {
  if (i < n_next) prefetch_rows(next + i * row, row, last ? n_next - i : 1, width);
}

// ---- AVX-512 scores: 16 keys of one block at a time. Each key's dot with a query head
// is 16 lanes of partial sums (DIM / 16 FMAs); the 16 keys' partials are then summed
// across lanes together, 15 adds and 30 shuffles for 16 scores, where a reduction per key
// costs ~8 dependent steps.

template <typename C>
ZS_TARGET_AVX512 inline __m512 load16_f32(const C* p) {
  if constexpr (std::is_same_v<C, float>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<C, c10::Half>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {  // bfloat16: the upper half of a float32
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Lane l of the result is the sum of the 16 lanes of v[kSlot[l]]: store key j's partials
// in v[kSlot[j]] (kSlot is its own inverse) and lane j holds key j's score.
inline constexpr int kSlot[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};

ZS_TARGET_AVX512 inline __m512 sum_lanes16(const __m512* v) {
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)  // 256-bit halves: v[i] in the low half, v[i + 8] in the high
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit quarters
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[i], t[i + 4], 0x88), _mm512_shuffle_f32x4(t[i], t[i + 4], 0xDD));
  for (int i = 0; i < 2; ++i)  // pairs within each quarter
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[i], u[i + 2], 0x44), _mm512_shuffle_ps(u[i], u[i + 2], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
}

// 16 lanes of partial sums of q . k (DIM floats each)
template <typename C, int DIM>
ZS_TARGET_AVX512 inline __m512 key_dot(const float* q, const C* k) {
  __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), load16_f32(k));
  for (int c = 1; c < DIM / 16; ++c) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), load16_f32(k + 16 * c), acc);
  return acc;
}

// Scores of keys [j0, j1) of one block (key j at kb + j * row) for the G query heads qf
// (float32, pre-scaled, DIM each): sc[g * n_keys + j].
template <typename C, int DIM, int GRP>
ZS_TARGET_AVX512 __attribute__((noinline)) void block_scores_avx512(const float* qf, const C* kb, int64_t row,
                                                                     int64_t j0, int64_t j1, float* sc,
                                                                     int64_t n_keys, const C* next, int64_t n_next) {
  static_assert(DIM % 16 == 0 && GRP > 0);
  for (int64_t j = j0; j < j1; j += 16) {
    const int64_t cnt = std::min<int64_t>(16, j1 - j);
    const C* k = kb + j * row;
    for (int g = 0; g < GRP; ++g) {
      if (next && j == j0) prefetch_share(next, row, n_next, g, GRP, DIM);
      const float* qg = qf + g * DIM;
      __m512 p[16];
      if (cnt == 16) {  // unrolled: the slots are constants and p stays in registers
#pragma GCC unroll 16
        for (int jj = 0; jj < 16; ++jj) p[kSlot[jj]] = key_dot<C, DIM>(qg, k + jj * row);
      } else {
        for (int jj = 0; jj < 16; ++jj) p[kSlot[jj]] = jj < cnt ? key_dot<C, DIM>(qg, k + jj * row) : _mm512_setzero_ps();
      }
      _mm512_mask_storeu_ps(sc + g * n_keys + j, static_cast<__mmask16>((1u << cnt) - 1), sum_lanes16(p));
    }
  }
}

// acc[g] += sum_j p[g, j] v_j over keys [j0, j1) of one block (p: sc[g * n_keys + j]).
// The accumulators stay in registers over the block: at most 16 of them, so a large group
// or head runs in passes over DIM in chunks of CH (a power of two, as DIM is).
template <typename C, int DIM, int GRP>
ZS_TARGET_AVX512 __attribute__((noinline)) void block_values_avx512(const float* sc, const C* vb, int64_t row,
                                                                     int64_t j0, int64_t j1, int64_t n_keys,
                                                                     float* acc_mem, const C* next, int64_t n_next) {
  constexpr int CH = std::min(DIM, std::max(16, static_cast<int>(std::bit_floor(256u / GRP))));  // per pass
  static_assert(DIM % CH == 0);
  constexpr int R = CH / 16;
  for (int c0 = 0; c0 < DIM; c0 += CH) {
    __m512 acc[GRP][R];
    for (int g = 0; g < GRP; ++g)
      for (int r = 0; r < R; ++r) acc[g][r] = _mm512_loadu_ps(acc_mem + g * DIM + c0 + 16 * r);
    for (int64_t j = j0; j < j1; ++j) {
      if (next && c0 == 0) prefetch_key(next, row, n_next, j - j0, j == j1 - 1, DIM);
      __m512 v[R];
      for (int r = 0; r < R; ++r) v[r] = load16_f32(vb + j * row + c0 + 16 * r);
      for (int g = 0; g < GRP; ++g) {
        const __m512 p = _mm512_set1_ps(sc[g * n_keys + j]);
        for (int r = 0; r < R; ++r) acc[g][r] = _mm512_fmadd_ps(p, v[r], acc[g][r]);
      }
    }
    for (int g = 0; g < GRP; ++g)
      for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc_mem + g * DIM + c0 + 16 * r, acc[g][r]);
  }
}

// ---- AVX2 blocks: the same work on 8 lanes (F16C widens float16). Without them the
// portable loops widened each float16 value on its own, and the float16 cache of a float32
// model (the default) made the AVX2 path's attention several times slower than a float32
// cache (docs/benchmarks.md, "Fifth round", "AVX2 vector blocks for decode attention").

template <typename C>
ZS_TARGET_AVX2 inline __m256 load8_f32(const C* p) {
  if constexpr (std::is_same_v<C, float>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<C, c10::Half>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {  // bfloat16: the upper half of a float32
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Lane j of the result is the sum of the 8 lanes of v[j].
ZS_TARGET_AVX2 inline __m256 sum_lanes8(const __m256* v) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // per 128-bit half
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Key k's 8 lanes of partial sums against each of the G query heads qf[g] (DIM floats
// each) into p[g][jj], k widened once for the group (a widening a head cost as much as its
// FMAs); each head's sum in the same order as with a widening of its own.
template <typename C, int DIM, int GRP>
ZS_TARGET_AVX2 inline void key_dots8(const float* qf, const C* k, __m256 (*p)[8], int jj) {
  __m256 acc[GRP];
  for (int c = 0; c < DIM / 8; ++c) {
    const __m256 kc = load8_f32(k + 8 * c);
    for (int g = 0; g < GRP; ++g) {
      const __m256 qc = _mm256_loadu_ps(qf + g * DIM + 8 * c);
      acc[g] = c == 0 ? _mm256_mul_ps(qc, kc) : _mm256_fmadd_ps(qc, kc, acc[g]);
    }
  }
  for (int g = 0; g < GRP; ++g) p[g][jj] = acc[g];
}

// As block_scores_avx512, 8 keys at a time, each key read once for the G query heads.
template <typename C, int DIM, int GRP>
ZS_TARGET_AVX2 __attribute__((noinline)) void block_scores_avx2(const float* qf, const C* kb, int64_t row, int64_t j0,
                                                                 int64_t j1, float* sc, int64_t n_keys, const C* next,
                                                                 int64_t n_next) {
  static_assert(DIM % 8 == 0 && GRP > 0);
  for (int64_t j = j0; j < j1; j += 8) {
    const int64_t cnt = std::min<int64_t>(8, j1 - j);
    const C* k = kb + j * row;
    __m256 p[GRP][8];
    for (int jj = 0; jj < 8; ++jj) {
      if (next && j == j0) prefetch_share(next, row, n_next, jj, 8, DIM);  // an eighth a key
      if (jj < cnt) {
        key_dots8<C, DIM, GRP>(qf, k + jj * row, p, jj);
      } else {
        for (int g = 0; g < GRP; ++g) p[g][jj] = _mm256_setzero_ps();
      }
    }
    for (int g = 0; g < GRP; ++g) {
      alignas(32) float out[8];
      _mm256_store_ps(out, sum_lanes8(p[g]));
      for (int64_t jj = 0; jj < cnt; ++jj) sc[g * n_keys + j + jj] = out[jj];
    }
  }
}

// As block_values_avx512 on 8 lanes: GRP x R accumulators, the R value vectors and the
// weight within AVX2's 16 registers.
template <typename C, int DIM, int GRP>
ZS_TARGET_AVX2 __attribute__((noinline)) void block_values_avx2(const float* sc, const C* vb, int64_t row, int64_t j0,
                                                                 int64_t j1, int64_t n_keys, float* acc_mem,
                                                                 const C* next, int64_t n_next) {
  constexpr int CH = std::min(DIM, 8 * std::max(1, static_cast<int>(std::bit_floor(15u / (GRP + 1)))));  // per pass
  static_assert(DIM % CH == 0);
  constexpr int R = CH / 8;
  for (int c0 = 0; c0 < DIM; c0 += CH) {
    __m256 acc[GRP][R];
    for (int g = 0; g < GRP; ++g)
      for (int r = 0; r < R; ++r) acc[g][r] = _mm256_loadu_ps(acc_mem + g * DIM + c0 + 8 * r);
    for (int64_t j = j0; j < j1; ++j) {
      if (next && c0 == 0) prefetch_key(next, row, n_next, j - j0, j == j1 - 1, DIM);
      __m256 v[R];
      for (int r = 0; r < R; ++r) v[r] = load8_f32(vb + j * row + c0 + 8 * r);
      for (int g = 0; g < GRP; ++g) {
        const __m256 p = _mm256_set1_ps(sc[g * n_keys + j]);
        for (int r = 0; r < R; ++r) acc[g][r] = _mm256_fmadd_ps(p, v[r], acc[g][r]);
      }
    }
    for (int g = 0; g < GRP; ++g)
      for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc_mem + g * DIM + c0 + 8 * r, acc[g][r]);
  }
}

}  // namespace zs_ops
