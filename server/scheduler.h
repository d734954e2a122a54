#pragma once
// Continuous batching for `sparrow serve`: up to `parallel` requests decode together, one sequence each of a
// sparrow_batch (the C API's many-sequence context), in one forward pass per step. New requests join the running
// batch between steps; a long prompt goes in chunks, so that it does not stall the streams already running.
// Beyond the slots, a bounded queue; beyond that, submit refuses (the server's 503).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "openai.h"
#include "sparrow/sparrow.h"

namespace sparrow::server {

// What a request's handler receives from the scheduler, in order: text deltas, then one finish (or an error).
struct StreamEvent {
  enum class Kind { Text, Finish, Error } kind = Kind::Text;
  std::string text;           // Text: the new text (whole UTF-8 characters); Error: the message
  std::string finish_reason;  // Finish: "stop" (end of turn or a stop string) or "length"
  int32_t prompt_tokens = 0, completion_tokens = 0;
};

// One request's channel from the scheduler thread to its HTTP handler.
class Stream {
 public:
  void push(StreamEvent e);
  // The next event, waiting up to `timeout`; nothing when none came.
  std::optional<StreamEvent> next(std::chrono::milliseconds timeout);
  // The client is gone: the scheduler drops the request at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<StreamEvent> events_;
  std::atomic<bool> cancelled_ = false;
};

struct SchedulerOptions {
  int32_t parallel = 4;      // sequences decoded together
  int32_t queue_limit = 64;  // requests waiting for a slot
  int32_t prefill_chunk = 256;  // prompt tokens one request adds per step
};

// Counters for /metrics, read under the scheduler's lock.
struct SchedulerStats {
  uint64_t requests = 0, prompt_tokens = 0, completion_tokens = 0, decode_steps = 0;
  double busy_seconds = 0;  // time spent in forward passes
  double first_token_seconds_sum = 0;
  uint64_t first_tokens = 0;
  int32_t active = 0, queued = 0;
  size_t kv_bytes = 0;
};

class Scheduler {
 public:
  // model stays owned by the caller; params are each sequence's (n_ctx is each sequence's context).
  Scheduler(sparrow_model* model, const sparrow_context_params& params, const SchedulerOptions& options);
  ~Scheduler();  // stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a generation of `prompt` (token ids, BOS included). Throws HttpError 503 when the queue is full or the
  // scheduler is stopping, 400 when the prompt does not fit a sequence's context.
  std::shared_ptr<Stream> submit(std::vector<sparrow_token> prompt, const GenerationParams& params);
  // Stops taking requests, finishes every queued and running one (finish_reason "stop" with what it has), and
  // joins the thread.
  void stop();
  SchedulerStats stats() const;
  int32_t n_ctx() const { return n_ctx_; }

 private:
  struct Request;
  struct Slot;
  void loop();
  void admit();  // queued requests into free slots (under mutex_)
  void step();   // one forward pass over every active slot
  // After a step: the slot's next token, its text, stop strings and limits.
  void advance(Slot& slot);
  void finish(Slot& slot, const std::string& reason);

  sparrow_model* model_;
  SchedulerOptions options_;
  int32_t n_ctx_ = 0;
  sparrow_batch* batch_ = nullptr;
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<std::unique_ptr<Request>> queue_;
  std::vector<std::unique_ptr<Slot>> slots_;  // running requests
  bool stopping_ = false;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace sparrow::server
