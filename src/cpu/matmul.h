#pragma once
// Matrix products and row gathers against weights of any supported format, SIMD through Highway and
// threaded. The reference for each is formats::dequantize_row followed by a plain float loop.
#include <cstdint>

#include "cpu/thread_pool.h"
#include "formats/weight_matrix.h"

namespace sparrow::cpu {

// y[t * n_out + o] = sum_i W[o][i] * x[t * n_in + i] for t in [0, n_tokens).
void matmul(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_tokens, float* y);

// Whether this CPU's kernels multiply `type` faster with its rows interleaved (WeightMatrix::interleaved,
// formats/weight_interleave.h) than in the file's layout. Both layouts work everywhere.
bool matmul_interleaves(TensorType type);

// out[r * n_in + i] = W[ids[r]][i] (embedding lookup), dequantized to float.
void get_rows(const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float* out);

}  // namespace sparrow::cpu
