#pragma once
// Calibrated key transforms (issue 13; docs/kv-quality.md): per layer that owns KV, a fixed invertible d x d
// matrix A with which keys are stored (k' = A k, after RoPE) and queries formed (q' = A^-T q), so that every score
// q'.k' = q.k is unchanged in exact arithmetic while a low-bit codec's error lands where queries look least. It
// generalizes key balancing (model/key_balance.h: A a real scale per RoPE pair, from the norm gains) to a matrix
// chosen from the model's own queries and keys on calibration text (`sparrow calibrate-keys`), kept in a file
// beside the model (never required).
//
// Why this A. A rotated codec's error e' is about the same size in every direction and proportional to the
// stored vector's norm, so the error of a score, q'.e', has a variance proportional to
//     cost(A) = tr(A^-T Sq A^-1) tr(A Sk A^T),
// with Sq the queries' second moments and Sk the keys' (centered, as the cache stores them, and weighted by the
// attention each key receives: an error on a key nobody attends to costs nothing). Writing M = A^T A, the cost
// tr(M^-1 Sq) tr(M Sk) is least, (tr (Sk^1/2 Sq Sk^1/2)^1/2)^2, at
//     M = Sk^-1/2 (Sk^1/2 Sq Sk^1/2)^1/2 Sk^-1/2
// (Cauchy-Schwarz, as for the diagonal balance), and A = M^1/2 is symmetric, so A^-T = A^-1.
//
// Why complex-linear in the RoPE pairs. After RoPE, the coupling of pairs p and r turns with the position at
// the difference of their frequencies, so a matrix fitted to the moments at some positions is wrong at others
// (fitted on positions 0-511 of Gemma 3 270M it cut tcq4 keys' KLD by a fifth at -c 512 and raised tcq4's by 60%
// at -c 4096). The moments
// here are therefore those of the keys before RoPE (each pair a complex number z_p, rotated back by its angle),
// averaged over every position 0..L-1 that the transform will see: coupling (p, r) times the mean of
// exp(i (w_p - w_r) t) over t < L. What survives couples pairs whose frequencies differ by less than about 1 / L,
// and is a complex matrix acting on the pairs, which in the real layout of NEOX RoPE (pair p = elements p and
// p + d/2) is [[Re, -Im], [Im, Re]].
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace sparrow {

// S^p for a symmetric positive semidefinite n x n matrix S (row-major; eigenvalues below 0 count as 0, p < 0
// needs them all positive). Throws sparrow::Error for a matrix that is not n x n, finite and symmetric.
std::vector<double> psd_power(std::span<const double> s, int n, double p);

// The angular frequency of each RoPE pair (angle = frequency * position), as the rope op forms it
// (ops/backend.h RopeParams): freq_scale * freq_base^(-2i / n_rot) / divisor_i.
std::vector<double> rope_pair_frequencies(int32_t n_rot, double freq_base, double freq_scale,
                                          std::span<const float> divisors);

// One KV-owning layer's statistics, accumulated over sequences of calibration text. Queries and keys arrive
// after the norms and RoPE (plain gains, no transform), as the model forms them: q [n_tokens][n_heads][d],
// k [n_tokens][n_kv_heads][d]; query head h reads KV head h / (n_heads / n_kv_heads).
class KeyStatistics {
 public:
  // pair_frequencies: d/2 values (rope_pair_frequencies).
  KeyStatistics(int head_dim, std::vector<double> pair_frequencies);

  void begin_sequence();
  // The keys of positions first_position.., in order (the first call of a sequence at position 0).
  void add_keys(std::span<const float> k, int n_tokens, int n_kv_heads, int first_position);
  // Queries of positions first_position.. (their keys already added): their moments, and the attention each
  // visible key receives from every stride-th of them (scores scale * q.k, causal, within the last sliding_window
  // positions when it is positive). A layer that reads another's KV adds its queries to that layer's statistics.
  void add_queries(std::span<const float> q, int n_tokens, int n_heads, int first_position, float scale,
                   int sliding_window, int stride);
  // Adds the sequence's keys, centered as the cache centers them (kv_cache.h: the mean of positions 1.. of the
  // first batch, none under kKeyCenterMinTokens) and weighted by the attention they received.
  void end_sequence();

  int head_dim() const { return d_; }
  int64_t n_queries() const { return n_queries_; }
  double key_weight() const { return key_weight_; }  // attention the keys received, summed
  const std::vector<double>& pair_frequencies() const { return frequencies_; }
  // Hermitian moments of the pairs before RoPE (d/2 x d/2, real and imaginary parts), unnormalized.
  const std::vector<double>& query_moments_re() const { return q_re_; }
  const std::vector<double>& query_moments_im() const { return q_im_; }
  const std::vector<double>& key_moments_re() const { return k_re_; }
  const std::vector<double>& key_moments_im() const { return k_im_; }

 private:
  void add_moments(std::vector<double>& re, std::vector<double>& im, const float* x, int position, double weight);

  int d_;
  std::vector<double> frequencies_;
  int64_t n_queries_ = 0;
  double key_weight_ = 0;
  std::vector<double> q_re_, q_im_, k_re_, k_im_;
  std::vector<double> pair_re_, pair_im_;  // add_moments' pairs before RoPE
  // The sequence in progress: its keys, the attention each received, the first batch's size (for the center).
  std::vector<float> keys_;
  std::vector<double> received_;
  int n_kv_heads_ = 0, first_batch_ = 0, n_seq_ = 0;
};

// A layer's transform: keys are stored as key * k, queries formed as query * q (both d x d, row-major, so that
// (query q) . (key k) = q . k).
struct KeyTransform {
  int head_dim = 0;
  std::vector<float> key;    // A
  std::vector<float> query;  // A^-T (= A^-1: A is symmetric)
  // The score-error variance without the transform over with it, on the moments it was solved for: the cost
  // below, (tr Sq)(tr Sk) / (tr(A^-T Sq A^-1) tr(A Sk A^T)).
  double predicted_gain = 0;
};

// The position-averaged second moments over positions 0..context-1 (above), as real d x d matrices in the
// layout of the head (pair p = elements p and p + d/2), normalized per query and per unit of key weight.
std::vector<double> averaged_query_moments(const KeyStatistics& s, double context);
std::vector<double> averaged_key_moments(const KeyStatistics& s, double context);

// A = M^1/2 for the statistics averaged over positions 0..context-1. Both moments are first scaled to trace d
// and given `ridge` * I, which bounds A's condition number: a direction that the calibration text never used
// must not blow up a key that does use it. Throws sparrow::Error for statistics without queries or keys.
KeyTransform solve_key_transform(const KeyStatistics& stats, double context, double ridge);

// The file beside a model that holds its transforms (GGUF: "blk.N.key_transform" and "blk.N.query_transform",
// F32 d x d, for each layer that owns KV, and the fingerprint of the model they were calibrated on).
struct KeyTransformFile {
  uint64_t model_fingerprint = 0;
  int32_t context = 0;       // positions the moments were averaged over
  int64_t n_tokens = 0;      // calibration tokens
  std::string source;        // what the calibration text was
  std::vector<KeyTransform> layers;  // indexed by layer; head_dim 0 where a layer has none
};
void write_key_transform_file(const std::string& path, const KeyTransformFile& f);
// The default place of a model's transforms: MODEL.gguf -> MODEL.key-transforms.gguf.
std::string key_transform_path_beside(const std::string& model_path);
// GGUF keys and tensor names of the file.
inline constexpr const char* kKeyTransformFingerprintKey = "sparrow.key_transforms.model_fingerprint";
inline constexpr const char* kKeyTransformContextKey = "sparrow.key_transforms.context";
inline constexpr const char* kKeyTransformTokensKey = "sparrow.key_transforms.tokens";
inline constexpr const char* kKeyTransformSourceKey = "sparrow.key_transforms.source";
std::string key_transform_tensor(int32_t il, bool query);

}  // namespace sparrow
