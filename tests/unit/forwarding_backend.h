#pragma once
// A test double of sparrow::Backend that forwards every op to another backend; a test overrides the ops it
// wants to fault, count or watch.
#include <memory>
#include <utility>

#include "ops/backend.h"

namespace sparrow::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  Backend& inner() { return *inner_; }

  const char* name() const override { return "forwarding"; }
  void begin_pass(bool record) override { inner_->begin_pass(record); }
  bool end_pass() override { return inner_->end_pass(); }
  void cancel_pass() override { inner_->cancel_pass(); }
  void synchronize() override { inner_->synchronize(); }
  float* alloc(size_t n) override { return inner_->alloc(n); }
  void* alloc_bytes(size_t n) override { return inner_->alloc_bytes(n); }
  void free_buffer(void* p) override { inner_->free_buffer(p); }
  void read(const float* s, float* d, size_t n) override { inner_->read(s, d, n); }
  void write(float* d, const float* s, size_t n) override { inner_->write(d, s, n); }
  void read_bytes(const void* s, void* d, size_t n) override { inner_->read_bytes(s, d, n); }
  void write_bytes(void* d, const void* s, size_t n) override { inner_->write_bytes(d, s, n); }
  size_t memory_capacity() const override { return inner_->memory_capacity(); }
  void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) override { inner_->matmul(w, x, n, y); }
  void matmuls(const float* x, int64_t n, std::span<const MatmulTarget> t) override { inner_->matmuls(x, n, t); }
  void add_rms_norm(float* x, float* r, const float* rw, int64_t rows, int64_t dim, float eps, const float* nw,
                    float* next, float x_scale) override {
    inner_->add_rms_norm(x, r, rw, rows, dim, eps, nw, next, x_scale);
  }
  void rms_norm_rope(std::span<const HeadTensor> t, float eps, int64_t n, int32_t d, int32_t p,
                     const RopeParams& r) override {
    inner_->rms_norm_rope(t, eps, n, d, p, r);
  }
  void embed(const WeightMatrix& w, const int32_t* ids, int64_t n, float s, float* out) override {
    inner_->embed(w, ids, n, s, out);
  }
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y) override {
    inner_->rms_norm(x, w, rows, dim, eps, y);
  }
  void rope(float* x, int64_t n, int32_t h, int32_t d, int32_t p, const RopeParams& r) override {
    inner_->rope(x, n, h, d, p, r);
  }
  void gelu_mul(const float* g, const float* u, int64_t n, float* y) override { inner_->gelu_mul(g, u, n, y); }
  void add(float* y, const float* x, int64_t n) override { inner_->add(y, x, n); }
  void scale(float* y, float s, int64_t n) override { inner_->scale(y, s, n); }
  void softcap(float* y, float c, int64_t n) override { inner_->softcap(y, c, n); }
  void copy(float* y, const float* x, int64_t n) override { inner_->copy(y, x, n); }
  void mul_rows(float* y, const float* x, int64_t r, int64_t l, int64_t s) override {
    inner_->mul_rows(y, x, r, l, s);
  }
  void mean_rows(const float* x, int64_t r, int64_t l, float* out) override { inner_->mean_rows(x, r, l, out); }
  int32_t sample(const float* l, int64_t n, const SamplingParams& p, float u) override {
    return inner_->sample(l, n, p, u);
  }
  void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n, int32_t p) override {
    inner_->kv_store(kv, k, v, n, p);
  }
  void attention(const AttentionArgs& a) override { inner_->attention(a); }
  void kv_encode(formats::KvCodec c, int d, const float* x, int64_t n, uint8_t* b) override {
    inner_->kv_encode(c, d, x, n, b);
  }
  void kv_decode(formats::KvCodec c, int d, const uint8_t* b, int64_t n, float* x) override {
    inner_->kv_decode(c, d, b, n, x);
  }
  void kv_score(formats::KvCodec c, int d, const float* q, int64_t nq, const uint8_t* b, int64_t nb,
                float* s) override {
    inner_->kv_score(c, d, q, nq, b, nb, s);
  }
  void kv_accumulate(formats::KvCodec c, int d, const float* w, int64_t ns, const uint8_t* b, int64_t nb,
                     float* acc) override {
    inner_->kv_accumulate(c, d, w, ns, b, nb, acc);
  }
  void kv_finish(formats::KvCodec c, int d, const float* acc, int64_t n, float* out) override {
    inner_->kv_finish(c, d, acc, n, out);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace sparrow::testing
