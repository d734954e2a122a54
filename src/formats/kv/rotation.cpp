// The randomized Hadamard rotation R = D2 · H · D1 / sqrt(d) shared by TurboQuant, TCQ and PolarQuant.
// Why this R: H spreads every input coordinate (an outlier channel included) over all d outputs, and the
// random signs make the rotated coordinates behave like those of a random unit vector, which is the
// distribution the Lloyd-Max codebooks are designed for (TurboQuant, arXiv 2504.19874, section 3).
// The signs come from SeededRandom with fixed per-head-dim seeds: they are part of the stored format, so
// these seeds must never change (a cache written with one R cannot be read with another).
#include "formats/kv/rotation.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/kv/seeded_random.h"
#include "util/error.h"

namespace sparrow::formats {
namespace {

// Seeds of D1 and D2 for head dim d: kSignSeedBase + 2d and kSignSeedBase + 2d + 1. Fixed forever.
constexpr uint64_t kSignSeedBase = 0x5350'5257'4844'0000ull;  // "SPRWHD" in the high bytes
constexpr std::array<int, 4> kHeadDims = {64, 128, 256, 512};

struct SignVectors {
  std::vector<float> in, out;  // D1, D2
};

std::vector<float> random_signs(uint64_t seed, int d) {
  SeededRandom rng(seed);
  std::vector<float> signs(d);
  for (float& s : signs) s = rng.sign();
  return signs;
}

int head_dim_slot(int d) {
  for (size_t i = 0; i < kHeadDims.size(); ++i)
    if (kHeadDims[i] == d) return int(i);
  throw Error("hadamard rotation: head dim " + std::to_string(d) + " is not one of 64, 128, 256, 512");
}

const SignVectors& signs_for(int d) {
  static const std::array<SignVectors, kHeadDims.size()> tables = [] {
    std::array<SignVectors, kHeadDims.size()> t;
    for (size_t i = 0; i < kHeadDims.size(); ++i) {
      const int n = kHeadDims[i];
      t[i].in = random_signs(kSignSeedBase + 2 * uint64_t(n), n);
      t[i].out = random_signs(kSignSeedBase + 2 * uint64_t(n) + 1, n);
    }
    return t;
  }();
  return tables[head_dim_slot(d)];
}

// In-place unnormalized Walsh-Hadamard transform (Sylvester order): v <- H v, d a power of two.
void walsh_hadamard(float* v, int d) {
  for (int h = 1; h < d; h *= 2)
    for (int i = 0; i < d; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

// out = after · H · (before ⊙ in) / sqrt(d); elementwise steps first and last make aliasing safe.
void signed_hadamard(const float* in, int d, const float* before, const float* after, float* out) {
  for (int i = 0; i < d; ++i) out[i] = in[i] * before[i];
  walsh_hadamard(out, d);
  const float scale = float(1.0 / std::sqrt(double(d)));
  for (int i = 0; i < d; ++i) out[i] *= after[i] * scale;
}

}  // namespace

void hadamard_rotate(const float* x, int d, float* y) {
  const SignVectors& s = signs_for(d);
  signed_hadamard(x, d, s.in.data(), s.out.data(), y);
}

void walsh_hadamard_orthonormal(const float* x, int d, float* y) {
  head_dim_slot(d);  // throws for an unsupported head dim
  if (x != y) std::copy(x, x + d, y);
  walsh_hadamard(y, d);
  const float scale = float(1.0 / std::sqrt(double(d)));
  for (int i = 0; i < d; ++i) y[i] *= scale;
}

void hadamard_unrotate(const float* y, int d, float* x) {
  const SignVectors& s = signs_for(d);
  signed_hadamard(y, d, s.out.data(), s.in.data(), x);
}

const float* hadamard_signs_in(int d) { return signs_for(d).in.data(); }
const float* hadamard_signs_out(int d) { return signs_for(d).out.data(); }

}  // namespace sparrow::formats
