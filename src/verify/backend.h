#pragma once
// What `sparrow verify` needs from a backend: the five KV codec ops and attention, batched so a GPU backend can
// run each matrix cell as a few kernel launches. All pointers are host memory; a device backend copies in and out.
// A backend names the codecs it lacks (supports() == false: the cell is "unsupported", which is a failure) and
// says why it cannot run at all (unavailable_reason(): every cell is "missing", also a failure).
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/kv/kv_codec.h"
#include "ops/backend.h"

namespace sparrow::verify {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // "" when the backend can run here; otherwise why not (e.g. "this build has no CUDA backend").
  virtual std::string unavailable_reason() const = 0;
  virtual bool supports(formats::KvCodec codec) const = 0;

  // n head vectors x[n][d] -> blocks[n][block_bytes(d)].
  virtual void encode(formats::KvCodec codec, int d, const float* x, int n, uint8_t* blocks) = 0;
  // blocks[n] -> x[n][d].
  virtual void decode(formats::KvCodec codec, int d, const uint8_t* blocks, int n, float* x) = 0;
  // scores[i][j] = score(prepare_query(queries[i]), blocks[j]) for i < n_queries, j < n_blocks.
  virtual void score(formats::KvCodec codec, int d, const float* queries, int n_queries, const uint8_t* blocks,
                     int n_blocks, float* scores) = 0;
  // acc[s][accumulator_floats(d)] = sum over j of weights[s][j] * block j, accumulated from zero in block
  // order, for s < n_sequences.
  virtual void accumulate(formats::KvCodec codec, int d, const float* weights, int n_sequences,
                          const uint8_t* blocks, int n_blocks, float* acc) = 0;
  // out[s][d] = finish(acc[s]).
  virtual void finish(formats::KvCodec codec, int d, const float* acc, int n, float* out) = 0;
  // sparrow::Backend::attention on host memory: args.q and args.out as documented there; args.kv.k and
  // args.kv.v each hold n_kv_heads x capacity blocks of their codec in the head-major layout of KvLayerView.
  virtual void attention(const AttentionArgs& args) = 0;
};

// A backend made of one KvCodecOps table per codec (the CPU's, a reference's, a test's deliberately broken
// one) and an attention kernel (none: attention throws). `ops_for` returns nullptr for a codec the backend
// lacks. Every codec op runs in guarded buffers: an op that writes past its block, prepared query, accumulator
// or output throws sparrow::Error.
class OpsTableBackend : public Backend {
 public:
  using OpsLookup = std::function<const formats::KvCodecOps*(formats::KvCodec)>;
  using AttentionKernel = std::function<void(const AttentionArgs&)>;
  OpsTableBackend(std::string name, OpsLookup ops_for, AttentionKernel attention = {})
      : name_(std::move(name)), ops_for_(std::move(ops_for)), attention_(std::move(attention)) {}

  std::string name() const override { return name_; }
  std::string unavailable_reason() const override { return ""; }
  bool supports(formats::KvCodec codec) const override;
  void encode(formats::KvCodec codec, int d, const float* x, int n, uint8_t* blocks) override;
  void decode(formats::KvCodec codec, int d, const uint8_t* blocks, int n, float* x) override;
  void score(formats::KvCodec codec, int d, const float* queries, int n_queries, const uint8_t* blocks,
             int n_blocks, float* scores) override;
  void accumulate(formats::KvCodec codec, int d, const float* weights, int n_sequences, const uint8_t* blocks,
                  int n_blocks, float* acc) override;
  void finish(formats::KvCodec codec, int d, const float* acc, int n, float* out) override;
  void attention(const AttentionArgs& args) override;

 private:
  const formats::KvCodecOps& ops(formats::KvCodec codec) const;
  std::string name_;
  OpsLookup ops_for_;
  AttentionKernel attention_;
};

// A backend this build or machine cannot run: every cell is missing, with `reason`.
class UnavailableBackend : public Backend {
 public:
  UnavailableBackend(std::string name, std::string reason) : name_(std::move(name)), reason_(std::move(reason)) {}
  std::string name() const override { return name_; }
  std::string unavailable_reason() const override { return reason_; }
  bool supports(formats::KvCodec) const override { return false; }
  void encode(formats::KvCodec, int, const float*, int, uint8_t*) override { unavailable(); }
  void decode(formats::KvCodec, int, const uint8_t*, int, float*) override { unavailable(); }
  void score(formats::KvCodec, int, const float*, int, const uint8_t*, int, float*) override { unavailable(); }
  void accumulate(formats::KvCodec, int, const float*, int, const uint8_t*, int, float*) override {
    unavailable();
  }
  void finish(formats::KvCodec, int, const float*, int, float*) override { unavailable(); }
  void attention(const AttentionArgs&) override { unavailable(); }

 private:
  [[noreturn]] void unavailable() const;
  std::string name_, reason_;
};

// The backends `sparrow verify --backend` knows, in order: "cpu", "cuda".
std::vector<std::string> backend_names();
// Throws sparrow::Error for an unknown name. A backend this build lacks comes back as an UnavailableBackend.
std::unique_ptr<Backend> make_backend(std::string_view name);

}  // namespace sparrow::verify
