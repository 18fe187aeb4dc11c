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

#include <vector>

#include "zs_ops.h"

namespace zs_ops {
namespace {

// A layer's tensors, in this order, in the flat `weights` list: input norm weight, qkv,
// o, post-attention norm weight, gate_up, down, where each linear is its P parts' (qs, d, m)
// then one bias for the whole projection. An absent m (8-bit weights) or bias is an empty
// tensor. `formats` holds, per linear, P and then each part's (block format, output
// features); a projection of several parts (a file that stores q, k and v in different
// GGUF types, scheduler_worker/quant/stacked.py) concatenates its parts' outputs, as the
// module does. The weights are in the kernels' packed layout.
struct Cursor {
  const at::Tensor* w;
  const int64_t* f;
};

at::Tensor linear(const at::Tensor& x, Cursor& c, int64_t isa) {
  const int64_t parts = *c.f++;
  std::vector<at::Tensor> ys;
  ys.reserve(parts);
  for (int64_t p = 0; p < parts; ++p, c.w += 3, c.f += 2) {
    const c10::optional<at::Tensor> m = c.w[2].numel() ? c10::optional<at::Tensor>(c.w[2]) : c10::nullopt;
    ys.push_back(zs_qgemm::qlinear(x, c.w[0], c.w[1], m, c.f[0], c.f[1], isa));
  }
  at::Tensor y = parts == 1 ? ys[0] : at::cat(ys, 1);
  if (c.w->numel()) y.add_(*c.w);
  ++c.w;
  return y;
}

// The number of weight tensors `formats` describes for L layers (checked before any read).
int64_t expected_tensors(at::IntArrayRef formats, int64_t L) {
  int64_t at = 0, tensors = 0;
  for (int64_t l = 0; l < L; ++l) {
    tensors += 2;  // the two norms
    for (int lin = 0; lin < 4; ++lin) {
      TORCH_CHECK(at < static_cast<int64_t>(formats.size()), "decode_layers: formats too short");
      const int64_t parts = formats[at];
      TORCH_CHECK(parts >= 1 && parts <= 8, "decode_layers: a linear of ", parts, " parts");
      at += 1 + 2 * parts;
      tensors += 3 * parts + 1;
    }
  }
  TORCH_CHECK(at == static_cast<int64_t>(formats.size()), "decode_layers: ", formats.size(),
              " formats, expected ", at);
  return tensors;
}

}  // namespace

at::Tensor decode_layers(at::Tensor residual, at::TensorList weights, at::IntArrayRef formats,
                         at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& positions,
                         const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slot_mapping,
                         const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t H, int64_t Hkv,
                         double eps, double scale, int64_t isa) {
  const int64_t L = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(L >= 1 && static_cast<int64_t>(v_caches.size()) == L, "decode_layers: one K and one V cache per layer");
  const int64_t expected = expected_tensors(formats, L);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == expected, "decode_layers: expected ", expected,
              " weight tensors, got ", weights.size());
  TORCH_CHECK(residual.dim() == 2 && residual.is_contiguous(), "decode_layers: residual must be a contiguous [T, hidden]");
  const int64_t T = residual.size(0), q_size = H * k_caches[0].size(3);
  at::Tensor x;  // the previous layer's MLP output
  Cursor c{weights.data(), formats.data()};
  for (int64_t l = 0; l < L; ++l) {
    const at::Tensor& norm1 = *c.w++;
    at::Tensor h = x.defined() ? rms_norm(x, residual, norm1, eps, isa) : rms_norm(residual, c10::nullopt, norm1, eps, isa);
    const at::Tensor qkv = linear(h, c, isa);
    auto [q, k] = rope_write_kv(qkv, positions, cos, sin, k_caches[l], v_caches[l], slot_mapping, H, Hkv, isa);
    const at::Tensor o = paged_decode_attention(q, k_caches[l], v_caches[l], block_tables, context_lens, scale, isa);
    h = linear(o.view({T, q_size}), c, isa);
    const at::Tensor& norm2 = *c.w++;
    h = rms_norm(h, residual, norm2, eps, isa);
    const at::Tensor gate_up = linear(h, c, isa);
    x = linear(silu_mul(gate_up, isa), c, isa);
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
