// Fixture generation and (de)serialization for `sparrow verify`. See fixture.h and docs/verify.md.
#include "verify/fixture.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "formats/kv/seeded_random.h"
#include "util/error.h"

namespace sparrow::verify {
namespace {

using formats::KvCodecInfo;
using formats::KvCodecOps;
using formats::SeededRandom;

// ---------------------------------------------------------------------------------------------------------
// Inputs. The seed and the recipe below are the fixture: change either and every codec fixture must be
// regenerated (load_fixtures refuses codec fixtures made from other inputs).

constexpr uint64_t kInputSeed = 0x5350'4B56'4649'5831ull;  // "SPKVFIX1"
constexpr int kVectors = 32, kGaussianVectors = 16, kQueries = 16, kSequences = 8, kExtraGaussian = 48;

void fill_normal(SeededRandom& rng, float* x, int n, double scale = 1.0) {
  for (int i = 0; i < n; ++i) x[i] = float(rng.normal() * scale);
}

// Vector `i` (>= kGaussianVectors) of head dim d: one edge case per index.
void fill_edge_case(SeededRandom& rng, int i, int d, float* x) {
  const int k = i - kGaussianVectors;
  if (k < 6) {  // a few channels 20-70x the rest, like real K caches
    fill_normal(rng, x, d);
    for (int c : {3, d / 4 + 1, d / 2 + 5, d - 7}) x[c] = rng.sign() * float(20 + 10 * k);
    return;
  }
  std::fill(x, x + d, 0.0f);
  if (k == 6) {  // heavy tails: a log-normal scale mixture
    for (int j = 0; j < d; ++j) x[j] = float(rng.normal() * std::exp(rng.normal()));
  } else if (k == 7) {
    fill_normal(rng, x, d, 1000.0);
  } else if (k == 8) {  // f16 subnormals among normal halves
    fill_normal(rng, x, d, 1e-4);
  } else if (k == 9) {  // all zeros
  } else if (k == 10) {
    std::fill(x, x + d, 0.37f);
  } else if (k == 11) {  // one-hot
    x[5] = 3.0f;
  } else if (k == 12) {
    for (int j = 0; j < d; ++j) x[j] = (j % 2) ? -1.0f : 1.0f;
  } else if (k == 13) {  // exactly on a q4_0 grid
    for (int j = 0; j < d; ++j) x[j] = float(int(rng.next_u64() % 16) - 8);
  } else if (k == 14) {  // a ramp
    for (int j = 0; j < d; ++j) x[j] = -1.0f + 2.0f * float(j) / float(d - 1);
  } else {  // tied largest magnitudes of opposite signs: q4_0 keeps the sign of the first
    fill_normal(rng, x, d);
    x[1] = -5.0f, x[2] = 5.0f, x[33] = 5.0f, x[34] = -5.0f;
  }
}

HeadDimInputs make_head_dim_inputs(int d) {
  SeededRandom rng(kInputSeed + uint64_t(d));
  HeadDimInputs in;
  in.head_dim = d;
  in.n_vectors = kVectors, in.n_queries = kQueries, in.n_sequences = kSequences, in.n_gaussian = kGaussianVectors;
  in.vectors.resize(size_t(kVectors) * d);
  for (int i = 0; i < kVectors; ++i) {
    float* x = in.vectors.data() + size_t(i) * d;
    if (i < kGaussianVectors)
      fill_normal(rng, x, d);
    else
      fill_edge_case(rng, i, d, x);
  }
  in.queries.resize(size_t(kQueries) * d);
  fill_normal(rng, in.queries.data(), kQueries * d);
  for (int c = 0; c < d; c += 37) in.queries[size_t(kQueries - 1) * d + c] *= 30.0f;  // one outlier query
  // Attention weights: softmax of random logits for most sequences, uniform for one, signed for the last.
  in.weights.resize(size_t(kSequences) * kVectors);
  for (int s = 0; s < kSequences; ++s) {
    float* w = in.weights.data() + size_t(s) * kVectors;
    if (s == kSequences - 1) {
      fill_normal(rng, w, kVectors);
      continue;
    }
    if (s == kSequences - 2) {
      std::fill(w, w + kVectors, 1.0f / kVectors);
      continue;
    }
    double total = 0, e[kVectors];
    for (int j = 0; j < kVectors; ++j) total += (e[j] = std::exp(2.0 * rng.normal()));
    for (int j = 0; j < kVectors; ++j) w[j] = float(e[j] / total);
  }
  in.gaussian.resize(size_t(kExtraGaussian) * d);
  fill_normal(rng, in.gaussian.data(), kExtraGaussian * d);
  return in;
}

// ---------------------------------------------------------------------------------------------------------
// Reference outputs.

bool same_value(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Marks the elements of `decoded` (the reference's reconstruction of x) that some encode of x perturbed by a
// relative `eps` reconstructs differently: they lie within about eps of a decision boundary (a rounding
// midpoint, a codebook threshold, an fp16 tie of a scale or norm), where a correct encoder computing the same
// math in another float order may land on either side. Probes: random-sign patterns per element (they move
// each value relative to the others, e.g. to its block's scale), then the whole vector scaled by 1 +- eps
// (they move norms and scales).
void mark_near_boundary(const KvCodecOps& ref, const float* x, int d, size_t block_bytes, const float* decoded,
                        float eps, uint32_t probes, uint64_t seed, uint8_t* flags) {
  SeededRandom rng(seed);
  std::vector<float> perturbed(d), redecoded(d);
  std::vector<uint8_t> block(block_bytes);
  for (uint32_t p = 0; p < probes; ++p) {
    const bool uniform = p + 2 >= probes;
    const float uniform_sign = (p + 1 == probes) ? -1.0f : 1.0f;
    for (int i = 0; i < d; ++i) perturbed[i] = x[i] * (1.0f + eps * (uniform ? uniform_sign : rng.sign()));
    ref.encode(perturbed.data(), d, block.data());
    ref.decode(block.data(), d, redecoded.data());
    for (int i = 0; i < d; ++i) flags[i] |= same_value(redecoded[i], decoded[i]) ? 0 : 1;
  }
}

HeadDimExpected expect_head_dim(const KvCodecInfo& info, const HeadDimInputs& in, const Tolerances& tol) {
  const KvCodecOps& ref = *info.reference;
  const int d = in.head_dim;
  HeadDimExpected e;
  e.head_dim = d;
  e.block_bytes = uint32_t(info.block_bytes(d));
  e.query_floats = uint32_t(info.query_floats(d));
  e.accumulator_floats = uint32_t(info.accumulator_floats(d));
  e.blocks.resize(size_t(in.n_vectors) * e.block_bytes);
  e.decoded.resize(size_t(in.n_vectors) * d);
  e.near_boundary.assign(size_t(in.n_vectors) * d, 0);
  for (int v = 0; v < in.n_vectors; ++v) {
    uint8_t* block = e.blocks.data() + size_t(v) * e.block_bytes;
    float* decoded = e.decoded.data() + size_t(v) * d;
    ref.encode(in.vector(v), d, block);
    ref.decode(block, d, decoded);
    mark_near_boundary(ref, in.vector(v), d, e.block_bytes, decoded, tol.boundary_probe, tol.probes,
                       kInputSeed ^ (uint64_t(d) << 20) ^ uint64_t(v), e.near_boundary.data() + size_t(v) * d);
  }
  e.scores.resize(size_t(in.n_queries) * in.n_vectors);
  std::vector<float> prepared(e.query_floats);
  for (int q = 0; q < in.n_queries; ++q) {
    ref.prepare_query(in.query(q), d, prepared.data());
    for (int v = 0; v < in.n_vectors; ++v) {
      e.scores[size_t(q) * in.n_vectors + v] =
          ref.score(prepared.data(), e.blocks.data() + size_t(v) * e.block_bytes, d);
    }
  }
  e.accumulators.assign(size_t(in.n_sequences) * e.accumulator_floats, 0.0f);
  e.finished.resize(size_t(in.n_sequences) * d);
  for (int s = 0; s < in.n_sequences; ++s) {
    float* acc = e.accumulators.data() + size_t(s) * e.accumulator_floats;
    for (int v = 0; v < in.n_vectors; ++v) {
      ref.accumulate(in.weights[size_t(s) * in.n_vectors + v], e.blocks.data() + size_t(v) * e.block_bytes, d,
                     acc);
    }
    ref.finish(acc, d, e.finished.data() + size_t(s) * d);
  }
  return e;
}

// ---------------------------------------------------------------------------------------------------------
// Bytes. Little-endian, fixed width; floats as their IEEE bits.

constexpr char kInputsMagic[8] = {'S', 'P', 'K', 'V', 'I', 'N', 'P', '1'};
constexpr char kCodecMagic[8] = {'S', 'P', 'K', 'V', 'F', 'I', 'X', '1'};

class ByteWriter {
 public:
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(uint8_t(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(uint8_t(v >> (8 * i)));
  }
  void f32(float v) { u32(std::bit_cast<uint32_t>(v)); }
  void floats(const std::vector<float>& v) {
    for (float x : v) f32(x);
  }
  void bytes(const std::vector<uint8_t>& v) { out_.insert(out_.end(), v.begin(), v.end()); }
  void flags(const std::vector<uint8_t>& v) {  // one bit per element, LSB first
    std::vector<uint8_t> packed((v.size() + 7) / 8, 0);
    for (size_t i = 0; i < v.size(); ++i) packed[i / 8] |= uint8_t((v[i] & 1) << (i % 8));
    bytes(packed);
  }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, const std::string& source) : bytes_(bytes), source_(source) {}

  void magic(const char (&expected)[8], const char* what) {
    need(8, "magic");
    if (std::memcmp(bytes_.data(), expected, 8) != 0) fail(std::string("not a ") + what + " (bad magic)");
    pos_ = 8;
  }
  uint32_t u32(const char* field) {
    need(4, field);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(bytes_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return v;
  }
  uint64_t u64(const char* field) {
    const uint64_t lo = u32(field);
    return lo | (uint64_t(u32(field)) << 32);
  }
  float f32(const char* field) { return std::bit_cast<float>(u32(field)); }
  // A count that sizes an allocation: bounded so a corrupt file cannot ask for gigabytes.
  uint32_t count(const char* field, uint32_t lo, uint32_t hi) {
    const uint32_t v = u32(field);
    if (v < lo || v > hi) {
      fail(std::string("field ") + field + " is " + std::to_string(v) + ", expected " + std::to_string(lo) + ".." +
           std::to_string(hi));
    }
    return v;
  }
  std::vector<float> floats(size_t n, const char* field) {
    need(4 * n, field);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = f32(field);
    return v;
  }
  std::vector<uint8_t> bytes(size_t n, const char* field) {
    need(n, field);
    std::vector<uint8_t> v(bytes_.begin() + pos_, bytes_.begin() + pos_ + n);
    pos_ += n;
    return v;
  }
  std::vector<uint8_t> flags(size_t n, const char* field) {
    const std::vector<uint8_t> packed = bytes((n + 7) / 8, field);
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = (packed[i / 8] >> (i % 8)) & 1;
    return v;
  }
  std::string text(const char* field) {
    const uint32_t n = count(field, 1, 64);
    const std::vector<uint8_t> b = bytes(n, field);
    return std::string(b.begin(), b.end());
  }
  void expect_end() {
    if (pos_ != bytes_.size()) {
      fail(std::to_string(bytes_.size() - pos_) + " unexpected bytes after the last field (offset " +
           std::to_string(pos_) + ")");
    }
  }
  [[noreturn]] void fail(const std::string& what) const { throw Error(source_ + ": " + what); }

 private:
  void need(size_t n, const char* field) const {
    if (bytes_.size() - pos_ < n) {
      fail(std::string("truncated: field ") + field + " needs " + std::to_string(n) + " bytes at offset " +
           std::to_string(pos_) + ", the file has " + std::to_string(bytes_.size()));
    }
  }

  std::span<const uint8_t> bytes_;
  std::string source_;
  size_t pos_ = 0;
};

constexpr uint32_t kMaxCount = 1u << 16;
constexpr uint32_t kMaxBlockBytes = 1u << 20;

int read_head_dim(ByteReader& r, int expected) {
  const uint32_t d = r.u32("head_dim");
  if (int(d) != expected) {
    r.fail("head dim section is " + std::to_string(d) + ", expected " + std::to_string(expected) +
           " (sections are 64, 128, 256, 512 in order)");
  }
  return int(d);
}

std::vector<uint8_t> read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path.string() + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  return std::vector<uint8_t>(s.begin(), s.end());
}

void write_file(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!f) throw Error(path.string() + ": cannot write");
}

template <class T>
const T& find_head_dim(const std::vector<T>& dims, int head_dim, const char* what) {
  for (const T& t : dims)
    if (t.head_dim == head_dim) return t;
  throw Error(std::string(what) + ": no section for head dim " + std::to_string(head_dim));
}

}  // namespace

const HeadDimInputs& FixtureInputs::at(int head_dim) const {
  return find_head_dim(dims, head_dim, "kv fixture inputs");
}

const HeadDimExpected& CodecFixture::at(int head_dim) const {
  return find_head_dim(dims, head_dim, ("kv fixture of " + codec).c_str());
}

FixtureInputs make_inputs() {
  FixtureInputs inputs;
  inputs.seed = kInputSeed;
  for (int d : kHeadDims) inputs.dims.push_back(make_head_dim_inputs(d));
  return inputs;
}

CodecFixture make_codec_fixture(const KvCodecInfo& info, const FixtureInputs& inputs, uint64_t inputs_checksum) {
  const KvCodecOps* ref = info.reference;
  if (ref == nullptr || !ref->encode || !ref->decode || !ref->prepare_query || !ref->score || !ref->accumulate ||
      !ref->finish) {
    throw Error("kv codec " + std::string(info.name) + ": no complete reference ops to make a fixture from");
  }
  CodecFixture f;
  f.codec = std::string(info.name);
  f.inputs_checksum = inputs_checksum;
  for (const HeadDimInputs& in : inputs.dims) f.dims.push_back(expect_head_dim(info, in, f.tolerances));
  return f;
}

uint64_t fnv1a64(std::span<const uint8_t> bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

std::vector<uint8_t> serialize_inputs(const FixtureInputs& inputs) {
  ByteWriter w;
  w.raw(kInputsMagic, 8);
  w.u64(inputs.seed);
  w.u32(uint32_t(inputs.dims.size()));
  for (const HeadDimInputs& in : inputs.dims) {
    for (int v : {in.head_dim, in.n_vectors, in.n_queries, in.n_sequences, in.n_gaussian, in.n_extra_gaussian()}) {
      w.u32(uint32_t(v));
    }
    w.floats(in.vectors);
    w.floats(in.queries);
    w.floats(in.weights);
    w.floats(in.gaussian);
  }
  return w.take();
}

FixtureInputs parse_inputs(std::span<const uint8_t> bytes, const std::string& source) {
  ByteReader r(bytes, source);
  r.magic(kInputsMagic, "kv fixture inputs file");
  FixtureInputs inputs;
  inputs.seed = r.u64("seed");
  r.count("n_head_dims", uint32_t(kHeadDims.size()), uint32_t(kHeadDims.size()));
  for (int expected : kHeadDims) {
    HeadDimInputs in;
    const int d = in.head_dim = read_head_dim(r, expected);
    in.n_vectors = int(r.count("n_vectors", 1, kMaxCount));
    in.n_queries = int(r.count("n_queries", 1, kMaxCount));
    in.n_sequences = int(r.count("n_sequences", 1, kMaxCount));
    in.n_gaussian = int(r.count("n_gaussian", 0, uint32_t(in.n_vectors)));
    const uint32_t n_extra = r.count("n_extra_gaussian", 0, kMaxCount);
    in.vectors = r.floats(size_t(in.n_vectors) * d, "vectors");
    in.queries = r.floats(size_t(in.n_queries) * d, "queries");
    in.weights = r.floats(size_t(in.n_sequences) * in.n_vectors, "weights");
    in.gaussian = r.floats(size_t(n_extra) * d, "gaussian");
    inputs.dims.push_back(std::move(in));
  }
  r.expect_end();
  return inputs;
}

std::vector<uint8_t> serialize_codec_fixture(const CodecFixture& f) {
  ByteWriter w;
  w.raw(kCodecMagic, 8);
  w.u32(uint32_t(f.codec.size()));
  w.raw(f.codec.data(), f.codec.size());
  w.u64(f.inputs_checksum);
  const Tolerances& t = f.tolerances;
  for (float x : {t.decode_rel, t.score_rel, t.accumulate_rel, t.finish_rel, t.boundary_probe}) w.f32(x);
  w.u32(t.probes);
  w.u32(uint32_t(f.dims.size()));
  for (const HeadDimExpected& e : f.dims) {
    const size_t n_vectors = e.decoded.size() / size_t(e.head_dim);
    const size_t n_sequences = e.finished.size() / size_t(e.head_dim);
    const size_t n_queries = e.scores.size() / n_vectors;
    for (size_t v : {size_t(e.head_dim), size_t(e.block_bytes), size_t(e.query_floats),
                     size_t(e.accumulator_floats), n_vectors, n_queries, n_sequences}) {
      w.u32(uint32_t(v));
    }
    w.bytes(e.blocks);
    w.floats(e.decoded);
    w.flags(e.near_boundary);
    w.floats(e.scores);
    w.floats(e.accumulators);
    w.floats(e.finished);
  }
  return w.take();
}

CodecFixture parse_codec_fixture(std::span<const uint8_t> bytes, const std::string& source) {
  ByteReader r(bytes, source);
  r.magic(kCodecMagic, "kv codec fixture");
  CodecFixture f;
  f.codec = r.text("codec");
  f.inputs_checksum = r.u64("inputs_checksum");
  Tolerances& t = f.tolerances;
  t.decode_rel = r.f32("decode_rel");
  t.score_rel = r.f32("score_rel");
  t.accumulate_rel = r.f32("accumulate_rel");
  t.finish_rel = r.f32("finish_rel");
  t.boundary_probe = r.f32("boundary_probe");
  t.probes = r.u32("probes");
  for (float x : {t.decode_rel, t.score_rel, t.accumulate_rel, t.finish_rel}) {
    if (!(x >= 0.0f && x < 1.0f)) r.fail("a tolerance is " + std::to_string(x) + ", expected 0 <= tol < 1");
  }
  r.count("n_head_dims", uint32_t(kHeadDims.size()), uint32_t(kHeadDims.size()));
  for (int expected : kHeadDims) {
    HeadDimExpected e;
    const int d = e.head_dim = read_head_dim(r, expected);
    e.block_bytes = r.count("block_bytes", 1, kMaxBlockBytes);
    e.query_floats = r.count("query_floats", 1, kMaxBlockBytes);
    e.accumulator_floats = r.count("accumulator_floats", 1, kMaxBlockBytes);
    const size_t n_vectors = r.count("n_vectors", 1, kMaxCount);
    const size_t n_queries = r.count("n_queries", 1, kMaxCount);
    const size_t n_sequences = r.count("n_sequences", 1, kMaxCount);
    e.blocks = r.bytes(n_vectors * e.block_bytes, "blocks");
    e.decoded = r.floats(n_vectors * d, "decoded");
    e.near_boundary = r.flags(n_vectors * d, "near_boundary");
    e.scores = r.floats(n_queries * n_vectors, "scores");
    e.accumulators = r.floats(n_sequences * e.accumulator_floats, "accumulators");
    e.finished = r.floats(n_sequences * d, "finished");
    f.dims.push_back(std::move(e));
  }
  r.expect_end();
  return f;
}

std::string inputs_file_name() { return "inputs.kvfix"; }
std::string codec_file_name(std::string_view codec) { return std::string(codec) + ".kvfix"; }

namespace {

// Why a codec fixture cannot be checked against these inputs, or "" if it can.
std::string mismatch_with_inputs(const CodecFixture& f, const Fixtures& fx, std::string_view expected_codec) {
  if (f.codec != expected_codec)
    return "holds codec '" + f.codec + "', expected '" + std::string(expected_codec) + "'";
  if (f.inputs_checksum != fx.inputs_checksum) {
    return "was made from other inputs than " + inputs_file_name() + " (regenerate: scripts/make-kv-fixtures)";
  }
  for (const HeadDimExpected& e : f.dims) {
    const HeadDimInputs& in = fx.inputs.at(e.head_dim);
    if (e.decoded.size() != size_t(in.n_vectors) * in.head_dim ||
        e.scores.size() != size_t(in.n_queries) * in.n_vectors ||
        e.finished.size() != size_t(in.n_sequences) * in.head_dim) {
      return "head dim " + std::to_string(e.head_dim) + ": counts of vectors, queries or sequences differ from " +
             inputs_file_name();
    }
  }
  return "";
}

}  // namespace

Fixtures load_fixtures(const std::filesystem::path& dir) {
  Fixtures fx;
  fx.dir = dir;
  const std::filesystem::path inputs_path = dir / inputs_file_name();
  if (!std::filesystem::exists(inputs_path)) {
    throw Error(inputs_path.string() + ": no kv fixture inputs here (make them: scripts/make-kv-fixtures)");
  }
  const std::vector<uint8_t> inputs_bytes = read_file(inputs_path);
  fx.inputs = parse_inputs(inputs_bytes, inputs_path.string());
  fx.inputs_checksum = fnv1a64(inputs_bytes);
  for (const formats::KvCodecInfo& info : formats::kv_codecs()) {
    const std::string name(info.name);
    const std::filesystem::path path = dir / codec_file_name(name);
    if (!std::filesystem::exists(path)) {
      fx.problems[name] = "no fixture " + path.string() + " (make it: scripts/make-kv-fixtures " + name + ")";
      continue;
    }
    try {
      CodecFixture f = parse_codec_fixture(read_file(path), path.string());
      const std::string mismatch = mismatch_with_inputs(f, fx, name);
      if (!mismatch.empty()) throw Error(path.string() + ": " + mismatch);
      fx.codecs.emplace(name, std::move(f));
    } catch (const Error& e) { fx.problems[name] = e.what(); }
  }
  return fx;
}

std::vector<std::filesystem::path> write_fixtures(const std::filesystem::path& dir,
                                                  std::span<const formats::KvCodecInfo> codecs) {
  std::filesystem::create_directories(dir);
  const FixtureInputs inputs = make_inputs();
  const std::vector<uint8_t> inputs_bytes = serialize_inputs(inputs);
  const uint64_t checksum = fnv1a64(inputs_bytes);
  std::vector<std::filesystem::path> written{dir / inputs_file_name()};
  write_file(written.back(), inputs_bytes);
  for (const formats::KvCodecInfo& info : codecs) {
    const CodecFixture f = make_codec_fixture(info, inputs, checksum);
    written.push_back(dir / codec_file_name(info.name));
    write_file(written.back(), serialize_codec_fixture(f));
  }
  return written;
}

}  // namespace sparrow::verify
