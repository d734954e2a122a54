// The CUDA decode kernels against the memory floor (issue 12): the GEMV of every common weight format at Gemma 4
// E2B/E4B shapes, and the decode attention of every common KV codec at long contexts, each timed with CUDA events
// and reported as the bandwidth it achieves (bytes it must read / time) beside the device's measured copy
// bandwidth. Decode is memory-bound, so that ratio is how close a kernel is to its floor. A kernel is timed as it
// runs inside a decode step: calls back to back (so that one launch's latency hides behind the previous kernel,
// as in a replayed graph), each on its own copy of the data, with enough copies that together they exceed the L2
// cache four times over (a decode step reads every matrix once, from memory, never from L2).
// Beside them, the prefill GEMM of f16 / bf16 weights (matmul_half.h, which adds its tensor-core partial sums in
// rounded fp32) against cuBLAS's GemmEx on the same operands (fp32 accumulation inside the tensor core), as
// TFLOP/s: what the accuracy of matmul_half costs.
//   sparrow_cuda_bench [--json FILE] [--quick] [--only gemv|attention|prefill]
// Prints markdown tables; --json writes the rows. --quick: fewer shapes and contexts (a pipeline check).
// --only: one kind of kernel.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention.h"
#include "cuda/cuda_check.h"
#include "cuda/device_info.h"
#include "cuda/kv/kv_ops.h"
#include "cuda/matmul.h"
#include "cuda/matmul_half.h"
#include "formats/kv/kv_codec.h"
#include "gguf/tensor_types.h"
#include "util/error.h"

namespace {

using namespace sparrow;

struct Row {
  std::string kernel;  // "gemv q8_0 1536x6144", "attention tbq4 d512 ctx 131072"
  double microseconds = 0;
  double bytes = 0;
  double flops = 0;  // prefill rows: 2 n_in n_out n_tokens
  double gb_per_s() const { return bytes / (microseconds * 1e-6) / 1e9; }
  double tflop_per_s() const { return flops / (microseconds * 1e-6) / 1e12; }
};

// Device memory freed on scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { SPARROW_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// A cuBLAS handle on a stream, destroyed on scope exit.
struct CublasHandle {
  cublasHandle_t h = nullptr;
  explicit CublasHandle(cudaStream_t stream) {
    SPARROW_CUBLAS_CHECK(cublasCreate(&h));
    SPARROW_CUBLAS_CHECK(cublasSetStream(h, stream));
  }
  ~CublasHandle() { cublasDestroy(h); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
};

// Copies of a kernel's data (of `bytes`) that together exceed four times the L2 cache; at most 64.
int copies_beyond_l2(size_t bytes) {
  int device = 0, l2_bytes = 0;
  SPARROW_CUDA_CHECK(cudaGetDevice(&device));
  SPARROW_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const size_t wanted = (4 * size_t(l2_bytes) + bytes - 1) / std::max<size_t>(bytes, 1);
  return int(std::clamp<size_t>(wanted, 1, 64));
}

// Best per-call time, in microseconds, of `repetitions` timings of `calls` back-to-back calls work(0 .. calls - 1)
// (after one untimed round).
double best_microseconds(cudaStream_t stream, int repetitions, int calls, const std::function<void(int)>& work) {
  cudaEvent_t start, stop;
  SPARROW_CUDA_CHECK(cudaEventCreate(&start));
  SPARROW_CUDA_CHECK(cudaEventCreate(&stop));
  for (int c = 0; c < calls; ++c) work(c);
  float best = 1e30f;
  for (int i = 0; i < repetitions; ++i) {
    SPARROW_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int c = 0; c < calls; ++c) work(c);
    SPARROW_CUDA_CHECK(cudaEventRecord(stop, stream));
    SPARROW_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    SPARROW_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    best = std::min(best, ms / float(calls));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(best) * 1e3;
}

// Random bytes (weights: every block type decodes any bytes; NaN or not, the kernel's work is the same).
void fill_random_bytes(void* device, size_t bytes, uint32_t seed) {
  std::vector<uint8_t> host(bytes);
  std::mt19937 rng(seed);
  for (auto& b : host) b = uint8_t(rng());
  SPARROW_CUDA_CHECK(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice));
}

void fill_random_floats(float* device, size_t n, uint32_t seed) {
  std::vector<float> host(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (auto& v : host) v = normal(rng);
  SPARROW_CUDA_CHECK(cudaMemcpy(device, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
}

// A device-to-device copy of 1 GiB: bytes read plus bytes written per second.
Row copy_bandwidth(cudaStream_t stream) {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer a(bytes), b(bytes);
  Row r{"copy 1 GiB (read + write)", 0, double(2 * bytes)};
  r.microseconds = best_microseconds(stream, 10, 1, [&](int) {
    SPARROW_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  return r;
}

struct Shape {
  int64_t n_in, n_out;
  const char* what;
};

Row gemv(cudaStream_t stream, TensorType type, const Shape& s) {
  const size_t weight_bytes = tensor_row_bytes(type, s.n_in) * size_t(s.n_out);
  const int copies = copies_beyond_l2(weight_bytes);
  DeviceBuffer w(weight_bytes * size_t(copies)), x(size_t(s.n_in) * sizeof(float)), y(size_t(s.n_out) * sizeof(float));
  fill_random_bytes(w.p, weight_bytes * size_t(copies), 1);
  fill_random_floats(x.as<float>(), size_t(s.n_in), 2);
  cuda::MatmulContext ctx(stream);
  Row r{"gemv " + std::string(tensor_type_name(type)) + " " + std::to_string(s.n_in) + "x" + std::to_string(s.n_out) +
            " (" + s.what + ")",
        0, double(weight_bytes + size_t(s.n_in + s.n_out) * sizeof(float))};
  r.microseconds = best_microseconds(stream, 10, std::max(copies, 8), [&](int c) {
    const WeightMatrix m{type, w.as<uint8_t>() + size_t(c % copies) * weight_bytes, s.n_in, s.n_out};
    cuda::matmul(ctx, m, x.as<float>(), 1, y.as<float>());
  });
  return r;
}

// A prefill product of `type` (F16 or BF16) weights and n_tokens activations of the same type, by matmul_half
// (cublas null) or by cuBLAS's GemmEx with fp32 accumulation (on the handle's stream, which must be `stream`).
Row prefill_gemm(cudaStream_t stream, const CublasHandle* cublas, TensorType type, const Shape& s, int64_t n_tokens) {
  const size_t w_bytes = size_t(s.n_in * s.n_out) * 2, x_bytes = size_t(s.n_in * n_tokens) * 2;
  DeviceBuffer w(w_bytes), x(x_bytes), y(size_t(s.n_out * n_tokens) * sizeof(float));
  // Random 16-bit patterns with the exponent kept small: finite values of either type.
  std::vector<uint16_t> host(std::max(w_bytes, x_bytes) / 2);
  std::mt19937 rng(5);
  for (auto& h : host) h = uint16_t(rng() & 0x37FF);
  SPARROW_CUDA_CHECK(cudaMemcpy(w.p, host.data(), w_bytes, cudaMemcpyHostToDevice));
  SPARROW_CUDA_CHECK(cudaMemcpy(x.p, host.data(), x_bytes, cudaMemcpyHostToDevice));
  const cudaDataType_t element = type == TensorType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  Row r{std::string(cublas ? "cuBLAS GemmEx " : "matmul_half ") + tensor_type_name(type) + " " +
            std::to_string(s.n_in) + "x" + std::to_string(s.n_out) + " x " + std::to_string(n_tokens) + " tokens (" +
            s.what + ")",
        0, double(w_bytes + x_bytes), 2.0 * double(s.n_in) * double(s.n_out) * double(n_tokens)};
  r.microseconds = best_microseconds(stream, 10, 4, [&](int) {
    if (cublas) {
      const float alpha = 1.0f, beta = 0.0f;
      SPARROW_CUBLAS_CHECK(cublasGemmEx(cublas->h, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n_out), int(n_tokens), int(s.n_in),
                                        &alpha, w.p, element, int(s.n_in), x.p, element, int(s.n_in), &beta, y.p,
                                        CUDA_R_32F, int(s.n_out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      cuda::matmul_half(stream, type, w.as<uint16_t>(), s.n_in, s.n_out, x.as<uint16_t>(), n_tokens, y.as<float>());
    }
  });
  return r;
}

// One decode step's attention: one query token at the end of a full context of n_keys positions.
Row decode_attention(cudaStream_t stream, formats::KvCodec codec, int head_dim, int n_heads, int n_kv_heads,
                     int64_t n_keys) {
  const auto& info = formats::kv_codec_info(codec);
  const formats::KvCodec v_codec = info.keys_only ? formats::KvCodec::F16 : codec;
  const size_t k_block = info.block_bytes(head_dim), v_block = formats::kv_codec_info(v_codec).block_bytes(head_dim);
  const size_t n_blocks = size_t(n_keys) * size_t(n_kv_heads);
  const size_t k_bytes = n_blocks * k_block, v_bytes = n_blocks * v_block;
  const int copies = copies_beyond_l2(k_bytes + v_bytes);
  DeviceBuffer k(k_bytes * size_t(copies)), v(v_bytes * size_t(copies));
  {
    // Encoded from random vectors a chunk at a time.
    const size_t chunk = 8192;
    DeviceBuffer rows(chunk * size_t(head_dim) * sizeof(float));
    fill_random_floats(rows.as<float>(), chunk * size_t(head_dim), 3);
    for (size_t b = 0; b < n_blocks; b += chunk) {
      const int64_t n = int64_t(std::min(chunk, n_blocks - b));
      cuda::kv_encode(codec, head_dim, rows.as<float>(), n, k.as<uint8_t>() + b * k_block, stream);
      cuda::kv_encode(v_codec, head_dim, rows.as<float>(), n, v.as<uint8_t>() + b * v_block, stream);
    }
    for (int c = 1; c < copies; ++c) {
      SPARROW_CUDA_CHECK(cudaMemcpyAsync(k.as<uint8_t>() + size_t(c) * k_bytes, k.p, k_bytes, cudaMemcpyDeviceToDevice,
                                         stream));
      SPARROW_CUDA_CHECK(cudaMemcpyAsync(v.as<uint8_t>() + size_t(c) * v_bytes, v.p, v_bytes, cudaMemcpyDeviceToDevice,
                                         stream));
    }
  }
  DeviceBuffer q(size_t(n_heads) * head_dim * sizeof(float)), out(size_t(n_heads) * head_dim * sizeof(float));
  fill_random_floats(q.as<float>(), size_t(n_heads) * head_dim, 4);
  cuda::AttentionContext ctx(stream);
  AttentionArgs a;
  a.q = q.as<float>();
  a.out = out.as<float>();
  a.n_tokens = 1;
  a.n_heads = n_heads;
  a.first_position = int32_t(n_keys - 1);
  a.scale = 1.0f / 16.0f;
  a.kv.k_codec = codec;
  a.kv.v_codec = v_codec;
  a.kv.capacity = n_keys;
  a.kv.n_kv_heads = n_kv_heads;
  a.kv.head_dim = head_dim;
  Row r{"attention " + std::string(info.name) + "/" + std::string(formats::kv_codec_info(v_codec).name) + " d" +
            std::to_string(head_dim) + " " + std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) +
            " heads, context " + std::to_string(n_keys),
        0, double(n_blocks * (k_block + v_block))};
  r.microseconds = best_microseconds(stream, 10, std::max(copies, 8), [&](int c) {
    a.kv.k = k.as<uint8_t>() + size_t(c % copies) * k_bytes;
    a.kv.v = v.as<uint8_t>() + size_t(c % copies) * v_bytes;
    cuda::attention(ctx, a);
  });
  return r;
}

int run(int argc, char** argv) {
  std::string json_path;
  std::string only;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
    else if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else throw Error(std::string("unknown argument ") + argv[i] +
                     " (usage: sparrow_cuda_bench [--json FILE] [--quick] [--only gemv|attention|prefill])");
  }
  if (!only.empty() && only != "gemv" && only != "attention" && only != "prefill") {
    throw Error("--only takes gemv, attention or prefill, not " + only);
  }
  const auto wants = [&](const char* kind) { return only.empty() || only == kind; };
  const cuda::DeviceInfo device = cuda::device_info(0);
  cudaStream_t stream;
  SPARROW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const Row copy = copy_bandwidth(stream);
  std::vector<Row> rows;
  // Gemma 4 E2B (n_embd 1536, n_ff 6144, or 12288 in its double-width layers, 8 x 256 query dims) and E4B (2560,
  // 10240) decode shapes.
  std::vector<Shape> shapes = {{1536, 2048, "E2B attn_q"},  {2048, 1536, "E2B attn_output"},
                               {1536, 6144, "E2B ffn_up"},  {6144, 1536, "E2B ffn_down"},
                               {12288, 1536, "E2B ffn_down, double width"},
                               {2560, 10240, "E4B ffn_up"}, {10240, 2560, "E4B ffn_down"},
                               {1536, 262144, "E2B output"}};
  if (quick) shapes.resize(2);
  if (wants("gemv")) {
    for (TensorType type : {TensorType::F16, TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_K,
                            TensorType::Q5_K, TensorType::Q6_K})
      for (const Shape& s : shapes) rows.push_back(gemv(stream, type, s));
  }
  const std::vector<int64_t> contexts = quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 32768, 131072};
  if (wants("attention")) {
    for (formats::KvCodec codec : {formats::KvCodec::F16, formats::KvCodec::Q8_0, formats::KvCodec::Q4_0,
                                   formats::KvCodec::TBQ4, formats::KvCodec::TBQ3, formats::KvCodec::TCQ3})
      for (int head_dim : {256, 512})
        for (int64_t n_keys : contexts) rows.push_back(decode_attention(stream, codec, head_dim, 8, 1, n_keys));
  }
  std::vector<Row> prefill;
  if (wants("prefill")) {
    const CublasHandle cublas(stream);
    for (TensorType type : {TensorType::F16, TensorType::BF16})
      for (size_t i = 0; i < (quick ? size_t(1) : size_t(4)); ++i)
        for (const CublasHandle* by : {static_cast<const CublasHandle*>(nullptr), &cublas})
          prefill.push_back(prefill_gemm(stream, by, type, shapes[i], 512));
  }
  SPARROW_CUDA_CHECK(cudaStreamDestroy(stream));

  std::printf("# CUDA decode kernels on %s\n\ncopy bandwidth: %.0f GB/s (%s)\n\n", device.name.c_str(),
              copy.gb_per_s(), copy.kernel.c_str());
  std::printf("| kernel | us | MB read | GB/s | of copy bandwidth |\n|---|---:|---:|---:|---:|\n");
  for (const Row& r : rows)
    std::printf("| %s | %.1f | %.2f | %.0f | %.0f%% |\n", r.kernel.c_str(), r.microseconds, r.bytes / 1e6,
                r.gb_per_s(), 100 * r.gb_per_s() / copy.gb_per_s());
  if (!prefill.empty()) {
    std::printf("\n| prefill GEMM | us | TFLOP/s |\n|---|---:|---:|\n");
    for (const Row& r : prefill)
      std::printf("| %s | %.1f | %.1f |\n", r.kernel.c_str(), r.microseconds, r.tflop_per_s());
  }
  if (!json_path.empty()) {
    nlohmann::ordered_json j;
    j["device"] = device.name;
    j["copy_gb_per_s"] = copy.gb_per_s();
    for (const Row& r : rows)
      j["rows"].push_back({{"kernel", r.kernel}, {"microseconds", r.microseconds}, {"bytes", r.bytes},
                           {"gb_per_s", r.gb_per_s()}, {"of_copy", r.gb_per_s() / copy.gb_per_s()}});
    for (const Row& r : prefill)
      j["prefill"].push_back({{"kernel", r.kernel}, {"microseconds", r.microseconds}, {"flops", r.flops},
                              {"tflop_per_s", r.tflop_per_s()}});
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sparrow_cuda_bench: %s\n", e.what());
    return 1;
  }
}
