#pragma once
// Device ops of trellis-coded TurboQuant (tcq2, tcq3, tcq4; formats/kv/trellis.{h,cpp}): rotation, then per sub-block
// a tail-biting bit-shift trellis path (k bits per element, the last L stream bits index the codebook) and the
// fp16 corrected norm after the stream.
//
// Parallel shape. Encode: one CTA per vector, sub-blocks in turn; the Viterbi search puts the 2^L trellis
// states across the threads (state s on thread s % blockDim), one barrier per element: each thread finds its
// state's best predecessor among 2^k (lowest index on ties, as the reference) and adds the squared distance,
// computed and added as two roundings like the reference's two loops. The junction pass and the final pass are
// the reference's (trellis.h); back pointers live in shared memory and one thread walks them back. Decode and
// expand read each element's state from a 16-bit window of the stream (the few elements whose window wraps
// around the circular stream read bit by bit), and look it up in the scaled codebook in global memory
// (2^L floats, which stay in L1).
#include "cuda/kv/device_codec.cuh"
#include "cuda/kv/primitives.cuh"
#include "formats/kv/trellis.h"

namespace sparrow::cuda {
namespace kv {

template <int kCodeBits, int kStateBits>
struct TrellisCodec {
  static constexpr int kStates = 1 << kStateBits;
  static constexpr int kGroups = kStates >> kCodeBits;  // predecessor groups m: states (m << k) | j
  static constexpr int kFan = 1 << kCodeBits;
  static constexpr int kMaxSubBlock = formats::tcq::kMaxSubBlock;
  static constexpr int kMaxWindow = 2 * 32;  // the junction pass: 2 W elements, W <= 32

  static __host__ __device__ int sub_block(int d) { return formats::tcq::sub_block_size(d); }
  static __host__ __device__ int stream_bytes(int n) { return n * kCodeBits / 8; }
  static __host__ __device__ int stride(int d) { return stream_bytes(sub_block(d)) + 2; }

  static __device__ const float* codebook(int n) { return kv_tables().tcq_codebook[kCodeBits - 2][n == 128]; }

  // The state of element t of a sub-block's circular stream (n elements): stream bits [k t + k - L, k t + k).
  static __device__ uint32_t state_at(const uint8_t* stream, int n, int t) {
    const int first = t * kCodeBits + kCodeBits - kStateBits;
    if (first >= 0) {  // L + 7 <= 16: two bytes hold the window (the last may be the norm's, masked off)
      const uint32_t window = stream[first / 8] | uint32_t(stream[first / 8 + 1]) << 8;
      return (window >> (first % 8)) & (kStates - 1);
    }
    const int bits = n * kCodeBits;
    uint32_t state = 0;
    for (int b = 0; b < kStateBits; ++b) {
      const int pos = (first + b + bits) % bits;
      state |= uint32_t((stream[pos / 8] >> (pos % 8)) & 1) << b;
    }
    return state;
  }

  // Element i of y^ (rotated basis): norm * codebook[state], the reference's one product.
  static __device__ float value(const uint8_t* block, int d, int i) {
    const int n = sub_block(d);
    const uint8_t* stream = block + (i / n) * stride(d);
    return __fmul_rn(load_f16(stream + stream_bytes(n)), codebook(n)[state_at(stream, n, i % n)]);
  }

  // ---------------------------------------------------------------------------------------------------------
  // Encode scratch (floats): u (n) | junction targets (2 W) | costs (2 x states) | path states (n) | path values
  // (n) | back pointers (n x groups bytes) | norm (1).
  static __host__ __device__ int encode_scratch_floats() {
    return 3 * kMaxSubBlock + kMaxWindow + 2 * kStates + kMaxSubBlock * kGroups / 4 + 1;
  }
  static __host__ __device__ int smem_floats(int d) {
    return d > encode_scratch_floats() ? d : encode_scratch_floats();
  }

  struct Scratch {
    float* u;
    float* targets;
    float* cost;
    float* next;
    uint32_t* states;
    float* values;
    uint8_t* back;
    float* norm;
  };
  static __device__ Scratch carve(float* smem) {
    Scratch s;
    s.u = smem;
    s.targets = s.u + kMaxSubBlock;
    s.cost = s.targets + kMaxWindow;
    s.next = s.cost + kStates;
    s.states = reinterpret_cast<uint32_t*>(s.next + kStates);
    s.values = reinterpret_cast<float*>(s.states + kMaxSubBlock);
    s.back = reinterpret_cast<uint8_t*>(s.values + kMaxSubBlock);
    s.norm = reinterpret_cast<float*>(s.back + kMaxSubBlock * kGroups);
    return s;
  }

  // formats::tcq::viterbi_path over `count` targets (shared): writes the path's states to s.states.
  // start_prefix / end_prefix: formats::tcq::kFree or a prefix p (the path starts from state p << k / its last
  // state's top L - k bits are p).
  static __device__ void viterbi_path(const float* cb, const float* targets, int count, int start_prefix,
                                      int end_prefix, Scratch& s) {
    float* cost = s.cost;
    float* next = s.next;
    for (int st = int(threadIdx.x); st < kStates; st += int(blockDim.x)) {
      const bool open = start_prefix == formats::tcq::kFree || st == (start_prefix << kCodeBits);
      cost[st] = open ? 0.0f : INFINITY;
    }
    __syncthreads();
    for (int t = 0; t < count; ++t) {
      const float target = targets[t];
      for (int st = int(threadIdx.x); st < kStates; st += int(blockDim.x)) {
        const int m = st % kGroups;  // st = c * groups + m
        int best = 0;
        for (int j = 1; j < kFan; ++j)
          if (cost[(m << kCodeBits) | j] < cost[(m << kCodeBits) | best]) best = j;
        if (st < kGroups) s.back[t * kGroups + m] = uint8_t(best);
        const float diff = target - cb[st];
        next[st] = __fadd_rn(cost[(m << kCodeBits) | best], __fmul_rn(diff, diff));
      }
      __syncthreads();
      float* swap = cost;
      cost = next;
      next = swap;
    }
    if (threadIdx.x < kWarpSize) {  // the best final state, lowest index on ties, then back along the pointers
      const int first = end_prefix == formats::tcq::kFree ? 0 : end_prefix << kCodeBits;
      const int last = end_prefix == formats::tcq::kFree ? kStates : first + kFan;
      float best_cost = INFINITY;
      int best = kStates;
      for (int st = first + lane_id(); st < last; st += kWarpSize) {
        if (best == kStates || cost[st] < best_cost) {
          best_cost = cost[st];
          best = st;
        }
      }
      for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
        const float other_cost = __shfl_xor_sync(kFullWarp, best_cost, offset);
        const int other = __shfl_xor_sync(kFullWarp, best, offset);
        const bool other_wins = other != kStates && (best == kStates || other_cost < best_cost ||
                                                     (other_cost == best_cost && other < best));
        if (other_wins) {
          best_cost = other_cost;
          best = other;
        }
      }
      if (threadIdx.x == 0) {
        uint32_t state = uint32_t(best);
        for (int t = count - 1; t >= 0; --t) {
          s.states[t] = state;
          const uint32_t m = state & uint32_t(kGroups - 1);
          state = (m << kCodeBits) | s.back[t * kGroups + m];
        }
      }
    }
    __syncthreads();
  }

  // One sub-block of the rotated vector (y: n floats, shared) into its stream and norm.
  static __device__ void encode_sub_block(const float* y, int n, uint8_t* stream, Scratch& s) {
    const float* cb = codebook(n);
    if (threadIdx.x == 0) *s.norm = float(sqrt(ordered_sum_of_squares(y, n)));  // normalise_sub_block
    __syncthreads();
    const float norm = *s.norm;
    const bool usable = norm > 0 && isfinite(norm);
    const float inv = usable ? 1.0f / norm : 0.0f;
    const int w = formats::tcq::junction_window(n);
    for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) s.u[i] = usable ? y[i] * inv : 0.0f;
    __syncthreads();
    for (int i = int(threadIdx.x); i < 2 * w; i += int(blockDim.x)) s.targets[i] = i < w ? s.u[n - w + i] : s.u[i - w];
    __syncthreads();
    viterbi_path(cb, s.targets, 2 * w, formats::tcq::kFree, formats::tcq::kFree, s);
    const int prefix = int(s.states[w - 1] >> kCodeBits);
    __syncthreads();  // every thread has read the junction's prefix before the next pass overwrites states
    viterbi_path(cb, s.u, n, prefix, prefix, s);
    for (int t = int(threadIdx.x); t < n; t += int(blockDim.x)) s.values[t] = cb[s.states[t]];
    for (int b = int(threadIdx.x); b < stream_bytes(n); b += int(blockDim.x)) {
      uint8_t byte = 0;  // stream bit i is bit i % k of code i / k; code t = state_t >> (L - k)
      for (int bit = 0; bit < 8; ++bit) {
        const int pos = 8 * b + bit;
        byte |= uint8_t(((s.states[pos / kCodeBits] >> (kStateBits - kCodeBits + pos % kCodeBits)) & 1) << bit);
      }
      stream[b] = byte;
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // formats::tcq::store_corrected_norm
      const double sum = ordered_sum_of_squares(s.values, n);
      float corrected = sum > 0 ? float(double(norm) / sqrt(sum)) : 0.0f;
      if (corrected > 65504.0f) corrected = 65504.0f;  // NaN stays NaN
      store_f16(corrected, stream + stream_bytes(n));
    }
    __syncthreads();
  }

  static __device__ void encode(float* x, int d, uint8_t* block, float* smem) {
    hadamard_rotate(x, d, x, x);
    Scratch s = carve(smem);
    const int n = sub_block(d);
    for (int sub = 0; sub < d / n; ++sub) encode_sub_block(x + sub * n, n, block + sub * stride(d), s);
  }

  static __device__ void decode(const uint8_t* block, int d, float* x, float* smem) {
    for (int i = int(threadIdx.x); i < d; i += int(blockDim.x)) smem[i] = value(block, d, i);
    __syncthreads();
    hadamard_unrotate(smem, d, smem, x);
  }
  static __device__ void prepare_query(float* q, int d, float* prepared, float* smem) {
    hadamard_rotate(q, d, smem, prepared);
  }
  static __device__ void finish(float* acc, int d, float* out, float* smem) { hadamard_unrotate(acc, d, smem, out); }
  static __device__ void expand(const uint8_t* block, int d, float* row) {
    with_head_dim(d, [&](auto head_dim) { expand_fixed<decltype(head_dim)::value>(block, row); });
    __syncwarp();
  }
  template <int D>
  static __device__ void expand_fixed(const uint8_t* block, float* row) {
    constexpr int n = D < kMaxSubBlock ? D : kMaxSubBlock;
    const float* cb = codebook(n);
#pragma unroll
    for (int s = 0; s < D / n; ++s) {
      const uint8_t* stream = block + s * stride(D);
      const float norm = load_f16(stream + stream_bytes(n));
#pragma unroll
      for (int t = lane_id(), k = 0; k < n / kWarpSize; ++k, t += kWarpSize)
        row[s * n + t] = __fmul_rn(norm, cb[state_at(stream, n, t)]);
    }
  }
};

}  // namespace kv

template <>
struct DeviceCodec<formats::KvCodec::TCQ2>
    : kv::TrellisCodec<formats::tcq::kTcq2Bits.code_bits, formats::tcq::kTcq2Bits.state_bits> {};
template <>
struct DeviceCodec<formats::KvCodec::TCQ3>
    : kv::TrellisCodec<formats::tcq::kTcq3Bits.code_bits, formats::tcq::kTcq3Bits.state_bits> {};
template <>
struct DeviceCodec<formats::KvCodec::TCQ4>
    : kv::TrellisCodec<formats::tcq::kTcq4Bits.code_bits, formats::tcq::kTcq4Bits.state_bits> {};

}  // namespace sparrow::cuda
