// A whole decode step's decoder layers in one call: for a Llama-family model whose
// linears are all served by the integer kernels, the Python forward would make ~10 op
// calls per layer, each through a module, the dispatcher and a few small tensor views;
// at batch 1 that glue cost about as much as a quarter of the step (docs/benchmarks.md).
// This op runs the same ops in the same order on the same inputs, so its output equals
// the module path's bit for bit (tests/scheduler_worker/test_kernels.py checks it).
//
// Per layer, with x the previous layer's MLP output (none before the first layer) and
// `residual` the running hidden state, updated in place:
//
//   h  = rms_norm(x, residual)                    (residual += x; the first layer: rms_norm(residual))
//   q, k = rope_write_kv(qkv_proj(h))             (k, v written into the layer's paged cache)
//   h  = o_proj(paged_decode_attention(q))
//   x  = down(silu_mul(gate_up(rms_norm(h, residual))))
//
// Returns the last layer's x; the caller applies the final norm and the output head.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "zs_ops.h"

namespace zs_ops {
namespace {

// A layer's tensors, in this order, in the flat `weights` list: input norm weight,
// qkv (qs, d, m, bias), o (qs, d, m, bias), post-attention norm weight, gate_up (qs, d, m,
// bias), down (qs, d, m, bias). An absent m (8-bit weights) or bias is an empty tensor.
// `formats` holds each of the four linears' (block format (0 = 4-bit, 1 = 8-bit), output
// features) per layer; the weights are in the kernels' packed layout.
constexpr int64_t kTensorsPerLayer = 18;
constexpr int64_t kFormatsPerLayer = 8;

at::Tensor linear(const at::Tensor& x, const at::Tensor* t, const int64_t* fmt, int64_t isa) {
  const c10::optional<at::Tensor> m = t[2].numel() ? c10::optional<at::Tensor>(t[2]) : c10::nullopt;
  at::Tensor y = zs_qgemm::qlinear(x, t[0], t[1], m, fmt[0], fmt[1], isa);
  if (t[3].numel()) y.add_(t[3]);
  return y;
}

}  // namespace

at::Tensor decode_layers(at::Tensor residual, at::TensorList weights, at::IntArrayRef formats,
                         at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& positions,
                         const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slot_mapping,
                         const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t H, int64_t Hkv,
                         double eps, double scale, int64_t isa) {
  const int64_t L = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(L >= 1 && static_cast<int64_t>(v_caches.size()) == L, "decode_layers: one K and one V cache per layer");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == L * kTensorsPerLayer, "decode_layers: expected ",
              L * kTensorsPerLayer, " weight tensors, got ", weights.size());
  TORCH_CHECK(static_cast<int64_t>(formats.size()) == L * kFormatsPerLayer, "decode_layers: expected ",
              L * kFormatsPerLayer, " formats, got ", formats.size());
  TORCH_CHECK(residual.dim() == 2 && residual.is_contiguous(), "decode_layers: residual must be a contiguous [T, hidden]");
  const int64_t T = residual.size(0), q_size = H * k_caches[0].size(3);
  at::Tensor x;  // the previous layer's MLP output
  for (int64_t l = 0; l < L; ++l) {
    const at::Tensor* w = weights.data() + l * kTensorsPerLayer;
    const int64_t* fmt = formats.data() + l * kFormatsPerLayer;
    at::Tensor h = x.defined() ? rms_norm(x, residual, w[0], eps, isa) : rms_norm(residual, c10::nullopt, w[0], eps, isa);
    const at::Tensor qkv = linear(h, w + 1, fmt, isa);
    auto [q, k] = rope_write_kv(qkv, positions, cos, sin, k_caches[l], v_caches[l], slot_mapping, H, Hkv, isa);
    const at::Tensor o = paged_decode_attention(q, k_caches[l], v_caches[l], block_tables, context_lens, scale, isa);
    h = linear(o.view({T, q_size}), w + 5, fmt + 2, isa);
    h = rms_norm(h, residual, w[9], eps, isa);
    x = linear(silu_mul(linear(h, w + 10, fmt + 4, isa), isa), w + 14, fmt + 6, isa);
  }
  return x;
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def("decode_layers(Tensor(a!) residual, Tensor[] weights, int[] formats, Tensor(b!)[] k_caches, "
          "Tensor(c!)[] v_caches, Tensor positions, Tensor cos, Tensor sin, Tensor slot_mapping, "
          "Tensor block_tables, Tensor context_lens, int H, int Hkv, float eps, float scale, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) { lib.impl("decode_layers", &zs_ops::decode_layers); }
