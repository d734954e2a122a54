#pragma once
// The codec constants on the device: the very tables the references use (Hadamard sign vectors, Lloyd-Max and
// trellis codebooks, polar angle codebooks, QJL projections), copied once per device from the host functions
// that define them (formats/kv/), so no constant is retyped and no generator runs twice.
//
// Where device code finds them: this build compiles every .cu file as its own device module (no relocatable
// device code), so a __device__ symbol cannot be shared between files. Each translation unit that includes
// this header gets its own __constant__ DeviceKvTables (pointers into the shared global-memory copies), and
// with_device_codec (codecs.cuh), the one runtime switch every launch site goes through, binds that unit's
// copy before it calls back. Binding copies to the device and synchronizes, which a CUDA graph capture forbids,
// so every unit also registers its binder (below), and cuda::bind_kv_tables (kv_ops.h) binds them all up front.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "cuda/cuda_check.h"
#include "formats/kv/lloyd_max.h"
#include "formats/kv/polar.h"
#include "util/error.h"

namespace sparrow::cuda::kv {

constexpr int kHeadDimSlots = 4;  // head dims 64, 128, 256, 512

// 0..3 for head dims 64..512 (d a supported head dim).
__host__ __device__ inline int head_dim_slot(int d) { return d == 64 ? 0 : d == 128 ? 1 : d == 256 ? 2 : 3; }

struct DeviceKvTables {
  const float* hadamard_in[kHeadDimSlots];   // D1 of formats/kv/rotation.h, d floats
  const float* hadamard_out[kHeadDimSlots];  // D2
  // lloyd_max_codebook(n, bits) at [lloyd_max_slot(n, bits)]: n = 64 or 128, bits 1..4.
  const formats::LloydMaxCodebook* lloyd_max;
  // tcq::scaled_codebook(trellis, n) at [trellis: k - 2 (tcq2, tcq3, tcq4)][n: 0 = 64, 1 = 128]; 2^L floats.
  const float* tcq_codebook[3][2];
  const formats::polar::AngleCodebook* polar_angles;  // levels 1..4 at [level - 1]
  // qjl::projection(m, d) at [m / d - 1][head_dim_slot(d)], row-major m x d; null until a codec that sketches
  // (qjl, tbq3p, tbq4p) is first bound: building them (Gram-Schmidt in double on the host) is not free.
  const float* qjl_projection[2][kHeadDimSlots];
};

__host__ __device__ inline int lloyd_max_slot(int n, int bits) { return (n == 64 ? 0 : 4) + bits - 1; }

// The current device's table pointers (a copy), the tables built and uploaded at the first call and kept for
// the life of the process; thread-safe. with_projections: the QJL matrices too.
DeviceKvTables device_kv_tables(bool with_projections);

// Adds a translation unit's binder to those cuda::bind_kv_tables calls; at static initialization, once per unit.
bool register_kv_tables_binder(void (*bind)(bool with_projections));

namespace {

__constant__ DeviceKvTables g_device_kv_tables;

// Binds this translation unit's tables on the current device: once per device (again only to add the
// projections). After that a call costs a cudaGetDevice and an atomic load.
[[maybe_unused]] void bind_device_kv_tables(bool with_projections) {
  constexpr int kMaxDevices = 64;
  static std::atomic<uint64_t> bound{0}, bound_with_projections{0};  // bit i: device i
  static std::mutex mutex;
  int device = 0;
  SPARROW_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= kMaxDevices) throw Error("kv codec tables: device " + std::to_string(device) + " (at most 64)");
  const uint64_t bit = uint64_t(1) << device;
  std::atomic<uint64_t>& done = with_projections ? bound_with_projections : bound;
  if (done.load(std::memory_order_acquire) & bit) return;
  std::lock_guard<std::mutex> lock(mutex);
  if (done.load(std::memory_order_relaxed) & bit) return;
  // A table with projections serves every codec; one without them is replaced when a sketching codec comes.
  const DeviceKvTables tables = device_kv_tables(with_projections);
  SPARROW_CUDA_CHECK(cudaMemcpyToSymbol(g_device_kv_tables, &tables, sizeof tables));
  SPARROW_CUDA_CHECK(cudaDeviceSynchronize());  // a copy from pageable memory may return before it lands
  bound.fetch_or(bit, std::memory_order_release);
  if (with_projections) bound_with_projections.fetch_or(bit, std::memory_order_release);
}

__device__ inline const DeviceKvTables& kv_tables() { return g_device_kv_tables; }

[[maybe_unused]] const bool g_kv_tables_binder_registered = register_kv_tables_binder(&bind_device_kv_tables);

}  // namespace
}  // namespace sparrow::cuda::kv
