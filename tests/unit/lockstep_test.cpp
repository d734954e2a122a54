// verify::Lockstep: a forward pass on two backends op by op. Two CPU backends agree exactly; a backend with one
// deliberately wrong op is caught at that op alone (the reference's outputs are forced into the test side, so the
// fault does not spread to the ops after it).
#include "verify/lockstep.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "cli_test_util.h"
#include "runtime/model.h"
#include "runtime/session.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;

const fs::path& tiny_model() {
  static const fs::path path = [] {
    fs::path p = fs::temp_directory_path() / ("sparrow-lockstep-" + std::to_string(::getpid()) + ".gguf");
    auto r = testing::run_sparrow("mkmodel --arch gemma4 --preset tiny-ple --type q8_0 --seed 5 -o " + p.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p;
  }();
  return path;
}

// Every op forwarded to a CPU backend, except that rms_norm's output comes out 0.1% too large.
class ScaledNormBackend final : public Backend {
 public:
  ScaledNormBackend() : cpu_(make_cpu_backend(1)) {}
  const char* name() const override { return "scaled-norm"; }
  float* alloc(size_t n) override { return cpu_->alloc(n); }
  void* alloc_bytes(size_t n) override { return cpu_->alloc_bytes(n); }
  void free_buffer(void* p) override { cpu_->free_buffer(p); }
  void read(const float* s, float* d, size_t n) override { cpu_->read(s, d, n); }
  void write(float* d, const float* s, size_t n) override { cpu_->write(d, s, n); }
  void read_bytes(const void* s, void* d, size_t n) override { cpu_->read_bytes(s, d, n); }
  void write_bytes(void* d, const void* s, size_t n) override { cpu_->write_bytes(d, s, n); }
  size_t memory_capacity() const override { return cpu_->memory_capacity(); }
  void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) override { cpu_->matmul(w, x, n, y); }
  void embed(const WeightMatrix& w, const int32_t* ids, int64_t n, float s, float* out) override {
    cpu_->embed(w, ids, n, s, out);
  }
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y) override {
    cpu_->rms_norm(x, w, rows, dim, eps, y);
    cpu_->scale(y, 1.001f, rows * dim);
  }
  void rope(float* x, int64_t n, int32_t h, int32_t d, int32_t p, const RopeParams& r) override {
    cpu_->rope(x, n, h, d, p, r);
  }
  void gelu_mul(const float* g, const float* u, int64_t n, float* y) override { cpu_->gelu_mul(g, u, n, y); }
  void add(float* y, const float* x, int64_t n) override { cpu_->add(y, x, n); }
  void scale(float* y, float s, int64_t n) override { cpu_->scale(y, s, n); }
  void softcap(float* y, float c, int64_t n) override { cpu_->softcap(y, c, n); }
  void copy(float* y, const float* x, int64_t n) override { cpu_->copy(y, x, n); }
  void mul_rows(float* y, const float* x, int64_t r, int64_t l, int64_t s) override { cpu_->mul_rows(y, x, r, l, s); }
  void mean_rows(const float* x, int64_t r, int64_t l, float* out) override { cpu_->mean_rows(x, r, l, out); }
  int32_t sample(const float* l, int64_t n, const SamplingParams& p, float u) override {
    return cpu_->sample(l, n, p, u);
  }
  void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n, int32_t p) override {
    cpu_->kv_store(kv, k, v, n, p);
  }
  void attention(const AttentionArgs& a) override { cpu_->attention(a); }
  void kv_encode(formats::KvCodec c, int d, const float* x, int64_t n, uint8_t* b) override {
    cpu_->kv_encode(c, d, x, n, b);
  }
  void kv_decode(formats::KvCodec c, int d, const uint8_t* b, int64_t n, float* x) override {
    cpu_->kv_decode(c, d, b, n, x);
  }
  void kv_score(formats::KvCodec c, int d, const float* q, int64_t nq, const uint8_t* b, int64_t nb,
                float* s) override {
    cpu_->kv_score(c, d, q, nq, b, nb, s);
  }
  void kv_accumulate(formats::KvCodec c, int d, const float* w, int64_t ns, const uint8_t* b, int64_t nb,
                     float* acc) override {
    cpu_->kv_accumulate(c, d, w, ns, b, nb, acc);
  }
  void kv_finish(formats::KvCodec c, int d, const float* acc, int64_t n, float* out) override {
    cpu_->kv_finish(c, d, acc, n, out);
  }

 private:
  std::unique_ptr<Backend> cpu_;
};

// Runs the tiny model's prompt and two decode steps in lockstep; returns the records.
std::vector<verify::LockstepRecord> run_in_lockstep(std::unique_ptr<Backend> test) {
  verify::Lockstep lockstep(make_cpu_weight_store(), make_cpu_weight_store(), std::move(test),
                            make_cpu_backend(1));
  ModelLoadOptions load;
  load.make_store = [&] { return lockstep.make_weight_store(); };
  const auto model = Model::load(tiny_model().string(), load);
  SessionOptions options;
  options.n_ctx = 32;
  options.k_codec = options.v_codec = formats::KvCodec::Q8_0;
  options.make_backend = [&] { return lockstep.make_backend(); };
  {
    Session session(*model, options);
    const std::vector<int32_t> prompt = {2, 17, 300, 41, 5, 9};
    session.decode(prompt.data(), int32_t(prompt.size()), true);
    for (int32_t next : {7, 8}) session.decode(&next, 1, false);
  }
  return lockstep.records();
}

TEST(Lockstep, TwoCpuBackendsAgreeOnEveryOp) {
  const auto records = run_in_lockstep(make_cpu_backend(1));
  std::set<std::string> kinds;
  for (const auto& r : records) {
    EXPECT_EQ(r.relative(), 0.0) << r.op << " #" << r.index;
    EXPECT_FALSE(r.mismatched_nan) << r.op;
    kinds.insert(r.op.substr(0, r.op.find(' ')));
  }
  // A Gemma 4 pass with PLE and a quantized KV cache goes through every op the model uses.
  for (const char* op : {"matmul", "embed", "rms_norm", "rope", "gelu_mul", "add", "scale", "mul_rows", "kv_store",
                         "attention", "softcap"})
    EXPECT_TRUE(kinds.count(op)) << op << " was not compared";
}

TEST(Lockstep, AWrongOpIsCaughtWhereItHappensAndNowhereElse) {
  const auto records = run_in_lockstep(std::make_unique<ScaledNormBackend>());
  int64_t norms = 0;
  for (const auto& r : records) {
    if (r.op.rfind("rms_norm", 0) == 0) {
      ++norms;
      EXPECT_NEAR(r.relative(), 1e-3, 1e-4) << r.op << " #" << r.index;
    } else {
      EXPECT_EQ(r.relative(), 0.0) << r.op << " #" << r.index << ": the fault spread past the op that made it";
    }
  }
  EXPECT_GT(norms, 0);
}

}  // namespace
}  // namespace sparrow
