// The AMX path of the quantized linears whose weights are plain bytes per block of 32
// inputs: the 8-bit format (../avx512/q4_q8.h) and the 5-bit panel (../avx512/panel.h).
//
// Both layouts are already an AMX "B" tile: per group of 16 output rows and block of 32
// inputs, 8 rows of 64 bytes, row k holding inputs 4k..4k+3 of the 16 outputs (4 bytes
// each). A tile of 16 activation rows x 32 int8 ("A", read in place with the row stride
// K) times it is one `tdpbsud` (signed activations x unsigned weights): the 16 x 16
// integer dots of the block, which the VNNI tiles build from 128 dpbusd. The dots leave the
// tile unit through memory (`tilestored`, 1 KB) and the float epilogue is the VNNI tiles'
// own, operation for operation in the same order: every output is bit for bit what
// tile_vnni / tile_panel give, so a request's numbers do not depend on the path or on how
// many rows share its step.
//
// The scales change every 32 inputs, so each `tdpbsud` runs at half its depth (K = 32 of
// 64), and every block's dots go out as a tile store before the float epilogue (per row a
// load, a conversion and two FMAs per 16 outputs). A slab is 16 rows x 2 groups; the tiles
// of block b + 1 are issued before block b's epilogue runs (C tiles 0-1 and 2-3
// alternate), so the tile unit works while the vector unit does. The tile side bounds it,
// not the epilogue (whose 32 accumulators spill here): docs/benchmarks.md, "Twelfth round",
// "The AMX slab with its epilogue in registers". Speed against the VNNI tiles, per format
// and row count: docs/benchmarks.md, "Tenth round".
//
// The tile configuration lives in static storage: built on the stack, GCC may drop the
// stores before `ldtilecfg` reads them (llama.cpp's AMX path crashes so, its issue
// #20824). It is loaded at the start of every call on each thread (oneDNN, inside torch,
// loads its own on the same threads) and released at the end. The kernel's permission to
// use the tile state is asked once per process (best_isa, zs_isa.cpp).
#pragma once

#include "../avx512/q4_q8.h"

namespace zs_qgemm {

#if ZS_HAVE_AMX
#define ZS_AMX \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")))
#else
#define ZS_AMX ZS_AVX512
#endif

// Activation rows from which the 8-bit format takes the AMX slabs (rows past the last
// whole 16 take the VNNI tiles).
constexpr int64_t AMX_MIN_ROWS = 16;

struct TileConfig {  // ldtilecfg's 64-byte operand, palette 1
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles 0-3: the dots (C) of two groups, for two blocks in flight; 4-5: activations (A),
// 16 rows x 32 bytes, one per block in flight; 6-7: the two groups' weights (B).
inline const TileConfig* amx_config() {
  alignas(64) static const TileConfig cfg = [] {
    TileConfig c{};
    c.palette = 1;
    for (int t = 0; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = 64;
    for (int t = 4; t < 6; ++t) c.rows[t] = 16, c.colsb[t] = 32;
    for (int t = 6; t < 8; ++t) c.rows[t] = 8, c.colsb[t] = 64;
    return c;
  }();
  return &cfg;
}

// The float epilogue of a block, as the VNNI tiles have it (EPI: the format's offset form).
enum AmxEpi : int { OFF128 = 0, OFF16 = 1, WITH_M = 2 };  // 8-bit; Q5_0's panel; panels with m

struct HalfScales {  // the 8-bit format's d, float16 per group and block
  const c10::Half* d;
  ZS_AMX ZS_INLINE __m512 dw(int64_t at) const { return load16_f16(d + at); }
  ZS_AMX ZS_INLINE __m512 mw(int64_t) const { return _mm512_setzero_ps(); }
};
struct PanelScales {  // the panel's float32 dw and mw
  const float* d;
  const float* m;
  ZS_AMX ZS_INLINE __m512 dw(int64_t at) const { return _mm512_load_ps(d + at); }
  ZS_AMX ZS_INLINE __m512 mw(int64_t at) const { return _mm512_load_ps(m + at); }
};

// Block b's dots into the C tiles of set SET (0: tiles 0-1, A tile 4; 1: tiles 2-3, A tile 5),
// the A tile from the 16 rows at xa. (GCC's tile intrinsics paste their tile number into
// the instruction's text: it must be a literal.)
#define ZS_AMX_DOTS(C0, C1, A)                          \
  _tile_zero(C0);                                       \
  _tile_loadd(A, xa + b * QK, stride);                  \
  _tile_loadd(6, q + b * 512, 64);                      \
  _tile_dpbsud(C0, A, 6);                               \
  if constexpr (RG == 2) {                              \
    _tile_zero(C1);                                     \
    _tile_loadd(7, q + (nb + b) * 512, 64);             \
    _tile_dpbsud(C1, A, 7);                             \
  }
template <int SET, int RG>
ZS_AMX ZS_INLINE void amx_issue(const int8_t* xa, int64_t stride, const uint8_t* q, int64_t nb, int64_t b) {
#if ZS_HAVE_AMX
  if constexpr (SET == 0) {
    ZS_AMX_DOTS(0, 1, 4)
  } else {
    ZS_AMX_DOTS(2, 3, 5)
  }
#endif
}
#undef ZS_AMX_DOTS

// Set SET's dots out to memory, one 16 x 16 int32 block per group.
template <int SET, int RG>
ZS_AMX ZS_INLINE void amx_store(int32_t (&dots)[RG][256]) {
#if ZS_HAVE_AMX
  if constexpr (SET == 0) {
    _tile_stored(0, dots[0], 64);
    if constexpr (RG == 2) _tile_stored(1, dots[1], 64);
  } else {
    _tile_stored(2, dots[0], 64);
    if constexpr (RG == 2) _tile_stored(3, dots[1], 64);
  }
#endif
}

template <int EPI, int RG, class S>
ZS_AMX ZS_INLINE void amx_epilogue(__m512 (&facc)[16][RG], const int32_t (&dots)[RG][256], const Act& x, int64_t nb,
                                   const S& sc, int64_t at, int64_t i0, int64_t b) {
  __m512 dw[RG], mw[RG];
  for (int g = 0; g < RG; ++g) {
    dw[g] = sc.dw(at + (g * nb + b) * GR);
    if constexpr (EPI == WITH_M) mw[g] = sc.mw(at + (g * nb + b) * GR);
  }
  for (int i = 0; i < 16; ++i) {
    const __m512 dx = _mm512_set1_ps(x.d[(i0 + i) * nb + b]);
    const float s = x.s[(i0 + i) * nb + b];
    for (int g = 0; g < RG; ++g) {
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(dots[g] + i * 16));
      if constexpr (EPI == WITH_M) {
        facc[i][g] = _mm512_fmadd_ps(dw[g], _mm512_mul_ps(dot, dx), facc[i][g]);
        facc[i][g] = _mm512_fmadd_ps(mw[g], _mm512_set1_ps(s), facc[i][g]);
      } else {
        const __m512 u = _mm512_fmsub_ps(dot, dx, _mm512_set1_ps((EPI == OFF128 ? 128.f : 16.f) * s));
        facc[i][g] = _mm512_fmadd_ps(dw[g], u, facc[i][g]);
      }
    }
  }
}

// Activation rows [i0, i0 + 16) x RG groups of 16 outputs (from column n0 on): q the first
// group's bytes (nb blocks of 512, the second group's right after), their scales from
// index `at` of sc. The AMX state must be configured (amx_begin).
template <int EPI, int RG, class S, typename T>
ZS_AMX void slab_amx(const Act& x, int64_t nb, const uint8_t* q, const S& sc, int64_t at, T* out, int64_t N, int64_t i0,
                     int64_t n0, const Ahead& ahead = {}) {
  __m512 facc[16][RG];
  zero_tile(facc);
  alignas(64) int32_t dots[RG][256];
  const int8_t* xa = x.q + i0 * nb * QK;
  const int64_t stride = nb * QK;
  // even blocks in tile set 0, odd ones in set 1: block b + 1 is issued before b's
  // epilogue runs
  amx_issue<0, RG>(xa, stride, q, nb, 0);
  for (int64_t b = 0; b < nb; b += 2) {
    ahead.fetch(b);
    if (b + 1 < nb) amx_issue<1, RG>(xa, stride, q, nb, b + 1);
    amx_store<0, RG>(dots);
    amx_epilogue<EPI, RG>(facc, dots, x, nb, sc, at, i0, b);
    if (b + 1 == nb) break;
    ahead.fetch(b + 1);
    if (b + 2 < nb) amx_issue<0, RG>(xa, stride, q, nb, b + 2);
    amx_store<1, RG>(dots);
    amx_epilogue<EPI, RG>(facc, dots, x, nb, sc, at, i0, b + 1);
  }
  store_tile(facc, out, N, i0, n0);
}

#if ZS_HAVE_AMX
ZS_AMX inline void amx_begin() { _tile_loadconfig(amx_config()); }
ZS_AMX inline void amx_end() { _tile_release(); }
#else  // unreachable: best_isa never answers AMX from such a library
inline void amx_begin() {}
inline void amx_end() {}
#endif

// Groups [g0, g1) of every activation row of the 8-bit format (M >= AMX_MIN_ROWS): pairs of
// groups, each in slabs of 16 rows, the rows past the last slab on the VNNI tiles.
template <typename T>
ZS_AMX void gemm_amx_q8(const Act& x, const Packed& w, int64_t M, T* out, int64_t g0, int64_t g1) {
  constexpr int64_t BB = Layout<Q8>::SBB;
  const int64_t nb = w.nb, gb = nb * BB, M16 = M / 16 * 16;
  const HalfScales sc{w.d};
  amx_begin();
  int64_t g = g0;
  for (; g < g1; g += 2) {
    const bool pair = g + 1 < g1;
    // the next pair's weights asked for while the first slab runs over this one
    const Ahead next = x.prefetch ? ahead_of(w.q, gb, g + 2, std::min<int64_t>(2, g1 - g - 2), nb) : Ahead{};
    for (int64_t i = 0; i < M16; i += 16) {
      if (pair) slab_amx<OFF128, 2>(x, nb, w.q + g * gb, sc, g * nb * GR, out, w.N, i, g * GR, i == 0 ? next : Ahead{});
      else slab_amx<OFF128, 1>(x, nb, w.q + g * gb, sc, g * nb * GR, out, w.N, i, g * GR);
    }
    if (pair) rows_vnni<Q8, 4, 2>(x, w, M, out, g, Ahead{}, M16);
    else rows_vnni<Q8, 4, 1>(x, w, M, out, g, Ahead{}, M16);
  }
  amx_end();
}

}  // namespace zs_qgemm
