// The decode step's non-GEMM work as single passes over memory, instead of the dozens of
// small torch ops (casts, gathers, masks, copies) each would otherwise take:
//
//   paged_decode_attention  one query token per sequence against its KV blocks, read in
//                           place through the block table (no gather, no padding mask)
//   rms_norm                y = w * x / rms(x), optionally adding a residual first (in place)
//   silu_mul                silu(gate) * up from the stacked gate_up projection
//   rope_write_kv           RoPE on q and k, and k, v written into the paged cache
//
// Plain loops written for the vectorizer; `target_clones` compiles each hot function for
// AVX-512, AVX2 and baseline x86-64 and the loader picks one by the CPU's flags (GCC
// ifunc), so one build runs on every x86 kind. Accumulation is float32 for float32 and
// bfloat16 tensors alike.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "zs_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#define ZS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace zs_ops {
namespace {

inline float f32(float x) { return x; }
inline float f32(c10::BFloat16 x) { return static_cast<float>(x); }

// ------------------------------------------------------------------ paged decode attention

template <typename T>
struct AttnArgs {
  const T* q;            // [B, H, D]
  const T* k_cache;      // [num_blocks, block_size, Hkv, D]
  const T* v_cache;
  const int64_t* tables; // [B, max_blocks]
  const int64_t* lens;   // [B]: tokens to attend (cached context incl. this step's token)
  T* out;                // [B, H, D]
  int64_t H, Hkv, D, block_size, max_blocks;
  float scale;
};

// exp(x), vectorizable: 2^n * p(r) with x = n ln2 + r, |r| <= ln2/2, p a degree-6 Taylor
// polynomial (relative error < 2e-7); x clamped to [-87, 88] (float's normal range). n is
// rounded by adding and subtracting 1.5 * 2^23 (floor() keeps GCC from vectorizing).
inline float fast_exp(float x) {
  x = x < -87.f ? -87.f : x;
  x = x > 88.f ? 88.f : x;
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  const float p = 1.f + r * (1.f + r * (0.5f + r * (0.16666667f + r * (0.041666668f + r * (0.008333334f + r * 0.0013888889f)))));
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// One (sequence, KV head) pair: its G query heads share every K/V row they read. The
// block table is walked block by block; a block holds block_size tokens, each token's
// heads side by side (row = Hkv * D elements).
// DIM, GRP: the head size and the query heads per KV head when they are compile-time
// constants (fixed-length loops the compiler unrolls, the G accumulators kept in
// registers), else 0 and a.D, a.H / a.Hkv are used.
template <typename T, int DIM, int GRP>
ZS_CLONES void attend_one(const AttnArgs<T>& a, int64_t b, int64_t kvh, float* scores, float* acc_buf) {
  const int64_t G = GRP > 0 ? GRP : a.H / a.Hkv, D = DIM > 0 ? DIM : a.D, L = a.lens[b], bs = a.block_size;
  alignas(64) float acc_fixed[GRP > 0 && DIM > 0 ? GRP * DIM : 1];
  float* acc = GRP > 0 && DIM > 0 ? acc_fixed : acc_buf;
  const int64_t row = a.Hkv * D;
  const int64_t* table = a.tables + b * a.max_blocks;
  const T* q = a.q + (b * a.H + kvh * G) * D;
  alignas(64) float qf[8 * 256];  // this pair's query heads in float32 (G <= 8, D <= 256: checked)
  for (int64_t i = 0; i < G * D; ++i) qf[i] = f32(q[i]) * a.scale;
  for (int64_t t0 = 0; t0 < L; t0 += bs) {
    const T* kb = a.k_cache + table[t0 / bs] * bs * row + kvh * D;
    const int64_t n = std::min(bs, L - t0);
    for (int64_t j = 0; j < n; ++j) {
      const T* k = kb + j * row;
      for (int64_t g = 0; g < G; ++g) {
        const float* qg = qf + g * D;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < D; ++i) s += qg[i] * f32(k[i]);
        scores[g * L + t0 + j] = s;
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float* sg = scores + g * L;
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t t = 0; t < L; ++t) mx = std::max(mx, sg[t]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < L; ++t) {
      sg[t] = fast_exp(sg[t] - mx);
      sum += sg[t];
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t t = 0; t < L; ++t) sg[t] *= inv;
  }
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t t0 = 0; t0 < L; t0 += bs) {
    const T* vb = a.v_cache + table[t0 / bs] * bs * row + kvh * D;
    const int64_t n = std::min(bs, L - t0);
    for (int64_t j = 0; j < n; ++j) {
      const T* v = vb + j * row;
      for (int64_t g = 0; g < G; ++g) {
        const float p = scores[g * L + t0 + j];
        float* ag = acc + g * D;
#pragma omp simd
        for (int64_t i = 0; i < D; ++i) ag[i] += p * f32(v[i]);
      }
    }
  }
  T* o = a.out + (b * a.H + kvh * G) * D;
  for (int64_t i = 0; i < G * D; ++i) o[i] = static_cast<T>(acc[i]);
}

template <typename T, int DIM>
void attend_dim(const AttnArgs<T>& a, int64_t G, int64_t b, int64_t kvh, float* scores, float* acc) {
  switch (G) {
    case 1: return attend_one<T, DIM, 1>(a, b, kvh, scores, acc);
    case 2: return attend_one<T, DIM, 2>(a, b, kvh, scores, acc);
    case 3: return attend_one<T, DIM, 3>(a, b, kvh, scores, acc);
    case 4: return attend_one<T, DIM, 4>(a, b, kvh, scores, acc);
    case 8: return attend_one<T, DIM, 8>(a, b, kvh, scores, acc);
    default: return attend_one<T, DIM, 0>(a, b, kvh, scores, acc);
  }
}

template <typename T>
void attend_dispatch(const AttnArgs<T>& a, int64_t G, int64_t b, int64_t kvh, float* scores, float* acc) {
  if (a.D == 64) attend_dim<T, 64>(a, G, b, kvh, scores, acc);
  else if (a.D == 128) attend_dim<T, 128>(a, G, b, kvh, scores, acc);
  else attend_one<T, 0, 0>(a, b, kvh, scores, acc);
}

template <typename T>
void attend_all(const AttnArgs<T>& a, int64_t B) {
  const int64_t G = a.H / a.Hkv;
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; ++b) max_len = std::max(max_len, a.lens[b]);
  at::parallel_for(0, B * a.Hkv, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores(static_cast<size_t>(G * std::max<int64_t>(max_len, 1)));
    std::vector<float> acc(static_cast<size_t>(G * a.D));
    for (int64_t w = w0; w < w1; ++w) attend_dispatch(a, G, w / a.Hkv, w % a.Hkv, scores.data(), acc.data());
  });
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "decode attention: bad shapes");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "decode attention: caches must be contiguous");
  TORCH_CHECK(q_in.scalar_type() == k_cache.scalar_type() && k_cache.scalar_type() == v_cache.scalar_type(),
              "decode attention: q and the caches must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "decode attention: block tables and lengths must be int64");
  const at::Tensor q = q_in.contiguous();
  const at::Tensor tables = block_tables.contiguous(), lens = context_lens.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && H % Hkv == 0, "decode attention: head counts or sizes disagree");
  TORCH_CHECK(H / Hkv <= 8 && D <= 256, "decode attention: at most 8 query heads per KV head and head_dim 256");
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == B && lens.size(0) == B, "decode attention: one table and length per sequence");
  const int64_t block_size = k_cache.size(1), max_blocks = tables.size(1);
  const int64_t* lp = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= max_blocks * block_size, "decode attention: context length ", lp[b],
                " outside its block table");
  at::Tensor out = at::empty_like(q);
  if (q.scalar_type() == at::kFloat) {
    AttnArgs<float> a{q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), tables.data_ptr<int64_t>(),
                      lp, out.data_ptr<float>(), H, Hkv, D, block_size, max_blocks, static_cast<float>(scale)};
    attend_all(a, B);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "decode attention: float32 or bfloat16 only");
    using bf = c10::BFloat16;
    AttnArgs<bf> a{q.data_ptr<bf>(), k_cache.data_ptr<bf>(), v_cache.data_ptr<bf>(), tables.data_ptr<int64_t>(),
                   lp, out.data_ptr<bf>(), H, Hkv, D, block_size, max_blocks, static_cast<float>(scale)};
    attend_all(a, B);
  }
  return out;
}

// ------------------------------------------------------------------ RMSNorm (+ residual)

// x (and residual) rows of length n. With a residual: residual += x; y = norm(residual).
template <typename T>
ZS_CLONES void rms_row(const T* x, T* residual, const T* w, T* y, int64_t n, float eps) {
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
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(f32(w[i]) * static_cast<float>(static_cast<T>(f32(x[i]) * inv)));
}

at::Tensor rms_norm(const at::Tensor& x_in, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
                    double eps) {
  const int64_t n = x_in.size(-1);
  TORCH_CHECK(weight.numel() == n && weight.scalar_type() == x_in.scalar_type(), "rms_norm: weight does not fit x");
  const at::Tensor x = x_in.contiguous();
  const at::Tensor w = weight.contiguous();
  if (residual.has_value())
    TORCH_CHECK(residual->is_contiguous() && residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(),
                "rms_norm: the residual must be contiguous and shaped like x");
  at::Tensor y = at::empty_like(x);
  const int64_t rows = x.numel() / std::max<int64_t>(n, 1);
  AT_DISPATCH_SWITCH(x.scalar_type(), "rms_norm", AT_DISPATCH_CASE(at::kFloat, [&] {
    using T = float;
    T* r = residual.has_value() ? residual->data_ptr<T>() : nullptr;
    at::parallel_for(0, rows, 16, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i)
        rms_row<T>(x.data_ptr<T>() + i * n, r ? r + i * n : nullptr, w.data_ptr<T>(), y.data_ptr<T>() + i * n, n, (float)eps);
    });
  }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
    using T = c10::BFloat16;
    T* r = residual.has_value() ? residual->data_ptr<T>() : nullptr;
    at::parallel_for(0, rows, 16, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i)
        rms_row<T>(x.data_ptr<T>() + i * n, r ? r + i * n : nullptr, w.data_ptr<T>(), y.data_ptr<T>() + i * n, n, (float)eps);
    });
  }));
  return y;
}

// ------------------------------------------------------------------ SiLU(gate) * up

template <typename T>
ZS_CLONES void silu_mul_row(const T* __restrict gu, T* __restrict out, int64_t n) {
  const T* __restrict up = gu + n;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = f32(gu[i]);
    const float act = g / (1.f + fast_exp(-g));  // rounded to T before the product, as torch does
    out[i] = static_cast<T>(f32(static_cast<T>(act)) * f32(up[i]));
  }
}

// x [..., 2n] = [gate | up] -> [..., n]
at::Tensor silu_mul(const at::Tensor& x_in) {
  const at::Tensor x = x_in.contiguous();
  const int64_t n2 = x.size(-1), n = n2 / 2;
  TORCH_CHECK(n2 % 2 == 0, "silu_mul: last dim must be even");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  at::Tensor out = at::empty(shape, x.options());
  const int64_t rows = x.numel() / std::max<int64_t>(n2, 1);
  AT_DISPATCH_SWITCH(x.scalar_type(), "silu_mul", AT_DISPATCH_CASE(at::kFloat, [&] {
    at::parallel_for(0, rows, 8, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) silu_mul_row<float>(x.data_ptr<float>() + i * n2, out.data_ptr<float>() + i * n, n);
    });
  }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
    using T = c10::BFloat16;
    at::parallel_for(0, rows, 8, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) silu_mul_row<T>(x.data_ptr<T>() + i * n2, out.data_ptr<T>() + i * n, n);
    });
  }));
  return out;
}

// ------------------------------------------------------------------ RoPE + KV-cache write

// One token: rotate its q and k heads (rotate-half, as HF Llama) with the position's
// cos/sin, write q and k to their outputs, and k and v into the cache slot.
template <typename T>
ZS_CLONES void rope_token(const T* qkv, const float* cos, const float* sin, T* q_out, T* k_out, T* k_slot,
                          T* v_slot, int64_t H, int64_t Hkv, int64_t D) {
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
  std::copy(k_out, k_out + Hkv * D, k_slot);
  std::copy(qkv + (H + Hkv) * D, qkv + (H + 2 * Hkv) * D, v_slot);
}

// qkv [T, (H + 2 Hkv) D] -> (q [T, H, D], k [T, Hkv, D]) rotated; k and v written to the
// caches [num_blocks, block_size, Hkv, D] at slot_mapping [T]. cos/sin: float32 tables
// [max_positions, D/2] indexed by positions [T].
std::tuple<at::Tensor, at::Tensor> rope_write_kv(const at::Tensor& qkv_in, const at::Tensor& positions,
                                                 const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache,
                                                 at::Tensor v_cache, const at::Tensor& slot_mapping, int64_t H,
                                                 int64_t Hkv) {
  const at::Tensor qkv = qkv_in.contiguous();
  const int64_t T_ = qkv.size(0), D = k_cache.size(3);
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == (H + 2 * Hkv) * D && k_cache.size(2) == Hkv, "rope_write_kv: shapes disagree");
  TORCH_CHECK(D % 2 == 0 && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              sin.is_contiguous() && cos.size(1) == D / 2, "rope_write_kv: cos/sin must be float32 [P, D/2]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.scalar_type() == qkv.scalar_type() &&
              v_cache.scalar_type() == qkv.scalar_type(), "rope_write_kv: caches must be contiguous, of qkv's dtype");
  TORCH_CHECK(positions.scalar_type() == at::kLong && slot_mapping.scalar_type() == at::kLong &&
              positions.numel() == T_ && slot_mapping.numel() == T_, "rope_write_kv: one int64 position and slot per token");
  const at::Tensor pos = positions.contiguous(), slots = slot_mapping.contiguous();
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1), max_pos = cos.size(0);
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T_; ++t)
    TORCH_CHECK(pp[t] >= 0 && pp[t] < max_pos && sp[t] >= 0 && sp[t] < num_slots, "rope_write_kv: position or slot out of range");
  at::Tensor q = at::empty({T_, H, D}, qkv.options());
  at::Tensor k = at::empty({T_, Hkv, D}, qkv.options());
  const int64_t row = Hkv * D, half = D / 2;
  AT_DISPATCH_SWITCH(qkv.scalar_type(), "rope_write_kv", AT_DISPATCH_CASE(at::kFloat, [&] {
    using T = float;
    at::parallel_for(0, T_, 8, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t)
        rope_token<T>(qkv.data_ptr<T>() + t * (H + 2 * Hkv) * D, cos.data_ptr<float>() + pp[t] * half,
                      sin.data_ptr<float>() + pp[t] * half, q.data_ptr<T>() + t * H * D, k.data_ptr<T>() + t * row,
                      k_cache.data_ptr<T>() + sp[t] * row, v_cache.data_ptr<T>() + sp[t] * row, H, Hkv, D);
    });
  }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
    using T = c10::BFloat16;
    at::parallel_for(0, T_, 8, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t)
        rope_token<T>(qkv.data_ptr<T>() + t * (H + 2 * Hkv) * D, cos.data_ptr<float>() + pp[t] * half,
                      sin.data_ptr<float>() + pp[t] * half, q.data_ptr<T>() + t * H * D, k.data_ptr<T>() + t * row,
                      k_cache.data_ptr<T>() + sp[t] * row, v_cache.data_ptr<T>() + sp[t] * row, H, Hkv, D);
    });
  }));
  return {q, k};
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, float scale) -> Tensor");
  lib.def("rms_norm(Tensor x, Tensor(a!)? residual, Tensor weight, float eps) -> Tensor");
  lib.def("silu_mul(Tensor x) -> Tensor");
  lib.def("rope_write_kv(Tensor qkv, Tensor positions, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, int H, int Hkv) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) {
  lib.impl("paged_decode_attention", &zs_ops::paged_decode_attention);
  lib.impl("rms_norm", &zs_ops::rms_norm);
  lib.impl("silu_mul", &zs_ops::silu_mul);
  lib.impl("rope_write_kv", &zs_ops::rope_write_kv);
}
