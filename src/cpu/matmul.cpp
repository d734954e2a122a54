// Matmul entry points: validate, quantize the activations once, then split the output rows (and, for a long
// prompt, the tokens) over the thread pool. The SIMD kernels live in matmul-inl.h, compiled per target.
// AVX3_DL (Ice Lake and later: AVX-512 with VNNI) as a target of its own, for the int8 dot-product kernels.
#define HWY_WANT_AVX3_DL
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/matmul-inl.h"

#if HWY_ONCE
#include <algorithm>
#include <string>
#include <vector>

#include <hwy/aligned_allocator.h>

#include "cpu/matmul.h"
#include "formats/weight_formats.h"
#include "formats/weight_interleave.h"
#include "util/error.h"

namespace sparrow::cpu {

HWY_EXPORT(MatmulRows);
HWY_EXPORT(QuantizeTokens);
HWY_EXPORT(GemmTokensPerVector);
HWY_EXPORT(PackTokenVectors);
HWY_EXPORT(GemmRows);
HWY_EXPORT(HasInterleavedKernel);

namespace {

size_t checked_row_bytes(const char* what, const WeightMatrix& w) {
  const TensorTypeInfo& geometry = formats::weight_format(w.type, what).geometry;
  if (w.n_in <= 0 || w.n_out <= 0 || w.n_in % geometry.block_elements != 0) {
    throw Error(std::string(what) + ": weight shape " + std::to_string(w.n_in) + " x " +
                std::to_string(w.n_out) + " does not fit " + std::string(geometry.name) +
                " (n_in must be a positive multiple of " + std::to_string(geometry.block_elements) + ")");
  }
  if (w.data == nullptr) throw Error(std::string(what) + ": weight data is null");
  return size_t(w.n_in / geometry.block_elements) * geometry.block_bytes;
}

constexpr size_t kActivationPadding = 16;

// Per-calling-thread scratch for quantized activations, grown as needed and reused across calls.
struct ActivationScratch {
  hwy::AlignedFreeUniquePtr<int16_t[]> q;
  hwy::AlignedFreeUniquePtr<int8_t[]> q8;
  std::vector<float> scale, scaled_sum32;
  hwy::AlignedFreeUniquePtr<float[]> pair_scale;
  hwy::AlignedFreeUniquePtr<int32_t[]> pair_sum;
  hwy::AlignedFreeUniquePtr<int16_t[]> sum16;
  size_t q_capacity = 0, pair_scale_capacity = 0, pair_sum_capacity = 0, sum16_capacity = 0;

  // Prompts are quantized in parallel, in chunks of tokens.
  QuantizedTokens quantize(ThreadPool& pool, const float* x, int64_t n_in, int64_t n_tokens,
                           formats::ActivationFormat format) {
    const int group = formats::activation_group(format);
    const size_t n = size_t(n_in * n_tokens);
    if (n > q_capacity) {
      q = hwy::AllocateAligned<int16_t>(n);
      q8 = hwy::AllocateAligned<int8_t>(n);
      q_capacity = n;
    }
    // Kernels read per-block activation data 8 blocks at a time, up to 7 entries past a row's end: pad with
    // zeros so that those reads stay in bounds and finite.
    const size_t n_scales = size_t(n_tokens * (n_in / group)), n_sums = size_t(n_tokens * (n_in / 32));
    scale.assign(n_scales + kActivationPadding, 0.0f);
    scaled_sum32.assign(n_sums + kActivationPadding, 0.0f);
    const size_t n_pair_lanes = size_t(n_tokens * block_pairs(n_in) * 16);
    grow(pair_scale, pair_scale_capacity, n_pair_lanes);
    grow(pair_sum, pair_sum_capacity, n_pair_lanes);
    grow(sum16, sum16_capacity, size_t(n_tokens * (n_in / 16)));
    const auto quantize_tokens = HWY_DYNAMIC_DISPATCH(QuantizeTokens);
    const int64_t groups = n_in / group, sums = n_in / 32, pair_lanes = block_pairs(n_in) * 16;
    const int64_t chunk = std::max<int64_t>(1, 16384 / n_in);  // tokens per task: ~64 KiB of floats
    pool.parallel_for((n_tokens + chunk - 1) / chunk, [&](int64_t task, int) {
      const int64_t t0 = task * chunk, n = std::min(chunk, n_tokens - t0);
      quantize_tokens(x + t0 * n_in, n_in, n, format, q.get() + t0 * n_in, q8.get() + t0 * n_in,
                      scale.data() + t0 * groups, scaled_sum32.data() + t0 * sums, pair_scale.get() + t0 * pair_lanes,
                      pair_sum.get() + t0 * pair_lanes, sum16.get() + t0 * (n_in / 16));
    });
    return QuantizedTokens{group,           q.get(),          q8.get(),   scale.data(), scaled_sum32.data(),
                           pair_scale.get(), pair_sum.get(), sum16.get()};
  }

  std::vector<float> rounded;
  std::vector<uint8_t> file_rows;  // a slab of an interleaved matrix's rows in the file's layout, for the GEMM
  const float* round_to(formats::ActivationFormat format, const float* x, int64_t n) {
    rounded.resize(size_t(n));
    formats::round_activations(format, x, n, rounded.data());
    return rounded.data();
  }

  // Buffers for n_tokens packed tokens.
  hwy::AlignedFreeUniquePtr<int16_t[]> packed_q;
  hwy::AlignedFreeUniquePtr<float[]> packed_scale, packed_sums;
  hwy::AlignedFreeUniquePtr<uint8_t[]> packed_quads;
  size_t packed_q_capacity = 0, packed_scale_capacity = 0, packed_sums_capacity = 0, packed_quads_capacity = 0;

  PackedTokens packed(int64_t n_tokens, int64_t n_in, int group) {
    grow(packed_q, packed_q_capacity, size_t(n_tokens * n_in));
    grow(packed_scale, packed_scale_capacity, size_t(n_tokens * (n_in / group)));
    grow(packed_sums, packed_sums_capacity, size_t(n_tokens * (n_in / 16)));  // per 16 elements at most
    grow(packed_quads, packed_quads_capacity, size_t(n_tokens * n_in));
    return PackedTokens{packed_q.get(), packed_scale.get(), packed_sums.get(), packed_quads.get()};
  }

  template <typename T>
  static void grow(hwy::AlignedFreeUniquePtr<T[]>& buffer, size_t& capacity, size_t n) {
    if (n <= capacity) return;
    buffer = hwy::AllocateAligned<T>(n);
    capacity = n;
  }
};

// Interleaved matrices come in whole groups of eight rows of a type with that layout.
void check_interleaving(const char* what, const WeightMatrix& w) {
  if (w.interleaved && (!formats::has_interleaved_layout(w.type) || w.n_out % formats::kInterleavedRows != 0)) {
    throw Error(std::string(what) + ": interleaved rows come in groups of " + std::to_string(formats::kInterleavedRows) +
                " of a type with that layout, not " + std::string(tensor_type_info(w.type)->name) + " x " +
                std::to_string(w.n_out) + " rows");
  }
}

// Rows [row_begin, row_end) of an interleaved matrix (row_bytes per row in the file's layout) back in that
// layout, one after another at out.
void deinterleave_rows(TensorType type, const uint8_t* data, int64_t n_in, size_t row_bytes, int64_t row_begin,
                       int64_t row_end, uint8_t* out) {
  const int64_t n_blocks = n_in / tensor_type_info(type)->block_elements;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* group = data + size_t(r / formats::kInterleavedRows) * formats::kInterleavedRows * row_bytes;
    formats::deinterleave_row(type, group, n_blocks, int(r % formats::kInterleavedRows), out + size_t(r - row_begin) * row_bytes);
  }
}

// For the kernels that read the file's layout: a job over `rows` (that layout) standing for the rows from
// row_begin of an interleaved job's matrix; its row 0 is row_begin, and its outputs land at their place in y.
MatmulJob job_over_file_rows(const MatmulJob& job, const uint8_t* rows, int64_t row_begin) {
  MatmulJob plain = job;
  plain.weights = rows;
  plain.interleaved = false;
  plain.y = job.y + row_begin;  // y keeps its stride of n_out
  return plain;
}

// Rows per task: enough tasks for load balance (a few per thread), few enough that each task's rows are
// worth the hand-off; a multiple of 4 keeps neighbouring rows of one task in one cache line run.
int64_t rows_per_task(int64_t n_out, int n_threads, int64_t multiple) {
  if (n_threads <= 1) return n_out;
  const int64_t target_tasks = int64_t(n_threads) * 8;
  const int64_t rows = std::clamp<int64_t>((n_out + target_tasks - 1) / target_tasks, 4, 256);
  return (rows + multiple - 1) / multiple * multiple;
}

// Tasks split interleaved matrices at group boundaries.
int64_t task_row_multiple(const MatmulJob& job) { return job.interleaved ? formats::kInterleavedRows : 1; }

// Tokens per task for prompt processing: a tile of tokens is multiplied against a row chunk that stays in
// cache; tiles bound the activation footprint (bytes of int16 activations) to about a quarter of L2.
int64_t tokens_per_task(int64_t n_tokens, int64_t n_in) {
  const int64_t budget_bytes = 256 * 1024;
  const int64_t fit = std::max<int64_t>(4, budget_bytes / (2 * n_in) / 4 * 4);
  return std::min(n_tokens, fit);
}

// The GEMM over rows [0, n_rows) of job and all n_vectors token vectors, split into tasks.
void gemm_row_range(ThreadPool& pool, const MatmulJob& job, const PackedTokens& packed, int64_t n_rows,
                    int64_t n_vectors, int64_t tokens_per_vector) {
  // Tasks: row chunks x token-vector chunks; a chunk's packed activations stay in L2 (about 256 KiB).
  const int64_t vector_bytes = tokens_per_vector * job.n_in * 2;
  const int64_t vectors_per_task =
      std::max<int64_t>(kGemmVectorsPerTile, (256 * 1024 / vector_bytes) / kGemmVectorsPerTile * kGemmVectorsPerTile);
  const int64_t token_tasks = (n_vectors + vectors_per_task - 1) / vectors_per_task;
  // About 8 tasks per thread in all; row chunks a multiple of 4 rows (the GEMM's row block on AVX-512).
  const int64_t row_chunks = std::max<int64_t>(1, (8 * pool.size() + token_tasks - 1) / token_tasks);
  const int64_t row_step = std::max<int64_t>(4, ((n_rows + row_chunks - 1) / row_chunks + 3) / 4 * 4);
  const int64_t row_tasks = (n_rows + row_step - 1) / row_step;
  const auto gemm = HWY_DYNAMIC_DISPATCH(GemmRows);
  pool.parallel_for(row_tasks * token_tasks, [&](int64_t task, int) {
    const int64_t r0 = (task % row_tasks) * row_step, v0 = (task / row_tasks) * vectors_per_task;
    gemm(job, packed, r0, std::min(n_rows, r0 + row_step), v0, std::min(n_vectors, v0 + vectors_per_task));
  });
}

// Prompt processing: the first n_gemm tokens (whole GEMM tiles) through the GEMM with packed activations.
void matmul_gemm(ThreadPool& pool, const MatmulJob& job, int64_t tokens_per_vector, int64_t n_gemm,
                 ActivationScratch& scratch) {
  const int64_t n_in = job.n_in, n_vectors = n_gemm / tokens_per_vector;
  const PackedTokens packed = scratch.packed(n_gemm, n_in, job.xq.group);
  const auto pack = HWY_DYNAMIC_DISPATCH(PackTokenVectors);
  pool.parallel_for(n_vectors, [&](int64_t tv, int) { pack(job.type, job.xq, n_in, tv, tv + 1, packed); });
  if (!job.interleaved) return gemm_row_range(pool, job, packed, job.n_out, n_vectors, tokens_per_vector);

  // The GEMM reads rows in the file's layout: an interleaved matrix goes back to it a slab of about 4 MiB at a
  // time, each slab once for all the tokens.
  const int64_t slab_rows =
      std::max<int64_t>(formats::kInterleavedRows, int64_t(4 << 20) / int64_t(job.row_bytes) / formats::kInterleavedRows * formats::kInterleavedRows);
  for (int64_t r0 = 0; r0 < job.n_out; r0 += slab_rows) {
    const int64_t n_rows = std::min(slab_rows, job.n_out - r0);
    scratch.file_rows.resize(size_t(n_rows) * job.row_bytes);
    pool.parallel_for(n_rows / formats::kInterleavedRows, [&](int64_t g, int) {
      const int64_t first = g * formats::kInterleavedRows;
      deinterleave_rows(job.type, job.weights, job.n_in, job.row_bytes, r0 + first, r0 + first + formats::kInterleavedRows,
                        scratch.file_rows.data() + size_t(first) * job.row_bytes);
    });
    gemm_row_range(pool, job_over_file_rows(job, scratch.file_rows.data(), r0), packed, n_rows, n_vectors, tokens_per_vector);
  }
}

// Tokens [token_begin, n_tokens) with the per-row kernels.
void matmul_rows(ThreadPool& pool, const MatmulJob& job, int64_t token_begin) {
  const int64_t n_tokens = job.n_tokens - token_begin;
  if (n_tokens <= 0) return;
  const int64_t row_step = rows_per_task(job.n_out, pool.size(), task_row_multiple(job));
  const int64_t token_step = tokens_per_task(n_tokens, job.n_in);
  const int64_t row_tasks = (job.n_out + row_step - 1) / row_step;
  const int64_t token_tasks = (n_tokens + token_step - 1) / token_step;
  const auto run = HWY_DYNAMIC_DISPATCH(MatmulRows);
  const bool reads_interleaved = job.interleaved && HWY_DYNAMIC_DISPATCH(HasInterleavedKernel)(job.type);
  pool.parallel_for(row_tasks * token_tasks, [&](int64_t task, int) {
    const int64_t r0 = (task % row_tasks) * row_step, r1 = std::min(job.n_out, r0 + row_step);
    const int64_t t0 = token_begin + (task / row_tasks) * token_step, t1 = std::min(job.n_tokens, t0 + token_step);
    if (reads_interleaved || !job.interleaved) return run(job, r0, r1, t0, t1);
    static thread_local std::vector<uint8_t> file_rows;
    file_rows.resize(size_t(r1 - r0) * job.row_bytes);
    deinterleave_rows(job.type, job.weights, job.n_in, job.row_bytes, r0, r1, file_rows.data());
    run(job_over_file_rows(job, file_rows.data(), r0), 0, r1 - r0, t0, t1);
  });
}

}  // namespace

void matmul(ThreadPool& pool, const WeightMatrix& w, const float* x, int64_t n_tokens, float* y) {
  const size_t row_bytes = checked_row_bytes("matmul", w);
  if (n_tokens <= 0) return;
  static thread_local ActivationScratch scratch;
  // Activations as ggml multiplies them with this weight type (formats::ActivationFormat), so that Sparrow's
  // logits match llama.cpp's: rounded to f16 / bf16 for those weights, 8-bit quantized for block types.
  const formats::ActivationFormat activation = formats::weight_format(w.type, "matmul").activation;
  if (activation == formats::ActivationFormat::F16 || activation == formats::ActivationFormat::BF16) {
    x = scratch.round_to(activation, x, w.n_in * n_tokens);
  }
  check_interleaving("matmul", w);
  MatmulJob job{w.type, static_cast<const uint8_t*>(w.data), row_bytes, w.interleaved, w.n_in, w.n_out, n_tokens, x, {}, y};
  int64_t n_gemm = 0;
  if (formats::activation_group(activation) != 0) {
    job.xq = scratch.quantize(pool, x, w.n_in, n_tokens, activation);
    const int64_t per_vector = int64_t(HWY_DYNAMIC_DISPATCH(GemmTokensPerVector)());
    const int64_t per_tile = per_vector * kGemmVectorsPerTile;
    if (per_tile > 0 && n_tokens >= per_tile) {
      n_gemm = n_tokens / per_tile * per_tile;
      matmul_gemm(pool, job, per_vector, n_gemm, scratch);
    }
  }
  matmul_rows(pool, job, n_gemm);
}

bool matmul_interleaves(TensorType type) { return HWY_DYNAMIC_DISPATCH(HasInterleavedKernel)(type); }

void get_rows(const WeightMatrix& w, const int32_t* ids, int64_t n_ids, float* out) {
  const size_t row_bytes = checked_row_bytes("get_rows", w);
  check_interleaving("get_rows", w);
  const auto* data = static_cast<const uint8_t*>(w.data);
  std::vector<uint8_t> file_row(w.interleaved ? row_bytes : 0);
  for (int64_t r = 0; r < n_ids; ++r) {
    if (ids[r] < 0 || ids[r] >= w.n_out) {
      throw Error("get_rows: row id " + std::to_string(ids[r]) + " out of range [0, " +
                  std::to_string(w.n_out) + ")");
    }
    const uint8_t* row = data + size_t(ids[r]) * row_bytes;
    if (w.interleaved) {
      deinterleave_rows(w.type, data, w.n_in, row_bytes, ids[r], ids[r] + 1, file_row.data());
      row = file_row.data();
    }
    formats::dequantize_row(w.type, row, out + r * w.n_in, w.n_in);
  }
}

}  // namespace sparrow::cpu
#endif  // HWY_ONCE
