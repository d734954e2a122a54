// The element-wise ops of the Backend interface (src/ops/backend.h), on the CPU backend, against scalar references
// written here from the interface's own definitions (double precision where it matters). Inputs are random from
// fixed seeds and never zero, so that an op which ignores an input, or writes nothing, cannot pass.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "formats/weight_formats.h"
#include "ops/backend.h"
#include "util/error.h"

namespace sparrow {
namespace {

using Floats = std::vector<float>;

// Gaussian values kept away from zero: |v| >= 1e-3.
Floats random_floats(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, stddev);
  Floats values(n);
  for (float& v : values) {
    v = gauss(rng);
    if (std::fabs(v) < 1e-3f) v = std::copysign(1e-3f, v == 0.0f ? 1.0f : v);
  }
  return values;
}

Floats uniform_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(lo, hi);
  Floats values(n);
  for (float& v : values) v = uniform(rng);
  return values;
}

// Element-wise comparison with a per-element tolerance; reports the first few mismatches with their index.
template <class Tolerance>
void expect_close(const Floats& actual, const std::vector<double>& expected, Tolerance tolerance,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < actual.size() && reported < 5; ++i) {
    const double tol = tolerance(i);
    if (!(std::fabs(double(actual[i]) - expected[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << actual[i] << ", expected " << expected[i]
                    << " within " << tol;
      ++reported;
    }
  }
}

void expect_equal(const Floats& actual, const Floats& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < actual.size() && reported < 5; ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << actual[i] << ", expected exactly " << expected[i];
      ++reported;
    }
  }
}

// Runs ops on a CPU backend. Its buffers are host memory, so inputs are written into them in place; results are
// taken back through Backend::read, as the model does.
class BackendOpsTest : public ::testing::Test {
 protected:
  ~BackendOpsTest() override {
    for (float* buffer : buffers_) backend_->free_buffer(buffer);
  }

  float* upload(const Floats& values) {
    float* buffer = backend_->alloc(values.size());
    buffers_.push_back(buffer);
    std::memcpy(buffer, values.data(), values.size() * sizeof(float));
    return buffer;
  }
  Floats download(const float* buffer, size_t n) {
    Floats host(n);
    backend_->read(buffer, host.data(), n);
    return host;
  }

  std::unique_ptr<Backend> backend_ = make_cpu_backend(1);

 private:
  std::vector<float*> buffers_;
};

// ---------------------------------------------------------------------------------------------------------------
// rms_norm: y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight

std::vector<double> reference_rms_norm(const Floats& x, const Floats* weight, int64_t n_rows, int64_t dim,
                                       double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    double sum_squares = 0;
    for (int64_t i = 0; i < dim; ++i) sum_squares += double(x[r * dim + i]) * x[r * dim + i];
    const double inv_rms = 1.0 / std::sqrt(sum_squares / double(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * inv_rms * (weight ? (*weight)[i] : 1.0);
  }
  return y;
}

// A float computation of a few roundings: a relative error of some units in the last place.
auto relative_tolerance(const std::vector<double>& expected, double ulps) {
  return [&expected, ulps](size_t i) { return ulps * FLT_EPSILON * std::fabs(expected[i]) + 1e-30; };
}

TEST_F(BackendOpsTest, RmsNormWithAndWithoutWeight) {
  const float eps = 1e-6f;
  for (int64_t dim : {1, 7, 64, 643}) {
    const int64_t n_rows = 3;
    const Floats x = random_floats(n_rows * dim, 11 + uint32_t(dim), 3.0f);
    const Floats weight = random_floats(dim, 23 + uint32_t(dim));
    float* x_buffer = upload(x);
    float* y_buffer = upload(random_floats(x.size(), 5));

    backend_->rms_norm(x_buffer, upload(weight), n_rows, dim, eps, y_buffer);
    const std::vector<double> weighted = reference_rms_norm(x, &weight, n_rows, dim, eps);
    expect_close(download(y_buffer, x.size()), weighted, relative_tolerance(weighted, 8),
                 "weighted, dim " + std::to_string(dim));

    backend_->rms_norm(x_buffer, nullptr, n_rows, dim, eps, y_buffer);
    const std::vector<double> plain = reference_rms_norm(x, nullptr, n_rows, dim, eps);
    expect_close(download(y_buffer, x.size()), plain, relative_tolerance(plain, 8),
                 "no weight, dim " + std::to_string(dim));
    EXPECT_EQ(download(x_buffer, x.size()), x) << "the input changed, dim " << dim;
  }
}

TEST_F(BackendOpsTest, RmsNormInPlace) {
  const int64_t n_rows = 4, dim = 257;
  const float eps = 1e-5f;
  const Floats x = random_floats(n_rows * dim, 31, 0.5f);
  const Floats weight = random_floats(dim, 37);
  float* buffer = upload(x);
  backend_->rms_norm(buffer, upload(weight), n_rows, dim, eps, buffer);
  const std::vector<double> expected = reference_rms_norm(x, &weight, n_rows, dim, eps);
  expect_close(download(buffer, x.size()), expected, relative_tolerance(expected, 8), "in place");
}

// ---------------------------------------------------------------------------------------------------------------
// rope: NEOX pairs (i, i + n_rot/2) rotated by theta_i = freq_scale * position * base^(-2i/n_rot) / divisor_i;
// dimensions from n_rot on are left alone.

struct RopeCase {
  int32_t head_dim;
  int32_t n_rot;
  int32_t n_heads;
  int64_t n_tokens;
  int32_t first_position;
  float freq_base;
  float freq_scale;
  bool with_divisors;
};

std::string describe(const RopeCase& c) {
  return "head_dim " + std::to_string(c.head_dim) + ", n_rot " + std::to_string(c.n_rot) + ", first position " +
         std::to_string(c.first_position) + ", base " + std::to_string(c.freq_base) + ", freq_scale " +
         std::to_string(c.freq_scale) + (c.with_divisors ? ", divisors" : "");
}

double rope_angle(const RopeCase& c, const Floats& divisors, int64_t position, int32_t pair) {
  const double inv_freq = std::pow(double(c.freq_base), -2.0 * pair / c.n_rot);
  const double divisor = c.with_divisors ? divisors[pair] : 1.0;
  return double(c.freq_scale) * double(position) * inv_freq / divisor;
}

TEST_F(BackendOpsTest, RopeRotatesNeoxPairs) {
  const std::vector<RopeCase> cases = {
      {64, 64, 2, 3, 0, 10000.0f, 1.0f, false},
      {128, 128, 3, 2, 37, 1000000.0f, 1.0f, false},
      {256, 256, 2, 3, 1000, 10000.0f, 0.25f, false},
      {128, 64, 2, 3, 5, 10000.0f, 1.0f, false},        // partial rotation: n_rot < head_dim
      {512, 128, 1, 2, 300, 1000000.0f, 1.0f, true},    // Gemma 4 proportional RoPE: per-pair divisors
      {256, 256, 2, 2, 9, 10000.0f, 0.5f, true},
  };
  uint32_t seed = 100;
  for (const RopeCase& c : cases) {
    const size_t n = size_t(c.n_tokens) * c.n_heads * c.head_dim;
    const Floats x = random_floats(n, ++seed);
    const Floats divisors = uniform_floats(size_t(c.n_rot / 2), ++seed, 1.0f, 8.0f);
    float* buffer = upload(x);
    RopeParams params;
    params.n_rot = c.n_rot;
    params.freq_base = c.freq_base;
    params.freq_scale = c.freq_scale;
    params.freq_divisors = c.with_divisors ? divisors.data() : nullptr;
    backend_->rope(buffer, c.n_tokens, c.n_heads, c.head_dim, c.first_position, params);
    const Floats y = download(buffer, n);

    // The CPU builds the angle of pair i by i float multiplications with a float base^(-2/n_rot) (as ggml
    // does): each multiplication rounds (half an ulp) and carries the factor's own error (up to an ulp of
    // powf), so the angle is off by up to 1.5 * i ulps of itself, plus the scale and divisor's roundings. The
    // rotated values inherit that angle error times their magnitude, plus a few roundings of their own.
    std::vector<double> expected(n), tolerance(n);
    const int32_t half = c.n_rot / 2;
    for (int64_t t = 0; t < c.n_tokens; ++t) {
      for (int32_t h = 0; h < c.n_heads; ++h) {
        const size_t row = (size_t(t) * c.n_heads + h) * c.head_dim;
        for (int32_t i = 0; i < half; ++i) {
          const double angle = rope_angle(c, divisors, c.first_position + t, i);
          const double a = x[row + i], b = x[row + i + half];
          expected[row + i] = a * std::cos(angle) - b * std::sin(angle);
          expected[row + i + half] = a * std::sin(angle) + b * std::cos(angle);
          const double angle_error = std::fabs(angle) * (2 * i + 4) * FLT_EPSILON;
          const double error = (std::fabs(a) + std::fabs(b)) * (angle_error + 4 * FLT_EPSILON);
          tolerance[row + i] = tolerance[row + i + half] = error;
        }
        for (int32_t i = c.n_rot; i < c.head_dim; ++i) {
          expected[row + i] = x[row + i];  // unrotated: must come back bit for bit
          tolerance[row + i] = 0;
        }
      }
    }
    expect_close(y, expected, [&](size_t i) { return tolerance[i]; }, describe(c));
  }
}

TEST_F(BackendOpsTest, RopeAtPositionZeroIsIdentity) {
  const int32_t head_dim = 128, n_heads = 2;
  const Floats x = random_floats(size_t(head_dim) * n_heads, 7);
  float* buffer = upload(x);
  RopeParams params;
  params.n_rot = head_dim;
  backend_->rope(buffer, 1, n_heads, head_dim, 0, params);
  expect_equal(download(buffer, x.size()), x, "position 0");
}

// ---------------------------------------------------------------------------------------------------------------
// gelu_mul: y = gelu_tanh(gate) * up

double exact_gelu_tanh(double x) {
  const double sqrt_2_over_pi = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(sqrt_2_over_pi * (x + 0.044715 * x * x * x)));
}

// The CPU computes GELU as llama.cpp does, through a table over f16 inputs whose entries are rounded to f16 (and
// saturates to 0 below -10 and to x above 10). Against the exact function that costs: the input's rounding to
// f16 (relative 2^-11), times GELU's slope (at most 1.13); and the entry's rounding (relative 2^-11 of the
// result). Twice that bound, 2^-10, leaves room for the reference's own float inputs. Below f16's smallest
// normal (6.1e-5) the steps are absolute, 2^-24; 1e-7 covers them.
double gelu_table_tolerance(double x, double gelu) {
  return std::ldexp(1.0, -10) * (1.13 * std::fabs(x) + std::fabs(gelu)) + 1e-7;
}

TEST_F(BackendOpsTest, GeluMulMatchesExactGeluWithinTheF16TableError) {
  const size_t n = 4096;
  // -12..12 covers both saturated ends of the table and everything between.
  const Floats gate = uniform_floats(n, 41, -12.0f, 12.0f);
  const Floats up = random_floats(n, 43);
  float* gate_buffer = upload(gate);
  float* y_buffer = upload(random_floats(n, 47));

  backend_->gelu_mul(gate_buffer, upload(up), int64_t(n), y_buffer);
  std::vector<double> expected(n);
  for (size_t i = 0; i < n; ++i) expected[i] = exact_gelu_tanh(gate[i]) * up[i];
  expect_close(download(y_buffer, n), expected,
               [&](size_t i) { return gelu_table_tolerance(gate[i], exact_gelu_tanh(gate[i])) * std::fabs(up[i]); },
               "with up");

  backend_->gelu_mul(gate_buffer, nullptr, int64_t(n), y_buffer);
  for (size_t i = 0; i < n; ++i) expected[i] = exact_gelu_tanh(gate[i]);
  expect_close(download(y_buffer, n), expected, [&](size_t i) { return gelu_table_tolerance(gate[i], expected[i]); },
               "without up");
}

TEST_F(BackendOpsTest, GeluMulInPlace) {
  const size_t n = 1000;
  const Floats gate = random_floats(n, 53, 2.0f);
  const Floats up = random_floats(n, 59);
  float* buffer = upload(gate);
  backend_->gelu_mul(buffer, upload(up), int64_t(n), buffer);
  std::vector<double> expected(n);
  for (size_t i = 0; i < n; ++i) expected[i] = exact_gelu_tanh(gate[i]) * up[i];
  expect_close(download(buffer, n), expected,
               [&](size_t i) { return gelu_table_tolerance(gate[i], exact_gelu_tanh(gate[i])) * std::fabs(up[i]); },
               "y aliasing gate");
}

// ---------------------------------------------------------------------------------------------------------------
// add, scale, copy, mul_rows: one float operation per element, so the results are exact: the float operation on
// two floats equals the double operation rounded once to float.

TEST_F(BackendOpsTest, AddScaleCopyAreExact) {
  const size_t n = 1031;
  const Floats y = random_floats(n, 61), x = random_floats(n, 67, 10.0f);
  const float s = 0.3716f;

  float* y_buffer = upload(y);
  backend_->add(y_buffer, upload(x), int64_t(n));
  Floats expected(n);
  for (size_t i = 0; i < n; ++i) expected[i] = float(double(y[i]) + double(x[i]));
  expect_equal(download(y_buffer, n), expected, "add");

  y_buffer = upload(y);
  backend_->scale(y_buffer, s, int64_t(n));
  for (size_t i = 0; i < n; ++i) expected[i] = float(double(y[i]) * double(s));
  expect_equal(download(y_buffer, n), expected, "scale");

  y_buffer = upload(y);
  backend_->copy(y_buffer, upload(x), int64_t(n));
  expect_equal(download(y_buffer, n), x, "copy");
}

TEST_F(BackendOpsTest, SoftcapIsCapTimesTanh) {
  const size_t n = 2048;
  for (float cap : {30.0f, 15.0f, 0.5f}) {
    // Values well past the cap too, where tanh saturates.
    const Floats y = random_floats(n, 71 + uint32_t(cap), 3.0f * cap);
    float* buffer = upload(y);
    backend_->softcap(buffer, cap, int64_t(n));
    std::vector<double> expected(n);
    for (size_t i = 0; i < n; ++i) expected[i] = double(cap) * std::tanh(double(y[i]) / cap);
    expect_close(download(buffer, n), expected, relative_tolerance(expected, 6), "cap " + std::to_string(cap));
  }
}

TEST_F(BackendOpsTest, MulRowsReadsStridedRows) {
  const int64_t n_rows = 5, row_len = 37;
  for (int64_t stride : {row_len, row_len + 11, 3 * row_len}) {
    const Floats y = random_floats(size_t(n_rows * row_len), 73 + uint32_t(stride));
    const Floats x = random_floats(size_t((n_rows - 1) * stride + row_len), 79 + uint32_t(stride));
    float* y_buffer = upload(y);
    backend_->mul_rows(y_buffer, upload(x), n_rows, row_len, stride);
    Floats expected(y.size());
    for (int64_t r = 0; r < n_rows; ++r) {
      for (int64_t i = 0; i < row_len; ++i)
        expected[r * row_len + i] = float(double(y[r * row_len + i]) * double(x[r * stride + i]));
    }
    expect_equal(download(y_buffer, y.size()), expected, "stride " + std::to_string(stride));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// embed: out[r] = scale * w[ids[r]], for every weight type Sparrow computes with.

const std::vector<TensorType>& weight_types() {
  static const std::vector<TensorType> types = {
      TensorType::F32,  TensorType::F16,  TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1,
      TensorType::Q5_0, TensorType::Q5_1, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};
  return types;
}

TEST_F(BackendOpsTest, WeightTypeListCoversEverySupportedType) {
  size_t supported = 0;
  for (uint32_t id = 0; id < 64; ++id) supported += formats::is_supported_weight_type(TensorType(id));
  EXPECT_EQ(supported, weight_types().size());
  for (TensorType type : weight_types()) EXPECT_TRUE(formats::is_supported_weight_type(type)) << uint32_t(type);
}

TEST_F(BackendOpsTest, EmbedDequantizesAndScalesRowsOfEveryType) {
  const int64_t n_in = 512, n_out = 9;  // 512: a whole number of blocks of every type (K types: 256)
  const std::vector<int32_t> ids = {4, 0, 8, 4, 2, 7};
  for (TensorType type : weight_types()) {
    const std::string name = tensor_type_name(type);
    const Floats values = random_floats(size_t(n_in * n_out), 83 + uint32_t(type), 0.05f);
    const size_t row_bytes = tensor_row_bytes(type, n_in);
    std::vector<uint8_t> weights(row_bytes * n_out);
    formats::quantize_row(type, values.data(), weights.data(), n_in * n_out);
    const WeightMatrix w{type, weights.data(), n_in, n_out};

    for (float scale : {1.0f, 25.29822f}) {
      float* out = upload(random_floats(ids.size() * n_in, 89));
      backend_->embed(w, ids.data(), int64_t(ids.size()), scale, out);
      Floats expected(ids.size() * n_in), row(n_in);
      for (size_t r = 0; r < ids.size(); ++r) {
        formats::dequantize_row(type, weights.data() + size_t(ids[r]) * row_bytes, row.data(), n_in);
        for (int64_t i = 0; i < n_in; ++i) expected[r * n_in + i] = row[i] * scale;
      }
      expect_equal(download(out, expected.size()), expected, name + ", scale " + std::to_string(scale));
    }
  }
}

TEST_F(BackendOpsTest, EmbedRejectsAnIdOutsideTheMatrix) {
  const int64_t n_in = 32, n_out = 3;
  const Floats weights = random_floats(size_t(n_in * n_out), 97);
  const WeightMatrix w{TensorType::F32, weights.data(), n_in, n_out};
  float* out = upload(Floats(n_in, 1.0f));
  for (int32_t id : {-1, 3}) {
    EXPECT_THROW(backend_->embed(w, &id, 1, 1.0f, out), Error) << "id " << id;
  }
}

}  // namespace
}  // namespace sparrow
