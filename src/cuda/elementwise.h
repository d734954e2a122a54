#pragma once
// The CUDA backend's element-wise and row kernels: what the CPU backend (src/cpu/cpu_backend.cpp) computes, on
// device memory. Element-wise ops are grid-stride loops over float4 where every pointer is 16-byte aligned (a
// scalar loop takes the tail, or everything when a pointer is not); row ops run one block per row. Every
// launcher enqueues on target.stream and returns without waiting.
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "cuda/device_position.h"
#include "ops/backend.h"
#include "ops/gelu.h"

namespace sparrow::cuda {

// Where a kernel runs: its stream, and the device's multiprocessor count, which caps grid-stride grids.
struct LaunchTarget {
  cudaStream_t stream = nullptr;
  int multiprocessors = 1;
};

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight (weight may be null); y may equal x.
void rms_norm(const LaunchTarget& target, const float* x, const float* weight, int64_t n_rows, int64_t dim,
              float eps, float* y);
// Backend::add_rms_norm in one kernel: x = (x + (r = rms_norm(r) * r_weight)) * x_scale, each step rounded as
// the ops one by one round it; then, when next is set, next = rms_norm(x) * next_weight. Either weight may be
// null (no weight).
void add_rms_norm(const LaunchTarget& target, float* x, float* r, const float* r_weight, int64_t n_rows, int64_t dim,
                  float eps, const float* next_weight, float* next, float x_scale = 1.0f);
// Backend::rope: NEOX pairs (i, i + n_rot/2), in place; params.freq_divisors in device memory or null.
void rope(const LaunchTarget& target, float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim,
          DevicePosition first_position, const RopeParams& params);
// Backend::rms_norm_rope in one kernel per kMaxHeadTensors tensors: each head of each tensor normalized (times
// its weight, which may be null), then rotated as by rope where the tensor rotates.
constexpr int kMaxHeadTensors = 3;
void rms_norm_rope(const LaunchTarget& target, std::span<const HeadTensor> tensors, float eps, int64_t n_tokens,
                   int32_t head_dim, DevicePosition first_position, const RopeParams& params);
// y = gelu(gate) * up (up may be null: y = gelu(gate)); y may alias gate. gelu_table: the device copy of
// gelu_f16_table().
void gelu_mul(const LaunchTarget& target, const uint16_t* gelu_table, const float* gate, const float* up,
              int64_t n, float* y);
void add(const LaunchTarget& target, float* y, const float* x, int64_t n);        // y += x
void scale(const LaunchTarget& target, float* y, float s, int64_t n);              // y *= s
void softcap(const LaunchTarget& target, float* y, float cap, int64_t n);          // y = cap * tanh(y / cap)
// y[r][i] *= x[r * x_row_stride + i] for r < n_rows, i < row_len.
void mul_rows(const LaunchTarget& target, float* y, const float* x, int64_t n_rows, int64_t row_len,
              int64_t x_row_stride);
// out[i] = mean over r < n_rows of x[r * row_len + i], accumulated in double (n_rows >= 1).
void mean_rows(const LaunchTarget& target, const float* x, int64_t n_rows, int64_t row_len, float* out);

// dst[i] = values[i] for i < n <= kInlineInts (values in host memory, dst on the device), the values passed as
// kernel arguments: a CUDA graph that recorded the launch holds them, and takes new ones as an argument update.
constexpr int kInlineInts = 256;
void write_inline_ints(const LaunchTarget& target, const int32_t* values, int n, int32_t* dst);

// GELU as every backend computes it (ops/gelu.h: llama.cpp's f16 table). Only inputs in (-10, 10) are looked up,
// and those round to f16 codes of magnitude at most 10.0 (kGeluLastCode), so the table holds those codes only,
// positive then negative, as f16: 73 KiB instead of a float per f16 code (256 KiB).
constexpr uint16_t kGeluLastCode = 0x4900;  // f16 bits of 10.0
constexpr int kGeluTableEntries = 2 * (kGeluLastCode + 1);
// Built on the host from ops/gelu.h's entries, as the CPU backend's table is, so the device reproduces the CPU
// bit for bit; device-side tanhf differs from the host's in the last float bits, which
// the f16 rounding would sometimes expose.
std::vector<uint16_t> gelu_f16_table();

}  // namespace sparrow::cuda
