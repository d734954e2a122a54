#pragma once
// The verification matrix: every codec x op x head dim of one backend, checked against the reference outputs
// stored in the fixtures (verify/fixture.h). A cell passes only if every case in it is within tolerance; a cell
// the backend cannot run (an op that throws, no fixture, backend unavailable) is a failure too, so a clean
// report means N/N everywhere with no holes. `sparrow verify` prints and exports this report.
//
// Per op, what a case is and when it passes (tolerances come from the codec's fixture):
//   encode      one vector: the backend's block, decoded by the REFERENCE decode, equals the reference's
//               decoded values exactly, except at elements marked near a decision boundary.
//   decode      one vector: the backend's decode of the reference block: every element within
//               decode_rel * max(|x_ref_i|, rms(x_ref)); decode_rel is 0, i.e. exactly equal.
//   score       one (query, block) pair: |s - s_ref| <= score_rel * max(|s_ref|, |q| * |x|).
//   accumulate  one weight sequence over all blocks, from zero: every accumulator element within
//               accumulate_rel * max(|a_ref_i|, rms(a_ref)).
//   finish      one reference accumulator: every output element within finish_rel * max(|o_ref_i|, rms(o_ref)).
// max_err is the largest relative error over the cases (0 when every compared value is identical), in the
// units of that op's tolerance: |got - ref| / max(|ref_i|, rms(ref)), or for score / max(|s_ref|, |q| |x|).
#include <array>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/kv/kv_codec.h"
#include "verify/target.h"
#include "verify/fixture.h"

namespace sparrow::verify {

enum class Op : uint8_t { Encode, Decode, Score, Accumulate, Finish };
constexpr std::array<Op, 5> kOps = {Op::Encode, Op::Decode, Op::Score, Op::Accumulate, Op::Finish};
std::string_view op_name(Op op);

enum class CellStatus : uint8_t { Passed, Failed, Missing };
std::string_view status_name(CellStatus status);

struct Cell {
  std::string codec;
  Op op = Op::Encode;
  int head_dim = 0;
  int passed = 0, total = 0;
  double max_err = 0;  // NaN when the cell did not run
  CellStatus status = CellStatus::Missing;
  std::string note;  // why the cell did not pass ("" when it did)
};

// A cell of attention over one (K codec, V codec) pair (verify/attention_cells.h); a case is one output row.
enum class Mask : uint8_t { Causal, Windowed };
struct AttentionCell {
  std::string k_codec, v_codec;
  int n_heads = 0, n_kv_heads = 0, n_kv = 0;
  Mask mask = Mask::Causal;
  int head_dim = 0;
  int passed = 0, total = 0;
  double max_err = 0;  // in units of max|v^|; NaN when the cell did not run
  CellStatus status = CellStatus::Missing;
  std::string note;
};

struct CodecSummary {
  std::string name;
  double bits_per_element = 0;              // at head dim 128
  std::map<int, double> mse_unit_gaussian;  // head dim -> mean |x - x^|^2 / |x|^2 over the fixture's
                                            // unit-Gaussian vectors (backend encode + decode); absent when
                                            // the codec's cells did not run (no fixture, no ops)
};

struct Report {
  std::string backend;
  std::string unavailable;  // why the backend could not run at all ("" if it ran)
  std::vector<Cell> cells;  // codecs in registry order, then ops, then head dims
  std::vector<CodecSummary> codecs;
  std::vector<AttentionCell> attention;  // run_attention_cells(), when the caller ran them
  int count(CellStatus status) const;    // of `cells`
  int attention_count(CellStatus status) const;
  bool all_passed() const;               // every codec cell and every attention cell
};

// Checks the target backend on every codec in `codecs` (all registered codecs unless given) x op x head dim.
Report run_verify(const Target& target, const Fixtures& fixtures,
                  std::span<const formats::KvCodecInfo> codecs = formats::kv_codecs());

// The report as a table for people: one row per codec and op, one column per head dim, then the notes of the
// cells that did not pass and the MSE per codec; then the attention cells, if any.
std::string format_report(const Report& report);

}  // namespace sparrow::verify
