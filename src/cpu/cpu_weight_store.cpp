// The CPU's weight store: matrices stay in the GGUF file mapping (zero-copy), vectors are kept in host memory.
#include <deque>
#include <vector>

#include "ops/backend.h"

namespace sparrow {
namespace {

class CpuWeightStore final : public WeightStore {
 public:
  WeightMatrix place(const WeightMatrix& host, bool) override { return host; }
  const float* place_floats(const float* host, size_t n) override {
    return floats_.emplace_back(host, host + n).data();
  }
  size_t device_bytes() const override { return 0; }
  std::string describe() const override { return "CPU: weights read from the file mapping"; }

 private:
  std::deque<std::vector<float>> floats_;  // a deque: placed vectors never move
};

}  // namespace

std::unique_ptr<WeightStore> make_cpu_weight_store() { return std::make_unique<CpuWeightStore>(); }

}  // namespace sparrow
