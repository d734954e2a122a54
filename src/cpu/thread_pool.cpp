// Workers wait on a generation counter: the caller publishes a loop (function, task count), bumps the
// generation, and every thread, the caller included, claims tasks from a shared atomic counter until none are
// left. Decode runs a few hundred short loops per token, so workers spin briefly before sleeping (a futex wait
// through std::atomic::wait); a sleeping pool costs nothing when the engine is idle.
#include "cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace sparrow::cpu {
namespace {

// Polls before a waiting thread goes to sleep; about 20-50 microseconds on current x86 cores.
constexpr int kSpinPolls = 1 << 14;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// True while this thread runs a task; a nested parallel_for then runs inline instead of deadlocking.
thread_local bool t_inside_task = false;

}  // namespace

struct ThreadPool::State {
  std::vector<std::thread> workers;
  std::atomic<uint64_t> generation{0};  // bumped once per published loop; also the stop signal
  std::atomic<bool> stopping{false};
  std::atomic<int> running_workers{0};  // workers still inside the current loop
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

  void worker_loop(int thread) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t now = generation.load(std::memory_order_acquire);
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
      run_tasks(thread);
      if (running_workers.fetch_sub(1, std::memory_order_acq_rel) == 1) running_workers.notify_one();
    }
  }

  void wait_for_workers() {
    int left = running_workers.load(std::memory_order_acquire);
    for (int i = 0; left != 0 && i < kSpinPolls; ++i) {
      cpu_relax();
      left = running_workers.load(std::memory_order_acquire);
    }
    while (left != 0) {
      running_workers.wait(left, std::memory_order_acquire);
      left = running_workers.load(std::memory_order_acquire);
    }
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
  s.fn = &fn;
  s.n_tasks = n_tasks;
  s.first_error = nullptr;
  s.next_task.store(0, std::memory_order_relaxed);
  s.running_workers.store(int(s.workers.size()), std::memory_order_relaxed);
  s.generation.fetch_add(1, std::memory_order_release);
  s.generation.notify_all();
  s.run_tasks(0);
  s.wait_for_workers();
  if (s.first_error) std::rethrow_exception(s.first_error);
}

}  // namespace sparrow::cpu
