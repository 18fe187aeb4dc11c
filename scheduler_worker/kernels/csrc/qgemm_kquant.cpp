// qlinear for the 5-bit and K-quant formats (fmt 2 q5, 6 q50, 3 q4k, 4 q5k; layouts and math in
// qgemm_kquant.h): the portable scalar reference, and the dispatch over the AVX2 and
// AVX-512 VNNI tiles of qgemm_kquant_simd.h. qgemm.cpp's qlinear forwards these formats
// here; activations are quantized by its quantize_act, as for the 4- and 8-bit formats.
#include <ATen/Parallel.h>

#include "qgemm_panel.h"

namespace zs_qgemm {

// defined in qgemm.cpp
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_act(const at::Tensor& x_in, int64_t isa);
int64_t clamp_isa(int64_t isa);

// One output of row n for activation row i, read from the packed layout.
template <int FMT>
float dot_kq_scalar(const Act& x, const KPacked& w, int64_t i, int64_t n) {
  using L = KLayout<FMT>;
  const int64_t g = n / GR, r = n % GR;
  float acc = 0.f;
  for (int64_t b = 0; b < w.nb; ++b) {
    const uint8_t* qb = kq_sub<FMT>(w, g, b);
    const int8_t* xb = x.q + (i * w.nb + b) * QK;
    int32_t sum = 0;
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 4; ++j) {
        const int v = qb[k * 64 + r * 4 + j];
        int lo = v & 15, hi = v >> 4;
        if constexpr (L::HI) {
          const int h = qb[256 + r * 4 + j];
          lo |= ((h >> (2 * k)) & 1) << 4;
          hi |= ((h >> (2 * k + 1)) & 1) << 4;
        }
        sum += lo * xb[4 * k + j] + hi * xb[16 + 4 * k + j];
      }
    float dw, mw;
    if constexpr (L::SUPER) {
      const int64_t u = kq_unit<FMT>(w, g, b) * GR + r;
      const uint8_t* sc = kq_sc<FMT>(w, g, b);
      dw = static_cast<float>(w.d[u]) * static_cast<float>(sc[r]);
      mw = static_cast<float>(w.m[u]) * static_cast<float>(sc[128 + r]);
    } else {
      dw = static_cast<float>(w.d[(g * w.nb + b) * GR + r]);
      mw = L::M ? static_cast<float>(w.m[(g * w.nb + b) * GR + r]) : -16.f * dw;
    }
    acc += dw * x.d[i * w.nb + b] * static_cast<float>(sum);
    acc += mw * x.s[i * w.nb + b];
  }
  return acc;
}

// Groups [g0, g1) of every activation row, on path `isa`.
template <int FMT, typename T>
void gemm_kq(const Act& x, const KPacked& w, int64_t M, T* out, int64_t g0, int64_t g1, int64_t isa) {
  // groups [g, g + n) asked for ahead (Ahead: qgemm_common.h) where a tile of `rm` rows
  // leaves more than one tile per group
  const int64_t gb = w.nb / KLayout<FMT>::UK * KLayout<FMT>::UB;
  auto next = [&](int64_t g, int64_t n, int64_t rm) {
    return x.prefetch && M > rm ? ahead_of(w.q, gb, g, std::min(n, g1 - g), w.nb) : Ahead{};
  };
  if (isa >= AVX512) {
    // the 5-bit formats on the panel path from PANEL_MIN_ROWS rows (qgemm_panel.h)
    if constexpr (KLayout<FMT>::HI)
      if (M >= PANEL_MIN_ROWS) return gemm_kq_panel<FMT>(x, w, M, out, g0, g1, isa == AMX && w.N <= PANEL_AMX_MAX_N);
    if (M >= 8) {  // one group, 8 rows a tile: each register of unpacked weights (the
      // nibbles ORed with their fifth bits) feeds 8 rows, not 4: 20-25% less time at 128
      // rows of Q5_0 (bench_quant.py --per-byte); the 4- and 8-bit tiles gained nothing
      for (int64_t g = g0; g < g1; ++g) rows_kq_vnni<FMT, 8, 1>(x, w, M, out, g, next(g + 1, 1, 8));
      return;
    }
    int64_t g = g0;
    for (; g + 2 <= g1; g += 2) rows_kq_vnni<FMT, 4, 2>(x, w, M, out, g, next(g + 2, 2, 4));
    if (g < g1) rows_kq_vnni<FMT, 4, 1>(x, w, M, out, g, Ahead{});
    return;
  }
  gemm_below_avx512(
      M, w.N, out, g0, g1, isa == AVX2,
      [&](auto rm, int64_t i, int64_t g, const Ahead& a) { tile_kq_avx2<FMT, decltype(rm)::value>(x, w, out, i, g, a); },
      [&](int64_t i, int64_t n) { return dot_kq_scalar<FMT>(x, w, i, n); },
      [&](int64_t g) { return next(g + 1, 1, 2); });
}

template <int FMT>
int64_t unit_bytes() { return KLayout<FMT>::UB; }

at::Tensor qlinear_kquant(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                          const c10::optional<at::Tensor>& m, int64_t fmt, int64_t n, int64_t isa) {
  TORCH_CHECK(is_kquant_fmt(fmt), "qlinear: unknown format ", fmt);
  TORCH_CHECK(x.dim() == 2, "qlinear: x must be 2-D");
  const int64_t M = x.size(0), K = x.size(1), nb = K / QK;
  const bool block_units = fmt == Q5 || fmt == Q50;
  const int64_t per_unit = block_units ? QK : 8 * QK;  // inputs per unit of d and m
  TORCH_CHECK(K % per_unit == 0, "qlinear: K=", K, " must be a multiple of ", per_unit, " for format ", fmt);
  TORCH_CHECK(d.dim() == 3 && d.size(2) == GR && d.is_contiguous() && d.scalar_type() == at::kHalf,
              "qlinear: d must be float16 [groups, units, 16]");
  const int64_t groups = d.size(0), units = K / per_unit;
  TORCH_CHECK(d.size(1) == units, "qlinear: K=", K, " does not match the weight's ", d.size(1), " units of ",
              per_unit);
  TORCH_CHECK(n > (groups - 1) * GR && n <= groups * GR, "qlinear: ", n, " outputs do not fit ", groups, " groups");
  TORCH_CHECK(fmt == Q50 || (m.has_value() && m->is_contiguous() && m->sizes() == d.sizes() &&
                              m->scalar_type() == at::kHalf),
              "qlinear: format ", fmt, " needs m shaped like d");
  const int64_t ub = block_units ? unit_bytes<Q5>() : fmt == Q4K ? unit_bytes<Q4K>() : unit_bytes<Q5K>();
  TORCH_CHECK(qs.is_contiguous() && qs.scalar_type() == at::kByte && qs.numel() == groups * units * ub,
              "qlinear: packed weight has the wrong shape");
  isa = clamp_isa(isa);
  auto [xq, xd, xs] = quantize_act(x, isa);
  at::Tensor out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  const Act a{xq.data_ptr<int8_t>(), xd.data_ptr<float>(), xs.data_ptr<float>(), prefetch_weights(M)};
  const KPacked w{qs.data_ptr<uint8_t>(), d.data_ptr<c10::Half>(), fmt == Q50 ? nullptr : m->data_ptr<c10::Half>(),
                  nb, n};
  const int64_t pairs = (groups + 1) / 2;
  const int64_t grain = std::max<int64_t>(1, 2048 / std::max<int64_t>(1, 2 * GR * M * nb / 4));
  auto run = [&](auto* o) {
    at::parallel_for(0, pairs, grain, [&](int64_t p0, int64_t p1) {
      const int64_t g0 = 2 * p0, g1 = std::min(groups, 2 * p1);
      if (fmt == Q50) gemm_kq<Q50>(a, w, M, o, g0, g1, isa);
      else if (fmt == Q5) gemm_kq<Q5>(a, w, M, o, g0, g1, isa);
      else if (fmt == Q4K) gemm_kq<Q4K>(a, w, M, o, g0, g1, isa);
      else gemm_kq<Q5K>(a, w, M, o, g0, g1, isa);
    });
  };
  if (out.scalar_type() == at::kFloat) run(out.data_ptr<float>());
  else run(out.data_ptr<c10::BFloat16>());
  return out;
}

}  // namespace zs_qgemm
