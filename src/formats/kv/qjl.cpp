// The QJL projection (see qjl.h for the construction and why) and the qjl codec: a key is stored as
// [fp16 ||k||][m / 8 bytes of sign(S k)] with m = 2d: 2 + 16/d bits per element (2.125 at d = 128).
// Keys only (keys_only = true: a V cache needs a codec with small per-vector error, this one only has small
// error on average), but decode and accumulate are defined anyway, on the same unbiased estimate k^, so that
// score(q', block) == <q, decode(block)> holds like for every other codec.
//
// Bases: a prepared query is S q (m floats); a V accumulator holds sum w * sqrt(pi/2)/m * ||k|| * sign(S k)
// (m floats), and finish applies S^T once per output row.
#include "formats/kv/qjl.h"

#include <cmath>
#include <string>
#include <vector>

#include "formats/kv/codec_registry.h"
#include "formats/kv/seeded_random.h"
#include "formats/kv/turboquant.h"
#include "util/error.h"

namespace sparrow::formats {
namespace qjl {
namespace {

// Seed of the m x d projection: kProjectionSeedBase + m * 4096 + d. Fixed forever: S is part of the format.
constexpr uint64_t kProjectionSeedBase = 0x514A'4C53'0000'0000ull;  // "QJLS"

// Orthonormalises rows [first, first + d) of the row-major m x d matrix g in place: classical Gram-Schmidt
// applied twice per row ("twice is enough", Giraud et al. 2005) for orthogonality to rounding level.
void orthonormalise_block(std::vector<double>& g, int first, int d) {
  for (int i = first; i < first + d; ++i) {
    double* row = &g[size_t(i) * d];
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = first; k < i; ++k) {
        const double* prev = &g[size_t(k) * d];
        double dot = 0;
        for (int j = 0; j < d; ++j) dot += row[j] * prev[j];
        for (int j = 0; j < d; ++j) row[j] -= dot * prev[j];
      }
    }
    double sum_sq = 0;
    for (int j = 0; j < d; ++j) sum_sq += row[j] * row[j];
    const double inv = 1.0 / std::sqrt(sum_sq);
    for (int j = 0; j < d; ++j) row[j] *= inv;
  }
}

std::vector<float> build_projection(int m, int d) {
  SeededRandom rng(kProjectionSeedBase + uint64_t(m) * 4096 + uint64_t(d));
  std::vector<double> g(size_t(m) * d);
  for (double& v : g) v = rng.normal();
  for (int first = 0; first < m; first += d) orthonormalise_block(g, first, d);
  const double rho = row_norm(d);
  std::vector<float> s(g.size());
  for (size_t i = 0; i < g.size(); ++i) s[i] = float(g[i] * rho);
  return s;
}

template <int kRowsPerDim, int kDim>
const float* cached_projection() {
  static const std::vector<float> s = build_projection(kRowsPerDim * kDim, kDim);
  return s.data();
}

template <int kRowsPerDim>
const float* cached_projection_for_dim(int d) {
  switch (d) {
    case 64: return cached_projection<kRowsPerDim, 64>();
    case 128: return cached_projection<kRowsPerDim, 128>();
    case 256: return cached_projection<kRowsPerDim, 256>();
    case 512: return cached_projection<kRowsPerDim, 512>();
    default: return nullptr;
  }
}

}  // namespace

const float* projection(int m, int d) {
  const float* s = m == d ? cached_projection_for_dim<1>(d) : m == 2 * d ? cached_projection_for_dim<2>(d) : nullptr;
  if (!s) {
    throw Error("qjl projection: no " + std::to_string(m) + " x " + std::to_string(d) +
                " matrix (head dim must be 64, 128, 256 or 512 and rows d or 2d)");
  }
  return s;
}

double row_norm(int d) { return std::sqrt(2.0) * std::exp(std::lgamma((d + 1) / 2.0) - std::lgamma(d / 2.0)); }

float estimator_scale(int m) { return float(std::sqrt(M_PI / 2) / m); }

void project(const float* x, int m, int d, float* sx) {
  const float* s = projection(m, d);
  for (int i = 0; i < m; ++i) {
    double sum = 0;
    for (int j = 0; j < d; ++j) sum += double(s[size_t(i) * d + j]) * x[j];
    sx[i] = float(sum);
  }
}

void project_transposed(const float* v, int m, int d, float* x) {
  const float* s = projection(m, d);
  for (int j = 0; j < d; ++j) {
    double sum = 0;
    for (int i = 0; i < m; ++i) sum += double(s[size_t(i) * d + j]) * v[i];
    x[j] = float(sum);
  }
}

void pack_signs(const float* sx, int m, uint8_t* bits) {
  for (int b = 0; b < m / 8; ++b) bits[b] = 0;
  for (int i = 0; i < m; ++i) bits[i / 8] |= uint8_t((sx[i] < 0) << (i % 8));
}

}  // namespace qjl

namespace {

constexpr const char* kName = "qjl";
constexpr int kMaxRows = qjl::kCodecRowsPerDim * turboquant::kMaxHeadDim;

int rows(int d) {
  turboquant::check_head_dim(kName, d);
  return qjl::kCodecRowsPerDim * d;
}

size_t block_bytes(int d) { return 2 + size_t(rows(d)) / 8; }
size_t sketch_floats(int d) { return size_t(rows(d)); }

void encode(const float* k, int d, uint8_t* block) {
  const int m = rows(d);
  double sum_sq = 0;
  for (int i = 0; i < d; ++i) sum_sq += double(k[i]) * k[i];
  turboquant::store_norm(float(std::sqrt(sum_sq)), block);
  float sk[kMaxRows];
  qjl::project(k, m, d, sk);
  qjl::pack_signs(sk, m, block + 2);
}

// The key estimate in the sketch basis: sqrt(pi/2)/m * ||k|| * sign(S k), so that k^ = S^T (this).
void estimate_in_sketch_basis(const uint8_t* block, int m, float* v) {
  const float scaled_norm = qjl::estimator_scale(m) * turboquant::load_norm(block);
  for (int i = 0; i < m; ++i) v[i] = scaled_norm * qjl::sign_at(block + 2, i);
}

void decode(const uint8_t* block, int d, float* x) {
  const int m = rows(d);
  float v[kMaxRows];
  estimate_in_sketch_basis(block, m, v);
  qjl::project_transposed(v, m, d, x);
}

void prepare_query(const float* q, int d, float* prepared) { qjl::project(q, rows(d), d, prepared); }

float score(const float* prepared, const uint8_t* block, int d) {
  const int m = rows(d);
  float v[kMaxRows];
  estimate_in_sketch_basis(block, m, v);
  double sum = 0;
  for (int i = 0; i < m; ++i) sum += double(prepared[i]) * v[i];
  return float(sum);
}

void accumulate(float w, const uint8_t* block, int d, float* acc) {
  const int m = rows(d);
  float v[kMaxRows];
  estimate_in_sketch_basis(block, m, v);
  for (int i = 0; i < m; ++i) acc[i] += w * v[i];
}

void finish(const float* acc, int d, float* out) { qjl::project_transposed(acc, rows(d), d, out); }

}  // namespace

const KvCodecInfo& qjl_codec() {
  static const KvCodecOps ops = {encode, decode, prepare_query, score, accumulate, finish};
  static const KvCodecInfo entry = {KvCodec::QJL, kName, true, block_bytes, sketch_floats, sketch_floats, &ops};
  return entry;
}

}  // namespace sparrow::formats
