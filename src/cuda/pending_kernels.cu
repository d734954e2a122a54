// Placeholders for the attention kernels, which are written on other branches; this file
// lets the CUDA backend build and link on its own and is deleted when those kernels are merged. The contexts
// only keep their stream, so that a backend can be made and its element-wise ops tested; every kernel entry
// point throws.
#include <string>

#include "cuda/attention.h"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

[[noreturn]] void pending(const char* what) {
  throw Error(std::string("CUDA backend: ") + what + " is not in this build yet (its kernels are merged separately)");
}

}  // namespace

AttentionContext::AttentionContext(cudaStream_t stream) : stream_(stream) {}

void kv_store(const KvLayerView&, const float*, const float*, int64_t, int32_t, cudaStream_t) { pending("kv_store"); }
void attention(AttentionContext&, const AttentionArgs&) { pending("attention"); }

}  // namespace sparrow::cuda
