// Builds the device copies of the codec tables from the host functions that define them (device_tables.cuh).
#include "cuda/kv/device_tables.cuh"

#include <map>
#include <mutex>
#include <vector>

#include "formats/kv/qjl.h"
#include "formats/kv/rotation.h"
#include "formats/kv/trellis.h"

namespace sparrow::cuda::kv {
namespace {

constexpr int kHeadDims[kHeadDimSlots] = {64, 128, 256, 512};

// count elements copied to a new device allocation, kept for the life of the process: the tables are
// read-only and every kernel that runs a codec needs them.
template <class T>
const T* upload(const T* host, size_t count) {
  void* device = nullptr;
  SPARROW_CUDA_CHECK(cudaMalloc(&device, sizeof(T) * count));
  SPARROW_CUDA_CHECK(cudaMemcpy(device, host, sizeof(T) * count, cudaMemcpyHostToDevice));
  return static_cast<const T*>(device);
}

DeviceKvTables upload_codebooks() {
  DeviceKvTables t{};
  for (int slot = 0; slot < kHeadDimSlots; ++slot) {
    const int d = kHeadDims[slot];
    t.hadamard_in[slot] = upload(formats::hadamard_signs_in(d), size_t(d));
    t.hadamard_out[slot] = upload(formats::hadamard_signs_out(d), size_t(d));
  }
  std::vector<formats::LloydMaxCodebook> books(8);
  for (int n : {64, 128})
    for (int bits = 1; bits <= 4; ++bits) books[lloyd_max_slot(n, bits)] = formats::lloyd_max_codebook(n, bits);
  t.lloyd_max = upload(books.data(), books.size());
  const formats::tcq::Trellis* trellises[3] = {&formats::tcq::tcq2_trellis(), &formats::tcq::tcq3_trellis(),
                                               &formats::tcq::tcq4_trellis()};
  for (int i = 0; i < 3; ++i) {
    t.tcq_codebook[i][0] = upload(formats::tcq::scaled_codebook(*trellises[i], 64), size_t(trellises[i]->states()));
    t.tcq_codebook[i][1] = upload(formats::tcq::scaled_codebook(*trellises[i], 128), size_t(trellises[i]->states()));
  }
  std::vector<formats::polar::AngleCodebook> angles;
  for (int level = 1; level <= formats::polar::kLevels; ++level)
    angles.push_back(formats::polar::angle_codebook(level));
  t.polar_angles = upload(angles.data(), angles.size());
  return t;
}

void upload_projections(DeviceKvTables& t) {
  for (int rows_per_dim = 1; rows_per_dim <= 2; ++rows_per_dim) {
    for (int slot = 0; slot < kHeadDimSlots; ++slot) {
      const int d = kHeadDims[slot], m = rows_per_dim * d;
      t.qjl_projection[rows_per_dim - 1][slot] = upload(formats::qjl::projection(m, d), size_t(m) * d);
    }
  }
}

}  // namespace

DeviceKvTables device_kv_tables(bool with_projections) {
  static std::mutex mutex;
  static std::map<int, DeviceKvTables> per_device;
  int device = 0;
  SPARROW_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = per_device.find(device);
  if (it == per_device.end()) it = per_device.emplace(device, upload_codebooks()).first;
  if (with_projections && it->second.qjl_projection[0][0] == nullptr) upload_projections(it->second);
  return it->second;
}

namespace {

struct Binders {
  std::mutex mutex;
  std::vector<void (*)(bool)> list;
};

Binders& binders() {
  static Binders b;  // built on first use: registration runs during other units' static initialization
  return b;
}

}  // namespace

bool register_kv_tables_binder(void (*bind)(bool with_projections)) {
  Binders& b = binders();
  std::lock_guard<std::mutex> lock(b.mutex);
  b.list.push_back(bind);
  return true;
}

}  // namespace sparrow::cuda::kv

namespace sparrow::cuda {

void bind_kv_tables() {
  kv::Binders& b = kv::binders();
  std::lock_guard<std::mutex> lock(b.mutex);
  for (void (*bind)(bool) : b.list) bind(true);
}

}  // namespace sparrow::cuda
