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
  for (int64_t g = g0; g < g1; ++g) {
    if (isa == AVX2) {
      // the next group asked for ahead (Ahead: qgemm_common.h) past one tile of 2 rows
      const Ahead next = x.prefetch && M > 2
          ? ahead_of(w.q, w.nb * group_block_bytes<FMT>(), g + 1, std::min<int64_t>(1, g1 - g - 1), w.nb)
          : Ahead{};
      int64_t i = 0;
      for (; i + 2 <= M; i += 2) tile_avx2<FMT, 2>(x, w, out, i, g, i + 2 == M ? next : Ahead{});
      if (i < M) tile_avx2<FMT, 1>(x, w, out, i, g, next);
      continue;
    }
    for (int64_t n = g * GR; n < std::min(w.N, (g + 1) * GR); ++n)
      for (int64_t i = 0; i < M; ++i) store(out + i * w.N + n, dot_scalar<FMT>(x, w, i, n));
  }
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

// out [M, n] (dtype of x) = x @ dequant(w).T, the weight packed (qgemm_common.h): qs
// [groups, nb * (256 | 512)] uint8, d (and m for 4-bit) [groups, nb, 16] float16, with
// groups = ceil(n / 16); fmt 0 = 4-bit, 1 = 8-bit; 2-4, 6 (5-bit, Q4_K, Q5_K, Q5_0): qgemm_kquant.h;
// 5 (Q6_K): qgemm_q6k.h (qgemm_q6k.cpp).
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                   const c10::optional<at::Tensor>& m, int64_t fmt, int64_t n, int64_t isa) {
  if (is_kquant_fmt(fmt)) return qlinear_kquant(x, qs, d, m, fmt, n, isa);  // 2-4, 6: qgemm_kquant.h
  TORCH_CHECK(x.dim() == 2, "qlinear: x must be 2-D");
  if (fmt == Q6K) return qlinear_q6k(x, qs, d, n, isa);
  TORCH_CHECK(fmt == Q4 || fmt == Q8, "qlinear: unknown format ", fmt);
  const int64_t M = x.size(0), K = x.size(1), nb = K / QK;
  TORCH_CHECK(d.dim() == 3 && d.size(2) == GR && d.is_contiguous() && d.scalar_type() == at::kHalf,
              "qlinear: d must be float16 [groups, K/32, 16]");
  const int64_t groups = d.size(0);
  TORCH_CHECK(K % QK == 0 && d.size(1) == nb, "qlinear: K=", K, " does not match the weight's ", d.size(1), " blocks");
  TORCH_CHECK(n > (groups - 1) * GR && n <= groups * GR, "qlinear: ", n, " outputs do not fit ", groups, " groups");
  const int64_t bb = fmt == Q4 ? group_block_bytes<Q4>() : group_block_bytes<Q8>();
  TORCH_CHECK(qs.is_contiguous() && qs.scalar_type() == at::kByte && qs.numel() == groups * nb * bb,
              "qlinear: packed weight has the wrong shape");
  if (fmt == Q4)
    TORCH_CHECK(m.has_value() && m->is_contiguous() && m->sizes() == d.sizes() && m->scalar_type() == at::kHalf,
                "qlinear: a 4-bit weight needs m shaped like d");
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

int64_t cpu_isa() { return best_isa(); }

}  // namespace zs_qgemm

using namespace zs_qgemm;

TORCH_LIBRARY(zeroserve, lib) {
  lib.def("qlinear(Tensor x, Tensor qs, Tensor d, Tensor? m, int fmt, int n, int isa) -> Tensor");
  lib.def("quantize_act(Tensor x, int isa) -> (Tensor, Tensor, Tensor)");
  lib.def("cpu_isa() -> int", &cpu_isa);
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) {
  lib.impl("qlinear", &qlinear);
  lib.impl("quantize_act", &quantize_act);
}
