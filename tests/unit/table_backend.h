#pragma once
// A test double of sparrow::Backend for the verification tests: its KV codec ops come from a KvCodecOps table
// (the CPU's, or a deliberately broken one) and its attention from a given kernel; memory is host memory. The
// model's ops are not part of it and throw. `sparrow verify` must catch every fault such a table injects.
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "formats/kv/kv_codec.h"
#include "ops/backend.h"
#include "util/error.h"

namespace sparrow::testing {

class TableBackend final : public Backend {
 public:
  using OpsLookup = std::function<const formats::KvCodecOps*(formats::KvCodec)>;
  using AttentionKernel = std::function<void(const AttentionArgs&)>;
  TableBackend(std::string name, OpsLookup ops_for, AttentionKernel attention = {})
      : name_(std::move(name)), ops_for_(std::move(ops_for)), attention_(std::move(attention)) {}

  const char* name() const override { return name_.c_str(); }
  float* alloc(size_t n_floats) override { return static_cast<float*>(alloc_bytes(n_floats * sizeof(float))); }
  void* alloc_bytes(size_t n_bytes) override { return std::calloc(n_bytes ? n_bytes : 1, 1); }
  void free_buffer(void* p) override { std::free(p); }
  void read(const float* src, float* dst, size_t n) override { std::memcpy(dst, src, n * sizeof(float)); }
  void write(float* dst, const float* src, size_t n) override { std::memcpy(dst, src, n * sizeof(float)); }
  void read_bytes(const void* src, void* dst, size_t n) override { std::memcpy(dst, src, n); }
  void write_bytes(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  size_t memory_capacity() const override { return size_t(1) << 40; }

  void matmul(const WeightMatrix&, const float*, int64_t, float*) override { not_here("matmul"); }
  void embed(const WeightMatrix&, const int32_t*, int64_t, float, float*) override { not_here("embed"); }
  void rms_norm(const float*, const float*, int64_t, int64_t, float, float*) override { not_here("rms_norm"); }
  void rope(float*, int64_t, int32_t, int32_t, int32_t, const RopeParams&) override { not_here("rope"); }
  void gelu_mul(const float*, const float*, int64_t, float*) override { not_here("gelu_mul"); }
  void add(float*, const float*, int64_t) override { not_here("add"); }
  void scale(float*, float, int64_t) override { not_here("scale"); }
  void softcap(float*, float, int64_t) override { not_here("softcap"); }
  void copy(float*, const float*, int64_t) override { not_here("copy"); }
  void mul_rows(float*, const float*, int64_t, int64_t, int64_t) override { not_here("mul_rows"); }
  void mean_rows(const float*, int64_t, int64_t, float*) override { not_here("mean_rows"); }
  int32_t sample(const float*, int64_t, const SamplingParams&, float) override { not_here("sample"); }
  void kv_store(const KvLayerView&, const float*, const float*, int64_t, int32_t) override { not_here("kv_store"); }

  void attention(const AttentionArgs& args) override {
    if (!attention_) throw Error("backend " + name_ + " has no attention kernel");
    attention_(args);
  }
  void kv_encode(formats::KvCodec codec, int d, const float* x, int64_t n, uint8_t* blocks) override {
    const size_t bytes = formats::kv_codec_info(codec).block_bytes(d);
    for (int64_t i = 0; i < n; ++i) ops(codec).encode(x + i * d, d, blocks + i * bytes);
  }
  void kv_decode(formats::KvCodec codec, int d, const uint8_t* blocks, int64_t n, float* x) override {
    const size_t bytes = formats::kv_codec_info(codec).block_bytes(d);
    for (int64_t i = 0; i < n; ++i) ops(codec).decode(blocks + i * bytes, d, x + i * d);
  }
  void kv_score(formats::KvCodec codec, int d, const float* queries, int64_t n_queries, const uint8_t* blocks,
                int64_t n_blocks, float* scores) override {
    const formats::KvCodecInfo& info = formats::kv_codec_info(codec);
    std::vector<float> prepared(info.query_floats(d));
    for (int64_t q = 0; q < n_queries; ++q) {
      ops(codec).prepare_query(queries + q * d, d, prepared.data());
      for (int64_t j = 0; j < n_blocks; ++j)
        scores[q * n_blocks + j] = ops(codec).score(prepared.data(), blocks + j * info.block_bytes(d), d);
    }
  }
  void kv_accumulate(formats::KvCodec codec, int d, const float* weights, int64_t n_sequences,
                     const uint8_t* blocks, int64_t n_blocks, float* acc) override {
    const formats::KvCodecInfo& info = formats::kv_codec_info(codec);
    for (int64_t s = 0; s < n_sequences; ++s) {
      float* sum = acc + s * info.accumulator_floats(d);
      std::fill_n(sum, info.accumulator_floats(d), 0.0f);
      for (int64_t j = 0; j < n_blocks; ++j)
        ops(codec).accumulate(weights[s * n_blocks + j], blocks + j * info.block_bytes(d), d, sum);
    }
  }
  void kv_finish(formats::KvCodec codec, int d, const float* acc, int64_t n, float* out) override {
    const size_t acc_floats = formats::kv_codec_info(codec).accumulator_floats(d);
    for (int64_t i = 0; i < n; ++i) ops(codec).finish(acc + i * acc_floats, d, out + i * d);
  }

 private:
  const formats::KvCodecOps& ops(formats::KvCodec codec) const {
    const formats::KvCodecOps* o = ops_for_(codec);
    if (o == nullptr || !o->encode || !o->decode || !o->prepare_query || !o->score || !o->accumulate || !o->finish)
      throw Error("backend " + name_ + " has no complete ops for " + std::string(formats::kv_codec_info(codec).name));
    return *o;
  }
  [[noreturn]] void not_here(const char* op) const { throw Error("backend " + name_ + " has no " + op); }

  std::string name_;
  OpsLookup ops_for_;
  AttentionKernel attention_;
};

}  // namespace sparrow::testing
