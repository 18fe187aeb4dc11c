// Paged decode attention: one query token per sequence against its KV blocks, read in
// place through the block table (no gather, no padding mask), float32 accumulation for
// every cache type: float32 q over float32 or float16 caches (the float16 cache of float32
// models, --kv-cache-dtype auto), bfloat16 over bfloat16. Any number of query heads per KV
// head and any head size; the common ones (head size 64 / 128 / 256, 1-8 query heads per
// KV head) get loops of compile-time length. One variant per ISA path (zs_isa.h).
//
// At many streams decode attention is bound by memory, not arithmetic: every step reads
// each sequence's whole cache of every layer (32 streams of ~200 tokens of SmolLM2: 283 MB
// a step in float32), from DRAM. Hence float16 caches, tasks of whole sequences (a block
// read as one span), and software prefetch of the next block.
//
// A sliding window W (> 0; 0: none) limits a sequence of L tokens to its last W keys,
// positions L - W .. L - 1, as transformers' sliding-window mask: the blocks before them
// are never read (a windowed request's table holds the placeholder block there once it
// gave them back).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "decode_attention_blocks.h"
#include "zs_isa.h"
#include "zs_ops.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <type_traits>
#include <vector>

namespace zs_ops {
namespace {

template <typename T, typename C>
struct AttnArgs {
  const T* q;            // [B, H, D]
  const C* k_cache;      // [num_blocks, block_size, Hkv, D]
  const C* v_cache;
  const int64_t* tables; // [B, max_blocks]
  const int64_t* lens;   // [B]: tokens to attend (cached context incl. this step's token)
  T* out;                // [B, H, D]
  int64_t H, Hkv, D, block_size, max_blocks;
  float scale;
  int64_t window;        // > 0: attend only the last `window` keys
};

// The first key position a sequence of L tokens attends.
ZS_INLINE int64_t first_key(int64_t L, int64_t window) { return window > 0 && L > window ? L - window : 0; }

struct Scratch {  // one thread's buffers, sized for one task's heads, D and longest context
  float* scores;  // [heads, max_len]
  float* acc;     // [heads, D]
  float* qf;      // [heads, D]
};

// KV heads [h0, h1) of sequence b: each KV head's G query heads share every K/V row they
// read. The block table is walked block by block; a block holds block_size tokens, each
// token's heads side by side (row = Hkv * D elements), so a task of every KV head reads
// each block as one span of memory.
// DIM, GRP: the head size and the query heads per KV head when they are compile-time
// constants (fixed-length loops the compiler unrolls), else 0 and a.D, a.H / a.Hkv are
// used. VEC: the vector blocks of this build (1: AVX2, 2: AVX-512; 0: none), which serve
// the fixed head sizes (a multiple of 8 or 16) and groups.
template <typename T, typename C, int DIM, int GRP, int VEC>
ZS_INLINE void attend_impl(const AttnArgs<T, C>& a, int64_t b, int64_t h0, int64_t h1, const Scratch& s) {
  constexpr bool v512 = VEC == 2 && DIM > 0 && DIM % 16 == 0 && GRP > 0;
  constexpr bool v256 = VEC == 1 && DIM > 0 && DIM % 8 == 0 && GRP > 0;
  const int64_t G = GRP > 0 ? GRP : a.H / a.Hkv, D = DIM > 0 ? DIM : a.D, L = a.lens[b], bs = a.block_size;
  const int64_t nh = h1 - h0, row = a.Hkv * D;
  float* scores = s.scores;  // [nh * G, n_keys]: scores[(h * G + g) * n_keys + t - s0]
  float* qf = s.qf;          // the task's query heads in float32, pre-scaled
  float* acc = s.acc;
  const int64_t* table = a.tables + b * a.max_blocks;
  const T* q = a.q + (b * a.H + h0 * G) * D;
  for (int64_t i = 0; i < nh * G * D; ++i) qf[i] = f32(q[i]) * a.scale;
  const int64_t s0 = first_key(L, a.window), n_keys = L - s0, first = s0 - s0 % bs;
  // (the lambdas always inline: each path's copy of this function then compiles them for
  // its own ISA)
  auto block = [&](const C* cache, int64_t t0) __attribute__((always_inline)) { return cache + table[t0 / bs] * bs * row + h0 * D; };
  // the first block of keys s0 .. L - 1 asked for (K's before the scores, V's before the
  // softmax, which then runs under its fetch)
  auto first_block = [&](const C* cache) __attribute__((always_inline)) {
    prefetch_rows(block(cache, first), row, std::min(bs, L - first), nh * D);
  };
  // fn(block's first row of the task's heads, t0, keys [j0, n) of the block, the next
  // block's first row and its key count) over the blocks that hold keys s0 .. L - 1. fn
  // asks for the next block a share at a time while it computes this one: per KV head,
  // and in the vector blocks per query head (scores) or per key (values). A whole block
  // asked for at once (~100 lines) waits on the miss buffers, and the loads of the block
  // in hand wait behind it: compute and memory then run one after the other (the figures:
  // docs/benchmarks.md, "Sixth round").
  auto each_block = [&](const C* cache, auto&& fn) __attribute__((always_inline)) {
    for (int64_t t0 = first; t0 < L; t0 += bs) {
      const bool more = t0 + bs < L;
      fn(block(cache, t0), t0, std::max<int64_t>(s0 - t0, 0), std::min(bs, L - t0),
         more ? block(cache, t0 + bs) : nullptr, more ? std::min(bs, L - t0 - bs) : 0);
    }
  };
  first_block(a.k_cache);
  each_block(a.k_cache, [&](const C* kb, int64_t t0, int64_t j0, int64_t n, const C* next, int64_t n_next)
                                 __attribute__((always_inline)) {
    for (int64_t h = 0; h < nh; ++h) {
      const C* next_h = next ? next + h * D : nullptr;
      float* sc = scores + h * G * n_keys + t0 - s0;
      if constexpr (v512) {
        block_scores_avx512<C, DIM, GRP>(qf + h * G * D, kb + h * D, row, j0, n, sc, n_keys, next_h, n_next);
      } else if constexpr (v256) {
        block_scores_avx2<C, DIM, GRP>(qf + h * G * D, kb + h * D, row, j0, n, sc, n_keys, next_h, n_next);
      } else {
        if (next_h) prefetch_rows(next_h, row, n_next, D);
        for (int64_t j = j0; j < n; ++j) {
          const C* k = kb + j * row + h * D;
          for (int64_t g = 0; g < G; ++g) {
            const float* qg = qf + (h * G + g) * D;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < D; ++i) dot += qg[i] * f32(k[i]);
            sc[g * n_keys + j] = dot;
          }
        }
      }
    }
  });
  first_block(a.v_cache);  // under the softmax
  for (int64_t g = 0; g < nh * G; ++g) {
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
  std::fill(acc, acc + nh * G * D, 0.f);
  each_block(a.v_cache, [&](const C* vb, int64_t t0, int64_t j0, int64_t n, const C* next, int64_t n_next)
                                 __attribute__((always_inline)) {
    for (int64_t h = 0; h < nh; ++h) {
      const C* next_h = next ? next + h * D : nullptr;
      const float* sc = scores + h * G * n_keys + t0 - s0;
      float* ah = acc + h * G * D;
      if constexpr (v512) {
        block_values_avx512<C, DIM, GRP>(sc, vb + h * D, row, j0, n, n_keys, ah, next_h, n_next);
      } else if constexpr (v256) {
        block_values_avx2<C, DIM, GRP>(sc, vb + h * D, row, j0, n, n_keys, ah, next_h, n_next);
      } else {
        if (next_h) prefetch_rows(next_h, row, n_next, D);
        for (int64_t j = j0; j < n; ++j) {
          const C* v = vb + j * row + h * D;
          for (int64_t g = 0; g < G; ++g) {
            const float p = sc[g * n_keys + j];
            float* ag = ah + g * D;
#pragma omp simd
            for (int64_t i = 0; i < D; ++i) ag[i] += p * f32(v[i]);
          }
        }
      }
    }
  });
  T* o = a.out + (b * a.H + h0 * G) * D;
  for (int64_t i = 0; i < nh * G * D; ++i) o[i] = static_cast<T>(acc[i]);
}

// The three paths of ZS_VARIANTS by hand, each with its own vector blocks (none portable).
#define ZS_ATTEND_PARAMS const AttnArgs<T, C>&a, int64_t b, int64_t h0, int64_t h1, const Scratch &s
template <typename T, typename C, int DIM, int GRP>
void attend_0(ZS_ATTEND_PARAMS) { attend_impl<T, C, DIM, GRP, 0>(a, b, h0, h1, s); }
template <typename T, typename C, int DIM, int GRP>
ZS_TARGET_AVX2 void attend_1(ZS_ATTEND_PARAMS) { attend_impl<T, C, DIM, GRP, 1>(a, b, h0, h1, s); }
template <typename T, typename C, int DIM, int GRP>
ZS_TARGET_AVX512 void attend_2(ZS_ATTEND_PARAMS) { attend_impl<T, C, DIM, GRP, 2>(a, b, h0, h1, s); }

template <typename T, typename C>
using AttendFn = void (*)(const AttnArgs<T, C>&, int64_t, int64_t, int64_t, const Scratch&);

template <typename T, typename C, int DIM>
AttendFn<T, C> pick_group(int64_t G, int64_t isa) {
  switch (G) {
    case 1: return ZS_PICK(attend, (<T, C, DIM, 1>), isa);
    case 2: return ZS_PICK(attend, (<T, C, DIM, 2>), isa);
    case 3: return ZS_PICK(attend, (<T, C, DIM, 3>), isa);
    case 4: return ZS_PICK(attend, (<T, C, DIM, 4>), isa);
    case 8: return ZS_PICK(attend, (<T, C, DIM, 8>), isa);
    default: return ZS_PICK(attend, (<T, C, DIM, 0>), isa);
  }
}

template <typename T, typename C>
AttendFn<T, C> pick(int64_t D, int64_t G, int64_t isa) {
  if (D == 64) return pick_group<T, C, 64>(G, isa);
  if (D == 128) return pick_group<T, C, 128>(G, isa);
  if (D == 256) return pick_group<T, C, 256>(G, isa);
  return ZS_PICK(attend, (<T, C, 0, 0>), isa);
}

// Tasks of whole sequences (every KV head: each block read as one span) when there are
// enough sequences to keep every thread busy, else of one KV head each.
template <typename T, typename C>
void attend_all(const AttnArgs<T, C>& a, int64_t B, int64_t isa) {
  const int64_t G = a.H / a.Hkv;
  const AttendFn<T, C> fn = pick<T, C>(a.D, G, isa);
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; ++b) max_len = std::max(max_len, a.lens[b] - first_key(a.lens[b], a.window));
  const int64_t per_task = B >= 2 * at::get_num_threads() ? a.Hkv : 1, tasks_per_seq = a.Hkv / per_task;
  const int64_t heads = per_task * G;
  at::parallel_for(0, B * tasks_per_seq, 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> buf(static_cast<size_t>(heads * (max_len + 2 * a.D)));
    const Scratch s{buf.data(), buf.data() + heads * max_len, buf.data() + heads * (max_len + a.D)};
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t h0 = (w % tasks_per_seq) * per_task;
      fn(a, w / tasks_per_seq, h0, h0 + per_task, s);
    }
  });
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                                  int64_t isa, int64_t window) {
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), "decode attention: bad shapes");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "decode attention: caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "decode attention: the caches must share a dtype");
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
  auto run = [&](auto* qp, auto* cp) {
    using T = std::remove_pointer_t<decltype(qp)>;
    using C = std::remove_pointer_t<decltype(cp)>;
    const AttnArgs<T, C> a{qp, k_cache.data_ptr<C>(), v_cache.data_ptr<C>(), tp, lp, out.data_ptr<T>(),
                           H, Hkv, D, block_size, max_blocks, static_cast<float>(scale), window};
    attend_all(a, B, isa);
  };
  const auto qt = q.scalar_type(), ct = k_cache.scalar_type();
  if (qt == at::kFloat && ct == at::kFloat) run(q.data_ptr<float>(), static_cast<float*>(nullptr));
  else if (qt == at::kFloat && ct == at::kHalf) run(q.data_ptr<float>(), static_cast<c10::Half*>(nullptr));
  else if (qt == at::kBFloat16 && ct == at::kBFloat16) run(q.data_ptr<c10::BFloat16>(), static_cast<c10::BFloat16*>(nullptr));
  else TORCH_CHECK(false, "decode attention: q and caches of ", qt, " and ", ct,
                   " (float32 with float32 or float16 caches, bfloat16 with bfloat16)");
  return out;
}

}  // namespace zs_ops

TORCH_LIBRARY_FRAGMENT(zeroserve, lib) {
  lib.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, float scale, int isa, int window=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) { lib.impl("paged_decode_attention", &zs_ops::paged_decode_attention); }
