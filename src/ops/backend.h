#pragma once
// The op interface the model is written against, once, for every backend (CPU now, CUDA next).
// Activations are float buffers the backend allocated (host memory on the CPU, device memory on CUDA), laid
// out row-major with the token index slowest: [n_tokens][...]. The model never reads them except through
// Backend::read. Weights are views of GGUF tensors the backend may have uploaded.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "formats/kv/kv_codec.h"
#include "formats/weight_matrix.h"
#include "gguf/tensor_types.h"
#include "ops/sampling.h"

namespace sparrow {

// Rotary position embedding, NEOX layout: dimension i pairs with i + n_rot/2.
// theta_i = freq_scale * position * freq_base^(-2i/n_rot) / freq_divisors[i] (divisors optional).
struct RopeParams {
  int32_t n_rot = 0;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  const float* freq_divisors = nullptr;  // n_rot/2 values (Gemma 4 proportional RoPE), or null
};

// One layer's slice of the KV cache: K and V each stored with their own codec (formats/kv/), one encoded
// block per (KV head, slot). Position p lives in slot p % capacity. Layout, head-major so that consecutive
// positions of one head are consecutive blocks: block (h, slot) at base + (h * capacity + slot) * block_bytes.
struct KvLayerView {
  formats::KvCodec k_codec = formats::KvCodec::F16;
  formats::KvCodec v_codec = formats::KvCodec::F16;
  void* k = nullptr;
  void* v = nullptr;
  int64_t capacity = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  // Key centering (null: off): keys are stored minus this vector ([n_kv_heads][head_dim] floats), which shifts
  // every score of a query by the same constant and so leaves the softmax unchanged, while the codec quantizes a
  // much smaller vector. The KV cache (kv/) sets it at the start of a sequence; kv_store only subtracts it.
  float* k_center = nullptr;

  // Protected positions (off while protected_k is null): the first `sinks` positions and, for each query, the
  // `window` positions up to and including its own are attended in protected_codec (f16 or q8_0), stored beside
  // the blocks above, and every other key in k_codec / v_codec. On this model a low-bit cache loses most of its
  // error that way (docs/kv-quality.md): the sink and the recent keys take most of the attention. kv_store writes
  // every position into both; keys are centered in both, so that every score of a query shifts by one constant.
  // Slots: position p < sinks in slot p, and every position in slot sinks + p % window_capacity, a ring of at
  // least window + the longest batch, so that a batch's own positions and the window before it are all held.
  int32_t sinks = 0;
  int32_t window = 0;
  formats::KvCodec protected_codec = formats::KvCodec::F16;
  void* protected_k = nullptr;  // [n_kv_heads][sinks + window_capacity] blocks
  void* protected_v = nullptr;
  int64_t window_capacity = 0;

  bool protects() const { return protected_k != nullptr; }
  int64_t protected_slots() const { return sinks + window_capacity; }
  // The window's slot of position p (a sink's own slot is p).
  int64_t window_slot(int64_t p) const { return sinks + p % window_capacity; }
};

struct AttentionArgs {
  const float* q = nullptr;  // [n_tokens][n_heads][head_dim], RoPE applied
  float* out = nullptr;      // [n_tokens][n_heads][head_dim]
  int64_t n_tokens = 0;
  int32_t n_heads = 0;
  int32_t first_position = 0;   // query t is at position first_position + t; keys 0..position are visible
  int32_t sliding_window = 0;   // > 0: a key at p0 is visible from p1 only if p1 - p0 < sliding_window
  float scale = 1.0f;           // applied to q.k before the softmax
  KvLayerView kv;
};

// One product of a group that shares its input (Backend::matmuls): y = w x.
struct MatmulTarget {
  WeightMatrix w;
  float* y = nullptr;
};

// A gated product (Backend::gated_matmul): y = gelu_tanh(gate x) * m, where m is up x (Gemma's feed-forward; up
// set, up_y where the product may be put) or the rows m[t][o] = mul[t * mul_stride + o] (the per-layer embedding's
// gate; up null).
struct GatedProduct {
  WeightMatrix gate;
  const WeightMatrix* up = nullptr;
  float* up_y = nullptr;  // [n_tokens][up->n_out] scratch; what it holds afterwards is unspecified
  const float* mul = nullptr;
  int64_t mul_stride = 0;
};

// Attention heads for Backend::rms_norm_rope: x [n_tokens][n_heads][head_dim], each head normalized (times weight,
// which may be null), then rotated by RoPE when rotate.
struct HeadTensor {
  float* x = nullptr;
  const float* weight = nullptr;
  int32_t n_heads = 0;
  bool rotate = true;
};

// The residual step after a block, on the block's output r (Backend::add_rms_norm's arguments but r and the
// shape): x += rms_norm(r) * r_weight, times x_scale; then next = rms_norm(x) * next_weight when next is set.
struct ResidualStep {
  float* x = nullptr;  // the residual stream h
  const float* r_weight = nullptr;
  float eps = 0.0f;
  const float* next_weight = nullptr;
  float* next = nullptr;  // the following block's input, or null
  float x_scale = 1.0f;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // One forward pass: the ops between begin_pass and end_pass. With record, the backend may record them rather
  // than run each as it comes, and run the recording at end_pass: on a GPU one CUDA graph launch replaces the
  // pass's hundreds of kernel launches. A read, write or allocation in between first runs what was recorded.
  // end_pass returns false when the recording failed and none of it ran; the caller then runs the pass again
  // without recording (a forward pass may be repeated: it rewrites the same cache slots with the same values).
  // cancel_pass drops an unfinished recording after an error. Backends that do not record ignore all three.
  virtual void begin_pass(bool record) { (void)record; }
  virtual bool end_pass() { return true; }
  virtual void cancel_pass() {}
  // Waits until every op issued so far has finished. Ops may return once their work is queued on a device;
  // only a read (and sample) waits for it. What timing needs; a no-op where ops run as they are called.
  virtual void synchronize() {}

  // Buffers. alloc returns zeroed memory owned by the backend until free_buffer.
  virtual float* alloc(size_t n_floats) = 0;
  virtual void* alloc_bytes(size_t n_bytes) = 0;
  virtual void free_buffer(void* p) = 0;
  virtual void read(const float* src, float* host_dst, size_t n) = 0;
  virtual void write(float* dst, const float* host_src, size_t n) = 0;
  virtual void read_bytes(const void* src, void* host_dst, size_t n) = 0;
  virtual void write_bytes(void* dst, const void* host_src, size_t n) = 0;
  // Bytes of the memory alloc draws from (host RAM, device memory): larger requests are refused up front.
  virtual size_t memory_capacity() const = 0;

  // y[t][o] = sum_i w[o][i] * x[t][i]
  virtual void matmul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) = 0;
  // y_i = w_i x for every target: the products of one input (q, k and v; gate and up), which a backend may
  // convert once and run as one kernel. Each y_i equals what matmul(w_i, x, n_tokens, y_i) writes.
  virtual void matmuls(const float* x, int64_t n_tokens, std::span<const MatmulTarget> targets) {
    for (const MatmulTarget& t : targets) matmul(t.w, x, n_tokens, t.y);
  }
  // y = gelu_tanh(p.gate x) * m as GatedProduct says, y: [n_tokens][p.gate.n_out]. Equals the ops one by one
  // (matmuls then gelu_mul; matmul, gelu_mul then mul_rows), which is the default; a backend may fuse them (the
  // CUDA decode GEMV multiplies in its epilogue, with the bits of the ops one by one).
  virtual void gated_matmul(const float* x, int64_t n_tokens, const GatedProduct& p, float* y) {
    const int64_t n = n_tokens * p.gate.n_out;
    if (p.up) {
      const MatmulTarget both[] = {{p.gate, y}, {*p.up, p.up_y}};
      matmuls(x, n_tokens, both);
      gelu_mul(y, p.up_y, n, y);
    } else {
      matmul(p.gate, x, n_tokens, y);
      gelu_mul(y, nullptr, n, y);
      mul_rows(y, p.mul, n_tokens, p.gate.n_out, p.mul_stride);
    }
  }
  // out[r] = scale * w[ids[r]] (embedding lookup)
  virtual void embed(const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float scale, float* out) = 0;
  // y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight (weight may be null: no weight); y may equal x.
  virtual void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) = 0;
  // The residual step after a block: x += rms_norm(r) * r_weight, r overwritten with rms_norm(r) * r_weight;
  // x then scaled by x_scale (Gemma 4's layer output scale); then, when next is set, next = rms_norm(x) *
  // next_weight (the following block's input). x, r, next: [n_rows][dim]. Each result equals what the ops one
  // by one (rms_norm, add, scale unless x_scale is 1, rms_norm) write.
  virtual void add_rms_norm(float* x, float* r, const float* r_weight, int64_t n_rows, int64_t dim, float eps,
                            const float* next_weight = nullptr, float* next = nullptr, float x_scale = 1.0f) {
    rms_norm(r, r_weight, n_rows, dim, eps, r);
    add(x, r, n_rows * dim);
    if (x_scale != 1.0f) scale(x, x_scale, n_rows * dim);
    if (next) rms_norm(x, next_weight, n_rows, dim, eps, next);
  }
  // A block's output projection and the residual step on it: r = w in ([n_tokens][w.n_out]), then
  // add_rms_norm(step.x, r, step.r_weight, n_tokens, w.n_out, ...). Equals matmul then add_rms_norm, which is the
  // default; a backend may fuse them (the CUDA decode GEMV's last CTA runs the step, with the ops' bits).
  virtual void matmul_residual(const WeightMatrix& w, const float* in, int64_t n_tokens, float* r,
                               const ResidualStep& step) {
    matmul(w, in, n_tokens, r);
    add_rms_norm(step.x, r, step.r_weight, n_tokens, w.n_out, step.eps, step.next_weight, step.next, step.x_scale);
  }
  // In place on x[n_tokens][n_heads][head_dim]; token t is at position first_position + t.
  virtual void rope(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t first_position,
                    const RopeParams& params) = 0;
  // x = RoPE(rms_norm(x) * weight) for every tensor of heads of one head_dim, tokens and positions (a run's
  // query, key and value heads: Gemma's Q and K norms, Gemma 4's V norm without rotation), each head normalized
  // on its own. Equals, tensor by tensor, rms_norm over n_tokens * n_heads rows of head_dim, then rope where the
  // tensor rotates; a backend may do them all in one launch.
  virtual void rms_norm_rope(std::span<const HeadTensor> tensors, float eps, int64_t n_tokens, int32_t head_dim,
                             int32_t first_position, const RopeParams& params) {
    for (const HeadTensor& t : tensors) {
      rms_norm(t.x, t.weight, n_tokens * t.n_heads, head_dim, eps, t.x);
      if (t.rotate) rope(t.x, n_tokens, t.n_heads, head_dim, first_position, params);
    }
  }
  // y = gelu_tanh(gate) * up (up may be null: y = gelu_tanh(gate)); y may alias gate.
  virtual void gelu_mul(const float* gate, const float* up, int64_t n, float* y) = 0;
  virtual void add(float* y, const float* x, int64_t n) = 0;       // y += x
  virtual void scale(float* y, float s, int64_t n) = 0;            // y *= s
  virtual void softcap(float* y, float cap, int64_t n) = 0;        // y = cap * tanh(y / cap)
  virtual void copy(float* y, const float* x, int64_t n) = 0;      // y = x
  // y[r][i] *= x[r * x_row_stride + i] for r < n_rows, i < row_len (y rows contiguous).
  virtual void mul_rows(float* y, const float* x, int64_t n_rows, int64_t row_len, int64_t x_row_stride) = 0;
  // out[i] = mean over r < n_rows of x[r * row_len + i], for i < row_len (accumulated in double on the CPU).
  virtual void mean_rows(const float* x, int64_t n_rows, int64_t row_len, float* out) = 0;
  // The token choose_token (ops/sampling.h) picks from n_vocab logits in backend memory for draw u: on a GPU
  // only the id comes back to the host.
  virtual int32_t sample(const float* logits, int64_t n_vocab, const SamplingParams& params, float u) = 0;

  // Encodes K and V rows ([n_tokens][n_kv_heads][head_dim] floats) for positions first_position.. into kv
  // (minus kv.k_center for keys, when set).
  virtual void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens,
                        int32_t first_position) = 0;
  // Causal (optionally sliding-window) softmax attention of q over the keys and values in args.kv, read
  // directly in their codecs (fused: no score matrix, no decoded copy of the cache), grouped-query: query
  // head h reads KV head h / (n_heads / n_kv_heads).
  virtual void attention(const AttentionArgs& args) = 0;

  // The KV codec ops one by one, batched over vectors, on backend memory: what `sparrow verify` checks against
  // the references (formats/kv/kv_codec.h defines each op); kv_store and attention use the same kernels.
  // blocks[n][block_bytes(d)] = encode(x[n][d])
  virtual void kv_encode(formats::KvCodec codec, int d, const float* x, int64_t n, uint8_t* blocks) = 0;
  // x[n][d] = decode(blocks[n])
  virtual void kv_decode(formats::KvCodec codec, int d, const uint8_t* blocks, int64_t n, float* x) = 0;
  // scores[i][j] = score(prepare_query(queries[i]), blocks[j])
  virtual void kv_score(formats::KvCodec codec, int d, const float* queries, int64_t n_queries,
                        const uint8_t* blocks, int64_t n_blocks, float* scores) = 0;
  // acc[s][accumulator_floats(d)] = sum over j, in order, of accumulate(weights[s][j], blocks[j]) from zero
  virtual void kv_accumulate(formats::KvCodec codec, int d, const float* weights, int64_t n_sequences,
                             const uint8_t* blocks, int64_t n_blocks, float* acc) = 0;
  // out[n][d] = finish(acc[n])
  virtual void kv_finish(formats::KvCodec codec, int d, const float* acc, int64_t n, float* out) = 0;
};

// What the model does with a weight matrix: multiplies by it (matmul), gathers rows of it (embed: token and
// per-layer embeddings), or both (an embedding that is also the output head). A store may lay a matrix out
// for the products (the CPU interleaves Q4_K rows) where rows are not mostly gathered.
enum class WeightUse { kMatmul, kLookup, kMatmulAndLookup };

// Where a model's weights live, placed once at load and shared by every Backend (context) of the model.
class WeightStore {
 public:
  virtual ~WeightStore() = default;
  // The backend-side view of a weight matrix held in host memory (the file mapping). on_device: in the device's
  // own memory, uploaded once; otherwise read where it is (the CPU; a GPU over the bus).
  virtual WeightMatrix place(const WeightMatrix& host, bool on_device, WeightUse use) = 0;
  // A copy of n host floats (norm vectors, RoPE divisors) in backend memory.
  virtual const float* place_floats(const float* host, size_t n) = 0;
  virtual size_t device_bytes() const = 0;   // bytes placed in device memory (0 on the CPU)
  virtual std::string describe() const = 0;  // the device, its memory, and what was placed on it
};

// The CPU backend (SIMD through Highway, n_threads workers; <= 0: all cores) and its weight store.
std::unique_ptr<Backend> make_cpu_backend(int n_threads);
std::unique_ptr<WeightStore> make_cpu_weight_store();

}  // namespace sparrow
