// CPU matmul, get_rows and the thread pool, against slow references written here: dequantize_row followed
// by a double-precision dot product.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include "cpu/matmul.h"
#include "cpu/thread_pool.h"
#include "formats/weight_formats.h"
#include "formats/weight_interleave.h"
#include "ggml_activations.h"
#include "util/error.h"

namespace sparrow::cpu {
namespace {

struct TypeCase {
  TensorType type;
  const char* name;
  int block_elements;
  size_t block_bytes;
  std::vector<size_t> half_fields;  // byte offsets of f16 scales inside a block
  bool int8_activations;            // multiplied with 8-bit quantized activations
};

const std::vector<TypeCase>& all_types() {
  using namespace formats;
  static const std::vector<TypeCase> types = {
      {TensorType::F32, "f32", 1, 4, {}, false},
      {TensorType::F16, "f16", 1, 2, {}, false},
      {TensorType::BF16, "bf16", 1, 2, {}, false},
      {TensorType::Q8_0, "q8_0", 32, sizeof(BlockQ8_0), {0}, true},
      {TensorType::Q4_0, "q4_0", 32, sizeof(BlockQ4_0), {0}, true},
      {TensorType::Q4_1, "q4_1", 32, sizeof(BlockQ4_1), {0, 2}, true},
      {TensorType::Q5_0, "q5_0", 32, sizeof(BlockQ5_0), {0}, true},
      {TensorType::Q5_1, "q5_1", 32, sizeof(BlockQ5_1), {0, 2}, true},
      {TensorType::Q4_K, "q4_K", 256, sizeof(BlockQ4_K), {0, 2}, true},
      {TensorType::Q5_K, "q5_K", 256, sizeof(BlockQ5_K), {0, 2}, true},
      {TensorType::Q6_K, "q6_K", 256, sizeof(BlockQ6_K), {offsetof(BlockQ6_K, d)}, true},
  };
  return types;
}

// Weight bytes: random quant bits with scales in +-[1/512, 1/16] for block types (every bit pattern of the
// quants occurs, including the extreme Q6_K scale -128), Gaussian values for float types.
std::vector<uint8_t> random_weights(const TypeCase& c, int64_t n_in, int64_t n_out, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t n = n_in * n_out;
  std::vector<uint8_t> bytes(size_t(n / c.block_elements) * c.block_bytes);
  if (c.block_elements == 1) {
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> values(n);
    for (auto& v : values) v = gauss(rng);
    formats::quantize_row(c.type, values.data(), bytes.data(), n);
    return bytes;
  }
  for (auto& b : bytes) b = uint8_t(rng());
  std::uniform_real_distribution<float> magnitude(1.0f / 512, 1.0f / 16);
  for (size_t block = 0; block < bytes.size() / c.block_bytes; ++block) {
    for (size_t offset : c.half_fields) {
      const float scale = (rng() & 1 ? 1.0f : -1.0f) * magnitude(rng);
      const uint16_t h = formats::f32_to_f16(scale);
      std::memcpy(bytes.data() + block * c.block_bytes + offset, &h, 2);
    }
  }
  return bytes;
}

// Activations with a few outliers, like real hidden states.
std::vector<float> random_activations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = gauss(rng);
  for (int64_t i = 0; i < n; i += 97) x[i] *= 20.0f;
  return x;
}

std::vector<float> dequantized_matrix(const TypeCase& c, const std::vector<uint8_t>& bytes, int64_t n_in,
                                      int64_t n_out) {
  std::vector<float> w(n_in * n_out);
  const size_t row_bytes = size_t(n_in / c.block_elements) * c.block_bytes;
  for (int64_t o = 0; o < n_out; ++o) {
    formats::dequantize_row(c.type, bytes.data() + o * row_bytes, w.data() + o * n_in, n_in);
  }
  return w;
}

// Hard bound on one output's error. Int8 activations: each x_i is rounded to a step of amax(group)/127, so it
// moves by at most step/2 and the output by at most sum_i |w_i| * step_i / 2; float accumulation is covered
// by 1e-4 relative slack (of sum_i |w_i x_i|). Float activations: float accumulation only, at most
// n_in * 2^-23 * sum_i |w_i x_i| (a loose worst case; real errors are far smaller).
double error_bound(const TypeCase& c, const float* w, const float* x, int64_t n_in) {
  double abs_dot = 0, rounding = 0;
  const int group = c.block_elements == 256 ? 256 : 32;
  for (int64_t g = 0; g < n_in; g += group) {
    double amax = 0;
    for (int64_t i = g; i < std::min(n_in, g + group); ++i) amax = std::max(amax, std::fabs(double(x[i])));
    for (int64_t i = g; i < std::min(n_in, g + group); ++i) {
      abs_dot += std::fabs(double(w[i]) * x[i]);
      rounding += std::fabs(double(w[i])) * amax / 127.0 / 2;
    }
  }
  // f16 / bf16 weights see activations rounded to their own type (half an ulp: 2^-11, 2^-8 relative).
  const double activation_rounding = c.type == TensorType::F16 ? 0x1.0p-11 : c.type == TensorType::BF16 ? 0x1.0p-8 : 0;
  if (!c.int8_activations) return (double(n_in) * 0x1.0p-23 + activation_rounding) * abs_dot + 1e-30;
  // The block scale is rounded to f16 on top of the 8-bit steps: 2^-11 of the block's contribution.
  return rounding * 1.0001 + (1e-4 + 0x1.0p-11) * abs_dot + 1e-30;
}

// Types with a per-block minimum (Q4_1, Q5_1) add min * f16(d * sum q) in ggml, which differs from
// min * sum(scale * q) by up to 2^-11 of that term.
bool has_block_min(TensorType t) { return t == TensorType::Q4_1 || t == TensorType::Q5_1; }

struct Shape {
  int64_t n_in, n_out;
};

// Rows in the file's layout rearranged eight at a time (formats/weight_interleave.h).
std::vector<uint8_t> interleaved(const TypeCase& c, const std::vector<uint8_t>& file_rows, Shape s) {
  std::vector<uint8_t> out(file_rows.size());
  const int64_t n_blocks = s.n_in / c.block_elements;
  const size_t row_bytes = size_t(n_blocks) * c.block_bytes, group_bytes = formats::kInterleavedRows * row_bytes;
  for (int64_t g = 0; g < s.n_out / formats::kInterleavedRows; ++g) {
    formats::interleave_rows(c.type, file_rows.data() + size_t(g) * group_bytes, row_bytes, n_blocks,
                             out.data() + size_t(g) * group_bytes);
  }
  return out;
}

enum class Layout { kFile, kInterleaved };

void check_matmul(const TypeCase& c, Shape s, int64_t n_tokens, ThreadPool& pool, uint32_t seed,
                  Layout layout = Layout::kFile) {
  const auto bytes = random_weights(c, s.n_in, s.n_out, seed);
  const auto w = dequantized_matrix(c, bytes, s.n_in, s.n_out);
  const auto x = random_activations(s.n_in * n_tokens, seed + 1);
  std::vector<float> y(n_tokens * s.n_out, NAN);
  const bool is_interleaved = layout == Layout::kInterleaved;
  const auto stored = is_interleaved ? interleaved(c, bytes, s) : bytes;
  matmul(pool, WeightMatrix{c.type, stored.data(), s.n_in, s.n_out, is_interleaved}, x.data(), n_tokens, y.data());
  // The kernels' only approximation is the 8-bit activation rounding: against activations rounded the same
  // way, what is left is float accumulation order (1e-5 of sum |w x|).
  const auto x8 = testing::ggml_activations(formats::weight_format(c.type, "test").activation, x);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t o = 0; o < s.n_out; ++o) {
      const float* wr = w.data() + o * s.n_in;
      const float* xt = x.data() + t * s.n_in;
      const float* x8t = x8.data() + t * s.n_in;
      double want = 0, want8 = 0, abs_dot = 0, min_terms = 0;
      for (int64_t i = 0; i < s.n_in; ++i) {
        want += double(wr[i]) * xt[i];
        want8 += double(wr[i]) * x8t[i];
        abs_dot += std::fabs(double(wr[i]) * x8t[i]);
      }
      if (has_block_min(c.type))
        for (int64_t b = 0; b < s.n_in; b += 32) {
          double wmax = 0, xsum = 0;
          for (int64_t i = b; i < b + 32; ++i) wmax = std::max(wmax, std::fabs(double(wr[i]))), xsum += x8t[i];
          min_terms += wmax * std::fabs(xsum);
        }
      const double got = y[t * s.n_out + o];
      const auto where = [&] {
        return std::string(c.name) + (is_interleaved ? " interleaved" : "") + " n_in=" + std::to_string(s.n_in) + " n_out=" + std::to_string(s.n_out) +
               " tokens=" + std::to_string(n_tokens) + " threads=" + std::to_string(pool.size()) + " token " +
               std::to_string(t) + " row " + std::to_string(o);
      };
      ASSERT_LE(std::fabs(got - want), error_bound(c, wr, xt, s.n_in)) << where() << ": got " << got << ", want " << want;
      ASSERT_LE(std::fabs(got - want8), 1e-5 * abs_dot + 0x1.0p-10 * min_terms + 1e-30)
          << where() << ": got " << got << ", want " << want8;
    }
  }
}

TEST(Matmul, MatchesDequantizedDoubleDotForEveryTypeShapeAndThreadCount) {
  ThreadPool one(1), two(2);
  uint32_t seed = 1;
  for (const auto& c : all_types()) {
    for (Shape s : {Shape{256, 67}, Shape{512, 33}, Shape{2560, 7}}) {
      for (int64_t n_tokens : {1, 3, 17, 37}) {  // 37: whole prompt GEMM tiles plus a remainder on every target
        check_matmul(c, s, n_tokens, one, seed++);
        check_matmul(c, s, n_tokens, two, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Dynamic dispatch picks the best target of this CPU; the others (down to the scalar fallback, which stands
// in for targets we cannot run here, like NEON) must compute the same products.
TEST(Matmul, EverySimdTargetCompiledInMatchesTheReference) {
  ThreadPool two(2);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    SCOPED_TRACE(hwy::TargetName(target));
    uint32_t seed = 100;
    for (const auto& c : all_types()) {
      for (int64_t n_tokens : {1, 5, 37}) check_matmul(c, Shape{512, 19}, n_tokens, two, seed++);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

const TypeCase& type_case(TensorType type) {
  for (const auto& c : all_types()) {
    if (c.type == type) return c;
  }
  throw std::logic_error("no case for that type");
}

// Interleaved rows (the CPU weight store's layout where cpu::matmul_interleaves): the same products as the
// file's layout, for one token (the interleaved kernels), a few (tokens over a group's rows) and a prompt (the
// GEMM, which reads the rows back in the file's layout), on every thread count and SIMD target.
TEST(Matmul, InterleavedRowsMatchTheReference) {
  ThreadPool one(1), two(2);
  uint32_t seed = 300;
  for (TensorType type : {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q8_0, TensorType::Q5_0, TensorType::Q4_0, TensorType::Q6_K}) {
    for (Shape s : {Shape{256, 8}, Shape{512, 64}, Shape{2560, 24}}) {
      for (int64_t n_tokens : {1, 3, 37}) {
        check_matmul(type_case(type), s, n_tokens, one, seed++, Layout::kInterleaved);
        check_matmul(type_case(type), s, n_tokens, two, seed++, Layout::kInterleaved);
        if (HasFatalFailure()) return;
      }
    }
  }
  // A prompt over a matrix of more than 4 MiB: the GEMM takes its rows back to the file's layout in slabs.
  check_matmul(type_case(TensorType::Q8_0), Shape{2560, 1600}, 37, two, seed++, Layout::kInterleaved);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    SCOPED_TRACE(hwy::TargetName(target));
    for (TensorType type : {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q8_0, TensorType::Q5_0, TensorType::Q4_0, TensorType::Q6_K}) {
      for (int64_t n_tokens : {1, 5, 37}) check_matmul(type_case(type), Shape{512, 16}, n_tokens, two, seed++, Layout::kInterleaved);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

TEST(Matmul, InterleavedRowsComeInWholeGroupsOfATypeWithThatLayout) {
  ThreadPool pool(1);
  std::vector<uint8_t> bytes(16 * sizeof(formats::BlockQ4_K));
  std::vector<float> x(512), y(16);
  EXPECT_THROW(matmul(pool, WeightMatrix{TensorType::Q4_K, bytes.data(), 256, 12, true}, x.data(), 1, y.data()), Error);
  EXPECT_THROW(matmul(pool, WeightMatrix{TensorType::Q4_1, bytes.data(), 256, 8, true}, x.data(), 1, y.data()), Error);
  const int32_t id = 0;
  EXPECT_THROW(get_rows(WeightMatrix{TensorType::Q4_K, bytes.data(), 256, 4, true}, &id, 1, x.data()), Error);
}

TEST(Matmul, FloatTypesHandleRowsThatAreNotAMultipleOfTheVectorWidth) {
  ThreadPool two(2);
  for (const auto& c : all_types()) {
    if (c.block_elements != 1) continue;
    for (int64_t n_in : {1, 7, 37, 129}) check_matmul(c, Shape{n_in, 5}, 3, two, uint32_t(n_in));
  }
}

// The VNNI kernels multiply 32-element blocks two at a time: an odd block count leaves a last block alone.
TEST(Matmul, BlockTypesHandleAnOddNumberOfBlocks) {
  ThreadPool two(2);
  for (const auto& c : all_types()) {
    if (c.block_elements != 32) continue;
    for (int64_t n_in : {32, 96, 288}) {
      for (int64_t n_tokens : {1, 8, 11}) check_matmul(c, Shape{n_in, 9}, n_tokens, two, uint32_t(n_in + n_tokens));
    }
  }
}

TEST(Matmul, ThreadCountDoesNotChangeResults) {
  ThreadPool one(1), two(2);
  for (const auto& c : all_types()) {
    const Shape s{512, 301};
    const auto bytes = random_weights(c, s.n_in, s.n_out, 5);
    const auto x = random_activations(s.n_in * 9, 6);
    std::vector<float> y1(9 * s.n_out), y2(9 * s.n_out);
    const WeightMatrix w{c.type, bytes.data(), s.n_in, s.n_out};
    matmul(one, w, x.data(), 9, y1.data());
    matmul(two, w, x.data(), 9, y2.data());
    EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0) << c.name;
  }
}

TEST(Matmul, RejectsBadShapesAndTypes) {
  ThreadPool pool(1);
  std::vector<uint8_t> bytes(4096);
  std::vector<float> x(512), y(512);
  EXPECT_THROW(matmul(pool, WeightMatrix{TensorType::Q4_K, bytes.data(), 100, 2}, x.data(), 1, y.data()), Error);
  EXPECT_THROW(matmul(pool, WeightMatrix{TensorType::Q2_K, bytes.data(), 256, 1}, x.data(), 1, y.data()), Error);
  EXPECT_THROW(matmul(pool, WeightMatrix{TensorType::Q8_0, nullptr, 32, 1}, x.data(), 1, y.data()), Error);
}

TEST(GetRows, EqualsDequantizeRowBitForBit) {
  for (const auto& c : all_types()) {
    const Shape s{512, 41};
    const auto bytes = random_weights(c, s.n_in, s.n_out, 11);
    const auto w = dequantized_matrix(c, bytes, s.n_in, s.n_out);
    const std::vector<int32_t> ids = {0, 40, 7, 7, 13};
    std::vector<float> out(ids.size() * s.n_in);
    get_rows(WeightMatrix{c.type, bytes.data(), s.n_in, s.n_out}, ids.data(), int64_t(ids.size()), out.data());
    for (size_t r = 0; r < ids.size(); ++r) {
      EXPECT_EQ(std::memcmp(out.data() + r * s.n_in, w.data() + ids[r] * s.n_in, s.n_in * sizeof(float)), 0)
          << c.name << " id " << ids[r];
    }
    const int32_t bad = 41;
    EXPECT_THROW(get_rows(WeightMatrix{c.type, bytes.data(), s.n_in, s.n_out}, &bad, 1, out.data()), Error);
  }
}

TEST(GetRows, InterleavedRowsEqualDequantizeRowBitForBit) {
  for (TensorType type : {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q8_0, TensorType::Q5_0, TensorType::Q4_0, TensorType::Q6_K}) {
    const TypeCase& c = type_case(type);
    const Shape s{512, 48};
    const auto bytes = random_weights(c, s.n_in, s.n_out, 12);
    const auto w = dequantized_matrix(c, bytes, s.n_in, s.n_out);
    const auto stored = interleaved(c, bytes, s);
    const std::vector<int32_t> ids = {0, 47, 7, 8, 8, 21};
    std::vector<float> out(ids.size() * s.n_in);
    get_rows(WeightMatrix{type, stored.data(), s.n_in, s.n_out, true}, ids.data(), int64_t(ids.size()), out.data());
    for (size_t r = 0; r < ids.size(); ++r) {
      EXPECT_EQ(std::memcmp(out.data() + r * s.n_in, w.data() + ids[r] * s.n_in, s.n_in * sizeof(float)), 0)
          << c.name << " id " << ids[r];
    }
  }
}

// ---------------------------------------------------------------------------------------------------------

TEST(ThreadPool, RunsEveryTaskExactlyOnceOnValidThreads) {
  for (int n_threads : {1, 2, 3}) {
    ThreadPool pool(n_threads);
    EXPECT_EQ(pool.size(), n_threads);
    for (int64_t n_tasks : {0, 1, 2, 5, 1000}) {
      for (int repeat = 0; repeat < 20; ++repeat) {
        std::vector<std::atomic<int>> hits(n_tasks);
        std::atomic<bool> bad_thread{false};
        pool.parallel_for(n_tasks, [&](int64_t task, int thread) {
          hits[task].fetch_add(1);
          if (thread < 0 || thread >= n_threads) bad_thread = true;
        });
        for (int64_t t = 0; t < n_tasks; ++t) ASSERT_EQ(hits[t].load(), 1) << "task " << t;
        ASSERT_FALSE(bad_thread.load());
      }
    }
  }
}

TEST(ThreadPool, UsesSeveralThreadsAndPropagatesExceptions) {
  ThreadPool pool(2);
  std::atomic<int> per_thread[2] = {0, 0};
  // The caller may finish a loop alone when the worker is not scheduled in time (by design), so the first
  // task on the caller's thread holds it until the worker has run a task (or 10 s pass).
  pool.parallel_for(64, [&](int64_t, int thread) {
    per_thread[thread].fetch_add(1);
    if (thread == 0 && per_thread[0].load() == 1) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (per_thread[1].load() == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    }
  });
  EXPECT_EQ(per_thread[0] + per_thread[1], 64);
  EXPECT_GT(per_thread[1].load(), 0) << "the worker thread never ran a task";
  EXPECT_THROW(pool.parallel_for(10, [](int64_t task, int) {
    if (task == 3) throw std::runtime_error("task 3 failed");
  }),
               std::runtime_error);
  std::atomic<int> after{0};
  pool.parallel_for(10, [&](int64_t, int) { after.fetch_add(1); });  // still usable after a throw
  EXPECT_EQ(after.load(), 10);
}

// Workers that wake late (descheduled on a busy machine) must never run a task of a loop that has already
// returned: each loop's function checks that its loop is still the current one.
TEST(ThreadPool, LateWorkersNeverRunAFinishedLoop) {
  ThreadPool pool(4);  // more threads than this machine may have cores, so some wake late
  std::atomic<int> current_loop{-1};
  std::atomic<int> stale_runs{0};
  for (int loop = 0; loop < 3000; ++loop) {
    current_loop = loop;
    std::atomic<int> done{0};
    const int n_tasks = 1 + loop % 7;
    pool.parallel_for(n_tasks, [&, loop](int64_t, int) {
      if (current_loop.load() != loop) stale_runs.fetch_add(1);
      done.fetch_add(1);
    });
    ASSERT_EQ(done.load(), n_tasks) << "loop " << loop;
  }
  EXPECT_EQ(stale_runs.load(), 0);
}

TEST(ThreadPool, NestedLoopsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.parallel_for(4, [&](int64_t, int) { pool.parallel_for(3, [&](int64_t, int) { inner.fetch_add(1); }); });
  EXPECT_EQ(inner.load(), 12);
}

}  // namespace
}  // namespace sparrow::cpu
