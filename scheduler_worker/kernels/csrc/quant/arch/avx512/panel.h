// The panel path of the 5-bit formats (Q5_0, Q5_1, Q5_K) on AVX-512 VNNI, for steps of
// many activation rows (prefill chunks, the largest decode batches).
//
// The row tiles of kquant.h unpack a weight register (the nibbles ORed with
// their fifth bits) once per tile of 8 rows: 7 vector instructions per 16 dpbusd, on the
// same vector pipes. Here a thread unpacks a pair of groups (32 output rows) once per
// step into a panel of plain bytes (q, 0..31) and float scales, and the tiles then run
// every activation row over the panel as the 8-bit tile does (q4_q8.h): two weight
// loads and one broadcast per row feed 2 dpbusd per 4 inputs, nothing unpacked twice.
// While the rows run over a pair, the first tile asks for the next pair's weights (Ahead,
// ../../kernel.h): the unpacking alone streams them from DRAM. Speed against the row tiles
// (Q4_K, with no fifth bit to merge, keeps them): docs/benchmarks.md, "Eighth round".
//
// Panel, per group of 16 output rows and block b of 32 inputs:
//   q  [512 bytes]: register k (0..7) holds q of inputs 4k..4k+3 of rows 0..15, byte 4r + j
//      (the 8-bit layout of ../../formats.h, unsigned and without its + 128)
//   dw [16 floats]: the rows' scale of the block (d, or d * sc for the K-quants)
//   mw [16 floats]: the rows' offset (m, or m * mn), so w = dw * q + mw (Q5_0: none, its
//      offset is -16 dw)
// Every output is bit for bit what the row tiles give (the same integer dots, the same
// float operations in the same order), so a request's numbers do not depend on how many
// rows share its step.
#pragma once

#include <memory>

#include "../amx/amx.h"
#include "kquant.h"

namespace zs_qgemm {

// Activation rows from which a step takes the panel path (even with the tiles at 16).
constexpr int64_t PANEL_MIN_ROWS = 32;

// Outputs up to which the AMX kind runs the panel's rows on the tile unit (../amx/amx.h):
// wider weights ran slower there than on the VNNI tiles, and no model has a 5-bit weight
// that wide (docs/benchmarks.md, "Tenth round").
constexpr int64_t PANEL_AMX_MAX_N = 16384;

struct Panel {  // a thread's panel of RG groups
  uint8_t* q;   // [RG][nb][512]
  float* dw;    // [RG][nb][16]
  float* mw;    // [RG][nb][16]
  int64_t nb;
};

// This thread's panel storage for `groups` groups of nb blocks, grown as needed.
inline Panel panel_storage(int64_t groups, int64_t nb) {
  thread_local std::unique_ptr<uint8_t[]> buf;
  thread_local int64_t cap = 0;
  const int64_t bytes = groups * nb * (512 + 2 * 16 * 4) + 64;
  if (bytes > cap) {
    buf.reset(new uint8_t[bytes]);
    cap = bytes;
  }
  uint8_t* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buf.get()) + 63) & ~uintptr_t{63});
  float* dw = reinterpret_cast<float*>(p + groups * nb * 512);
  return {p, dw, dw + groups * nb * 16, nb};
}

// Unpacks group g of w into slot s of the panel.
template <int FMT>
ZS_AVX512 void unpack_kq_panel(const Act& x, const Packed& w, int64_t g, const Panel& p, int64_t s) {
  using L = Layout<FMT>;
  const int64_t nb = w.nb;
  const __m512i nib = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  uint8_t* q = p.q + s * nb * 512;
  float* dw = p.dw + s * nb * GR;
  float* mw = p.mw + s * nb * GR;
  __m512 du = _mm512_setzero_ps(), mu = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = sub_block<FMT>(w, g, b);
    if (x.prefetch) prefetch_block_ahead<L::SBB>(wb);
    __m512i hb = _mm512_setzero_si512();
    if constexpr (L::HI) hb = _mm512_loadu_si512(wb + 256);
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_loadu_si512(wb + k * 64);
      __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      if constexpr (L::HI) {  // + 16 where the fifth bit is set
        lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hb, _mm512_set1_epi8(static_cast<char>(1 << (2 * k)))), lo, bit4);
        hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(hb, _mm512_set1_epi8(static_cast<char>(2 << (2 * k)))), hi, bit4);
      }
      _mm512_store_si512(q + b * 512 + k * 64, lo);
      _mm512_store_si512(q + b * 512 + (4 + k) * 64, hi);
    }
    __m512 d, m = _mm512_setzero_ps();
    if constexpr (L::SUPER) {
      if (b % 8 == 0) {
        const int64_t u = unit_of<FMT>(w, g, b) * scale_stride<FMT>(w);
        du = load16_f16(w.d + u);
        mu = load16_f16(w.m + u);
      }
      const uint8_t* sc = block_scales<FMT>(w, g, b);
      d = _mm512_mul_ps(du, u8x16_to_ps(sc));
      m = _mm512_mul_ps(mu, u8x16_to_ps(sc + 128));
    } else {
      d = load16_f16(w.d + (g * nb + b) * scale_stride<FMT>(w));
      if constexpr (L::M) m = load16_f16(w.m + (g * nb + b) * scale_stride<FMT>(w));
    }
    _mm512_store_ps(dw + b * GR, d);
    if constexpr (L::M) _mm512_store_ps(mw + b * GR, m);
  }
}

// RM activation rows [i0, i0 + RM) x the panel's RG groups (outputs from n0 on); HAS_M:
// the format stores m (all but Q5_0).
template <bool HAS_M, int RM, int RG, typename T>
ZS_AVX512 void tile_panel(const Act& x, const Panel& p, int64_t N, T* out, int64_t i0, int64_t n0, const Ahead& ahead = {}) {
  const int64_t nb = p.nb;
  __m512 facc[RM][RG];
  zero_tile(facc);
  for (int64_t b = 0; b < nb; ++b) {
    __m512i iacc[RM][RG];
    zero_tile(iacc);
    const int8_t* xb[RM];
    act_blocks(xb, x, i0, nb, b);
    ahead.fetch(b);
    const uint8_t* wb[RG];
    for (int g = 0; g < RG; ++g) wb[g] = p.q + (g * nb + b) * 512;
    dot_block8<RM, RG>(iacc, wb, xb);
    for (int g = 0; g < RG; ++g) {
      const __m512 dw = _mm512_load_ps(p.dw + (g * nb + b) * GR);
      for (int i = 0; i < RM; ++i) {  // as tile_kq_vnni's epilogue
        const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * nb + b]);
        if constexpr (HAS_M) {
          facc[i][g] = _mm512_fmadd_ps(dw, _mm512_mul_ps(_mm512_cvtepi32_ps(iacc[i][g]), dx), facc[i][g]);
          facc[i][g] = _mm512_fmadd_ps(_mm512_load_ps(p.mw + (g * nb + b) * GR), _mm512_set1_ps(x.s[(i0 + i) * nb + b]), facc[i][g]);
        } else {  // d (dx dot - 16 s)
          const __m512 u = _mm512_fmsub_ps(_mm512_cvtepi32_ps(iacc[i][g]), dx, _mm512_set1_ps(16.f * x.s[(i0 + i) * nb + b]));
          facc[i][g] = _mm512_fmadd_ps(dw, u, facc[i][g]);
        }
      }
    }
  }
  store_tile(facc, out, N, i0, n0);
}

// Groups [g0, g1) of every activation row (M >= PANEL_MIN_ROWS): a pair of groups at a
// time unpacked into the panel, then every row over it in tiles of 4 (and the rest); with
// `amx`, the rows in slabs of 16 on the tile unit first (../amx/amx.h: the panel is its
// B tile layout; the same outputs bit for bit).
template <int FMT, typename T>
ZS_AVX512 void gemm_kq_panel(const Act& x, const Packed& w, int64_t M, T* out, int64_t g0, int64_t g1, bool amx) {
  constexpr bool HAS_M = Layout<FMT>::M;
  const int64_t gb = w.nb / Layout<FMT>::UK * Layout<FMT>::UB;
  const Panel p = panel_storage(2, w.nb);
  const int64_t M16 = amx ? M / 16 * 16 : 0;
  if (amx) amx_begin();
  for (int64_t g = g0; g < g1; g += 2) {
    unpack_kq_panel<FMT>(x, w, g, p, 0);
    const bool pair = g + 1 < g1;
    if (pair) unpack_kq_panel<FMT>(x, w, g + 1, p, 1);
    // the next pair's weights asked for while the rows run over this one
    const Ahead next = x.prefetch ? ahead_of(w.q, gb, g + 2, std::min<int64_t>(2, g1 - g - 2), w.nb) : Ahead{};
    auto rows = [&](auto rg) {
      constexpr int RG = decltype(rg)::value;
      const PanelScales sc{p.dw, p.mw};
      for (int64_t i = 0; i < M16; i += 16)
        slab_amx<HAS_M ? WITH_M : OFF16, RG>(x, p.nb, p.q, sc, 0, out, w.N, i, g * GR, i == 0 ? next : Ahead{});
      int64_t i = M16;
      for (; i + 4 <= M; i += 4) tile_panel<HAS_M, 4, RG>(x, p, w.N, out, i, g * GR, i == 0 ? next : Ahead{});
      const int64_t left = M - i;
      if (left == 3) tile_panel<HAS_M, 3, RG>(x, p, w.N, out, i, g * GR);
      else if (left == 2) tile_panel<HAS_M, 2, RG>(x, p, w.N, out, i, g * GR);
      else if (left == 1) tile_panel<HAS_M, 1, RG>(x, p, w.N, out, i, g * GR);
    };
    if (pair) rows(std::integral_constant<int, 2>{});
    else rows(std::integral_constant<int, 1>{});
  }
  if (amx) amx_end();
}

}  // namespace zs_qgemm
