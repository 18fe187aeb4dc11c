// qlinear for GGUF Q6_K (fmt 5; layout and math in qgemm_q6k.h): the portable scalar
// reference, and the dispatch over the AVX2 and AVX-512 VNNI tiles of qgemm_q6k_simd.h.
// qgemm.cpp's qlinear forwards the format here; activations are quantized by its
// quantize_act, as for every other format, plus the per-piece sums this format needs.
#include <ATen/Parallel.h>

#include "qgemm_q6k_simd.h"

namespace zs_qgemm {

// defined in qgemm.cpp
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_act(const at::Tensor& x_in, int64_t isa);
int64_t clamp_isa(int64_t isa);

// One output of row n for activation row i, read from the packed layout.
float dot_q6_scalar(const Q6Act& x, const Q6Packed& w, int64_t i, int64_t n) {
  const int64_t g = n / GR, r = n % GR, nb = w.nsb * 8;
  float acc = 0.f, dv = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    if (b % 8 == 0) dv = static_cast<float>(q6_d(w, g, b)[r]);
    const uint8_t* qb = q6_sub(w, g, b);
    const int8_t* sc = q6_sc(w, g, b);
    const int8_t* xb = x.q + (i * nb + b) * QK;
    float t = 0.f;
    for (int p = 0; p < 2; ++p) {
      int32_t s = x.off[(i * nb + b) * 2 + p];
      const uint8_t* hb = qb + 256 + 64 * p + 4 * r;
      for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 4; ++j) {
          const int v = qb[64 * k + 4 * r + j];
          const int q = (p ? v >> 4 : v & 15) | ((hb[j] >> (2 * k)) & 3) << 4;
          s += q * xb[16 * p + 4 * k + j];
        }
      t += static_cast<float>(s) * (dv * static_cast<float>(sc[16 * p + r]));
    }
    acc += t * x.d[i * nb + b];
  }
  return acc;
}

// Groups [g0, g1) of every activation row, on path `isa`.
template <typename T>
void gemm_q6(const Q6Act& x, const Q6Packed& w, int64_t M, T* out, int64_t g0, int64_t g1, int64_t isa) {
  // the next group asked for ahead (Ahead: qgemm_common.h) where a tile of `rm` rows
  // leaves more than one tile per group
  auto next = [&](int64_t g, int64_t rm) {
    return x.prefetch && M > rm ? ahead_of(w.q, w.nsb * Q6_UB, g + 1, std::min<int64_t>(1, g1 - g - 1), w.nsb * 8) : Ahead{};
  };
  if (isa >= AVX512) {
    // one group at a time: two groups' interleaved weight streams (the RG = 2 tiles of the
    // other formats) measured 2-3x slower per byte at 1 row once the weight left the L2
    // cache (a 49152 x 512 weight, one thread, Zen 4), and no faster at 4-32 rows
    for (int64_t g = g0; g < g1; ++g) rows_q6_vnni<4, 1>(x, w, M, out, g, next(g, 4));
    return;
  }
  gemm_below_avx512(
      M, w.N, out, g0, g1, isa == AVX2,
      [&](auto rm, int64_t i, int64_t g, const Ahead& a) { tile_q6_avx2<decltype(rm)::value>(x, w, out, i, g, a); },
      [&](int64_t i, int64_t n) { return dot_q6_scalar(x, w, i, n); },
      [&](int64_t g) { return next(g, 2); });
}

// off [M, K/16] = -32 * the sum of each piece of 16 quantized activations
static at::Tensor piece_offsets(const at::Tensor& xq) {
  const int64_t M = xq.size(0), P = xq.size(1) / 16;
  at::Tensor off = at::empty({M, P}, xq.options().dtype(at::kInt));
  const int8_t* q = xq.data_ptr<int8_t>();
  int32_t* o = off.data_ptr<int32_t>();
  at::parallel_for(0, M, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, P)), [&](int64_t i0, int64_t i1) {
    for (int64_t e = i0 * P; e < i1 * P; ++e) {
      int32_t s = 0;
      for (int j = 0; j < 16; ++j) s += q[e * 16 + j];
      o[e] = -32 * s;
    }
  });
  return off;
}

at::Tensor qlinear_q6k(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, int64_t n, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % QK_K == 0, "qlinear Q6_K: x must be [M, K] with K % 256 == 0");
  const int64_t M = x.size(0), K = x.size(1), nsb = K / QK_K;
  TORCH_CHECK(d.dim() == 3 && d.size(2) == GR && d.is_contiguous() && d.scalar_type() == at::kHalf,
              "qlinear Q6_K: d must be float16 [groups, K/256, 16]");
  const int64_t groups = d.size(0);
  TORCH_CHECK(d.size(1) == nsb, "qlinear Q6_K: K=", K, " does not match the weight's ", d.size(1),
              " super-blocks of 256");
  TORCH_CHECK(n > (groups - 1) * GR && n <= groups * GR, "qlinear Q6_K: ", n, " outputs do not fit ", groups,
              " groups");
  TORCH_CHECK(qs.is_contiguous() && qs.scalar_type() == at::kByte && qs.numel() == groups * nsb * Q6_UB,
              "qlinear Q6_K: packed weight has the wrong shape");
  isa = clamp_isa(isa);
  auto [xq, xd, xs] = quantize_act(x, isa);
  at::Tensor out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  const at::Tensor off = piece_offsets(xq);
  const Q6Act a{xq.data_ptr<int8_t>(), xd.data_ptr<float>(), off.data_ptr<int32_t>(), prefetch_weights(M)};
  const Q6Packed w{qs.data_ptr<uint8_t>(), d.data_ptr<c10::Half>(), nsb, n};
  // tasks of whole group pairs, each above ~2k sub-block dots (as the other formats)
  const int64_t pairs = (groups + 1) / 2;
  const int64_t grain = std::max<int64_t>(1, 2048 / std::max<int64_t>(1, 2 * GR * M * nsb * 8 / 4));
  auto run = [&](auto* o) {
    at::parallel_for(0, pairs, grain, [&](int64_t p0, int64_t p1) {
      gemm_q6(a, w, M, o, 2 * p0, std::min(groups, 2 * p1), isa);
    });
  };
  if (out.scalar_type() == at::kFloat) run(out.data_ptr<float>());
  else run(out.data_ptr<c10::BFloat16>());
  return out;
}

}  // namespace zs_qgemm
