// Device sampling (sampling.h). Candidates are ordered by a 64-bit key, the logit's order-preserving bits
// above the complement of the id, so that the key order is the CPU sampler's order (descending logit, lowest id
// first among equal logits) and no two keys are equal:
//   greedy: one pass, each block's largest key merged with atomicMax; the key's low half names the id.
//   top-k <= kMaxSelected: radix selection of the k largest keys, 12 bits per pass from the top (a histogram
//     of the next digit among the keys that share the digits chosen so far, then the digit where the count
//     from the top reaches k); it stops as soon as every key at or above the chosen prefix fits kMaxSelected,
//     which for real logits is after one or two passes. Those keys are gathered and sorted in one block.
//   larger top-k, or none: cub's radix sort of the whole vocabulary (stable, so equal logits keep id order).
// Then one block walks the sorted candidates: top-p, min-p, temperature, and the inverse CDF at u.
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/sampling.h"
#include "util/error.h"

namespace sparrow::cuda {
namespace {

constexpr int kDigitBits = 12;
constexpr int kDigitBins = 1 << kDigitBits;
constexpr int kSelectPasses = (64 + kDigitBits - 1) / kDigitBits;
constexpr int kCountThreads = 256;
constexpr int kChooseThreads = 1024;
constexpr int kBinsPerThread = kDigitBins / kChooseThreads;
constexpr int kSortThreads = 1024;
constexpr int kPickThreads = 1024;
constexpr int kItemsPerCountThread = 4;
constexpr int kBlocksPerMultiprocessor = 2;

// A float's bits, reordered so that unsigned comparison is float comparison (-0 counted as +0, which the CPU's
// comparisons treat as equal).
__device__ uint32_t order_bits(float logit) {
  const uint32_t bits = __float_as_uint(logit == 0.0f ? 0.0f : logit);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}
__device__ float logit_of(uint32_t order) {
  return __uint_as_float((order & 0x80000000u) ? order & 0x7fffffffu : ~order);
}
__device__ unsigned long long candidate_key(float logit, int32_t id) {
  return (static_cast<unsigned long long>(order_bits(logit)) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}
int32_t id_of_key(unsigned long long key) { return int32_t(~uint32_t(key)); }

unsigned grid_for(int multiprocessors, int64_t n, int threads, int items_per_thread) {
  const int64_t wanted = (n + int64_t(threads) * items_per_thread - 1) / (int64_t(threads) * items_per_thread);
  return unsigned(std::clamp<int64_t>(wanted, 1, int64_t(multiprocessors) * kBlocksPerMultiprocessor));
}

// ---- greedy -------------------------------------------------------------------------------------------------

__device__ unsigned long long warp_max(unsigned long long v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__global__ void argmax_kernel(const float* logits, int32_t n, unsigned long long* best) {
  __shared__ unsigned long long warp_best[32];
  unsigned long long local = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    local = max(local, candidate_key(logits[i], int32_t(i)));
  local = warp_max(local);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_best[warp] = local;
  __syncthreads();
  if (warp == 0) {
    local = warp_max(lane < int(blockDim.x >> 5) ? warp_best[lane] : 0);
    if (lane == 0) atomicMax(best, local);
  }
}

// ---- top-k by radix selection -------------------------------------------------------------------------------

struct SelectState {
  unsigned long long prefix;  // the digits chosen so far, from the top
  int32_t prefix_bits;
  int32_t above;        // keys greater than every key with this prefix: all among the k largest
  int32_t done;         // the keys at or above the prefix number at most kMaxSelected: gather them
  uint32_t n_gathered;
};

// Pass p reads bits [shift, shift + bits) of the key, counting from the top.
int pass_bits(int pass) { return std::min(kDigitBits, 64 - pass * kDigitBits); }
int pass_shift(int pass) { return 64 - pass * kDigitBits - pass_bits(pass); }

__device__ bool has_prefix(unsigned long long key, const SelectState& s) {
  return s.prefix_bits == 0 || (key >> (64 - s.prefix_bits)) == s.prefix;
}

// Histogram of the pass's digit over the keys that carry the prefix: per block in shared memory, then added to
// the pass's global histogram.
__global__ void count_digits(const float* logits, int32_t n, const SelectState* state, int shift, int bits,
                             uint32_t* histogram) {
  __shared__ uint32_t bins[kDigitBins];
  const SelectState s = *state;
  if (s.done) return;
  for (int b = threadIdx.x; b < kDigitBins; b += blockDim.x) bins[b] = 0;
  __syncthreads();
  const unsigned long long mask = (1ull << bits) - 1;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const unsigned long long key = candidate_key(logits[i], int32_t(i));
    if (has_prefix(key, s)) atomicAdd(&bins[(key >> shift) & mask], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kDigitBins; b += blockDim.x)
    if (bins[b]) atomicAdd(&histogram[b], bins[b]);
}

// One block: the digit whose bin holds the k-th largest key. Thread t holds the bins of descending ranks
// t * kBinsPerThread.., so an inclusive scan gives, per bin, the keys at or above it.
__global__ void choose_digit(const uint32_t* histogram, int32_t k, int bits, SelectState* state) {
  using Scan = cub::BlockScan<uint32_t, kChooseThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const SelectState s = *state;  // read by every thread before the one that finds the digit writes
  if (s.done) return;
  const int n_bins = 1 << bits;
  uint32_t counts[kBinsPerThread], at_or_above[kBinsPerThread];
  for (int j = 0; j < kBinsPerThread; ++j) {
    const int rank = threadIdx.x * kBinsPerThread + j;
    counts[j] = rank < n_bins ? histogram[n_bins - 1 - rank] : 0;
  }
  Scan(scan_storage).InclusiveSum(counts, at_or_above);
  const uint32_t remaining = uint32_t(k - s.above);
  for (int j = 0; j < kBinsPerThread; ++j) {
    const uint32_t strictly_above = at_or_above[j] - counts[j];
    if (strictly_above < remaining && at_or_above[j] >= remaining) {
      const unsigned long long digit = n_bins - 1 - (threadIdx.x * kBinsPerThread + j);
      const int32_t above = s.above + int32_t(strictly_above);
      state->above = above;
      state->prefix = (s.prefix << bits) | digit;
      state->prefix_bits = s.prefix_bits + bits;
      state->done = int64_t(above) + counts[j] <= DeviceSampler::kMaxSelected;
    }
  }
}

__global__ void gather_candidates(const float* logits, int32_t n, SelectState* state,
                                  unsigned long long* candidates) {
  const unsigned long long prefix = state->prefix;
  const int drop = 64 - state->prefix_bits;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const unsigned long long key = candidate_key(logits[i], int32_t(i));
    if ((key >> drop) >= prefix) candidates[atomicAdd(&state->n_gathered, 1u)] = key;
  }
}

// One block: bitonic sort, descending, of the gathered keys (padded with 0, which no candidate key equals: the
// complemented id sets bit 31); the first k become the sorted candidates.
__global__ void __launch_bounds__(kSortThreads) sort_candidates(const SelectState* state, const unsigned long long* candidates, int32_t k,
                                uint32_t* sorted_keys, int32_t* sorted_ids) {
  __shared__ unsigned long long keys[DeviceSampler::kMaxSelected];
  const uint32_t count = min(state->n_gathered, uint32_t(DeviceSampler::kMaxSelected));
  uint32_t size = 1;
  while (size < count) size <<= 1;
  for (uint32_t i = threadIdx.x; i < size; i += blockDim.x) keys[i] = i < count ? candidates[i] : 0;
  __syncthreads();
  for (uint32_t width = 2; width <= size; width <<= 1) {
    for (uint32_t stride = width / 2; stride > 0; stride >>= 1) {
      for (uint32_t i = threadIdx.x; i < size; i += blockDim.x) {
        const uint32_t partner = i ^ stride;
        if (partner <= i) continue;
        const bool descending = (i & width) == 0;
        const unsigned long long a = keys[i], b = keys[partner];
        if ((a < b) == descending) {
          keys[i] = b;
          keys[partner] = a;
        }
      }
      __syncthreads();
    }
  }
  for (int32_t r = threadIdx.x; r < k; r += blockDim.x) {
    sorted_keys[r] = uint32_t(keys[r] >> 32);
    sorted_ids[r] = int32_t(~uint32_t(keys[r]));
  }
}

// ---- the whole vocabulary -----------------------------------------------------------------------------------

__global__ void order_keys(const float* logits, int32_t n, uint32_t* keys, int32_t* ids) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    keys[i] = order_bits(logits[i]);
    ids[i] = int32_t(i);
  }
}

// ---- the pick -----------------------------------------------------------------------------------------------

using PickScan = cub::BlockScan<double, kPickThreads>;
struct PickShared {
  typename PickScan::TempStorage scan;
  int32_t first;
};

// For value(i) >= 0, i < count: the first i where the running sum of values reaches fraction x their total
// (running >= target, or running > target when `strictly`), count - 1 if rounding leaves it unreached. Each
// thread sums one contiguous segment, a block scan places the segments, and each thread walks its own.
template <class Value>
__device__ int32_t first_reaching(PickShared& shared, Value value, int32_t count, double fraction, bool strictly) {
  const int32_t segment = (count + int32_t(blockDim.x) - 1) / int32_t(blockDim.x);
  const int32_t begin = min(count, int32_t(threadIdx.x) * segment);
  const int32_t end = min(count, begin + segment);
  double segment_sum = 0.0;
  for (int32_t i = begin; i < end; ++i) segment_sum += value(i);
  double before = 0.0, total = 0.0;
  PickScan(shared.scan).ExclusiveSum(segment_sum, before, total);
  if (threadIdx.x == 0) shared.first = count - 1;
  __syncthreads();
  const double target = fraction * total;
  double running = before;
  for (int32_t i = begin; i < end; ++i) {
    running += value(i);
    if (strictly ? running > target : running >= target) {
      atomicMin(&shared.first, i);
      break;
    }
  }
  __syncthreads();
  const int32_t first = shared.first;
  __syncthreads();  // the scan storage and `first` are reused by the next call
  return first;
}

// One block over the sorted candidates: the CPU sampler's top-p, min-p, temperature and inverse-CDF draw.
// 1024 threads fit only within 64 registers each: the bound tells the compiler so.
__global__ void __launch_bounds__(kPickThreads)
    pick_candidate(const uint32_t* sorted_keys, const int32_t* sorted_ids, int32_t n_sorted, SamplingParams params,
                   float u, unsigned long long* result) {
  __shared__ PickShared shared;
  __shared__ int32_t first_below_min_p;
  const float top = logit_of(sorted_keys[0]);
  auto probability = [&](int32_t i) { return exp(double(logit_of(sorted_keys[i]) - top)); };
  int32_t keep = n_sorted;
  if (params.top_p < 1.0f) keep = first_reaching(shared, probability, keep, double(params.top_p), false) + 1;
  if (params.min_p > 0.0f) {
    if (threadIdx.x == 0) first_below_min_p = keep;
    __syncthreads();
    // Probabilities fall along the sorted order, so each thread's first one below min_p is its smallest.
    for (int32_t i = 1 + threadIdx.x; i < keep; i += blockDim.x) {
      if (probability(i) < double(params.min_p)) {
        atomicMin(&first_below_min_p, i);
        break;
      }
    }
    __syncthreads();
    keep = first_below_min_p;
  }
  auto weight = [&](int32_t i) { return exp(double(logit_of(sorted_keys[i]) - top) / double(params.temperature)); };
  const int32_t chosen = first_reaching(shared, weight, keep, double(u), true);
  if (threadIdx.x == 0) *result = static_cast<uint32_t>(sorted_ids[chosen]);
}

template <class T>
T* device_alloc(size_t count) {
  void* p = nullptr;
  SPARROW_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

}  // namespace

DeviceSampler::DeviceSampler(cudaStream_t stream, int multiprocessors)
    : stream_(stream), multiprocessors_(std::max(1, multiprocessors)) {
  select_state_ = device_alloc<SelectState>(1);
  histograms_ = device_alloc<uint32_t>(size_t(kSelectPasses) * kDigitBins);
  candidates_ = device_alloc<unsigned long long>(kMaxSelected);
  result_ = device_alloc<unsigned long long>(1);
  SPARROW_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_result_), sizeof(unsigned long long)));
}

// Destructors do not throw: a failing cudaFree here has nothing left to protect.
DeviceSampler::~DeviceSampler() {
  cudaStreamSynchronize(stream_);
  for (void* p : {select_state_, static_cast<void*>(histograms_), static_cast<void*>(candidates_),
                  static_cast<void*>(sorted_keys_), static_cast<void*>(sorted_ids_), static_cast<void*>(keys_),
                  static_cast<void*>(ids_), sort_scratch_, static_cast<void*>(result_)})
    cudaFree(p);
  cudaFreeHost(host_result_);
}

void DeviceSampler::reserve(int32_t n_vocab) {
  if (n_vocab <= capacity_) return;
  SPARROW_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (void* p : {static_cast<void*>(sorted_keys_), static_cast<void*>(sorted_ids_), static_cast<void*>(keys_),
                  static_cast<void*>(ids_), sort_scratch_})
    SPARROW_CUDA_CHECK(cudaFree(p));
  sorted_keys_ = keys_ = nullptr;
  sorted_ids_ = ids_ = nullptr;
  sort_scratch_ = nullptr;
  sorted_keys_ = device_alloc<uint32_t>(n_vocab);
  sorted_ids_ = device_alloc<int32_t>(n_vocab);
  keys_ = device_alloc<uint32_t>(n_vocab);
  ids_ = device_alloc<int32_t>(n_vocab);
  sort_scratch_bytes_ = 0;
  SPARROW_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(nullptr, sort_scratch_bytes_, keys_, sorted_keys_, ids_,
                                                               sorted_ids_, n_vocab, 0, 32, stream_));
  sort_scratch_ = device_alloc<unsigned char>(sort_scratch_bytes_);
  capacity_ = n_vocab;
}

int32_t DeviceSampler::sample(const float* logits, int64_t n_vocab, const SamplingParams& params, float u) {
  if (n_vocab <= 0 || n_vocab > std::numeric_limits<int32_t>::max())
    throw Error("sample: vocabulary of " + std::to_string(n_vocab) + " logits (expected 1 to 2^31 - 1)");
  if (!(u >= 0.0f && u < 1.0f)) throw Error("sample: uniform draw " + std::to_string(u) + " is not in [0, 1)");
  if (std::isnan(params.temperature) || std::isnan(params.top_p) || std::isnan(params.min_p))
    throw Error("sample: temperature, top-p and min-p must be numbers");
  const int32_t n = int32_t(n_vocab);
  if (params.temperature <= 0.0f) return argmax(logits, n);
  reserve(n);
  const int32_t k = params.top_k > 0 && params.top_k < n ? params.top_k : n;
  if (k <= kMaxSelected) select_top_k(logits, n, k);
  else sort_all(logits, n);
  return pick(k, params, u);
}

int32_t DeviceSampler::argmax(const float* logits, int32_t n_vocab) {
  SPARROW_CUDA_CHECK(cudaMemsetAsync(result_, 0, sizeof(unsigned long long), stream_));
  argmax_kernel<<<grid_for(multiprocessors_, n_vocab, kCountThreads, kItemsPerCountThread), kCountThreads, 0,
                  stream_>>>(logits, n_vocab, result_);
  SPARROW_CUDA_CHECK_LAUNCH();
  SPARROW_CUDA_CHECK(cudaMemcpyAsync(host_result_, result_, sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                     stream_));
  SPARROW_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return id_of_key(*host_result_);
}

// Every pass is launched; once the candidates fit, the remaining passes return at once (the host never waits
// to learn how many passes a vocabulary needed).
void DeviceSampler::select_top_k(const float* logits, int32_t n_vocab, int32_t k) {
  auto* state = static_cast<SelectState*>(select_state_);
  SPARROW_CUDA_CHECK(cudaMemsetAsync(state, 0, sizeof(SelectState), stream_));
  SPARROW_CUDA_CHECK(
      cudaMemsetAsync(histograms_, 0, size_t(kSelectPasses) * kDigitBins * sizeof(uint32_t), stream_));
  const unsigned blocks = grid_for(multiprocessors_, n_vocab, kCountThreads, kItemsPerCountThread);
  for (int pass = 0; pass < kSelectPasses; ++pass) {
    uint32_t* histogram = histograms_ + size_t(pass) * kDigitBins;
    count_digits<<<blocks, kCountThreads, 0, stream_>>>(logits, n_vocab, state, pass_shift(pass), pass_bits(pass),
                                                         histogram);
    SPARROW_CUDA_CHECK_LAUNCH();
    choose_digit<<<1, kChooseThreads, 0, stream_>>>(histogram, k, pass_bits(pass), state);
    SPARROW_CUDA_CHECK_LAUNCH();
  }
  gather_candidates<<<blocks, kCountThreads, 0, stream_>>>(logits, n_vocab, state, candidates_);
  SPARROW_CUDA_CHECK_LAUNCH();
  sort_candidates<<<1, kSortThreads, 0, stream_>>>(state, candidates_, k, sorted_keys_, sorted_ids_);
  SPARROW_CUDA_CHECK_LAUNCH();
}

void DeviceSampler::sort_all(const float* logits, int32_t n_vocab) {
  order_keys<<<grid_for(multiprocessors_, n_vocab, kCountThreads, kItemsPerCountThread), kCountThreads, 0,
               stream_>>>(logits, n_vocab, keys_, ids_);
  SPARROW_CUDA_CHECK_LAUNCH();
  size_t scratch_bytes = sort_scratch_bytes_;
  SPARROW_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(sort_scratch_, scratch_bytes, keys_, sorted_keys_, ids_,
                                                               sorted_ids_, n_vocab, 0, 32, stream_));
}

int32_t DeviceSampler::pick(int32_t n_sorted, const SamplingParams& params, float u) {
  pick_candidate<<<1, kPickThreads, 0, stream_>>>(sorted_keys_, sorted_ids_, n_sorted, params, u, result_);
  SPARROW_CUDA_CHECK_LAUNCH();
  SPARROW_CUDA_CHECK(cudaMemcpyAsync(host_result_, result_, sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                     stream_));
  SPARROW_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return int32_t(*host_result_);
}

}  // namespace sparrow::cuda
