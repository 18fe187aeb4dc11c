// The AVX2 tile of the codebook formats (IQ4XS, IQ4NL; layouts: ../../formats.h): each nibble
// looked up in the row's 16-value int8 codebook (one vpshufb), then dotted with the int8
// activations by maddubs with the sign trick (|w| times x with w's sign, as llama.cpp's
// ggml_vec_dot_iq4_xs_q8_K does): the values are signed, and maddubs takes one unsigned
// operand. The block's dw (its d, or the super-block's d times the int8 block scale) is
// formed in float32 for 8 rows at once.
#pragma once

#include "common.h"

namespace zs_qgemm {

// RM activation rows x one group of 16 output rows, as tile_avx2 (two halves of 8 rows).
template <int FMT, int RM, typename T>
ZS_AVX2 void tile_codebook_avx2(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead = {}) {
  using L = Layout<FMT>;
  static_assert(L::R.codebook != nullptr && L::R.piece == QK && !L::M, "a codebook of nibbles, scaled per block");
  const int64_t nb = w.nb, N = w.N;
  const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(L::R.codebook)));
  __m256 facc[RM][2];
  for (int i = 0; i < RM; ++i) facc[i][0] = facc[i][1] = _mm256_setzero_ps();
  __m256 du[2];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = sub_block<FMT>(w, g, b);
    if (x.prefetch && i0 == 0) prefetch_block_ahead<L::SBB>(wb);
    ahead.fetch(b);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    __m256i iacc[RM][2];
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < RM; ++i) iacc[i][h] = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + k * 64 + h * 32));
        const __m256i lo = _mm256_shuffle_epi8(book, _mm256_and_si256(v, nib));
        const __m256i hi = _mm256_shuffle_epi8(book, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
        const __m256i alo = _mm256_sign_epi8(lo, lo), ahi = _mm256_sign_epi8(hi, hi);
        for (int i = 0; i < RM; ++i) {
          // int16 pairs of |w| x <= 2 * 127 * 127: no saturation; widened before the sum
          const __m256i xl = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(xb[i] + 4 * k)), lo);
          const __m256i xh = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(xb[i] + 16 + 4 * k)), hi);
          const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(alo, xl), ones),
                                             _mm256_madd_epi16(_mm256_maddubs_epi16(ahi, xh), ones));
          iacc[i][h] = _mm256_add_epi32(iacc[i][h], p);
        }
      }
    }
    if (L::SUPER && b % 8 == 0)
      for (int h = 0; h < 2; ++h) du[h] = load8_f16(w.d + unit_of<FMT>(w, g, b) * GR + 8 * h);
    for (int h = 0; h < 2; ++h) {
      __m256 dw;
      if constexpr (L::SUPER) {
        static_assert(L::R.scale == Scale::D_SC_I8, "int8 block scales");
        dw = _mm256_mul_ps(du[h], i8x8_to_ps(reinterpret_cast<const int8_t*>(block_scales<FMT>(w, g, b)) + 8 * h));
      } else {
        dw = load8_f16(w.d + (g * nb + b) * GR + 8 * h);
      }
      for (int i = 0; i < RM; ++i) {
        const __m256 dx = _mm256_set1_ps(x.d[(i0 + i) * nb + b]);
        facc[i][h] = _mm256_fmadd_ps(dw, _mm256_mul_ps(_mm256_cvtepi32_ps(iacc[i][h]), dx), facc[i][h]);
      }
    }
  }
  store_tile_avx2(facc, out, N, i0, g);
}

}  // namespace zs_qgemm
