#pragma once
// A fixed pool of worker threads that runs one parallel loop at a time; the calling thread takes part.
#include <cstdint>
#include <functional>
#include <memory>

namespace sparrow::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: hardware concurrency
  ~ThreadPool();
  int size() const { return n_threads_; }
  // Calls fn(task, thread) for task in [0, n_tasks), spread over the threads; returns when all are done.
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t task, int thread)>& fn);

 private:
  struct State;
  int n_threads_;
  std::unique_ptr<State> state_;
};

}  // namespace sparrow::cpu
