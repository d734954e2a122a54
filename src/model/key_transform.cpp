#include "model/key_transform.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <utility>

#include <Eigen/Dense>

#include "gguf/gguf.h"
#include "kv/kv_cache.h"
#include "util/error.h"

namespace sparrow {
namespace {

using Matrix = std::vector<double>;  // n x n, row-major
using EigenMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

Eigen::Map<const EigenMatrix> view(std::span<const double> a, int n) { return {a.data(), n, n}; }

Matrix to_vector(const EigenMatrix& m) { return Matrix(m.data(), m.data() + m.size()); }

// The eigendecomposition of a symmetric matrix (Eigen's tridiagonal QR); throws unless `a` is n x n, finite and
// symmetric within 1e-9 of its norm.
Eigen::SelfAdjointEigenSolver<EigenMatrix> eigen_of(std::span<const double> a, int n) {
  if (n <= 0 || a.size() != size_t(n) * n)
    throw Error("key transform: expected a " + std::to_string(n) + " x " + std::to_string(n) + " matrix, got " +
                std::to_string(a.size()) + " values");
  const auto m = view(a, n);
  if (!m.allFinite()) throw Error("key transform: a matrix with non-finite values");
  if ((m - m.transpose()).cwiseAbs().maxCoeff() > 1e-9 * std::max(m.norm(), 1e-300))
    throw Error("key transform: the matrix is not symmetric");
  Eigen::SelfAdjointEigenSolver<EigenMatrix> e(m);
  if (e.info() != Eigen::Success) throw Error("key transform: the eigendecomposition did not converge");
  return e;
}

// V diag(max(lambda, 0)^p) V^T; p < 0 needs every eigenvalue positive.
EigenMatrix power_of(const Eigen::SelfAdjointEigenSolver<EigenMatrix>& e, double p) {
  Eigen::VectorXd powered = e.eigenvalues().cwiseMax(0.0);
  if (p < 0 && powered.minCoeff() <= 0) throw Error("key transform: a negative power of a singular matrix");
  powered = powered.array().pow(p).matrix();
  const EigenMatrix v = e.eigenvectors();
  return v * powered.asDiagonal() * v.transpose();
}

// Scaled to trace n, plus ridge * I.
EigenMatrix regularized(std::span<const double> s, int n, double ridge) {
  const EigenMatrix m = view(s, n);
  const double trace = m.trace();
  if (!(trace > 0) || !std::isfinite(trace))
    throw Error("key transform: second moments with a zero or non-finite trace");
  return m * (n / trace) + ridge * EigenMatrix::Identity(n, n);
}

// (a + a^T) / 2: a product of symmetric matrices like B S B is symmetric only up to rounding.
EigenMatrix symmetrized(const EigenMatrix& a) { return (a + a.transpose()) / 2; }

// The Hermitian moments (re, im; h x h) averaged over positions 0..L-1 and scaled by 1 / count, as the real
// d x d matrix [[Re, -Im], [Im, Re]] of the head's layout.
Matrix averaged(const std::vector<double>& re, const std::vector<double>& im, const std::vector<double>& freq,
                double count, double context) {
  const int h = int(freq.size()), d = 2 * h;
  if (!(count > 0)) throw Error("key transform: no calibration queries or keys for this layer");
  Matrix out(size_t(d) * d, 0.0);
  for (int p = 0; p < h; ++p)
    for (int r = 0; r < h; ++r) {
      // mean over t in [0, L) of exp(i D t) = (exp(i D L) - 1) / (i D L)
      const double x = (freq[size_t(p)] - freq[size_t(r)]) * context;
      const std::complex<double> mean =
          std::abs(x) < 1e-9 ? std::complex<double>(1, 0)
                             : (std::exp(std::complex<double>(0, x)) - 1.0) / std::complex<double>(0, x);
      const std::complex<double> s = std::complex<double>(re[size_t(p) * h + r], im[size_t(p) * h + r]) * mean / count;
      out[size_t(p) * d + r] = out[size_t(p + h) * d + (r + h)] = s.real();
      out[size_t(p) * d + (r + h)] = -s.imag();
      out[size_t(p + h) * d + r] = s.imag();
    }
  return to_vector(symmetrized(view(out, d)));
}

std::vector<float> to_floats(const EigenMatrix& m) { return std::vector<float>(m.data(), m.data() + m.size()); }

}  // namespace

std::vector<double> psd_power(std::span<const double> s, int n, double p) {
  return to_vector(power_of(eigen_of(s, n), p));
}

std::vector<double> rope_pair_frequencies(int32_t n_rot, double freq_base, double freq_scale,
                                          std::span<const float> divisors) {
  if (n_rot <= 0 || n_rot % 2 != 0) throw Error("rope_pair_frequencies: n_rot must be positive and even");
  const int half = n_rot / 2;
  if (!divisors.empty() && divisors.size() != size_t(half))
    throw Error("rope_pair_frequencies: " + std::to_string(divisors.size()) + " divisors for " +
                std::to_string(half) + " pairs");
  std::vector<double> w(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    const double divisor = divisors.empty() ? 1.0 : double(divisors[size_t(i)]);
    w[size_t(i)] = freq_scale * std::pow(freq_base, -2.0 * i / n_rot) / divisor;
  }
  return w;
}

KeyStatistics::KeyStatistics(int head_dim, std::vector<double> pair_frequencies)
    : d_(head_dim), frequencies_(std::move(pair_frequencies)) {
  if (head_dim <= 0 || head_dim % 2 != 0 || frequencies_.size() != size_t(head_dim / 2))
    throw Error("KeyStatistics: head dim " + std::to_string(head_dim) + " with " +
                std::to_string(frequencies_.size()) + " pair frequencies");
  const size_t h = size_t(head_dim / 2);
  q_re_.assign(h * h, 0.0);
  q_im_ = k_re_ = k_im_ = q_re_;
}

void KeyStatistics::begin_sequence() {
  keys_.clear();
  received_.clear();
  n_seq_ = first_batch_ = n_kv_heads_ = 0;
}

void KeyStatistics::add_keys(std::span<const float> k, int n_tokens, int n_kv_heads, int first_position) {
  if (n_tokens <= 0 || n_kv_heads <= 0 || k.size() != size_t(n_tokens) * n_kv_heads * d_)
    throw Error("KeyStatistics: keys do not hold n_tokens x n_kv_heads x head_dim values");
  if (first_position != n_seq_ || (n_seq_ > 0 && n_kv_heads != n_kv_heads_))
    throw Error("KeyStatistics: keys must arrive in order, position " + std::to_string(n_seq_) + " next");
  if (n_seq_ == 0) first_batch_ = n_tokens, n_kv_heads_ = n_kv_heads;
  keys_.insert(keys_.end(), k.begin(), k.end());
  received_.resize(received_.size() + size_t(n_tokens) * n_kv_heads, 0.0);
  n_seq_ += n_tokens;
}

void KeyStatistics::add_queries(std::span<const float> q, int n_tokens, int n_heads, int first_position,
                                float scale, int sliding_window, int stride) {
  const int d = d_, n_kv = n_kv_heads_;
  if (n_tokens <= 0 || n_heads <= 0 || n_kv == 0 || n_heads % n_kv != 0 || stride <= 0 ||
      q.size() != size_t(n_tokens) * n_heads * d)
    throw Error("KeyStatistics: queries do not hold n_tokens x n_heads x head_dim values of this layer's heads");
  if (first_position + n_tokens > n_seq_) throw Error("KeyStatistics: queries ahead of their keys");
  const int group = n_heads / n_kv;
  std::vector<double> p;
  for (int t = 0; t < n_tokens; ++t) {
    const int i = first_position + t;
    if (i % stride != 0) continue;
    const int first = sliding_window > 0 ? std::max(0, i - sliding_window + 1) : 0;
    p.resize(size_t(i - first + 1));
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q.data() + (size_t(t) * n_heads + h) * d;
      const int kh = h / group;
      double top = -INFINITY;
      for (int j = first; j <= i; ++j) {
        const float* kj = keys_.data() + (size_t(j) * n_kv + kh) * d;
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += double(qh[e]) * kj[e];
        p[size_t(j - first)] = scale * dot;
        top = std::max(top, p[size_t(j - first)]);
      }
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - top));
      for (int j = first; j <= i; ++j) received_[size_t(j) * n_kv + kh] += p[size_t(j - first)] / sum;
      add_moments(q_re_, q_im_, qh, i, 1.0);
      ++n_queries_;
    }
  }
}

void KeyStatistics::end_sequence() {
  const int d = d_, n_kv = n_kv_heads_;
  std::vector<double> center(size_t(n_kv) * d, 0.0);
  if (first_batch_ >= kKeyCenterMinTokens)
    for (int t = 1; t < first_batch_; ++t)
      for (size_t i = 0; i < center.size(); ++i) center[i] += double(keys_[size_t(t) * n_kv * d + i]) / (first_batch_ - 1);
  std::vector<float> x(static_cast<size_t>(d));
  for (int t = 0; t < n_seq_; ++t)
    for (int h = 0; h < n_kv; ++h) {
      const double w = received_[size_t(t) * n_kv + h];
      if (w == 0) continue;
      const float* k = keys_.data() + (size_t(t) * n_kv + h) * d;
      for (int e = 0; e < d; ++e) x[size_t(e)] = float(double(k[e]) - center[size_t(h) * d + e]);
      add_moments(k_re_, k_im_, x.data(), t, w);
      key_weight_ += w;
    }
  begin_sequence();
}

// z_p = (x_p + i x_{p+h}) exp(-i w_p position): the pair before RoPE; re + i im += weight z z^H.
void KeyStatistics::add_moments(std::vector<double>& re, std::vector<double>& im, const float* x, int position,
                                double weight) {
  const int h = d_ / 2;
  std::vector<double>& a = pair_re_;
  std::vector<double>& b = pair_im_;
  a.resize(size_t(h));
  b.resize(size_t(h));
  for (int p = 0; p < h; ++p) {
    const double angle = frequencies_[size_t(p)] * position, c = std::cos(angle), s = std::sin(angle);
    a[size_t(p)] = x[p] * c + x[p + h] * s;
    b[size_t(p)] = x[p + h] * c - x[p] * s;
  }
  for (int p = 0; p < h; ++p) {
    const double ap = weight * a[size_t(p)], bp = weight * b[size_t(p)];
    double* re_row = re.data() + size_t(p) * h;
    double* im_row = im.data() + size_t(p) * h;
    for (int r = 0; r < h; ++r) {  // z_p conj(z_r)
      re_row[r] += ap * a[size_t(r)] + bp * b[size_t(r)];
      im_row[r] += bp * a[size_t(r)] - ap * b[size_t(r)];
    }
  }
}

std::vector<double> averaged_query_moments(const KeyStatistics& s, double context) {
  return averaged(s.query_moments_re(), s.query_moments_im(), s.pair_frequencies(), double(s.n_queries()), context);
}

std::vector<double> averaged_key_moments(const KeyStatistics& s, double context) {
  return averaged(s.key_moments_re(), s.key_moments_im(), s.pair_frequencies(), s.key_weight(), context);
}

KeyTransform solve_key_transform(const KeyStatistics& stats, double context, double ridge) {
  const int d = stats.head_dim();
  if (!(context >= 1)) throw Error("key transform: the context must be at least one position");
  const EigenMatrix sq = regularized(averaged_query_moments(stats, context), d, ridge);
  const EigenMatrix sk = regularized(averaged_key_moments(stats, context), d, ridge);
  const Eigen::SelfAdjointEigenSolver<EigenMatrix> sk_eigen(sk);
  const EigenMatrix sk_half = power_of(sk_eigen, 0.5), sk_inv_half = power_of(sk_eigen, -0.5);
  const EigenMatrix inner = symmetrized(sk_half * sq * sk_half);
  const EigenMatrix inner_half = power_of(Eigen::SelfAdjointEigenSolver<EigenMatrix>(inner), 0.5);
  const Eigen::SelfAdjointEigenSolver<EigenMatrix> m(symmetrized(sk_inv_half * inner_half * sk_inv_half));
  KeyTransform t;
  t.head_dim = d;
  const EigenMatrix key = power_of(m, 0.5), query = power_of(m, -0.5);
  t.key = to_floats(key);
  t.query = to_floats(query);
  t.predicted_gain = sq.trace() * sk.trace() / ((query * sq * query.transpose()).trace() *
                                                (key * sk * key.transpose()).trace());
  return t;
}

std::string key_transform_tensor(int32_t il, bool query) {
  return "blk." + std::to_string(il) + (query ? ".query_transform" : ".key_transform");
}

std::string key_transform_path_beside(const std::string& model_path) {
  const std::string ext = ".gguf";
  const bool has_ext = model_path.size() > ext.size() && model_path.ends_with(ext);
  return (has_ext ? model_path.substr(0, model_path.size() - ext.size()) : model_path) + ".key-transforms.gguf";
}

void write_key_transform_file(const std::string& path, const KeyTransformFile& f) {
  gguf::Writer w;
  w.set_string("general.architecture", "sparrow-key-transforms");
  w.set_u64(kKeyTransformFingerprintKey, f.model_fingerprint);
  w.set_u32(kKeyTransformContextKey, uint32_t(f.context));
  w.set_u64(kKeyTransformTokensKey, uint64_t(f.n_tokens));
  w.set_string(kKeyTransformSourceKey, f.source);
  for (size_t il = 0; il < f.layers.size(); ++il) {
    const KeyTransform& t = f.layers[il];
    if (t.head_dim == 0) continue;
    const size_t n = size_t(t.head_dim) * t.head_dim;
    if (t.key.size() != n || t.query.size() != n)
      throw Error("key transforms: layer " + std::to_string(il) + " is not head_dim x head_dim");
    for (bool query : {false, true}) {
      const std::vector<float>& m = query ? t.query : t.key;
      w.add_tensor(key_transform_tensor(int32_t(il), query), TensorType::F32, {t.head_dim, t.head_dim},
                   m.data(), n * sizeof(float));
    }
  }
  w.write(path);
}

}  // namespace sparrow
