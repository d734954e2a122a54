#include "runtime/multi_session.h"

#include <algorithm>
#include <string>
#include <utility>

#include "runtime/sequence_state.h"
#include "util/error.h"

namespace sparrow {

MultiSession::MultiSession(const Model& model, const SessionOptions& options, int32_t max_sequences)
    : model_(model), options_(options) {
  if (max_sequences <= 0 || max_sequences > 4096)
    throw Error("sequences: " + std::to_string(max_sequences) + " (1 to 4096)");
  const SessionSizes sizes = SessionSizes::resolve(model.config, options);
  n_ctx_ = sizes.n_ctx;
  // A pass must hold the last token of every sequence.
  n_batch_ = std::max(sizes.n_batch, max_sequences);
  backend_ = make_session_backend(model, options);
  forward_ = std::make_unique<GemmaForward>(*backend_, model.config, model.weights, n_batch_, max_sequences,
                                            options.record_decode);
  sequences_.resize(size_t(max_sequences));
}

// The caches before the backend that holds their memory.
MultiSession::~MultiSession() {
  sequences_.clear();
  forward_.reset();
}

int32_t MultiSession::open() {
  for (size_t id = 0; id < sequences_.size(); ++id) {
    Sequence& s = sequences_[id];
    if (s.cache) continue;
    s = Sequence{};
    s.cache = make_sequence_cache(*backend_, model_.config, options_, {n_ctx_, n_batch_});
    return int32_t(id);
  }
  throw Error("sequences: all " + std::to_string(sequences_.size()) + " are open");
}

void MultiSession::close(int32_t sequence) {
  state(sequence);  // throws for an id that is not open
  sequences_[size_t(sequence)] = Sequence{};
}

const MultiSession::Sequence& MultiSession::state(int32_t sequence) const {
  if (!is_open(sequence))
    throw Error("sequence " + std::to_string(sequence) + " is not open");
  return sequences_[size_t(sequence)];
}

int32_t MultiSession::n_open() const {
  return int32_t(std::count_if(sequences_.begin(), sequences_.end(), [](const Sequence& s) { return bool(s.cache); }));
}

size_t MultiSession::kv_bytes() const {
  size_t bytes = 0;
  for (const Sequence& s : sequences_)
    if (s.cache) bytes += s.cache->bytes();
  return bytes;
}

void MultiSession::check(std::span<const Step> steps) const {
  if (steps.empty()) throw Error("decode: no steps");
  std::vector<bool> seen(sequences_.size());
  for (const Step& step : steps) {
    const Sequence& s = state(step.sequence);
    if (seen[size_t(step.sequence)]) throw Error("decode: sequence " + std::to_string(step.sequence) + " twice");
    seen[size_t(step.sequence)] = true;
    if (step.tokens.empty()) throw Error("decode: no tokens for sequence " + std::to_string(step.sequence));
    if (int64_t(s.n_past) + int64_t(step.tokens.size()) > n_ctx_)
      throw Error("decode: " + std::to_string(step.tokens.size()) + " more tokens do not fit sequence " +
                  std::to_string(step.sequence) + "'s context (" + std::to_string(s.n_past) + " of " +
                  std::to_string(n_ctx_) + " used)");
    for (int32_t t : step.tokens)
      if (t < 0 || t >= model_.config.n_vocab)
        throw Error("decode: token id " + std::to_string(t) + " is outside the vocabulary");
  }
}

void MultiSession::decode(std::span<const Step> steps) {
  check(steps);
  for (Sequence& s : sequences_) {
    s.logits_row = -1;
    s.host_logits.clear();
  }
  prefill(steps);
  // The last token of every step, together: one pass, one row of logits each.
  std::vector<int32_t> tokens;
  std::vector<GemmaForward::SequenceRun> runs;
  std::vector<Sequence*> of;
  for (const Step& step : steps) {
    Sequence& s = state(step.sequence);
    tokens.push_back(step.tokens.back());
    runs.push_back({s.cache.get(), s.n_past, 1, GemmaForward::Logits::Last});
    of.push_back(&s);
  }
  run_pass(tokens, runs, of);
  for (size_t i = 0; i < of.size(); ++i) of[i]->logits_row = int32_t(i);
}

// Every step's tokens but its last, packed into passes of at most n_batch tokens; a step's tokens may continue
// in the next pass.
void MultiSession::prefill(std::span<const Step> steps) {
  std::vector<int32_t> tokens;
  std::vector<GemmaForward::SequenceRun> runs;
  std::vector<Sequence*> of;
  auto flush = [&] {
    if (runs.empty()) return;
    run_pass(tokens, runs, of);
    tokens.clear();
    runs.clear();
    of.clear();
  };
  for (const Step& step : steps) {
    Sequence& s = state(step.sequence);
    std::span<const int32_t> rest = step.tokens.first(step.tokens.size() - 1);
    while (!rest.empty()) {
      const size_t room = size_t(n_batch_) - tokens.size();
      const size_t n = std::min(room, rest.size());
      tokens.insert(tokens.end(), rest.begin(), rest.begin() + std::ptrdiff_t(n));
      runs.push_back({s.cache.get(), s.n_past, int32_t(n), GemmaForward::Logits::None});
      of.push_back(&s);
      rest = rest.subspan(n);
      if (tokens.size() == size_t(n_batch_)) flush();
    }
  }
  flush();
}

void MultiSession::run_pass(const std::vector<int32_t>& tokens, const std::vector<GemmaForward::SequenceRun>& runs,
                            const std::vector<Sequence*>& of) {
  if (should_stop_ && should_stop_()) throw Cancelled();
  forward_->run(tokens.data(), runs, nullptr);
  for (size_t i = 0; i < runs.size(); ++i) of[i]->n_past += runs[i].n_tokens;
}

void MultiSession::truncate(int32_t sequence, int32_t n_past) {
  Sequence& s = state(sequence);
  if (n_past < 0 || n_past > s.n_past)
    throw Error("truncate: " + std::to_string(n_past) + " is not between 0 and the " + std::to_string(s.n_past) +
                " tokens of sequence " + std::to_string(sequence));
  s.cache->check_truncate(n_past);
  s.n_past = n_past;
  s.logits_row = -1;
  s.host_logits.clear();
}

void MultiSession::save_state(int32_t sequence, const std::string& path, std::span<const int32_t> tokens) const {
  const Sequence& s = state(sequence);
  save_sequence_state(path, model_, *s.cache, s.n_past, tokens);
}

void MultiSession::reset(int32_t sequence) {
  Sequence& s = state(sequence);
  s.n_past = 0;
  s.logits_row = -1;
  s.host_logits.clear();
  s.cache->reset();
}

std::vector<int32_t> MultiSession::restore_state(int32_t sequence, const std::string& path) {
  reset(sequence);
  Sequence& s = state(sequence);
  RestoredSequence r = restore_sequence_state(path, model_, *s.cache);
  s.n_past = r.n_past;
  return std::move(r.tokens);
}

const float* MultiSession::logits(int32_t sequence) {
  Sequence& s = state(sequence);
  if (s.logits_row < 0) throw Error("logits: sequence " + std::to_string(sequence) + " was not in the last decode");
  if (s.host_logits.empty()) {
    s.host_logits.resize(size_t(model_.config.n_vocab));
    backend_->read(forward_->logits_row(s.logits_row), s.host_logits.data(), s.host_logits.size());
  }
  return s.host_logits.data();
}

int32_t MultiSession::sample(int32_t sequence, Sampler& sampler) {
  Sequence& s = state(sequence);
  if (s.logits_row < 0) throw Error("sample: sequence " + std::to_string(sequence) + " was not in the last decode");
  return backend_->sample(forward_->logits_row(s.logits_row), model_.config.n_vocab, sampler.params(),
                          sampler.next_uniform());
}

}  // namespace sparrow
