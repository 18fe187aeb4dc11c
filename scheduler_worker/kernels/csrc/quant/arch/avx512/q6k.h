// The AVX-512 VNNI tiles of Q6_K (layout and math: ../../formats.h): the 4-bit tile's
// integer work (q4_q8.h) with the top two bits of each value ORed in above its nibble; the
// piece's dot starts at the activations' -32 * sum (Act::off) and is scaled by d * sc in
// float32, 16 rows at once.
#pragma once

#include "common.h"

namespace zs_qgemm {

// RM activation rows x RG groups, as tile_kq_vnni: one dpbusd per 4 inputs, 16 rows at once.
template <int RM, int RG, typename T>
ZS_AVX512 void tile_q6_vnni(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g0, const Ahead& ahead = {}) {
  const int64_t nb = w.nb, N = w.N;
  const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  __m512 facc[RM][RG];
  zero_tile(facc);
  __m512 dv[RG];
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb[RG];
    for (int g = 0; g < RG; ++g) {
      wb[g] = sub_block<Q6K>(w, g0 + g, b);
      if (b % 8 == 0) dv[g] = load16_f16(q6_d(w, g0 + g, b));
      if (x.prefetch && i0 == 0) prefetch_block_ahead<Layout<Q6K>::SBB>(wb[g]);
    }
    ahead.fetch(b);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    __m512 t[RM][RG];
    for (int p = 0; p < 2; ++p) {  // the sub-block's two pieces
      __m512i iacc[RM][RG], hb[RG];
      for (int i = 0; i < RM; ++i) {
        const __m512i o = _mm512_set1_epi32(x.off[((i0 + i) * nb + b) * 2 + p]);
        for (int g = 0; g < RG; ++g) iacc[i][g] = o;
      }
      for (int g = 0; g < RG; ++g) hb[g] = _mm512_loadu_si512(wb[g] + 256 + 64 * p);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        __m512i q[RG];
        for (int g = 0; g < RG; ++g) {
          __m512i v = _mm512_loadu_si512(wb[g] + 64 * k);
          if (p) v = _mm512_srli_epi16(v, 4);
          // nibble | (top bits & 0x30): ternary-logic function a | (b & c)
          q[g] = _mm512_ternarylogic_epi32(_mm512_and_si512(v, nib), q6_top_vnni(hb[g], k), top, 0xF8);
        }
        for (int i = 0; i < RM; ++i) {
          const __m512i xv = _mm512_set1_epi32(load_i32(xb[i] + 16 * p + 4 * k));
          for (int g = 0; g < RG; ++g) iacc[i][g] = _mm512_dpbusd_epi32(iacc[i][g], q[g], xv);
        }
      }
      for (int g = 0; g < RG; ++g) {
        const __m512 ds = _mm512_mul_ps(dv[g], i8x16_to_ps(q6_sc(w, g0 + g, b) + 16 * p));
        for (int i = 0; i < RM; ++i) {
          const __m512 f = _mm512_cvtepi32_ps(iacc[i][g]);
          t[i][g] = p == 0 ? _mm512_mul_ps(f, ds) : _mm512_fmadd_ps(f, ds, t[i][g]);
        }
      }
    }
    for (int i = 0; i < RM; ++i) {
      const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * nb + b]);
      for (int g = 0; g < RG; ++g) facc[i][g] = _mm512_fmadd_ps(t[i][g], dx, facc[i][g]);
    }
  }
  store_tile(facc, out, N, i0, g0 * GR);
}

// Activation rows in tiles of RM (the bulk, then the remainder) for RG groups: the groups'
// weights stay in cache across the row tiles.
template <int RM, int RG, typename T>
ZS_AVX512 void rows_q6_vnni(const Act& x, const Packed& w, int64_t M, T* out, int64_t g0, const Ahead& ahead) {
  int64_t i = 0;
  for (; i + RM <= M; i += RM) tile_q6_vnni<RM, RG>(x, w, out, i, g0, i + RM == M ? ahead : Ahead{});
  const int64_t left = M - i;
  if (left == 3) tile_q6_vnni<3, RG>(x, w, out, i, g0, ahead);
  else if (left == 2) tile_q6_vnni<2, RG>(x, w, out, i, g0, ahead);
  else if (left == 1) tile_q6_vnni<1, RG>(x, w, out, i, g0, ahead);
}

}  // namespace zs_qgemm
