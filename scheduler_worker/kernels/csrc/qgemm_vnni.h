// AVX-512 VNNI path of the quantized linears (the layout: qgemm_common.h). One dpbusd
// multiplies 4 inputs of one activation row (broadcast) into 16 output rows at once: no
// horizontal sums, no shuffles of the scales, and one weight load feeds every activation
// row of the tile. 8-bit weights are stored + 128 so that they are the unsigned operand:
// sum (w+128) x = dot + 128 sum(x), and dx * 128 sum(x) = 128 s, from the activation block
// sum the quantizer already computes, is subtracted per block.
#pragma once

#include "qgemm_avx2.h"

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
// row and group. The 8-bit tile's block, and the 5-bit panel's (qgemm_panel.h).
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

// RM activation rows [i0, i0 + RM) x RG groups [g0, g0 + RG) of 16 output rows.
template <int FMT, int RM, int RG, typename T>
ZS_AVX512 void tile_vnni(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g0, const Ahead& ahead = {}) {
  constexpr int64_t BB = group_block_bytes<FMT>();
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
      const int64_t at = ((g0 + g) * nb + b) * GR;
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
  constexpr int64_t BB = group_block_bytes<FMT>();
  const int64_t gb = w.nb * BB;
  // the next pair asked for ahead (Ahead: qgemm_common.h) where a group takes more than one
  // tile of 4 rows
  auto next = [&](int64_t g) {
    return x.prefetch && M > 4 ? ahead_of(w.q, gb, g, std::min<int64_t>(2, g1 - g), w.nb) : Ahead{};
  };
  int64_t g = g0;
  for (; g + 2 <= g1; g += 2) rows_vnni<FMT, 4, 2>(x, w, M, out, g, next(g + 2));
  if (g < g1) rows_vnni<FMT, 4, 1>(x, w, M, out, g, Ahead{});
}

}  // namespace zs_qgemm
