// `sparrow perplexity`: llama-perplexity's measurement. The text is tokenized once (with BOS) and cut into chunks
// of n_ctx tokens; each chunk is evaluated from an empty cache with its first token replaced by BOS, and positions
// n_ctx/2 .. n_ctx-2 are scored on the token that follows them, so every scored token sees at least n_ctx/2
// tokens of context. PPL = exp(mean negative log-likelihood).
// --kl-base FILE saves every scored position's full distribution (when FILE does not exist) or compares this run
// against it: mean KL divergence and top-1 agreement, e.g. of a compressed KV cache against f16. The file format
// is in docs/perplexity.md.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>

#include "commands.h"
#include "common.h"
#include "util/error.h"

namespace sparrow::tools {
namespace {

namespace fs = std::filesystem;

struct PerplexityOptions {
  std::string text_path;
  int32_t max_chunks = 0;  // 0: all
  std::string kl_base_path;
};

// Mean of a per-position quantity and the standard error of that mean.
class RunningMean {
 public:
  void add(double x) {
    sum_ += x;
    sum_squares_ += x * x;
    ++count_;
  }
  size_t count() const { return count_; }
  double mean() const { return count_ ? sum_ / count_ : 0; }
  double standard_error() const {
    if (count_ < 2) return 0;
    const double variance = sum_squares_ / count_ - mean() * mean();
    return variance > 0 ? std::sqrt(variance / (count_ - 1)) : 0;
  }

 private:
  double sum_ = 0, sum_squares_ = 0;
  size_t count_ = 0;
};

// log p_i = logit_i - max_logit - log_sum_exp, with the sum in double.
struct LogSoftmax {
  float max_logit;
  float min_logit;
  double log_sum_exp;  // log sum_i exp(logit_i - max_logit)
  int32_t argmax;      // lowest id on ties
  double log_prob(float logit) const { return double(logit) - max_logit - log_sum_exp; }
};

LogSoftmax log_softmax(const float* logits, int32_t n_vocab) {
  LogSoftmax s{logits[0], logits[0], 0, 0};
  for (int32_t i = 1; i < n_vocab; ++i) {
    if (logits[i] > s.max_logit) {
      s.max_logit = logits[i];
      s.argmax = i;
    }
    s.min_logit = std::min(s.min_logit, logits[i]);
  }
  double sum = 0;
  for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - s.max_logit);
  s.log_sum_exp = std::log(sum);
  return s;
}

// ---- kl-base rows ----
// One scored position: the argmax token and the exact log-probability of the token that followed (so the base
// PPL is exact), then every token's log-probability as a 16-bit code over [floor, top]: code 0 is "below the
// floor" (probability taken as 0), code q >= 1 is floor + (q - 1) * step. The floor is kBaseRangeNats below the
// top log-probability, as in llama.cpp, so that the codes keep a step of 2.4e-4 nats; the tokens it drops are
// each at least 9e6 times less likely than the top one.
constexpr double kBaseRangeNats = 16;
constexpr uint32_t kMaxCode = 65535;

struct BaseRowHeader {
  int32_t top_token;
  float target_log_prob;
  float floor_log_prob;
  float step;  // nats per code
};
static_assert(sizeof(BaseRowHeader) == 16);

size_t base_row_bytes(int32_t n_vocab) { return sizeof(BaseRowHeader) + sizeof(uint16_t) * size_t(n_vocab); }

// The float nearest x that is not above it, so that the token defining the floor stays at or above it.
float float_at_or_below(double x) {
  const float f = float(x);
  return f > x ? std::nextafter(f, -INFINITY) : f;
}

void encode_base_row(const float* logits, int32_t n_vocab, const LogSoftmax& s, sparrow_token target, uint8_t* out) {
  const double top = s.log_prob(s.max_logit);
  BaseRowHeader header{s.argmax, float(s.log_prob(logits[target])),
                       float_at_or_below(std::max(s.log_prob(s.min_logit), top - kBaseRangeNats)), 0};
  header.step = float((top - header.floor_log_prob) / (kMaxCode - 1));
  std::memcpy(out, &header, sizeof header);
  uint16_t* codes = reinterpret_cast<uint16_t*>(out + sizeof header);
  for (int32_t i = 0; i < n_vocab; ++i) {
    const double above_floor = s.log_prob(logits[i]) - header.floor_log_prob;
    if (above_floor < 0) {
      codes[i] = 0;
    } else {
      const double steps = header.step > 0 ? std::round(above_floor / header.step) : 0;
      codes[i] = uint16_t(1 + std::min(steps, double(kMaxCode - 1)));
    }
  }
}

// What scoring one position yields; the base fields are set only when comparing against a kl-base file.
struct PositionScore {
  double nll = 0;
  double nll_base = 0;
  double kld = 0;  // sum_i p_base_i * (log p_base_i - log p_i)
  bool same_top = false;
};

void compare_with_base(const float* logits, int32_t n_vocab, const LogSoftmax& s, const uint8_t* base_row,
                       PositionScore& score) {
  BaseRowHeader header;
  std::memcpy(&header, base_row, sizeof header);
  const uint16_t* codes = reinterpret_cast<const uint16_t*>(base_row + sizeof header);
  auto base_log_prob = [&](int32_t i) { return double(header.floor_log_prob) + double(codes[i] - 1) * header.step; };
  double kld = 0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (codes[i] == 0) continue;
    const double log_p_base = base_log_prob(i);
    kld += std::exp(log_p_base) * (log_p_base - s.log_prob(logits[i]));
  }
  score.kld = kld;
  score.nll_base = -double(header.target_log_prob);
  score.same_top = header.top_token == s.argmax;
}

// ---- kl-base file ----
constexpr char kBaseMagic[8] = {'S', 'P', 'K', 'L', 'B', 'A', 'S', 'E'};
constexpr uint32_t kBaseVersion = 1;

// The tokens a run scores, and what a kl-base file records of them: a comparison needs all of it to match.
struct ScoredText {
  uint32_t n_ctx = 0;
  uint32_t n_vocab = 0;
  uint32_t n_chunks = 0;
  std::vector<sparrow_token> tokens;  // n_chunks * n_ctx, as in the text (before BOS replaces each chunk's first)

  size_t scored_per_chunk() const { return n_ctx - 1 - n_ctx / 2; }
  size_t file_bytes() const {
    const size_t header_bytes = sizeof kBaseMagic + 4 * sizeof(uint32_t) + size_t(n_chunks) * n_ctx * sizeof(int32_t);
    return header_bytes + size_t(n_chunks) * scored_per_chunk() * base_row_bytes(int32_t(n_vocab));
  }
};

template <typename T>
void write_value(std::ostream& out, const T& value) {
  out.write(reinterpret_cast<const char*>(&value), sizeof value);
}

// Writes to FILE.partial and renames it to FILE when complete, so an interrupted run never leaves a base behind
// that a later run would compare against.
class BaseWriter {
 public:
  BaseWriter(const std::string& path, const ScoredText& text) : path_(path), partial_(path + ".partial") {
    out_.open(partial_, std::ios::binary);
    if (!out_) throw Error(partial_ + ": cannot open for writing");
    out_.write(kBaseMagic, sizeof kBaseMagic);
    for (uint32_t v : {kBaseVersion, text.n_ctx, text.n_vocab, text.n_chunks}) write_value(out_, v);
    out_.write(reinterpret_cast<const char*>(text.tokens.data()), text.tokens.size() * sizeof(sparrow_token));
  }
  ~BaseWriter() {
    if (!committed_) {
      out_.close();
      std::error_code ignored;
      fs::remove(partial_, ignored);
    }
  }
  void write_rows(const std::vector<uint8_t>& rows, size_t n_bytes) {
    out_.write(reinterpret_cast<const char*>(rows.data()), std::streamsize(n_bytes));
    if (!out_) throw Error(partial_ + ": write failed");
  }
  void commit() {
    out_.close();
    if (!out_) throw Error(partial_ + ": write failed");
    fs::rename(partial_, path_);
    committed_ = true;
  }

 private:
  std::string path_, partial_;
  std::ofstream out_;
  bool committed_ = false;
};

class BaseReader {
 public:
  explicit BaseReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw Error(path + ": cannot open kl-base file");
    char magic[sizeof kBaseMagic];
    uint32_t version = 0;
    in_.read(magic, sizeof magic);
    if (!in_ || std::memcmp(magic, kBaseMagic, sizeof magic) != 0)
      throw Error(path + ": not a kl-base file (bad magic)");
    read_value(version);
    if (version != kBaseVersion)
      throw Error(path + ": kl-base version " + std::to_string(version) + ", expected " + std::to_string(kBaseVersion));
    read_value(base_.n_ctx);
    read_value(base_.n_vocab);
    read_value(base_.n_chunks);
    check_size();
    base_.tokens.resize(size_t(base_.n_chunks) * base_.n_ctx);
    in_.read(reinterpret_cast<char*>(base_.tokens.data()), base_.tokens.size() * sizeof(sparrow_token));
    if (!in_) throw Error(path + ": truncated kl-base file");
  }

  // Throws unless the file was computed with this run's context, vocabulary and tokens.
  void check_matches(const ScoredText& run) const {
    if (base_.n_ctx != run.n_ctx)
      throw Error(path_ + ": kl-base was computed with -c " + std::to_string(base_.n_ctx) + ", this run has -c " +
                  std::to_string(run.n_ctx));
    if (base_.n_vocab != run.n_vocab)
      throw Error(path_ + ": kl-base has a vocabulary of " + std::to_string(base_.n_vocab) + " tokens, the model " +
                  std::to_string(run.n_vocab));
    if (base_.n_chunks != run.n_chunks)
      throw Error(path_ + ": kl-base has " + std::to_string(base_.n_chunks) + " chunks, this run " +
                  std::to_string(run.n_chunks) + " (--chunks and the text must be the same)");
    if (base_.tokens != run.tokens) throw Error(path_ + ": kl-base was computed on other tokens (another text?)");
  }

  void read_rows(std::vector<uint8_t>& rows, size_t n_bytes) {
    in_.read(reinterpret_cast<char*>(rows.data()), std::streamsize(n_bytes));
    if (!in_) throw Error(path_ + ": truncated kl-base file");
  }

 private:
  template <typename T>
  void read_value(T& value) {
    in_.read(reinterpret_cast<char*>(&value), sizeof value);
    if (!in_) throw Error(path_ + ": truncated kl-base header");
  }
  // The sizes fix the file's length exactly; checking it first catches truncation and implausible headers
  // before anything large is allocated.
  void check_size() {
    if (base_.n_ctx < 4 || base_.n_vocab == 0 || base_.n_chunks == 0 || base_.n_ctx > (1u << 24) ||
        base_.n_vocab > (1u << 24) || base_.n_chunks > (1u << 24))
      throw Error(path_ + ": corrupt kl-base header (n_ctx " + std::to_string(base_.n_ctx) + ", n_vocab " +
                  std::to_string(base_.n_vocab) + ", chunks " + std::to_string(base_.n_chunks) + ")");
    const uintmax_t actual = fs::file_size(path_);
    if (actual != base_.file_bytes())
      throw Error(path_ + ": kl-base file is " + std::to_string(actual) + " bytes, its header says " +
                  std::to_string(base_.file_bytes()));
  }

  std::string path_;
  std::ifstream in_;
  ScoredText base_;
};

// ---- evaluation ----

// Calls work(i) for every i in [0, n) on up to `threads` threads.
void parallel_for(int32_t n, int32_t threads, const std::function<void(int32_t)>& work) {
  std::atomic<int32_t> next{0};
  auto worker = [&] {
    for (int32_t i = next++; i < n; i = next++) work(i);
  };
  std::vector<std::thread> helpers;
  for (int32_t t = 1; t < std::min(threads, n); ++t) helpers.emplace_back(worker);
  worker();
  for (auto& h : helpers) h.join();
}

void decode_or_throw(sparrow_context* ctx, const sparrow_token* tokens, int32_t n, bool all_logits) {
  if (sparrow_decode(ctx, tokens, n, all_logits) != 0) throw Error(sparrow_last_error());
}

// Evaluates one chunk from an empty cache and calls score_rows(position, n) for each run of up to n_batch scored
// positions, while their logits are those of the last decode. The prefix that is only context is decoded
// without logits; the last token is only a target, so it is never decoded.
void evaluate_chunk(sparrow_context* ctx, std::vector<sparrow_token> chunk, sparrow_token bos, int32_t n_batch,
                    const std::function<void(int32_t, int32_t)>& score_rows) {
  const int32_t n_ctx = int32_t(chunk.size()), first = n_ctx / 2;
  chunk[0] = bos;
  sparrow_context_reset(ctx);
  decode_or_throw(ctx, chunk.data(), first, false);
  for (int32_t position = first; position < n_ctx - 1; position += n_batch) {
    const int32_t n = std::min(n_batch, n_ctx - 1 - position);
    decode_or_throw(ctx, chunk.data() + position, n, true);
    score_rows(position, n);
  }
}

struct Totals {
  RunningMean nll, nll_base, kld;
  size_t same_top = 0;
};

class PerplexityRun {
 public:
  PerplexityRun(sparrow_model* model, sparrow_context* ctx, const ScoredText& text, int32_t n_batch, int32_t threads)
      : model_(model), ctx_(ctx), text_(text), n_batch_(n_batch), threads_(threads) {}

  void set_base_writer(BaseWriter* writer) { writer_ = writer; }
  void set_base_reader(BaseReader* reader) { reader_ = reader; }
  const Totals& totals() const { return totals_; }

  void run_chunks() {
    const size_t row_bytes = base_row_bytes(int32_t(text_.n_vocab));
    const size_t rows_per_batch = std::min(size_t(n_batch_), text_.scored_per_chunk());
    if (writer_ || reader_) base_rows_.resize(rows_per_batch * row_bytes);
    for (uint32_t c = 0; c < text_.n_chunks; ++c) {
      const auto begin = text_.tokens.begin() + size_t(c) * text_.n_ctx;
      chunk_ = std::vector<sparrow_token>(begin, begin + text_.n_ctx);
      evaluate_chunk(ctx_, chunk_, sparrow_token_bos(model_), n_batch_,
                     [&](int32_t position, int32_t n) { score_rows(position, n); });
      std::printf("[%u]%.4f,", c + 1, std::exp(totals_.nll.mean()));
      std::fflush(stdout);
    }
    std::printf("\n");
  }

 private:
  void score_rows(int32_t position, int32_t n) {
    const int32_t n_vocab = int32_t(text_.n_vocab);
    const size_t row_bytes = base_row_bytes(n_vocab);
    if (reader_) reader_->read_rows(base_rows_, size_t(n) * row_bytes);
    std::vector<const float*> logits_rows(n);
    for (int32_t i = 0; i < n; ++i) logits_rows[i] = sparrow_get_logits(ctx_, i);
    std::vector<PositionScore> scores(n);
    parallel_for(n, threads_, [&](int32_t i) {
      const float* logits = logits_rows[i];
      const sparrow_token target = chunk_[position + i + 1];
      const LogSoftmax s = log_softmax(logits, n_vocab);
      scores[i].nll = -s.log_prob(logits[target]);
      if (writer_) encode_base_row(logits, n_vocab, s, target, base_rows_.data() + i * row_bytes);
      if (reader_) compare_with_base(logits, n_vocab, s, base_rows_.data() + i * row_bytes, scores[i]);
    });
    if (writer_) writer_->write_rows(base_rows_, size_t(n) * row_bytes);
    for (const PositionScore& score : scores) add(score);
  }

  void add(const PositionScore& score) {
    totals_.nll.add(score.nll);
    if (!reader_) return;
    totals_.nll_base.add(score.nll_base);
    totals_.kld.add(score.kld);
    totals_.same_top += score.same_top;
  }

  sparrow_model* model_;
  sparrow_context* ctx_;
  const ScoredText& text_;
  int32_t n_batch_, threads_;
  BaseWriter* writer_ = nullptr;
  BaseReader* reader_ = nullptr;
  std::vector<sparrow_token> chunk_;
  std::vector<uint8_t> base_rows_;
  Totals totals_;
};

// The tokens a run evaluates: the first n_chunks * n_ctx of the text, tokenized once with BOS.
ScoredText plan_run(sparrow_model* model, const PerplexityOptions& o, int32_t n_ctx) {
  std::vector<sparrow_token> tokens = tokenize(model, read_text_file(o.text_path), true, false);
  if (tokens.size() < 2 * size_t(n_ctx))
    throw Error(o.text_path + ": " + std::to_string(tokens.size()) + " tokens, perplexity with -c " +
                std::to_string(n_ctx) + " needs at least " + std::to_string(2 * n_ctx));
  ScoredText run;
  run.n_ctx = uint32_t(n_ctx);
  run.n_vocab = uint32_t(sparrow_model_n_vocab(model));
  run.n_chunks = uint32_t(tokens.size() / n_ctx);
  if (o.max_chunks > 0) run.n_chunks = std::min(run.n_chunks, uint32_t(o.max_chunks));
  tokens.resize(size_t(run.n_chunks) * n_ctx);
  run.tokens = std::move(tokens);
  return run;
}

void print_comparison(const Totals& t, const std::string& base_path) {
  const double same_top = double(t.same_top) / t.kld.count();
  const double same_top_error = t.kld.count() > 1 ? std::sqrt(same_top * (1 - same_top) / (t.kld.count() - 1)) : 0;
  const double ppl_base = std::exp(t.nll_base.mean());
  std::printf("against %s (%zu positions):\n", base_path.c_str(), t.kld.count());
  std::printf("Mean PPL(base) = %.4f +/- %.5f\n", ppl_base, ppl_base * t.nll_base.standard_error());
  std::printf("Mean KLD = %.6f +/- %.6f\n", t.kld.mean(), t.kld.standard_error());
  std::printf("Same top-1 = %.3f +/- %.3f %%\n", 100 * same_top, 100 * same_top_error);
}

void print_estimate(const RunningMean& nll) {
  const double ppl = std::exp(nll.mean());
  // The error of exp(mean) is ppl times the error of the mean (first-order propagation), as llama.cpp reports.
  std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * nll.standard_error());
  std::printf("PPL = %.4f\n", ppl);
}

void run_perplexity(const ModelOptions& model_options, const PerplexityOptions& o) {
  if (model_options.n_ctx < 4) throw Error("-c " + std::to_string(model_options.n_ctx) + ": perplexity needs -c >= 4");
  if (o.max_chunks < 0) throw Error("--chunks " + std::to_string(o.max_chunks) + ": must not be negative");
  LoadedModel m(model_options.model_path, model_options.load);
  const ScoredText run = plan_run(m.model, o, model_options.n_ctx);
  Context ctx(m.model, model_options);
  const int32_t n_batch = std::max(1, model_options.n_batch);
  const int32_t threads = model_options.threads > 0 ? model_options.threads
                                                    : int32_t(std::max(1u, std::thread::hardware_concurrency()));
  std::fprintf(stderr, "perplexity: %u chunks of %u tokens, %zu scored positions each\n", run.n_chunks, run.n_ctx,
               run.scored_per_chunk());

  PerplexityRun evaluation(m.model, ctx.ctx, run, n_batch, threads);
  const bool compare = !o.kl_base_path.empty() && fs::exists(o.kl_base_path);
  std::unique_ptr<BaseReader> reader;
  std::unique_ptr<BaseWriter> writer;
  if (compare) {
    reader = std::make_unique<BaseReader>(o.kl_base_path);
    reader->check_matches(run);
    evaluation.set_base_reader(reader.get());
  } else if (!o.kl_base_path.empty()) {
    writer = std::make_unique<BaseWriter>(o.kl_base_path, run);
    evaluation.set_base_writer(writer.get());
  }
  evaluation.run_chunks();
  if (writer) {
    writer->commit();
    std::fprintf(stderr, "wrote kl-base %s: %.1f MiB\n", o.kl_base_path.c_str(), run.file_bytes() / 1048576.0);
  }
  if (compare) print_comparison(evaluation.totals(), o.kl_base_path);
  print_estimate(evaluation.totals().nll);
}

}  // namespace

void add_perplexity_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("perplexity", "perplexity of a text (llama-perplexity's method), and KL "
                                               "divergence against a saved base run");
  auto model = std::make_shared<ModelOptions>();
  model->n_ctx = 512;  // llama-perplexity's default
  auto o = std::make_shared<PerplexityOptions>();
  add_model_options(*cmd, *model);
  cmd->add_option("-f,--file", o->text_path, "text file to score")->required();
  cmd->add_option("--chunks", o->max_chunks, "evaluate at most N chunks of -c tokens (0: all)");
  cmd->add_option("--kl-base", o->kl_base_path,
                  "FILE of full log-probabilities: written if missing, else compared against (KLD, top-1)");
  cmd->callback([=, &exit_code] {
    check_model_options(*model);
    run_perplexity(*model, *o);
    exit_code = 0;
  });
}

}  // namespace sparrow::tools
