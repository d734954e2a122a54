#pragma once
// Key balancing (kv/kv_cache.h, KeyBalancing): per RoPE pair p of a head (elements p and p + d/2, which RoPE
// rotates together, so that a scale shared by the pair commutes with it) keys are multiplied by s_p and queries
// divided by it, which leaves every score q . k unchanged. A rotated codec's error e is about the same size in
// every direction, and a score's error q' . e then grows with sum_p (q_p / s_p)^2 * sum_p (s_p k_p)^2, which
// s_p = sqrt(|q_p| / |k_p|) brings down to (sum_p |q_p| |k_p|)^2 (Cauchy-Schwarz; |x_p| the pair's magnitude).
// Queries and keys are RMS-normalized per head and then multiplied by their norm gains, so the gains stand for
// the pairs' magnitudes. On Gemma 3 270M this halved the mean KLD of tbq4, tbq3 and tcq3 keys against f16 KV.
#include <span>
#include <vector>

namespace sparrow {

// s_p for the n pairs of a head of dim 2n, repeated for both elements of each pair, from the query and key norm
// gains (each of the head dim). Pair magnitudes below 1e-3 of the largest count as that floor; all-zero gains
// give scale 1.
std::vector<float> key_balance(std::span<const float> q_gain, std::span<const float> k_gain);

// gain[i] * scale[i] (keys) or gain[i] / scale[i] (queries).
std::vector<float> scaled_gain(std::span<const float> gain, std::span<const float> scale, bool divide);

}  // namespace sparrow
