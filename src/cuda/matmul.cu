// GPU matrix products and row gathers for every weight format. Every kernel is a template over the weight type
// T and decodes through formats::WeightBlock<T>::decode_run (weight_blocks.h), the decoder the CPU reference
// uses: a run of kRunElements (8) consecutive elements of one decode unit (a block; 8 elements of a float type)
// is the unit of work of one thread. Launch shapes are described in docs/cuda.md, "Matrix products".
#include "cuda/matmul.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>

#include "cuda/activations.h"
#include "cuda/cuda_check.h"
#include "cuda/dependent_launch.cuh"
#include "cuda/matmul_half.h"
#include "cuda/matmul_int8.h"
#include "cuda/stage_bytes.cuh"
#include "formats/weight_formats.h"
#include "formats/weight_int8.h"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

using formats::kRunElements;
using formats::WeightBlock;

template <TensorType T>
using Unit = typename WeightBlock<T>::Unit;
template <TensorType T>
constexpr int kUnitElements = WeightBlock<T>::kUnitElements;
template <TensorType T>
constexpr int kUnitBytes = int(sizeof(Unit<T>));

constexpr int kWarp = 32;

// ---------------------------------------------------------------------------------------------------------
// Shared pieces.

// Decodes the run of row `row` (row_bytes apart from the next) that starts at element e.
template <TensorType T>
__device__ __forceinline__ void decode_row_run(const uint8_t* rows, size_t row_bytes, int64_t row, int64_t e,
                                               float* out) {
  const uint8_t* unit = rows + size_t(row) * row_bytes + size_t(e / kUnitElements<T>) * kUnitBytes<T>;
  WeightBlock<T>::decode_run(*reinterpret_cast<const Unit<T>*>(unit), int(e % kUnitElements<T>), out);
}

// Stores the 8 floats of a run: two 16-byte stores where dst allows it.
__device__ __forceinline__ void store_run(float* dst, const float* v) {
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    for (int k = 0; k < kRunElements; ++k) dst[k] = v[k];
  }
}

// ---------------------------------------------------------------------------------------------------------
// Decode path: GEMV, one warp per output row.
//
// The CTA walks the rows in chunks of kGemvChunk elements. Per chunk, the CTA stages the chunk of the
// activations of every token in shared memory (x_tile[t][kGemvChunk]), and each warp stages its row's bytes of
// the chunk with 16-byte loads; then lane l decodes runs l, l + 32, ... of the chunk from shared memory and
// accumulates run . x[t] for every token in registers. A warp-shuffle reduction ends the row.

constexpr int kGemvWarps = 8;      // output rows per CTA
constexpr int kGemvChunk = 512;    // elements per step: a multiple of every decode unit (8, 32, 256)
static_assert(kMaxGemvTokens <= kWarp, "lane t writes token t's output");

template <TensorType T>
constexpr int kChunkBytes = kGemvChunk / kUnitElements<T> * kUnitBytes<T>;
// A warp's staging buffer: a chunk of its row, shifted to the row's address modulo 16 (see stage_row_bytes).
template <TensorType T>
constexpr int kStagingBytes = (kChunkBytes<T> + 16 + 15) / 16 * 16;

template <TensorType T>
constexpr size_t gemv_shared_bytes(int64_t n_tokens) {
  return size_t(n_tokens) * kGemvChunk * sizeof(float) + size_t(kGemvWarps) * kStagingBytes<T>;
}
static_assert(gemv_shared_bytes<TensorType::F32>(kMaxGemvTokens) <= 48 * 1024, "fits the default shared memory");

// x_tile[t][i] = x[t][c0 + i] for i < n; coalesced over the CTA's threads.
__device__ void stage_activations(const float* __restrict__ x, int64_t n_in, int n_tokens, int64_t c0, int n,
                                  float* x_tile) {
  for (int k = threadIdx.x; k < n_tokens * n; k += blockDim.x) {
    const int t = k / n, i = k % n;
    x_tile[t * kGemvChunk + i] = x[t * n_in + c0 + i];
  }
}

template <TensorType T>
__global__ void __launch_bounds__(kGemvWarps * kWarp)
    gemv_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in, int64_t n_out,
                const float* __restrict__ x, int n_tokens, float* __restrict__ y) {
  extern __shared__ uint4 gemv_shared[];  // uint4: 16-byte aligned
  float* x_tile = reinterpret_cast<float*>(gemv_shared);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  uint8_t* staging = reinterpret_cast<uint8_t*>(x_tile + n_tokens * kGemvChunk) + warp * kStagingBytes<T>;
  const int64_t row = int64_t(blockIdx.x) * kGemvWarps + warp;
  const bool active = row < n_out;  // inactive warps still help stage the activations
  const uint8_t* row_data = w + size_t(active ? row : 0) * row_bytes;

  float acc[kMaxGemvTokens];
  for (int t = 0; t < kMaxGemvTokens; ++t) acc[t] = 0.0f;
  for (int64_t c0 = 0; c0 < n_in; c0 += kGemvChunk) {
    const int n = n_in - c0 < kGemvChunk ? int(n_in - c0) : kGemvChunk;
    __syncthreads();  // every warp is done with the previous chunk's tile
    stage_activations(x, n_in, n_tokens, c0, n, x_tile);
    const uint8_t* src = row_data + size_t(c0 / kUnitElements<T>) * kUnitBytes<T>;
    uint8_t* units = staging + (reinterpret_cast<uintptr_t>(src) & 15);
    if (active) stage_row_bytes(units, src, n / kUnitElements<T> * kUnitBytes<T>, lane);
    __syncthreads();  // the tile and the staged rows are visible
    if (!active) continue;
    for (int e = lane * kRunElements; e < n; e += kWarp * kRunElements) {
      float wv[kRunElements];
      WeightBlock<T>::decode_run(*reinterpret_cast<const Unit<T>*>(units + (e / kUnitElements<T>) * kUnitBytes<T>),
                                 e % kUnitElements<T>, wv);
#pragma unroll
      for (int t = 0; t < kMaxGemvTokens; ++t) {
        if (t >= n_tokens) break;
        const float4* xt = reinterpret_cast<const float4*>(x_tile + t * kGemvChunk + e);
        const float4 a = xt[0], b = xt[1];
        float sum = acc[t];
        sum = fmaf(wv[0], a.x, sum), sum = fmaf(wv[1], a.y, sum), sum = fmaf(wv[2], a.z, sum);
        sum = fmaf(wv[3], a.w, sum), sum = fmaf(wv[4], b.x, sum), sum = fmaf(wv[5], b.y, sum);
        sum = fmaf(wv[6], b.z, sum), sum = fmaf(wv[7], b.w, sum);
        acc[t] = sum;
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int t = 0; t < kMaxGemvTokens; ++t) {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) acc[t] += __shfl_xor_sync(0xFFFFFFFFu, acc[t], offset);
    if (lane == t && t < n_tokens) y[int64_t(t) * n_out + row] = acc[t];
  }
}

template <TensorType T>
void launch_gemv(MatmulContext& ctx, const WeightMatrix& w, size_t row_bytes, const float* x, int64_t n_tokens,
                 float* y) {
  static_assert(kGemvChunk % kUnitElements<T> == 0, "a chunk is whole decode units, so chunks split no block");
  const int64_t ctas = (w.n_out + kGemvWarps - 1) / kGemvWarps;
  gemv_kernel<T><<<unsigned(ctas), kGemvWarps * kWarp, gemv_shared_bytes<T>(n_tokens), ctx.stream()>>>(
      static_cast<const uint8_t*>(w.data), row_bytes, w.n_in, w.n_out, x, int(n_tokens), y);
  SPARROW_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------------------
// Prefill path for the float types: F16 / BF16 weights as they are, on tensor cores (matmul_half.h); F32 through
// cuBLAS in full fp32. (Block types take the kernels on 8-bit codes of matmul_int8.cu.)

// x: the activations as floats (F32), x_half: their f16 / bf16 encodings (F16 / BF16).
template <TensorType T>
void float_gemm(MatmulContext& ctx, const WeightMatrix& w, const float* x, const uint16_t* x_half, int64_t n_tokens,
                float* y) {
  static_assert(T == TensorType::F32 || T == TensorType::F16 || T == TensorType::BF16,
                "a block type needs formats::WeightInt8 (its products are matmul_int8's)");
  if constexpr (T == TensorType::F32) {
    // y[t][o] = sum_i a[o][i] x[t][i] column-major: Y^T = A^T-as-stored times X.
    const float alpha = 1.0f, beta = 0.0f;
    SPARROW_CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, int(w.n_out), int(n_tokens),
                                      int(w.n_in), &alpha, w.data, CUDA_R_32F, int(w.n_in), x, CUDA_R_32F,
                                      int(w.n_in), &beta, y, CUDA_R_32F, int(w.n_out), CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
  } else {
    matmul_half(ctx.stream(), T, static_cast<const uint16_t*>(w.data), w.n_in, w.n_out, x_half, n_tokens, y);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Row gathers: one CTA per id, one thread per run.

constexpr int kThreads = 256;

template <TensorType T>
__global__ void __launch_bounds__(kThreads)
    get_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_in, int64_t n_out,
                    const int32_t* __restrict__ ids, float scale, float* __restrict__ out) {
  allow_dependents();  // the decode GEMV after it may start streaming its weights
  const int64_t r = blockIdx.x;
  const int32_t id = ids[r];
  const bool valid = id >= 0 && id < n_out;
  float* dst = out + r * n_in;
  for (int64_t e = int64_t(threadIdx.x) * kRunElements; e < n_in; e += int64_t(blockDim.x) * kRunElements) {
    float v[kRunElements];
    if (valid) {
      decode_row_run<T>(w, row_bytes, id, e, v);
      for (int k = 0; k < kRunElements; ++k) v[k] = scale * v[k];
    } else {
      for (int k = 0; k < kRunElements; ++k) v[k] = __int_as_float(0x7FC00000);  // NaN marks the bad id
    }
    store_run(dst + e, v);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Validation, shared by matmul and get_rows.

// Bytes per row of w for weight type T; throws unless the shape and the data pointer fit T.
template <TensorType T>
size_t checked_row_bytes(const char* what, const WeightMatrix& w) {
  const std::string type_name = tensor_type_name(T);
  if (w.n_in <= 0 || w.n_out <= 0 || w.n_in % kUnitElements<T> != 0 || w.n_in > INT_MAX || w.n_out > INT_MAX) {
    throw Error(std::string(what) + ": weight shape " + std::to_string(w.n_in) + " x " + std::to_string(w.n_out) +
                " does not fit " + type_name + " on the GPU (n_in a positive multiple of " +
                std::to_string(kUnitElements<T>) + ", both below 2^31)");
  }
  if (w.data == nullptr) throw Error(std::string(what) + ": weight data is null");
  if (reinterpret_cast<uintptr_t>(w.data) % alignof(Unit<T>) != 0) {
    throw Error(std::string(what) + ": " + type_name + " weight data is not aligned to " +
                std::to_string(alignof(Unit<T>)) + " bytes");
  }
  return size_t(w.n_in / kUnitElements<T>) * kUnitBytes<T>;
}

}  // namespace

MatmulContext::MatmulContext(cudaStream_t stream)
    : activations(stream),
      activation_bits(stream),
      activation_scales(stream),
      activation_sums(stream),
      residual_counts(stream),
      stream_(stream) {
  SPARROW_CUBLAS_CHECK(cublasCreate(&cublas_));
  const cublasStatus_t status = cublasSetStream(cublas_, stream_);
  if (status != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(cublas_);
    throw_cublas_error(status, "cublasSetStream", __FILE__, __LINE__);
  }
}

MatmulContext::~MatmulContext() { cublasDestroy(cublas_); }

namespace {

// Float weights, one matrix: the activations as the CPU multiplies them with this type (activations.h), then
// the GEMV (decode) or cuBLAS (prefill).
template <TensorType T>
void float_matmul(MatmulContext& ctx, const WeightMatrix& w, size_t row_bytes, const float* x, int64_t n_tokens,
                  float* y) {
  constexpr formats::ActivationFormat kActivation = formats::find_weight_format(T)->activation;
  const bool half_gemm = T != TensorType::F32 && n_tokens > kMaxGemvTokens;
  const float* rounded = x;
  const uint16_t* half = nullptr;
  if constexpr (kActivation != formats::ActivationFormat::F32) {
    const size_t n = size_t(n_tokens * w.n_in);
    ActivationOutputs out;
    if (half_gemm) {
      out.half = ctx.activation_bits.get<uint16_t>(n);
    } else {
      out.rounded = ctx.activations.get<float>(n);
    }
    quantize_activations(ctx.stream(), kActivation, x, n_tokens, w.n_in, out);
    rounded = out.rounded;
    half = out.half;
  }
  if (n_tokens <= kMaxGemvTokens) {
    launch_gemv<T>(ctx, w, row_bytes, rounded, n_tokens, y);
  } else {
    float_gemm<T>(ctx, w, rounded, half, n_tokens, y);
  }
}

// The activation format and input length that ctx's 8-bit activation buffers hold, converted from one x.
struct Converted {
  formats::ActivationFormat format;
  int64_t n_in;
  ActivationOutputs buffers;
};

}  // namespace

void matmul(MatmulContext& ctx, const float* x, int64_t n_tokens, std::span<const MatmulTarget> targets) {
  if (n_tokens < 0 || n_tokens > INT_MAX) {
    throw Error("cuda::matmul: n_tokens " + std::to_string(n_tokens) + " out of range");
  }
  for (const MatmulTarget& t : targets) {
    formats::visit_weight_type(t.w.type, "cuda::matmul", [&](auto type) {
      checked_row_bytes<decltype(type)::value>("cuda::matmul", t.w);
    });
  }
  if (n_tokens == 0 || targets.empty()) return;
  if (x == nullptr) throw Error("cuda::matmul: null activations");
  for (const MatmulTarget& t : targets)
    if (t.y == nullptr) throw Error("cuda::matmul: null output");

  std::optional<Converted> converted;
  for (size_t i = 0; i < targets.size();) {
    const WeightMatrix& w = targets[i].w;
    if (!matmul_int8_supports(w.type)) {
      formats::visit_weight_type(w.type, "cuda::matmul", [&](auto type) {
        constexpr TensorType T = decltype(type)::value;
        if constexpr (!formats::WeightInt8<T>::kSupported) {
          float_matmul<T>(ctx, w, checked_row_bytes<T>("cuda::matmul", w), x, n_tokens, targets[i].y);
        }
      });
      converted.reset();  // the float path reuses the 8-bit buffers
      ++i;
      continue;
    }
    // Block weights: their 8-bit codes times the activations' (matmul_int8.h), a run of one type per launch.
    size_t j = i + 1;
    while (j < targets.size() && j - i < size_t(kMaxGemvMatrices) && targets[j].w.type == w.type &&
           targets[j].w.n_in == w.n_in) {
      ++j;
    }
    if (matmul_int8_quantizes(w.type, w.n_in, n_tokens)) {  // the GEMV quantizes x itself: one launch
      matmul_int8(ctx, targets.subspan(i, j - i), x, n_tokens);
      i = j;
      continue;
    }
    const formats::ActivationFormat format = formats::find_weight_format(w.type)->activation;
    if (!converted || converted->format != format || converted->n_in != w.n_in) {
      const size_t n = size_t(n_tokens * w.n_in);
      converted = Converted{format, w.n_in,
                            ActivationOutputs{.q = ctx.activation_bits.get<int8_t>(n),
                                              .scale = ctx.activation_scales.get<float>(n / 32),
                                              .sum32 = ctx.activation_sums.get<float>(n / 32)}};
      quantize_activations(ctx.stream(), format, x, n_tokens, w.n_in, converted->buffers);
    }
    const ActivationOutputs& q8 = converted->buffers;
    matmul_int8(ctx, targets.subspan(i, j - i), q8.q, q8.scale, q8.sum32, n_tokens);
    i = j;
  }
}

void matmul(MatmulContext& ctx, const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) {
  const MatmulTarget target{w, y};
  matmul(ctx, x, n_tokens, std::span(&target, 1));
}

void get_rows(MatmulContext& ctx, const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float scale,
              float* out) {
  formats::visit_weight_type(w.type, "cuda::get_rows", [&](auto type) {
    constexpr TensorType T = decltype(type)::value;
    const size_t row_bytes = checked_row_bytes<T>("cuda::get_rows", w);
    if (n_ids < 0 || n_ids > INT_MAX) throw Error("cuda::get_rows: n_ids " + std::to_string(n_ids) + " out of range");
    if (n_ids == 0) return;
    if (ids == nullptr || out == nullptr) throw Error("cuda::get_rows: null ids or output");
    get_rows_kernel<T><<<unsigned(n_ids), kThreads, 0, ctx.stream()>>>(static_cast<const uint8_t*>(w.data), row_bytes,
                                                                       w.n_in, w.n_out, ids, scale, out);
    SPARROW_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace sparrow::cuda
