// Quantized linear layers on the CPU: GGUF Q4_0 / Q4_1 / Q8_0 weights (and the same block
// formats made from float checkpoints) times activations quantized to 8 bits per block of
// 32, as llama.cpp's ggml_vec_dot_q4_1_q8_1 / q8_0_q8_0 do.
//
//   weight row n, block b (32 inputs):  w = d[n,b] * q + m[n,b]      (4-bit: q in 0..15)
//                                       w = d[n,b] * q                (8-bit: q in -127..127)
//   activation row i, block b:          x ~= dx[i,b] * qx,  sx[i,b] = dx[i,b] * sum(qx)
//   out[i,n] = sum_b d[n,b] dx[i,b] dot(q, qx)  (+ sum_b m[n,b] sx[i,b] for 4-bit)
//
// Q4_0 is the 4-bit form with m = -8 d; the caller repacks GGUF blocks into three arrays
// (nibbles as GGUF orders them, fp32 d, fp32 m) without changing a value.
//
// Three code paths, picked by the caller and clamped to what the CPU has: scalar (portable,
// the reference the others are tested against) and AVX2 (maddubs + madd, 32 inputs per
// op) on the weights as above (`qlinear`), and AVX-512 VNNI on the same values repacked 16
// rows at a time (`qlinear_vnni`, qgemm_vnni.h). Work splits over output columns with
// at::parallel_for (torch's OpenMP pool); within a thread a tile of activation rows x
// weight rows keeps the weights in registers across the rows of the batch.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "qgemm_vnni.h"

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

template <int FMT>
float dot_row_scalar(const Problem& p, int64_t i, int64_t n) {
  const int8_t* xq = p.x.q + i * p.nb * QK;
  const uint8_t* wq = p.w.q + n * p.w.row_bytes;
  float acc = 0.f;
  for (int64_t b = 0; b < p.nb; ++b) {
    int32_t sum = 0;
    if constexpr (FMT == Q4) {
      const uint8_t* qb = wq + b * 16;
      const int8_t* xb = xq + b * QK;
      for (int j = 0; j < 16; ++j) sum += (qb[j] & 15) * xb[j] + (qb[j] >> 4) * xb[j + 16];
    } else {
      const int8_t* qb = reinterpret_cast<const int8_t*>(wq) + b * QK;
      const int8_t* xb = xq + b * QK;
      for (int j = 0; j < QK; ++j) sum += qb[j] * xb[j];
    }
    acc += p.w.d[n * p.nb + b] * p.x.d[i * p.nb + b] * static_cast<float>(sum);
    if constexpr (FMT == Q4) acc += p.w.m[n * p.nb + b] * p.x.s[i * p.nb + b];
  }
  return acc;
}

template <int FMT, typename T>
void gemm_scalar(const Problem& p, T* out, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t i = 0; i < p.M; ++i) store(out + i * p.N + n, dot_row_scalar<FMT>(p, i, n));
}

// ---------------------------------------------------------------- tiling and dispatch

// Columns [n0, n1) for every row: tiles of RN weight rows, the batch in tiles of up to RM
// rows (RM for the bulk, then the remainder), a 1-row weight tile for a column tail.
template <int FMT, int RM, int RN, typename T, typename Tile>
struct Tiler {
  template <int rm, int rn>
  static void rows(const Problem& p, T* out, int64_t n, int64_t m_left, int64_t i0) {
    if constexpr (rm > 0) {
      if (m_left >= rm) {
        Tile::template run<rm, rn>(p, out, i0, n);
        return;
      }
      rows<rm - 1, rn>(p, out, n, m_left, i0);
    }
  }
  static void cols(const Problem& p, T* out, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1;) {
      const bool full = n + RN <= n1;
      for (int64_t i = 0; i < p.M;) {
        const int64_t take = std::min<int64_t>(RM, p.M - i);
        if (full) rows<RM, RN>(p, out, n, take, i);
        else rows<RM, 1>(p, out, n, take, i);
        i += take;
      }
      n += full ? RN : 1;
    }
  }
};

template <int FMT, typename T>
struct Avx2Tile {
  template <int rm, int rn>
  static void run(const Problem& p, T* out, int64_t i0, int64_t n0) { tile_avx2<FMT, rm, rn>(p, out, i0, n0); }
};

template <int FMT, typename T>
void gemm(const Problem& p, T* out, int64_t isa) {
  // Each task is a run of RN-aligned columns; grain keeps a task above ~2k block dots
  // (a few microseconds), so even a 576-column GEMV splits over two threads.
  constexpr int64_t RN = 4;
  const int64_t tiles = (p.N + RN - 1) / RN;
  const int64_t grain = std::max<int64_t>(1, 2048 / std::max<int64_t>(1, RN * p.M * p.nb));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) {
    const int64_t n0 = t0 * RN, n1 = std::min(p.N, t1 * RN);
    if (isa == AVX2) {
      Tiler<FMT, 3, 2, T, Avx2Tile<FMT, T>>::cols(p, out, n0, n1);
    }
    else gemm_scalar<FMT>(p, out, n0, n1);
  });
}

int64_t best_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni"))
    return AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return AVX2;
  return SCALAR;
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

// out [M, N] (dtype of x) = x @ dequant(w).T: qs [N, K/2] uint8 (fmt 0) or [N, K] int8
// (fmt 1), d [N, K/32] float32, m [N, K/32] float32 (fmt 0). The scalar and AVX2 paths;
// AVX-512 takes the weights repacked (qlinear_vnni).
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                   const c10::optional<at::Tensor>& m, int64_t fmt, int64_t isa) {
  TORCH_CHECK(x.dim() == 2, "qlinear: x must be 2-D");
  TORCH_CHECK(fmt == Q4 || fmt == Q8, "qlinear: unknown format ", fmt);
  const int64_t M = x.size(0), K = x.size(1), N = d.size(0), nb = K / QK;
  TORCH_CHECK(K % QK == 0 && d.size(1) == nb, "qlinear: K=", K, " does not match the weight's ", d.size(1), " blocks");
  TORCH_CHECK(qs.is_contiguous() && d.is_contiguous() && d.scalar_type() == at::kFloat, "qlinear: bad weight tensors");
  TORCH_CHECK(qs.size(0) == N && qs.size(1) == (fmt == Q4 ? K / 2 : K), "qlinear: packed weight has the wrong shape");
  if (fmt == Q4)
    TORCH_CHECK(m.has_value() && m->is_contiguous() && m->sizes() == d.sizes() && m->scalar_type() == at::kFloat,
                "qlinear: a 4-bit weight needs m [N, K/32] float32");
  isa = clamp_isa(isa);
  TORCH_CHECK(isa != AVX512, "qlinear: the AVX-512 path reads weights repacked by pack_vnni: call qlinear_vnni");
  auto [xq, xd, xs] = quantize_act(x, isa);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const Problem p{{xq.data_ptr<int8_t>(), xd.data_ptr<float>(), xs.data_ptr<float>()},
                  {static_cast<const uint8_t*>(qs.data_ptr()), d.data_ptr<float>(), fmt == Q4 ? m->data_ptr<float>() : nullptr, qs.size(1)},
                  M, N, nb};
  if (out.scalar_type() == at::kFloat) {
    if (fmt == Q4) gemm<Q4>(p, out.data_ptr<float>(), isa);
    else gemm<Q8>(p, out.data_ptr<float>(), isa);
  } else {
    if (fmt == Q4) gemm<Q4>(p, out.data_ptr<c10::BFloat16>(), isa);
    else gemm<Q8>(p, out.data_ptr<c10::BFloat16>(), isa);
  }
  return out;
}

// out [M, n] (dtype of x) = x @ dequant(w).T for a weight in the vnni layout (see
// qgemm_vnni.h): qs [groups, nb * (512 | 256)] uint8, d (and m) [groups, nb, 16] float32.
at::Tensor qlinear_vnni(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                        const c10::optional<at::Tensor>& m, int64_t fmt, int64_t n) {
  TORCH_CHECK(best_isa() == AVX512, "qlinear_vnni: this CPU has no AVX-512 VNNI");
  TORCH_CHECK(x.dim() == 2, "qlinear_vnni: x must be 2-D");
  TORCH_CHECK(fmt == Q4 || fmt == Q8, "qlinear_vnni: unknown format ", fmt);
  const int64_t M = x.size(0), K = x.size(1), nb = K / QK;
  TORCH_CHECK(d.dim() == 3 && d.size(2) == VR && d.is_contiguous() && d.scalar_type() == at::kFloat,
              "qlinear_vnni: d must be float32 [groups, K/32, 16]");
  const int64_t groups = d.size(0);
  TORCH_CHECK(K % QK == 0 && d.size(1) == nb, "qlinear_vnni: K=", K, " does not match the weight's ", d.size(1), " blocks");
  TORCH_CHECK(n > (groups - 1) * VR && n <= groups * VR, "qlinear_vnni: ", n, " outputs do not fit ", groups, " groups");
  TORCH_CHECK(qs.is_contiguous() && qs.scalar_type() == at::kByte && qs.numel() == groups * nb * (fmt == Q4 ? 256 : 512),
              "qlinear_vnni: packed weight has the wrong shape");
  if (fmt == Q4)
    TORCH_CHECK(m.has_value() && m->is_contiguous() && m->sizes() == d.sizes() && m->scalar_type() == at::kFloat,
                "qlinear_vnni: a 4-bit weight needs m shaped like d");
  auto [xq, xd, xs] = quantize_act(x, AVX512);
  at::Tensor out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  const Act a{xq.data_ptr<int8_t>(), xd.data_ptr<float>(), xs.data_ptr<float>()};
  const Packed w{qs.data_ptr<uint8_t>(), d.data_ptr<float>(), fmt == Q4 ? m->data_ptr<float>() : nullptr};
  // tasks of whole group pairs, each above ~2k block dots, so a 576-row GEMV still splits
  const int64_t pairs = (groups + 1) / 2;
  const int64_t grain = std::max<int64_t>(1, 2048 / std::max<int64_t>(1, 2 * VR * M * nb / 4));
  auto run = [&](auto* o) {
    at::parallel_for(0, pairs, grain, [&](int64_t p0, int64_t p1) {
      const int64_t g0 = 2 * p0, g1 = std::min(groups, 2 * p1);
      if (fmt == Q4) gemm_vnni<Q4>(a, w, M, nb, n, o, g0, g1);
      else gemm_vnni<Q8>(a, w, M, nb, n, o, g0, g1);
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
  lib.def("qlinear(Tensor x, Tensor qs, Tensor d, Tensor? m, int fmt, int isa) -> Tensor");
  lib.def("qlinear_vnni(Tensor x, Tensor qs, Tensor d, Tensor? m, int fmt, int n) -> Tensor");
  lib.def("quantize_act(Tensor x, int isa) -> (Tensor, Tensor, Tensor)");
  lib.def("cpu_isa() -> int", &cpu_isa);
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) {
  lib.impl("qlinear", &qlinear);
  lib.impl("qlinear_vnni", &qlinear_vnni);
  lib.impl("quantize_act", &quantize_act);
}
