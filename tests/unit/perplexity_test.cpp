// `sparrow perplexity` on a tiny random Gemma 4 model: its PPL must equal exp(mean NLL) worked out here through
// the C API (each chunk decoded whole, its first token replaced by BOS, positions n_ctx/2 .. n_ctx-2 scored);
// a kl-base file must hold what docs/perplexity.md says; a run compared against its own base gives KLD ~ 0 and
// 100% top-1, a compressed KV cache a positive KLD; bad input fails with one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "runtime/resources.h"
#include "sparrow/sparrow.h"

namespace sparrow::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kCtx = 32;              // tiny presets have a 16-token window: chunks cross it
constexpr int kFirstScored = kCtx / 2;
constexpr int kScoredPerChunk = kCtx - 1 - kFirstScored;
constexpr const char* kRunOptions = " -c 32 -b 8 -t 2";  // -b 8: the scored half takes two decodes
constexpr double kSamePpl = 1e-6;                          // relative; PPL is printed to 4 decimals

const char* const kText =
    "The committee met on Tuesday to review the budget for the coming year. Several members argued that the "
    "library needed new windows before winter, while others wanted the money spent on books and longer opening "
    "hours. After two hours of debate they agreed to repair the windows first and to ask the county for a grant "
    "to cover the rest. The chairman thanked everyone and closed the meeting a little after nine.";

fs::path write_file(const std::string& name, const std::string& bytes) {
  const fs::path p = scratch_dir() / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

// A tiny Gemma 4 model with the committed vocabulary fixture, written once per test process.
const std::string& tiny_model() {
  static const std::string path = [] {
    const std::string out = (scratch_dir() / "tiny-ple-f16.gguf").string();
    const std::string vocab = resources::gemma4_vocab_path().string();
    const CommandResult r =
        run_sparrow("mkmodel --arch gemma4 --preset tiny-ple --type f16 --vocab " + vocab + " -o " + out);
    return r.exit_code == 0 ? out : std::string();
  }();
  return path;
}

const fs::path& text_file() {
  static const fs::path p = write_file("text.txt", kText);
  return p;
}

CommandResult run_perplexity(const std::string& extra) {
  return run_sparrow("perplexity -m " + tiny_model() + " -f " + text_file().string() + kRunOptions + extra);
}

// The number after `label` on the first line that has it; NaN if none does.
double value_after(const std::string& out, const std::string& label) {
  const size_t at = out.find(label);
  return at == std::string::npos ? NAN : std::stod(out.substr(at + label.size()));
}

std::string last_line(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s.substr(s.rfind('\n') + 1);
}

double last_line_ppl(const CommandResult& r) {
  const std::string line = last_line(r.out);
  EXPECT_EQ(line.rfind("PPL = ", 0), 0u) << r.out;
  return line.rfind("PPL = ", 0) == 0 ? std::stod(line.substr(6)) : NAN;
}

void expect_clean_failure(const CommandResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const size_t at = r.err.find("error: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_NE(r.err.find(needle, at), std::string::npos) << r.err;
  const std::string last = r.err.substr(at);
  EXPECT_EQ(std::count(last.begin(), last.end(), '\n'), 1) << "error must be one line: " << last;
}

// ---- the reference, through the C API ----

struct Reference {
  std::unique_ptr<sparrow_model, void (*)(sparrow_model*)> model{nullptr, sparrow_model_free};
  std::unique_ptr<sparrow_context, void (*)(sparrow_context*)> ctx{nullptr, sparrow_context_free};
  std::vector<sparrow_token> tokens;  // the whole text, with BOS
  int n_vocab = 0;

  Reference() {
    model.reset(sparrow_model_load(tiny_model().c_str(), nullptr, nullptr));
    if (!model) return;
    n_vocab = sparrow_model_n_vocab(model.get());
    sparrow_context_params p = sparrow_context_default_params();
    p.n_ctx = kCtx;
    p.n_threads = 2;
    p.n_batch = 8;  // as kRunOptions: the same decode boundaries give the same logits, bit for bit
    ctx.reset(sparrow_context_new(model.get(), p));
    tokens.resize(4096);
    const int n = sparrow_tokenize(model.get(), kText, int(std::strlen(kText)), 1, 0, tokens.data(), 4096);
    tokens.resize(std::max(n, 0));
  }
  int n_chunks() const { return int(tokens.size()) / kCtx; }

  // Chunk c as the model sees it: its first token replaced by BOS, every position's logits kept.
  std::vector<sparrow_token> decode_chunk(int c) {
    std::vector<sparrow_token> chunk(tokens.begin() + c * kCtx, tokens.begin() + (c + 1) * kCtx);
    chunk[0] = sparrow_token_bos(model.get());
    sparrow_context_reset(ctx.get());
    EXPECT_EQ(sparrow_decode(ctx.get(), chunk.data(), kCtx, 1), 0) << sparrow_last_error();
    return chunk;
  }

  std::vector<double> log_probs(int position) const {
    const float* logits = sparrow_get_logits(ctx.get(), position);
    double max_logit = logits[0], sum = 0;
    for (int i = 0; i < n_vocab; ++i) max_logit = std::max(max_logit, double(logits[i]));
    for (int i = 0; i < n_vocab; ++i) sum += std::exp(logits[i] - max_logit);
    std::vector<double> out(n_vocab);
    for (int i = 0; i < n_vocab; ++i) out[i] = logits[i] - max_logit - std::log(sum);
    return out;
  }

  // Sum of -log p(next token) over the scored positions of chunk c.
  double chunk_nll(int c) {
    const std::vector<sparrow_token> chunk = decode_chunk(c);
    double nll = 0;
    for (int pos = kFirstScored; pos < kCtx - 1; ++pos) nll -= log_probs(pos)[chunk[pos + 1]];
    return nll;
  }
};

class Perplexity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (tiny_model().empty()) GTEST_FAIL() << "mkmodel failed";
  }
};

TEST_F(Perplexity, EqualsExpOfMeanNllOverTheSecondHalfOfEachChunk) {
  Reference ref;
  ASSERT_TRUE(ref.ctx) << sparrow_last_error();
  ASSERT_GE(ref.n_chunks(), 2) << "the test text must give at least two chunks of " << kCtx;
  const double nll_first = ref.chunk_nll(0);
  double nll_all = nll_first;
  for (int c = 1; c < ref.n_chunks(); ++c) nll_all += ref.chunk_nll(c);
  const double expected_first = std::exp(nll_first / kScoredPerChunk);
  const double expected_all = std::exp(nll_all / (kScoredPerChunk * ref.n_chunks()));

  const CommandResult r = run_perplexity("");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NEAR(last_line_ppl(r), expected_all, kSamePpl * expected_all) << r.out;
  EXPECT_NEAR(value_after(r.out, "[1]"), expected_first, kSamePpl * expected_first) << r.out;
  const std::string last_chunk = "[" + std::to_string(ref.n_chunks()) + "]";
  EXPECT_NEAR(value_after(r.out, last_chunk), expected_all, kSamePpl * expected_all) << r.out;
  EXPECT_NEAR(value_after(r.out, "Final estimate: PPL = "), expected_all, kSamePpl * expected_all) << r.out;
  EXPECT_GT(value_after(r.out, " +/- "), 0) << r.out;

  const CommandResult one = run_perplexity(" --chunks 1");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NEAR(last_line_ppl(one), expected_first, kSamePpl * expected_first) << one.out;
  EXPECT_EQ(one.out.find("[2]"), std::string::npos) << one.out;
}

// A kl-base of the whole test text with the default f16 KV cache, written once per test process.
struct F16Base {
  fs::path path = scratch_dir() / "f16.klbase";
  CommandResult write;
  F16Base() {
    fs::remove(path);
    write = run_perplexity(" --kl-base " + path.string());
  }
};
const F16Base& f16_base() {
  static const F16Base base;
  return base;
}

// The file layout of docs/perplexity.md, read back here and checked against the C API's distributions.
TEST_F(Perplexity, KlBaseFileHoldsTheQuantizedLogProbabilities) {
  const F16Base& base = f16_base();
  ASSERT_EQ(base.write.exit_code, 0) << base.write.err;
  EXPECT_FALSE(fs::exists(base.path.string() + ".partial"));
  Reference ref;
  ASSERT_TRUE(ref.ctx) << sparrow_last_error();
  const size_t row_bytes = 16 + 2 * size_t(ref.n_vocab);
  const size_t n_chunks = ref.n_chunks();
  ASSERT_EQ(fs::file_size(base.path), 8 + 16 + n_chunks * (4 * kCtx + kScoredPerChunk * row_bytes));

  const std::string bytes = read_text(base.path);
  EXPECT_EQ(bytes.substr(0, 8), "SPKLBASE");
  uint32_t fields[4];
  std::memcpy(fields, bytes.data() + 8, sizeof fields);
  EXPECT_EQ(fields[0], 1u);  // version
  EXPECT_EQ(fields[1], uint32_t(kCtx));
  EXPECT_EQ(fields[2], uint32_t(ref.n_vocab));
  EXPECT_EQ(fields[3], n_chunks);
  std::vector<sparrow_token> tokens(n_chunks * kCtx);
  std::memcpy(tokens.data(), bytes.data() + 24, 4 * tokens.size());
  EXPECT_EQ(tokens, std::vector<sparrow_token>(ref.tokens.begin(), ref.tokens.begin() + tokens.size()));

  // The first and last scored positions of the second chunk.
  const std::vector<sparrow_token> chunk = ref.decode_chunk(1);
  const char* chunk_rows = bytes.data() + 24 + 4 * tokens.size() + kScoredPerChunk * row_bytes;
  for (int row : {0, kScoredPerChunk - 1}) {
    const char* r = chunk_rows + row * row_bytes;
    int32_t top;
    float target_log_p, floor, step;
    std::memcpy(&top, r, 4);
    std::memcpy(&target_log_p, r + 4, 4);
    std::memcpy(&floor, r + 8, 4);
    std::memcpy(&step, r + 12, 4);
    std::vector<uint16_t> codes(ref.n_vocab);
    std::memcpy(codes.data(), r + 16, 2 * codes.size());
    const std::vector<double> log_p = ref.log_probs(kFirstScored + row);
    const int argmax = int(std::max_element(log_p.begin(), log_p.end()) - log_p.begin());
    EXPECT_EQ(top, argmax);
    const double expected_target_log_p = log_p[chunk[kFirstScored + row + 1]];
    EXPECT_NEAR(target_log_p, expected_target_log_p, 1e-5 * std::abs(expected_target_log_p));
    EXPECT_NEAR(floor, std::max(*std::min_element(log_p.begin(), log_p.end()), log_p[argmax] - 16), 1e-4);
    EXPECT_NEAR(step, (log_p[argmax] - floor) / 65534, 1e-9);
    int dropped = 0;
    for (int i = 0; i < ref.n_vocab; ++i) {
      if (codes[i] == 0) {
        EXPECT_LT(log_p[i], floor + 1e-4) << "token " << i;
        ++dropped;
      } else {
        EXPECT_NEAR(floor + (codes[i] - 1) * double(step), log_p[i], step / 2 + 1e-5) << "token " << i;
      }
    }
    EXPECT_LT(dropped, ref.n_vocab);
  }
}

TEST_F(Perplexity, RunAgainstItsOwnBaseHasZeroKldAndFullTopOneAgreement) {
  const F16Base& base = f16_base();
  ASSERT_EQ(base.write.exit_code, 0) << base.write.err;
  const CommandResult compare = run_perplexity(" --kl-base " + base.path.string());
  ASSERT_EQ(compare.exit_code, 0) << compare.err;
  const double ppl = last_line_ppl(compare);
  EXPECT_EQ(ppl, last_line_ppl(base.write));
  EXPECT_NEAR(value_after(compare.out, "Mean KLD = "), 0, 1e-5) << compare.out;
  EXPECT_EQ(value_after(compare.out, "Same top-1 = "), 100.0) << compare.out;
  EXPECT_NEAR(value_after(compare.out, "Mean PPL(base) = "), ppl, 1e-5 * ppl) << compare.out;
}

TEST_F(Perplexity, CompressedKvCacheHasPositiveKldAgainstF16Base) {
  const F16Base& base = f16_base();
  ASSERT_EQ(base.write.exit_code, 0) << base.write.err;
  const CommandResult q4 = run_perplexity(" -ctk q4_0 -ctv q4_0 --kl-base " + base.path.string());
  ASSERT_EQ(q4.exit_code, 0) << q4.err;
  // 1000 times what the self-comparison may show; the tiny model's q4_0 KLD is about 0.4 nats.
  EXPECT_GT(value_after(q4.out, "Mean KLD = "), 1e-2) << q4.out;
  EXPECT_NE(last_line_ppl(q4), last_line_ppl(base.write));
  const double base_ppl = last_line_ppl(base.write);
  EXPECT_NEAR(value_after(q4.out, "Mean PPL(base) = "), base_ppl, 1e-5 * base_ppl) << q4.out;
}

TEST_F(Perplexity, MissingTextFile) {
  expect_clean_failure(run_sparrow("perplexity -m " + tiny_model() + " -f /nonexistent/text.txt -c 32"),
                       "/nonexistent/text.txt");
}

TEST_F(Perplexity, TextShorterThanTwoContexts) {
  expect_clean_failure(run_sparrow("perplexity -m " + tiny_model() + " -f " + text_file().string() + " -c 256"),
                       "needs at least 512");
}

TEST_F(Perplexity, CorruptKlBase) {
  const fs::path not_a_base = write_file("garbage.klbase", std::string(4096, 'x'));
  expect_clean_failure(run_perplexity(" --kl-base " + not_a_base.string()), "bad magic");

  const F16Base& base = f16_base();
  ASSERT_EQ(base.write.exit_code, 0) << base.write.err;
  const std::string bytes = read_text(base.path);
  const fs::path truncated = write_file("truncated.klbase", bytes.substr(0, bytes.size() - 100));
  expect_clean_failure(run_perplexity(" --kl-base " + truncated.string()), "bytes");
  const fs::path header_only = write_file("header-only.klbase", bytes.substr(0, 20));
  expect_clean_failure(run_perplexity(" --kl-base " + header_only.string()), "truncated");
}

TEST_F(Perplexity, MismatchedKlBase) {
  const F16Base& base = f16_base();
  ASSERT_EQ(base.write.exit_code, 0) << base.write.err;
  expect_clean_failure(run_perplexity(" --chunks 1 --kl-base " + base.path.string()), "chunks");
  expect_clean_failure(
      run_sparrow("perplexity -m " + tiny_model() + " -f " + text_file().string() + " -c 30 --kl-base " +
                  base.path.string()),
      "-c 32");
  const fs::path other_text = write_file("other.txt", std::string("Another text entirely. ") + kText);
  expect_clean_failure(run_sparrow("perplexity -m " + tiny_model() + " -f " + other_text.string() + kRunOptions +
                                   " --chunks 2 --kl-base " + base.path.string()),
                       "other tokens");
}

}  // namespace
}  // namespace sparrow::testing
