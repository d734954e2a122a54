// `sparrow bench`: llama-bench-style throughput. pp<N>: one prompt of N tokens in batches; tg<N>: N tokens
// decoded one at a time. Each test runs after filling the cache to a depth, repeated, on random tokens.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "commands.h"
#include "common.h"
#include "util/error.h"

namespace sparrow::tools {
namespace {

struct BenchOptions {
  std::vector<int32_t> prompt_sizes{512};
  std::vector<int32_t> generate_sizes{128};
  std::vector<int32_t> depths{0};
  int32_t repetitions = 3;
  std::string json_path;
};

struct Result {
  std::string test;  // "pp512", "tg128"
  int32_t depth;
  std::vector<double> tokens_per_second;
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

std::vector<sparrow_token> random_tokens(int32_t n, int32_t n_vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
  std::vector<sparrow_token> t(n);
  for (auto& x : t) x = pick(rng);
  return t;
}

void decode_or_throw(sparrow_context* ctx, const std::vector<sparrow_token>& tokens) {
  if (sparrow_decode(ctx, tokens.data(), int32_t(tokens.size()), 0) != 0) throw Error(sparrow_last_error());
}

// Seconds to run one pp or tg test after filling the cache to `depth` tokens (not timed).
double time_one(sparrow_context* ctx, int32_t n_vocab, bool prompt, int32_t n, int32_t depth, std::mt19937& rng) {
  sparrow_context_reset(ctx);
  if (depth > 0) decode_or_throw(ctx, random_tokens(depth, n_vocab, rng));
  std::vector<sparrow_token> tokens = random_tokens(n, n_vocab, rng);
  auto t0 = std::chrono::steady_clock::now();
  if (prompt) {
    decode_or_throw(ctx, tokens);
  } else {
    for (sparrow_token t : tokens) decode_or_throw(ctx, {t});
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("bench", "prompt processing and generation speed (llama-bench style)");
  auto model = std::make_shared<ModelOptions>();
  auto o = std::make_shared<BenchOptions>();
  add_model_options(*cmd, *model);
  cmd->add_option("-p,--n-prompt", o->prompt_sizes, "prompt sizes (pp tests)")->delimiter(',');
  cmd->add_option("-n,--n-gen", o->generate_sizes, "generation lengths (tg tests)")->delimiter(',');
  cmd->add_option("-d,--depth", o->depths, "tokens already in the cache before each test")->delimiter(',');
  cmd->add_option("-r,--repetitions", o->repetitions, "runs per test");
  cmd->add_option("--json", o->json_path, "write results as JSON to this file");
  cmd->callback([=, &exit_code] {
    if (o->repetitions < 1) throw Error("--repetitions must be at least 1");
    LoadedModel m(resolve_model_path(model->model_path));
    int32_t max_depth = 0, max_n = 0;
    for (int32_t d : o->depths) max_depth = std::max(max_depth, d);
    for (int32_t n : o->prompt_sizes) max_n = std::max(max_n, n);
    for (int32_t n : o->generate_sizes) max_n = std::max(max_n, n);
    ModelOptions mo = *model;
    if (mo.n_ctx == 0) mo.n_ctx = max_depth + max_n;
    Context ctx(m.model, mo);
    const int32_t n_vocab = sparrow_model_n_vocab(m.model);
    std::mt19937 rng(1);
    // One untimed warm-up pass faults in the weights.
    time_one(ctx.ctx, n_vocab, true, std::min(16, max_n), 0, rng);

    std::vector<Result> results;
    std::printf("| %-8s | %8s | %14s |\n|----------|---------:|---------------:|\n", "test", "depth", "tokens/s");
    for (int32_t depth : o->depths) {
      auto run = [&](bool prompt, int32_t n) {
        Result r{(prompt ? "pp" : "tg") + std::to_string(n), depth, {}};
        for (int32_t i = 0; i < o->repetitions; ++i)
          r.tokens_per_second.push_back(n / time_one(ctx.ctx, n_vocab, prompt, n, depth, rng));
        std::printf("| %-8s | %8d | %7.2f ± %5.2f |\n", r.test.c_str(), depth, r.mean(), r.stddev());
        std::fflush(stdout);
        results.push_back(r);
      };
      for (int32_t n : o->prompt_sizes) if (n > 0) run(true, n);
      for (int32_t n : o->generate_sizes) if (n > 0) run(false, n);
    }
    if (!o->json_path.empty()) {
      nlohmann::json j;
      j["engine"] = "sparrow";
      j["model"] = sparrow_model_describe(m.model);
      j["threads"] = mo.threads > 0 ? mo.threads : int(std::thread::hardware_concurrency());
      j["cache_type_k"] = mo.cache_type_k;
      j["cache_type_v"] = mo.cache_type_v;
      for (const Result& r : results)
        j["results"].push_back({{"test", r.test}, {"depth", r.depth}, {"tokens_per_second", r.mean()},
                                {"stddev", r.stddev()}, {"samples", r.tokens_per_second}});
      std::ofstream out(o->json_path);
      if (!out) throw Error(o->json_path + ": cannot open for writing");
      out << j.dump(2) << "\n";
    }
    exit_code = 0;
  });
}

}  // namespace sparrow::tools
