// `sparrow bench` on a tiny random model: one JSON row per (KV configuration, test, depth) with real speeds and
// KV sizes, clear errors for bad lists, and scripts/plot-bench turning the JSON into a PNG.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "cli_test_util.h"

namespace sparrow::testing {
namespace {

namespace fs = std::filesystem;

// Gemma 3 tiny: 5 sliding layers (16-token window) and 1 global layer, written once per test run.
const std::string& tiny_model() {
  static const std::string path = [] {
    const fs::path p = scratch_dir() / "tiny.gguf";
    auto r = run_sparrow("mkmodel --arch gemma3 --preset tiny --type f16 --seed 5 -o " + p.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p.string();
  }();
  return path;
}

nlohmann::json run_bench_json(const std::string& args, const std::string& name) {
  const fs::path json = scratch_dir() / name;
  auto r = run_sparrow("bench -m " + tiny_model() + " -t 2 -r 2 --json " + json.string() + " " + args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return {};
  return nlohmann::json::parse(read_text(json));
}

using RowKey = std::tuple<std::string, std::string, int>;  // kv, test, depth

// Rows by (kv, test, depth); fails the test on a duplicate row or a non-positive speed or size.
std::map<RowKey, nlohmann::json> rows_by_key(const nlohmann::json& j) {
  std::map<RowKey, nlohmann::json> rows;
  for (const auto& r : j["results"]) {
    const RowKey key{r["kv"], r["test"], r["depth"]};
    EXPECT_TRUE(rows.emplace(key, r).second) << "duplicate row " << r.dump();
    EXPECT_GT(r["tokens_per_second"].get<double>(), 0.0) << r.dump();
    EXPECT_GT(r["kv_mib"].get<double>(), 0.0) << r.dump();
    EXPECT_EQ(r["samples"].size(), 2u) << r.dump();
  }
  return rows;
}

TEST(Bench, CrossProductOfKAndVListsGivesOneRowPerConfigTestAndDepth) {
  // Depth 40 is past the 16-token sliding window; the rewind after each pp16 goes back 16 <= -b 512 tokens.
  const auto j = run_bench_json("-p 16 -n 4 -d 0,40 -ctk f16,f32 -ctv f16,f32", "cross.json");
  ASSERT_FALSE(j.is_null());
  const auto rows = rows_by_key(j);
  EXPECT_EQ(rows.size(), 4u * 2u * 2u);
  for (const std::string kv : {"f16/f16", "f16/f32", "f32/f16", "f32/f32"})
    for (const std::string test : {"pp16", "tg4"})
      for (int depth : {0, 40}) EXPECT_TRUE(rows.count({kv, test, depth})) << kv << " " << test << " @ " << depth;

  // Every layer stores K and V rows of the same head dim, so an f32 half costs twice an f16 half.
  const double f16 = rows.at({"f16/f16", "pp16", 0})["kv_mib"], f32 = rows.at({"f32/f32", "pp16", 0})["kv_mib"];
  EXPECT_DOUBLE_EQ(f32, 2 * f16);
  EXPECT_DOUBLE_EQ(rows.at({"f16/f32", "tg4", 40})["kv_mib"].get<double>(), 1.5 * f16);

  EXPECT_EQ(j["engine"], "sparrow");
  EXPECT_EQ(j["model"], "tiny.gguf");
  EXPECT_EQ(j["threads"], 2);
  EXPECT_FALSE(j["machine"]["cpu"].get<std::string>().empty());
  EXPECT_GT(j["machine"]["cores"].get<int>(), 0);
  EXPECT_NE(j["command"].get<std::string>().find("bench -m"), std::string::npos) << j["command"];
  EXPECT_NE(j["command"].get<std::string>().find("-ctk f16,f32"), std::string::npos) << j["command"];
  EXPECT_TRUE(j["commit"].is_string());
}

TEST(Bench, ExplicitPairsRunOnlyThosePairs) {
  const auto j = run_bench_json("-p 8 -n 2 -d 24 --kv f32/f16,f16", "pairs.json");
  ASSERT_FALSE(j.is_null());
  const auto rows = rows_by_key(j);
  const std::set<RowKey> expected{{"f32/f16", "pp8", 24}, {"f32/f16", "tg2", 24}, {"f16/f16", "pp8", 24},
                                  {"f16/f16", "tg2", 24}};
  std::set<RowKey> got;
  for (const auto& [key, row] : rows) got.insert(key);
  EXPECT_EQ(got, expected);
}

TEST(Bench, KvBitsAddsARowPerBudgetAfterThePairs) {
  const auto j = run_bench_json("-p 8 -n 2 --kv f16/f16 --kv-bits 16,4.2", "bits.json");
  ASSERT_FALSE(j.is_null());
  const auto rows = rows_by_key(j);
  EXPECT_EQ(rows.size(), 6u);
  // 16 bits take f16 (the best measured configuration): the same cache size as the f16/f16 pair.
  EXPECT_DOUBLE_EQ(rows.at({"bits 16", "pp8", 0})["kv_mib"].get<double>(),
                   rows.at({"f16/f16", "pp8", 0})["kv_mib"].get<double>());
  EXPECT_LT(rows.at({"bits 4.2", "tg2", 0})["kv_mib"].get<double>(),
            rows.at({"f16/f16", "tg2", 0})["kv_mib"].get<double>() * 4.2 / 16);
}

TEST(Bench, PromptLongerThanTheBatchRefillsInsteadOfRewinding) {
  // pp32 with -b 8 cannot be rewound (truncate goes back at most n_batch tokens): each run refills depth 20.
  const auto j = run_bench_json("-p 32 -n 3 -d 0,20 -b 8", "refill.json");
  ASSERT_FALSE(j.is_null());
  const auto rows = rows_by_key(j);
  EXPECT_EQ(rows.size(), 4u);
  EXPECT_TRUE(rows.count({"auto/auto", "pp32", 20}));  // no -ctk/-ctv/--kv: the default, auto
  EXPECT_TRUE(rows.count({"auto/auto", "tg3", 20}));
}

TEST(Bench, PrintsATableRowPerResult) {
  auto r = run_sparrow("bench -m " + tiny_model() + " -t 2 -r 1 -p 8 -n 2 -d 0,16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| auto/auto   | pp8     |       0 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| auto/auto   | tg2     |      16 |"), std::string::npos) << r.out;
}

// A failed command: exit 1, and a one-line error naming `needle`.
void expect_bench_error(const std::string& args, const std::string& needle) {
  auto r = run_sparrow("bench -m " + tiny_model() + " -t 2 -r 1 -p 8 -n 2 " + args);
  EXPECT_EQ(r.exit_code, 1) << args << ": " << r.err;
  const size_t at = r.err.find("error: ");
  ASSERT_NE(at, std::string::npos) << args << ": " << r.err;
  const std::string line = r.err.substr(at);
  EXPECT_NE(line.find(needle), std::string::npos) << args << ": " << line;
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << "error must be one line: " << line;
  EXPECT_EQ(r.out.find("| f16/f16"), std::string::npos) << "nothing may run before the error: " << r.out;
}

TEST(Bench, UnknownCodecIsAClearError) {
  expect_bench_error("-ctk f16,q9_9", "q9_9");
  expect_bench_error("--kv f16/f16,f16/q9_9", "q9_9");
}

TEST(Bench, QjlAsValueCodecIsAClearError) {
  expect_bench_error("--kv f16/f16,f16/qjl", "qjl");
  expect_bench_error("-ctv qjl", "qjl");
}

TEST(Bench, NegativeDepthIsAClearError) { expect_bench_error("-d 0,-256", "-256"); }

TEST(Bench, MalformedPairIsAClearError) {
  expect_bench_error("--kv f16/", "f16/");
  expect_bench_error("--kv f16/f16/f16", "f16/f16/f16");
}

TEST(Bench, PairsAndListsTogetherAreAUsageError) {
  auto r = run_sparrow("bench -m " + tiny_model() + " --kv f16/f16 -ctk f16");
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--kv"), std::string::npos) << r.err;
}

bool have_matplotlib() { return std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") == 0; }

void expect_png(const fs::path& png) {
  const std::string bytes = read_text(png);
  ASSERT_GT(bytes.size(), 1000u) << png;
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << png;
}

TEST(PlotBench, PlotsSparrowJson) {
  if (!have_matplotlib()) GTEST_SKIP() << "python3 with matplotlib not installed (scripts/setup installs it)";
  const auto j = run_bench_json("-p 8 -n 2 -d 0,16 --kv f16,f32", "plot.json");
  ASSERT_FALSE(j.is_null());
  const fs::path png = scratch_dir() / "plot.png";
  const std::string cmd = std::string(SPARROW_SOURCE_DIR) + "/scripts/plot-bench " +
                          (scratch_dir() / "plot.json").string() + " -o " + png.string() + " >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  expect_png(png);
}

// The layout scripts/bench-kv writes: Sparrow's JSON under "sparrow", llama-bench rows under "llama_cpp".
TEST(PlotBench, PlotsBenchKvJsonWithLlamaCppRows) {
  if (!have_matplotlib()) GTEST_SKIP() << "python3 with matplotlib not installed (scripts/setup installs it)";
  nlohmann::json sparrow = {{"engine", "sparrow"}, {"results", nlohmann::json::array()}};
  nlohmann::json llama = {{"results", nlohmann::json::array()}};
  for (int depth : {0, 256}) {
    sparrow["results"].push_back({{"kv", "f16/f16"}, {"test", "pp64"}, {"depth", depth},
                                  {"tokens_per_second", 500.0 - depth}, {"kv_mib", 3.5}});
    sparrow["results"].push_back({{"kv", "tbq4/tbq4"}, {"test", "tg16"}, {"depth", depth},
                                  {"tokens_per_second", 70.0}, {"kv_mib", 1.0}});
    llama["results"].push_back({{"kv", "f16/f16"}, {"test", "pp64"}, {"depth", depth},
                                {"tokens_per_second", 480.0 - depth}});
  }
  const fs::path json = scratch_dir() / "bench-kv.json", png = scratch_dir() / "bench-kv.png";
  std::ofstream(json) << nlohmann::json{{"sparrow", sparrow}, {"llama_cpp", llama}}.dump();
  const std::string cmd =
      std::string(SPARROW_SOURCE_DIR) + "/scripts/plot-bench " + json.string() + " -o " + png.string() + " >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  expect_png(png);
}

TEST(PlotBench, RejectsJsonThatIsNotABenchmark) {
  if (!have_matplotlib()) GTEST_SKIP() << "python3 with matplotlib not installed (scripts/setup installs it)";
  const fs::path json = scratch_dir() / "other.json";
  std::ofstream(json) << R"({"hello": 1})";
  const std::string cmd = std::string(SPARROW_SOURCE_DIR) + "/scripts/plot-bench " + json.string() + " -o " +
                          (scratch_dir() / "other.png").string() + " 2>/dev/null";
  EXPECT_NE(std::system(cmd.c_str()), 0);
}

}  // namespace
}  // namespace sparrow::testing
