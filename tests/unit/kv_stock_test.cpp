// The stock KV codecs (f16, bf16, q8_0, q4_0) against llama.cpp's block layouts, written out by hand here
// (bit patterns and block bytes worked out from the IEEE formats and ggml's block_q8_0 / block_q4_0, not from
// Sparrow's code), q8_0 and q4_0 in the orthonormal Walsh-Hadamard basis llama.cpp rotates its quantized
// caches into (built here from its definition, H[i][j] = (-1)^popcount(i & j) / sqrt(d), not from the
// butterflies), the optimized CPU ops against the references at extreme scales on every SIMD target compiled
// in, and, when llama.cpp's build is present, against ggml's own quantizers. The contract every codec keeps
// (identities, optimized ops against the references on every SIMD target, bad input) runs from the rows at
// the end (kv_codec_contract_test.cpp).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/kv/cpu_kv_codecs.h"
#include "formats/kv/codec_registry.h"
#include "formats/kv/kv_codec.h"
#include "formats/kv/rotation.h"
#include "kv_codec_test_util.h"
#include "reference_test_util.h"
#include "runtime/resources.h"

namespace sparrow::formats {
namespace {

struct Stock {
  const char* name;
  const KvCodecInfo& info;
  const KvCodecOps& optimized;  // on the SIMD target chosen when stock_codecs() was called
  cpu::ExpandBlocks expand;     // the optimized basis rows
};

Stock stock(const KvCodecInfo& info) {
  return {.name = info.name.data(),
          .info = info,
          .optimized = cpu::kv_codec_ops(info.codec),
          .expand = cpu::kv_expand_blocks(info.codec)};
}

std::vector<Stock> stock_codecs() {
  return {stock(f16_codec()), stock(bf16_codec()), stock(q8_0_codec()), stock(q4_0_codec())};
}

using kv_codec_test::CodecCase;
using kv_codec_test::encode;
using kv_codec_test::for_each_simd_target;
using kv_codec_test::kHeadDims;
using kv_codec_test::KvCodecContract;

std::vector<float> gaussian(int n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

bool rotates(const KvCodecInfo& info) { return info.codec == KvCodec::Q8_0 || info.codec == KvCodec::Q4_0; }

// W x for W = H / sqrt(d), H the Sylvester Hadamard matrix, straight from its entries, in double.
std::vector<double> hadamard_times(const std::vector<double>& x) {
  const size_t d = x.size();
  std::vector<double> y(d, 0.0);
  for (size_t i = 0; i < d; ++i) {
    for (size_t j = 0; j < d; ++j) y[i] += (std::popcount(i & j) % 2 ? -x[j] : x[j]);
    y[i] /= std::sqrt(double(d));
  }
  return y;
}

std::vector<double> hadamard_times(const std::vector<float>& x) {
  return hadamard_times(std::vector<double>(x.begin(), x.end()));
}

// The float vector x with W x = g (to float rounding; W is its own inverse): how a test puts chosen values
// in front of q8_0's and q4_0's quantizer.
std::vector<float> unrotated(const std::vector<float>& g) {
  const std::vector<double> x = hadamard_times(g);
  return std::vector<float>(x.begin(), x.end());
}

// The basis row of a block: accumulate(1, block) into zeros, which for the stock codecs is the dequantized
// block exactly (0 + 1 * v).
std::vector<float> basis_row(const KvCodecOps& ops, const std::vector<uint8_t>& block, int d) {
  std::vector<float> row(d, 0.0f);
  ops.accumulate(1.0f, block.data(), d, row.data());
  return row;
}

uint16_t u16_at(const std::vector<uint8_t>& b, size_t offset) {
  return uint16_t(b[offset] | (b[offset + 1] << 8));
}

// ---------------------------------------------------------------------------------------------------------
// Traits.

TEST(KvStock, BlockBytesAndBitsPerElementAreLlamaCpps) {
  for (int d : kHeadDims) {
    EXPECT_EQ(f16_codec().block_bytes(d), size_t(2 * d));
    EXPECT_EQ(bf16_codec().block_bytes(d), size_t(2 * d));
    EXPECT_EQ(q8_0_codec().block_bytes(d), size_t(d / 32 * 34));  // fp16 scale + 32 int8
    EXPECT_EQ(q4_0_codec().block_bytes(d), size_t(d / 32 * 18));  // fp16 scale + 16 bytes of nibbles
  }
  EXPECT_DOUBLE_EQ(kv_bits_per_element(KvCodec::F16, 128), 16.0);
  EXPECT_DOUBLE_EQ(kv_bits_per_element(KvCodec::BF16, 256), 16.0);
  EXPECT_DOUBLE_EQ(kv_bits_per_element(KvCodec::Q8_0, 512), 8.5);
  EXPECT_DOUBLE_EQ(kv_bits_per_element(KvCodec::Q4_0, 64), 4.5);
}

// ---------------------------------------------------------------------------------------------------------
// Hand-written layouts. Each case lists inputs and the bytes llama.cpp stores for them.

// f16: IEEE binary16, round to nearest even, little-endian, element i at bytes 2i..2i+1.
const std::vector<std::pair<float, uint16_t>> kHalfCases = {
    {1.0f, 0x3C00},
    {-2.0f, 0xC000},
    {0.1f, 0x2E66},
    {65504.0f, 0x7BFF},  // largest half
    {65520.0f, 0x7C00},
    {-1e6f, 0xFC00},                // rounds past 65504: infinity
    {1.0f + 0x1p-11f, 0x3C00},      // tie between 0x3C00 and 0x3C01: even
    {1.0f + 3 * 0x1p-11f, 0x3C02},  // tie between 0x3C01 and 0x3C02: even
    {0x1p-14f, 0x0400},
    {0x1p-24f, 0x0001},  // smallest normal, smallest subnormal
    {0x1p-25f, 0x0000},
    {3 * 0x1p-25f, 0x0002},  // subnormal ties to even
    {-0.0f, 0x8000},
    {std::nanf(""), 0x7E00},  // canonical quiet NaN
    {INFINITY, 0x7C00},
};

// bf16: the top half of the float bits, rounded to nearest even; NaN stays NaN (quiet bit set).
const std::vector<std::pair<uint32_t, uint16_t>> kBf16Cases = {
    {0x3F800000, 0x3F80}, {0xC0400000, 0xC040},  // 1, -3
    {0x3F808000, 0x3F80}, {0x3F818000, 0x3F82},  // ties: to even
    {0x3F80C000, 0x3F81}, {0x3F807FFF, 0x3F80},  // above and below the tie
    {0x7F7FFFFF, 0x7F80},                        // largest float rounds to infinity
    {0x7F800000, 0x7F80}, {0x7FA00000, 0x7FE0},  // infinity; a signalling NaN made quiet
};

template <class Case, class ToFloat>
void expect_halves(const KvCodecOps& ops, const KvCodecInfo& info, const std::vector<Case>& cases,
                   ToFloat to_float) {
  std::vector<float> x(64, 0.0f);
  std::vector<uint16_t> want(64, 0);
  for (size_t i = 0; i < cases.size(); ++i) {
    x[i] = to_float(cases[i].first);
    want[i] = cases[i].second;
  }
  const std::vector<uint8_t> block = encode(info, ops, x);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(u16_at(block, 2 * i), want[i]) << info.name << " element " << i << " = " << x[i];
  }
}

TEST(KvStock, F16AndBf16MatchTheIeeeBitPatterns) {
  const auto same = [](float f) { return f; };
  const auto from_bits = [](uint32_t b) { return std::bit_cast<float>(b); };
  expect_halves(*f16_codec().reference, f16_codec(), kHalfCases, same);
  for_each_simd_target([&] { expect_halves(cpu::kv_codec_ops(KvCodec::F16), f16_codec(), kHalfCases, same); });
  expect_halves(*bf16_codec().reference, bf16_codec(), kBf16Cases, from_bits);
  for_each_simd_target([&] { expect_halves(cpu::kv_codec_ops(KvCodec::BF16), bf16_codec(), kBf16Cases, from_bits); });
}

TEST(KvStock, HalvesDecodeToTheirValues) {
  // 0x3555 = 1/3 rounded to half: 0.333251953125; 0x0001 = 2^-24; 0xFBFF = -65504.
  const std::vector<uint16_t> halves = {0x3C00, 0x3555, 0x0001, 0xFBFF, 0x8000};
  const std::vector<float> values = {1.0f, 0.333251953125f, 0x1p-24f, -65504.0f, -0.0f};
  std::vector<uint8_t> block(2 * 64, 0);
  for (size_t i = 0; i < halves.size(); ++i) std::memcpy(block.data() + 2 * i, &halves[i], 2);
  for (const KvCodecOps* ops : {f16_codec().reference, &cpu::kv_codec_ops(KvCodec::F16)}) {
    std::vector<float> x(64, 1.0f);
    ops->decode(block.data(), 64, x.data());
    for (size_t i = 0; i < values.size(); ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(x[i]), std::bit_cast<uint32_t>(values[i]));
    for (size_t i = values.size(); i < 64; ++i) EXPECT_EQ(x[i], 0.0f);
  }
  // bf16 0x4049 = 3.140625.
  std::vector<uint8_t> b16(2 * 64, 0);
  b16[0] = 0x49, b16[1] = 0x40;
  for (const KvCodecOps* ops : {bf16_codec().reference, &cpu::kv_codec_ops(KvCodec::BF16)}) {
    std::vector<float> x(64, 1.0f);
    ops->decode(b16.data(), 64, x.data());
    EXPECT_EQ(x[0], 3.140625f);
    EXPECT_EQ(x[1], 0.0f);
  }
}

// q8_0 block (ggml block_q8_0): fp16 d = amax / 127 at bytes 0..1, then q_j = round(g_j / d) as int8, where
// g = W x is the head vector in the Hadamard basis. With amax = 127/16 the scale is exactly 1/16 (half 0x2C00),
// so g_j = (k_j + f_j) / 16 quantizes to k_j when |f_j| < 0.5 (here <= 0.3, far beyond the float rounding of
// the rotation).
std::vector<float> q8_0_grid(std::vector<int8_t>* q) {
  std::vector<float> g(64);
  q->resize(64);
  for (int j = 0; j < 64; ++j) {
    const int block = j / 32;
    const float unit = block == 0 ? 1.0f / 16 : 1.0f / 4;  // scale of block 0 and block 1
    int k = (j * 37) % 253 - 126;                          // spread over -126..126
    const float frac = 0.3f * float((j % 7) - 3) / 3.0f;   // |frac| <= 0.3: far from a rounding tie
    if (j % 32 == 5) k = (block == 0 ? 127 : -127);        // the block's largest magnitude
    g[j] = (float(k) + (j % 32 == 5 ? 0.0f : frac)) * unit;
    (*q)[j] = int8_t(k);
  }
  return g;
}

// Decode is W times the dequantized block, which the block's basis row holds exactly.
void expect_decode_rotates_back(const KvCodecOps& ops, const std::vector<uint8_t>& b,
                                const std::vector<float>& dequantized) {
  const int d = int(dequantized.size());
  EXPECT_EQ(basis_row(ops, b, d), dequantized);
  const std::vector<double> want = hadamard_times(dequantized);
  std::vector<float> y(d);
  ops.decode(b.data(), d, y.data());
  for (int j = 0; j < d; ++j) EXPECT_NEAR(y[j], want[j], 1e-6 * (1 + std::fabs(want[j]))) << "element " << j;
}

TEST(KvStock, Q8_0BlocksAreGgmlBlockQ8_0OfTheHadamardTransform) {
  std::vector<int8_t> q;
  const std::vector<float> x = unrotated(q8_0_grid(&q));
  std::vector<float> dequantized(64);
  for (int j = 0; j < 64; ++j) dequantized[j] = float(q[j]) * (j < 32 ? 1.0f / 16 : 1.0f / 4);
  auto check = [&](const KvCodecOps& ops) {
    const std::vector<uint8_t> b = encode(q8_0_codec(), ops, x);
    ASSERT_EQ(b.size(), 68u);
    EXPECT_EQ(u16_at(b, 0), 0x2C00);   // 1/16
    EXPECT_EQ(u16_at(b, 34), 0x3400);  // 1/4
    for (int j = 0; j < 64; ++j) EXPECT_EQ(int8_t(b[(j / 32) * 34 + 2 + j % 32]), q[j]) << "element " << j;
    expect_decode_rotates_back(ops, b, dequantized);
  };
  check(*q8_0_codec().reference);
  for_each_simd_target([&] { check(cpu::kv_codec_ops(KvCodec::Q8_0)); });
}

// q4_0 block (ggml block_q4_0) of g = W x: fp16 d = max / -8, max the first element of largest magnitude with
// its sign; nibble n_j = clamp(round(g_j / d) + 8, 0, 15); byte j holds element j low and element j + 16 high.
// Block 0: max = -1 (d = 1/8, half 0x3000), so g = (n - 8) / 8 gives nibble n; 0.99 would need 16 and clamps
// to 15. Block 1: max = +1 (d = -1/8, half 0xB000), nibble = 8 - round(8 g). No two magnitudes tie: the float
// rounding of the rotation could break a tie either way.
TEST(KvStock, Q4_0BlocksAreGgmlBlockQ4_0OfTheHadamardTransform) {
  std::vector<float> g(64);
  std::vector<int> nibble(64);
  for (int j = 0; j < 32; ++j) {
    const int n = 1 + (j * 5 + 3) % 15;                        // 1..15: |g| < 1
    g[j] = (float(n - 8) + 0.1f * float((j % 5) - 2)) / 8.0f;  // within 0.2 quanta of the grid
    nibble[j] = n;
  }
  g[7] = -1.0f, nibble[7] = 0;
  g[9] = 0.99f, nibble[9] = 15;  // 8 + 8 clamped
  for (int j = 32; j < 64; ++j) {
    const int k = (j * 3) % 15 - 7;  // -7..7
    g[j] = float(k) / 8.0f + 0.01f;
    nibble[j] = 8 - k;
  }
  g[33] = 1.0f, nibble[33] = 0;
  g[40] = -0.99f, nibble[40] = 15;  // 8 + 8, clamped
  const std::vector<float> x = unrotated(g);
  std::vector<float> dequantized(64);
  for (int j = 0; j < 64; ++j) dequantized[j] = float(nibble[j] - 8) * (j < 32 ? 0.125f : -0.125f);
  auto check = [&](const KvCodecOps& ops) {
    const std::vector<uint8_t> b = encode(q4_0_codec(), ops, x);
    ASSERT_EQ(b.size(), 36u);
    EXPECT_EQ(u16_at(b, 0), 0x3000);
    EXPECT_EQ(u16_at(b, 18), 0xB000);
    for (int blk = 0; blk < 2; ++blk) {
      for (int j = 0; j < 16; ++j) {
        const int want = nibble[32 * blk + j] | (nibble[32 * blk + 16 + j] << 4);
        EXPECT_EQ(int(b[18 * blk + 2 + j]), want) << "block " << blk << " byte " << j;
      }
    }
    expect_decode_rotates_back(ops, b, dequantized);
  };
  check(*q4_0_codec().reference);
  for_each_simd_target([&] { check(cpu::kv_codec_ops(KvCodec::Q4_0)); });
}

// The rotation is llama.cpp's matrix at every head dim (ggml_gen_hadamard), applied by encode, by
// prepare_query and by finish alike, and it is its own inverse.
TEST(KvStock, WalshHadamardIsTheOrthonormalSylvesterMatrix) {
  for (int d : kHeadDims) {
    const std::vector<float> x = gaussian(d, 3 + d);
    const std::vector<double> want = hadamard_times(x);
    std::vector<float> y(d), twice(d);
    walsh_hadamard_orthonormal(x.data(), d, y.data());
    for (int i = 0; i < d; ++i) ASSERT_NEAR(y[i], want[i], 1e-5) << "d=" << d << " i=" << i;
    walsh_hadamard_orthonormal(y.data(), d, twice.data());
    for (int i = 0; i < d; ++i) ASSERT_NEAR(twice[i], x[i], 1e-5) << "d=" << d << " i=" << i;
  }
  std::vector<float> x(96, 1.0f);
  EXPECT_THROW(walsh_hadamard_orthonormal(x.data(), 96, x.data()), std::exception);
}

// ---------------------------------------------------------------------------------------------------------
// Ops in each codec's basis: score(prepare_query(q), b) is <q, decode(b)> and finish(accumulate(w, b)) is
// w decode(b). f16 and bf16 work in the plain basis (prepare_query and finish copy); q8_0 and q4_0 in the
// Hadamard basis (both are W).

TEST(KvStock, ScoreAndAccumulateActOnDecodedValuesThroughTheBasis) {
  for (const Stock& s : stock_codecs()) {
    for (int d : kHeadDims) {
      const std::vector<float> x = gaussian(d, 7 + d), q = gaussian(d, 8 + d);
      const std::vector<double> wq = hadamard_times(q);
      for (const KvCodecOps* ops : {s.info.reference, &s.optimized}) {
        const std::vector<uint8_t> b = encode(s.info, *ops, x);
        std::vector<float> y(d), prepared(d), acc(d, 0.0f), out(d);
        ops->decode(b.data(), d, y.data());
        ops->prepare_query(q.data(), d, prepared.data());
        for (int i = 0; i < d; ++i) {
          if (rotates(s.info)) ASSERT_NEAR(prepared[i], wq[i], 1e-5) << s.name << " d=" << d;
          else ASSERT_EQ(prepared[i], q[i]) << s.name << " d=" << d;
        }
        double dot = 0, magnitude = 0;
        for (int i = 0; i < d; ++i) dot += double(q[i]) * y[i], magnitude += std::fabs(double(q[i]) * y[i]);
        EXPECT_NEAR(ops->score(prepared.data(), b.data(), d), dot, 1e-5 * magnitude) << s.name << " d=" << d;
        ops->accumulate(-0.75f, b.data(), d, acc.data());
        ops->accumulate(0.25f, b.data(), d, acc.data());
        const std::vector<float> row = basis_row(*ops, b, d);
        for (int i = 0; i < d; ++i) EXPECT_NEAR(acc[i], -0.5 * row[i], 1e-6 * (1 + std::fabs(row[i]))) << s.name;
        ops->finish(acc.data(), d, out.data());
        for (int i = 0; i < d; ++i) EXPECT_NEAR(out[i], -0.5 * y[i], 1e-5 * (1 + std::fabs(y[i]))) << s.name;
        if (!rotates(s.info)) EXPECT_EQ(out, acc) << s.name;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Optimized ops against the references, on every compiled target, at scales that reach fp16's subnormals and
// large scales: encode and decode bit for bit.

TEST(KvStock, OptimizedEncodeAndDecodeAreBitExactAtEveryScaleOnEveryTarget) {
  for_each_simd_target([] {
    for (const Stock& s : stock_codecs()) {
      for (int d : kHeadDims) {
        for (float scale : {1.0f, 1000.0f, 1e-4f, 3e-7f}) {
          const std::vector<float> x = gaussian(d, uint32_t(d * 31 + scale * 7), scale);
          const std::vector<uint8_t> want = encode(s.info, *s.info.reference, x);
          const std::vector<uint8_t> got = encode(s.info, s.optimized, x);
          ASSERT_EQ(got, want) << s.name << " d=" << d << " scale " << scale;
          std::vector<float> y_ref(d), y_opt(d);
          s.info.reference->decode(want.data(), d, y_ref.data());
          s.optimized.decode(want.data(), d, y_opt.data());
          ASSERT_EQ(std::memcmp(y_ref.data(), y_opt.data(), sizeof(float) * d), 0) << s.name << " d=" << d;
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------------------
// Against llama.cpp's own quantizers (ggml_get_type_traits(type)->from_float_ref), when its build is here:
// our block of x is ggml's block of x (f16, bf16) or of W x (q8_0, q4_0), which is what llama.cpp's cache holds.

struct GgmlTraitsPrefix {  // leading fields of ggml's struct ggml_type_traits, in ggml.h's order
  const char* type_name;
  int64_t blck_size, blck_size_interleave;
  size_t type_size;
  bool is_quantized;
  void (*to_float)(const void* x, float* y, int64_t k);
  void (*from_float_ref)(const float* x, void* y, int64_t k);
};

std::string ggml_base_path() { return (resources::llama_cpp_prefix() / "lib/libggml-base.so").string(); }

// ggml's reference quantizers round q8_0 half away from zero and q4_0 by truncating x/d + 8.5 in float, so
// values within ~1e-5 quanta of a rounding midpoint may go either way: those are the only differences allowed.
bool near_midpoint(float scaled) { return std::fabs(std::fabs(scaled - std::trunc(scaled)) - 0.5f) < 1e-5f; }

TEST(KvStock, SameBlocksAsGgmlsQuantizers) {
  const std::string path = ggml_base_path();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_LLAMA_CPP_REFERENCE(lib != nullptr, "llama.cpp's libggml-base.so is not loadable at " + path +
                                                  " (build it with scripts/build-llama-cpp or set SPARROW_LLAMA_CPP)");
  using GetTraits = const GgmlTraitsPrefix* (*)(int);
  const auto get_traits = reinterpret_cast<GetTraits>(dlsym(lib, "ggml_get_type_traits"));
  ASSERT_NE(get_traits, nullptr);
  const std::pair<const Stock, int> types[] = {{stock_codecs()[0], 1},
                                               {stock_codecs()[1], 30},
                                               {stock_codecs()[2], 8},
                                               {stock_codecs()[3], 2}};  // ggml type ids
  int differing_bytes = 0;
  for (const auto& [s, ggml_type] : types) {
    const GgmlTraitsPrefix* t = get_traits(ggml_type);
    ASSERT_STREQ(t->type_name, s.name);
    for (int d : kHeadDims) {
      std::vector<float> x = gaussian(d, 99 + d);
      const std::vector<uint8_t> ours = encode(s.info, s.optimized, x);
      if (rotates(s.info)) walsh_hadamard_orthonormal(x.data(), d, x.data());  // what the quantizer sees
      std::vector<uint8_t> theirs(s.info.block_bytes(d));
      t->from_float_ref(x.data(), theirs.data(), d);
      ASSERT_EQ(ours.size(), theirs.size());
      for (size_t i = 0; i < ours.size(); ++i) {
        if (ours[i] == theirs[i]) continue;
        ++differing_bytes;
        // Only quant bytes of q8_0/q4_0 may differ, and only for an element next to a rounding midpoint.
        ASSERT_TRUE(s.info.codec == KvCodec::Q8_0 || s.info.codec == KvCodec::Q4_0) << s.name << " byte " << i;
        const size_t block_bytes = s.info.codec == KvCodec::Q8_0 ? 34 : 18, at = i % block_bytes;
        ASSERT_GE(at, 2u) << s.name << ": scale differs in block " << i / block_bytes;
        const float scale = s.info.codec == KvCodec::Q8_0 ? 127.0f : 8.0f;  // quanta per amax
        float amax = 0;
        const float* blk = x.data() + (i / block_bytes) * 32;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(blk[j]));
        const int j0 = int(at - 2);
        const bool lo_ok = near_midpoint(blk[j0] * scale / amax);
        const bool hi_ok = s.info.codec == KvCodec::Q4_0 && near_midpoint(blk[j0 + 16] * scale / amax);
        EXPECT_TRUE(lo_ok || hi_ok) << s.name << " d=" << d << " byte " << i;
      }
      std::vector<float> y_theirs(d);
      t->to_float(theirs.data(), y_theirs.data(), d);
      std::vector<float> y_ours(d);  // the dequantized block, signed zeros included
      s.expand(theirs.data(), 1, d, y_ours.data());
      EXPECT_EQ(std::memcmp(y_ours.data(), y_theirs.data(), sizeof(float) * d), 0) << s.name << " d=" << d;
    }
  }
  dlclose(lib);
  EXPECT_LE(differing_bytes, 2);  // midpoints are rare in Gaussian data
}

// The contract: encode and decode bit for bit, the query entering and the output leaving the basis exactly as
// the reference does (a copy, or the same butterflies). Huge inputs: f16 holds magnitudes up to 65504; q8_0's
// and q4_0's fp16 scales, amax / 127 and amax / 8 of the Hadamard transform (whose largest element of this
// test's vector is about 6.4 times its magnitude), hold 1e5 and 1e4.
INSTANTIATE_TEST_SUITE_P(Stock, KvCodecContract,
                         ::testing::Values(CodecCase{.codec = KvCodec::F32, .name = "f32"},
                                         CodecCase{.codec = KvCodec::F16, .name = "f16", .finite_magnitude = 6e4f},
                                         CodecCase{.codec = KvCodec::BF16, .name = "bf16"},
                                         CodecCase{.codec = KvCodec::Q8_0, .name = "q8_0", .finite_magnitude = 1e5f},
                                         CodecCase{.codec = KvCodec::Q4_0, .name = "q4_0", .finite_magnitude = 1e4f}),
                         kv_codec_test::case_name);

}  // namespace
}  // namespace sparrow::formats
