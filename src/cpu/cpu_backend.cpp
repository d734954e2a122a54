// The CPU backend: Backend ops on host memory. Matrix products come from cpu/matmul (Highway SIMD, threaded);
// the element-wise ops here are simple loops the compiler vectorizes.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cpu/attention.h"
#include "cpu/kv/cpu_kv_codecs.h"
#include "cpu/matmul.h"
#include "cpu/thread_pool.h"
#include "formats/weight_formats.h"
#include "ops/backend.h"
#include "ops/gelu.h"
#include "util/error.h"

namespace sparrow {
namespace {

// ops/gelu.h's table, as floats over every f16 code.
class GeluTable {
 public:
  GeluTable() : table_(65536) {
    for (uint32_t h = 0; h < 65536; ++h) table_[h] = formats::f16_to_f32(gelu_table_entry(uint16_t(h)));
  }
  float operator()(float x) const {
    return gelu_with_table(x, [this](uint16_t code) { return table_[code]; });
  }

 private:
  std::vector<float> table_;
};

const GeluTable& gelu_tanh() {
  static const GeluTable table;
  return table;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) : pool_(n_threads) {}
  const char* name() const override { return "cpu"; }

  float* alloc(size_t n_floats) override { return static_cast<float*>(alloc_bytes(n_floats * sizeof(float))); }
  // Anonymous mappings: page-aligned, zeroed lazily by the kernel, so a large KV cache costs memory only
  // as it fills.
  void* alloc_bytes(size_t n_bytes) override {
    const size_t size = std::max<size_t>(n_bytes, 1);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error("cpu backend: out of memory allocating " + std::to_string(n_bytes) + " bytes");
    std::lock_guard<std::mutex> lock(sizes_mutex_);
    sizes_[p] = size;
    return p;
  }
  void free_buffer(void* p) override {
    std::lock_guard<std::mutex> lock(sizes_mutex_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    munmap(p, it->second);
    sizes_.erase(it);
  }
  void read(const float* src, float* host_dst, size_t n) override { std::memcpy(host_dst, src, n * sizeof(float)); }
  void write(float* dst, const float* host_src, size_t n) override { std::memcpy(dst, host_src, n * sizeof(float)); }
  void read_bytes(const void* src, void* host_dst, size_t n) override { std::memcpy(host_dst, src, n); }
  void write_bytes(void* dst, const void* host_src, size_t n) override { std::memcpy(dst, host_src, n); }
  size_t memory_capacity() const override { return size_t(sysconf(_SC_PHYS_PAGES)) * size_t(sysconf(_SC_PAGE_SIZE)); }

  void matmul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) override {
    cpu::matmul(pool_, w, x, n_tokens, y);
  }
  void embed(const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float scale, float* out) override {
    cpu::get_rows(w, ids, n_ids, out);
    if (scale != 1.0f) this->scale(out, scale, n_ids * w.n_in);
  }

  void rms_norm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps, float* y) override {
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      double sum = 0;  // ggml accumulates the sum of squares in double too
      for (int64_t i = 0; i < dim; ++i) sum += double(xr[i]) * xr[i];
      const float inv = 1.0f / std::sqrt(float(sum / dim) + eps);
      if (weight) for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
      else for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv;
    }
  }

  void rope(float* x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, int32_t first_position,
            const RopeParams& p) override {
    const int32_t half = p.n_rot / 2;
    const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.n_rot));
    std::vector<float> cos_t(half), sin_t(half);
    for (int64_t t = 0; t < n_tokens; ++t) {
      // Angles built by repeated multiplication, as ggml does, so positions match llama.cpp bit for bit
      // as far as the float math allows.
      float theta = float(first_position + t);
      for (int32_t i = 0; i < half; ++i) {
        const float divisor = p.freq_divisors ? p.freq_divisors[i] : 1.0f;
        const float angle = p.freq_scale * (theta / divisor);
        cos_t[i] = std::cos(angle);
        sin_t[i] = std::sin(angle);
        theta *= theta_scale;
      }
      for (int32_t h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * int64_t(head_dim);
        for (int32_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * cos_t[i] - b * sin_t[i];
          v[i + half] = a * sin_t[i] + b * cos_t[i];
        }
      }
    }
  }

  void gelu_mul(const float* gate, const float* up, int64_t n, float* y) override {
    const GeluTable& gelu = gelu_tanh();
    if (up) for (int64_t i = 0; i < n; ++i) y[i] = gelu(gate[i]) * up[i];
    else for (int64_t i = 0; i < n; ++i) y[i] = gelu(gate[i]);
  }
  void add(float* y, const float* x, int64_t n) override { for (int64_t i = 0; i < n; ++i) y[i] += x[i]; }
  void scale(float* y, float s, int64_t n) override { for (int64_t i = 0; i < n; ++i) y[i] *= s; }
  void softcap(float* y, float cap, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] = cap * std::tanh(y[i] / cap);
  }
  void copy(float* y, const float* x, int64_t n) override { std::memcpy(y, x, n * sizeof(float)); }
  void mul_rows(float* y, const float* x, int64_t n_rows, int64_t row_len, int64_t x_row_stride) override {
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t i = 0; i < row_len; ++i) y[r * row_len + i] *= x[r * x_row_stride + i];
  }
  int32_t sample(const float* logits, int64_t n_vocab, const SamplingParams& params, float u) override {
    return choose_token(logits, int32_t(n_vocab), params, u, candidates_);
  }
  void mean_rows(const float* x, int64_t n_rows, int64_t row_len, float* out) override {
    std::vector<double> sum(size_t(row_len), 0.0);
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t i = 0; i < row_len; ++i) sum[i] += x[r * row_len + i];
    for (int64_t i = 0; i < row_len; ++i) out[i] = float(sum[i] / double(n_rows));
  }

  void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens,
                int32_t first_position) override {
    cpu::kv_store(pool_, kv, k, v, n_tokens, first_position);
  }
  void attention(const AttentionArgs& args) override { cpu::attention(pool_, args); }

  void kv_encode(formats::KvCodec codec, int d, const float* x, int64_t n, uint8_t* blocks) override {
    const formats::KvCodecOps& ops = cpu::kv_codec_ops(codec);
    const size_t block_bytes = formats::kv_codec_info(codec).block_bytes(d);
    pool_.parallel_for(n, [&](int64_t i, int) { ops.encode(x + i * d, d, blocks + i * block_bytes); });
  }
  void kv_decode(formats::KvCodec codec, int d, const uint8_t* blocks, int64_t n, float* x) override {
    const formats::KvCodecOps& ops = cpu::kv_codec_ops(codec);
    const size_t block_bytes = formats::kv_codec_info(codec).block_bytes(d);
    pool_.parallel_for(n, [&](int64_t i, int) { ops.decode(blocks + i * block_bytes, d, x + i * d); });
  }
  void kv_score(formats::KvCodec codec, int d, const float* queries, int64_t n_queries, const uint8_t* blocks,
                int64_t n_blocks, float* scores) override {
    const formats::KvCodecOps& ops = cpu::kv_codec_ops(codec);
    const formats::KvCodecInfo& info = formats::kv_codec_info(codec);
    const size_t block_bytes = info.block_bytes(d);
    pool_.parallel_for(n_queries, [&](int64_t q, int) {
      std::vector<float> prepared(info.query_floats(d));
      ops.prepare_query(queries + q * d, d, prepared.data());
      for (int64_t j = 0; j < n_blocks; ++j)
        scores[q * n_blocks + j] = ops.score(prepared.data(), blocks + j * block_bytes, d);
    });
  }
  void kv_accumulate(formats::KvCodec codec, int d, const float* weights, int64_t n_sequences,
                     const uint8_t* blocks, int64_t n_blocks, float* acc) override {
    const formats::KvCodecOps& ops = cpu::kv_codec_ops(codec);
    const formats::KvCodecInfo& info = formats::kv_codec_info(codec);
    const size_t block_bytes = info.block_bytes(d), acc_floats = info.accumulator_floats(d);
    pool_.parallel_for(n_sequences, [&](int64_t s, int) {
      float* sum = acc + s * acc_floats;
      std::fill_n(sum, acc_floats, 0.0f);
      for (int64_t j = 0; j < n_blocks; ++j) ops.accumulate(weights[s * n_blocks + j], blocks + j * block_bytes, d, sum);
    });
  }
  void kv_finish(formats::KvCodec codec, int d, const float* acc, int64_t n, float* out) override {
    const formats::KvCodecOps& ops = cpu::kv_codec_ops(codec);
    const size_t acc_floats = formats::kv_codec_info(codec).accumulator_floats(d);
    pool_.parallel_for(n, [&](int64_t i, int) { ops.finish(acc + i * acc_floats, d, out + i * d); });
  }

 private:
  cpu::ThreadPool pool_;
  std::vector<TokenCandidate> candidates_;  // sample()'s scratch
  std::mutex sizes_mutex_;
  std::unordered_map<void*, size_t> sizes_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

}  // namespace sparrow
