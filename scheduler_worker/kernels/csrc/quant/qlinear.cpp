// Quantized linear layers on the CPU: GGUF block-quantized weights (formats.h: Q4_0, Q4_1,
// Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, and the same block formats made from float
// checkpoints; each format a row of FORMAT_ROWS) times activations quantized to 8 bits per block of 32, as llama.cpp's
// ggml_vec_dot_*_q8_* do:
//
//   weight row n, block b (32 inputs):  w = dw[n,b] * q + mw[n,b]    (formats.h)
//   activation row i, block b:          x ~= dx[i,b] * qx,  sx[i,b] = dx[i,b] * sum(qx)
//   out[i,n] = sum_b dw[n,b] dx[i,b] dot(q, qx) + sum_b mw[n,b] sx[i,b]
//
// The weights come repacked into the kernels' layout (formats.h), every value kept: 16
// output rows interleaved 4 bytes at a time, so a vector register holds 4 inputs' weights
// for 16 (or 8) rows and one integer multiply-add of a broadcast activation word feeds all
// of them.
//
// This file is the entry of every format: the checks, the activation quantizer, the split
// of the work over groups of output rows (zs_team::parallel_for: torch's OpenMP pool, or
// a decode step's team), and the one table of which kernel runs each (format, ISA) pair.
// The kernels are laid out by ISA: generic/ (portable, the reference the others are
// tested against), arch/avx2/ (maddubs + madd), arch/avx512/ (VNNI dpbusd), arch/amx/
// (the tile unit). Within a thread a tile of activation rows x groups keeps the weights
// in registers across the rows of the batch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "kernel.h"
#include "../zs_team.h"

namespace zs_qgemm {

// The (format, ISA) table: the formats with SIMD tiles, each with the kernel each ISA has
// of its own, null where it has none. A pair with no kernel runs the one of the next ISA
// down (AMX is AVX-512 plus the tile unit), and a format with no row here (or none down to
// SCALAR) runs its portable kernel (generic::EVERY: every format of formats.h has one), so
// a new format is served by its row in formats.h alone, its tiles a row here later.
// tests/scheduler_worker/test_format_codes.py reads this table against
// scheduler_worker/quant/formats.py's AMX_FORMS.
struct FormatKernels {
  Fmt fmt;
  GroupsFn isa[3];  // AVX2, AVX512, AMX
};
constexpr FormatKernels TILES[] = {
    {Q4, {&avx2::groups<Q4>, &avx512::groups<Q4>, nullptr}},
    {Q8, {&avx2::groups<Q8>, &avx512::groups<Q8>, &amx::groups<Q8>}},
    {Q5, {&avx2::groups<Q5>, &avx512::groups<Q5>, &amx::groups<Q5>}},
    {Q4K, {&avx2::groups<Q4K>, &avx512::groups<Q4K>, nullptr}},
    {Q5K, {&avx2::groups<Q5K>, &avx512::groups<Q5K>, &amx::groups<Q5K>}},
    {Q6K, {&avx2::groups<Q6K>, &avx512::groups<Q6K>, nullptr}},
    {Q50, {&avx2::groups<Q50>, &avx512::groups<Q50>, &amx::groups<Q50>}},
    {IQ4XS, {&avx2::groups<IQ4XS>, &avx512::groups<IQ4XS>, nullptr}},
    {IQ4NL, {&avx2::groups<IQ4NL>, &avx512::groups<IQ4NL>, nullptr}},
};
// the activation quantizer per ISA, as the table's columns
constexpr QuantizeFn QUANTIZE[4] = {&generic::quantize, &avx2::quantize, nullptr, nullptr};

// TILES by format code: [fmt][isa], null where none (SCALAR's column: generic::EVERY).
constexpr std::array<std::array<GroupsFn, 4>, NFMT> tiles_by_code() {
  std::array<std::array<GroupsFn, 4>, NFMT> t{};
  for (const FormatKernels& row : TILES)
    for (int64_t isa = AVX2; isa <= AMX; ++isa) t[row.fmt][isa] = row.isa[isa - AVX2];
  return t;
}
constexpr auto TILES_BY_CODE = tiles_by_code();

// The kernel of (fmt, isa): its own, else the next ISA down's, else the portable one.
static GroupsFn groups_for(int64_t fmt, int64_t isa) {
  for (; isa > SCALAR; --isa)
    if (TILES_BY_CODE[fmt][isa] != nullptr) return TILES_BY_CODE[fmt][isa];
  return generic::EVERY[fmt];
}

// o[e] = -32 * the sum of piece e of 16 quantized activations q, e < P (Q6K's offsets)
static void piece_offsets(const int8_t* q, int64_t P, int32_t* o) {
  for (int64_t e = 0; e < P; ++e) {
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += q[e * 16 + j];
    o[e] = -32 * s;
  }
}

// x [M, K] (contiguous) quantized into q [M, K], d [M, K/32], s [M, K/32], and where `off`
// is given Q6K's piece offsets into it [M, K/16] (piece_offsets), in tasks of whole blocks
// across the rows (256 and more a task: fewer cost more to hand over than they take): a
// block's results depend on its 32 values alone, so any split gives the same bits.
static void quantize_rows(const at::Tensor& x, int64_t isa, int8_t* qp, float* dp, float* sp, int32_t* off) {
  ZS_PIECE("quantize");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % QK == 0, "quantize_act: x must be [M, K] with K % 32 == 0");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "quantize_act: x must be float32 or bfloat16");
  isa = clamp_isa(isa);
  QuantizeFn quantize = nullptr;
  for (; quantize == nullptr; --isa) quantize = QUANTIZE[isa];
  const int64_t M = x.size(0), nb = x.size(1) / QK, K = nb * QK;
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const char* xp = static_cast<const char*>(x.data_ptr());
  const int64_t esize = x.element_size();
  zs_team::parallel_for(0, M * nb, 256, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0, n; b < b1; b += n) {  // row b / nb's blocks b % nb .. + n
      n = std::min(b1 - b, nb - b % nb);
      quantize(xp + (b / nb * K + b % nb * QK) * esize, bf16, n, qp + b * QK, dp + b, sp + b);
    }
    if (off != nullptr) piece_offsets(qp + b0 * QK, 2 * (b1 - b0), off + 2 * b0);
  });
}

// x [M, K] float32/bfloat16 -> (q int8 [M, K], d [M, K/32], s [M, K/32])
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_act(const at::Tensor& x_in, int64_t isa) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) % QK == 0, "quantize_act: x must be [M, K] with K % 32 == 0");
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), nb = x.size(1) / QK;
  at::Tensor q = at::empty({M, nb * QK}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, nb}, x.options().dtype(at::kFloat));
  at::Tensor s = at::empty({M, nb}, x.options().dtype(at::kFloat));
  quantize_rows(x, isa, q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<float>(), nullptr);
  return {q, d, s};
}


// Halves from a unit's scales to the next unit's (Packed::ds): 16 where d (and m) are
// contiguous, 32 where d and m are the two halves of one [groups, units, 2, 16] tensor
// (m = d + 16, the weight arena's layout); 0 for any other layout.
static int64_t scale_stride(const at::Tensor& d, const c10::optional<at::Tensor>& m) {
  if (d.is_contiguous() && (!m.has_value() || m->is_contiguous())) return GR;
  const bool pair = m.has_value() && d.stride(2) == 1 && d.stride(1) == 2 * GR && d.stride(0) == d.size(1) * 2 * GR &&
                    m->strides() == d.strides() && m->data_ptr<c10::Half>() == d.data_ptr<c10::Half>() + GR;
  return pair ? 2 * GR : 0;
}

// The checks of a weight of format `fmt` in the kernels' layout for x [M, K]; its groups.
static int64_t check_weight(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                            const c10::optional<at::Tensor>& m, int64_t fmt, const char* op) {
  TORCH_CHECK(fmt >= 0 && fmt < NFMT, op, ": unknown format ", fmt);
  const FormatInfo& f = FORMATS[fmt];
  TORCH_CHECK(x.dim() == 2, op, ": x must be 2-D");
  const int64_t K = x.size(1);
  TORCH_CHECK(K % f.unit == 0, op, ": K=", K, " must be a multiple of ", f.unit, " (K % ", f.unit,
              " == 0) for ", f.name);
  TORCH_CHECK(d.dim() == 3 && d.size(2) == GR && d.scalar_type() == at::kHalf, op, ": d must be float16 [groups, K/",
              f.unit, ", 16]");
  const int64_t groups = d.size(0), units = K / f.unit;
  TORCH_CHECK(d.size(1) == units, op, ": K=", K, " does not match the weight's ", d.size(1), " units of ", f.unit);
  TORCH_CHECK(!f.m || (m.has_value() && m->sizes() == d.sizes() && m->scalar_type() == at::kHalf), op, ": a ",
              f.name, " weight needs m shaped like d");
  TORCH_CHECK(scale_stride(d, f.m ? m : c10::nullopt) != 0, op,
              ": d (and m) must be contiguous, or d and m the halves of one [groups, units, 2, 16] tensor");
  TORCH_CHECK(qs.is_contiguous() && qs.scalar_type() == at::kByte && qs.numel() == groups * units * f.unit_bytes,
              op, ": packed weight has the wrong shape");
  return groups;
}

// Calls of up to SCRATCH_ROWS rows (decode steps) quantize their activations into buffers
// the calling thread keeps: a step makes ~4 calls a layer, each of which otherwise
// allocated and freed four small tensors (docs/benchmarks.md, "AVX2 K-quants at one
// stream"). Larger calls (prefill) allocate, so no thread keeps a prompt's worth.
constexpr int64_t SCRATCH_ROWS = 64;
struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> off;
};

struct Call {  // one call's quantized activations and weight, as the kernels read them
  at::Tensor xq, xd, xs, off;  // the activations' memory where the call is too large for the scratch
  Act a;
  Packed w;
};

static Call prepare(const at::Tensor& x_in, const at::Tensor& qs, const at::Tensor& d,
                    const c10::optional<at::Tensor>& m, int64_t fmt, int64_t N, int64_t isa) {
  Call c;
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), nb = K / QK;
  const bool pieces = FORMATS[fmt].pieces;
  int8_t* q;
  float *xd, *xs;
  int32_t* off = nullptr;
  if (M <= SCRATCH_ROWS) {
    thread_local Scratch scratch;
    scratch.q.resize(std::max<size_t>(scratch.q.size(), M * K));
    scratch.d.resize(std::max<size_t>(scratch.d.size(), M * nb));
    scratch.s.resize(std::max<size_t>(scratch.s.size(), M * nb));
    if (pieces) scratch.off.resize(std::max<size_t>(scratch.off.size(), M * K / 16));
    q = scratch.q.data(), xd = scratch.d.data(), xs = scratch.s.data(), off = scratch.off.data();
  } else {
    c.xq = at::empty({M, K}, x.options().dtype(at::kChar));
    c.xd = at::empty({M, nb}, x.options().dtype(at::kFloat));
    c.xs = at::empty({M, nb}, x.options().dtype(at::kFloat));
    if (pieces) c.off = at::empty({M, K / 16}, x.options().dtype(at::kInt));
    q = c.xq.data_ptr<int8_t>(), xd = c.xd.data_ptr<float>(), xs = c.xs.data_ptr<float>();
    if (pieces) off = c.off.data_ptr<int32_t>();
  }
  quantize_rows(x, isa, q, xd, xs, pieces ? off : nullptr);
  c.a = {q, xd, xs, pieces ? off : nullptr, prefetch_weights(M)};
  const c10::optional<at::Tensor> mm = FORMATS[fmt].m ? m : c10::nullopt;
  c.w = {qs.data_ptr<uint8_t>(), d.data_ptr<c10::Half>(), mm ? mm->data_ptr<c10::Half>() : nullptr, nb, N, scale_stride(d, mm)};
  return c;
}

// out [M, n] (dtype of x) = x @ dequant(w).T, the weight packed (formats.h): qs uint8
// [groups, units * unit bytes], d (and m where the format has one) float16 [groups, units,
// 16] (or d and m interleaved: scale_stride), with groups = ceil(n / 16).
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                   const c10::optional<at::Tensor>& m, int64_t fmt, int64_t n, int64_t isa) {
  ZS_PIECE("qlinear");
  const int64_t groups = check_weight(x, qs, d, m, fmt, "qlinear");
  TORCH_CHECK(n > (groups - 1) * GR && n <= groups * GR, "qlinear: ", n, " outputs do not fit ", groups, " groups");
  const int64_t M = x.size(0), nb = x.size(1) / QK;
  isa = clamp_isa(isa);
  at::Tensor out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  const Call c = prepare(x, qs, d, m, fmt, n, isa);
  const GroupsFn kernel = groups_for(fmt, isa);
  const Out o{out.data_ptr(), out.scalar_type() == at::kBFloat16};
  // tasks of whole group pairs, each above ~2k block dots, so a 576-row GEMV still splits
  const int64_t pairs = (groups + 1) / 2;
  const int64_t grain = std::max<int64_t>(1, 2048 / std::max<int64_t>(1, 2 * GR * M * nb / 4));
  zs_team::parallel_for(0, pairs, grain, [&](int64_t p0, int64_t p1) {
    kernel(c.a, c.w, M, o, 2 * p0, std::min(groups, 2 * p1));
  });
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

ZS_TARGET_AVX512 static float max16_avx512(const float* x, int64_t n, bool& nan) {
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

// int64 [M]: argmax over the first n of qlinear(x, qs, d, m, fmt, ...)'s outputs (n <= the
// weight's groups x 16).
at::Tensor qlinear_argmax(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                          const c10::optional<at::Tensor>& m, int64_t fmt, int64_t n, int64_t isa) {
  const int64_t groups = check_weight(x, qs, d, m, fmt, "qlinear_argmax");
  TORCH_CHECK(n > 0 && n <= groups * GR, "qlinear_argmax: ", n, " outputs asked of a weight of ", groups * GR);
  const int64_t M = x.size(0), used = (n + GR - 1) / GR, units = x.size(1) / FORMATS[fmt].unit;
  isa = clamp_isa(isa);
  at::Tensor idx = at::empty({M}, x.options().dtype(at::kLong));
  if (M == 0) return idx;
  const Call call = prepare(x, qs, d, m, fmt, n, isa);
  const GroupsFn kernel = groups_for(fmt, isa);
  const int64_t gq = units * FORMATS[fmt].unit_bytes, gd = units * call.w.ds;  // a group's bytes, scales
  const int64_t chunks = (used + ARGMAX_GROUPS - 1) / ARGMAX_GROUPS;
  std::vector<RowBest> part(chunks * M);  // a task's rows at its first chunk's slot
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    zs_team::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      std::vector<T> out(M * ARGMAX_GROUPS * GR);
      std::vector<float> tmp(std::is_same_v<T, float> ? 0 : ARGMAX_GROUPS * GR);
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t g0 = c * ARGMAX_GROUPS, g1 = std::min(used, g0 + ARGMAX_GROUPS);
        const int64_t cols = std::min(n, g1 * GR) - g0 * GR;
        const Packed w{call.w.q + g0 * gq, call.w.d + g0 * gd, call.w.m ? call.w.m + g0 * gd : nullptr,
                       call.w.nb, cols, call.w.ds};
        kernel(call.a, w, M, Out{out.data(), std::is_same_v<T, c10::BFloat16>}, 0, g1 - g0);
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
