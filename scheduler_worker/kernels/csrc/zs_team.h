// A decode step's threads held in one OpenMP region for the whole step (decode_layers):
// the calling thread runs the step and, at each op's split, hands the other threads their
// shares through two cache lines instead of an `omp parallel` fork/join per op (~10 a
// layer; each costs several microseconds on a VM, a handoff a fraction of one: the figures
// in docs/benchmarks.md, "Two threads in the decode step"). The waiting threads spin, as
// libgomp's do between regions, and yield the CPU when a wait runs long.
//
// zs_team::parallel_for splits a range into up to CHUNKS_PER_THREAD chunks a thread, none
// under the grain; outside a team it is at::parallel_for. Every op split here computes each
// output in one chunk whatever the split (qlinear's groups, attention's runs and heads, rows;
// qlinear_argmax merges its chunks in order), so any split gives the same bits. Each chunk
// goes to whichever thread claims it first: a helper that another process holds off its CPU
// leaves its chunks to the caller instead of stalling the step (docs/benchmarks.md, "Served
// and in-process at 8 streams (issue 56), eleventh session"), and a thread whose chunks ran
// slower takes fewer (one chunk a thread left the caller waiting ~10% of an 8-row step:
// "The team's chunks, fourteenth session").
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>

namespace zs_team {

class Team {
 public:
  using Fn = void (*)(const void* ctx, int64_t b, int64_t e);
  int64_t size() const { return size_; }
  void set_size(int64_t size) { size_ = size; }  // by the caller, before its first run
  // f(ctx, ...) over chunks of `chunk` of [b, e) (fewer than 2^16 of them), each run by the
  // first thread to claim it, the caller included; returns once every chunk is done
  // (rethrowing a thread's exception).
  void run(Fn f, const void* ctx, int64_t b, int64_t e, int64_t chunk);
  void serve();  // a helper thread's loop, until stop()
  void stop();

 private:
  // Claims the next chunk of generation `gen`'s task: its index, or -1 when none is left
  // (or a newer task was posted).
  int64_t claim(uint64_t gen);
  void run_chunk(int64_t i);  // and counts it done

  // the posted task: generation << 32 | chunks << 16 | chunks claimed. A new generation is
  // posted only once every chunk of the last is done, so a claim of the current one may
  // read fn_ .. chunk_ (written before the post).
  alignas(64) std::atomic<uint64_t> state_{0};
  alignas(64) std::atomic<int64_t> done_{0};  // chunks of the posted task finished
  alignas(64) Fn fn_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t begin_ = 0, end_ = 0, chunk_ = 0;
  std::atomic<bool> stopping_{false};
  std::exception_ptr error_;
  std::atomic_flag error_set_ = ATOMIC_FLAG_INIT;
  int64_t size_ = 1;
};

// The team of the calling thread's step, if it is running one.
Team* current();

// Runs step() on the calling thread with the others of at::get_num_threads() held as its
// team; without a second thread (or inside a parallel region), step() alone.
void with_team(const std::function<void()>& step);

// How many chunks a team thread may take of one op: enough for the threads' speeds to even
// out, few enough that a chunk's setup (a thread's activation copy, its scratch) stays small.
constexpr int64_t CHUNKS_PER_THREAD = 4;

// [begin, end) in chunks of at least grain over the team's threads (at::parallel_for's
// split outside a team).
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  Team* t = current();
  if (t == nullptr) return at::parallel_for(begin, end, grain, f);
  if (begin >= end) return;
  const int64_t n = end - begin;
  if (n <= grain || n <= 1) return f(begin, end);
  const int64_t most = t->size() * CHUNKS_PER_THREAD;
  const int64_t chunks = grain > 0 ? std::min(most, (n + grain - 1) / grain) : std::min(most, n);
  t->run([](const void* c, int64_t b, int64_t e) { (*static_cast<const F*>(c))(b, e); }, &f, begin, end,
         (n + chunks - 1) / chunks);
}

#ifdef ZS_TEAM_STATS  // a measuring build: cycles of a named piece of the step, printed at exit
// On a team's calling thread: the piece's own cycles outside the team's tasks and the pieces
// nested in it (its serial work), its chunks' cycles and its waits for the helpers'.
class Piece {
 public:
  explicit Piece(const char* name);
  ~Piece();

 private:
  const char* name_;
  uint64_t t0_, inner0_, work0_, wait0_;
};
#define ZS_PIECE(name) const zs_team::Piece zs_piece_(name)
#else
#define ZS_PIECE(name)
#endif

// The threads an op's split may use: the team's, else at::get_num_threads().
inline int64_t num_threads() {
  const Team* t = current();
  return t != nullptr ? t->size() : at::get_num_threads();
}

}  // namespace zs_team
