// Decode GEMVs (one token) of the quantized weight types against a plain read of the same bytes, the bandwidth
// a GEMV could reach on this machine (issue 14: "per-matrix GEMV within 10% of the memory bandwidth that a plain
// read of the same bytes reaches").
//
//   sparrow_cpu_gemv_bench [--json FILE] [--mb MB] [--rounds N] [--threads 1,2] [--gemm-tokens N]
//
// Each matrix (type x row length) holds about MB of weights, beyond the caches: its rows are copies of one
// quantized Gaussian row (a GEMV's speed does not depend on the values). Per thread count, each round times a
// plain read of the matrix's bytes (a SIMD sum, split over the same thread pool) and then the GEMV, back to back,
// so that a noisy neighbour hurts both; the table gives each one's median GB/s over the rounds and the median of
// the per-round ratios. Run through scripts/bench-cpu, which records machine and commit.
// With --gemm-tokens N it times the prompt GEMM instead: each type times N tokens at once, in multiply-adds per
// second (the prompt speed's kernel; a matrix of 2048 rows, small enough to stay in cache between rounds).

// Highway's per-target compilation of this file, for the plain read.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/cpu_gemv_bench.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace sparrow::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sum of the 64-bit words in [p, p + n_bytes), n_bytes a multiple of 4 vectors: every byte is loaded once.
uint64_t SumWords(const uint8_t* p, size_t n_bytes) {
  const hn::ScalableTag<uint64_t> d;
  const size_t step = hn::Lanes(d) * sizeof(uint64_t);
  auto a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 4 * step <= n_bytes; i += 4 * step) {
    a0 = hn::Add(a0, hn::LoadU(d, reinterpret_cast<const uint64_t*>(p + i)));
    a1 = hn::Add(a1, hn::LoadU(d, reinterpret_cast<const uint64_t*>(p + i + step)));
    a2 = hn::Add(a2, hn::LoadU(d, reinterpret_cast<const uint64_t*>(p + i + 2 * step)));
    a3 = hn::Add(a3, hn::LoadU(d, reinterpret_cast<const uint64_t*>(p + i + 3 * step)));
  }
  uint64_t sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; i < n_bytes; ++i) sum += p[i];
  return sum;
}

}  // namespace sparrow::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpu/matmul.h"
#include "cpu/thread_pool.h"
#include "formats/weight_formats.h"
#include "ops/backend.h"
#include "util/error.h"

namespace sparrow::bench {
HWY_EXPORT(SumWords);

struct MatrixCase {
  TensorType type;
  int64_t n_in;
};

// The types of issue 14, at Gemma 3 270M's hidden size (640) where it has them and at 2048.
const std::vector<MatrixCase> kCases = {
    {TensorType::Q8_0, 640}, {TensorType::Q8_0, 2048}, {TensorType::Q5_0, 640}, {TensorType::Q5_0, 2048},
    {TensorType::Q4_0, 2048}, {TensorType::Q4_K, 2048}, {TensorType::Q5_K, 2048}, {TensorType::Q6_K, 2048},
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The matrix's bytes read once, split into as many tasks as the GEMV's rows are (a few per thread).
double time_plain_read(cpu::ThreadPool& pool, const uint8_t* data, size_t size) {
  const int64_t n_tasks = 8 * int64_t(pool.size());
  const size_t chunk = (size / size_t(n_tasks) + 255) / 256 * 256;
  std::atomic<uint64_t> sink{0};
  const auto t0 = std::chrono::steady_clock::now();
  pool.parallel_for(n_tasks, [&](int64_t task, int) {
    const size_t begin = std::min(size, size_t(task) * chunk);
    const size_t end = std::min(size, begin + chunk);
    sink += HWY_DYNAMIC_DISPATCH(SumWords)(data + begin, end - begin);
  });
  const double s = seconds_since(t0);
  if (sink.load() == 42) std::puts("");  // keeps the sum alive
  return s;
}

double time_gemv(cpu::ThreadPool& pool, const WeightMatrix& w, const std::vector<float>& x, std::vector<float>& y) {
  const auto t0 = std::chrono::steady_clock::now();
  cpu::matmul(pool, w, x.data(), 1, y.data());
  return seconds_since(t0);
}

// A Gaussian row of n_in elements quantized as `type`, copied into n_out rows.
std::vector<uint8_t> quantized_matrix(TensorType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
  const size_t row_bytes = tensor_row_bytes(type, n_in);
  std::vector<float> row(static_cast<size_t>(n_in));
  std::normal_distribution<float> gauss;
  for (float& v : row) v = gauss(rng);
  std::vector<uint8_t> bytes(row_bytes * size_t(n_out));
  formats::quantize_row(type, row.data(), bytes.data(), n_in);
  for (int64_t r = 1; r < n_out; ++r) std::memcpy(bytes.data() + size_t(r) * row_bytes, bytes.data(), row_bytes);
  return bytes;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

nlohmann::ordered_json run_case(const MatrixCase& c, int64_t target_bytes, int rounds, int threads) {
  const size_t row_bytes = tensor_row_bytes(c.type, c.n_in);
  // Whole groups of 8 rows, as model matrices have (the weight store interleaves only those).
  const int64_t n_out = std::max<int64_t>(8, target_bytes / int64_t(row_bytes) / 8 * 8);
  std::mt19937 rng(1);
  std::normal_distribution<float> gauss;
  const std::vector<uint8_t> bytes = quantized_matrix(c.type, c.n_in, n_out, rng);
  std::vector<float> x(static_cast<size_t>(c.n_in)), y(static_cast<size_t>(n_out));
  for (float& v : x) v = gauss(rng);
  // As a model holds it: through the CPU weight store, which may rearrange it (WeightMatrix::interleaved).
  const auto store = make_cpu_weight_store();
  const WeightMatrix w = store->place(WeightMatrix{c.type, bytes.data(), c.n_in, n_out}, false, WeightUse::kMatmul);

  cpu::ThreadPool pool(threads);
  // The bytes the GEMV reads (the store's copy where it rearranged them), read plainly.
  const auto* placed = static_cast<const uint8_t*>(w.data);
  time_plain_read(pool, placed, bytes.size());  // warm-up: pages touched, threads started
  time_gemv(pool, w, x, y);
  std::vector<double> read_gbps, gemv_gbps, ratios;
  for (int i = 0; i < rounds; ++i) {
    const double read_s = time_plain_read(pool, placed, bytes.size()), gemv_s = time_gemv(pool, w, x, y);
    read_gbps.push_back(double(bytes.size()) / read_s / 1e9);
    gemv_gbps.push_back(double(bytes.size()) / gemv_s / 1e9);
    ratios.push_back(read_s / gemv_s);
  }
  nlohmann::ordered_json row_json;
  row_json["type"] = std::string(tensor_type_info(c.type)->name);
  row_json["n_in"] = c.n_in;
  row_json["n_out"] = n_out;
  row_json["bytes"] = bytes.size();
  row_json["interleaved"] = w.interleaved;
  row_json["threads"] = threads;
  row_json["rounds"] = rounds;
  row_json["read_gb_per_s"] = median(read_gbps);
  row_json["gemv_gb_per_s"] = median(gemv_gbps);
  row_json["gemv_over_read"] = median(ratios);
  row_json["gemv_over_read_min"] = *std::min_element(ratios.begin(), ratios.end());
  row_json["gemv_over_read_max"] = *std::max_element(ratios.begin(), ratios.end());
  return row_json;
}

// The prompt GEMM of n_tokens tokens against a 2048-row matrix: median multiply-adds per second over the rounds.
nlohmann::ordered_json run_gemm_case(const MatrixCase& c, int64_t n_tokens, int rounds, int threads) {
  const int64_t n_out = 2048;
  std::mt19937 rng(1);
  std::normal_distribution<float> gauss;
  const std::vector<uint8_t> bytes = quantized_matrix(c.type, c.n_in, n_out, rng);
  std::vector<float> x(size_t(c.n_in * n_tokens)), y(size_t(n_out * n_tokens));
  for (float& v : x) v = gauss(rng);
  const auto store = make_cpu_weight_store();
  const WeightMatrix w = store->place(WeightMatrix{c.type, bytes.data(), c.n_in, n_out}, false, WeightUse::kMatmul);
  cpu::ThreadPool pool(threads);
  cpu::matmul(pool, w, x.data(), n_tokens, y.data());  // warm-up
  std::vector<double> gmacs;
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::matmul(pool, w, x.data(), n_tokens, y.data());
    gmacs.push_back(double(c.n_in) * double(n_out) * double(n_tokens) / seconds_since(t0) / 1e9);
  }
  nlohmann::ordered_json row_json;
  row_json["type"] = std::string(tensor_type_info(c.type)->name);
  row_json["n_in"] = c.n_in;
  row_json["n_out"] = n_out;
  row_json["tokens"] = n_tokens;
  row_json["threads"] = threads;
  row_json["rounds"] = rounds;
  row_json["gmac_per_s"] = median(gmacs);
  row_json["gmac_per_s_best"] = *std::max_element(gmacs.begin(), gmacs.end());  // steadier than the median when noisy
  return row_json;
}

std::vector<int> parse_threads(const std::string& list) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = list.find(',', start);
    const std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const int n = std::atoi(item.c_str());
    if (n <= 0) throw Error("--threads: '" + item + "' is not a positive thread count");
    out.push_back(n);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int run_gemm(int64_t n_tokens, int rounds, const std::vector<int>& threads, const std::string& json_path) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::printf("| type | n_in | tokens | threads | GMAC/s (median) | best |\n|---|---:|---:|---:|---:|---:|\n");
  for (const MatrixCase& c : kCases) {
    for (int t : threads) {
      const auto r = run_gemm_case(c, n_tokens, rounds, t);
      std::printf("| %s | %lld | %lld | %d | %.1f | %.1f |\n", r["type"].get<std::string>().c_str(), (long long)c.n_in,
                  (long long)n_tokens, t, r["gmac_per_s"].get<double>(), r["gmac_per_s_best"].get<double>());
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << nlohmann::ordered_json{{"gemm_tokens", n_tokens}, {"rows", rows}}.dump(2) << "\n";
  return 0;
}

int run(int argc, char** argv) {
  std::string json_path, thread_list = "1,2";
  int64_t mb = 256, gemm_tokens = 0;
  int rounds = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--json" && has_value) json_path = argv[++i];
    else if (arg == "--mb" && has_value) mb = std::atoll(argv[++i]);
    else if (arg == "--rounds" && has_value) rounds = std::atoi(argv[++i]);
    else if (arg == "--threads" && has_value) thread_list = argv[++i];
    else if (arg == "--gemm-tokens" && has_value) gemm_tokens = std::atoll(argv[++i]);
    else throw Error("unknown argument " + arg + " (usage: sparrow_cpu_gemv_bench [--json FILE] [--mb MB] [--rounds N] [--threads 1,2] [--gemm-tokens N])");
  }
  if (mb <= 0 || rounds <= 0 || gemm_tokens < 0) throw Error("--mb, --rounds and --gemm-tokens must be positive");
  const std::vector<int> threads = parse_threads(thread_list);
  if (gemm_tokens > 0) return run_gemm(gemm_tokens, rounds, threads, json_path);

  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::printf("| type | n_in | MB | threads | plain read GB/s | GEMV GB/s | GEMV / read (min-max) |\n|---|---:|---:|---:|---:|---:|---:|\n");
  for (const MatrixCase& c : kCases) {
    for (int t : threads) {
      const auto r = run_case(c, mb << 20, rounds, t);
      std::printf("| %s | %lld | %.0f | %d | %.1f | %.1f | %.2f (%.2f-%.2f) |\n", r["type"].get<std::string>().c_str(),
                  (long long)c.n_in, r["bytes"].get<double>() / (1 << 20), t, r["read_gb_per_s"].get<double>(),
                  r["gemv_gb_per_s"].get<double>(), r["gemv_over_read"].get<double>(),
                  r["gemv_over_read_min"].get<double>(), r["gemv_over_read_max"].get<double>());
      std::fflush(stdout);
      rows.push_back(r);
    }
  }
  if (!json_path.empty()) {
    nlohmann::ordered_json j;
    j["mb_per_matrix"] = mb;
    j["rounds"] = rounds;
    j["rows"] = rows;
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace sparrow::bench

int main(int argc, char** argv) {
  try {
    return sparrow::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
#endif  // HWY_ONCE
