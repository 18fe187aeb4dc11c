// The team of a decode step (zs_team.h).
#include "zs_team.h"

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

void Team::run(Fn f, const void* ctx, int64_t b, int64_t e, int64_t chunk) {
  fn_ = f, ctx_ = ctx, begin_ = b, end_ = e, chunk_ = chunk;
  pending_.store(size_ - 1, std::memory_order_relaxed);  // every helper answers, idle or not
  gen_.fetch_add(1, std::memory_order_release);
  std::exception_ptr mine;
  ZS_STAT(const uint64_t t0 = __rdtsc());
  try {
    f(ctx, b, std::min(e, b + chunk));
  } catch (...) {
    mine = std::current_exception();
  }
  ZS_STAT(const uint64_t t1 = __rdtsc());
  for (int64_t spins = 0; pending_.load(std::memory_order_acquire) != 0;) relax(spins);
  ZS_STAT(const uint64_t t2 = __rdtsc(); stats.tasks++; stats.caller_work += t1 - t0; stats.caller_wait += t2 - t1;
          tl_work += t1 - t0; tl_wait += t2 - t1);
  if (mine) std::rethrow_exception(mine);
  if (error_) {
    std::exception_ptr theirs = error_;
    error_ = nullptr;
    error_set_.clear();
    std::rethrow_exception(theirs);
  }
}

void Team::serve(int64_t tid) {
  for (uint64_t seen = 0;;) {
    uint64_t g;
    for (int64_t spins = 0; (g = gen_.load(std::memory_order_acquire)) == seen;) relax(spins);
    seen = g;
    if (stopping_) return;
    const int64_t b = begin_ + tid * chunk_;
    if (b < end_) {
      ZS_STAT(const uint64_t t0 = __rdtsc());
      try {
        fn_(ctx_, b, std::min(end_, b + chunk_));
      } catch (...) {
        if (!error_set_.test_and_set()) error_ = std::current_exception();
      }
      ZS_STAT(stats.helper_work += __rdtsc() - t0);  // one helper in the measured runs
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void Team::stop() {
  stopping_ = true;
  gen_.fetch_add(1, std::memory_order_release);
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
      team.serve(omp_get_thread_num());
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace zs_team
