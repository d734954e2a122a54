// The CUDA backend: buffers, transfers and op dispatch on one stream. Kernels live in elementwise.cu and
// sampling.cu; matrix products in matmul.h, KV writes and attention in attention.h.
#include "cuda/cuda_backend.h"

#include <string>
#include <vector>

#include "cuda/attention.h"
#include "cuda/cuda_check.h"
#include "cuda/kv/kv_ops.h"
#include "cuda/matmul.h"
#include "util/error.h"

namespace sparrow {

CudaBackend::CudaBackend(int device_index) : device_(cuda::device_info(device_index)) {
  SPARROW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  matmul_ = std::make_unique<cuda::MatmulContext>(stream_);
  attention_ = std::make_unique<cuda::AttentionContext>(stream_);
  sampler_ = std::make_unique<cuda::DeviceSampler>(stream_, device_.multiprocessors);
  ids_ = std::make_unique<cuda::DeviceScratch>(stream_);
  const std::vector<uint16_t> table = cuda::gelu_f16_table();
  SPARROW_CUDA_CHECK(cudaMalloc(&gelu_table_, table.size() * sizeof(uint16_t)));
  SPARROW_CUDA_CHECK(cudaMemcpyAsync(gelu_table_, table.data(), table.size() * sizeof(uint16_t),
                                     cudaMemcpyHostToDevice, stream_));
}

// Destructors do not throw: failures while releasing memory are ignored.
CudaBackend::~CudaBackend() {
  cancel_pass();
  cudaStreamSynchronize(stream_);
  if (decode_graph_ != nullptr) cudaGraphExecDestroy(decode_graph_);
  ids_.reset();
  sampler_.reset();
  attention_.reset();
  matmul_.reset();
  for (const auto& [p, bytes] : buffers_) cudaFree(p);
  cudaFree(gelu_table_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::begin_pass(bool record) {
  cancel_pass();  // a pass that ended in an error may have left its recording open
  if (!record) return;
  // Relaxed: a scratch buffer may still grow (cudaMalloc) while the pass is being captured.
  SPARROW_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  recording_ = true;
}

bool CudaBackend::end_pass() { return !recording_ || finish_recording(); }

void CudaBackend::cancel_pass() {
  if (!recording_) return;
  recording_ = false;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture leaves its error behind; nothing of it ran
}

bool CudaBackend::finish_recording() {
  recording_ = false;
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream_, &graph) != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return false;
  }
  // The same kernels with new arguments update the executable graph in place; another shape (a flash-decoding
  // split count that changed with the context, say) needs a new one.
  if (decode_graph_ != nullptr) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(decode_graph_, graph, &info) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphExecDestroy(decode_graph_);
      decode_graph_ = nullptr;
    }
  }
  if (decode_graph_ == nullptr && cudaGraphInstantiate(&decode_graph_, graph, 0) != cudaSuccess) {
    cudaGetLastError();
    decode_graph_ = nullptr;
    cudaGraphDestroy(graph);
    return false;
  }
  cudaGraphDestroy(graph);
  SPARROW_CUDA_CHECK(cudaGraphLaunch(decode_graph_, stream_));
  return true;
}

void CudaBackend::run_recording() {
  if (recording_ && !finish_recording())
    throw Error("cuda backend: recording the forward pass as a CUDA graph failed (--graphs off avoids it)");
}

float* CudaBackend::alloc(size_t n_floats) { return static_cast<float*>(alloc_bytes(n_floats * sizeof(float))); }

void* CudaBackend::alloc_bytes(size_t n_bytes) {
  run_recording();
  const size_t size = std::max<size_t>(n_bytes, 1);
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, size);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error("cuda backend: out of device memory allocating " + std::to_string(n_bytes) + " bytes on " +
                device_.name + ": " + cudaGetErrorString(status));
  }
  SPARROW_CUDA_CHECK(cudaMemsetAsync(p, 0, size, stream_));
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  buffers_[p] = size;
  return p;
}

// Waits for the stream first, so no queued kernel still uses the buffer; like the CPU backend, a pointer it did
// not allocate is ignored.
void CudaBackend::free_buffer(void* p) {
  run_recording();
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  auto it = buffers_.find(p);
  if (it == buffers_.end()) return;
  SPARROW_CUDA_CHECK(cudaStreamSynchronize(stream_));
  SPARROW_CUDA_CHECK(cudaFree(p));
  buffers_.erase(it);
}

void CudaBackend::read(const float* src, float* host_dst, size_t n) {
  if (n == 0) return;
  run_recording();
  SPARROW_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  SPARROW_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// A copy from pageable memory returns once the runtime has staged the source, so host_src is free again.
void CudaBackend::write(float* dst, const float* host_src, size_t n) {
  if (n == 0) return;
  run_recording();
  SPARROW_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::read_bytes(const void* src, void* host_dst, size_t n) {
  if (n == 0) return;
  run_recording();
  SPARROW_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, n, cudaMemcpyDeviceToHost, stream_));
  SPARROW_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::write_bytes(void* dst, const void* host_src, size_t n) {
  if (n == 0) return;
  run_recording();
  SPARROW_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, n, cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::mean_rows(const float* x, int64_t n_rows, int64_t row_len, float* out) {
  cuda::mean_rows(target(), x, n_rows, row_len, out);
}

int32_t CudaBackend::sample(const float* logits, int64_t n_vocab, const SamplingParams& params, float u) {
  run_recording();
  return sampler_->sample(logits, n_vocab, params, u);
}

void CudaBackend::synchronize() {
  run_recording();
  SPARROW_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::matmul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) {
  cuda::matmul(*matmul_, w, x, n_tokens, y);
}

void CudaBackend::matmuls(const float* x, int64_t n_tokens, std::span<const MatmulTarget> targets) {
  cuda::matmul(*matmul_, x, n_tokens, targets);
}

void CudaBackend::embed(const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float scale, float* out) {
  if (n_ids <= 0) return;
  for (int64_t r = 0; r < n_ids; ++r)
    if (ids[r] < 0 || ids[r] >= w.n_out)
      throw Error("embed: id " + std::to_string(ids[r]) + " is outside the table's " + std::to_string(w.n_out) +
                  " rows");
  int32_t* on_device = ids_->get<int32_t>(size_t(n_ids));
  if (n_ids <= cuda::kInlineInts) {
    // As kernel arguments: a recorded pass holds them, and its replay takes new ids as an argument update.
    cuda::write_inline_ints(target(), ids, int(n_ids), on_device);
  } else {
    run_recording();  // a copy from pageable host memory cannot be recorded
    SPARROW_CUDA_CHECK(
        cudaMemcpyAsync(on_device, ids, size_t(n_ids) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  }
  cuda::get_rows(*matmul_, w, on_device, n_ids, scale, out);
}

void CudaBackend::rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) {
  cuda::rms_norm(target(), x, weight, n_rows, dim, eps, y);
}

void CudaBackend::add_rms_norm(float* x, float* r, const float* r_weight, int64_t n_rows, int64_t dim, float eps,
                               const float* next_weight, float* next) {
  cuda::add_rms_norm(target(), x, r, r_weight, n_rows, dim, eps, next_weight, next);
}

void CudaBackend::rms_norm_rope(float* x, const float* weight, float eps, int64_t n_tokens, int32_t n_heads,
                                int32_t head_dim, int32_t first_position, const RopeParams& params) {
  cuda::rms_norm_rope(target(), x, weight, eps, n_tokens, n_heads, head_dim, first_position, params);
}

void CudaBackend::rope(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t first_position,
                       const RopeParams& params) {
  cuda::rope(target(), x, n_tokens, n_heads, head_dim, first_position, params);
}

void CudaBackend::gelu_mul(const float* gate, const float* up, int64_t n, float* y) {
  cuda::gelu_mul(target(), gelu_table_, gate, up, n, y);
}

void CudaBackend::add(float* y, const float* x, int64_t n) { cuda::add(target(), y, x, n); }
void CudaBackend::scale(float* y, float s, int64_t n) { cuda::scale(target(), y, s, n); }
void CudaBackend::softcap(float* y, float cap, int64_t n) { cuda::softcap(target(), y, cap, n); }

// cudaMemcpyDefault: x may be a weight mapped from host memory.
void CudaBackend::copy(float* y, const float* x, int64_t n) {
  if (n <= 0 || y == x) return;
  SPARROW_CUDA_CHECK(cudaMemcpyAsync(y, x, size_t(n) * sizeof(float), cudaMemcpyDefault, stream_));
}

void CudaBackend::mul_rows(float* y, const float* x, int64_t n_rows, int64_t row_len, int64_t x_row_stride) {
  cuda::mul_rows(target(), y, x, n_rows, row_len, x_row_stride);
}

void CudaBackend::kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens,
                           int32_t first_position) {
  cuda::kv_store(kv, k, v, n_tokens, first_position, stream_);
}

void CudaBackend::attention(const AttentionArgs& args) { cuda::attention(*attention_, args); }

std::unique_ptr<Backend> make_cuda_backend(int device_index) { return std::make_unique<CudaBackend>(device_index); }

void CudaBackend::kv_encode(formats::KvCodec codec, int d, const float* x, int64_t n, uint8_t* blocks) {
  cuda::kv_encode(codec, d, x, n, blocks, stream_);
}

void CudaBackend::kv_decode(formats::KvCodec codec, int d, const uint8_t* blocks, int64_t n, float* x) {
  cuda::kv_decode(codec, d, blocks, n, x, stream_);
}

void CudaBackend::kv_score(formats::KvCodec codec, int d, const float* queries, int64_t n_queries,
                           const uint8_t* blocks, int64_t n_blocks, float* scores) {
  cuda::kv_score(codec, d, queries, n_queries, blocks, n_blocks, scores, stream_);
}

void CudaBackend::kv_accumulate(formats::KvCodec codec, int d, const float* weights, int64_t n_sequences,
                                const uint8_t* blocks, int64_t n_blocks, float* acc) {
  cuda::kv_accumulate(codec, d, weights, n_sequences, blocks, n_blocks, acc, stream_);
}

void CudaBackend::kv_finish(formats::KvCodec codec, int d, const float* acc, int64_t n, float* out) {
  cuda::kv_finish(codec, d, acc, n, out, stream_);
}

}  // namespace sparrow
