// The ops of quant/qlinear.cpp, decode_attention.cpp and decode_ops.cpp as C++ functions, for decode_model.cpp, which
// chains them without going back through Python and torch's dispatcher.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace zs_qgemm {
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                   const c10::optional<at::Tensor>& m, int64_t fmt, int64_t n, int64_t isa);
}  // namespace zs_qgemm

namespace zs_ops {
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                                  int64_t isa, int64_t window);
at::Tensor rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
                    double eps, int64_t isa);
at::Tensor silu_mul(const at::Tensor& x, int64_t isa);
at::Tensor gelu_tanh_mul(const at::Tensor& x, int64_t isa);
void head_norm_(at::Tensor qkv, const at::Tensor& q_weight, const at::Tensor& k_weight, int64_t H, int64_t Hkv,
                double eps, int64_t isa);
std::tuple<at::Tensor, at::Tensor> rope_write_kv(const at::Tensor& qkv, const at::Tensor& positions,
                                                 const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache,
                                                 at::Tensor v_cache, const at::Tensor& slot_mapping, int64_t H,
                                                 int64_t Hkv, int64_t isa);
}  // namespace zs_ops
