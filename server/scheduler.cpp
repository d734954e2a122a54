#include "scheduler.h"

#include <algorithm>
#include <random>

namespace sparrow::server {
namespace {

using Clock = std::chrono::steady_clock;

bool continuation(char c) { return (uint8_t(c) & 0xC0) == 0x80; }

// The largest end' <= end such that s[0, end') does not end inside a UTF-8 character: text is streamed in whole
// characters, while a token's bytes may stop inside one.
size_t complete_end(const std::string& s, size_t end) {
  size_t b = end;
  while (b > 0 && b < s.size() && continuation(s[b])) --b;
  if (b < end) return b;
  size_t p = end;
  while (p > 0 && end - p < 3 && continuation(s[p - 1])) --p;
  if (p == 0) return end;
  const uint8_t lead = uint8_t(s[p - 1]);
  const size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
  return p - 1 + length > end ? p - 1 : end;
}

std::string piece(sparrow_model* model, sparrow_token token) {
  std::string out(32, '\0');
  int32_t n = sparrow_token_to_piece(model, token, 0, out.data(), int32_t(out.size()));
  if (n < 0 && n != INT32_MIN) {
    out.resize(size_t(-n));
    n = sparrow_token_to_piece(model, token, 0, out.data(), int32_t(out.size()));
  }
  out.resize(n < 0 ? 0 : size_t(n));
  return out;
}

}  // namespace

void Stream::push(StreamEvent e) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(e));
  }
  ready_.notify_one();
}

std::optional<StreamEvent> Stream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  StreamEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

struct Scheduler::Request {
  std::vector<sparrow_token> prompt;
  GenerationParams params;
  std::shared_ptr<Stream> stream;
  Clock::time_point submitted;
};

struct Scheduler::Slot {
  std::unique_ptr<Request> request;
  sparrow_seq seq = -1;
  sparrow_sampler* sampler = nullptr;
  size_t fed = 0;                 // prompt tokens decoded
  sparrow_token next_token = -1;  // the last sampled token, decoded at the next step
  int32_t generated = 0;
  std::string text;    // generated text
  size_t emitted = 0;  // bytes of text sent
  bool first_token = false;
  bool done = false;
};

Scheduler::Scheduler(sparrow_model* model, const sparrow_context_params& params, const SchedulerOptions& options)
    : model_(model), options_(options) {
  if (options.parallel < 1) throw HttpError(500, "parallel must be at least 1", "server_error");
  batch_ = sparrow_batch_new(model, params, options.parallel);
  if (!batch_) throw std::runtime_error(sparrow_last_error());
  // Serving needs one sequence's KV cache to fit: a probe sequence finds out now rather than at the first request.
  const sparrow_seq probe = sparrow_seq_open(batch_);
  if (probe < 0) {
    const std::string why = sparrow_last_error();
    sparrow_batch_free(batch_);
    throw std::runtime_error(why);
  }
  sparrow_seq_close(batch_, probe);
  n_ctx_ = sparrow_batch_n_ctx(batch_);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

std::shared_ptr<Stream> Scheduler::submit(std::vector<sparrow_token> prompt, const GenerationParams& params) {
  if (int64_t(prompt.size()) >= n_ctx_)
    throw HttpError(400, "the prompt has " + std::to_string(prompt.size()) + " tokens; the context holds " +
                             std::to_string(n_ctx_) + " per request, including the reply",
                    "invalid_request_error", "messages");
  auto request = std::make_unique<Request>();
  request->prompt = std::move(prompt);
  request->params = params;
  request->stream = std::make_shared<Stream>();
  request->submitted = Clock::now();
  std::shared_ptr<Stream> stream = request->stream;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw HttpError(503, "the server is shutting down", "server_error");
    // Free slots take requests at once; beyond them, queue_limit may wait.
    const int32_t free_slots = std::max(0, options_.parallel - stats_.active);
    if (int32_t(queue_.size()) >= options_.queue_limit + free_slots)
      throw HttpError(503, "the server is busy: " + std::to_string(queue_.size()) + " requests are waiting",
                      "server_error");
    queue_.push_back(std::move(request));
    stats_.queued = int32_t(queue_.size());
  }
  work_.notify_one();
  return stream;
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& slot : slots_) finish(*slot, "stop");
  slots_.clear();
  for (auto& request : queue_) request->stream->push({StreamEvent::Kind::Error, "the server is shutting down"});
  queue_.clear();
  if (batch_) sparrow_batch_free(batch_);
  batch_ = nullptr;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty() || !slots_.empty(); });
      if (stopping_) return;
      admit();
    }
    if (!slots_.empty()) step();
  }
}

void Scheduler::admit() {
  while (!queue_.empty() && int32_t(slots_.size()) < options_.parallel) {
    auto slot = std::make_unique<Slot>();
    slot->request = std::move(queue_.front());
    queue_.pop_front();
    slot->seq = sparrow_seq_open(batch_);
    if (slot->seq < 0) {
      slot->request->stream->push({StreamEvent::Kind::Error, sparrow_last_error()});
      continue;
    }
    const GenerationParams& p = slot->request->params;
    sparrow_sampler_params sp = sparrow_sampler_default_params();
    sp.temperature = p.temperature;
    sp.top_k = p.top_k;
    sp.top_p = p.top_p;
    sp.min_p = p.min_p;
    sp.seed = p.has_seed ? p.seed : std::random_device{}();
    slot->sampler = sparrow_sampler_new(sp);
    ++stats_.requests;
    stats_.prompt_tokens += slot->request->prompt.size();
    slots_.push_back(std::move(slot));
    stats_.active = int32_t(slots_.size());
  }
  stats_.queued = int32_t(queue_.size());
  stats_.active = int32_t(slots_.size());
}

void Scheduler::step() {
  // Requests whose client went away leave first.
  for (auto& slot : slots_)
    if (slot->request->stream->cancelled()) finish(*slot, "cancelled");
  std::erase_if(slots_, [](const std::unique_ptr<Slot>& s) { return s->done; });
  if (slots_.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.active = 0;
    stats_.kv_bytes = sparrow_batch_kv_bytes(batch_);
    return;
  }

  std::vector<sparrow_seq_step> steps;
  for (auto& slot : slots_) {
    const std::vector<sparrow_token>& prompt = slot->request->prompt;
    if (slot->fed < prompt.size()) {
      const size_t n = std::min(prompt.size() - slot->fed, size_t(options_.prefill_chunk));
      steps.push_back({slot->seq, prompt.data() + slot->fed, int32_t(n)});
      slot->fed += n;
    } else {
      steps.push_back({slot->seq, &slot->next_token, 1});
    }
  }
  const Clock::time_point start = Clock::now();
  const int status = sparrow_batch_decode(batch_, steps.data(), int32_t(steps.size()));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (status != 0) {
    const std::string why = sparrow_last_error();
    for (auto& slot : slots_) {
      slot->request->stream->push({StreamEvent::Kind::Error, why});
      finish(*slot, "");
    }
  } else {
    for (auto& slot : slots_)
      if (slot->fed == slot->request->prompt.size()) advance(*slot);
  }
  std::erase_if(slots_, [](const std::unique_ptr<Slot>& s) { return s->done; });
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.decode_steps;
  stats_.busy_seconds += seconds;
  stats_.active = int32_t(slots_.size());
  stats_.kv_bytes = sparrow_batch_kv_bytes(batch_);
}

void Scheduler::advance(Slot& slot) {
  const sparrow_token token = sparrow_seq_sample(batch_, slot.seq, slot.sampler);
  if (token < 0) {
    slot.request->stream->push({StreamEvent::Kind::Error, sparrow_last_error()});
    finish(slot, "");
    return;
  }
  if (!slot.first_token) {
    slot.first_token = true;
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.first_token_seconds_sum += std::chrono::duration<double>(Clock::now() - slot.request->submitted).count();
    ++stats_.first_tokens;
  }
  if (sparrow_token_is_end_of_generation(model_, token)) return finish(slot, "stop");
  ++slot.generated;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.completion_tokens;
  }
  slot.text += piece(model_, token);
  // A stop string ends the reply before it; text that could still become one is held back.
  const std::vector<std::string>& stops = slot.request->params.stop;
  size_t longest = 0;
  for (const std::string& s : stops) {
    longest = std::max(longest, s.size());
    const size_t from = slot.emitted > s.size() ? slot.emitted - s.size() : 0;
    const size_t at = slot.text.find(s, from);
    if (at != std::string::npos) {
      slot.text.resize(at);
      return finish(slot, "stop");
    }
  }
  const size_t safe = complete_end(slot.text, slot.text.size() - std::min(slot.text.size(), longest ? longest - 1 : 0));
  if (safe > slot.emitted) {
    slot.request->stream->push({StreamEvent::Kind::Text, slot.text.substr(slot.emitted, safe - slot.emitted)});
    slot.emitted = safe;
  }
  const GenerationParams& p = slot.request->params;
  const int32_t n_past = sparrow_seq_n_past(batch_, slot.seq);
  if ((p.max_tokens > 0 && slot.generated >= p.max_tokens) || n_past + 1 >= n_ctx_) return finish(slot, "length");
  slot.next_token = token;
}

void Scheduler::finish(Slot& slot, const std::string& reason) {
  if (slot.done) return;
  slot.done = true;
  sparrow_seq_close(batch_, slot.seq);
  sparrow_sampler_free(slot.sampler);
  slot.sampler = nullptr;
  {
    // Before the client hears of it: once its reply is complete, the request no longer counts as running.
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.active = std::max(0, stats_.active - 1);
    stats_.kv_bytes = sparrow_batch_kv_bytes(batch_);
  }
  if (!reason.empty()) {
    if (slot.text.size() > slot.emitted)
      slot.request->stream->push({StreamEvent::Kind::Text, slot.text.substr(slot.emitted)});
    StreamEvent e{StreamEvent::Kind::Finish};
    e.finish_reason = reason == "cancelled" ? "stop" : reason;
    e.prompt_tokens = int32_t(slot.request->prompt.size());
    e.completion_tokens = slot.generated;
    slot.request->stream->push(e);
  }
}

}  // namespace sparrow::server
