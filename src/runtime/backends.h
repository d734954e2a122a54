#pragma once
// The backends a model can run on, chosen by name ("cpu", "cuda"): the one place that lists them.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ops/backend.h"

namespace sparrow {

enum class Device { Cpu, Cuda };

std::optional<Device> parse_device(std::string_view name);
// Every device's name, in order: "cpu", "cuda".
std::vector<std::string> device_names();
const char* device_name(Device device);
// "" when this build and machine can run on the device; otherwise one line saying why.
std::string device_unavailable_reason(Device device);
// Both throw sparrow::Error with that reason when the device cannot be used.
std::unique_ptr<WeightStore> make_weight_store(Device device);
std::unique_ptr<Backend> make_backend(Device device, int n_threads);

}  // namespace sparrow
