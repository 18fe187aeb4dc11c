// The team of a decode step (zs_team.h).
#include "zs_team.h"

#include <c10/util/Exception.h>
#include <immintrin.h>
#include <omp.h>
#include <sched.h>

#ifdef ZS_TEAM_STATS
#include <x86intrin.h>

#include <cstdio>
#include <cstring>
#endif

namespace zs_team {
namespace {

thread_local Team* tls_team = nullptr;

#ifdef ZS_TEAM_STATS  // a measuring build only (docs/benchmarks.md, "Two threads in the decode step")
struct Stats {
  uint64_t steps = 0, tasks = 0, region = 0, caller_work = 0, caller_wait = 0, helper_work = 0;
  ~Stats() {
    if (steps)
      std::fprintf(stderr, "zs_team: %llu steps, %.1f tasks a step; Mcycles a step: region %.3f, caller's chunks %.3f, "
                   "caller waiting %.3f, helpers' chunks %.3f\n", (unsigned long long)steps, double(tasks) / steps,
                   region / 1e6 / steps, caller_work / 1e6 / steps, caller_wait / 1e6 / steps, helper_work / 1e6 / steps);
  }
} stats;

// the calling thread's cycles in Team::run (chunks, waits) and in closed pieces, and the
// totals per piece name
thread_local uint64_t tl_work = 0, tl_wait = 0, tl_inner = 0;
struct PieceTotals {
  static constexpr int N = 32;
  const char* name[N] = {};
  uint64_t serial[N] = {}, work[N] = {}, wait[N] = {}, calls[N] = {}, least[N] = {};  // least: a call's fewest cycles
  int slot(const char* n) {
    int i = 0;
    while (i < N && name[i] != nullptr && std::strcmp(name[i], n) != 0) ++i;
    if (i < N && name[i] == nullptr) name[i] = n;
    return i < N ? i : N - 1;
  }
  ~PieceTotals() {
    if (stats.steps == 0) return;
    for (int i = 0; i < N && name[i] != nullptr; ++i)
      std::fprintf(stderr, "zs_team: %-16s Mcycles a step: serial %.3f, chunks %.3f, waiting %.3f (%.1f calls; "
                   "the fastest %.1f kcycles)\n", name[i], serial[i] / 1e6 / stats.steps, work[i] / 1e6 / stats.steps,
                   wait[i] / 1e6 / stats.steps, double(calls[i]) / stats.steps, least[i] / 1e3);
  }
} pieces;
#define ZS_STAT(x) x
#else
#define ZS_STAT(x)
#endif

// One turn of a wait: a pause, and past ~100 us of them the CPU yielded (a machine with
// more runnable threads than CPUs: the thread waited on may be the one descheduled).
inline void relax(int64_t& spins) {
  if (++spins < 4096) _mm_pause();
  else sched_yield();
}

}  // namespace

Team* current() { return tls_team; }

#ifdef ZS_TEAM_STATS
Piece::Piece(const char* name) : name_(tls_team ? name : nullptr), t0_(__rdtsc()), inner0_(tl_inner), work0_(tl_work), wait0_(tl_wait) {}

Piece::~Piece() {
  if (name_ == nullptr) return;  // outside a team's step
  const uint64_t all = __rdtsc() - t0_, work = tl_work - work0_, wait = tl_wait - wait0_;
  const uint64_t serial = all - work - wait - (tl_inner - inner0_);
  const int i = pieces.slot(name_);
  pieces.serial[i] += serial, pieces.work[i] += work, pieces.wait[i] += wait, pieces.calls[i]++;
  const uint64_t own = all - (tl_inner - inner0_);  // the call less the pieces nested in it
  if (pieces.least[i] == 0 || own < pieces.least[i]) pieces.least[i] = own;
  tl_inner += serial;  // an enclosing piece counts this one's cycles as its own tasks'
}
#endif

int64_t Team::claim(uint64_t gen) {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    const int64_t claimed = s & 0xffff, chunks = (s >> 16) & 0xffff;
    if ((s >> 32) != gen || claimed >= chunks) return -1;
    if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) return claimed;
  }
}

void Team::run_chunk(int64_t i) {
  const int64_t b = begin_ + i * chunk_;
  try {
    fn_(ctx_, b, std::min(end_, b + chunk_));
  } catch (...) {
    if (!error_set_.test_and_set()) error_ = std::current_exception();
  }
  done_.fetch_add(1, std::memory_order_release);
}

void Team::run(Fn f, const void* ctx, int64_t b, int64_t e, int64_t chunk) {
  const int64_t chunks = (e - b + chunk - 1) / chunk;
  TORCH_CHECK(chunks >= 1 && chunks < 0x10000, "zs_team: ", chunks, " chunks");
  fn_ = f, ctx_ = ctx, begin_ = b, end_ = e, chunk_ = chunk;
  done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = (state_.load(std::memory_order_relaxed) >> 32) + 1;
  state_.store(gen << 32 | static_cast<uint64_t>(chunks) << 16, std::memory_order_release);
  ZS_STAT(const uint64_t t0 = __rdtsc());
  for (int64_t i; (i = claim(gen)) >= 0;) run_chunk(i);
  ZS_STAT(const uint64_t t1 = __rdtsc());
  for (int64_t spins = 0; done_.load(std::memory_order_acquire) != chunks;) relax(spins);
  ZS_STAT(const uint64_t t2 = __rdtsc(); stats.tasks++; stats.caller_work += t1 - t0; stats.caller_wait += t2 - t1;
          tl_work += t1 - t0; tl_wait += t2 - t1);
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    error_set_.clear();
    std::rethrow_exception(error);
  }
}

void Team::serve() {
  for (uint64_t seen = 0;;) {
    uint64_t gen;
    for (int64_t spins = 0; (gen = state_.load(std::memory_order_acquire) >> 32) == seen;) relax(spins);
    seen = gen;
    if (stopping_.load(std::memory_order_relaxed)) return;
    ZS_STAT(const uint64_t t0 = __rdtsc());
    for (int64_t i; (i = claim(gen)) >= 0;) run_chunk(i);
    ZS_STAT(stats.helper_work += __rdtsc() - t0);  // one helper in the measured runs
  }
}

void Team::stop() {
  stopping_.store(true, std::memory_order_relaxed);
  const uint64_t gen = (state_.load(std::memory_order_relaxed) >> 32) + 1;
  state_.store(gen << 32, std::memory_order_release);
}

void with_team(const std::function<void()>& step) {
  if (tls_team != nullptr || at::in_parallel_region() || at::get_num_threads() < 2) return step();
  Team team;
  std::exception_ptr error;
  // no num_threads clause: torch's own regions avoid it (libgomp's pool, pytorch#32008);
  // the team is whatever threads the region has
#pragma omp parallel
  {
    if (omp_get_thread_num() == 0) {
      team.set_size(omp_get_num_threads());
      tls_team = &team;
      ZS_STAT(const uint64_t t0 = __rdtsc());
      try {
        step();
      } catch (...) {
        error = std::current_exception();
      }
      ZS_STAT(stats.steps++; stats.region += __rdtsc() - t0);
      tls_team = nullptr;
      team.stop();
    } else {
      team.serve();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace zs_team
