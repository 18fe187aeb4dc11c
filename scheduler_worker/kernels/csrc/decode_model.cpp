// A whole decode step's decoder layers in one call: for a model whose linears are all
// served by the integer kernels, the Python forward would make ~10-20 op calls per layer,
// each through a module, the dispatcher and a few small tensor views; at batch 1 that glue
// cost about as much as a quarter of the step (docs/benchmarks.md). This op runs the same
// kernels in the same order on the same inputs, so for Llama-family models its output
// equals the module path's bit for bit (tests/scheduler_worker/test_kernels.py checks it).
//
// Per layer, with x the previous layer's MLP output (none before the first layer) and
// `residual` the running hidden state, updated in place:
//
//   h  = rms_norm(x, residual)                    (residual += x; the first layer: rms_norm(residual))
//   qkv = qkv_proj(h)                             (QK_NORM: q and k heads RMS-normed in place)
//   q, k = rope_write_kv(qkv)                     (the layer's cos/sin tables; k, v into its paged cache)
//   h  = o_proj(paged_decode_attention(q))        (the layer's sliding window, 0: none)
//   h  = rms_norm(h)                              (SANDWICH only: the post-attention norm)
//   x  = down(act(gate_up(rms_norm(h, residual))))   (act: SiLU, or GELU-tanh with GELU_TANH)
//   x  = rms_norm(x)                              (SANDWICH only: the post-feed-forward norm)
//
// Llama / Mistral / Qwen 2: no flags; Qwen 3: QK_NORM; Gemma 3: all three, its norms'
// (1 + w) weights precomputed by the caller. Returns the last layer's x; the caller
// applies the final norm and the output head.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "zs_ops.h"
#include "zs_team.h"

namespace zs_ops {
namespace {

enum Style : int64_t { QK_NORM = 1, SANDWICH = 2, GELU_TANH = 4 };

// A layer's tensors, in this order, in the flat `weights` list: input norm weight,
// (QK_NORM: q norm and k norm weights), qkv, o, (SANDWICH: post-attention norm weight),
// pre-MLP norm weight, gate_up, down, (SANDWICH: post-MLP norm weight), where each linear is its P parts' (qs, d, m)
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
int64_t expected_tensors(at::IntArrayRef formats, int64_t L, int64_t style) {
  int64_t at = 0, tensors = 0;
  for (int64_t l = 0; l < L; ++l) {
    tensors += 2 + (style & QK_NORM ? 2 : 0) + (style & SANDWICH ? 2 : 0);  // the norms
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
                         at::TensorList rope, at::IntArrayRef layer_rope, at::IntArrayRef layer_window,
                         const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& context_lens,
                         int64_t H, int64_t Hkv, double eps, double scale, int64_t style, int64_t isa) {
  const int64_t L = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(L >= 1 && static_cast<int64_t>(v_caches.size()) == L, "decode_layers: one K and one V cache per layer");
  TORCH_CHECK(style >= 0 && style <= (QK_NORM | SANDWICH | GELU_TANH), "decode_layers: unknown style ", style);
  const int64_t expected = expected_tensors(formats, L, style);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == expected, "decode_layers: expected ", expected,
              " weight tensors, got ", weights.size());
  TORCH_CHECK(static_cast<int64_t>(layer_rope.size()) == L && static_cast<int64_t>(layer_window.size()) == L,
              "decode_layers: one rope table pair and one window per layer");
  TORCH_CHECK(!rope.empty() && rope.size() % 2 == 0, "decode_layers: rope holds (cos, sin) pairs");
  for (int64_t l = 0; l < L; ++l)
    TORCH_CHECK(layer_rope[l] >= 0 && 2 * layer_rope[l] < static_cast<int64_t>(rope.size()) && layer_window[l] >= 0,
                "decode_layers: layer ", l, " names rope pair ", layer_rope[l], ", window ", layer_window[l]);
  TORCH_CHECK(residual.dim() == 2 && residual.is_contiguous(), "decode_layers: residual must be a contiguous [T, hidden]");
  const int64_t T = residual.size(0), q_size = H * k_caches[0].size(3);
  at::Tensor x;  // the previous layer's MLP output
  Cursor c{weights.data(), formats.data()};
  // one OpenMP region for the whole step: each op's split a handoff to the team (zs_team.h)
  zs_team::with_team([&] {
    ZS_PIECE("decode_layers");
    for (int64_t l = 0; l < L; ++l) {
      const at::Tensor& norm1 = *c.w++;
      at::Tensor h = x.defined() ? rms_norm(x, residual, norm1, eps, isa) : rms_norm(residual, c10::nullopt, norm1, eps, isa);
      const at::Tensor* qk_norms = c.w;
      if (style & QK_NORM) c.w += 2;
      at::Tensor qkv = linear(h, c, isa);
      if (style & QK_NORM) head_norm_(qkv, qk_norms[0], qk_norms[1], H, Hkv, eps, isa);
      const at::Tensor& cos = rope[2 * layer_rope[l]];
      const at::Tensor& sin = rope[2 * layer_rope[l] + 1];
      auto [q, k] = rope_write_kv(qkv, positions, cos, sin, k_caches[l], v_caches[l], slot_mapping, H, Hkv, isa);
      const at::Tensor o =
          paged_decode_attention(q, k_caches[l], v_caches[l], block_tables, context_lens, scale, isa, layer_window[l]);
      h = linear(o.view({T, q_size}), c, isa);
      if (style & SANDWICH) h = rms_norm(h, c10::nullopt, *c.w++, eps, isa);
      const at::Tensor& norm2 = *c.w++;
      h = rms_norm(h, residual, norm2, eps, isa);
      const at::Tensor gate_up = linear(h, c, isa);
      x = linear(style & GELU_TANH ? gelu_tanh_mul(gate_up, isa) : silu_mul(gate_up, isa), c, isa);
      if (style & SANDWICH) x = rms_norm(x, c10::nullopt, *c.w++, eps, isa);
    }
  });
  return x;
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def("decode_layers(Tensor(a!) residual, Tensor[] weights, int[] formats, Tensor(b!)[] k_caches, "
          "Tensor(c!)[] v_caches, Tensor positions, Tensor[] rope, int[] layer_rope, int[] layer_window, "
          "Tensor slot_mapping, Tensor block_tables, Tensor context_lens, int H, int Hkv, float eps, float scale, "
          "int style, int isa) -> Tensor");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) { lib.impl("decode_layers", &zs_ops::decode_layers); }
