// The AVX2 kernels of the formats it names (maddubs + madd; the tiles: q4_q8.h, q8_rows.h, kquant.h, q6k.h,
// codebook.h)
// and the AVX2 activation quantizer, which the AVX-512 and AMX kinds use too (the table in
// qlinear.cpp falls back to the next ISA down).
#include "codebook.h"
#include "kquant.h"
#include "q4_q8.h"
#include "q6k.h"
#include "q8_rows.h"

namespace zs_qgemm {

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


namespace avx2 {

void quantize(const void* x, bool bf16, int64_t nb, int8_t* q, float* d, float* s) {
  if (bf16) quantize_row_avx2(static_cast<const c10::BFloat16*>(x), nb, q, d, s);
  else quantize_row_avx2(static_cast<const float*>(x), nb, q, d, s);
}

template <int FMT, int RM, int H0 = 0, int H1 = 2, typename T>
static void tile(const Act& x, const Packed& w, T* out, int64_t i0, int64_t g, const Ahead& ahead) {
  if constexpr (FMT == Q4 || FMT == Q8) tile_avx2<FMT, RM, H0, H1>(x, w, out, i0, g, ahead);
  else if constexpr (FMT == Q6K) tile_q6_avx2<RM, H0, H1>(x, w, out, i0, g, ahead);
  else if constexpr (FMT == Q5 || FMT == Q50 || FMT == Q4K || FMT == Q5K) tile_kq_avx2<FMT, RM, H0, H1>(x, w, out, i0, g, ahead);
  else if constexpr (FMT == IQ4XS || FMT == IQ4NL) tile_codebook_avx2<FMT, RM, H0, H1>(x, w, out, i0, g, ahead);
  else static_assert(NO_TILES<FMT>, "no AVX2 tiles for this format");
}

// The formats whose tiles take one half of a group (8 output rows), whose registers then
// hold 4 activation rows.
template <int FMT>
constexpr bool HALVES = FMT != Q8;  // Q8 from 3 rows: q8_rows.h

// Half H of group g for M rows: tiles of 4 rows, then 2, then 1; the last one gets `last`.
template <int FMT, int H, typename T>
static void half_rows(const Act& x, const Packed& w, T* o, int64_t M, int64_t g, const Ahead& last) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) tile<FMT, 4, H, H + 1>(x, w, o, i, g, i + 4 == M ? last : Ahead{});
  if (i + 2 <= M) {
    tile<FMT, 2, H, H + 1>(x, w, o, i, g, i + 2 == M ? last : Ahead{});
    i += 2;
  }
  if (i < M) tile<FMT, 1, H, H + 1>(x, w, o, i, g, last);
}

// Q4_1, the 5-bit formats and Q6_K from UNPACK_MIN_ROWS rows: per group, every block's
// planes (the nibbles, with their fifth bit or top two bits ORed in: kquant.h, q6k.h)
// unpacked once into a thread's aligned buffer, and the tiles of rows then read them there.
// The row tiles unpack a half's planes once per tile of 4 rows, ~9 vector instructions a
// register (Q4_1: 3) against 16 maddubs + adds: at 8 rows twice, at a prompt's hundreds
// of rows a hundred times. Q4_1 gains least, from 16 rows (docs/benchmarks.md, "AVX2 Q4_1
// unpacked once per group"); Q4_K (3 instructions a register and a super-block's scales)
// ran no faster so (8 rows: 1.09x the time) and keeps the tiles, as on AVX-512
// (../avx512/panel.h). The integer sums and float operations are the tiles' own (Q4_1's:
// q4_q8.h's, in KQuantBlock), so the outputs are the same bits
// (tests/scheduler_worker/test_kquant_kernels.py, test_kernels.py).
template <int FMT>
constexpr bool UNPACKS = FMT == Q4 || FMT == Q5 || FMT == Q50 || FMT == Q5K || FMT == Q6K;
constexpr int64_t UNPACK_MIN_ROWS = 8;

template <int FMT, int RM, int H, typename T>
static void tile_unpacked(const Act& x, const Packed& w, T* o, int64_t i, int64_t g, const Ahead& a, const uint8_t* u) {
  if constexpr (FMT == Q6K) tile_q6_avx2<RM, H, H + 1, true>(x, w, o, i, g, a, u);
  else tile_kq_unpacked_avx2<FMT, RM, H, H + 1>(x, w, o, i, g, a, u);
}

template <int FMT, int H, typename T>
static void half_rows_unpacked(const Act& x, const Packed& w, T* o, int64_t M, int64_t g, const Ahead& last,
                               const uint8_t* u) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) tile_unpacked<FMT, 4, H>(x, w, o, i, g, i + 4 == M ? last : Ahead{}, u);
  if (i + 2 <= M) {
    tile_unpacked<FMT, 2, H>(x, w, o, i, g, i + 2 == M ? last : Ahead{}, u);
    i += 2;
  }
  if (i < M) tile_unpacked<FMT, 1, H>(x, w, o, i, g, last, u);
}

template <int FMT, typename T>
static void unpacked_groups(const Act& x, const Packed& w, int64_t M, T* o, int64_t g0, int64_t g1) {
  thread_local std::vector<uint8_t> planes;
  uint8_t* u = aligned_scratch(planes, w.nb * KQ_PLANE_BYTES);
  for (int64_t g = g0; g < g1; ++g) {
    const Ahead ahead =
        x.prefetch ? ahead_of(w.q, group_bytes<FMT>(w.nb), g + 1, std::min<int64_t>(1, g1 - g - 1), w.nb) : Ahead{};
    if constexpr (FMT == Q6K) q6_unpack_group(w, g, x.prefetch, u);
    else kq_unpack_group<FMT>(w, g, x.prefetch, u);
    half_rows_unpacked<FMT, 0>(x, w, o, M, g, Ahead{}, u);
    half_rows_unpacked<FMT, 1>(x, w, o, M, g, ahead, u);
  }
}

// Q8 from 3 rows: per half group, tiles of 4 rows then the rest (q8_rows.h), the
// activations widened to int16 here, once per call; from Q8_WIDE_MIN_ROWS rows the weights
// too, a group at a time into an aligned thread buffer (q8_widen_group), instead of once
// per tile of 4 rows.
constexpr int64_t Q8_WIDE_MIN_ROWS = 8;

template <bool WIDE, typename T>
static void q8_half(const Wide& xw, const Act& x, const Packed& w, T* o, int64_t M, int64_t g, int h,
                    const Ahead& ahead, const int16_t* wide) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) tile_q8_rows_avx2<4, WIDE>(xw, x, w, o, i, g, h, h == 1 && i + 4 == M ? ahead : Ahead{}, wide);
  const Ahead& a = h == 1 ? ahead : Ahead{};
  if (M - i == 3) tile_q8_rows_avx2<3, WIDE>(xw, x, w, o, i, g, h, a, wide);
  else if (M - i == 2) tile_q8_rows_avx2<2, WIDE>(xw, x, w, o, i, g, h, a, wide);
  else if (M - i == 1) tile_q8_rows_avx2<1, WIDE>(xw, x, w, o, i, g, h, a, wide);
}

template <typename T>
static void q8_groups(const Act& x, const Packed& w, int64_t M, T* o, int64_t g0, int64_t g1) {
  const int64_t nb = w.nb, K = nb * QK;
  thread_local std::vector<int16_t> q16;
  thread_local std::vector<int32_t> sums;
  thread_local std::vector<uint8_t> wide;
  q16.resize(M * K);
  sums.resize(M * nb);
  for (int64_t r = 0; r < M * nb; ++r) {
    int32_t t = 0;
    for (int j = 0; j < QK; ++j) t += q16[r * QK + j] = x.q[r * QK + j];
    sums[r] = t;
  }
  const Wide xw{q16.data(), sums.data()};
  const bool widen = M >= Q8_WIDE_MIN_ROWS;
  int16_t* u = widen ? reinterpret_cast<int16_t*>(aligned_scratch(wide, nb * Q8_WIDE_BLOCK * 2)) : nullptr;
  for (int64_t g = g0; g < g1; ++g) {
    const Ahead ahead =
        x.prefetch ? ahead_of(w.q, group_bytes<Q8>(nb), g + 1, std::min<int64_t>(1, g1 - g - 1), nb) : Ahead{};
    if (widen) q8_widen_group(w, g, x.prefetch, u);
    for (int h = 0; h < 2; ++h) {
      if (widen) q8_half<true>(xw, x, w, o, M, g, h, ahead, u);
      else q8_half<false>(xw, x, w, o, M, g, h, ahead, nullptr);
    }
  }
}

// Per group, tiles of 2 activation rows then 1, or from 4 rows on (Q8: 3) per half group
// tiles of up to 4; the group's last tile asks for the next group's weights (Ahead:
// ../../kernel.h) where there is more than one tile.
template <int FMT>
void groups(const Act& x, const Packed& w, int64_t M, Out out, int64_t g0, int64_t g1) {
  if constexpr (FMT == Q8)
    if (M >= 3) return with_out(out, [&](auto* o) { q8_groups(x, w, M, o, g0, g1); });
  if constexpr (UNPACKS<FMT>)
    if (M >= UNPACK_MIN_ROWS) return with_out(out, [&](auto* o) { unpacked_groups<FMT>(x, w, M, o, g0, g1); });
  with_out(out, [&](auto* o) {
    for (int64_t g = g0; g < g1; ++g) {
      const Ahead ahead = x.prefetch && M > 2
          ? ahead_of(w.q, group_bytes<FMT>(w.nb), g + 1, std::min<int64_t>(1, g1 - g - 1), w.nb)
          : Ahead{};
      if constexpr (HALVES<FMT>)
        if (M >= 4) {
          half_rows<FMT, 0>(x, w, o, M, g, Ahead{});
          half_rows<FMT, 1>(x, w, o, M, g, ahead);
          continue;
        }
      int64_t i = 0;
      for (; i + 2 <= M; i += 2) tile<FMT, 2>(x, w, o, i, g, i + 2 == M ? ahead : Ahead{});
      if (i < M) tile<FMT, 1>(x, w, o, i, g, ahead);
    }
  });
}

ZS_INSTANTIATE_EVERY_FORMAT

}  // namespace avx2
}  // namespace zs_qgemm
