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
// the reference the others are tested against), AVX2 (maddubs + madd, 32 inputs per op)
// and AVX-512 VNNI (dpbusd over two blocks per register). Work splits over output columns
// with at::parallel_for (torch's OpenMP pool); within a thread a tile of RM activation rows
// x RN weight rows keeps the unpacked weights in registers across the rows of the batch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t QK = 32;
enum Isa : int64_t { SCALAR = 0, AVX2 = 1, AVX512 = 2 };
enum Fmt : int64_t { Q4 = 0, Q8 = 1 };  // Q4: nibbles + d + m; Q8: int8 + d

struct Act {  // activations quantized per block of 32
  const int8_t* q;  // [M, K]
  const float* d;   // [M, nb]
  const float* s;   // [M, nb]: d * sum(q)
};

struct Weight {
  const uint8_t* q;  // [N, K/2] nibbles (Q4) or [N, K] int8 (Q8)
  const float* d;    // [N, nb]
  const float* m;    // [N, nb] (Q4 only)
  int64_t row_bytes;
};

struct Problem {
  Act x;
  Weight w;
  int64_t M, N, nb;
};

template <typename T>
inline void store(T* out, float v) {
  *out = static_cast<T>(v);
}

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

// ---------------------------------------------------------------- AVX2

#define ZS_AVX2 __attribute__((target("avx2,fma,f16c")))

ZS_AVX2 inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

ZS_AVX2 inline float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
  float r = hsum_avx2(acc);
  for (; k < n; ++k) r += a[k] * b[k];
  return r;
}

ZS_AVX2 inline __m256 load8_avx2(const float* x) { return _mm256_loadu_ps(x); }
ZS_AVX2 inline __m256 load8_avx2(const c10::BFloat16* x) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <typename T>
ZS_AVX2 void quantize_row_avx2(const T* x, int64_t nb, int8_t* q, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < nb; ++b) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = load8_avx2(x + b * QK + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float db = _mm_cvtss_f32(m4) / 127.f;
    const __m256 id = _mm256_set1_ps(db > 0.f ? 1.f / db : 0.f);
    __m256i i32[4];
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      i32[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      sum = _mm256_add_epi32(sum, i32[j]);
    }
    // pack 4 x 8 int32 -> 32 int8; packs work per 128-bit lane, the permute restores order
    __m256i p16a = _mm256_packs_epi32(i32[0], i32[1]);
    __m256i p16b = _mm256_packs_epi32(i32[2], i32[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * QK), p8);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    d[b] = db;
    s[b] = db * static_cast<float>(_mm_cvtsi128_si32(s4));
  }
}

ZS_AVX2 inline __m256i unpack_q4_avx2(const uint8_t* p) {  // 16 bytes -> 32 values in order
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

ZS_AVX2 inline __m256 dot_u8s8_avx2(__m256i u, __m256i s) {  // 32 u8*s8 -> 8 float partials
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

template <int FMT, int RM, int RN, typename T>
ZS_AVX2 void tile_avx2(const Problem& p, T* out, int64_t i0, int64_t n0) {
  __m256 acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) acc[i][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < p.nb; ++b) {
    __m256i w[RN], ws[RN];  // unsigned weight bytes; for Q8 |w| and w (for its signs)
    __m256 dw[RN];
    for (int r = 0; r < RN; ++r) {
      const uint8_t* row = p.w.q + (n0 + r) * p.w.row_bytes;
      if constexpr (FMT == Q4) {
        w[r] = unpack_q4_avx2(row + b * 16);
      } else {
        ws[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * QK));
        w[r] = _mm256_sign_epi8(ws[r], ws[r]);
      }
      dw[r] = _mm256_set1_ps(p.w.d[(n0 + r) * p.nb + b]);
    }
    for (int i = 0; i < RM; ++i) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.x.q + (i0 + i) * p.nb * QK + b * QK));
      const __m256 dx = _mm256_set1_ps(p.x.d[(i0 + i) * p.nb + b]);
      for (int r = 0; r < RN; ++r) {
        const __m256 t = FMT == Q4 ? dot_u8s8_avx2(w[r], x) : dot_u8s8_avx2(w[r], _mm256_sign_epi8(x, ws[r]));
        acc[i][r] = _mm256_fmadd_ps(t, _mm256_mul_ps(dw[r], dx), acc[i][r]);
      }
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) {
      float v = hsum_avx2(acc[i][r]);
      if constexpr (FMT == Q4) v += dot_f32_avx2(p.w.m + (n0 + r) * p.nb, p.x.s + (i0 + i) * p.nb, p.nb);
      store(out + (i0 + i) * p.N + n0 + r, v);
    }
}

// ---------------------------------------------------------------- AVX-512 VNNI

#define ZS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

ZS_AVX512 inline float hsum_avx512(__m512 v) { return _mm512_reduce_add_ps(v); }

ZS_AVX512 inline __m512i load64_avx512(const void* p, bool two) {
  return two ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, p);
}

// [a0 x8, a1 x8] from two consecutive floats (a1 = 0 when `two` is false)
ZS_AVX512 inline __m512 pair_avx512(const float* p, bool two) {
  const __m128 t = _mm_maskz_loadu_ps(two ? 0x3 : 0x1, p);
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(t));
}

// 8-bit weights, two blocks per 64-byte register (the signs of w moved onto x, as dpbusd
// multiplies unsigned by signed bytes).
template <int FMT, int RM, int RN, typename T>
ZS_AVX512 void tile_avx512(const Problem& p, T* out, int64_t i0, int64_t n0) {
  static_assert(FMT == Q8, "4-bit weights take tile_avx512_q4g");
  __m512 acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < p.nb; b += 2) {
    const bool two = b + 1 < p.nb;
    __m512i w[RN];
    __mmask64 neg[RN];
    __m512 dw[RN];
    for (int r = 0; r < RN; ++r) {
      const uint8_t* row = p.w.q + (n0 + r) * p.w.row_bytes;
      const __m512i ws = load64_avx512(row + b * QK, two);
      neg[r] = _mm512_movepi8_mask(ws);
      w[r] = _mm512_abs_epi8(ws);
      dw[r] = pair_avx512(p.w.d + (n0 + r) * p.nb + b, two);
    }
    for (int i = 0; i < RM; ++i) {
      const __m512i x = load64_avx512(p.x.q + (i0 + i) * p.nb * QK + b * QK, two);
      const __m512 dx = pair_avx512(p.x.d + (i0 + i) * p.nb + b, two);
      for (int r = 0; r < RN; ++r) {
        const __m512i xs = _mm512_mask_sub_epi8(x, neg[r], _mm512_setzero_si512(), x);
        const __m512 t = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w[r], xs));
        acc[i][r] = _mm512_fmadd_ps(t, _mm512_mul_ps(dw[r], dx), acc[i][r]);
      }
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) store(out + (i0 + i) * p.N + n0 + r, hsum_avx512(acc[i][r]));
}

// 4-bit weights, four blocks per step. A 64-byte load holds four blocks' nibbles: its low
// nibbles are elements 0-15 of each block, its high nibbles elements 16-31, so two ANDs
// and a shift unpack 128 weights. The activations of a 4-bit AVX-512 call are stored to
// match (see group_row): per group of up to four blocks, first every block's elements
// 0-15, then every block's 16-31. Each dpbusd pair leaves four int32 lanes per block,
// scaled by [d_b x4 | d_b+1 x4 | ...]. A short last group is loaded with masks.
template <int RM, int RN, typename T>
ZS_AVX512 void tile_avx512_q4g(const Problem& p, T* out, int64_t i0, int64_t n0) {
  __m512 acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) acc[i][r] = _mm512_setzero_ps();
  const __m512i idx4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < p.nb; b += 4) {
    const int64_t nt = std::min<int64_t>(4, p.nb - b);
    const __mmask64 bytes = nt == 4 ? ~0ull : (1ull << (16 * nt)) - 1;
    const __mmask8 lanes = static_cast<__mmask8>((1u << nt) - 1);
    __m512i lo[RN], hi[RN];
    __m512 dw[RN];
    for (int r = 0; r < RN; ++r) {
      const __m512i v = _mm512_maskz_loadu_epi8(bytes, p.w.q + (n0 + r) * p.w.row_bytes + b * 16);
      lo[r] = _mm512_and_si512(v, nib);
      hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      dw[r] = _mm512_permutexvar_ps(idx4, _mm512_zextps128_ps512(_mm_maskz_loadu_ps(lanes, p.w.d + (n0 + r) * p.nb + b)));
    }
    for (int i = 0; i < RM; ++i) {
      const int8_t* xr = p.x.q + (i0 + i) * p.nb * QK + b * QK;
      const __m512i xlo = _mm512_maskz_loadu_epi8(bytes, xr);
      const __m512i xhi = _mm512_maskz_loadu_epi8(bytes, xr + 16 * nt);
      const __m512 dx = _mm512_permutexvar_ps(idx4, _mm512_zextps128_ps512(_mm_maskz_loadu_ps(lanes, p.x.d + (i0 + i) * p.nb + b)));
      for (int r = 0; r < RN; ++r) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[r], xlo), hi[r], xhi);
        acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], dx), acc[i][r]);
      }
    }
  }
  for (int i = 0; i < RM; ++i)
    for (int r = 0; r < RN; ++r) {
      const float v = hsum_avx512(acc[i][r]) + dot_f32_avx2(p.w.m + (n0 + r) * p.nb, p.x.s + (i0 + i) * p.nb, p.nb);
      store(out + (i0 + i) * p.N + n0 + r, v);
    }
}

// One quantized activation row, rearranged for tile_avx512_q4g: per group of up to four
// blocks, the first halves of its blocks, then their second halves.
void group_row(int8_t* q, int64_t nb) {
  int8_t tmp[4 * QK];
  for (int64_t b = 0; b < nb; b += 4) {
    const int64_t nt = std::min<int64_t>(4, nb - b);
    int8_t* g = q + b * QK;
    for (int64_t j = 0; j < nt; ++j) {
      std::memcpy(tmp + j * 16, g + j * QK, 16);
      std::memcpy(tmp + nt * 16 + j * 16, g + j * QK + 16, 16);
    }
    std::memcpy(g, tmp, static_cast<size_t>(nt * QK));
  }
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

template <typename T>
struct Avx512GroupedTile {
  template <int rm, int rn>
  static void run(const Problem& p, T* out, int64_t i0, int64_t n0) { tile_avx512_q4g<rm, rn>(p, out, i0, n0); }
};

template <int FMT, typename T>
struct Avx512Tile {
  template <int rm, int rn>
  static void run(const Problem& p, T* out, int64_t i0, int64_t n0) { tile_avx512<FMT, rm, rn>(p, out, i0, n0); }
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
    if (isa == AVX512) {
      if constexpr (FMT == Q4) Tiler<FMT, 3, RN, T, Avx512GroupedTile<T>>::cols(p, out, n0, n1);
      else Tiler<FMT, 4, RN, T, Avx512Tile<FMT, T>>::cols(p, out, n0, n1);
    }
    else if (isa == AVX2) {
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
void quantize_rows(const T* x, int64_t M, int64_t nb, int64_t isa, bool grouped, int8_t* q, float* d, float* s) {
  const int64_t K = nb * QK;
  at::parallel_for(0, M, std::max<int64_t>(1, 256 / nb), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (isa >= AVX2) quantize_row_avx2(x + i * K, nb, q + i * K, d + i * nb, s + i * nb);
      else quantize_row_scalar(x + i * K, nb, q + i * K, d + i * nb, s + i * nb);
      if (grouped) group_row(q + i * K, nb);
    }
  });
}

// x [M, K] float32/bfloat16 -> (q int8 [M, K], d [M, K/32], s [M, K/32]); `grouped`: q in
// tile_avx512_q4g's order (the quantize_act op returns the natural order)
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_act_impl(const at::Tensor& x_in, int64_t isa, bool grouped) {
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
    quantize_rows(x.data_ptr<float>(), M, nb, isa, grouped, q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<float>());
  else
    quantize_rows(x.data_ptr<c10::BFloat16>(), M, nb, isa, grouped, q.data_ptr<int8_t>(), d.data_ptr<float>(),
                  s.data_ptr<float>());
  return {q, d, s};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_act(const at::Tensor& x, int64_t isa) {
  return quantize_act_impl(x, isa, false);
}

// out [M, N] (dtype of x) = x @ dequant(w).T: qs [N, K/2] uint8 (fmt 0) or [N, K] int8
// (fmt 1), d [N, K/32] float32, m [N, K/32] float32 (fmt 0).
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
  auto [xq, xd, xs] = quantize_act_impl(x, isa, fmt == Q4 && isa == AVX512);
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

int64_t cpu_isa() { return best_isa(); }

}  // namespace

TORCH_LIBRARY(zeroserve, lib) {
  lib.def("qlinear(Tensor x, Tensor qs, Tensor d, Tensor? m, int fmt, int isa) -> Tensor");
  lib.def("quantize_act(Tensor x, int isa) -> (Tensor, Tensor, Tensor)");
  lib.def("cpu_isa() -> int", &cpu_isa);
}

TORCH_LIBRARY_IMPL(zeroserve, CPU, lib) {
  lib.impl("qlinear", &qlinear);
  lib.impl("quantize_act", &quantize_act);
}
