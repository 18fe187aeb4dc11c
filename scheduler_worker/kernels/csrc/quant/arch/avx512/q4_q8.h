// The AVX-512 VNNI tiles of the 4- and 8-bit formats (Q4, Q8; layout: ../../formats.h).
// One dpbusd multiplies 4 inputs of one activation row (broadcast) into 16 output rows at
// once: no horizontal sums, no shuffles of the scales, and one weight load feeds every
// activation row of the tile. 8-bit weights are stored + 128 so that they are the unsigned
// operand: sum (w+128) x = dot + 128 sum(x), and dx * 128 sum(x) = 128 s, from the
// activation block sum the quantizer already computes, is subtracted per block.
#pragma once

#include "common.h"

namespace zs_qgemm {

// RM activation rows [i0, i0 + RM) x RG groups [g0, g0 + RG) of 16 output rows.
template <int FMT, int RM, int RG, typename T>
ZS_AVX512 void tile_vnni(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g0, const Ahead& ahead = {}) {
  constexpr int64_t BB = Layout<FMT>::SBB;
  const int64_t nb = w.nb, N = w.N;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  __m512 facc[RM][RG];
  zero_tile(facc);
  for (int64_t b = 0; b < nb; ++b) {
    __m512i iacc[RM][RG];
    zero_tile(iacc);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    if (x.prefetch && i0 == 0)
      for (int g = 0; g < RG; ++g) prefetch_block_ahead<BB>(w.q + ((g0 + g) * nb + b) * BB);
    ahead.fetch(b);
    if constexpr (FMT == Q8) {
      const uint8_t* wb[RG];
      for (int g = 0; g < RG; ++g) wb[g] = w.q + ((g0 + g) * nb + b) * BB;
      dot_block8<RM, RG>(iacc, wb, xb);
    } else {
      for (int k = 0; k < 4; ++k) {
        __m512i lo[RG], hi[RG];
        for (int g = 0; g < RG; ++g) {
          const __m512i v = _mm512_loadu_si512(w.q + ((g0 + g) * nb + b) * BB + k * 64);
          lo[g] = _mm512_and_si512(v, nib);
          hi[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        }
        for (int i = 0; i < RM; ++i) {
          const __m512i xl = _mm512_set1_epi32(load_i32(xb[i] + 4 * k));
          const __m512i xh = _mm512_set1_epi32(load_i32(xb[i] + 16 + 4 * k));
          for (int g = 0; g < RG; ++g) iacc[i][g] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(iacc[i][g], lo[g], xl), hi[g], xh);
        }
      }
    }
    for (int g = 0; g < RG; ++g) {
      const int64_t at = ((g0 + g) * nb + b) * scale_stride<FMT>(w);
      const __m512 dw = load16_f16(w.d + at);
      for (int i = 0; i < RM; ++i) {
        const float dx = x.d[(i0 + i) * nb + b], s = x.s[(i0 + i) * nb + b];
        const __m512 dot = _mm512_cvtepi32_ps(iacc[i][g]);
        if constexpr (FMT == Q8) {
          const __m512 u = _mm512_fmsub_ps(dot, _mm512_set1_ps(dx), _mm512_set1_ps(128.f * s));
          facc[i][g] = _mm512_fmadd_ps(dw, u, facc[i][g]);
        } else {
          facc[i][g] = _mm512_fmadd_ps(dw, _mm512_mul_ps(dot, _mm512_set1_ps(dx)), facc[i][g]);
          facc[i][g] = _mm512_fmadd_ps(load16_f16(w.m + at), _mm512_set1_ps(s), facc[i][g]);
        }
      }
    }
  }
  store_tile(facc, out, N, i0, g0 * GR);
}

// Activation rows [from, M) in tiles of up to RM (the bulk, then the remainder), for RG groups.
template <int FMT, int RM, int RG, typename T>
ZS_AVX512 void rows_vnni(const Act& x, const Packed& w, int64_t M, T* out, int64_t g0, const Ahead& ahead, int64_t from = 0) {
  int64_t i = from;
  for (; i + RM <= M; i += RM) tile_vnni<FMT, RM, RG>(x, w, out, i, g0, i + RM == M ? ahead : Ahead{});
  const int64_t left = M - i;
  if (left == 3) tile_vnni<FMT, 3, RG>(x, w, out, i, g0, ahead);
  else if (left == 2) tile_vnni<FMT, 2, RG>(x, w, out, i, g0, ahead);
  else if (left == 1) tile_vnni<FMT, 1, RG>(x, w, out, i, g0, ahead);
}

// Groups [t0, t1) of every activation row: pairs of groups, then a single one.
template <int FMT, typename T>
ZS_AVX512 void gemm_vnni(const Act& x, const Packed& w, int64_t M, T* out, int64_t g0, int64_t g1) {
  constexpr int64_t BB = Layout<FMT>::SBB;
  const int64_t gb = w.nb * BB;
  // the next pair asked for ahead (Ahead: ../../kernel.h) where a group takes more than one
  // tile of 4 rows
  auto next = [&](int64_t g) {
    return x.prefetch && M > 4 ? ahead_of(w.q, gb, g, std::min<int64_t>(2, g1 - g), w.nb) : Ahead{};
  };
  int64_t g = g0;
  for (; g + 2 <= g1; g += 2) rows_vnni<FMT, 4, 2>(x, w, M, out, g, next(g + 2));
  if (g < g1) rows_vnni<FMT, 4, 1>(x, w, M, out, g, Ahead{});
}

}  // namespace zs_qgemm
