// The AMX kernels: the 8-bit format from AMX_MIN_ROWS activation rows, and the 5-bit
// formats' panel from PANEL_MIN_ROWS rows for weights of at most PANEL_AMX_MAX_N outputs
// (amx.h, ../avx512/panel.h). Every other step, and every other format, runs the AVX-512
// kernels (the table in qlinear.cpp falls back to the next ISA down).
#include "../avx512/panel.h"
#include "amx.h"

namespace zs_qgemm::amx {

template <int FMT>
void groups(const Act& x, const Packed& w, int64_t M, Out out, int64_t g0, int64_t g1) {
  if constexpr (FMT == Q8) {
    if (M >= AMX_MIN_ROWS) return with_out(out, [&](auto* o) { gemm_amx_q8(x, w, M, o, g0, g1); });
  } else if constexpr (FMT == Q5 || FMT == Q50 || FMT == Q5K) {  // the 5-bit formats' panel
    if (M >= PANEL_MIN_ROWS && w.N <= PANEL_AMX_MAX_N)
      return with_out(out, [&](auto* o) { gemm_kq_panel<FMT>(x, w, M, o, g0, g1, true); });
  } else {
    static_assert(NO_TILES<FMT>, "no AMX tiles for this format");
  }
  avx512::groups<FMT>(x, w, M, out, g0, g1);
}

ZS_INSTANTIATE_GROUPS(Q8)
ZS_INSTANTIATE_GROUPS(Q5)
ZS_INSTANTIATE_GROUPS(Q50)
ZS_INSTANTIATE_GROUPS(Q5K)

}  // namespace zs_qgemm::amx
