#include "verify/target.h"

#include <cstring>

#include "runtime/backends.h"
#include "util/error.h"

namespace sparrow::verify {
namespace {

using formats::KvCodec;

// A backend buffer freed on scope exit.
class Buffer {
 public:
  // With host non-null, holds a copy of its first `bytes` bytes.
  Buffer(Backend& backend, size_t bytes, const void* host = nullptr)
      : backend_(backend), data_(backend.alloc_bytes(bytes)) {
    if (host) backend.write_bytes(data_, host, bytes);
  }
  ~Buffer() { backend_.free_buffer(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  Backend& backend_;
  void* data_;
};

// One vector's output slot followed by a guard zone filled with a pattern no op writes.
class GuardedSlot {
 public:
  GuardedSlot(Backend& backend, size_t bytes) : backend_(backend), bytes_(bytes), buffer_(backend, bytes + kGuard) {}
  template <class T>
  T* data() const { return buffer_.as<T>(); }
  // Fills the guard zone; call before each op.
  void arm() {
    const std::vector<uint8_t> pattern(kGuard, kPattern);
    backend_.write_bytes(buffer_.as<uint8_t>() + bytes_, pattern.data(), kGuard);
  }
  // Copies the output to host_dst; throws naming the op if the guard zone changed.
  void take(void* host_dst, const char* op, const Backend& backend, KvCodec codec, int d) {
    std::vector<uint8_t> host(bytes_ + kGuard);
    backend_.read_bytes(buffer_.as<uint8_t>(), host.data(), host.size());
    for (size_t i = bytes_; i < host.size(); ++i) {
      if (host[i] != kPattern)
        throw Error(std::string(backend.name()) + " " + std::string(formats::kv_codec_info(codec).name) + " " + op +
                    " at head dim " + std::to_string(d) + " wrote past its " + std::to_string(bytes_) +
                    "-byte output");
    }
    std::memcpy(host_dst, host.data(), bytes_);
  }

 private:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kPattern = 0xA5;
  Backend& backend_;
  size_t bytes_;
  Buffer buffer_;
};

}  // namespace

std::vector<std::string> backend_names() { return device_names(); }

Target make_target(std::string_view name) {
  const std::optional<Device> device = parse_device(name);
  if (!device) throw Error("verify: unknown backend '" + std::string(name) + "' (expected cpu, cuda or all)");
  Target t;
  t.name = std::string(name);
  t.unavailable = device_unavailable_reason(*device);
  if (t.unavailable.empty()) t.backend = make_backend(*device, 0);
  return t;
}

void encode(Backend& backend, KvCodec codec, int d, const float* x, int n, uint8_t* blocks) {
  const size_t block_bytes = formats::kv_codec_info(codec).block_bytes(d);
  const Buffer in(backend, size_t(n) * d * sizeof(float), x);
  GuardedSlot out(backend, block_bytes);
  for (int i = 0; i < n; ++i) {
    out.arm();
    backend.kv_encode(codec, d, in.as<float>() + size_t(i) * d, 1, out.data<uint8_t>());
    out.take(blocks + size_t(i) * block_bytes, "encode", backend, codec, d);
  }
}

void decode(Backend& backend, KvCodec codec, int d, const uint8_t* blocks, int n, float* x) {
  const size_t block_bytes = formats::kv_codec_info(codec).block_bytes(d);
  const Buffer in(backend, size_t(n) * block_bytes, blocks);
  GuardedSlot out(backend, size_t(d) * sizeof(float));
  for (int i = 0; i < n; ++i) {
    out.arm();
    backend.kv_decode(codec, d, in.as<uint8_t>() + size_t(i) * block_bytes, 1, out.data<float>());
    out.take(x + size_t(i) * d, "decode", backend, codec, d);
  }
}

void score(Backend& backend, KvCodec codec, int d, const float* queries, int n_queries, const uint8_t* blocks,
           int n_blocks, float* scores) {
  const size_t block_bytes = formats::kv_codec_info(codec).block_bytes(d);
  const Buffer q(backend, size_t(n_queries) * d * sizeof(float), queries);
  const Buffer b(backend, size_t(n_blocks) * block_bytes, blocks);
  GuardedSlot out(backend, size_t(n_blocks) * sizeof(float));
  for (int i = 0; i < n_queries; ++i) {
    out.arm();
    backend.kv_score(codec, d, q.as<float>() + size_t(i) * d, 1, b.as<uint8_t>(), n_blocks, out.data<float>());
    out.take(scores + size_t(i) * n_blocks, "score", backend, codec, d);
  }
}

void accumulate(Backend& backend, KvCodec codec, int d, const float* weights, int n_sequences,
                const uint8_t* blocks, int n_blocks, float* acc) {
  const formats::KvCodecInfo& info = formats::kv_codec_info(codec);
  const size_t block_bytes = info.block_bytes(d), acc_floats = info.accumulator_floats(d);
  const Buffer w(backend, size_t(n_sequences) * n_blocks * sizeof(float), weights);
  const Buffer b(backend, size_t(n_blocks) * block_bytes, blocks);
  GuardedSlot out(backend, acc_floats * sizeof(float));
  for (int s = 0; s < n_sequences; ++s) {
    out.arm();
    backend.kv_accumulate(codec, d, w.as<float>() + size_t(s) * n_blocks, 1, b.as<uint8_t>(), n_blocks,
                          out.data<float>());
    out.take(acc + size_t(s) * acc_floats, "accumulate", backend, codec, d);
  }
}

void finish(Backend& backend, KvCodec codec, int d, const float* acc, int n, float* out) {
  const size_t acc_floats = formats::kv_codec_info(codec).accumulator_floats(d);
  const Buffer in(backend, size_t(n) * acc_floats * sizeof(float), acc);
  GuardedSlot slot(backend, size_t(d) * sizeof(float));
  for (int i = 0; i < n; ++i) {
    slot.arm();
    backend.kv_finish(codec, d, in.as<float>() + size_t(i) * acc_floats, 1, slot.data<float>());
    slot.take(out + size_t(i) * d, "finish", backend, codec, d);
  }
}

void attention(Backend& backend, const AttentionArgs& host_args) {
  const KvLayerView& kv = host_args.kv;
  const size_t q_bytes = size_t(host_args.n_tokens) * host_args.n_heads * kv.head_dim * sizeof(float);
  const size_t blocks = size_t(kv.n_kv_heads) * kv.capacity;
  const Buffer q(backend, q_bytes, host_args.q);
  const Buffer k(backend, blocks * formats::kv_codec_info(kv.k_codec).block_bytes(kv.head_dim), kv.k);
  const Buffer v(backend, blocks * formats::kv_codec_info(kv.v_codec).block_bytes(kv.head_dim), kv.v);
  GuardedSlot out(backend, q_bytes);
  out.arm();
  AttentionArgs args = host_args;
  args.q = q.as<float>();
  args.out = out.data<float>();
  args.kv.k = k.as<void>();
  args.kv.v = v.as<void>();
  args.kv.k_center = nullptr;
  backend.attention(args);
  out.take(host_args.out, "attention", backend, kv.k_codec, kv.head_dim);
}

}  // namespace sparrow::verify
