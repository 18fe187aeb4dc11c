// Paged decode attention: one query token per sequence against its KV blocks, read in
// place through the block table (no gather, no padding mask), float32 accumulation for
// float32 and bfloat16 caches alike. Any number of query heads per KV head and any head
// size; the common ones (head size 64 / 128 / 256, 1-8 query heads per KV head) get loops
// of compile-time length. One variant per ISA path (zs_isa.h).
//
// A sliding window W (> 0; 0: none) limits a sequence of L tokens to its last W keys,
// positions L - W .. L - 1, as transformers' sliding-window mask: the blocks before them
// are never read (a windowed request's table holds the placeholder block there once it
// gave them back).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "zs_isa.h"
#include "zs_ops.h"

#include <algorithm>
#include <limits>
#include <vector>

namespace zs_ops {
namespace {

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
  int64_t window;        // > 0: attend only the last `window` keys
};

// The first key position a sequence of L tokens attends.
ZS_INLINE int64_t first_key(int64_t L, int64_t window) { return window > 0 && L > window ? L - window : 0; }

struct Scratch {  // one thread's buffers, sized for the largest G, D and context
  float* scores;  // [G, max_len]
  float* acc;     // [G, D]
  float* qf;      // [G, D]
};

// One (sequence, KV head) pair: its G query heads share every K/V row they read. The
// block table is walked block by block; a block holds block_size tokens, each token's
// heads side by side (row = Hkv * D elements).
// DIM, GRP: the head size and the query heads per KV head when they are compile-time
// constants (fixed-length loops the compiler unrolls, the G accumulators kept in
// registers), else 0 and a.D, a.H / a.Hkv are used.
template <typename T, int DIM, int GRP>
ZS_INLINE void attend_impl(const AttnArgs<T>& a, int64_t b, int64_t kvh, const Scratch& s) {
  const int64_t G = GRP > 0 ? GRP : a.H / a.Hkv, D = DIM > 0 ? DIM : a.D, L = a.lens[b], bs = a.block_size;
  alignas(64) float acc_fixed[GRP > 0 && DIM > 0 ? GRP * DIM : 1];
  float* acc = GRP > 0 && DIM > 0 ? acc_fixed : s.acc;
  float* scores = s.scores;
  float* qf = s.qf;  // this pair's query heads in float32, pre-scaled
  const int64_t row = a.Hkv * D;
  const int64_t* table = a.tables + b * a.max_blocks;
  const T* q = a.q + (b * a.H + kvh * G) * D;
  for (int64_t i = 0; i < G * D; ++i) qf[i] = f32(q[i]) * a.scale;
  const int64_t s0 = first_key(L, a.window), n_keys = L - s0;  // scores[g * n_keys + t - s0]
  for (int64_t t0 = s0 - s0 % bs; t0 < L; t0 += bs) {
    const T* kb = a.k_cache + table[t0 / bs] * bs * row + kvh * D;
    const int64_t n = std::min(bs, L - t0);
    for (int64_t j = std::max<int64_t>(s0 - t0, 0); j < n; ++j) {
      const T* k = kb + j * row;
      for (int64_t g = 0; g < G; ++g) {
        const float* qg = qf + g * D;
        float sc = 0.f;
#pragma omp simd reduction(+ : sc)
        for (int64_t i = 0; i < D; ++i) sc += qg[i] * f32(k[i]);
        scores[g * n_keys + t0 + j - s0] = sc;
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    float* sg = scores + g * n_keys;
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t t = 0; t < n_keys; ++t) mx = std::max(mx, sg[t]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < n_keys; ++t) {
      sg[t] = fast_exp(sg[t] - mx);
      sum += sg[t];
    }
    const float inv = 1.f / sum;
#pragma omp simd
    for (int64_t t = 0; t < n_keys; ++t) sg[t] *= inv;
  }
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t t0 = s0 - s0 % bs; t0 < L; t0 += bs) {
    const T* vb = a.v_cache + table[t0 / bs] * bs * row + kvh * D;
    const int64_t n = std::min(bs, L - t0);
    for (int64_t j = std::max<int64_t>(s0 - t0, 0); j < n; ++j) {
      const T* v = vb + j * row;
      for (int64_t g = 0; g < G; ++g) {
        const float p = scores[g * n_keys + t0 + j - s0];
        float* ag = acc + g * D;
#pragma omp simd
        for (int64_t i = 0; i < D; ++i) ag[i] += p * f32(v[i]);
      }
    }
  }
  T* o = a.out + (b * a.H + kvh * G) * D;
  for (int64_t i = 0; i < G * D; ++i) o[i] = static_cast<T>(acc[i]);
}

ZS_VARIANTS((template <typename T, int DIM, int GRP>), attend, (attend_impl<T, DIM, GRP>),
            (const AttnArgs<T>& a, int64_t b, int64_t kvh, const Scratch& s), (a, b, kvh, s))

template <typename T>
using AttendFn = void (*)(const AttnArgs<T>&, int64_t, int64_t, const Scratch&);

template <typename T, int DIM>
AttendFn<T> pick_group(int64_t G, int64_t isa) {
  switch (G) {
    case 1: return ZS_PICK(attend, (<T, DIM, 1>), isa);
    case 2: return ZS_PICK(attend, (<T, DIM, 2>), isa);
    case 3: return ZS_PICK(attend, (<T, DIM, 3>), isa);
    case 4: return ZS_PICK(attend, (<T, DIM, 4>), isa);
    case 8: return ZS_PICK(attend, (<T, DIM, 8>), isa);
    default: return ZS_PICK(attend, (<T, DIM, 0>), isa);
  }
}

template <typename T>
AttendFn<T> pick(int64_t D, int64_t G, int64_t isa) {
  if (D == 64) return pick_group<T, 64>(G, isa);
  if (D == 128) return pick_group<T, 128>(G, isa);
  if (D == 256) return pick_group<T, 256>(G, isa);
  return ZS_PICK(attend, (<T, 0, 0>), isa);
}

template <typename T>
void attend_all(const AttnArgs<T>& a, int64_t B, int64_t isa) {
  const int64_t G = a.H / a.Hkv;
  const AttendFn<T> fn = pick<T>(a.D, G, isa);
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; ++b) max_len = std::max(max_len, a.lens[b] - first_key(a.lens[b], a.window));
  at::parallel_for(0, B * a.Hkv, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> buf(static_cast<size_t>(G * (max_len + 2 * a.D)));
    const Scratch s{buf.data(), buf.data() + G * max_len, buf.data() + G * (max_len + a.D)};
    for (int64_t w = w0; w < w1; ++w) fn(a, w / a.Hkv, w % a.Hkv, s);
  });
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                                  int64_t isa, int64_t window) {
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "decode attention: bad shapes");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "decode attention: caches must be contiguous");
  TORCH_CHECK(q_in.scalar_type() == k_cache.scalar_type() && k_cache.scalar_type() == v_cache.scalar_type(),
              "decode attention: q and the caches must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "decode attention: block tables and lengths must be int64");
  const at::Tensor q = q_in.contiguous();
  const at::Tensor tables = block_tables.contiguous(), lens = context_lens.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && Hkv >= 1 && H % Hkv == 0, "decode attention: head counts or sizes disagree");
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == B && lens.size(0) == B, "decode attention: one table and length per sequence");
  const int64_t block_size = k_cache.size(1), max_blocks = tables.size(1), num_blocks = k_cache.size(0);
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  TORCH_CHECK(window >= 0, "decode attention: a negative window");
  for (int64_t b = 0; b < B; ++b) {  // every block id read below, once per sequence
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= max_blocks * block_size, "decode attention: context length ", lp[b],
                " outside its block table");
    for (int64_t j = first_key(lp[b], window) / block_size; j < (lp[b] + block_size - 1) / block_size; ++j) {
      const int64_t id = tp[b * max_blocks + j];
      TORCH_CHECK(id >= 0 && id < num_blocks, "decode attention: block id ", id, " of sequence ", b,
                  " outside the cache's ", num_blocks, " blocks");
    }
  }
  isa = zs_qgemm::clamp_isa(isa);
  at::Tensor out = at::empty_like(q);
  if (q.scalar_type() == at::kFloat) {
    AttnArgs<float> a{q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), tp,
                      lp, out.data_ptr<float>(), H, Hkv, D, block_size, max_blocks, static_cast<float>(scale), window};
    attend_all(a, B, isa);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "decode attention: float32 or bfloat16 only");
    using bf = c10::BFloat16;
    AttnArgs<bf> a{q.data_ptr<bf>(), k_cache.data_ptr<bf>(), v_cache.data_ptr<bf>(), tp,
                   lp, out.data_ptr<bf>(), H, Hkv, D, block_size, max_blocks, static_cast<float>(scale), window};
    attend_all(a, B, isa);
  }
  return out;
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, float scale, int isa, int window=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) { lib.impl("paged_decode_attention", &zs_ops::paged_decode_attention); }
