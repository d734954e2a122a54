// Trellis-coded TurboQuant (tcq2, tcq3, tcq4), reference ops: rotate, then per sub-block normalise, find the
// minimum-squared-error path through the tail-biting bit-shift trellis with the Viterbi algorithm (two passes:
// the junction, then the whole sub-block), and store the path's codes and the corrected norm (layout and trellis
// in trellis.h). Plain scalar code; the optimized ops are in cpu/kv/trellis.cpp and produce the same bytes.
//
// As in TurboQuant the rotation is orthogonal: a prepared query is R q, a score is <R q, y^> summed directly over
// the codebook values of the path (no decoded vector), and V is accumulated in the rotated basis and un-rotated
// once per output row by finish.
#include "formats/kv/trellis.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "formats/kv/codec_registry.h"
#include "formats/kv/rotation.h"
#include "formats/weight_formats.h"
#include "util/error.h"

namespace sparrow::formats {
namespace tcq {
namespace {

#include "formats/kv/tcq_codebooks.inc"

constexpr float kMaxNorm = 65504.0f;  // largest finite fp16

// One Viterbi step. cost[s]: the least squared error of a path ending in state s. The predecessors of state
// s = c << (L-k) | m are the 2^k states (m << k) | j, so the step is: per m, the best predecessor (lowest j on
// ties), then per c the squared distance of the target to that state's value added on. The squared distances are
// computed in their own loop and the path costs added in another, so that no compiler fuses the multiply into the
// add (the optimized encoder does the same two steps and must get the same floats).
struct ViterbiTables {
  std::vector<float> cost, next, distance;
  std::vector<uint8_t> back;  // back[t * groups + m]: the j of state m's best predecessor at element t
};

void viterbi_step(const Trellis& tr, const float* cb, float target, ViterbiTables& v, uint8_t* back) {
  const int k = tr.code_bits, groups = tr.states() >> k, fan = 1 << k;
  for (int s = 0; s < tr.states(); ++s) {
    const float diff = target - cb[s];
    v.distance[s] = diff * diff;
  }
  for (int m = 0; m < groups; ++m) {
    int best = 0;
    for (int j = 1; j < fan; ++j)
      if (v.cost[(m << k) | j] < v.cost[(m << k) | best]) best = j;
    back[m] = uint8_t(best);
    const float best_cost = v.cost[(m << k) | best];
    for (int c = 0; c < fan; ++c) {
      const int s = c * groups + m;
      v.next[s] = best_cost + v.distance[s];
    }
  }
  v.cost.swap(v.next);
}

void write_code(const Trellis& tr, uint8_t* stream, int t, uint32_t code) {
  for (int b = 0; b < tr.code_bits; ++b) {
    const int pos = t * tr.code_bits + b;
    if ((code >> b) & 1) stream[pos / 8] |= uint8_t(1u << (pos % 8));
  }
}

}  // namespace

const Trellis& tcq2_trellis() {
  static const Trellis t = {"tcq2", kTcq2Bits.code_bits, kTcq2Bits.state_bits, kTcq2Codebook};
  return t;
}

const Trellis& tcq3_trellis() {
  static const Trellis t = {"tcq3", kTcq3Bits.code_bits, kTcq3Bits.state_bits, kTcq3Codebook};
  return t;
}

const Trellis& tcq4_trellis() {
  static const Trellis t = {"tcq4", kTcq4Bits.code_bits, kTcq4Bits.state_bits, kTcq4Codebook};
  return t;
}

void check_head_dim(const Trellis& trellis, const char* op, int d) {
  if (!kv_head_dim_supported(d)) {
    throw Error(std::string("kv codec ") + trellis.codec + " " + op + ": head dim " + std::to_string(d) +
                " is not supported (expected 64, 128, 256 or 512)");
  }
}

size_t block_bytes(const Trellis& trellis, int d) {
  check_head_dim(trellis, "block size", d);
  const int n = sub_block_size(d);
  return size_t(d / n) * trellis.sub_block_bytes(n);
}

const float* scaled_codebook(const Trellis& trellis, int n) {
  struct Scaled {
    std::vector<float> n64, n128;
  };
  static const auto make = [](const Trellis& tr) {
    Scaled s;
    for (int i = 0; i < tr.states(); ++i) {
      s.n64.push_back(float(double(tr.codebook[i]) / std::sqrt(64.0)));
      s.n128.push_back(float(double(tr.codebook[i]) / std::sqrt(128.0)));
    }
    return s;
  };
  static const Scaled tables[] = {make(tcq2_trellis()), make(tcq3_trellis()), make(tcq4_trellis())};
  const Scaled& s = tables[trellis.code_bits - 2];  // one trellis per code width
  if (n == 64) return s.n64.data();
  if (n == 128) return s.n128.data();
  throw Error(std::string("kv codec ") + trellis.codec + ": no codebook for sub-blocks of " + std::to_string(n) +
              " elements (expected 64 or 128)");
}

uint32_t state_at(const Trellis& tr, const uint8_t* stream, int n, int t) {
  const int bits = n * tr.code_bits;
  uint32_t state = 0;
  for (int b = 0; b < tr.state_bits; ++b) {
    const int pos = (t * tr.code_bits + tr.code_bits - tr.state_bits + b + bits) % bits;  // circular
    if ((stream[pos / 8] >> (pos % 8)) & 1) state |= 1u << b;
  }
  return state;
}

float normalise_sub_block(const float* y, int n, float* u) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += double(y[i]) * y[i];
  const float norm = float(std::sqrt(sum));
  if (!(norm > 0) || !std::isfinite(norm)) {
    std::fill(u, u + n, 0.0f);
    return norm;
  }
  const float inv = 1.0f / norm;
  for (int i = 0; i < n; ++i) u[i] = y[i] * inv;
  return norm;
}

void store_corrected_norm(float norm, const float* values, int n, uint8_t* dst) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += double(values[i]) * values[i];
  float corrected = sum > 0 ? float(norm / std::sqrt(sum)) : 0.0f;
  if (corrected > kMaxNorm) corrected = kMaxNorm;  // NaN stays NaN
  const f16_bits h = f32_to_f16(corrected);
  std::memcpy(dst, &h, 2);
}

float load_norm(const uint8_t* src) {
  f16_bits h;
  std::memcpy(&h, src, 2);
  return f16_to_f32(h);
}

void viterbi_path(const Trellis& tr, const float* cb, const float* targets, int count, int start_prefix,
                  int end_prefix, uint32_t* states) {
  const int groups = tr.states() >> tr.code_bits;
  ViterbiTables v;
  if (start_prefix == kFree) {
    v.cost.assign(tr.states(), 0.0f);
  } else {
    v.cost.assign(tr.states(), std::numeric_limits<float>::infinity());
    v.cost[start_prefix << tr.code_bits] = 0;
  }
  v.next.resize(tr.states());
  v.distance.resize(tr.states());
  v.back.resize(size_t(count) * groups);
  for (int t = 0; t < count; ++t) viterbi_step(tr, cb, targets[t], v, v.back.data() + size_t(t) * groups);

  // The best final state (among those ending on end_prefix), then back along the predecessors.
  uint32_t state = end_prefix == kFree ? 0u : uint32_t(end_prefix) << tr.code_bits;
  const uint32_t last = end_prefix == kFree ? uint32_t(tr.states()) : state + (1u << tr.code_bits);
  for (uint32_t s = state + 1; s < last; ++s)
    if (v.cost[s] < v.cost[state]) state = s;
  for (int t = count - 1; t >= 0; --t) {
    states[t] = state;
    const uint32_t m = state & uint32_t(groups - 1);
    state = (m << tr.code_bits) | v.back[size_t(t) * groups + m];
  }
}

void viterbi_encode(const Trellis& tr, const float* cb, const float* u, int n, uint8_t* stream, float* values) {
  // Pass 1, the junction: the last W and the first W elements as one sequence, free at both ends; its state at
  // element n-1 holds the codes of the stream's last elements, which are the bits before element 0.
  const int w = junction_window(n);
  std::vector<float> junction(u + n - w, u + n);
  junction.insert(junction.end(), u, u + w);
  std::vector<uint32_t> states(n > 2 * w ? n : 2 * w);
  viterbi_path(tr, cb, junction.data(), 2 * w, kFree, kFree, states.data());
  const int prefix = int(states[w - 1] >> tr.code_bits);
  // Pass 2: the whole sub-block from that prefix back to it.
  viterbi_path(tr, cb, u, n, prefix, prefix, states.data());
  std::memset(stream, 0, tr.stream_bytes(n));
  for (int t = 0; t < n; ++t) {
    values[t] = cb[states[t]];
    write_code(tr, stream, t, states[t] >> (tr.state_bits - tr.code_bits));
  }
}

namespace {

// ---------------------------------------------------------------------------------------------------------
// Reference ops, one instance per trellis.

template <const Trellis& (*kTrellis)()>
void reference_encode(const float* x, int d, uint8_t* block) {
  const Trellis& tr = kTrellis();
  check_head_dim(tr, "encode", d);
  const int n = sub_block_size(d);
  const float* cb = scaled_codebook(tr, n);
  std::array<float, kMaxHeadDim> y;
  std::array<float, kMaxSubBlock> u, values;
  hadamard_rotate(x, d, y.data());
  for (int sub = 0; sub < d / n; ++sub) {
    uint8_t* stream = block + sub * tr.sub_block_bytes(n);
    const float norm = normalise_sub_block(y.data() + sub * n, n, u.data());
    viterbi_encode(tr, cb, u.data(), n, stream, values.data());
    store_corrected_norm(norm, values.data(), n, stream + tr.stream_bytes(n));
  }
}

// y^ in the rotated basis: element t of a sub-block is norm * cb[state_t].
void decode_rotated(const Trellis& tr, const uint8_t* block, int d, float* y) {
  const int n = sub_block_size(d);
  const float* cb = scaled_codebook(tr, n);
  for (int sub = 0; sub < d / n; ++sub) {
    const uint8_t* stream = block + sub * tr.sub_block_bytes(n);
    const float norm = load_norm(stream + tr.stream_bytes(n));
    for (int t = 0; t < n; ++t) y[sub * n + t] = norm * cb[state_at(tr, stream, n, t)];
  }
}

template <const Trellis& (*kTrellis)()>
void reference_decode(const uint8_t* block, int d, float* x) {
  const Trellis& tr = kTrellis();
  check_head_dim(tr, "decode", d);
  decode_rotated(tr, block, d, x);
  hadamard_unrotate(x, d, x);
}

template <const Trellis& (*kTrellis)()>
void reference_prepare_query(const float* q, int d, float* prepared) {
  check_head_dim(kTrellis(), "prepare_query", d);
  hadamard_rotate(q, d, prepared);
}

// <R q, y^> = sum over sub-blocks of norm * sum_t q'_t cb[state_t].
template <const Trellis& (*kTrellis)()>
float reference_score(const float* prepared, const uint8_t* block, int d) {
  const Trellis& tr = kTrellis();
  check_head_dim(tr, "score", d);
  const int n = sub_block_size(d);
  const float* cb = scaled_codebook(tr, n);
  double score = 0;
  for (int sub = 0; sub < d / n; ++sub) {
    const uint8_t* stream = block + sub * tr.sub_block_bytes(n);
    double dot = 0;
    for (int t = 0; t < n; ++t) dot += double(prepared[sub * n + t]) * cb[state_at(tr, stream, n, t)];
    score += load_norm(stream + tr.stream_bytes(n)) * dot;
  }
  return float(score);
}

template <const Trellis& (*kTrellis)()>
void reference_accumulate(float w, const uint8_t* block, int d, float* acc) {
  const Trellis& tr = kTrellis();
  check_head_dim(tr, "accumulate", d);
  std::array<float, kMaxHeadDim> y;
  decode_rotated(tr, block, d, y.data());
  for (int i = 0; i < d; ++i) acc[i] += w * y[i];
}

template <const Trellis& (*kTrellis)()>
void reference_finish(const float* acc, int d, float* out) {
  check_head_dim(kTrellis(), "finish", d);
  hadamard_unrotate(acc, d, out);
}

template <const Trellis& (*kTrellis)()>
size_t reference_block_bytes(int d) {
  return block_bytes(kTrellis(), d);
}

template <const Trellis& (*kTrellis)()>
size_t head_dim_floats(int d) {
  check_head_dim(kTrellis(), "query/accumulator size", d);
  return size_t(d);
}

template <const Trellis& (*kTrellis)()>
constexpr KvCodecOps kReferenceOps = {reference_encode<kTrellis>,     reference_decode<kTrellis>,
                                      reference_prepare_query<kTrellis>, reference_score<kTrellis>,
                                      reference_accumulate<kTrellis>, reference_finish<kTrellis>};

template <const Trellis& (*kTrellis)()>
KvCodecInfo codec_info(KvCodec codec) {
  return {codec,
          kTrellis().codec,
          false,
          reference_block_bytes<kTrellis>,
          head_dim_floats<kTrellis>,
          head_dim_floats<kTrellis>,
          &kReferenceOps<kTrellis>};
}

}  // namespace
}  // namespace tcq

const KvCodecInfo& tcq2_codec() {
  static const KvCodecInfo info = tcq::codec_info<tcq::tcq2_trellis>(KvCodec::TCQ2);
  return info;
}

const KvCodecInfo& tcq3_codec() {
  static const KvCodecInfo info = tcq::codec_info<tcq::tcq3_trellis>(KvCodec::TCQ3);
  return info;
}

const KvCodecInfo& tcq4_codec() {
  static const KvCodecInfo info = tcq::codec_info<tcq::tcq4_trellis>(KvCodec::TCQ4);
  return info;
}

}  // namespace sparrow::formats
