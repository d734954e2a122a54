#pragma once
// Many sequences of one model decoded together: each sequence has its own KV cache, and one forward pass carries
// tokens of several, so that a decode step of N sequences reads the weights once rather than N times. What a
// server's parallel slots and batched decoding run on; Session is the one-sequence case with its extras (every
// row's logits, truncation).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kv/kv_cache.h"
#include "model/gemma.h"
#include "ops/backend.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace sparrow {

class MultiSession {
 public:
  // Sequences get options' KV cache settings and context (n_ctx tokens each); at most max_sequences are open at
  // once (it sizes the logits kept on the backend: one row per sequence of a step).
  MultiSession(const Model& model, const SessionOptions& options, int32_t max_sequences);
  ~MultiSession();

  // A new, empty sequence with its KV cache allocated; its id is reused after close. Throws when max_sequences
  // are open or the cache does not fit.
  int32_t open();
  // Frees the sequence's KV cache.
  void close(int32_t sequence);

  // Tokens appended to one sequence.
  struct Step {
    int32_t sequence = 0;
    std::span<const int32_t> tokens;
  };
  // Appends each step's tokens to its sequence and keeps the logits of each step's last token. Every token but
  // each step's last goes through forward passes of at most n_batch tokens that mix sequences; the last tokens
  // then go together through one pass (a decode step when every step has one token), whose logits stay in
  // backend memory for sampling. A sequence appears in at most one step. Throws Cancelled when the abort check
  // says so before a pass; the tokens of the passes before it stay decoded (n_past says how many).
  void decode(std::span<const Step> steps);
  // Asked before every forward pass; true stops the decode. Empty: never.
  void set_abort(std::function<bool()> should_stop) { should_stop_ = std::move(should_stop); }
  // Forgets the sequence's tokens after the first n_past (as Session::truncate).
  void truncate(int32_t sequence, int32_t n_past);
  // Forgets all of the sequence's tokens; its cache stays allocated.
  void reset(int32_t sequence);
  // The sequence's state to a file and back (runtime/sequence_state.h); as Session::save_state/restore_state.
  void save_state(int32_t sequence, const std::string& path, std::span<const int32_t> tokens) const;
  std::vector<int32_t> restore_state(int32_t sequence, const std::string& path);
  // The kept logits of the sequence's step in the last decode (host memory, n_vocab floats).
  const float* logits(int32_t sequence);
  // The next token of the sequence from the last decode's logits, drawn with `sampler` on the backend (on a GPU
  // only the id is copied back).
  int32_t sample(int32_t sequence, Sampler& sampler);

  int32_t n_past(int32_t sequence) const { return state(sequence).n_past; }
  bool is_open(int32_t sequence) const {
    return sequence >= 0 && size_t(sequence) < sequences_.size() && sequences_[size_t(sequence)].cache != nullptr;
  }
  int32_t n_ctx() const { return n_ctx_; }
  int32_t max_sequences() const { return int32_t(sequences_.size()); }
  int32_t n_open() const;
  // Bytes of KV cache the open sequences hold.
  size_t kv_bytes() const;

 private:
  struct Sequence {
    std::unique_ptr<KvCache> cache;  // null: the id is free
    int32_t n_past = 0;
    int32_t logits_row = -1;         // its row of the last decode's kept logits, or -1
    std::vector<float> host_logits;  // that row, once copied to the host
  };
  const Sequence& state(int32_t sequence) const;
  Sequence& state(int32_t sequence) { return const_cast<Sequence&>(std::as_const(*this).state(sequence)); }
  void check(std::span<const Step> steps) const;
  void prefill(std::span<const Step> steps);  // every step's tokens but the last
  // One forward pass over runs of the sequences `of` (one run each), then their n_past advance.
  void run_pass(const std::vector<int32_t>& tokens, const std::vector<GemmaForward::SequenceRun>& runs,
                const std::vector<Sequence*>& of);

  const Model& model_;
  SessionOptions options_;
  int32_t n_ctx_;
  int32_t n_batch_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<GemmaForward> forward_;
  std::vector<Sequence> sequences_;  // by id
  std::function<bool()> should_stop_;
};

}  // namespace sparrow
