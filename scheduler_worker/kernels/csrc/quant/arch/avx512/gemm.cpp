// The AVX-512 VNNI kernels of the formats it names: the loops over a thread's groups of the tiles
// of q4_q8.h, kquant.h (with the 5-bit formats' panel, panel.h) and q6k.h.
#include "panel.h"
#include "q4_q8.h"
#include "q6k.h"

namespace zs_qgemm {

// Q5, Q50, Q4K, Q5K, IQ4XS, IQ4NL: groups [g0, g1) of every activation row.
template <int FMT, typename T>
ZS_AVX512 void gemm_kq_vnni(const Act& x, const Packed& w, int64_t M, T* out, int64_t g0, int64_t g1) {
  // groups [g, g + n) asked for ahead (Ahead: ../../kernel.h) where a tile of `rm` rows
  // leaves more than one tile per group
  auto next = [&](int64_t g, int64_t n, int64_t rm) {
    return x.prefetch && M > rm ? ahead_of(w.q, group_bytes<FMT>(w.nb), g, std::min(n, g1 - g), w.nb) : Ahead{};
  };
  // the 5-bit formats on the panel path from PANEL_MIN_ROWS rows (panel.h)
  if constexpr (Layout<FMT>::HI)
    if (M >= PANEL_MIN_ROWS) return gemm_kq_panel<FMT>(x, w, M, out, g0, g1, false);
  if (M >= 8) {  // one group, 8 rows a tile: each register of unpacked weights (the
    // nibbles ORed with their fifth bits) feeds 8 rows, not 4: 20-25% less time at 128
    // rows of Q5_0 (bench_quant.py --per-byte); the 4- and 8-bit tiles gained nothing
    for (int64_t g = g0; g < g1; ++g) rows_kq_vnni<FMT, 8, 1>(x, w, M, out, g, next(g + 1, 1, 8));
    return;
  }
  int64_t g = g0;
  for (; g + 2 <= g1; g += 2) rows_kq_vnni<FMT, 4, 2>(x, w, M, out, g, next(g + 2, 2, 4));
  if (g < g1) rows_kq_vnni<FMT, 4, 1>(x, w, M, out, g, Ahead{});
}

// Q6K: one group at a time. Two groups' interleaved weight streams (the RG = 2 tiles of
// the other formats) measured 2-3x slower per byte at 1 row once the weight left the L2
// cache (a 49152 x 512 weight, one thread, Zen 4), and no faster at 4-32 rows.
template <typename T>
ZS_AVX512 void gemm_q6_vnni(const Act& x, const Packed& w, int64_t M, T* out, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    // the next group asked for ahead where a tile of 4 rows leaves more than one per group
    const Ahead next = x.prefetch && M > 4
        ? ahead_of(w.q, group_bytes<Q6K>(w.nb), g + 1, std::min<int64_t>(1, g1 - g - 1), w.nb)
        : Ahead{};
    rows_q6_vnni<4, 1>(x, w, M, out, g, next);
  }
}

namespace avx512 {

template <int FMT>
void groups(const Act& x, const Packed& w, int64_t M, Out out, int64_t g0, int64_t g1) {
  with_out(out, [&](auto* o) {
    if constexpr (FMT == Q4 || FMT == Q8) gemm_vnni<FMT>(x, w, M, o, g0, g1);
    else if constexpr (FMT == Q6K) gemm_q6_vnni(x, w, M, o, g0, g1);
    else if constexpr (FMT == Q5 || FMT == Q50 || FMT == Q4K || FMT == Q5K || FMT == IQ4XS ||
                       FMT == IQ4NL)
      gemm_kq_vnni<FMT>(x, w, M, o, g0, g1);
    else static_assert(NO_TILES<FMT>, "no AVX-512 tiles for this format");
  });
}

ZS_INSTANTIATE_EVERY_FORMAT

}  // namespace avx512
}  // namespace zs_qgemm
