#pragma once
// The committed fixtures `sparrow verify` checks every backend against (tests/fixtures/kv/, format in
// docs/verify.md):
//  - inputs.kvfix: per head dim, input vectors, queries and V weights, all from fixed seeds, shared by every
//    codec;
//  - <codec>.kvfix: what that codec's REFERENCE ops produce on those inputs (blocks, decoded values, scores,
//    accumulators, finished rows), which elements sit near an encoding decision boundary, and the tolerances.
// Regenerating (write_fixtures, `sparrow verify --write-fixtures DIR`) yields identical bytes as long as the
// references do not change; a fixture made from other inputs than the committed ones is refused.
#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/kv/kv_codec.h"

namespace sparrow::verify {

constexpr std::array<int, 4> kHeadDims = {64, 128, 256, 512};

// Inputs of one head dim d, shared by every codec. Vectors [0, n_gaussian) and all of `gaussian` have
// independent N(0, 1) elements; the other vectors are edge cases (heavy tails and outlier channels, large and
// tiny scales, zeros, constants, exact grid values, tied maxima).
struct HeadDimInputs {
  int head_dim = 0;
  int n_vectors = 0, n_queries = 0, n_sequences = 0, n_gaussian = 0;
  std::vector<float> vectors;   // n_vectors x d: encoded into the blocks every op works on
  std::vector<float> queries;   // n_queries x d: scored against every block
  std::vector<float> weights;   // n_sequences x n_vectors: one V weighted sum over all blocks per sequence
  std::vector<float> gaussian;  // extra N(0, 1) vectors (x d) for the MSE statistic only
  const float* vector(int i) const { return vectors.data() + size_t(i) * head_dim; }
  const float* query(int i) const { return queries.data() + size_t(i) * head_dim; }
  int n_extra_gaussian() const { return int(gaussian.size() / size_t(head_dim)); }
};

struct FixtureInputs {
  uint64_t seed = 0;
  std::vector<HeadDimInputs> dims;  // in kHeadDims order
  const HeadDimInputs& at(int head_dim) const;
};

// How far a backend may be from the reference; stored in each codec fixture.
struct Tolerances {
  float decode_rel = 0.0f;       // decode elements, relative like accumulate_rel: 0 = exact
  float score_rel = 1e-4f;       // score, relative to max(|expected|, |q| * |x|)
  float accumulate_rel = 1e-4f;  // accumulator elements, relative to max(|expected_i|, rms(expected))
  float finish_rel = 1e-4f;      // finished elements, likewise
  float boundary_probe = 1e-6f;  // relative input perturbation that defines "near a decision boundary"
  uint32_t probes = 18;          // reference encodes per vector that look for those boundaries
};

// The reference's outputs for one codec at one head dim.
struct HeadDimExpected {
  int head_dim = 0;
  uint32_t block_bytes = 0, query_floats = 0, accumulator_floats = 0;
  std::vector<uint8_t> blocks;         // n_vectors x block_bytes: reference encode of each vector
  std::vector<float> decoded;          // n_vectors x d: reference decode of those blocks
  std::vector<uint8_t> near_boundary;  // n_vectors x d: 1 where a tiny input change can change that element's
                                       // decoded value (any encode may round it either way)
  std::vector<float> scores;           // n_queries x n_vectors: reference prepare_query + score
  std::vector<float> accumulators;     // n_sequences x accumulator_floats: reference accumulate from zero
  std::vector<float> finished;         // n_sequences x d: reference finish of those accumulators
};

struct CodecFixture {
  std::string codec;
  uint64_t inputs_checksum = 0;  // fnv1a64 of the inputs file these outputs were made from
  Tolerances tolerances;
  std::vector<HeadDimExpected> dims;  // in kHeadDims order
  const HeadDimExpected& at(int head_dim) const;
};

// The fixed-seed inputs (always the same numbers).
FixtureInputs make_inputs();
// Runs `info`'s reference ops on the inputs. Throws sparrow::Error if the codec has no reference.
CodecFixture make_codec_fixture(const formats::KvCodecInfo& info, const FixtureInputs& inputs,
                                uint64_t inputs_checksum);

// Serialization (little-endian, fixed layout: docs/verify.md). Readers validate every size and throw
// sparrow::Error naming the file and the field on anything malformed.
std::vector<uint8_t> serialize_inputs(const FixtureInputs& inputs);
FixtureInputs parse_inputs(std::span<const uint8_t> bytes, const std::string& source);
std::vector<uint8_t> serialize_codec_fixture(const CodecFixture& fixture);
CodecFixture parse_codec_fixture(std::span<const uint8_t> bytes, const std::string& source);
uint64_t fnv1a64(std::span<const uint8_t> bytes);

std::string inputs_file_name();                       // "inputs.kvfix"
std::string codec_file_name(std::string_view codec);  // "tbq4.kvfix"

// Everything `sparrow verify` reads from a fixture directory. A codec whose file is absent, malformed or made
// from other inputs has an entry in `problems` instead of `codecs`; its cells are reported missing.
struct Fixtures {
  std::filesystem::path dir;
  FixtureInputs inputs;
  uint64_t inputs_checksum = 0;
  std::map<std::string, CodecFixture> codecs;
  std::map<std::string, std::string> problems;
};
// Throws sparrow::Error if inputs.kvfix is missing or malformed (nothing can be checked without it).
Fixtures load_fixtures(const std::filesystem::path& dir);

// Writes inputs.kvfix (unless one with identical bytes is there) and the fixture of every codec in `codecs`
// that has a reference. Returns the files written. Deterministic: same references, same bytes.
std::vector<std::filesystem::path> write_fixtures(const std::filesystem::path& dir,
                                                  std::span<const formats::KvCodecInfo> codecs);

}  // namespace sparrow::verify
