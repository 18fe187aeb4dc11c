// The AVX2 Q8 tile from 3 activation rows on (layout: ../../formats.h). Without VNNI the
// sign trick of q4_q8.h spends sign, maddubs and madd per row and 32 products; here the
// weights are widened to int16 once per tile and each row's products are one madd per 16
// (int32 pair sums: exact), with the activations widened to int16 once per call.
#pragma once

#include <vector>

#include "common.h"

namespace zs_qgemm {

// The activations of M rows as int16 and each block's integer sum (the weights are read
// as stored, q + 128: the sum takes the 128 back off).
struct Wide {
  const int16_t* q;    // [M, K]
  const int32_t* sum;  // [M, nb]
};

// hadd of two 4-row madd accumulators leaves rows in the order 0 1 4 5 2 3 6 7 (and
// back: the order is its own inverse)
ZS_AVX2 inline __m256i q8_row_order() { return _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7); }

// int16 a group's block takes widened (q8_widen_group): [half][k 0..7][wl, wh] x 16.
constexpr int64_t Q8_WIDE_BLOCK = 2 * 8 * 2 * 16;

// Group g's weights as int16 q (the + 128 taken off), every block's, at u: what the tiles
// widen per tile of rows, done once for all of them (q8_groups from Q8_WIDE_MIN_ROWS rows).
ZS_AVX2 inline void q8_widen_group(const Packed& w, int64_t g, bool prefetch, int16_t* u) {
  constexpr int64_t BB = Layout<Q8>::SBB;
  const __m256i off = _mm256_set1_epi16(128);
  for (int64_t b = 0; b < w.nb; ++b) {
    const uint8_t* wb = w.q + (g * w.nb + b) * BB;
    if (prefetch) prefetch_block_ahead<BB>(wb);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 8; ++k)
        for (int j = 0; j < 2; ++j) {
          const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 64 * k + 32 * h + 16 * j));
          _mm256_store_si256(reinterpret_cast<__m256i*>(u + b * Q8_WIDE_BLOCK + ((h * 8 + k) * 2 + j) * 16),
                             _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), off));
        }
  }
}

// RM activation rows x half h (8 output rows) of group g; WIDE: `wide` (32-byte aligned,
// q8_widen_group's), the weights are read there, already int16 and without the + 128.
template <int RM, bool WIDE = false, typename T>
ZS_AVX2 void tile_q8_rows_avx2(const Wide& xw, const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, int h,
                                const Ahead& ahead, const int16_t* wide = nullptr) {
  constexpr int64_t BB = Layout<Q8>::SBB;
  const int64_t nb = w.nb, N = w.N, K = nb * QK;
  const __m256i order = q8_row_order();
  __m256 facc[RM];
  for (int i = 0; i < RM; ++i) facc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = w.q + (g * nb + b) * BB + 32 * h;
    const int16_t* w16 = WIDE ? wide + b * Q8_WIDE_BLOCK + h * 256 : nullptr;
    if (!WIDE && x.prefetch && i0 == 0 && h == 0) prefetch_block_ahead<BB>(wb);
    ahead.fetch(b);
    __m256i lo[RM], hi[RM];  // rows 0-3 and 4-7 of the half, two pair sums a row
    for (int i = 0; i < RM; ++i) lo[i] = hi[i] = _mm256_setzero_si256();
    const int16_t* xb = xw.q + i0 * K + b * QK;
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i wl = WIDE ? _mm256_load_si256(reinterpret_cast<const __m256i*>(w16 + 32 * k))
                              : _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 64 * k)));
      const __m256i wh = WIDE ? _mm256_load_si256(reinterpret_cast<const __m256i*>(w16 + 32 * k + 16))
                              : _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 64 * k + 16)));
      for (int i = 0; i < RM; ++i) {
        int64_t v;
        std::memcpy(&v, xb + i * K + 4 * k, 8);
        const __m256i xv = _mm256_set1_epi64x(v);
        lo[i] = _mm256_add_epi32(lo[i], _mm256_madd_epi16(wl, xv));
        hi[i] = _mm256_add_epi32(hi[i], _mm256_madd_epi16(wh, xv));
        ZS_KEEP(lo[i]);
        ZS_KEEP(hi[i]);
      }
    }
    const __m256 dw = _mm256_permutevar8x32_ps(load8_f16(w.d + (g * nb + b) * 16 + 8 * h), order);
    for (int i = 0; i < RM; ++i) {
      const int64_t r = (i0 + i) * nb + b;
      const __m256i q = _mm256_hadd_epi32(lo[i], hi[i]);  // the same sum either way: exact
      const __m256i s = WIDE ? q : _mm256_sub_epi32(q, _mm256_set1_epi32(128 * xw.sum[r]));
      // as tile_avx2 rounds it: a row's outputs do not depend on the tile it falls in
      facc[i] = _mm256_fmadd_ps(dw, _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(x.d[r])), facc[i]);
    }
  }
  const int64_t n0 = g * 16 + 8 * h, take = std::min<int64_t>(8, N - n0);
  for (int i = 0; i < RM; ++i) {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, _mm256_permutevar8x32_ps(facc[i], order));
    T* o = out + (i0 + i) * N + n0;
    if constexpr (std::is_same_v<T, float>)
      if (take == 8) {  // as store_tile_avx2 (common.h): no memcpy call for a whole half
        _mm256_storeu_ps(o, _mm256_load_ps(tmp));
        continue;
      }
    for (int64_t j = 0; j < take; ++j) store(o + j, tmp[j]);
  }
}

}  // namespace zs_qgemm
