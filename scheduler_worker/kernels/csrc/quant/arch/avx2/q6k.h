// The AVX2 tile of Q6_K (layout and math: ../../formats.h). The integer work per piece of
// 16 inputs is the 4-bit tile's (q4_q8.h) with the top two bits of each value ORed in
// above its nibble first; the piece's dot starts at the activations' -32 * sum (Act::off)
// and is scaled by d * sc in float32, 8 rows at once.
#pragma once

#include "block_tile.h"  // KQ_PLANE_BYTES

namespace zs_qgemm {

// The 6-bit values of block b, half h, piece p, register k (inputs 16p + 4k.. of rows 8h..
// 8h + 7, the nibble with its top two bits ORed in): what every row of a tile multiplies.
ZS_AVX2 ZS_INLINE __m256i q6_plane(const __m256i (&vv)[4], __m256i hb, int p, int k) {
  const __m256i nib = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
  const __m256i v = p ? _mm256_srli_epi16(vv[k], 4) : vv[k];
  return _mm256_or_si256(_mm256_and_si256(v, nib), _mm256_and_si256(q6_top_avx2(hb, k), top));
}

// Group g's planes, every block's, at u (64-byte aligned; KQ_PLANE_BYTES a block, as
// [h][p][k] x 32 bytes): the unpacked path of gemm.cpp, made once for every tile of rows.
ZS_AVX2 inline void q6_unpack_group(const Packed& w, int64_t g, bool prefetch, uint8_t* u) {
  for (int64_t b = 0; b < w.nb; ++b) {
    const uint8_t* wb = sub_block<Q6K>(w, g, b);
    if (prefetch) prefetch_block_ahead<Layout<Q6K>::SBB>(wb);
    for (int h = 0; h < 2; ++h) {
      __m256i vv[4];
      for (int k = 0; k < 4; ++k) vv[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * k + 32 * h));
      for (int p = 0; p < 2; ++p) {
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256 + 64 * p + 32 * h));
        for (int k = 0; k < 4; ++k)
          _mm256_store_si256(reinterpret_cast<__m256i*>(u + b * KQ_PLANE_BYTES + ((h * 2 + p) * 4 + k) * 32),
                             q6_plane(vv, hb, p, k));
      }
    }
  }
}

// RM activation rows x one group of 16 output rows, as tile_kq_avx2 (two halves of 8 rows);
// UNPACKED: the planes read from u (q6_unpack_group's) instead of made from the block.
template <int RM, int H0 = 0, int H1 = 2, bool UNPACKED = false, typename T>
ZS_AVX2 void tile_q6_avx2(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead = {},
                          const uint8_t* u = nullptr) {
  const int64_t nb = w.nb, N = w.N;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 facc[RM][2];
  for (int i = 0; i < RM; ++i) facc[i][0] = facc[i][1] = _mm256_setzero_ps();
  __m256 dv[2];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = sub_block<Q6K>(w, g, b);
    if (!UNPACKED && x.prefetch && i0 == 0 && H0 == 0) prefetch_block_ahead<Layout<Q6K>::SBB>(wb);
    ahead.fetch(b);
    const int8_t* sc = q6_sc(w, g, b);
    if (b % 8 == 0)
      for (int h = H0; h < H1; ++h) dv[h] = load8_f16(q6_d(w, g, b) + 8 * h);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    for (int h = H0; h < H1; ++h) {  // rows 8h .. 8h + 7
      __m256 t[RM];
      for (int p = 0; p < 2; ++p) {  // the sub-block's two pieces
        // the nibble registers, then the piece's top-bit plane: address order (kquant.h)
        __m256i vv[4], hb = _mm256_setzero_si256();
        if constexpr (!UNPACKED) {
          for (int k = 0; k < 4; ++k) vv[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * k + 32 * h));
          const uint8_t* hp = wb + 256 + 64 * p + 32 * h;
          asm("" : "+r"(hp) : "x"(vv[0]), "x"(vv[1]), "x"(vv[2]), "x"(vv[3]));
          hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hp));
        }
        __m256i acc[RM];
        for (int i = 0; i < RM; ++i) acc[i] = _mm256_set1_epi32(x.off[((i0 + i) * nb + b) * 2 + p]);
#pragma GCC unroll 2
        for (int k = 0; k < 4; k += 2) {
          __m256i q[2];
#pragma GCC unroll 2
          for (int kk = 0; kk < 2; ++kk)
            q[kk] = UNPACKED ? _mm256_load_si256(reinterpret_cast<const __m256i*>(
                                   u + b * KQ_PLANE_BYTES + ((h * 2 + p) * 4 + k + kk) * 32))
                             : q6_plane(vv, hb, p, k + kk);
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
  store_tile_avx2<RM, H0, H1>(facc, out, N, i0, g);
}

}  // namespace zs_qgemm
