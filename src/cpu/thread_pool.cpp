// The caller publishes a loop (function, task count) as a "job", wakes the workers, and every thread, the
// caller included, claims tasks from a shared atomic counter until none are left.
//
// A worker takes part only by joining the job while it is open; when the caller has run out of tasks it
// closes the job and waits just for the workers that joined. So a worker that the OS has not scheduled yet
// (a busy machine) never delays the loop: it wakes later, finds the job closed, and goes back to waiting.
// Decode runs a few hundred short loops per token, so waiting threads spin briefly before they sleep (a
// futex wait through std::atomic::wait); a sleeping pool costs nothing when the engine is idle.
#include "cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace sparrow::cpu {
namespace {

// Polls before a waiting thread goes to sleep; tens of microseconds on current cores.
constexpr int kSpinPolls = 1 << 14;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Job word: generation in the high 32 bits, then an "open" bit, then the number of workers inside.
constexpr uint64_t kOpen = uint64_t(1) << 31;
constexpr uint64_t kActiveMask = kOpen - 1;
constexpr uint64_t job_word(uint32_t generation, bool open) { return (uint64_t(generation) << 32) | (open ? kOpen : 0); }
constexpr uint32_t generation_of(uint64_t job) { return uint32_t(job >> 32); }

// True while this thread runs a task; a nested parallel_for then runs inline instead of deadlocking.
thread_local bool t_inside_task = false;

}  // namespace

struct ThreadPool::State {
  std::vector<std::thread> workers;
  std::atomic<uint32_t> generation{0};  // bumped per published job; workers sleep on it
  std::atomic<uint64_t> job{0};          // see job_word
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> next_task{0};
  int64_t n_tasks = 0;
  const std::function<void(int64_t, int)>* fn = nullptr;
  std::mutex error_mutex;
  std::exception_ptr first_error;

  void run_tasks(int thread) {
    t_inside_task = true;
    for (;;) {
      const int64_t task = next_task.fetch_add(1, std::memory_order_relaxed);
      if (task >= n_tasks) break;
      try {
        (*fn)(task, thread);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        next_task.store(n_tasks, std::memory_order_relaxed);  // stop handing out work
      }
    }
    t_inside_task = false;
  }

  // Joins the job of `gen` if it is still open; false if it is closed or already replaced.
  bool join(uint32_t gen) {
    uint64_t word = job.load(std::memory_order_acquire);
    for (;;) {
      if (generation_of(word) != gen || !(word & kOpen)) return false;
      if (job.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel)) return true;
    }
  }

  void leave() {
    const uint64_t word = job.fetch_sub(1, std::memory_order_acq_rel) - 1;
    if ((word & kActiveMask) == 0 && !(word & kOpen)) job.notify_all();
  }

  void worker_loop(int thread) {
    uint32_t seen = 0;
    for (;;) {
      uint32_t now = generation.load(std::memory_order_acquire);
      for (int i = 0; now == seen && i < kSpinPolls; ++i) {
        cpu_relax();
        now = generation.load(std::memory_order_acquire);
      }
      while (now == seen) {
        generation.wait(seen, std::memory_order_acquire);
        now = generation.load(std::memory_order_acquire);
      }
      seen = now;
      if (stopping.load(std::memory_order_acquire)) return;
      if (join(now)) {
        run_tasks(thread);
        leave();
      }
    }
  }

  // Closes the job so that no more workers join, then waits for those inside.
  void close_and_wait(uint32_t gen) {
    uint64_t word = job.load(std::memory_order_acquire);
    while (!job.compare_exchange_weak(word, word & ~kOpen, std::memory_order_acq_rel)) {
    }
    word &= ~kOpen;
    for (int i = 0; (word & kActiveMask) != 0 && i < kSpinPolls; ++i) {
      cpu_relax();
      word = job.load(std::memory_order_acquire);
    }
    while ((word & kActiveMask) != 0) {
      job.wait(word, std::memory_order_acquire);
      word = job.load(std::memory_order_acquire);
    }
    (void)gen;
  }
};

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(n_threads > 0 ? n_threads : int(std::max(1u, std::thread::hardware_concurrency()))),
      state_(std::make_unique<State>()) {
  for (int t = 1; t < n_threads_; ++t) {
    state_->workers.emplace_back([state = state_.get(), t] { state->worker_loop(t); });
  }
}

ThreadPool::~ThreadPool() {
  state_->stopping.store(true, std::memory_order_release);
  state_->generation.fetch_add(1, std::memory_order_release);
  state_->generation.notify_all();
  for (auto& w : state_->workers) w.join();
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t task, int thread)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1 || t_inside_task) {
    for (int64_t task = 0; task < n_tasks; ++task) fn(task, 0);
    return;
  }
  State& s = *state_;
  // No worker is inside a job here (the previous call waited for them), so the job fields are ours.
  const uint32_t gen = s.generation.load(std::memory_order_relaxed) + 1;
  s.fn = &fn;
  s.n_tasks = n_tasks;
  s.first_error = nullptr;
  s.next_task.store(0, std::memory_order_relaxed);
  s.job.store(job_word(gen, true), std::memory_order_release);
  s.generation.store(gen, std::memory_order_release);
  s.generation.notify_all();
  s.run_tasks(0);
  s.close_and_wait(gen);
  if (s.first_error) std::rethrow_exception(s.first_error);
}

}  // namespace sparrow::cpu
