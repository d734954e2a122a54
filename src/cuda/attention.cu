// KV-cache writes and fused attention on the GPU: the launch planning behind src/cuda/attention.h. The kernels
// are in src/cuda/attention/; the codecs enter as compile-time parameters through with_device_codec.
#include "cuda/attention.h"

#include <algorithm>
#include <string>

#include "cuda/attention/flash_kernel.cuh"
#include "cuda/attention/flash_launch.h"
#include "cuda/attention/row_kernels.cuh"
#include "cuda/attention/shared_memory.h"
#include "cuda/cuda_check.h"
#include "cuda/kv/codecs.cuh"
#include "util/error.h"

namespace sparrow::cuda {

using formats::KvCodec;
using formats::kv_codec_info;

// ---------------------------------------------------------------------------------------------------------
// Context

AttentionContext::AttentionContext(cudaStream_t stream)
    : stream_(stream), prepared_(stream), partial_acc_(stream), partial_state_(stream), split_counters_(stream) {
  int device = 0, multiprocessors = 0, max_shared = 0;
  SPARROW_CUDA_CHECK(cudaGetDevice(&device));
  SPARROW_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  SPARROW_CUDA_CHECK(cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  multiprocessors_ = multiprocessors;
  max_shared_bytes_ = size_t(max_shared);
}

namespace {

void check_geometry(const char* op, const KvLayerView& kv) {
  if (!formats::kv_head_dim_supported(kv.head_dim))
    throw Error(std::string(op) + ": head dim " + std::to_string(kv.head_dim) +
                " is not supported (64, 128, 256 or 512)");
  if (kv.n_kv_heads <= 0) throw Error(std::string(op) + ": n_kv_heads must be positive");
  if (kv.capacity <= 0) throw Error(std::string(op) + ": the KV cache has no slots");
  if (!kv.k || !kv.v) throw Error(std::string(op) + ": the KV cache has no memory");
  if (kv_codec_info(kv.v_codec).keys_only)
    throw Error(std::string(op) + ": " + std::string(kv_codec_info(kv.v_codec).name) +
                " stores keys only and cannot hold V");
}

// ---------------------------------------------------------------------------------------------------------
// kv_store

// Encodes rows first_row.. (n_kept of them) of k, and of v where given (it then has k's codec), with codec
// `codec`: one launch.
void store_rows(KvCodec codec, const KvLayerView& kv, const rows::StoreRows& k, const rows::StoreRows* v,
                int64_t first_row, int64_t n_kept, DevicePosition first_position, cudaStream_t stream) {
  const int64_t block_bytes = int64_t(kv_codec_info(codec).block_bytes(kv.head_dim));
  with_device_codec(codec, [&](auto c) {
    constexpr KvCodec C = decltype(c)::value;
    const size_t shared = sizeof(float) * size_t(kv.head_dim + DeviceCodec<C>::smem_floats(kv.head_dim));
    allow_shared_bytes(rows::store_kernel<C>, shared);
    const dim3 grid(unsigned(n_kept * kv.n_kv_heads), v ? 2 : 1);
    rows::store_kernel<C><<<grid, rows::kThreads, shared, stream>>>(k, v ? *v : k, first_row, first_position,
                                                                    kv.n_kv_heads, kv.head_dim, kv.capacity,
                                                                    block_bytes);
    SPARROW_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void kv_store(const KvLayerView& kv, const float* k, const float* v, int64_t n_tokens, DevicePosition first_position,
              cudaStream_t stream) {
  check_geometry("kv_store", kv);
  if (n_tokens < 0 || first_position.value < 0) throw Error("kv_store: negative token count or position");
  if (n_tokens == 0) return;
  // A batch longer than a ring keeps only its last `capacity` tokens: two CTAs writing one slot could finish in
  // either order.
  const int64_t first_kept = std::max<int64_t>(0, n_tokens - kv.capacity);
  const int64_t n_kept = n_tokens - first_kept;
  const rows::StoreRows keys{k, kv.k_center, static_cast<uint8_t*>(kv.k)};
  const rows::StoreRows values{v, nullptr, static_cast<uint8_t*>(kv.v)};
  if (kv.k_codec == kv.v_codec)
    return store_rows(kv.k_codec, kv, keys, &values, first_kept, n_kept, first_position, stream);
  store_rows(kv.k_codec, kv, keys, nullptr, first_kept, n_kept, first_position, stream);
  store_rows(kv.v_codec, kv, values, nullptr, first_kept, n_kept, first_position, stream);
}

// ---------------------------------------------------------------------------------------------------------
// attention

namespace {

// Keys per split at the least: one 32-key tile. A short decode context (one KV head, a few hundred keys) took
// 15 us in one CTA at 128 (H100 profile, 2026-12-05) while the GPU idled; splits of a tile spread it out.
constexpr int64_t kMinKeysPerSplit = 32;
constexpr int kCtasPerMultiprocessor = 2;  // CTAs per SM decode aims for, so one waits on memory while one computes

void check(const AttentionArgs& a) {
  check_geometry("attention", a.kv);
  if (a.n_heads <= 0 || a.n_heads % a.kv.n_kv_heads != 0)
    throw Error("attention: n_heads (" + std::to_string(a.n_heads) + ") must be a multiple of n_kv_heads (" +
                std::to_string(a.kv.n_kv_heads) + ")");
  if (a.n_tokens < 0 || a.first_position < 0) throw Error("attention: negative token count or position");
  if (!a.q || !a.out) throw Error("attention: null query or output");
}

// Rows per CTA and keys per tile: whole GQA groups of up to kMaxRows rows, 32 keys per tile (one per lane), and
// both shrunk until the shared memory fits (long basis rows, as tbq4p's 2 x 512 floats, need 16-key tiles).
void choose_tiles(const AttentionContext& ctx, flash::Params& p) {
  const int64_t total_rows = p.n_tokens * p.group;
  int rows = p.group <= flash::kMaxRows ? p.group * (flash::kMaxRows / p.group) : flash::kMaxRows;
  rows = int(std::min<int64_t>(rows, total_rows));
  auto fits = [&](int r, int keys) {
    return flash::SharedLayout(r, keys, p.k_floats, p.v_floats).bytes() <= ctx.max_shared_bytes();
  };
  int keys = fits(rows, 32) ? 32 : 16;
  while (!fits(rows, keys) && rows > 1) rows = rows > p.group ? rows - p.group : rows / 2;
  if (!fits(rows, keys))
    throw Error("attention: basis rows of " + std::to_string(p.k_floats) + " (K) and " + std::to_string(p.v_floats) +
                " (V) floats do not fit in shared memory");
  p.rows_per_cta = rows;
  p.keys_per_tile = keys;
  p.n_row_blocks = int32_t((total_rows + rows - 1) / rows);
}

// Splits of each CTA's key range (flash-decoding): enough CTAs to fill the GPU, each with at least
// kMinKeysPerSplit keys. Prefill has enough row blocks to fill it and gets one split.
int32_t choose_splits(const AttentionContext& ctx, const flash::Params& p) {
  const int64_t ctas = int64_t(p.n_row_blocks) * (p.n_heads / p.group);
  const int64_t tokens_per_cta = (p.rows_per_cta + p.group - 1) / p.group + 1;
  const int64_t context = p.first_position.value + p.n_tokens;
  const int64_t longest_range =
      p.sliding_window > 0 ? std::min<int64_t>(context, p.sliding_window + tokens_per_cta) : context;
  const int64_t wanted = (int64_t(kCtasPerMultiprocessor) * ctx.multiprocessors() + ctas - 1) / ctas;
  return int32_t(std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, longest_range / kMinKeysPerSplit)));
}

// Decode over a short context has too few keys to split and too few row blocks to fill the GPU (at depth 0 of
// E2B, one CTA for the 8 query heads of its one KV head: 14 us on an H100, 2026-12-06). Smaller row blocks, down
// to one row, give more CTAs, each expanding the same few K and V tiles for fewer rows.
void spread_short_contexts(const AttentionContext& ctx, flash::Params& p) {
  const int64_t wanted = int64_t(kCtasPerMultiprocessor) * ctx.multiprocessors();
  const int64_t total_rows = p.n_tokens * p.group;
  while (p.rows_per_cta > 1 && int64_t(p.n_splits) * p.n_row_blocks * (p.n_heads / p.group) < wanted) {
    p.rows_per_cta /= 2;
    p.n_row_blocks = int32_t((total_rows + p.rows_per_cta - 1) / p.rows_per_cta);
    p.n_splits = choose_splits(ctx, p);
  }
}

// Whether attention is one launch: the flash kernel's CTAs prepare their own queries and the last CTA of each
// row block merges its splits (flash_kernel.cuh), saving prepare_query_kernel's and merge_kernel's launches. Each
// CTA of a row block prepares all its rows, so this pays when a row block has few CTAs and rows: the split count
// times the rows per CTA bounds both the repeated preparing and the partials one CTA merges. Long decode contexts,
// split over hundreds of CTAs per row block, keep the two row kernels, which spread that work one CTA per row.
constexpr int64_t kMaxOneLaunchPartials = 64;

void choose_one_launch(AttentionContext& ctx, const AttentionArgs& a, flash::Params& p) {
  p.one_launch = false;
  p.one_launch_floats = 0;
  p.splits_done = nullptr;
  if (int64_t(p.n_splits) * p.rows_per_cta > kMaxOneLaunchPartials) return;
  int prepare_scratch = 0, finish_scratch = 0;
  with_device_codec(a.kv.k_codec, [&](auto k) { prepare_scratch = DeviceCodec<decltype(k)::value>::smem_floats(p.head_dim); });
  with_device_codec(a.kv.v_codec, [&](auto v) { finish_scratch = DeviceCodec<decltype(v)::value>::smem_floats(p.head_dim); });
  const flash::SharedLayout tiles(p.rows_per_cta, p.keys_per_tile, p.k_floats, p.v_floats);
  const int prepare_floats = tiles.k_rows + p.head_dim + prepare_scratch;
  const int merge_floats = flash::round_up4(p.rows_per_cta * p.n_splits) + p.v_floats + p.head_dim + finish_scratch;
  const int floats = std::max(prepare_floats, merge_floats);
  if (sizeof(float) * size_t(std::max(floats, tiles.total)) > ctx.max_shared_bytes()) return;
  p.one_launch = true;
  p.one_launch_floats = floats;
  if (p.n_splits > 1) p.splits_done = ctx.split_counters(size_t(p.n_row_blocks) * p.n_heads / p.group);
}

flash::Params plan(AttentionContext& ctx, const AttentionArgs& a, const int32_t* first_position_at) {
  const int d = a.kv.head_dim;
  flash::Params p{};
  p.k_cache = static_cast<const uint8_t*>(a.kv.k);
  p.v_cache = static_cast<const uint8_t*>(a.kv.v);
  p.capacity = a.kv.capacity;
  p.k_block_bytes = int64_t(kv_codec_info(a.kv.k_codec).block_bytes(d));
  p.v_block_bytes = int64_t(kv_codec_info(a.kv.v_codec).block_bytes(d));
  p.n_tokens = a.n_tokens;
  p.head_dim = d;
  p.k_floats = int32_t(kv_codec_info(a.kv.k_codec).query_floats(d));
  p.v_floats = int32_t(kv_codec_info(a.kv.v_codec).accumulator_floats(d));
  p.n_heads = a.n_heads;
  p.group = a.n_heads / a.kv.n_kv_heads;
  p.first_position = DevicePosition(a.first_position, first_position_at);
  p.sliding_window = a.sliding_window;
  // The score loop reads float4s of slices of a K row; the accumulator gives each thread float4 columns.
  if (p.k_floats % 64 != 0 || p.v_floats % 4 != 0 || p.v_floats > flash::kMaxAccumulatorFloats ||
      flash::kThreads % (p.v_floats / 4) != 0)
    throw Error("attention: basis rows of " + std::to_string(p.k_floats) + " (K) and " + std::to_string(p.v_floats) +
                " (V) floats are not supported by the CUDA kernels");
  choose_tiles(ctx, p);
  p.n_splits = choose_splits(ctx, p);
  spread_short_contexts(ctx, p);
  const size_t n_rows = size_t(a.n_tokens) * a.n_heads;
  p.partial_acc = ctx.partial_accumulators(size_t(p.n_splits) * n_rows * p.v_floats);
  p.partial_state = reinterpret_cast<float2*>(ctx.partial_states(2 * size_t(p.n_splits) * n_rows));
  p.q = a.q;
  p.scale = a.scale;
  p.out = a.out;
  choose_one_launch(ctx, a, p);
  return p;
}

// prepared[row] = scale * prepare_query(q[row]): the queries enter the K basis once per call.
void prepare_queries(const AttentionArgs& a, const flash::Params& p, float* prepared, cudaStream_t stream) {
  with_device_codec(a.kv.k_codec, [&](auto k) {
    constexpr KvCodec K = decltype(k)::value;
    const size_t shared = sizeof(float) * size_t(p.head_dim + p.k_floats + DeviceCodec<K>::smem_floats(p.head_dim));
    allow_shared_bytes(rows::prepare_query_kernel<K>, shared);
    rows::prepare_query_kernel<K><<<unsigned(a.n_tokens * a.n_heads), rows::kThreads, shared, stream>>>(
        a.q, p.head_dim, p.k_floats, a.scale, prepared);
    SPARROW_CUDA_CHECK_LAUNCH();
  });
}

void run_flash(const AttentionArgs& a, const flash::Params& p, cudaStream_t stream) {
  const int64_t n_ctas = int64_t(p.n_splits) * p.n_row_blocks * a.kv.n_kv_heads;
  const size_t shared = std::max(flash::SharedLayout(p.rows_per_cta, p.keys_per_tile, p.k_floats, p.v_floats).bytes(),
                                 sizeof(float) * size_t(p.one_launch_floats));
  using Launch = void (*)(KvCodec, KvCodec, const flash::Params&, unsigned, size_t, cudaStream_t);
  static_assert(flash::kShards == 4, "one entry per flash_shard_*.cu");
  static constexpr Launch kLaunch[flash::kShards] = {flash::launch_shard<0>, flash::launch_shard<1>,
                                                     flash::launch_shard<2>, flash::launch_shard<3>};
  kLaunch[flash::shard_of(a.kv.k_codec)](a.kv.k_codec, a.kv.v_codec, p, unsigned(n_ctas), shared, stream);
}

void merge_splits(const AttentionArgs& a, const flash::Params& p, cudaStream_t stream) {
  const int64_t n_rows = a.n_tokens * a.n_heads;
  with_device_codec(a.kv.v_codec, [&](auto v) {
    constexpr KvCodec V = decltype(v)::value;
    const size_t shared =
        sizeof(float) * size_t(p.v_floats + p.head_dim + DeviceCodec<V>::smem_floats(p.head_dim) + p.n_splits);
    allow_shared_bytes(rows::merge_kernel<V>, shared);
    rows::merge_kernel<V><<<unsigned(n_rows), rows::kThreads, shared, stream>>>(
        p.partial_acc, p.partial_state, p.n_splits, n_rows, p.head_dim, p.v_floats, a.out);
    SPARROW_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void attention(AttentionContext& ctx, const AttentionArgs& args, const int32_t* first_position_at) {
  check(args);
  if (args.n_tokens == 0) return;
  flash::Params p = plan(ctx, args, first_position_at);
  if (p.one_launch) {
    run_flash(args, p, ctx.stream());
    return;
  }
  float* prepared = ctx.prepared_queries(size_t(args.n_tokens) * args.n_heads * p.k_floats);
  p.prepared = prepared;
  prepare_queries(args, p, prepared, ctx.stream());
  run_flash(args, p, ctx.stream());
  merge_splits(args, p, ctx.stream());
}

AttentionLaunch plan_attention(AttentionContext& ctx, const AttentionArgs& args) {
  check(args);
  if (args.n_tokens == 0) return {};
  const flash::Params p = plan(ctx, args, nullptr);
  const void* prepared =
      p.one_launch ? nullptr : ctx.prepared_queries(size_t(args.n_tokens) * args.n_heads * p.k_floats);
  return {p.n_splits, p.rows_per_cta, prepared, p.partial_acc, p.partial_state, p.splits_done};
}

}  // namespace sparrow::cuda
