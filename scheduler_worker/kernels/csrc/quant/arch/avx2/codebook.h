// The AVX2 tile of the codebook formats (IQ4XS, IQ4NL; layouts: ../../formats.h): each nibble
// looked up in the row's 16-value int8 codebook (one vpshufb), then dotted with the int8
// activations by maddubs with the sign trick (|w| times x with w's sign, as llama.cpp's
// ggml_vec_dot_iq4_xs_q8_K does): the values are signed, and maddubs takes one unsigned
// operand. The block's dw (its d, or the super-block's d times the int8 block scale) is
// formed in float32 for 8 rows at once.
#pragma once

#include "block_tile.h"

namespace zs_qgemm {

template <int FMT, int RM, int H0, int H1>
struct CodebookBlock {
  static constexpr bool U = false;  // reads the packed blocks (block_tile.h)
  using L = Layout<FMT>;
  static_assert(L::R.codebook != nullptr && L::R.piece == QK && !L::M && L::R.offset == 0,
                "a codebook of nibbles, scaled per block");
  __m256 du[2];

  ZS_AVX2 ZS_INLINE void dot(const uint8_t* wb, const int8_t* const (&xb)[RM], __m256i (&iacc)[RM][2]) {
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(L::R.codebook)));
    for (int h = H0; h < H1; ++h) {
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
  }

  ZS_AVX2 ZS_INLINE Scales scales(const Packed& w, int64_t g, int64_t b, int h) {
    if constexpr (L::SUPER) {
      static_assert(L::R.scale == Scale::D_SC_I8, "int8 block scales");
      if (b % 8 == 0) du[h] = load8_f16(w.d + unit_of<FMT>(w, g, b) * GR + 8 * h);
      return {_mm256_mul_ps(du[h], i8x8_to_ps(reinterpret_cast<const int8_t*>(block_scales<FMT>(w, g, b)) + 8 * h)),
              _mm256_setzero_ps()};
    } else {
      return {load8_f16(w.d + (g * w.nb + b) * GR + 8 * h), _mm256_setzero_ps()};
    }
  }
};

template <int FMT, int RM, int H0 = 0, int H1 = 2, typename T>
ZS_AVX2 void tile_codebook_avx2(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead = {}) {
  block_tile_avx2<FMT, RM, CodebookBlock<FMT, RM, H0, H1>, H0, H1>(x, w, out, i0, g, ahead);
}

}  // namespace zs_qgemm
