#include "cuda/device_info.h"

#include <gtest/gtest.h>

#include "gpu_test_util.h"

namespace {

TEST(CudaDevice, ReportsNameAndMemory) {
  SPARROW_REQUIRE_GPU();
  const sparrow::cuda::DeviceInfo info = sparrow::cuda::device_info(0);
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.total_memory, size_t(1) << 30);
  EXPECT_LE(info.free_memory, info.total_memory);
  EXPECT_GE(info.sm_major, 8);
}

TEST(CudaDevice, MissingDeviceIndexIsAnError) {
  // Holds with or without a GPU: no machine has 4096 of them.
  EXPECT_FALSE(sparrow::cuda::unavailable_reason(4096).empty());
}

}  // namespace
