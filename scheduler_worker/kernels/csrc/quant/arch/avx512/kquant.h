// The AVX-512 VNNI tiles of the 5-bit, K-quant and codebook formats (Q5, Q50, Q4K, Q5K,
// IQ4XS, IQ4NL; layouts: ../../formats.h), read from the format's row: the 4-bit tile's integer
// work (q4_q8.h) with the fifth bit added into the nibbles first, or each nibble looked up
// in the codebook + 128 (one vpshufb: dpbusd takes unsigned weights, and the dot then
// less 128 s is the codebook's), and each block's scales (float16 d, m per block, or the
// super-block's d, m times the uint8 sub-scales or d times the int8 block scales)
// multiplied in float32 for 16 rows at once.
#pragma once

#include "common.h"

namespace zs_qgemm {

// RM activation rows x RG groups, as tile_vnni: one dpbusd per 4 inputs, 16 rows at once.
template <int FMT, int RM, int RG, typename T>
ZS_AVX512 void tile_kq_vnni(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g0, const Ahead& ahead = {}) {
  using L = Layout<FMT>;
  constexpr FormatRow R = L::R;
  static_assert(R.piece == QK && R.bits <= 5, "nibbles (and a fifth bit), scaled per block");
  constexpr bool BOOK = R.codebook != nullptr;
  constexpr float OFF = BOOK ? 128.f : static_cast<float>(R.offset);  // v = the stored byte - OFF
  const int64_t nb = w.nb, N = w.N;
  const __m512i nib = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  __m512i book = _mm512_setzero_si512();  // the codebook + 128, in every 128-bit lane
  if constexpr (BOOK)
    book = _mm512_broadcast_i32x4(_mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(R.codebook)),
                                                _mm_set1_epi8(static_cast<char>(0x80))));
  __m512 facc[RM][RG];
  zero_tile(facc);
  __m512 du[RG], mu[RG];
  for (int64_t b = 0; b < nb; ++b) {
    __m512i iacc[RM][RG];
    zero_tile(iacc);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    const uint8_t* wb[RG];
    __m512i hb[RG];
    for (int g = 0; g < RG; ++g) {
      wb[g] = sub_block<FMT>(w, g0 + g, b);
      if constexpr (L::HI) hb[g] = _mm512_loadu_si512(wb[g] + 256);
      if (x.prefetch && i0 == 0) prefetch_block_ahead<L::SBB>(wb[g]);
    }
    ahead.fetch(b);
    for (int k = 0; k < 4; ++k) {
      __m512i lo[RG], hi[RG];
      for (int g = 0; g < RG; ++g) {
        const __m512i v = _mm512_loadu_si512(wb[g] + k * 64);
        lo[g] = _mm512_and_si512(v, nib);
        hi[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        if constexpr (L::HI) {  // + 16 where the fifth bit is set
          lo[g] = _mm512_mask_add_epi8(lo[g], _mm512_test_epi8_mask(hb[g], _mm512_set1_epi8(static_cast<char>(1 << (2 * k)))), lo[g], bit4);
          hi[g] = _mm512_mask_add_epi8(hi[g], _mm512_test_epi8_mask(hb[g], _mm512_set1_epi8(static_cast<char>(2 << (2 * k)))), hi[g], bit4);
        }
        if constexpr (BOOK) {
          lo[g] = _mm512_shuffle_epi8(book, lo[g]);
          hi[g] = _mm512_shuffle_epi8(book, hi[g]);
        }
      }
      for (int i = 0; i < RM; ++i) {
        const __m512i xl = _mm512_set1_epi32(load_i32(xb[i] + 4 * k));
        const __m512i xh = _mm512_set1_epi32(load_i32(xb[i] + 16 + 4 * k));
        for (int g = 0; g < RG; ++g) iacc[i][g] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(iacc[i][g], lo[g], xl), hi[g], xh);
      }
    }
    for (int g = 0; g < RG; ++g) {
      __m512 dw, mw = _mm512_setzero_ps();
      if constexpr (L::SUPER) {
        if (b % 8 == 0) {
          const int64_t u = unit_of<FMT>(w, g0 + g, b) * scale_stride<FMT>(w);
          du[g] = load16_f16(w.d + u);
          if constexpr (L::M) mu[g] = load16_f16(w.m + u);
        }
        const uint8_t* sc = block_scales<FMT>(w, g0 + g, b);
        if constexpr (R.scale == Scale::D_SC_I8) {
          dw = _mm512_mul_ps(du[g], i8x16_to_ps(reinterpret_cast<const int8_t*>(sc)));
        } else {
          dw = _mm512_mul_ps(du[g], u8x16_to_ps(sc));
          mw = _mm512_mul_ps(mu[g], u8x16_to_ps(sc + 128));
        }
      } else {
        dw = load16_f16(w.d + ((g0 + g) * nb + b) * scale_stride<FMT>(w));
        if constexpr (L::M) mw = load16_f16(w.m + ((g0 + g) * nb + b) * scale_stride<FMT>(w));
      }
      for (int i = 0; i < RM; ++i) {
        const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * nb + b]);
        if constexpr (L::M) {
          facc[i][g] = _mm512_fmadd_ps(dw, _mm512_mul_ps(_mm512_cvtepi32_ps(iacc[i][g]), dx), facc[i][g]);
          facc[i][g] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.s[(i0 + i) * nb + b]), facc[i][g]);
        } else {  // d (dx dot - OFF s)
          const __m512 u = _mm512_fmsub_ps(_mm512_cvtepi32_ps(iacc[i][g]), dx, _mm512_set1_ps(OFF * x.s[(i0 + i) * nb + b]));
          facc[i][g] = _mm512_fmadd_ps(dw, u, facc[i][g]);
        }
      }
    }
  }
  store_tile(facc, out, N, i0, g0 * GR);
}

template <int FMT, int RM, int RG, typename T>
ZS_AVX512 void rows_kq_vnni(const Act& x, const Packed& w, int64_t M, T* out, int64_t g0, const Ahead& ahead) {
  auto last = [&](int64_t end) { return end == M ? ahead : Ahead{}; };  // the last tile asks
  int64_t i = 0;
  for (; i + RM <= M; i += RM) tile_kq_vnni<FMT, RM, RG>(x, w, out, i, g0, last(i + RM));
  if constexpr (RM > 4) {
    if (M - i >= 4) {
      tile_kq_vnni<FMT, 4, RG>(x, w, out, i, g0, last(i + 4));
      i += 4;
    }
  }
  const int64_t left = M - i;
  if (left == 3) tile_kq_vnni<FMT, 3, RG>(x, w, out, i, g0, ahead);
  else if (left == 2) tile_kq_vnni<FMT, 2, RG>(x, w, out, i, g0, ahead);
  else if (left == 1) tile_kq_vnni<FMT, 1, RG>(x, w, out, i, g0, ahead);
}

}  // namespace zs_qgemm
