// Quantized linear layers on the CPU: GGUF Q4_0 / Q4_1 / Q8_0 weights (and the same block
// formats made from float checkpoints) times activations quantized to 8 bits per block of
// 32, as llama.cpp's ggml_vec_dot_q4_1_q8_1 / q8_0_q8_0 do.
//
//   weight row n, block b (32 inputs):  w = d[n,b] * q + m[n,b]      (4-bit: q in 0..15)
//                                       w = d[n,b] * q                (8-bit: q in -127..127)
//   activation row i, block b:          x ~= dx[i,b] * qx,  sx[i,b] = dx[i,b] * sum(qx)
//   out[i,n] = sum_b d[n,b] dx[i,b] dot(q, qx)  (+ sum_b m[n,b] sx[i,b] for 4-bit)
//
// Q4_0 is the 4-bit form with m = -8 d. The weights come repacked into the kernels' layout
// (qgemm_common.h), every value kept: 16 output rows interleaved 4 bytes at a time, so a
// vector register holds 4 inputs' weights for 16 (or 8) rows and one integer multiply-add
// of a broadcast activation word feeds all of them.
//
// Three code paths over that one layout, picked by the caller and clamped to what the CPU
// has: scalar (portable, the reference the others are tested against), AVX2 (maddubs +
// madd) and AVX-512 VNNI (dpbusd); on AMX the 8-bit format's steps of 16 rows and more
// take the tile unit (qgemm_amx.h). Work splits over groups of output rows with
// at::parallel_for (torch's OpenMP pool); within a thread a tile of activation rows x
// groups keeps the weights in registers across the rows of the batch.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <cpuid.h>

#include <type_traits>
#include <vector>

#include "qgemm_amx.h"
#include "qgemm_kquant.h"
#include "qgemm_q6k.h"

namespace zs_qgemm {
// ---------------------------------------------------------------- scalar (reference)

template <typename T>
void quantize_row_scalar(const T* x, int64_t nb, int8_t* q, float* d, float* s) {
  for (int64_t b = 0; b < nb; ++b) {
    float amax = 0.f;
    for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(static_cast<float>(x[b * QK + j])));
    const float db = amax / 127.f;
    const float id = db > 0.f ? 1.f / db : 0.f;
    int sum = 0;
    for (int j = 0; j < QK; ++j) {
      const int v = static_cast<int>(std::nearbyint(static_cast<float>(x[b * QK + j]) * id));
      q[b * QK + j] = static_cast<int8_t>(v);
      sum += v;
    }
    d[b] = db;
    s[b] = db * static_cast<float>(sum);
  }
}

// One output of row n for activation row i, read from the packed layout.
template <int FMT>
float dot_scalar(const Act& x, const Packed& w, int64_t i, int64_t n) {
  constexpr int64_t BB = group_block_bytes<FMT>();
  const int64_t g = n / GR, r = n % GR;
  float acc = 0.f;
  for (int64_t b = 0; b < w.nb; ++b) {
    const uint8_t* qb = w.q + (g * w.nb + b) * BB + r * 4;
    const int8_t* xb = x.q + (i * w.nb + b) * QK;
    int32_t sum = 0;
    for (int64_t k = 0; k < BB / 64; ++k)
      for (int64_t j = 0; j < 4; ++j) {
        const int v = qb[k * 64 + j];
        if constexpr (FMT == Q4) sum += (v & 15) * xb[4 * k + j] + (v >> 4) * xb[16 + 4 * k + j];
        else sum += (v - 128) * xb[4 * k + j];
      }
    const int64_t at = (g * w.nb + b) * GR + r;
    acc += static_cast<float>(w.d[at]) * x.d[i * w.nb + b] * static_cast<float>(sum);
    if constexpr (FMT == Q4) acc += static_cast<float>(w.m[at]) * x.s[i * w.nb + b];
  }
  return acc;
}

// Groups [g0, g1) of every activation row, on path `isa`.
template <int FMT, typename T>
void gemm(const Act& x, const Packed& w, int64_t M, T* out, int64_t g0, int64_t g1, int64_t isa) {
  if constexpr (FMT == Q8)
    if (isa == AMX && M >= AMX_MIN_ROWS) return gemm_amx_q8(x, w, M, out, g0, g1);
  if (isa >= AVX512) return gemm_vnni<FMT>(x, w, M, out, g0, g1);
  gemm_below_avx512(
      M, w.N, out, g0, g1, isa == AVX2,
      [&](auto rm, int64_t i, int64_t g, const Ahead& a) { tile_avx2<FMT, decltype(rm)::value>(x, w, out, i, g, a); },
      [&](int64_t i, int64_t n) { return dot_scalar<FMT>(x, w, i, n); },
      [&](int64_t g) {  // the next group asked for ahead (Ahead: qgemm_common.h) past one tile of 2 rows
        return x.prefetch && M > 2
            ? ahead_of(w.q, w.nb * group_block_bytes<FMT>(), g + 1, std::min<int64_t>(1, g1 - g - 1), w.nb)
            : Ahead{};
      });
}

// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25), and Linux's permission to
// use the tile data: asked once for the whole process (arch_prctl ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA; Linux 5.16+), refused on older kernels or where a VM hides it.
static bool amx_usable() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1)) return false;
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

static int64_t detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni"))
    return ZS_HAVE_AMX && amx_usable() ? AMX : AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return AVX2;
  return SCALAR;
}

int64_t best_isa() {
  static const int64_t best = detect_isa();  // every op clamps its isa: one syscall, at the first
  return best;
}

int64_t clamp_isa(int64_t isa) { return std::min(std::max<int64_t>(isa, SCALAR), best_isa()); }

template <typename T>
void quantize_rows(const T* x, int64_t M, int64_t nb, int64_t isa, int8_t* q, float* d, float* s) {
  const int64_t K = nb * QK;
  at::parallel_for(0, M, std::max<int64_t>(1, 256 / nb), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (isa >= AVX2) quantize_row_avx2(x + i * K, nb, q + i * K, d + i * nb, s + i * nb);
      else quantize_row_scalar(x + i * K, nb, q + i * K, d + i * nb, s + i * nb);
    }
  });
}

// x [M, K] float32/bfloat16 -> (q int8 [M, K], d [M, K/32], s [M, K/32])
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_act(const at::Tensor& x_in, int64_t isa) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) % QK == 0, "quantize_act: x must be [M, K] with K % 32 == 0");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16,
              "quantize_act: x must be float32 or bfloat16");
  const at::Tensor x = x_in.contiguous();
  isa = clamp_isa(isa);
  const int64_t M = x.size(0), nb = x.size(1) / QK;
  at::Tensor q = at::empty({M, nb * QK}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, nb}, x.options().dtype(at::kFloat));
  at::Tensor s = at::empty({M, nb}, x.options().dtype(at::kFloat));
  if (x.scalar_type() == at::kFloat)
    quantize_rows(x.data_ptr<float>(), M, nb, isa, q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<float>());
  else
    quantize_rows(x.data_ptr<c10::BFloat16>(), M, nb, isa, q.data_ptr<int8_t>(), d.data_ptr<float>(),
                  s.data_ptr<float>());
  return {q, d, s};
}

// The checks of a Q4_0/Q4_1/Q8_0 weight in the kernels' layout for x [M, K] and n outputs;
// its groups (ceil(n / 16) or more).
static int64_t check_packed(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                            const c10::optional<at::Tensor>& m, int64_t fmt, int64_t n, const char* op) {
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D");
  TORCH_CHECK(fmt == Q4 || fmt == Q8, op, ": unknown format ", fmt);
  const int64_t K = x.size(1), nb = K / QK;
  TORCH_CHECK(d.dim() == 3 && d.size(2) == GR && d.is_contiguous() && d.scalar_type() == at::kHalf,
              op, ": d must be float16 [groups, K/32, 16]");
  const int64_t groups = d.size(0);
  TORCH_CHECK(K % QK == 0 && d.size(1) == nb, op, ": K=", K, " does not match the weight's ", d.size(1), " blocks");
  const int64_t bb = fmt == Q4 ? group_block_bytes<Q4>() : group_block_bytes<Q8>();
  TORCH_CHECK(qs.is_contiguous() && qs.scalar_type() == at::kByte && qs.numel() == groups * nb * bb,
              op, ": packed weight has the wrong shape");
  if (fmt == Q4)
    TORCH_CHECK(m.has_value() && m->is_contiguous() && m->sizes() == d.sizes() && m->scalar_type() == at::kHalf,
                op, ": a 4-bit weight needs m shaped like d");
  return groups;
}

// out [M, n] (dtype of x) = x @ dequant(w).T, the weight packed (qgemm_common.h): qs
// [groups, nb * (256 | 512)] uint8, d (and m for 4-bit) [groups, nb, 16] float16, with
// groups = ceil(n / 16); fmt 0 = 4-bit, 1 = 8-bit; 2-4, 6 (5-bit, Q4_K, Q5_K, Q5_0): qgemm_kquant.h;
// 5 (Q6_K): qgemm_q6k.h (qgemm_q6k.cpp).
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                   const c10::optional<at::Tensor>& m, int64_t fmt, int64_t n, int64_t isa) {
  if (is_kquant_fmt(fmt)) return qlinear_kquant(x, qs, d, m, fmt, n, isa);  // 2-4, 6: qgemm_kquant.h
  TORCH_CHECK(x.dim() == 2, "qlinear: x must be 2-D");
  if (fmt == Q6K) return qlinear_q6k(x, qs, d, n, isa);
  const int64_t groups = check_packed(x, qs, d, m, fmt, n, "qlinear");
  TORCH_CHECK(n > (groups - 1) * GR && n <= groups * GR, "qlinear: ", n, " outputs do not fit ", groups, " groups");
  const int64_t M = x.size(0), nb = x.size(1) / QK;
  isa = clamp_isa(isa);
  auto [xq, xd, xs] = quantize_act(x, isa);
  at::Tensor out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  const Act a{xq.data_ptr<int8_t>(), xd.data_ptr<float>(), xs.data_ptr<float>(), prefetch_weights(M)};
  const Packed w{qs.data_ptr<uint8_t>(), d.data_ptr<c10::Half>(), fmt == Q4 ? m->data_ptr<c10::Half>() : nullptr, nb, n};
  // tasks of whole group pairs, each above ~2k block dots, so a 576-row GEMV still splits
  const int64_t pairs = (groups + 1) / 2;
  const int64_t grain = std::max<int64_t>(1, 2048 / std::max<int64_t>(1, 2 * GR * M * nb / 4));
  auto run = [&](auto* o) {
    at::parallel_for(0, pairs, grain, [&](int64_t p0, int64_t p1) {
      const int64_t g0 = 2 * p0, g1 = std::min(groups, 2 * p1);
      if (fmt == Q4) gemm<Q4>(a, w, M, o, g0, g1, isa);
      else gemm<Q8>(a, w, M, o, g0, g1, isa);
    });
  };
  if (out.scalar_type() == at::kFloat) run(out.data_ptr<float>());
  else run(out.data_ptr<c10::BFloat16>());
  return out;
}

// ---------------------------------------------------------------- argmax of the outputs
// qlinear_argmax: per activation row, the index of its largest output among the first n,
// the outputs never written out. A greedy step's output head (Gemma 3's 262,144 x 640 at 32
// rows: 33.5 MB of logits) otherwise stores every logit and reads it back for the argmax.
// Each task computes chunks of ARGMAX_GROUPS groups into a buffer that stays in cache,
// with the same kernels and the same rounding to x's dtype as qlinear, and scans it: the
// index is the one torch's max(dim) gives on qlinear's outputs (the first of the largest;
// a NaN counts as the largest, the first NaN wins), bit for bit.
constexpr int64_t ARGMAX_GROUPS = 64;  // 1,024 outputs: 128 KB of float32 at 32 rows

struct RowBest {  // the best output of one row so far, over increasing indices
  float v = 0.f;
  int64_t i = -1;  // none yet
  bool nan = false;
  bool beaten_by(float cv, bool cnan) const { return i < 0 || (cnan && !nan) || (!cnan && !nan && cv > v); }
};

// The largest of x[0, n) (n a multiple of 16) and whether one is NaN. maxps(v, m) is
// `v > m ? v : m`, lane by lane (GCC will not vectorize that loop without -ffast-math).
static float max16_sse(const float* x, int64_t n, bool& nan) {
  __m128 m[4], u = _mm_setzero_ps();
  for (auto& r : m) r = _mm_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16)
    for (int k = 0; k < 4; ++k) {
      const __m128 v = _mm_loadu_ps(x + j + 4 * k);
      m[k] = _mm_max_ps(v, m[k]);
      u = _mm_or_ps(u, _mm_cmpunord_ps(v, v));
    }
  alignas(16) float l[4];
  _mm_store_ps(l, _mm_max_ps(_mm_max_ps(m[0], m[1]), _mm_max_ps(m[2], m[3])));
  nan = _mm_movemask_ps(u) != 0;
  return std::max(std::max(l[0], l[1]), std::max(l[2], l[3]));
}

ZS_AVX512 static float max16_avx512(const float* x, int64_t n, bool& nan) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  __mmask16 u = 0;
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    m = _mm512_max_ps(v, m);
    u |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  nan = u != 0;
  return _mm512_reduce_max_ps(m);
}

// Offers each row of out [M, cols] (columns col0...) to best[M].
template <typename T>
static void offer_rows(const T* out, int64_t M, int64_t cols, int64_t col0, int64_t isa, RowBest* best, float* tmp) {
  const int64_t n16 = cols / 16 * 16;
  for (int64_t i = 0; i < M; ++i) {
    const float* r = tmp;
    if constexpr (std::is_same_v<T, float>) r = out + i * cols;
    else
      for (int64_t j = 0; j < cols; ++j) tmp[j] = static_cast<float>(out[i * cols + j]);
    bool nan;
    float m = isa >= AVX512 ? max16_avx512(r, n16, nan) : max16_sse(r, n16, nan);
    for (int64_t j = n16; j < cols; ++j) {
      m = r[j] > m ? r[j] : m;
      nan |= r[j] != r[j];
    }
    if (!best[i].beaten_by(m, nan)) continue;
    int64_t j = 0;
    while (nan ? r[j] == r[j] : r[j] != m) ++j;
    best[i] = {r[j], col0 + j, nan};
  }
}

// int64 [M]: argmax over the first n of qlinear(x, qs, d, m, fmt, ...)'s outputs, for the
// 4- and 8-bit formats (n <= the weight's groups x 16).
at::Tensor qlinear_argmax(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                          const c10::optional<at::Tensor>& m, int64_t fmt, int64_t n, int64_t isa) {
  const int64_t groups = check_packed(x, qs, d, m, fmt, n, "qlinear_argmax");
  TORCH_CHECK(n > 0 && n <= groups * GR, "qlinear_argmax: ", n, " outputs asked of a weight of ", groups * GR);
  const int64_t M = x.size(0), nb = x.size(1) / QK, used = (n + GR - 1) / GR;
  isa = clamp_isa(isa);
  at::Tensor idx = at::empty({M}, x.options().dtype(at::kLong));
  if (M == 0) return idx;
  auto [xq, xd, xs] = quantize_act(x, isa);
  const Act a{xq.data_ptr<int8_t>(), xd.data_ptr<float>(), xs.data_ptr<float>(), prefetch_weights(M)};
  const int64_t bb = fmt == Q4 ? group_block_bytes<Q4>() : group_block_bytes<Q8>();
  const uint8_t* q = qs.data_ptr<uint8_t>();
  const c10::Half* dp = d.data_ptr<c10::Half>();
  const c10::Half* mp = fmt == Q4 ? m->data_ptr<c10::Half>() : nullptr;
  const int64_t chunks = (used + ARGMAX_GROUPS - 1) / ARGMAX_GROUPS;
  std::vector<RowBest> part(chunks * M);  // a task's rows at its first chunk's slot
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      std::vector<T> out(M * ARGMAX_GROUPS * GR);
      std::vector<float> tmp(std::is_same_v<T, float> ? 0 : ARGMAX_GROUPS * GR);
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t g0 = c * ARGMAX_GROUPS, g1 = std::min(used, g0 + ARGMAX_GROUPS);
        const int64_t cols = std::min(n, g1 * GR) - g0 * GR;
        const Packed w{q + g0 * nb * bb, dp + g0 * nb * GR, mp ? mp + g0 * nb * GR : nullptr, nb, cols};
        if (fmt == Q4) gemm<Q4>(a, w, M, out.data(), 0, g1 - g0, isa);
        else gemm<Q8>(a, w, M, out.data(), 0, g1 - g0, isa);
        offer_rows(out.data(), M, cols, g0 * GR, isa, &part[c0 * M], tmp.data());
      }
    });
  };
  if (x.scalar_type() == at::kFloat) run(static_cast<float*>(nullptr));
  else run(static_cast<c10::BFloat16*>(nullptr));
  int64_t* o = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < M; ++i) {
    RowBest b;
    for (int64_t c = 0; c < chunks; ++c) {
      const RowBest& p = part[c * M + i];
      if (p.i >= 0 && b.beaten_by(p.v, p.nan)) b = p;
    }
    o[i] = b.i;
  }
  return idx;
}

int64_t cpu_isa() { return best_isa(); }

}  // namespace zs_qgemm

using namespace zs_qgemm;

TORCH_LIBRARY(zeroserve, lib) {
  lib.def("qlinear(Tensor x, Tensor qs, Tensor d, Tensor? m, int fmt, int n, int isa) -> Tensor");
  lib.def("qlinear_argmax(Tensor x, Tensor qs, Tensor d, Tensor? m, int fmt, int n, int isa) -> Tensor");
  lib.def("quantize_act(Tensor x, int isa) -> (Tensor, Tensor, Tensor)");
  lib.def("cpu_isa() -> int", &cpu_isa);
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) {
  lib.impl("qlinear", &qlinear);
  lib.impl("qlinear_argmax", &qlinear_argmax);
  lib.impl("quantize_act", &quantize_act);
}
