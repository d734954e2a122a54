// The CUDA backend: buffers, transfers and op dispatch on one stream. Kernels live in elementwise.cu and
// sampling.cu; matrix products in matmul.h, KV writes and attention in attention.h.
#include "cuda/cuda_backend.h"

#include <string>
#include <vector>

#include "cuda/attention.h"
#include "cuda/cuda_check.h"
#include "cuda/kv/kv_ops.h"
#include "cuda/matmul.h"
#include "cuda/matmul_int8.h"
#include "cuda/pass_recorder.h"
#include "util/error.h"

namespace sparrow {

CudaBackend::CudaBackend(int device_index) : device_(cuda::device_info(device_index)) {
  SPARROW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  cuda::bind_kv_tables();  // now, not at a codec's first launch, which may fall inside a recorded pass
  matmul_ = std::make_unique<cuda::MatmulContext>(stream_);
  attention_ = std::make_unique<cuda::AttentionContext>(stream_);
  sampler_ = std::make_unique<cuda::DeviceSampler>(stream_, device_.multiprocessors);
  ids_ = std::make_unique<cuda::DeviceScratch>(stream_);
  recorder_ = std::make_unique<cuda::PassRecorder>(target());
  const std::vector<uint16_t> table = cuda::gelu_f16_table();
  SPARROW_CUDA_CHECK(cudaMalloc(&gelu_table_, table.size() * sizeof(uint16_t)));
  SPARROW_CUDA_CHECK(cudaMemcpyAsync(gelu_table_, table.data(), table.size() * sizeof(uint16_t),
                                     cudaMemcpyHostToDevice, stream_));
}

// Destructors do not throw: failures while releasing memory are ignored.
CudaBackend::~CudaBackend() {
  recorder_.reset();
  cudaStreamSynchronize(stream_);
  ids_.reset();
  sampler_.reset();
  attention_.reset();
  matmul_.reset();
  for (const auto& [p, bytes] : buffers_) cudaFree(p);
  cudaFree(gelu_table_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::begin_pass(bool record) { recorder_->begin(record); }
bool CudaBackend::end_pass() { return recorder_->end(); }
void CudaBackend::cancel_pass() { recorder_->cancel(); }
void CudaBackend::run_recording() { recorder_->interrupt(); }

template <class... Fields>
bool CudaBackend::record(Op op, const Fields&... fields) {
  recorder_->describe(op, fields...);
  return recorder_->launching();
}

void CudaBackend::describe(const WeightMatrix& w) { recorder_->describe(w.type, w.data, w.n_in, w.n_out); }

void CudaBackend::describe(const KvLayerView& kv) {
  recorder_->describe(kv.k_codec, kv.v_codec, kv.k, kv.v, kv.capacity, kv.n_kv_heads, kv.head_dim, kv.k_center);
}

void CudaBackend::describe(const RopeParams& p) {
  recorder_->describe(p.n_rot, p.freq_base, p.freq_scale, p.freq_divisors);
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
  if (record(Op::MeanRows, x, n_rows, row_len, out)) cuda::mean_rows(target(), x, n_rows, row_len, out);
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
  describe(w);
  if (record(Op::Matmul, x, n_tokens, y)) cuda::matmul(*matmul_, w, x, n_tokens, y);
}

void CudaBackend::matmuls(const float* x, int64_t n_tokens, std::span<const MatmulTarget> targets) {
  for (const MatmulTarget& t : targets) {
    describe(t.w);
    recorder_->describe(t.y);
  }
  if (record(Op::Matmuls, x, n_tokens, targets.size())) cuda::matmul(*matmul_, x, n_tokens, targets);
}

// One launch where the decode GEMV fuses the product (matmul_int8_fuses), else the ops one by one.
void CudaBackend::gated_matmul(const float* x, int64_t n_tokens, const GatedProduct& p, float* y) {
  if (!cuda::matmul_int8_fuses(p, n_tokens)) return Backend::gated_matmul(x, n_tokens, p, y);
  describe(p.gate);
  if (p.up) describe(*p.up);
  recorder_->describe(p.mul, p.mul_stride);
  if (record(Op::GatedMatmul, x, n_tokens, y)) cuda::matmul_int8_gated(*matmul_, gelu_table_, p, x, n_tokens, y);
}

// One launch where the decode GEMV runs the residual step (matmul_int8_fuses_residual), else the ops one by one.
void CudaBackend::matmul_residual(const WeightMatrix& w, const float* in, int64_t n_tokens, float* r,
                                  const ResidualStep& step) {
  if (!cuda::matmul_int8_fuses_residual(w, n_tokens, r, step))
    return Backend::matmul_residual(w, in, n_tokens, r, step);
  describe(w);
  recorder_->describe(step.x, step.r_weight, step.eps, step.next_weight, step.next, step.x_scale);
  if (record(Op::MatmulResidual, in, n_tokens, r)) cuda::matmul_int8_residual(*matmul_, w, in, n_tokens, r, step);
}

void CudaBackend::embed(const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float scale, float* out) {
  if (n_ids <= 0) return;
  for (int64_t r = 0; r < n_ids; ++r)
    if (ids[r] < 0 || ids[r] >= w.n_out)
      throw Error("embed: id " + std::to_string(ids[r]) + " is outside the table's " + std::to_string(w.n_out) +
                  " rows");
  // In a recorded pass the ids are step values, which a graph launched again reads afresh.
  const int32_t* on_device =
      n_ids <= cuda::PassRecorder::kMaxStepValues ? recorder_->values(ids, int(n_ids)) : nullptr;
  describe(w);
  if (!record(Op::Embed, n_ids, scale, out)) return;
  if (on_device == nullptr) {
    int32_t* staged = ids_->get<int32_t>(size_t(n_ids));
    if (n_ids <= cuda::kInlineInts) {
      cuda::write_inline_ints(target(), ids, int(n_ids), staged);
    } else {
      run_recording();  // a copy from pageable host memory cannot be recorded
      SPARROW_CUDA_CHECK(
          cudaMemcpyAsync(staged, ids, size_t(n_ids) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    }
    on_device = staged;
  }
  cuda::get_rows(*matmul_, w, on_device, n_ids, scale, out);
}

void CudaBackend::rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) {
  if (record(Op::RmsNorm, x, weight, n_rows, dim, eps, y)) cuda::rms_norm(target(), x, weight, n_rows, dim, eps, y);
}

void CudaBackend::add_rms_norm(float* x, float* r, const float* r_weight, int64_t n_rows, int64_t dim, float eps,
                               const float* next_weight, float* next, float x_scale) {
  if (record(Op::AddRmsNorm, x, r, r_weight, n_rows, dim, eps, next_weight, next, x_scale))
    cuda::add_rms_norm(target(), x, r, r_weight, n_rows, dim, eps, next_weight, next, x_scale);
}

void CudaBackend::rms_norm_rope(std::span<const HeadTensor> tensors, float eps, int64_t n_tokens, int32_t head_dim,
                                int32_t first_position, const RopeParams& params) {
  const cuda::DevicePosition position(first_position, recorder_->value(first_position));
  describe(params);
  for (const HeadTensor& t : tensors) recorder_->describe(t.x, t.weight, t.n_heads, t.rotate);
  if (record(Op::RmsNormRope, eps, n_tokens, head_dim, tensors.size()))
    cuda::rms_norm_rope(target(), tensors, eps, n_tokens, head_dim, position, params);
}

void CudaBackend::rope(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t first_position,
                       const RopeParams& params) {
  const cuda::DevicePosition position(first_position, recorder_->value(first_position));
  describe(params);
  if (record(Op::Rope, x, n_tokens, n_heads, head_dim)) cuda::rope(target(), x, n_tokens, n_heads, head_dim, position, params);
}

void CudaBackend::gelu_mul(const float* gate, const float* up, int64_t n, float* y) {
  if (record(Op::GeluMul, gate, up, n, y)) cuda::gelu_mul(target(), gelu_table_, gate, up, n, y);
}

void CudaBackend::add(float* y, const float* x, int64_t n) {
  if (record(Op::Add, y, x, n)) cuda::add(target(), y, x, n);
}

void CudaBackend::scale(float* y, float s, int64_t n) {
  if (record(Op::Scale, y, s, n)) cuda::scale(target(), y, s, n);
}

void CudaBackend::softcap(float* y, float cap, int64_t n) {
  if (record(Op::Softcap, y, cap, n)) cuda::softcap(target(), y, cap, n);
}

// cudaMemcpyDefault: x may be a weight mapped from host memory.
void CudaBackend::copy(float* y, const float* x, int64_t n) {
  if (n <= 0 || y == x || !record(Op::Copy, y, x, n)) return;
  SPARROW_CUDA_CHECK(cudaMemcpyAsync(y, x, size_t(n) * sizeof(float), cudaMemcpyDefault, stream_));
}

void CudaBackend::mul_rows(float* y, const float* x, int64_t n_rows, int64_t row_len, int64_t x_row_stride) {
  if (record(Op::MulRows, y, x, n_rows, row_len, x_row_stride))
    cuda::mul_rows(target(), y, x, n_rows, row_len, x_row_stride);
}

// Protected positions (KvLayerView::protects) are CPU-only on this branch until the CUDA kernels read them.
void CudaBackend::refuse_protected(const KvLayerView& kv) {
  if (kv.protects())
    throw Error("the CUDA backend does not yet keep protected KV positions (--kv-sinks, --kv-window); use the CPU");
}

void CudaBackend::kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens,
                           int32_t first_position) {
  refuse_protected(kv);
  const cuda::DevicePosition position(first_position, recorder_->value(first_position));
  describe(kv);
  if (record(Op::KvStore, k, v, n_tokens)) cuda::kv_store(kv, k, v, n_tokens, position, stream_);
}

void CudaBackend::attention(const AttentionArgs& args) {
  refuse_protected(args.kv);
  const int32_t* position = recorder_->value(args.first_position);
  // The plan (the split count and rows per CTA, which follow the context length, and the scratch) is part of what
  // a graph holds.
  const cuda::AttentionLaunch plan = cuda::plan_attention(*attention_, args);
  describe(args.kv);
  recorder_->describe(plan.n_splits, plan.rows_per_cta, plan.prepared, plan.partial_acc, plan.partial_state,
                      plan.split_counters);
  if (record(Op::Attention, args.q, args.out, args.n_tokens, args.n_heads, args.sliding_window, args.scale))
    cuda::attention(*attention_, args, position);
}

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
