#pragma once
// Random key transforms for the tests of model/key_transform.h on every backend (tests/unit, tests/gpu).
#include <complex>
#include <cstdint>
#include <random>
#include <vector>

#include "model/key_transform.h"
#include "runtime/model.h"

namespace sparrow::testing {

using cplx = std::complex<double>;

// The real d x d matrix of a complex h x h one in the head's layout: [[Re, -Im], [Im, Re]].
inline std::vector<double> real_layout(const std::vector<cplx>& c, int h) {
  const int d = 2 * h;
  std::vector<double> out(size_t(d) * d);
  for (int p = 0; p < h; ++p)
    for (int r = 0; r < h; ++r) {
      const cplx v = c[size_t(p) * h + r];
      out[size_t(p) * d + r] = out[size_t(p + h) * d + r + h] = v.real();
      out[size_t(p) * d + r + h] = -v.imag();
      out[size_t(p + h) * d + r] = v.imag();
    }
  return out;
}

// Random transforms (A = M^1/2 for a random complex-linear M) for every layer of `model` that owns KV.
inline KeyTransformFile random_transforms(const Model& model, uint64_t fingerprint) {
  KeyTransformFile f;
  f.model_fingerprint = fingerprint;
  f.context = 64;
  f.n_tokens = 64;
  f.source = "random";
  f.layers.resize(model.config.layers.size());
  std::mt19937 rng(7);
  std::normal_distribution<double> normal;
  for (size_t il = 0; il < f.layers.size(); ++il) {
    const LayerConfig& l = model.config.layers[il];
    if (!l.owns_kv) continue;
    const int d = l.head_dim, h = d / 2;
    std::vector<cplx> b(size_t(h) * h), m(size_t(h) * h);
    for (cplx& x : b) x = cplx(normal(rng), normal(rng)) * 0.4;
    for (int p = 0; p < h; ++p)
      for (int r = 0; r < h; ++r) {
        for (int k = 0; k < h; ++k) m[size_t(p) * h + r] += b[size_t(p) * h + k] * std::conj(b[size_t(r) * h + k]);
        if (p == r) m[size_t(p) * h + r] += 0.5;
      }
    const std::vector<double> real_m = real_layout(m, h);
    const std::vector<double> key = psd_power(real_m, d, 0.5), query = psd_power(real_m, d, -0.5);
    f.layers[il] = {d, std::vector<float>(key.begin(), key.end()), std::vector<float>(query.begin(), query.end())};
  }
  return f;
}

}  // namespace sparrow::testing
