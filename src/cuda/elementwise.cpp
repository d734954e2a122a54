// Host side of the element-wise kernels: the GELU table they read.
#include "cuda/elementwise.h"


namespace sparrow::cuda {
std::vector<uint16_t> gelu_f16_table() {
  std::vector<uint16_t> table(kGeluTableEntries);
  for (uint32_t magnitude = 0; magnitude <= kGeluLastCode; ++magnitude) {
    table[magnitude] = gelu_table_entry(uint16_t(magnitude));
    table[kGeluLastCode + 1 + magnitude] = gelu_table_entry(uint16_t(0x8000 | magnitude));
  }
  return table;
}

}  // namespace sparrow::cuda
