// The CPU's weight store: matrices stay in the GGUF file mapping (zero-copy), except those the kernels read
// faster interleaved (cpu::matmul_interleaves: Q4_K, Q8_0 and Q5_0 on AVX2), which are rearranged once into memory of
// their own; vectors are kept in host memory.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <hwy/aligned_allocator.h>

#include "cpu/matmul.h"
#include "formats/weight_interleave.h"
#include "ops/backend.h"

namespace sparrow {
namespace {

// The file's pages of a rearranged matrix are not read again: hand them back to the page cache rather than
// hold them twice. A hint (MADV_PAGEOUT keeps the contents: clean file pages are re-read if touched).
void release_pages(const void* data, size_t bytes) {
#ifdef MADV_PAGEOUT
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (uintptr_t(data) + page - 1) / page * page, end = (uintptr_t(data) + bytes) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#endif
}

class CpuWeightStore final : public WeightStore {
 public:
  WeightMatrix place(const WeightMatrix& host, bool, WeightUse use) override {
    // Lookup tables stay in the file: a lookup reads a few rows, which would then be gathered from eight.
    if (use == WeightUse::kLookup || host.interleaved || host.n_out % formats::kInterleavedRows != 0 ||
        !cpu::matmul_interleaves(host.type)) {
      return host;
    }
    auto [it, inserted] = interleaved_.try_emplace(host.data);  // a tied output head is the embedding again
    if (inserted) it->second = interleave(host);
    return it->second;
  }
  const float* place_floats(const float* host, size_t n) override {
    return floats_.emplace_back(host, host + n).data();
  }
  size_t device_bytes() const override { return 0; }
  std::string describe() const override {
    std::string text = "CPU: weights read from the file mapping";
    if (interleaved_bytes_ > 0) {
      text += ", " + std::to_string(interleaved_bytes_ >> 20) + " MiB of rows interleaved in memory";
    }
    return text;
  }

 private:
  WeightMatrix interleave(const WeightMatrix& host) {
    const size_t row_bytes = tensor_row_bytes(host.type, host.n_in), bytes = row_bytes * size_t(host.n_out);
    const size_t group_bytes = formats::kInterleavedRows * row_bytes;
    const int64_t n_blocks = host.n_in / tensor_type_info(host.type)->block_elements;
    auto& groups = buffers_.emplace_back(hwy::AllocateAligned<uint8_t>(bytes));
    const auto* rows = static_cast<const uint8_t*>(host.data);
    for (int64_t g = 0; g < host.n_out / formats::kInterleavedRows; ++g) {
      formats::interleave_rows(host.type, rows + size_t(g) * group_bytes, row_bytes, n_blocks, groups.get() + size_t(g) * group_bytes);
    }
    release_pages(host.data, bytes);
    interleaved_bytes_ += bytes;
    WeightMatrix placed = host;
    placed.data = groups.get();
    placed.interleaved = true;
    return placed;
  }

  std::deque<std::vector<float>> floats_;  // a deque: placed vectors never move
  std::deque<hwy::AlignedFreeUniquePtr<uint8_t[]>> buffers_;
  std::map<const void*, WeightMatrix> interleaved_;  // by the file data they came from
  size_t interleaved_bytes_ = 0;
};

}  // namespace

std::unique_ptr<WeightStore> make_cpu_weight_store() { return std::make_unique<CpuWeightStore>(); }

}  // namespace sparrow
