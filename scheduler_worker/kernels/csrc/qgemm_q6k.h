// GGUF Q6_K weights (fmt 5 of qlinear) times activations quantized to 8 bits per block of
// 32 (quantize_act). The weights stay as the file has them, 210 bytes per 256 inputs:
// per row and super-block b, qs[n, b] = ql[128] (low 4 bits) | qh[64] (high 2 bits) |
// scales[16] (int8, one per 16 inputs), 208 bytes, and d[n, b] the float16 super-scale
// (scheduler_worker/quant/q6k.py splits them). Input k of a super-block, k = 128 h + 32 r
// + l (h < 2, r < 4, l < 32), is
//   q = (4-bit: ql[64 h + l + 32 (r & 1)], its low nibble for r < 2, else its high one)
//     | (2-bit: qh[32 h + l] >> 2 r & 3) << 4,          w = d * scales[k / 16] * (q - 32)
// Per super-block the 256 six-bit values are unpacked once to int8 and reused for every
// activation row; each 16-input piece's products are scaled by its scale and the activation
// block's d, in 16 float lanes summed once per super-block, then by d. One always-inline
// body, one variant per ISA path (zs_isa.h).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <tuple>
#include <vector>

#include "zs_isa.h"

namespace zs_qgemm {

constexpr int64_t Q6K = 5;  // qlinear's fmt code
constexpr int64_t QK_K = 256, Q6K_BYTES = 208;

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_act(const at::Tensor& x, int64_t isa);

struct Q6KArgs {
  const uint8_t* qs;    // [N, nb, 208]
  const c10::Half* d;   // [N, nb]
  const int8_t* xq;     // [M, K]
  const float* xd;      // [M, K / 32]
  int64_t M, N, nb;     // nb = K / 256
};

// Output rows [n0, n1) for every activation row: acc [M] scratch, out [M, N] float.
ZS_INLINE void q6k_rows_impl(const Q6KArgs& a, int64_t n0, int64_t n1, float* acc, float* out) {
  alignas(64) int8_t w[QK_K];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t i = 0; i < a.M; ++i) acc[i] = 0.f;
    for (int64_t b = 0; b < a.nb; ++b) {
      const uint8_t* ql = a.qs + (n * a.nb + b) * Q6K_BYTES;
      const uint8_t* qh = ql + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(ql + 192);
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t l = 0; l < 32; ++l) {
          const int lo0 = ql[64 * h + l], lo1 = ql[64 * h + l + 32], hi = qh[32 * h + l];
          int8_t* o = w + 128 * h + l;
          o[0] = static_cast<int8_t>(((lo0 & 15) | (hi & 3) << 4) - 32);
          o[32] = static_cast<int8_t>(((lo1 & 15) | (hi >> 2 & 3) << 4) - 32);
          o[64] = static_cast<int8_t>(((lo0 >> 4) | (hi >> 4 & 3) << 4) - 32);
          o[96] = static_cast<int8_t>(((lo1 >> 4) | (hi >> 6 & 3) << 4) - 32);
        }
      const float db = static_cast<float>(a.d[n * a.nb + b]);
      for (int64_t i = 0; i < a.M; ++i) {
        const int8_t* x = a.xq + i * a.nb * QK_K + b * QK_K;
        const float* xd = a.xd + (i * a.nb + b) * (QK_K / 32);
        // 16 lanes, one per input of a piece: each piece's products (exact in float) scaled
        // by its scale and the activation block's d, summed across lanes once per block
        // (a horizontal sum per piece made the vector paths slower than the scalar one)
        alignas(64) float lane[16] = {};
        for (int64_t j = 0; j < 16; ++j) {
          const float f = static_cast<float>(sc[j]) * xd[j / 2];
          const int8_t* wj = w + 16 * j;
          const int8_t* xj = x + 16 * j;
#pragma omp simd
          for (int64_t k = 0; k < 16; ++k)
            lane[k] += f * static_cast<float>(static_cast<int32_t>(wj[k]) * static_cast<int32_t>(xj[k]));
        }
        float s = 0.f;
        for (int64_t k = 0; k < 16; ++k) s += lane[k];
        acc[i] += db * s;
      }
    }
    for (int64_t i = 0; i < a.M; ++i) out[i * a.N + n] = acc[i];
  }
}

ZS_VARIANTS((), q6k_rows, (q6k_rows_impl), (const Q6KArgs& a, int64_t n0, int64_t n1, float* acc, float* out),
            (a, n0, n1, acc, out))

// x [M, K] float32/bfloat16, K % 256 == 0 -> [M, n] (x's dtype)
inline at::Tensor qlinear_q6k(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, int64_t n,
                              int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) % QK_K == 0, "qlinear Q6_K: x must be [M, K] with K % 256 == 0");
  const int64_t M = x.size(0), K = x.size(1), nb = K / QK_K;
  TORCH_CHECK(d.dim() == 2 && d.size(0) == n && d.size(1) == nb && d.is_contiguous() && d.scalar_type() == at::kHalf,
              "qlinear Q6_K: d must be float16 [n, K/256]");
  TORCH_CHECK(qs.is_contiguous() && qs.scalar_type() == at::kByte && qs.numel() == n * nb * Q6K_BYTES,
              "qlinear Q6_K: qs must be uint8 [n, K/256 * 208]");
  isa = clamp_isa(isa);
  auto [xq, xd, xs] = quantize_act(x, isa);
  at::Tensor out = at::empty({M, n}, x.options().dtype(at::kFloat));
  if (M > 0 && n > 0) {
    const Q6KArgs a{qs.data_ptr<uint8_t>(), d.data_ptr<c10::Half>(), xq.data_ptr<int8_t>(), xd.data_ptr<float>(), M, n, nb};
    const auto fn = isa == 2 ? &q6k_rows_2 : isa == 1 ? &q6k_rows_1 : &q6k_rows_0;
    float* o = out.data_ptr<float>();
    const int64_t grain = std::max<int64_t>(1, 64 / std::max<int64_t>(1, M * nb));
    at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) {
      std::vector<float> acc(static_cast<size_t>(M));
      fn(a, n0, n1, acc.data(), o);
    });
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace zs_qgemm
