#pragma once
// The backend `sparrow verify` checks — a sparrow::Backend, the same object the model runs on — and the KV
// codec ops called on it from host memory. Each call copies its inputs into backend buffers and reads each
// vector's output back from a buffer with a guard zone behind it, so an op that writes past what its codec
// declares (block_bytes, query_floats, accumulator_floats, d) throws instead of corrupting the next vector.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/kv/kv_codec.h"
#include "ops/backend.h"

namespace sparrow::verify {

struct Target {
  std::string name;
  std::unique_ptr<Backend> backend;  // null when this build or machine cannot run it
  std::string unavailable;           // why backend is null ("" otherwise)
};

// The backends `sparrow verify --backend` knows, in order: "cpu", "cuda".
std::vector<std::string> backend_names();
// Throws sparrow::Error for an unknown name. A backend this build or machine lacks comes back without a
// Backend and with the reason, so that every one of its cells is reported missing.
Target make_target(std::string_view name);

// The five checked ops of Backend on host memory (semantics in ops/backend.h, kv_encode .. kv_finish).
void encode(Backend& backend, formats::KvCodec codec, int d, const float* x, int n, uint8_t* blocks);
void decode(Backend& backend, formats::KvCodec codec, int d, const uint8_t* blocks, int n, float* x);
void score(Backend& backend, formats::KvCodec codec, int d, const float* queries, int n_queries,
           const uint8_t* blocks, int n_blocks, float* scores);
void accumulate(Backend& backend, formats::KvCodec codec, int d, const float* weights, int n_sequences,
                const uint8_t* blocks, int n_blocks, float* acc);
void finish(Backend& backend, formats::KvCodec codec, int d, const float* acc, int n, float* out);
// Backend::attention with host pointers: args.q and args.out as documented there; args.kv.k and args.kv.v
// each hold n_kv_heads x capacity blocks of their codec, head-major (KvLayerView); args.kv.k_center unused.
void attention(Backend& backend, const AttentionArgs& host_args);

}  // namespace sparrow::verify
