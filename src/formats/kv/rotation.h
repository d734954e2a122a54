#pragma once
// The randomized Hadamard transform R = D2 · H · D1 / sqrt(d) that TurboQuant, TCQ and PolarQuant share:
// D1, D2 fixed random ±1 diagonals (per head dim, from fixed seeds), H the Walsh-Hadamard matrix. R is
// orthogonal, so <R q, R k> = <q, k>: queries are rotated once per step, keys never un-rotated, and V is
// accumulated rotated and un-rotated once per output row (R^T = D1 · H · D2 / sqrt(d)).
namespace sparrow::formats {

void hadamard_rotate(const float* x, int d, float* y);    // y = R x   (x and y may alias)
void hadamard_unrotate(const float* y, int d, float* x);  // x = R^T y (may alias)
// The plain orthonormal Walsh-Hadamard transform W = H / sqrt(d) (Sylvester order, no signs): the rotation
// llama.cpp applies to Q, K and V before its quantized KV types (docs/kv-codecs.md), which
// the q8_0 and q4_0 codecs reproduce. W is symmetric and its own inverse. x and y may alias.
void walsh_hadamard_orthonormal(const float* x, int d, float* y);
// The ±1 diagonals for head dim d (d floats each), e.g. for optimized kernels that fuse the transform.
const float* hadamard_signs_in(int d);   // D1
const float* hadamard_signs_out(int d);  // D2

}  // namespace sparrow::formats
