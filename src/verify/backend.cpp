// OpsTableBackend: runs a KvCodecOps table one vector at a time, in buffers with guard zones behind them, so a
// kernel that writes past what its codec declares (block_bytes, query_floats, accumulator_floats, d) is caught
// instead of silently corrupting the next vector.
#include "verify/backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "util/error.h"

namespace sparrow::verify {
namespace {

using formats::KvCodec;
using formats::KvCodecOps;

// n elements of T followed by a guard zone filled with a pattern no op would write.
template <class T>
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t n) : n_(n), data_(n + kGuard) {
    std::memset(data_.data() + n_, kPattern, kGuardBytes);
  }
  T* data() { return data_.data(); }
  size_t size() const { return n_; }
  // Throws if the guard zone changed, naming the op and the codec.
  void check(const char* op, const std::string& backend, KvCodec codec, int d) const {
    std::vector<uint8_t> expected(kGuardBytes, kPattern);
    if (std::memcmp(data_.data() + n_, expected.data(), kGuardBytes) != 0) {
      throw Error(backend + " " + std::string(formats::kv_codec_info(codec).name) + " " + op + " at head dim " +
                  std::to_string(d) + " wrote past its " + std::to_string(n_) + "-element output");
    }
  }

 private:
  static constexpr size_t kGuardBytes = 64, kGuard = kGuardBytes / sizeof(T);
  static constexpr int kPattern = 0xA5;
  size_t n_;
  std::vector<T> data_;
};

bool complete(const KvCodecOps* ops) {
  return ops != nullptr && ops->encode && ops->decode && ops->prepare_query && ops->score && ops->accumulate &&
         ops->finish;
}

}  // namespace

bool OpsTableBackend::supports(KvCodec codec) const { return complete(ops_for_(codec)); }

const KvCodecOps& OpsTableBackend::ops(KvCodec codec) const {
  const KvCodecOps* ops = ops_for_(codec);
  if (!complete(ops)) {
    throw Error("backend " + name_ + " has no complete ops for kv codec " +
                std::string(formats::kv_codec_info(codec).name));
  }
  return *ops;
}

void OpsTableBackend::encode(KvCodec codec, int d, const float* x, int n, uint8_t* blocks) {
  const KvCodecOps& o = ops(codec);
  const size_t block_bytes = formats::kv_codec_info(codec).block_bytes(d);
  GuardedBuffer<uint8_t> block(block_bytes);
  for (int i = 0; i < n; ++i) {
    o.encode(x + size_t(i) * d, d, block.data());
    block.check("encode", name_, codec, d);
    std::copy_n(block.data(), block_bytes, blocks + size_t(i) * block_bytes);
  }
}

void OpsTableBackend::decode(KvCodec codec, int d, const uint8_t* blocks, int n, float* x) {
  const KvCodecOps& o = ops(codec);
  const size_t block_bytes = formats::kv_codec_info(codec).block_bytes(d);
  GuardedBuffer<float> out{size_t(d)};
  for (int i = 0; i < n; ++i) {
    o.decode(blocks + size_t(i) * block_bytes, d, out.data());
    out.check("decode", name_, codec, d);
    std::copy_n(out.data(), d, x + size_t(i) * d);
  }
}

void OpsTableBackend::score(KvCodec codec, int d, const float* queries, int n_queries, const uint8_t* blocks,
                            int n_blocks, float* scores) {
  const KvCodecOps& o = ops(codec);
  const formats::KvCodecInfo& info = formats::kv_codec_info(codec);
  const size_t block_bytes = info.block_bytes(d);
  GuardedBuffer<float> prepared(info.query_floats(d));
  for (int q = 0; q < n_queries; ++q) {
    o.prepare_query(queries + size_t(q) * d, d, prepared.data());
    prepared.check("prepare_query", name_, codec, d);
    for (int j = 0; j < n_blocks; ++j) {
      scores[size_t(q) * n_blocks + j] = o.score(prepared.data(), blocks + size_t(j) * block_bytes, d);
    }
  }
}

void OpsTableBackend::accumulate(KvCodec codec, int d, const float* weights, int n_sequences,
                                 const uint8_t* blocks, int n_blocks, float* acc) {
  const KvCodecOps& o = ops(codec);
  const formats::KvCodecInfo& info = formats::kv_codec_info(codec);
  const size_t block_bytes = info.block_bytes(d), acc_floats = info.accumulator_floats(d);
  GuardedBuffer<float> sum(acc_floats);
  for (int s = 0; s < n_sequences; ++s) {
    std::fill_n(sum.data(), acc_floats, 0.0f);
    for (int j = 0; j < n_blocks; ++j) {
      o.accumulate(weights[size_t(s) * n_blocks + j], blocks + size_t(j) * block_bytes, d, sum.data());
    }
    sum.check("accumulate", name_, codec, d);
    std::copy_n(sum.data(), acc_floats, acc + size_t(s) * acc_floats);
  }
}

void OpsTableBackend::finish(KvCodec codec, int d, const float* acc, int n, float* out) {
  const KvCodecOps& o = ops(codec);
  const size_t acc_floats = formats::kv_codec_info(codec).accumulator_floats(d);
  GuardedBuffer<float> row{size_t(d)};
  for (int s = 0; s < n; ++s) {
    o.finish(acc + size_t(s) * acc_floats, d, row.data());
    row.check("finish", name_, codec, d);
    std::copy_n(row.data(), d, out + size_t(s) * d);
  }
}

void OpsTableBackend::attention(const AttentionArgs& args) {
  if (!attention_) throw Error("backend " + name_ + " has no attention kernel");
  attention_(args);
}

void UnavailableBackend::unavailable() const { throw Error("backend " + name_ + " is unavailable: " + reason_); }

}  // namespace sparrow::verify
