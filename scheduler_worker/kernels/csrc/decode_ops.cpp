// The decode step's element-wise work as single passes over memory, instead of the
// dozens of small torch ops (casts, gathers, copies) each would otherwise take:
//
//   rms_norm                y = w * x / rms(x), optionally adding a residual first (in place)
//   silu_mul                silu(gate) * up from the stacked gate_up projection
//   gelu_tanh_mul           gelu_tanh(gate) * up (Gemma's activation), likewise
//   head_norm_              RMSNorm per head on qkv's q and k columns, in place (QK-norm)
//   rope_write_kv           RoPE on q and k, and k, v written into the paged cache
//   token_bitmask_          -inf where a grammar's packed token bitmask forbids (structured outputs)
//
// (paged decode attention: decode_attention.cpp.) Plain loops written for the vectorizer,
// one variant per ISA path, picked by the op's `isa` argument (zs_isa.h). Accumulation is
// float32 for float32 and bfloat16 tensors alike.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "zs_isa.h"
#include "zs_ops.h"
#include "zs_team.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace zs_ops {
namespace {

// ------------------------------------------------------------------ RMSNorm (+ residual)

// x (and residual) rows of length n. With a residual: residual += x; y = norm(residual).
template <typename T>
ZS_INLINE void rms_row_impl(const T* x, T* residual, const T* w, T* y, int64_t n, float eps) {
  float ss = 0.f;
  if (residual != nullptr) {
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i) {
      const float v = f32(x[i]) + f32(residual[i]);
      residual[i] = static_cast<T>(v);
      ss += f32(residual[i]) * f32(residual[i]);
    }
    x = residual;
  } else {
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i) ss += f32(x[i]) * f32(x[i]);
  }
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(f32(w[i]) * f32(static_cast<T>(f32(x[i]) * inv)));
}

ZS_VARIANTS((template <typename T>), rms_row, (rms_row_impl<T>),
            (const T* x, T* residual, const T* w, T* y, int64_t n, float eps), (x, residual, w, y, n, eps))

template <typename T>
void rms_rows(const at::Tensor& x, const c10::optional<at::Tensor>& residual, const at::Tensor& w, at::Tensor& y,
              int64_t n, float eps, int64_t isa) {
  const auto fn = ZS_PICK(rms_row, (<T>), isa);
  T* r = residual.has_value() ? residual->data_ptr<T>() : nullptr;
  const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
  zs_team::parallel_for(0, rows, 16, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i)
      fn(x.data_ptr<T>() + i * n, r ? r + i * n : nullptr, w.data_ptr<T>(), y.data_ptr<T>() + i * n, n, eps);
  });
}

// ------------------------------------------------------------------ act(gate) * up

// The gated MLP's activation: SiLU (Llama and most), or GELU-tanh (Gemma), where
// gelu_tanh(g) = g / 2 * (1 + tanh(u)), u = sqrt(2 / pi) * (g + 0.044715 g^3), as torch's
// approximate="tanh", is written g / (1 + exp(-2u)) (the same function, without the
// cancellation of 1 + tanh(u) for negative u). Both on fast_exp: vectorizable, within a
// few float ulps of torch's.
enum Gate : int { SILU = 0, GELU_TANH = 1 };  // the activation of gated_mul

template <typename T, int ACT>
ZS_INLINE void gated_row_impl(const T* __restrict gate, const T* __restrict up, T* __restrict out, int64_t n) {
  constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
  const ExpRange range;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = f32(gate[i]);
    const float z = ACT == SILU ? g : kBeta * 2.f * (g + kKappa * g * g * g);
    const float act = g / (1.f + fast_exp(-z, range));  // rounded to T before the product, as torch does
    out[i] = static_cast<T>(f32(static_cast<T>(act)) * f32(up[i]));
  }
}

ZS_VARIANTS((template <typename T, int ACT>), gated_row, (gated_row_impl<T, ACT>),
            (const T* gate, const T* up, T* out, int64_t n), (gate, up, out, n))

// Tasks of pieces of GATED_PIECE values (a multiple of every vector width: each value is
// computed the same way whatever the split), 8 rows' worth and more a task: below that a
// split's handoff and cross-core reads cost what it saves ("The decode step's serial
// part" in docs/benchmarks.md); an odd number of rows splits evenly.
constexpr int64_t GATED_PIECE = 256, GATED_ROWS = 8;

template <typename T, int ACT>
void gated_rows(const at::Tensor& x, at::Tensor& out, int64_t n, int64_t isa) {
  const auto fn = ZS_PICK(gated_row, (<T, ACT>), isa);
  const int64_t rows = x.numel() / std::max<int64_t>(2 * n, 1), pieces = (n + GATED_PIECE - 1) / GATED_PIECE;
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  zs_team::parallel_for(0, rows * pieces, GATED_ROWS * pieces, [&](int64_t a, int64_t b) {
    for (int64_t u = a, v; u < b; u = v) {  // the task's pieces of row i, [u, v), in one call
      const int64_t i = u / pieces, j = u % pieces * GATED_PIECE;
      v = std::min(b, (i + 1) * pieces);
      fn(xp + i * 2 * n + j, xp + i * 2 * n + n + j, op + i * n + j, std::min((v - u) * GATED_PIECE, n - j));
    }
  });
}

// x [..., 2n] = [gate | up] -> act(gate) * up [..., n]
template <int ACT>
at::Tensor gated_mul(const at::Tensor& x_in, int64_t isa, const char* name) {
  ZS_PIECE("activation");
  const at::Tensor x = x_in.contiguous();
  const int64_t n2 = x.size(-1), n = n2 / 2;
  TORCH_CHECK(n2 % 2 == 0, name, ": last dim must be even");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  isa = zs_qgemm::clamp_isa(isa);
  at::Tensor out = at::empty(shape, x.options());
  if (x.scalar_type() == at::kFloat) gated_rows<float, ACT>(x, out, n, isa);
  else {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16, name, ": float32 or bfloat16 only");
    gated_rows<c10::BFloat16, ACT>(x, out, n, isa);
  }
  return out;
}

// ------------------------------------------------------------------ RMSNorm per head (QK-norm)

// qkv [T, (H + 2 Hkv) D]: each of the H q heads normed with qw, each of the Hkv k heads
// with kw, in place; v untouched.
template <typename T>
void head_norm_rows(at::Tensor& qkv, const at::Tensor& qw, const at::Tensor& kw, int64_t H, int64_t Hkv, int64_t D,
                    float eps, int64_t isa) {
  const auto fn = ZS_PICK(rms_row, (<T>), isa);
  const int64_t width = (H + 2 * Hkv) * D;
  zs_team::parallel_for(0, qkv.size(0) * (H + Hkv), 16, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      const int64_t t = i / (H + Hkv), h = i % (H + Hkv);
      T* x = qkv.data_ptr<T>() + t * width + h * D;
      fn(x, nullptr, (h < H ? qw : kw).data_ptr<T>(), x, D, eps);
    }
  });
}

// ------------------------------------------------------------------ RoPE + KV-cache write

// n floats into float16, rounded to nearest even (c10::Half's bits): 8 at a time by F16C
// on the vector paths (c10::Half's own conversion is a dozen scalar instructions a value,
// most of the KV write: docs/benchmarks.md, "The decode step's serial part").
ZS_TARGET_AVX2 inline void store_half_f16c(const float* src, c10::Half* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i] = static_cast<c10::Half>(src[i]);
}

template <int VEC>
ZS_INLINE void store_half(const float* src, c10::Half* dst, int64_t n) {
  if constexpr (VEC > 0) store_half_f16c(src, dst, n);
  else
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<c10::Half>(src[i]);
}

// One token: rotate its q and k heads (rotate-half, as HF Llama) with the position's
// cos/sin, write q and k to their outputs, and k and v into the cache slot (of the cache's
// type C: T, or float16 under float32). VEC: the vector ISA of the path (0: portable).
template <typename T, typename C, int VEC>
ZS_INLINE void rope_token_impl(const T* qkv, const float* cos, const float* sin, T* q_out, T* k_out, C* k_slot,
                               C* v_slot, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < H + Hkv; ++h) {
    const T* x = qkv + h * D;
    T* o = h < H ? q_out + h * D : k_out + (h - H) * D;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = f32(x[i]), x2 = f32(x[i + half]);
      o[i] = static_cast<T>(x1 * cos[i] - x2 * sin[i]);
      o[i + half] = static_cast<T>(x2 * cos[i] + x1 * sin[i]);
    }
  }
  const T* v = qkv + (H + Hkv) * D;
  if constexpr (std::is_same_v<T, float> && std::is_same_v<C, c10::Half>) {
    store_half<VEC>(k_out, k_slot, Hkv * D);
    store_half<VEC>(v, v_slot, Hkv * D);
  } else {
    for (int64_t i = 0; i < Hkv * D; ++i) {
      k_slot[i] = static_cast<C>(f32(k_out[i]));
      v_slot[i] = static_cast<C>(f32(v[i]));
    }
  }
}

// ZS_VARIANTS by hand: each path's copy knows its vector ISA (store_half's F16C)
#define ZS_ROPE_PARAMS \
  const T *qkv, const float *cos, const float *sin, T *q_out, T *k_out, C *k_slot, C *v_slot, int64_t H, int64_t Hkv, int64_t D
#define ZS_ROPE_ARGS qkv, cos, sin, q_out, k_out, k_slot, v_slot, H, Hkv, D
template <typename T, typename C>
void rope_token_0(ZS_ROPE_PARAMS) { rope_token_impl<T, C, 0>(ZS_ROPE_ARGS); }
template <typename T, typename C>
ZS_TARGET_AVX2 void rope_token_1(ZS_ROPE_PARAMS) { rope_token_impl<T, C, 1>(ZS_ROPE_ARGS); }
template <typename T, typename C>
ZS_TARGET_AVX512 void rope_token_2(ZS_ROPE_PARAMS) { rope_token_impl<T, C, 2>(ZS_ROPE_ARGS); }

template <typename T, typename C>
void rope_tokens(const at::Tensor& qkv, const int64_t* pp, const int64_t* sp, const at::Tensor& cos,
                 const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache, at::Tensor& q, at::Tensor& k,
                 int64_t H, int64_t Hkv, int64_t D, int64_t isa) {
  const auto fn = ZS_PICK(rope_token, (<T, C>), isa);
  const int64_t row = Hkv * D, half = D / 2;
  zs_team::parallel_for(0, qkv.size(0), 8, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t)
      fn(qkv.data_ptr<T>() + t * (H + 2 * Hkv) * D, cos.data_ptr<float>() + pp[t] * half,
         sin.data_ptr<float>() + pp[t] * half, q.data_ptr<T>() + t * H * D, k.data_ptr<T>() + t * row,
         k_cache.data_ptr<C>() + sp[t] * row, v_cache.data_ptr<C>() + sp[t] * row, H, Hkv, D);
  });
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x_in, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
                    double eps, int64_t isa) {
  ZS_PIECE("rms_norm");
  const int64_t n = x_in.size(-1);
  TORCH_CHECK(weight.numel() == n && weight.scalar_type() == x_in.scalar_type(), "rms_norm: weight does not fit x");
  const at::Tensor x = x_in.contiguous();
  const at::Tensor w = weight.contiguous();
  if (residual.has_value())
    TORCH_CHECK(residual->is_contiguous() && residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(),
                "rms_norm: the residual must be contiguous and shaped like x");
  isa = zs_qgemm::clamp_isa(isa);
  at::Tensor y = at::empty_like(x);
  if (x.scalar_type() == at::kFloat) rms_rows<float>(x, residual, w, y, n, static_cast<float>(eps), isa);
  else {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16, "rms_norm: float32 or bfloat16 only");
    rms_rows<c10::BFloat16>(x, residual, w, y, n, static_cast<float>(eps), isa);
  }
  return y;
}

at::Tensor silu_mul(const at::Tensor& x, int64_t isa) { return gated_mul<SILU>(x, isa, "silu_mul"); }

at::Tensor gelu_tanh_mul(const at::Tensor& x, int64_t isa) { return gated_mul<GELU_TANH>(x, isa, "gelu_tanh_mul"); }

// QK-norm in place: qkv [T, (H + 2 Hkv) D] contiguous, q_weight and k_weight [D].
void head_norm_(at::Tensor qkv, const at::Tensor& q_weight, const at::Tensor& k_weight, int64_t H, int64_t Hkv,
                double eps, int64_t isa) {
  const int64_t D = q_weight.numel();
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous() && D > 0 && qkv.size(1) == (H + 2 * Hkv) * D,
              "head_norm_: qkv must be a contiguous [T, (H + 2 Hkv) D]");
  TORCH_CHECK(k_weight.numel() == D && q_weight.is_contiguous() && k_weight.is_contiguous() &&
              q_weight.scalar_type() == qkv.scalar_type() && k_weight.scalar_type() == qkv.scalar_type(),
              "head_norm_: the weights must be contiguous [head_dim] of qkv's dtype");
  isa = zs_qgemm::clamp_isa(isa);
  if (qkv.scalar_type() == at::kFloat) head_norm_rows<float>(qkv, q_weight, k_weight, H, Hkv, D, static_cast<float>(eps), isa);
  else {
    TORCH_CHECK(qkv.scalar_type() == at::kBFloat16, "head_norm_: float32 or bfloat16 only");
    head_norm_rows<c10::BFloat16>(qkv, q_weight, k_weight, H, Hkv, D, static_cast<float>(eps), isa);
  }
}

// qkv [T, (H + 2 Hkv) D] -> (q [T, H, D], k [T, Hkv, D]) rotated; k and v written to the
// caches [num_blocks, block_size, Hkv, D] at slot_mapping [T]. cos/sin: float32 tables
// [max_positions, D/2] indexed by positions [T].
std::tuple<at::Tensor, at::Tensor> rope_write_kv(const at::Tensor& qkv_in, const at::Tensor& positions,
                                                 const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache,
                                                 at::Tensor v_cache, const at::Tensor& slot_mapping, int64_t H,
                                                 int64_t Hkv, int64_t isa) {
  ZS_PIECE("rope_write_kv");
  const at::Tensor qkv = qkv_in.contiguous();
  const int64_t T_ = qkv.size(0), D = k_cache.size(3);
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == (H + 2 * Hkv) * D && k_cache.size(2) == Hkv, "rope_write_kv: shapes disagree");
  TORCH_CHECK(D % 2 == 0 && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              sin.is_contiguous() && cos.size(1) == D / 2 && sin.sizes() == cos.sizes(),
              "rope_write_kv: cos/sin must be float32 [P, D/2]");
  const bool half_cache = qkv.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kHalf;
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
              v_cache.scalar_type() == k_cache.scalar_type() && (k_cache.scalar_type() == qkv.scalar_type() || half_cache),
              "rope_write_kv: caches must be contiguous, of qkv's dtype (or float16 under float32)");
  TORCH_CHECK(positions.scalar_type() == at::kLong && slot_mapping.scalar_type() == at::kLong &&
              positions.numel() == T_ && slot_mapping.numel() == T_, "rope_write_kv: one int64 position and slot per token");
  const at::Tensor pos = positions.contiguous(), slots = slot_mapping.contiguous();
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1), max_pos = cos.size(0);
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T_; ++t)
    TORCH_CHECK(pp[t] >= 0 && pp[t] < max_pos && sp[t] >= 0 && sp[t] < num_slots, "rope_write_kv: position or slot out of range");
  isa = zs_qgemm::clamp_isa(isa);
  at::Tensor q = at::empty({T_, H, D}, qkv.options());
  at::Tensor k = at::empty({T_, Hkv, D}, qkv.options());
  if (half_cache) rope_tokens<float, c10::Half>(qkv, pp, sp, cos, sin, k_cache, v_cache, q, k, H, Hkv, D, isa);
  else if (qkv.scalar_type() == at::kFloat) rope_tokens<float, float>(qkv, pp, sp, cos, sin, k_cache, v_cache, q, k, H, Hkv, D, isa);
  else {
    TORCH_CHECK(qkv.scalar_type() == at::kBFloat16, "rope_write_kv: float32 or bfloat16 only");
    rope_tokens<c10::BFloat16, c10::BFloat16>(qkv, pp, sp, cos, sin, k_cache, v_cache, q, k, H, Hkv, D, isa);
  }
  return {q, k};
}

namespace {
// One row of logits [V]: -inf wherever bit t % 32 of words[t / 32] is clear, and beyond
// the words' 32 W tokens. A grammar's mask is mostly whole words of 0 (32 tokens filled)
// or of ~0 (skipped); a mixed word is a select per token, which vectorizes: ~3 us for 49k
// tokens against ~70 us to unpack to bool and fill.
ZS_INLINE void bitmask_row_impl(float* logits, const uint32_t* words, int64_t V, int64_t W) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t whole = std::min(V / 32, W);
  for (int64_t w = 0; w < whole; ++w) {
    const uint32_t bits = words[w];
    float* p = logits + 32 * w;
    if (bits == ~0u) continue;
    if (bits == 0) {
      for (int j = 0; j < 32; ++j) p[j] = ninf;
      continue;
    }
    for (int j = 0; j < 32; ++j) p[j] = (bits >> j) & 1u ? p[j] : ninf;
  }
  for (int64_t t = 32 * whole; t < V; ++t)
    if (t >= 32 * W || !((words[t >> 5] >> (t & 31)) & 1u)) logits[t] = ninf;
}
ZS_VARIANTS((), bitmask_row, bitmask_row_impl, (float* l, const uint32_t* w, int64_t V, int64_t W), (l, w, V, W))
}  // namespace

// Structured outputs: logits [R, V] float32; rows[j] is the logit row words[j] masks, an
// int32 [W] of llguidance's bitmask (bit i of word w set = token 32 w + i allowed).
void token_bitmask_(at::Tensor logits, at::IntArrayRef rows, at::TensorList words, int64_t isa) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.scalar_type() == at::kFloat,
              "token_bitmask_: logits must be a contiguous float32 [R, V]");
  TORCH_CHECK(rows.size() == words.size(), "token_bitmask_: one bitmask per row");
  const int64_t R = logits.size(0), V = logits.size(1);
  const auto fn = ZS_PICK(bitmask_row, (), zs_qgemm::clamp_isa(isa));
  for (size_t j = 0; j < rows.size(); ++j) {
    const at::Tensor& w = words[j];
    TORCH_CHECK(rows[j] >= 0 && rows[j] < R, "token_bitmask_: row out of range");
    TORCH_CHECK(w.dim() == 1 && w.is_contiguous() && w.scalar_type() == at::kInt,
                "token_bitmask_: each bitmask must be a contiguous int32 [W]");
    fn(logits.data_ptr<float>() + rows[j] * V, reinterpret_cast<const uint32_t*>(w.data_ptr<int32_t>()), V, w.numel());
  }
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def("rms_norm(Tensor x, Tensor(a!)? residual, Tensor weight, float eps, int isa) -> Tensor");
  lib.def("silu_mul(Tensor x, int isa) -> Tensor");
  lib.def("gelu_tanh_mul(Tensor x, int isa) -> Tensor");
  lib.def("head_norm_(Tensor(a!) qkv, Tensor q_weight, Tensor k_weight, int H, int Hkv, float eps, int isa) -> ()");
  lib.def("rope_write_kv(Tensor qkv, Tensor positions, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, int H, int Hkv, int isa) -> (Tensor, Tensor)");
  lib.def("token_bitmask_(Tensor(a!) logits, int[] rows, Tensor[] words, int isa) -> ()");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) {
  lib.impl("rms_norm", &zs_ops::rms_norm);
  lib.impl("silu_mul", &zs_ops::silu_mul);
  lib.impl("gelu_tanh_mul", &zs_ops::gelu_tanh_mul);
  lib.impl("head_norm_", &zs_ops::head_norm_);
  lib.impl("rope_write_kv", &zs_ops::rope_write_kv);
  lib.impl("token_bitmask_", &zs_ops::token_bitmask_);
}
