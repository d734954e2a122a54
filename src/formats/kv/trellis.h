#pragma once
// Trellis-coded TurboQuant (tcq2, tcq3, tcq4): TurboQuant's rotation and per-sub-block norm, but instead of quantizing
// each coordinate on its own, the codes of a sub-block form one path through a bit-shift trellis and are chosen
// together by the Viterbi algorithm (minimum squared error over the whole sub-block). Trellis-coded quantization:
// Marcellin & Fischer, IEEE Trans. Commun. 1990; the bit-shift trellis with a large trained codebook as in QTIP
// (Tseng et al., arXiv 2406.11235).
//
// The trellis: a sub-block of n elements (n = 128, the whole head at d = 64) is a plain bit stream of k bits per
// element. The reconstruction of element t is codebook[state_t], where state_t is the last L bits of the stream
// after element t's code, i.e. stream bits [k t + k - L, k t + k):
//     state_t = (state_{t-1} >> k) | (code_t << (L - k)),      code_t = state_t >> (L - k).
// tcq4: k = 4, L = 8 (256 states); tcq3: k = 3, L = 9 (512 states); tcq2: k = 2, L = 8 (256 states).
// The trellis is tail-biting: the stream is read as a circle, so the bits before bit 0 are the stream's last
// L - k bits (the codes of its last (L - k) / k elements) and state_{-1} = state_{n-1}. Nothing but the norm is
// stored besides the codes (4.125, 3.125 and 2.125 bits per element at n = 128), and no element is worse off than
// another: a fixed start state would leave element 0 only 2^k reachable values and cost 10-18% of tcq3's MSE.
// Encoding (after QTIP's tail-biting search, Tseng et al. 2024, algorithm 4): a first Viterbi pass, free at both
// ends, over the elements around the junction (the last W and first W, W = min(32, n/2)) decides the codes of the
// last (L - k) / k elements; a second pass over the whole sub-block starts from them and must end on them. The
// second pass is an exact Viterbi search given the junction. The windowed junction choice costs 0.4% of MSE
// against the best tail-biting path on average (4% at the 99th percentile of sub-blocks; measured by exhaustive
// search over all junctions); a first pass over the whole rotated sub-block (W = n/2 = 64) gets within 0.05% for
// a third more encode time.
// Decoding is O(1) per element: the state is one shift of a 16-bit load (L + 7 <= 16), the load for the first
// elements taking its low byte from the stream's end.
//
// Sub-block layout: [stream: n k / 8 bytes][fp16 norm]. Stream bit i is bit i % 8 of byte i / 8 (little-endian
// bit order, so a little-endian 16-bit load at byte i / 8 shifted right by i % 8 reads bits i..i+8). The norm
// comes after the stream so that such a load never leaves the block: the last window of tcq2 starts on a byte
// boundary and its load touches the norm's first byte, which the mask drops.
// The stored norm is ||y_sub|| / ||c_sub|| (c_sub = codebook values of the path, scaled by 1/sqrt(n)), so that
// the reconstruction norm * c_sub has the sub-block's norm (as in TurboQuant; saturates at 65504).
// Codebooks: unit-variance Gaussian scale from scripts/gen-tcq-codebook (tcq_codebooks.inc); for sub-block size n
// the values are codebook / sqrt(n), like the Lloyd-Max tables, since a rotated unit sub-block has coordinates of
// variance 1/n.
#include <cstddef>
#include <cstdint>

#include "formats/host_device.h"

namespace sparrow::formats::tcq {

inline constexpr int kMaxSubBlock = 128;
inline constexpr int kMaxHeadDim = 512;

SPARROW_HOST_DEVICE inline int sub_block_size(int d) { return d < kMaxSubBlock ? d : kMaxSubBlock; }

// k and L of each codec, in a header so that the CUDA kernels (src/cuda/kv/trellis.cuh) share them.
struct TrellisBits {
  int code_bits;   // k
  int state_bits;  // L
};
inline constexpr TrellisBits kTcq2Bits = {2, 8};
inline constexpr TrellisBits kTcq3Bits = {3, 9};
inline constexpr TrellisBits kTcq4Bits = {4, 8};

struct Trellis {
  const char* codec;     // "tcq3"
  int code_bits;         // k: bits per element in the stream
  int state_bits;        // L: stream bits that index the codebook
  const float* codebook; // 2^L values, unit-variance scale

  int states() const { return 1 << state_bits; }
  uint32_t state_mask() const { return (1u << state_bits) - 1; }
  // Elements whose codes form the bits before the stream (the tail-biting junction): the last (L - k) / k.
  int junction_elements() const { return (state_bits - code_bits) / code_bits; }
  size_t stream_bytes(int n) const { return size_t(n) * code_bits / 8; }
  size_t sub_block_bytes(int n) const { return stream_bytes(n) + 2; }
};

const Trellis& tcq2_trellis();
const Trellis& tcq3_trellis();
const Trellis& tcq4_trellis();

// Bytes of one encoded head vector; throws sparrow::Error naming the codec unless d is a supported head dim.
size_t block_bytes(const Trellis& trellis, int d);
void check_head_dim(const Trellis& trellis, const char* op, int d);

// The codebook for sub-block size n (64 or 128): codebook[s] / sqrt(n), as floats.
const float* scaled_codebook(const Trellis& trellis, int n);

// The state of element t of an n-element sub-block, read bit by bit from the circular stream (reference).
uint32_t state_at(const Trellis& trellis, const uint8_t* stream, int n, int t);

// Shared by the reference and the optimized encoder so that both see the same floats: the unit sub-block
// u = y / ||y|| (returns ||y||; u all zeros when ||y|| is 0 or not finite), and the corrected norm of a path
// whose reconstruction values are `values` (scaled codebook entries), written as fp16 after the stream.
float normalise_sub_block(const float* y, int n, float* u);
void store_corrected_norm(float norm, const float* values, int n, uint8_t* dst);
float load_norm(const uint8_t* src);

// W of the junction pass, which runs over elements n - W..n-1 then 0..W-1: min(32, n / 2).
SPARROW_HOST_DEVICE inline int junction_window(int n) { return n / 2 < 32 ? n / 2 : 32; }

// The Viterbi search over `count` targets (reference). start_prefix / end_prefix: kFree, or p in
// [0, 2^(L-k)) to require state_{-1} >> k == p (the path starts from state p << k) / state_{count-1} >> k == p.
// Ties go to the lowest state index. Writes the path's states.
inline constexpr int kFree = -1;
void viterbi_path(const Trellis& trellis, const float* cb, const float* targets, int count, int start_prefix,
                  int end_prefix, uint32_t* states);

// The tail-biting encoding of the unit sub-block u (n elements) with codebook cb (scaled_codebook): writes the
// n k-bit codes of the stream, and `values` receives cb[state_t]. Reference.
void viterbi_encode(const Trellis& trellis, const float* cb, const float* u, int n, uint8_t* stream, float* values);

}  // namespace sparrow::formats::tcq
