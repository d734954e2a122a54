#pragma once
// GPU tests skip, with the reason printed, when this machine has no usable CUDA device.
#include <gtest/gtest.h>

#include "cuda/device_info.h"

#define SPARROW_REQUIRE_GPU()                                                        \
  do {                                                                               \
    const std::string sparrow_gpu_reason_ = ::sparrow::cuda::unavailable_reason(0);  \
    if (!sparrow_gpu_reason_.empty()) GTEST_SKIP() << sparrow_gpu_reason_;           \
  } while (0)
