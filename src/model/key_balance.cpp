#include "model/key_balance.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace sparrow {

std::vector<float> key_balance(std::span<const float> q_gain, std::span<const float> k_gain) {
  if (q_gain.size() != k_gain.size() || q_gain.size() % 2 != 0 || q_gain.empty())
    throw Error("key_balance: query and key gains of one even head dim are needed");
  const size_t half = q_gain.size() / 2;
  std::vector<double> q(half), k(half);
  double q_max = 0, k_max = 0;
  for (size_t p = 0; p < half; ++p) {
    q[p] = std::hypot(double(q_gain[p]), double(q_gain[p + half]));
    k[p] = std::hypot(double(k_gain[p]), double(k_gain[p + half]));
    q_max = std::max(q_max, q[p]);
    k_max = std::max(k_max, k[p]);
  }
  std::vector<float> scale(q_gain.size(), 1.0f);
  if (q_max == 0 || k_max == 0) return scale;  // nothing to balance against
  // A pair that queries (nearly) ignore gets a small scale, so that its keys take little of the codec's budget;
  // the floor keeps the scales finite.
  constexpr double kFloor = 1e-3;
  for (size_t p = 0; p < half; ++p) {
    const double s = std::sqrt(std::max(q[p], kFloor * q_max) / std::max(k[p], kFloor * k_max));
    scale[p] = scale[p + half] = float(s);
  }
  return scale;
}

std::vector<float> scaled_gain(std::span<const float> gain, std::span<const float> scale, bool divide) {
  if (gain.size() != scale.size()) throw Error("scaled_gain: gain and scale differ in length");
  std::vector<float> out(gain.size());
  for (size_t i = 0; i < gain.size(); ++i) out[i] = divide ? gain[i] / scale[i] : gain[i] * scale[i];
  return out;
}

}  // namespace sparrow
