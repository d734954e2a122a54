// The one place that knows which backends `sparrow verify` can check. A new backend (CUDA: a batched
// implementation of verify::Backend over its kernels) replaces its UnavailableBackend line here.
#include "cpu/kv/cpu_kv_codecs.h"
#include "util/error.h"
#include "verify/backend.h"

namespace sparrow::verify {

std::vector<std::string> backend_names() { return {"cpu", "cuda"}; }

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") {
    std::shared_ptr<sparrow::Backend> kernels = make_cpu_backend(0);
    return std::make_unique<OpsTableBackend>(
        "cpu", [](formats::KvCodec codec) { return &cpu::kv_codec_ops(codec); },
        [kernels](const AttentionArgs& args) { kernels->attention(args); });
  }
  if (name == "cuda") {
    return std::make_unique<UnavailableBackend>(
        "cuda", "this build has no CUDA backend (no CUDA KV codec kernels are compiled in)");
  }
  throw Error("verify: unknown backend '" + std::string(name) + "' (expected cpu, cuda or all)");
}

}  // namespace sparrow::verify
