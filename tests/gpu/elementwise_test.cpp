// The CUDA backend's element-wise and row ops, transfers and weight placement, against scalar references
// written here from each op's definition (src/ops/backend.h), on random inputs from fixed seeds. Outputs are
// poisoned with NaN before every op, so an element the kernel skips shows up.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "formats/weight_formats.h"
#include "gpu_test_util.h"
#include "util/error.h"

namespace sparrow {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -3.0f, float hi = 3.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    SPARROW_REQUIRE_GPU();
    backend_ = std::make_unique<CudaBackend>(0);
  }
  // A device copy of `host`, preceded by `offset` floats (offset 1 makes it only 4-byte aligned).
  float* upload(const std::vector<float>& host, size_t offset = 0) {
    float* p = backend_->alloc(host.size() + offset) + offset;
    backend_->write(p, host.data(), host.size());
    return p;
  }
  float* poisoned(size_t n, size_t offset = 0) { return upload(std::vector<float>(n, kNaN), offset); }
  std::vector<float> download(const float* p, size_t n) {
    std::vector<float> host(n);
    backend_->read(p, host.data(), n);
    return host;
  }
  std::unique_ptr<CudaBackend> backend_;
};

void expect_near_relative(const std::vector<float>& got, const std::vector<double>& want, double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tolerance * std::max(1.0, std::fabs(want[i]))) << "element " << i;
}

void expect_equal(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
}

TEST_F(CudaOps, AllocationsAreZeroed) {
  const float* p = backend_->alloc(100003);
  for (float x : download(p, 100003)) ASSERT_EQ(x, 0.0f);
  const auto* bytes = static_cast<const float*>(backend_->alloc_bytes(4 * 777));
  for (float x : download(bytes, 777)) ASSERT_EQ(x, 0.0f);
}

TEST_F(CudaOps, FreedBuffersAreGoneAndUnknownPointersIgnored) {
  float* p = backend_->alloc(16);
  EXPECT_NO_THROW(backend_->free_buffer(p));
  EXPECT_NO_THROW(backend_->free_buffer(p));  // already freed: no longer the backend's, ignored
  int host_value = 0;
  EXPECT_NO_THROW(backend_->free_buffer(&host_value));  // never the backend's: ignored, as on the CPU
  EXPECT_EQ(download(upload({1.0f, 2.0f}), 2), (std::vector<float>{1.0f, 2.0f}));
}

// Rows held in registers (dim % 4 == 0 up to 8192), rows too long for that (10240) and rows of other lengths.
// 1 / sqrt(mean(v[0..dim)^2) + eps) in double.
double inverse_rms(const float* v, int64_t dim, double eps) {
  double squares = 0;
  for (int64_t i = 0; i < dim; ++i) squares += double(v[i]) * v[i];
  return 1.0 / std::sqrt(squares / double(dim) + eps);
}

TEST_F(CudaOps, RmsNormMatchesDoublePrecisionReference) {
  for (int64_t dim : {64, 256, 640, 1001, 5376, 10240}) {
    for (bool with_weight : {true, false}) {
      for (bool in_place : {false, true}) {
        const int64_t rows = 7;
        const float eps = 1e-6f;
        const std::vector<float> x = random_floats(rows * dim, uint32_t(dim) * 4 + with_weight * 2 + in_place);
        const std::vector<float> w = random_floats(dim, 99, 0.5f, 1.5f);
        std::vector<double> want(x.size());
        for (int64_t r = 0; r < rows; ++r) {
          const double inv = inverse_rms(x.data() + r * dim, dim, eps);
          for (int64_t i = 0; i < dim; ++i) want[r * dim + i] = x[r * dim + i] * inv * (with_weight ? w[i] : 1.0);
        }
        float* dx = upload(x);
        float* dy = in_place ? dx : poisoned(x.size());
        backend_->rms_norm(dx, with_weight ? upload(w) : nullptr, rows, dim, eps, dy);
        SCOPED_TRACE("dim " + std::to_string(dim) + (with_weight ? " weighted" : "") + (in_place ? " in place" : ""));
        expect_near_relative(download(dy, x.size()), want, 2e-6);
      }
    }
  }
}

// x = (x + (r = rms_norm(r) * r_weight)) * x_scale, then next = rms_norm(x) * next_weight, against double
// precision; the weighted cases take a layer output scale other than 1.
TEST_F(CudaOps, AddRmsNormMatchesDoublePrecisionReference) {
  for (int64_t dim : {64, 640, 1001, 1536, 5376, 10240}) {
    for (bool with_next : {true, false}) {
      for (bool with_weights : {true, false}) {
        const int64_t rows = 5;
        const float eps = 1e-6f;
        const uint32_t seed = uint32_t(dim) * 4 + with_next * 2 + with_weights;
        const std::vector<float> x = random_floats(rows * dim, seed), r = random_floats(rows * dim, seed + 1000, -9, 9);
        const std::vector<float> rw = random_floats(dim, 98, 0.5f, 1.5f), nw = random_floats(dim, 99, 0.5f, 1.5f);
        const float x_scale = with_weights ? 0.71f : 1.0f;
        std::vector<double> want_r(x.size()), want_x(x.size()), want_next(x.size());
        for (int64_t row = 0; row < rows; ++row) {
          const int64_t o = row * dim;
          const double inv = inverse_rms(r.data() + o, dim, eps);
          double x_squares = 0;
          for (int64_t i = 0; i < dim; ++i) {
            want_r[o + i] = r[o + i] * inv * (with_weights ? rw[i] : 1.0);
            want_x[o + i] = (x[o + i] + want_r[o + i]) * x_scale;
            x_squares += want_x[o + i] * want_x[o + i];
          }
          const double x_inv = 1.0 / std::sqrt(x_squares / double(dim) + eps);
          for (int64_t i = 0; i < dim; ++i) want_next[o + i] = want_x[o + i] * x_inv * (with_weights ? nw[i] : 1.0);
        }
        float* dx = upload(x);
        float* dr = upload(r);
        float* dnext = poisoned(x.size());
        backend_->add_rms_norm(dx, dr, with_weights ? upload(rw) : nullptr, rows, dim, eps,
                               with_weights ? upload(nw) : nullptr, with_next ? dnext : nullptr, x_scale);
        SCOPED_TRACE("dim " + std::to_string(dim) + (with_next ? " with next" : "") + (with_weights ? " weighted" : ""));
        expect_near_relative(download(dr, x.size()), want_r, 2e-6);
        expect_near_relative(download(dx, x.size()), want_x, 4e-6);
        if (with_next) expect_near_relative(download(dnext, x.size()), want_next, 4e-6);
        else for (float v : download(dnext, x.size())) ASSERT_TRUE(std::isnan(v)) << "next written without a next";
      }
    }
  }
}

// theta_i = freq_scale * (position * base^(-2i/n_rot)) / divisor_i, with base^(-2i/n_rot) * position formed by
// repeated float multiplication as ggml does (the product chain is part of the op's definition: llama.cpp's
// angles round that way); cos and sin in double.
std::vector<float> rope_reference(std::vector<float> x, int64_t n_tokens, int n_heads, int head_dim, int first_position,
                                  int n_rot, float base, float freq_scale, const std::vector<float>& divisors) {
  const int half = n_rot / 2;
  const float step = std::pow(base, -2.0f / float(n_rot));
  for (int64_t t = 0; t < n_tokens; ++t) {
    float theta = float(first_position + t);
    for (int i = 0; i < half; ++i) {
      const float angle = freq_scale * (theta / (divisors.empty() ? 1.0f : divisors[i]));
      theta *= step;
      for (int h = 0; h < n_heads; ++h) {
        float* v = x.data() + (t * n_heads + h) * head_dim;
        const double a = v[i], b = v[i + half];
        v[i] = float(a * std::cos(double(angle)) - b * std::sin(double(angle)));
        v[i + half] = float(a * std::sin(double(angle)) + b * std::cos(double(angle)));
      }
    }
  }
  return x;
}

TEST_F(CudaOps, RopeRotatesNeoxPairsWithScaleAndDivisors) {
  struct Case { int head_dim, n_rot, first_position; float base, freq_scale; bool divisors; };
  for (const Case& c : {Case{64, 64, 0, 10000.0f, 1.0f, false}, Case{256, 128, 37, 1000000.0f, 1.0f, false},
                        Case{512, 512, 5000, 1000000.0f, 0.125f, true}, Case{256, 256, 70000, 10000.0f, 1.0f, true}}) {
    const int64_t n_tokens = 5;
    const int n_heads = 3;
    const std::vector<float> x = random_floats(n_tokens * n_heads * c.head_dim, uint32_t(c.head_dim + c.n_rot));
    std::vector<float> divisors;
    if (c.divisors) divisors = random_floats(c.n_rot / 2, 7, 1.0f, 40.0f);
    float* dx = upload(x);
    RopeParams params;
    params.n_rot = c.n_rot;
    params.freq_base = c.base;
    params.freq_scale = c.freq_scale;
    params.freq_divisors = c.divisors ? upload(divisors) : nullptr;
    backend_->rope(dx, n_tokens, n_heads, c.head_dim, c.first_position, params);
    const std::vector<float> want =
        rope_reference(x, n_tokens, n_heads, c.head_dim, c.first_position, c.n_rot, c.base, c.freq_scale, divisors);
    const std::vector<float> got = download(dx, x.size());
    SCOPED_TRACE("head dim " + std::to_string(c.head_dim) + ", n_rot " + std::to_string(c.n_rot));
    for (size_t i = 0; i < x.size(); ++i) {
      const bool rotated = int(i % c.head_dim) < c.n_rot;
      if (rotated) ASSERT_NEAR(got[i], want[i], 2e-6 * (1 + std::fabs(want[i]))) << "element " << i;
      else ASSERT_EQ(got[i], x[i]) << "element " << i << " lies past n_rot and must be untouched";
    }
  }
}

// Each head normalized (double precision), then rope_reference: the query and key path in one op.
TEST_F(CudaOps, RmsNormRopeMatchesNormThenRope) {
  struct Case { int n_heads, head_dim, n_rot, first_position; bool weight, divisors; };
  for (const Case& c : {Case{8, 256, 256, 0, true, false}, Case{1, 512, 512, 9000, true, true},
                        Case{3, 64, 64, 12, false, false}, Case{20, 128, 64, 70000, true, false},
                        Case{2, 256, 128, 5, true, true}}) {
    const int64_t n_tokens = 4;
    const float eps = 1e-6f, base = 1000000.0f, freq_scale = 1.0f;
    const std::vector<float> x = random_floats(n_tokens * c.n_heads * c.head_dim, uint32_t(c.head_dim + c.n_heads));
    const std::vector<float> w = random_floats(c.head_dim, 3, 0.5f, 1.5f);
    std::vector<float> divisors;
    if (c.divisors) divisors = random_floats(c.n_rot / 2, 7, 1.0f, 40.0f);
    std::vector<float> normalized(x.size());
    for (size_t head = 0; head < x.size() / size_t(c.head_dim); ++head) {
      const float* v = x.data() + head * c.head_dim;
      const double inv = inverse_rms(v, c.head_dim, eps);
      for (int i = 0; i < c.head_dim; ++i) normalized[head * c.head_dim + i] = float(v[i] * inv * (c.weight ? w[i] : 1.0));
    }
    const std::vector<float> want = rope_reference(normalized, n_tokens, c.n_heads, c.head_dim, c.first_position,
                                                   c.n_rot, base, freq_scale, divisors);
    float* dx = upload(x);
    RopeParams params;
    params.n_rot = c.n_rot;
    params.freq_base = base;
    params.freq_scale = freq_scale;
    params.freq_divisors = c.divisors ? upload(divisors) : nullptr;
    const HeadTensor heads{.x = dx, .weight = c.weight ? upload(w) : nullptr, .n_heads = c.n_heads};
    backend_->rms_norm_rope(std::span(&heads, 1), eps, n_tokens, c.head_dim, c.first_position, params);
    const std::vector<float> got = download(dx, x.size());
    SCOPED_TRACE(std::to_string(c.n_heads) + " heads of " + std::to_string(c.head_dim) + ", n_rot " +
                 std::to_string(c.n_rot));
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], want[i], 4e-6 * (1 + std::fabs(want[i]))) << "element " << i;
  }
}

// A run's query, key and value heads in one launch: each tensor gives the bits of its own launch (the query and
// key), and the value heads, normalized without rotation, their double-precision norm; the tensors interleave
// in no way (each is written only where it lies). Four tensors take two launches.
TEST_F(CudaOps, RmsNormRopeOfSeveralTensorsIsEachTensorOnItsOwn) {
  const int64_t n_tokens = 3;
  const int head_dim = 256;
  const float eps = 1e-6f;
  RopeParams params;
  params.n_rot = head_dim;
  params.freq_base = 10000.0f;
  struct Part { int n_heads; bool weight, rotate; };
  const Part parts[] = {{8, true, true}, {1, true, true}, {1, false, false}, {2, true, true}};
  std::vector<std::vector<float>> inputs;
  std::vector<HeadTensor> together, alone;
  const std::vector<float> w = random_floats(head_dim, 3, 0.5f, 1.5f);
  const float* dw = upload(w);
  for (size_t i = 0; i < std::size(parts); ++i) {
    inputs.push_back(random_floats(n_tokens * parts[i].n_heads * head_dim, uint32_t(40 + i)));
    const float* weight = parts[i].weight ? dw : nullptr;
    together.push_back({.x = upload(inputs[i]), .weight = weight, .n_heads = parts[i].n_heads,
                        .rotate = parts[i].rotate});
    alone.push_back({.x = upload(inputs[i]), .weight = weight, .n_heads = parts[i].n_heads,
                     .rotate = parts[i].rotate});
  }
  backend_->rms_norm_rope(together, eps, n_tokens, head_dim, 17, params);
  for (const HeadTensor& t : alone) backend_->rms_norm_rope(std::span(&t, 1), eps, n_tokens, head_dim, 17, params);
  for (size_t i = 0; i < std::size(parts); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    const size_t n = inputs[i].size();
    const std::vector<float> got = download(together[i].x, n), own = download(alone[i].x, n);
    EXPECT_EQ(std::memcmp(got.data(), own.data(), n * sizeof(float)), 0);
    if (parts[i].rotate) continue;
    for (size_t head = 0; head < n / head_dim; ++head) {
      const float* v = inputs[i].data() + head * head_dim;
      const double inv = inverse_rms(v, head_dim, eps);
      for (int e = 0; e < head_dim; ++e)
        ASSERT_NEAR(got[head * head_dim + e], v[e] * inv, 4e-6 * (1 + std::fabs(v[e] * inv))) << "element " << e;
    }
  }
}

TEST_F(CudaOps, RopeRejectsAnOddOrOversizedRotation) {
  float* x = poisoned(64);
  RopeParams params;
  params.n_rot = 63;
  EXPECT_THROW(backend_->rope(x, 1, 1, 64, 0, params), Error);
  params.n_rot = 128;
  EXPECT_THROW(backend_->rope(x, 1, 1, 64, 0, params), Error);
}

// llama.cpp's GELU: input rounded to f16, gelu_tanh in float, rounded to f16; 0 at or below -10, x at or above 10.
float gelu_reference(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  const float h = formats::f16_to_f32(formats::f32_to_f16(x));
  const float g = 0.5f * h * (1.0f + std::tanh(0.79788456080286535588f * h * (1.0f + 0.044715f * h * h)));
  return formats::f16_to_f32(formats::f32_to_f16(g));
}

// Every f16 value in [-12, 12], the saturation edges and random floats.
std::vector<float> gelu_inputs() {
  std::vector<float> gate;
  for (uint32_t code = 0; code < 0x10000; ++code) {
    const float f = formats::f16_to_f32(uint16_t(code));
    if (std::fabs(f) <= 12.0f) gate.push_back(f);
  }
  for (float edge : {-10.0f, 10.0f, std::nextafter(-10.0f, 0.0f), std::nextafter(10.0f, 0.0f), 9.999f, -9.999f})
    gate.push_back(edge);
  const std::vector<float> extra = random_floats(100003, 5, -11.0f, 11.0f);
  gate.insert(gate.end(), extra.begin(), extra.end());
  return gate;
}

TEST_F(CudaOps, GeluMulReproducesTheF16TableBitForBit) {
  const std::vector<float> gate = gelu_inputs();
  const std::vector<float> up = random_floats(gate.size(), 6);
  std::vector<float> with_up(gate.size()), alone(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    alone[i] = gelu_reference(gate[i]);
    with_up[i] = alone[i] * up[i];
  }
  for (size_t offset : {0, 1}) {  // float4 path, then the scalar path
    SCOPED_TRACE("offset " + std::to_string(offset));
    float* dgate = upload(gate, offset);
    float* dup = upload(up, offset);
    float* y = poisoned(gate.size(), offset);
    backend_->gelu_mul(dgate, dup, int64_t(gate.size()), y);
    expect_equal(download(y, gate.size()), with_up);
    y = poisoned(gate.size(), offset);
    backend_->gelu_mul(dgate, nullptr, int64_t(gate.size()), y);
    expect_equal(download(y, gate.size()), alone);
    backend_->gelu_mul(dgate, dup, int64_t(gate.size()), dgate);  // y aliasing gate
    expect_equal(download(dgate, gate.size()), with_up);
  }
}

TEST_F(CudaOps, AddScaleCopyAreExactOnEveryLengthAndAlignment) {
  for (size_t n : {size_t(1), size_t(3), size_t(4), size_t(1001), size_t(1) << 20 | 3}) {
    for (size_t offset : {0, 1}) {
      SCOPED_TRACE("n " + std::to_string(n) + ", offset " + std::to_string(offset));
      const std::vector<float> a = random_floats(n, uint32_t(n) + 1), b = random_floats(n, uint32_t(n) + 2);
      std::vector<float> sum(n), scaled(n);
      for (size_t i = 0; i < n; ++i) {
        sum[i] = a[i] + b[i];
        scaled[i] = a[i] * -1.75f;
      }
      float* y = upload(a, offset);
      backend_->add(y, upload(b, offset), int64_t(n));
      expect_equal(download(y, n), sum);
      y = upload(a, offset);
      backend_->scale(y, -1.75f, int64_t(n));
      expect_equal(download(y, n), scaled);
      y = poisoned(n, offset);
      backend_->copy(y, upload(a), int64_t(n));
      expect_equal(download(y, n), a);
    }
  }
}

TEST_F(CudaOps, SoftcapMatchesTanh) {
  for (size_t offset : {0, 1}) {
    const size_t n = 262147;
    const std::vector<float> x = random_floats(n, 11, -80.0f, 80.0f);
    const float cap = 30.0f;
    std::vector<double> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = cap * std::tanh(double(x[i]) / cap);
    float* y = upload(x, offset);
    backend_->softcap(y, cap, int64_t(n));
    SCOPED_TRACE("offset " + std::to_string(offset));
    expect_near_relative(download(y, n), want, 2e-6);
  }
  EXPECT_THROW(backend_->softcap(poisoned(4), 0.0f, 4), Error);
}

TEST_F(CudaOps, MulRowsReadsStridedRows) {
  struct Case { int64_t rows, row_len, stride; size_t offset; };
  for (const Case& c : {Case{5, 256, 256 * 9, 0}, Case{3, 255, 1000, 0}, Case{70000, 4, 8, 0}, Case{4, 64, 64, 1}}) {
    SCOPED_TRACE("rows " + std::to_string(c.rows) + ", row_len " + std::to_string(c.row_len));
    const std::vector<float> y0 = random_floats(c.rows * c.row_len, 21);
    const std::vector<float> x = random_floats((c.rows - 1) * c.stride + c.row_len, 22);
    std::vector<float> want = y0;
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < c.row_len; ++i) want[r * c.row_len + i] *= x[r * c.stride + i];
    float* y = upload(y0, c.offset);
    backend_->mul_rows(y, upload(x, c.offset), c.rows, c.row_len, c.stride);
    expect_equal(download(y, y0.size()), want);
  }
}

TEST_F(CudaOps, MeanRowsAveragesColumns) {
  for (int64_t rows : {1, 7, 511}) {
    for (int64_t row_len : {1, 256, 2051}) {
      const std::vector<float> x = random_floats(rows * row_len, uint32_t(rows * 3 + row_len), -5.0f, 9.0f);
      std::vector<double> want(row_len, 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < row_len; ++i) want[i] += x[r * row_len + i];
      for (double& m : want) m /= double(rows);
      float* out = poisoned(row_len);
      backend_->mean_rows(upload(x), rows, row_len, out);
      SCOPED_TRACE("rows " + std::to_string(rows) + ", row_len " + std::to_string(row_len));
      expect_near_relative(download(out, row_len), want, 1e-7);
    }
  }
  EXPECT_THROW(backend_->mean_rows(poisoned(4), 0, 4, poisoned(4)), Error);
}

WeightMatrix f32_matrix(const std::vector<float>& data, int64_t n_in) {
  return WeightMatrix{TensorType::F32, data.data(), n_in, int64_t(data.size()) / n_in};
}

TEST_F(CudaOps, EmbedGathersScaledRows) {
  const int64_t n_in = 96, n_out = 50;
  const std::vector<float> table = random_floats(n_in * n_out, 31);
  std::unique_ptr<WeightStore> store = make_cuda_weight_store(0);
  const WeightMatrix w = store->place(f32_matrix(table, n_in), true, WeightUse::kMatmul);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  std::vector<float> want;
  for (int32_t id : ids)
    for (int64_t i = 0; i < n_in; ++i) want.push_back(table[id * n_in + i] * 2.5f);
  float* out = poisoned(want.size());
  backend_->embed(w, ids.data(), int64_t(ids.size()), 2.5f, out);
  expect_equal(download(out, want.size()), want);
}

TEST_F(CudaOps, EmbedRejectsIdsOutsideTheTable) {
  const std::vector<float> table = random_floats(8 * 4, 32);
  std::unique_ptr<WeightStore> store = make_cuda_weight_store(0);
  const WeightMatrix w = store->place(f32_matrix(table, 8), true, WeightUse::kMatmul);
  for (int32_t bad : {-1, 4}) {
    const std::vector<int32_t> ids = {0, bad};
    EXPECT_THROW(backend_->embed(w, ids.data(), 2, 1.0f, poisoned(16)), Error);
  }
}

// ---- weight placement ----------------------------------------------------------------------------------------

std::vector<uint8_t> device_bytes(const void* p, size_t n) {
  std::vector<uint8_t> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), p, n, cudaMemcpyDefault), cudaSuccess);
  return host;
}

TEST(CudaWeightStore, UploadsMatricesAndVectorsOnceAndCountsTheirBytes) {
  SPARROW_REQUIRE_GPU();
  std::unique_ptr<WeightStore> store = make_cuda_weight_store(0);
  const std::vector<float> f32 = random_floats(64 * 10, 41);
  std::vector<uint8_t> q8(34 * 2 * 7);  // Q8_0: 64 elements per row = 2 blocks of 34 bytes, 7 rows
  std::mt19937 rng(42);
  for (uint8_t& b : q8) b = uint8_t(rng());
  const WeightMatrix a = store->place(f32_matrix(f32, 64), true, WeightUse::kMatmul);
  const WeightMatrix b = store->place(WeightMatrix{TensorType::Q8_0, q8.data(), 64, 7}, true, WeightUse::kMatmul);
  EXPECT_EQ(a.type, TensorType::F32);
  EXPECT_EQ(a.n_in, 64);
  EXPECT_EQ(a.n_out, 10);
  EXPECT_EQ(b.type, TensorType::Q8_0);
  EXPECT_NE(a.data, static_cast<const void*>(f32.data()));
  const std::vector<uint8_t> a_bytes = device_bytes(a.data, f32.size() * 4);
  EXPECT_EQ(std::memcmp(a_bytes.data(), f32.data(), a_bytes.size()), 0);
  EXPECT_EQ(device_bytes(b.data, q8.size()), q8);
  const std::vector<float> norm = random_floats(640, 43);
  const float* placed_norm = store->place_floats(norm.data(), norm.size());
  const std::vector<uint8_t> norm_bytes = device_bytes(placed_norm, norm.size() * 4);
  EXPECT_EQ(std::memcmp(norm_bytes.data(), norm.data(), norm_bytes.size()), 0);
  const size_t expected = f32.size() * 4 + q8.size() + norm.size() * 4;
  EXPECT_EQ(store->device_bytes(), expected);
  // A tied matrix (the output projection reusing the embedding's bytes) is the same device copy.
  EXPECT_EQ(store->place(f32_matrix(f32, 64), true, WeightUse::kMatmul).data, a.data);
  EXPECT_EQ(store->device_bytes(), expected);
  EXPECT_EQ(store->place(WeightMatrix{TensorType::F32, nullptr, 64, 0}, true, WeightUse::kMatmul).data, nullptr);
  const std::string text = store->describe();
  EXPECT_NE(text.find("CUDA0: " + cuda::device_info(0).name), std::string::npos) << text;
  EXPECT_NE(text.find("of weights"), std::string::npos) << text;
}

// The model binder converts each norm vector in a temporary host buffer, so consecutive vectors can arrive at
// the same host address with different values: each must get its own device copy (this once gave every norm of
// a model the first norm's values).
TEST(CudaWeightStore, VectorsFromOneReusedHostBufferStayDistinct) {
  SPARROW_REQUIRE_GPU();
  std::unique_ptr<WeightStore> store = make_cuda_weight_store(0);
  std::vector<float> buffer = random_floats(256, 44);
  const std::vector<float> first = buffer;
  const float* a = store->place_floats(buffer.data(), buffer.size());
  buffer = random_floats(256, 45);
  const float* b = store->place_floats(buffer.data(), buffer.size());
  EXPECT_NE(a, b);
  const std::vector<uint8_t> a_bytes = device_bytes(a, 256 * 4), b_bytes = device_bytes(b, 256 * 4);
  EXPECT_EQ(std::memcmp(a_bytes.data(), first.data(), a_bytes.size()), 0);
  EXPECT_EQ(std::memcmp(b_bytes.data(), buffer.data(), b_bytes.size()), 0);
}

// Host-resident weights: two matrices sharing a page of a read-only, private file mapping (as the GGUF reader
// maps a model); kernels read them in place over the bus.
TEST(CudaWeightStore, MapsReadOnlyFilePagesForKernels) {
  SPARROW_REQUIRE_GPU();
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t mapping_bytes = 6 * page;
  const std::vector<float> values = random_floats(mapping_bytes / 4, 51);
  char path[] = "/tmp/sparrow-weight-store-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, values.data(), mapping_bytes), ssize_t(mapping_bytes));
  void* mapping = mmap(nullptr, mapping_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  unlink(path);
  ASSERT_NE(mapping, MAP_FAILED);
  const auto* floats = static_cast<const float*>(mapping);
  const int64_t n_in = 100;
  const int64_t first_rows = int64_t(page / 4 / n_in) + 3;  // ends inside the next page...
  const float* first = floats + 17;
  const float* second = first + first_rows * n_in;  // ...where this one starts
  {
    std::unique_ptr<WeightStore> store = make_cuda_weight_store(0);
    const WeightMatrix a = store->place(WeightMatrix{TensorType::F32, first, n_in, first_rows}, false, WeightUse::kMatmul);
    const WeightMatrix b = store->place(WeightMatrix{TensorType::F32, second, n_in, 20}, false, WeightUse::kMatmul);
    EXPECT_EQ(store->device_bytes(), 0u);
    CudaBackend backend(0);
    for (const auto& [placed, host] : {std::pair{a, first}, std::pair{b, second}}) {
      const size_t n = size_t(placed.n_in * placed.n_out);
      float* sum = backend.alloc(n);  // zero + the mapped weights, read by the add kernel
      backend.add(sum, static_cast<const float*>(placed.data), int64_t(n));
      std::vector<float> got(n);
      backend.read(sum, got.data(), n);
      expect_equal(got, std::vector<float>(host, host + n));
    }
  }
  munmap(mapping, mapping_bytes);
}

}  // namespace
}  // namespace sparrow
