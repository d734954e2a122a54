// `sparrow bench`: llama-bench-style throughput per KV cache configuration. pp<N>: one prompt of N tokens in
// batches; tg<N>: N tokens decoded one at a time. Each test runs at each depth (tokens already in the cache),
// repeated, on random tokens. Per configuration the cache is filled to a depth once, untimed, and every run is
// rewound to it with sparrow_context_truncate, so a 16k-token depth costs one fill, not one per run.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "commands.h"
#include "common.h"
#include "util/error.h"

namespace sparrow::tools {
namespace {

struct KvConfig {
  std::string k, v;
  float bits = 0;  // > 0: --kv-bits, in place of k and v
  std::string name() const {
    if (bits <= 0) return k + "/" + v;
    char buf[32];
    std::snprintf(buf, sizeof buf, "bits %g", bits);
    return buf;
  }
};

struct BenchOptions {
  std::string model_path;
  LoadOptions load;
  int32_t threads = 0;
  int32_t n_batch = 512;
  std::vector<int32_t> prompt_sizes{512};
  std::vector<int32_t> generate_sizes{128};
  std::vector<int32_t> depths{0};
  std::vector<std::string> cache_types_k{"auto"};
  std::vector<std::string> cache_types_v{"auto"};
  std::vector<std::string> kv_pairs;  // --kv K/V,...: explicit pairs instead of the -ctk x -ctv cross product
  std::vector<float> kv_bits;         // --kv-bits B,...: configurations chosen by size, after the pairs
  int32_t repetitions = 3;
  std::string json_path;
};

struct Result {
  std::string kv;    // "f16/f16"
  std::string test;  // "pp512", "tg128"
  int32_t n_prompt, n_gen, depth;
  double kv_mib;  // KV cache of the whole context, MiB
  std::vector<double> tokens_per_second;
  // tg tests: bytes one generated token reads (weights, and the KV cache at its depth, averaged over the test);
  // at the memory bandwidth, the floor. 0 for pp tests, which are compute-bound.
  double bytes_per_token = 0;
  double mean() const {
    double s = 0;
    for (double x : tokens_per_second) s += x;
    return s / tokens_per_second.size();
  }
  double stddev() const {
    double m = mean(), s = 0;
    for (double x : tokens_per_second) s += (x - m) * (x - m);
    return tokens_per_second.size() > 1 ? std::sqrt(s / (tokens_per_second.size() - 1)) : 0.0;
  }
};

// "K/V", or "C" for the same codec on both.
KvConfig parse_kv_pair(const std::string& spec) {
  const size_t slash = spec.find('/');
  if (slash == std::string::npos) {
    if (spec.empty()) throw Error("--kv: empty entry (expected K/V, e.g. f16/f16,tbq4/tbq3)");
    return {spec, spec};
  }
  KvConfig c{spec.substr(0, slash), spec.substr(slash + 1)};
  if (c.k.empty() || c.v.empty() || c.v.find('/') != std::string::npos)
    throw Error("--kv: '" + spec + "' is not K/V (e.g. f16/f16,tbq4/tbq3)");
  return c;
}

std::vector<KvConfig> kv_configs(const BenchOptions& o) {
  std::vector<KvConfig> configs;
  if (!o.kv_pairs.empty()) {
    for (const std::string& spec : o.kv_pairs) configs.push_back(parse_kv_pair(spec));
  } else {
    // Like llama-bench: every K type with every V type.
    for (const std::string& k : o.cache_types_k)
      for (const std::string& v : o.cache_types_v) configs.push_back({k, v});
  }
  for (float bits : o.kv_bits) {
    if (!(bits > 0)) throw Error("--kv-bits: " + std::to_string(bits) + " is not a positive number of bits");
    configs.push_back({"", "", bits});
  }
  return configs;
}

void check_sizes(const BenchOptions& o) {
  if (o.repetitions < 1) throw Error("--repetitions must be at least 1");
  if (o.n_batch < 1) throw Error("-b " + std::to_string(o.n_batch) + ": the batch size must be at least 1 token");
  if (o.depths.empty()) throw Error("--depth: give at least one depth (0: an empty cache)");
  for (int32_t d : o.depths)
    if (d < 0) throw Error("--depth " + std::to_string(d) + ": depths must be 0 or more tokens");
  for (int32_t n : o.prompt_sizes)
    if (n < 0) throw Error("--n-prompt " + std::to_string(n) + ": prompt sizes must be 0 or more tokens");
  for (int32_t n : o.generate_sizes)
    if (n < 0) throw Error("--n-gen " + std::to_string(n) + ": generation lengths must be 0 or more tokens");
}

sparrow_context_params context_params(const BenchOptions& o, const KvConfig& kv, int32_t n_ctx) {
  sparrow_context_params p = sparrow_context_default_params();
  p.n_ctx = n_ctx;
  p.n_threads = o.threads;
  p.n_batch = o.n_batch;
  if (kv.bits > 0) {
    p.kv_bits = kv.bits;
  } else {
    p.cache_type_k = kv.k.c_str();
    p.cache_type_v = kv.v.c_str();
  }
  p.decode_graphs = o.load.graphs == "on";
  return p;
}

using ContextPtr = std::unique_ptr<sparrow_context, void (*)(sparrow_context*)>;

ContextPtr open_context(sparrow_model* model, const BenchOptions& o, const KvConfig& kv, int32_t n_ctx) {
  ContextPtr ctx(sparrow_context_new(model, context_params(o, kv, n_ctx)), sparrow_context_free);
  if (!ctx) throw Error("KV " + kv.name() + ": " + sparrow_last_error());
  return ctx;
}

// Opens a small context per configuration before timing anything, so that a bad codec in the last
// configuration fails in seconds, not after hours of benchmarks.
void check_configs_open(sparrow_model* model, const BenchOptions& o, const std::vector<KvConfig>& configs) {
  constexpr int32_t kProbeContext = 16;  // tokens; enough to build every layer's cache
  for (const KvConfig& kv : configs) open_context(model, o, kv, kProbeContext);
}

std::vector<sparrow_token> random_tokens(int32_t n, int32_t n_vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
  std::vector<sparrow_token> t(n);
  for (auto& x : t) x = pick(rng);
  return t;
}

void decode_or_throw(sparrow_context* ctx, const std::vector<sparrow_token>& tokens) {
  if (sparrow_decode(ctx, tokens.data(), int32_t(tokens.size()), 0) != 0) throw Error(sparrow_last_error());
}

// Keeps one context at a chosen depth: fills it with untimed random tokens and rewinds to it after each run.
class DepthKeeper {
 public:
  DepthKeeper(sparrow_context* ctx, int32_t n_vocab, std::mt19937& rng) : ctx_(ctx), n_vocab_(n_vocab), rng_(rng) {}

  void go_to(int32_t depth) {
    const int32_t n_past = sparrow_context_n_past(ctx_);
    // truncate refuses going back more than n_batch tokens (sliding-window rings would have lost what the
    // next token sees); then the cache is filled again from the start.
    if (depth <= n_past && sparrow_context_truncate(ctx_, depth) != 0) sparrow_context_reset(ctx_);
    const int32_t missing = depth - sparrow_context_n_past(ctx_);
    if (missing > 0) decode_or_throw(ctx_, random_tokens(missing, n_vocab_, rng_));
  }

 private:
  sparrow_context* ctx_;
  int32_t n_vocab_;
  std::mt19937& rng_;
};

void synchronize_or_throw(sparrow_context* ctx) {
  if (sparrow_synchronize(ctx) != 0) throw Error(sparrow_last_error());
}

// Seconds to decode `tokens` as one prompt (pp) or one token at a time (tg). A decode may return with its work
// still queued on a GPU: the clock starts on an idle device and each decode is waited for, as llama-bench does.
double time_decode(sparrow_context* ctx, const std::vector<sparrow_token>& tokens, bool one_at_a_time) {
  synchronize_or_throw(ctx);
  auto t0 = std::chrono::steady_clock::now();
  if (one_at_a_time) {
    for (sparrow_token t : tokens) {
      decode_or_throw(ctx, {t});
      synchronize_or_throw(ctx);
    }
  } else {
    decode_or_throw(ctx, tokens);
    synchronize_or_throw(ctx);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Test {
  std::string name;  // "pp512"
  int32_t n_prompt, n_gen;
  int32_t tokens() const { return n_prompt + n_gen; }
};

std::vector<Test> tests(const BenchOptions& o) {
  std::vector<Test> t;
  for (int32_t n : o.prompt_sizes)
    if (n > 0) t.push_back({"pp" + std::to_string(n), n, 0});
  for (int32_t n : o.generate_sizes)
    if (n > 0) t.push_back({"tg" + std::to_string(n), 0, n});
  if (t.empty()) throw Error("nothing to run: every --n-prompt and --n-gen is 0");
  return t;
}

void print_table_header() {
  std::printf("| %-11s | %-7s | %7s | %17s | %8s |\n", "kv", "test", "depth", "t/s", "KV MiB");
  std::printf("|-------------|---------|--------:|------------------:|---------:|\n");
}

void print_row(const Result& r) {
  std::printf("| %-11s | %-7s | %7d | %8.2f ± %6.2f | %8.2f |\n", r.kv.c_str(), r.test.c_str(), r.depth, r.mean(),
              r.stddev(), r.kv_mib);
  std::fflush(stdout);
}

// Mean bytes a generated token of test t at `depth` reads; 0 for a prompt test.
double decode_bytes(const sparrow_model* model, const sparrow_context* ctx, const Test& t, int32_t depth) {
  if (t.n_gen == 0) return 0;
  double kv = 0;
  for (int32_t i = 0; i < t.n_gen; ++i) kv += double(sparrow_context_kv_bytes_read(ctx, depth + i));
  return double(sparrow_model_weight_bytes_per_token(model)) + kv / t.n_gen;
}

// Every test at every depth for one KV configuration, in one context sized for the deepest test.
std::vector<Result> bench_config(sparrow_model* model, const BenchOptions& o, const std::vector<Test>& all_tests,
                                 const KvConfig& kv) {
  int32_t longest = 0;
  for (const Test& t : all_tests) longest = std::max(longest, t.tokens());
  const int32_t max_depth = *std::max_element(o.depths.begin(), o.depths.end());
  ContextPtr owner = open_context(model, o, kv, max_depth + longest);
  sparrow_context* ctx = owner.get();
  const double kv_mib = double(sparrow_context_kv_bytes(ctx)) / (1 << 20);
  std::cerr << "KV " << kv.name() << ":\n" << sparrow_context_kv_summary(ctx) << "\n";

  // The same token stream for every configuration, so that codecs are compared on equal inputs.
  std::mt19937 rng(1);
  const int32_t n_vocab = sparrow_model_n_vocab(model);
  DepthKeeper keeper(ctx, n_vocab, rng);
  // One untimed run of the first test, like llama-bench's warm-up: faults in weights and scratch.
  keeper.go_to(o.depths.front());
  time_decode(ctx, random_tokens(all_tests.front().tokens(), n_vocab, rng), all_tests.front().n_gen > 0);

  std::vector<Result> results;
  for (int32_t depth : o.depths) {
    for (const Test& t : all_tests) {
      Result r{kv.name(), t.name, t.n_prompt, t.n_gen, depth, kv_mib, {}, decode_bytes(model, ctx, t, depth)};
      for (int32_t i = 0; i < o.repetitions; ++i) {
        keeper.go_to(depth);
        const double seconds = time_decode(ctx, random_tokens(t.tokens(), n_vocab, rng), t.n_gen > 0);
        r.tokens_per_second.push_back(t.tokens() / seconds);
      }
      print_row(r);
      results.push_back(r);
    }
  }
  return results;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t value = line.find_first_not_of(" \t", line.find(':') + 1);
    return value == std::string::npos ? "unknown" : line.substr(value);
  }
  return "unknown";
}

// The commit of the checkout the binary was built in (build/sparrow sits one level below it), or "".
std::string git_commit() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const std::string cmd = "git -C '" + exe.parent_path().string() + "' rev-parse --short HEAD 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[64] = {0};
  std::string out = fgets(buf, sizeof buf, p) ? buf : "";
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// The command line as typed (before -ctk/-ctv were rewritten), from /proc.
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!all.empty() && all.back() == '\0') all.pop_back();
  std::replace(all.begin(), all.end(), '\0', ' ');
  return all;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

void write_json(const std::string& path, const BenchOptions& o, const std::string& model_path, sparrow_model* model,
                const std::vector<Result>& results) {
  const int cores = int(std::thread::hardware_concurrency());
  nlohmann::ordered_json j;  // keys in the order docs/bench.md lists them
  j["engine"] = "sparrow";
  j["date"] = utc_now();
  j["model"] = std::filesystem::path(model_path).filename().string();
  j["model_description"] = sparrow_model_describe(model);
  j["machine"] = {{"cpu", cpu_model()}, {"cores", cores}};
  j["device"] = sparrow_model_placement(model);
  j["weight_bytes_per_token"] = sparrow_model_weight_bytes_per_token(model);
  j["commit"] = git_commit();
  j["command"] = command_line();
  j["threads"] = o.threads > 0 ? o.threads : cores;
  j["n_batch"] = o.n_batch;
  j["repetitions"] = o.repetitions;
  j["results"] = nlohmann::ordered_json::array();
  for (const Result& r : results)
    j["results"].push_back({{"kv", r.kv}, {"test", r.test}, {"n_prompt", r.n_prompt}, {"n_gen", r.n_gen},
                            {"depth", r.depth}, {"tokens_per_second", r.mean()}, {"stddev", r.stddev()},
                            {"samples", r.tokens_per_second}, {"kv_mib", r.kv_mib},
                            {"bytes_per_token", r.bytes_per_token},
                            {"gb_per_s", r.bytes_per_token * r.mean() / 1e9}});
  std::ofstream out(path);
  if (!out) throw Error(path + ": cannot open for writing");
  out << j.dump(2) << "\n";
}

void add_options(CLI::App& cmd, BenchOptions& o) {
  cmd.add_option("-m,--model", o.model_path, "GGUF model file (default: Gemma 3 270M from its pip package)");
  add_load_options(cmd, o.load);
  cmd.add_option("-t,--threads", o.threads, "worker threads (0: all cores)");
  cmd.add_option("-b,--batch-size", o.n_batch, "tokens per forward pass during prompt processing");
  cmd.add_option("-p,--n-prompt", o.prompt_sizes, "prompt sizes (pp tests)")->delimiter(',');
  cmd.add_option("-n,--n-gen", o.generate_sizes, "generation lengths (tg tests)")->delimiter(',');
  cmd.add_option("-d,--depth", o.depths, "tokens already in the cache before each test")->delimiter(',');
  auto* k = cmd.add_option("--cache-type-k", o.cache_types_k, "K codecs (-ctk), e.g. f16,q8_0,tbq4")->delimiter(',');
  auto* v = cmd.add_option("--cache-type-v", o.cache_types_v, "V codecs (-ctv); every K is run with every V")
                ->delimiter(',');
  cmd.add_option("--kv", o.kv_pairs, "explicit K/V pairs instead of -ctk x -ctv, e.g. f16/f16,tbq4/tbq3")
      ->delimiter(',')
      ->excludes(k)
      ->excludes(v);
  cmd.add_option("--kv-bits", o.kv_bits,
                 "also the best measured KV configuration of at most B bits per element, for each B (e.g. 4.5,3.2)")
      ->delimiter(',');
  cmd.add_option("-r,--repetitions", o.repetitions, "runs per test");
  cmd.add_option("--json", o.json_path, "write results as JSON to this file (plot it with scripts/plot-bench)");
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("bench", "prompt processing and generation speed per KV cache type and depth");
  auto o = std::make_shared<BenchOptions>();
  add_options(*cmd, *o);
  cmd->callback([=, &exit_code] {
    check_sizes(*o);
    o->threads = checked_threads(o->threads);
    const std::vector<Test> all_tests = tests(*o);
    const std::vector<KvConfig> configs = kv_configs(*o);
    LoadedModel m(o->model_path, o->load);
    check_configs_open(m.model, *o, configs);

    std::vector<Result> results;
    print_table_header();
    for (const KvConfig& kv : configs) {
      std::vector<Result> rows = bench_config(m.model, *o, all_tests, kv);
      results.insert(results.end(), rows.begin(), rows.end());
    }
    if (!o->json_path.empty()) write_json(o->json_path, *o, m.path, m.model, results);
    exit_code = 0;
  });
}

}  // namespace sparrow::tools
