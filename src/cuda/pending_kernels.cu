// Placeholders for the matrix-product and attention kernels, which are written on other branches; this file
// lets the CUDA backend build and link on its own and is deleted when those kernels are merged. The contexts
// only keep their stream, so that a backend can be made and its element-wise ops tested; every kernel entry
// point throws.
#include <string>

#include "cuda/attention.h"
#include "cuda/matmul.h"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

[[noreturn]] void pending(const char* what) {
  throw Error(std::string("CUDA backend: ") + what + " is not in this build yet (its kernels are merged separately)");
}

}  // namespace

MatmulContext::MatmulContext(cudaStream_t stream) : stream_(stream) {}
AttentionContext::AttentionContext(cudaStream_t stream) : stream_(stream) {}

void matmul(MatmulContext&, const WeightMatrix&, const float*, int64_t, float*) { pending("matmul"); }
void get_rows(const WeightMatrix&, const int32_t*, int64_t, float*, cudaStream_t) { pending("get_rows"); }
void kv_store(const KvLayerView&, const float*, const float*, int64_t, int32_t, cudaStream_t) { pending("kv_store"); }
void attention(AttentionContext&, const AttentionArgs&) { pending("attention"); }

}  // namespace sparrow::cuda
