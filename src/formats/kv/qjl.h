#pragma once
// The QJL sketch (Zandieh, Daliri, Han, arXiv 2406.03482): store sign(S k) (m bits) and ||k||; estimate
//   <q, k> ~ sqrt(pi/2) / m * ||k|| * <S q, sign(S k)>,
// which is <q, k^> for the key estimate k^ = sqrt(pi/2) / m * ||k|| * S^T sign(S k). Used by the qjl codec
// (m = 2d) and by the residual sketch of tbq3p/tbq4p (m = d).
//
// S (m x d) is Gaussian from a fixed seed with orthogonalised rows: each block of d consecutive rows is
// orthonormalised (Gram-Schmidt, twice, in double), then every row is scaled to E[chi_d] =
// sqrt(2) Gamma((d+1)/2) / Gamma(d/2), the mean norm of a d-dimensional Gaussian row. Why that scale: with
// rows of norm rho, E|<s, u>| = rho * E|u_1| for a random unit u, and rho = E[chi_d] makes
// sqrt(pi/2) * rho * E|u_1| = 1 exactly, so the estimate is unbiased over isotropic keys for this one fixed
// S, not only on average over random S. Orthogonal rows lower the variance below the i.i.d. Gaussian bound
// pi / (2m) * ||q||^2 ||k||^2 (QJL lemma 3.5). S is built at first use; tests pin it by a checksum.
#include <cstddef>
#include <cstdint>

#include "formats/host_device.h"

namespace sparrow::formats::qjl {

constexpr int kCodecRowsPerDim = 2;  // the qjl codec sketches m = 2d rows

// The m x d projection, row-major; m = d or 2d, d a supported head dim; throws sparrow::Error otherwise.
const float* projection(int m, int d);
// E[chi_d], the norm of every row of S.
double row_norm(int d);
// sqrt(pi/2) / m, the estimator's constant.
float estimator_scale(int m);

// sx = S x (m floats); x = S^T v (d floats). Reference: double sums.
void project(const float* x, int m, int d, float* sx);
void project_transposed(const float* v, int m, int d, float* x);

// Sign bits of a sketch: bit i % 8 of byte i / 8 is set when sx[i] < 0 (so a zero projection reads +1).
void pack_signs(const float* sx, int m, uint8_t* bits);
SPARROW_HOST_DEVICE inline float sign_at(const uint8_t* bits, int i) {
  return (bits[i / 8] >> (i % 8)) & 1 ? -1.0f : 1.0f;
}

}  // namespace sparrow::formats::qjl
