#pragma once
// The codec constants on the device: the very tables the references use (Hadamard sign vectors, Lloyd-Max and
// trellis codebooks, polar angle codebooks, QJL projections), copied once per device from the host functions
// that define them (formats/kv/), so no constant is retyped and no generator runs twice.
//
// Where device code finds them: this build compiles every .cu file as its own device module (no relocatable
// device code), so a __device__ symbol cannot be shared between files. Each translation unit that includes
// this header gets its own __constant__ DeviceKvTables (pointers into the shared global-memory copies), and
// with_device_codec (codecs.cuh), the one runtime switch every launch site goes through, binds that unit's
// copy before it calls back. A launch site inside CUDA graph capture must call bind_device_kv_tables() once
// before capturing (binding copies to the device and synchronizes).
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "cuda/cuda_check.h"
#include "formats/kv/lloyd_max.h"
#include "formats/kv/polar.h"

namespace sparrow::cuda::kv {

constexpr int kHeadDimSlots = 4;  // head dims 64, 128, 256, 512

// 0..3 for head dims 64..512 (d a supported head dim).
__host__ __device__ inline int head_dim_slot(int d) { return d == 64 ? 0 : d == 128 ? 1 : d == 256 ? 2 : 3; }

struct DeviceKvTables {
  const float* hadamard_in[kHeadDimSlots];   // D1 of formats/kv/rotation.h, d floats
  const float* hadamard_out[kHeadDimSlots];  // D2
  // lloyd_max_codebook(n, bits) at [lloyd_max_slot(n, bits)]: n = 64 or 128, bits 1..4.
  const formats::LloydMaxCodebook* lloyd_max;
  // tcq::scaled_codebook(trellis, n) at [trellis: 0 tcq2, 1 tcq3][n: 0 = 64, 1 = 128]; 2^L floats.
  const float* tcq_codebook[2][2];
  const formats::polar::AngleCodebook* polar_angles;  // levels 1..4 at [level - 1]
  // qjl::projection(m, d) at [m / d - 1][head_dim_slot(d)], row-major m x d; null until a codec that sketches
  // (qjl, tbq3p, tbq4p) is first bound: the 2d x 512 matrix alone takes a second to build on the host.
  const float* qjl_projection[2][kHeadDimSlots];
};

__host__ __device__ inline int lloyd_max_slot(int n, int bits) { return (n == 64 ? 0 : 4) + bits - 1; }

// The tables of the current device, built and uploaded at the first call (thread-safe; kept for the life of
// the process). with_projections: the QJL matrices too.
const DeviceKvTables& device_kv_tables(bool with_projections);

namespace {

__constant__ DeviceKvTables g_device_kv_tables;

// Binds this translation unit's tables on the current device (once per device; again only to add the
// projections).
[[maybe_unused]] void bind_device_kv_tables(bool with_projections) {
  constexpr int kMaxDevices = 64;
  static std::mutex mutex;
  static std::array<uint8_t, kMaxDevices> bound{};  // 1: bound, 2: bound with projections
  int device = 0;
  SPARROW_CUDA_CHECK(cudaGetDevice(&device));
  const uint8_t wanted = with_projections ? 2 : 1;
  std::lock_guard<std::mutex> lock(mutex);
  uint8_t& state = bound[size_t(device) % kMaxDevices];
  if (state >= wanted) return;
  const DeviceKvTables& tables = device_kv_tables(with_projections);
  SPARROW_CUDA_CHECK(cudaMemcpyToSymbol(g_device_kv_tables, &tables, sizeof tables));
  SPARROW_CUDA_CHECK(cudaDeviceSynchronize());  // a copy from pageable memory may return before it lands
  state = wanted;
}

__device__ inline const DeviceKvTables& kv_tables() { return g_device_kv_tables; }

}  // namespace
}  // namespace sparrow::cuda::kv
