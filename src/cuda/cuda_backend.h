#pragma once
// The CUDA backend: Backend (src/ops/backend.h) on one device, all work on one non-default stream, activations
// and the KV cache in device memory; and the weight store that places a model's weights on that device once,
// for every context of the model. See docs/cuda.md.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cuda/device_info.h"
#include "cuda/device_scratch.h"
#include "cuda/elementwise.h"
#include "cuda/sampling.h"
#include "ops/backend.h"

namespace sparrow {

// Throws sparrow::Error (one line, why) when device `device_index` cannot be used.
std::unique_ptr<Backend> make_cuda_backend(int device_index);
std::unique_ptr<WeightStore> make_cuda_weight_store(int device_index);

namespace cuda {
class MatmulContext;
class AttentionContext;
class PassRecorder;
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  const char* name() const override { return "cuda"; }

  // A recorded pass is captured into a CUDA graph once and launched again for every later pass that describes
  // itself the same way (cuda/pass_recorder.h): token ids and positions reach the kernels through device memory,
  // so a decode step costs one small kernel and one graph launch, with no capture and no graph update.
  void begin_pass(bool record) override;
  bool end_pass() override;
  void cancel_pass() override;
  const cuda::DeviceInfo& device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // Device memory (cudaMalloc, never managed), zeroed in stream order.
  float* alloc(size_t n_floats) override;
  void* alloc_bytes(size_t n_bytes) override;
  void free_buffer(void* p) override;
  // Device -> host; waits for the stream.
  void read(const float* src, float* host_dst, size_t n) override;
  // Host -> device, in stream order; host_src may be reused when it returns.
  void write(float* dst, const float* host_src, size_t n) override;
  void read_bytes(const void* src, void* host_dst, size_t n) override;
  void write_bytes(void* dst, const void* host_src, size_t n) override;
  size_t memory_capacity() const override { return device_.total_memory; }
  // out[i] = mean over r < n_rows of x[r * row_len + i], i < row_len.
  void mean_rows(const float* x, int64_t n_rows, int64_t row_len, float* out) override;
  // One token id from n_vocab logits in device memory, chosen as the CPU sampler chooses for the same u.
  int32_t sample(const float* logits, int64_t n_vocab, const SamplingParams& params, float u) override;
  void synchronize() override;

  void matmul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) override;
  // The input converted once for all targets; targets of one block type and input length in one GEMV launch.
  void matmuls(const float* x, int64_t n_tokens, std::span<const MatmulTarget> targets) override;
  void gated_matmul(const float* x, int64_t n_tokens, const GatedProduct& p, float* y) override;
  void matmul_residual(const WeightMatrix& w, const float* in, int64_t n_tokens, float* r,
                       const ResidualStep& step) override;
  // ids are host memory; they are checked against the vocabulary and copied to the device.
  void embed(const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float scale, float* out) override;
  void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) override;
  void add_rms_norm(float* x, float* r, const float* r_weight, int64_t n_rows, int64_t dim, float eps,
                    const float* next_weight, float* next, float x_scale) override;
  void rope(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t first_position,
            const RopeParams& params) override;
  void rms_norm_rope(std::span<const HeadTensor> tensors, float eps, int64_t n_tokens, int32_t head_dim,
                     int32_t first_position, const RopeParams& params) override;
  void gelu_mul(const float* gate, const float* up, int64_t n, float* y) override;
  void add(float* y, const float* x, int64_t n) override;
  void scale(float* y, float s, int64_t n) override;
  void softcap(float* y, float cap, int64_t n) override;
  void copy(float* y, const float* x, int64_t n) override;
  void mul_rows(float* y, const float* x, int64_t n_rows, int64_t row_len, int64_t x_row_stride) override;
  void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens,
                int32_t first_position) override;
  void attention(const AttentionArgs& args) override;

  void kv_encode(formats::KvCodec codec, int d, const float* x, int64_t n, uint8_t* blocks) override;
  void kv_decode(formats::KvCodec codec, int d, const uint8_t* blocks, int64_t n, float* x) override;
  void kv_score(formats::KvCodec codec, int d, const float* queries, int64_t n_queries, const uint8_t* blocks,
                int64_t n_blocks, float* scores) override;
  void kv_accumulate(formats::KvCodec codec, int d, const float* weights, int64_t n_sequences,
                     const uint8_t* blocks, int64_t n_blocks, float* acc) override;
  void kv_finish(formats::KvCodec codec, int d, const float* acc, int64_t n, float* out) override;

 private:
  // The ops, as they describe themselves to the pass recorder.
  enum class Op : uint8_t {
    Matmul, Matmuls, GatedMatmul, MatmulResidual, Embed, RmsNorm, AddRmsNorm, Rope, RmsNormRope, GeluMul, Add,
    Scale, Softcap, Copy, MulRows, MeanRows, KvStore, Attention
  };

  cuda::LaunchTarget target() const { return {stream_, device_.multiprocessors}; }
  // Describes an op (its code and fields) to the recorder; true when it is to launch its kernels now.
  template <class... Fields>
  bool record(Op op, const Fields&... fields);
  void describe(const WeightMatrix& w);
  void describe(const KvLayerView& kv);
  static void refuse_protected(const KvLayerView& kv);
  void describe(const RopeParams& p);
  // Before what a recording must not hold (host transfers, allocations, waits): PassRecorder::interrupt.
  void run_recording();

  cuda::DeviceInfo device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::MatmulContext> matmul_;
  std::unique_ptr<cuda::AttentionContext> attention_;
  std::unique_ptr<cuda::DeviceSampler> sampler_;
  uint16_t* gelu_table_ = nullptr;
  std::unique_ptr<cuda::DeviceScratch> ids_;  // embed's token ids on the device, in a direct pass
  std::unique_ptr<cuda::PassRecorder> recorder_;
  std::mutex buffers_mutex_;
  std::unordered_map<void*, size_t> buffers_;  // live allocations and their sizes in bytes
};

}  // namespace sparrow
