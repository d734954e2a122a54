// The verification matrix engine: runs a backend's ops on the fixture inputs and compares with the stored
// reference outputs, one cell per codec x op x head dim. See verify.h for what each op's cases are.
#include "verify/verify.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

#include "util/error.h"
#include "verify/attention_cells.h"

namespace sparrow::verify {
namespace {

using formats::KvCodec;
using formats::KvCodecInfo;

constexpr double kNotRun = std::numeric_limits<double>::quiet_NaN();

// The error of one compared value: 0 when identical (NaN matching NaN included), infinite when exactly one
// side is NaN, otherwise |got - expected|.
double difference(float got, float expected) {
  if (got == expected || (std::isnan(got) && std::isnan(expected))) return 0.0;
  if (std::isnan(got) || std::isnan(expected)) return std::numeric_limits<double>::infinity();
  return std::fabs(double(got) - double(expected));
}

double norm(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return std::sqrt(s);
}

double rms(const float* x, size_t n) { return n ? norm(x, n) / std::sqrt(double(n)) : 0.0; }

// Relative error `diff / scale` for reporting, with 0/0 = 0.
double relative(double diff, double scale) { return diff == 0.0 ? 0.0 : diff / scale; }

// Tallies the cases of one cell.
struct Tally {
  int passed = 0, total = 0;
  double max_err = 0;
  std::string first_failure;
  void add(bool ok, double err, const std::string& what) {
    ++total;
    if (ok)
      ++passed;
    else if (first_failure.empty())
      first_failure = what;
    if (!(err <= max_err)) max_err = err;  // NaN and infinity win
  }
};

// Everything the checks of one (codec, head dim) need.
struct CellContext {
  sparrow::Backend& backend;
  const KvCodecInfo& info;
  const HeadDimInputs& in;
  const HeadDimExpected& expected;
  const Tolerances& tol;
  int d() const { return in.head_dim; }
  const uint8_t* ref_block(int v) const { return expected.blocks.data() + size_t(v) * expected.block_bytes; }
  const float* ref_decoded(int v) const { return expected.decoded.data() + size_t(v) * d(); }
};

std::string vector_label(int v) { return "vector " + std::to_string(v); }

// One row of values (a decoded vector, an accumulator, a finished output) against the reference's: element i
// passes if |got_i - want_i| <= rel * max(|want_i|, rms(want)) (rel = 0: exactly equal); elements with a
// nonzero `skip` flag are not compared. Adds one case to `t`, its error the largest relative error.
void check_row(Tally& t, const float* got, const float* want, size_t n, double rel, const uint8_t* skip,
               const std::string& label) {
  const double floor = rms(want, n);
  double worst = 0;
  int bad = -1;
  for (size_t i = 0; i < n; ++i) {
    if (skip != nullptr && skip[i]) continue;
    const double scale = std::max(std::fabs(double(want[i])), floor);
    const double diff = difference(got[i], want[i]);
    const double err = relative(diff, scale);
    if (!(diff <= rel * scale) && bad < 0) bad = int(i);
    if (!(err <= worst)) worst = err;
  }
  char what[200] = "";
  if (bad >= 0) {
    std::snprintf(what, sizeof what, "%s element %d: got %.9g, reference %.9g", label.c_str(), bad,
                  double(got[bad]), double(want[bad]));
  }
  t.add(bad < 0, worst, what);
}

Tally check_encode(CellContext& c) {
  const int d = c.d(), n = c.in.n_vectors;
  std::vector<uint8_t> blocks(size_t(n) * c.expected.block_bytes);
  encode(c.backend, c.info.codec, d, c.in.vectors.data(), n, blocks.data());
  std::vector<float> decoded(d);
  Tally t;
  for (int v = 0; v < n; ++v) {
    // The reference decode reads the backend's bytes: encode is judged on its own, not through another
    // backend op. Exact, except where a tiny input change already changes the reference's result.
    c.info.reference->decode(blocks.data() + size_t(v) * c.expected.block_bytes, d, decoded.data());
    check_row(t, decoded.data(), c.ref_decoded(v), size_t(d), 0.0, c.expected.near_boundary.data() + size_t(v) * d,
              vector_label(v) + " (the backend's block, decoded by the reference)");
  }
  return t;
}

Tally check_decode(CellContext& c) {
  const int d = c.d(), n = c.in.n_vectors;
  std::vector<float> decoded(size_t(n) * d);
  decode(c.backend, c.info.codec, d, c.expected.blocks.data(), n, decoded.data());
  Tally t;
  for (int v = 0; v < n; ++v) {
    check_row(t, decoded.data() + size_t(v) * d, c.ref_decoded(v), size_t(d), c.tol.decode_rel, nullptr,
              vector_label(v));
  }
  return t;
}

Tally check_score(CellContext& c) {
  const int d = c.d(), n = c.in.n_vectors, nq = c.in.n_queries;
  std::vector<float> scores(size_t(nq) * n);
  score(c.backend, c.info.codec, d, c.in.queries.data(), nq, c.expected.blocks.data(), n, scores.data());
  Tally t;
  for (int q = 0; q < nq; ++q) {
    const double q_norm = norm(c.in.query(q), d);
    for (int v = 0; v < n; ++v) {
      const float got = scores[size_t(q) * n + v], want = c.expected.scores[size_t(q) * n + v];
      const double x_norm = std::max(norm(c.in.vector(v), d), norm(c.ref_decoded(v), d));
      const double scale = std::max(std::fabs(double(want)), q_norm * x_norm);
      const double diff = difference(got, want);
      char what[160];
      std::snprintf(what, sizeof what, "query %d x %s: got %.9g, reference %.9g", q, vector_label(v).c_str(),
                    double(got), double(want));
      t.add(diff <= c.tol.score_rel * scale, relative(diff, scale), what);
    }
  }
  return t;
}

Tally check_accumulate(CellContext& c) {
  const int d = c.d(), n = c.in.n_vectors, ns = c.in.n_sequences;
  const size_t af = c.expected.accumulator_floats;
  std::vector<float> acc(size_t(ns) * af);
  accumulate(c.backend, c.info.codec, d, c.in.weights.data(), ns, c.expected.blocks.data(), n, acc.data());
  Tally t;
  for (int s = 0; s < ns; ++s) {
    check_row(t, acc.data() + s * af, c.expected.accumulators.data() + s * af, af, c.tol.accumulate_rel,
              nullptr, "sequence " + std::to_string(s));
  }
  return t;
}

Tally check_finish(CellContext& c) {
  const int d = c.d(), ns = c.in.n_sequences;
  std::vector<float> out(size_t(ns) * d);
  finish(c.backend, c.info.codec, d, c.expected.accumulators.data(), ns, out.data());
  Tally t;
  for (int s = 0; s < ns; ++s) {
    check_row(t, out.data() + size_t(s) * d, c.expected.finished.data() + size_t(s) * d, size_t(d),
              c.tol.finish_rel, nullptr, "accumulator " + std::to_string(s));
  }
  return t;
}

// Number of cases a cell of `op` has on these inputs.
int case_count(Op op, const HeadDimInputs& in) {
  switch (op) {
    case Op::Encode:
    case Op::Decode: return in.n_vectors;
    case Op::Score: return in.n_vectors * in.n_queries;
    case Op::Accumulate:
    case Op::Finish: return in.n_sequences;
  }
  return 0;
}

Tally run_check(Op op, CellContext& c) {
  switch (op) {
    case Op::Encode: return check_encode(c);
    case Op::Decode: return check_decode(c);
    case Op::Score: return check_score(c);
    case Op::Accumulate: return check_accumulate(c);
    case Op::Finish: return check_finish(c);
  }
  throw Error("verify: unknown op");
}

Cell not_run(const KvCodecInfo& info, Op op, int d, CellStatus status, std::string note, int total) {
  Cell cell;
  cell.codec = std::string(info.name);
  cell.op = op;
  cell.head_dim = d;
  cell.total = total;
  cell.max_err = kNotRun;
  cell.status = status;
  cell.note = std::move(note);
  return cell;
}

// Why the fixture's sizes no longer fit the codec, or "".
std::string layout_drift(const KvCodecInfo& info, const HeadDimExpected& e) {
  const int d = e.head_dim;
  if (e.block_bytes != info.block_bytes(d) || e.query_floats != info.query_floats(d) ||
      e.accumulator_floats != info.accumulator_floats(d)) {
    return "the fixture was made for block_bytes/query_floats/accumulator_floats " +
           std::to_string(e.block_bytes) + "/" + std::to_string(e.query_floats) + "/" +
           std::to_string(e.accumulator_floats) + ", the codec now declares " +
           std::to_string(info.block_bytes(d)) + "/" + std::to_string(info.query_floats(d)) + "/" +
           std::to_string(info.accumulator_floats(d)) + " (regenerate: scripts/make-kv-fixtures " +
           std::string(info.name) + ")";
  }
  if (info.reference == nullptr || info.reference->decode == nullptr) return "the codec has no reference decode";
  return "";
}

Cell run_cell(Op op, CellContext& c) {
  Cell cell = not_run(c.info, op, c.d(), CellStatus::Failed, "", case_count(op, c.in));
  try {
    const Tally t = run_check(op, c);
    cell.passed = t.passed;
    cell.total = t.total;
    cell.max_err = t.max_err;
    const bool ok = t.total > 0 && t.passed == t.total;
    cell.status = ok ? CellStatus::Passed : CellStatus::Failed;
    if (!ok) cell.note = t.first_failure.empty() ? "no cases" : t.first_failure;
  } catch (const std::exception& e) { cell.note = e.what(); }
  return cell;
}

// Mean |x - x^|^2 / |x|^2 over the unit-Gaussian vectors of head dim d, through the backend's encode and
// decode (per-vector normalisation makes it the MSE of unit vectors, the papers' figure).
double unit_gaussian_mse(sparrow::Backend& backend, const KvCodecInfo& info, const HeadDimInputs& in) {
  const int d = in.head_dim;
  std::vector<float> x(in.vectors.begin(), in.vectors.begin() + size_t(in.n_gaussian) * d);
  x.insert(x.end(), in.gaussian.begin(), in.gaussian.end());
  const int n = int(x.size() / size_t(d));
  std::vector<uint8_t> blocks(size_t(n) * info.block_bytes(d));
  std::vector<float> decoded(x.size());
  encode(backend, info.codec, d, x.data(), n, blocks.data());
  decode(backend, info.codec, d, blocks.data(), n, decoded.data());
  double total = 0;
  for (int v = 0; v < n; ++v) {
    double err = 0, energy = 0;
    for (int i = 0; i < d; ++i) {
      const double xi = x[size_t(v) * d + i], e = xi - decoded[size_t(v) * d + i];
      err += e * e;
      energy += xi * xi;
    }
    total += err / energy;
  }
  return total / n;
}

CodecSummary summarize(sparrow::Backend* backend, const KvCodecInfo& info, const Fixtures& fixtures, bool runnable) {
  CodecSummary s;
  s.name = std::string(info.name);
  s.bits_per_element = formats::kv_bits_per_element(info.codec, 128);
  if (!runnable) return s;
  for (const HeadDimInputs& in : fixtures.inputs.dims) {
    try {
      s.mse_unit_gaussian[in.head_dim] = unit_gaussian_mse(*backend, info, in);
    } catch (const std::exception&) {
      // The encode/decode cells report the error; the statistic is just absent.
    }
  }
  return s;
}

}  // namespace

std::string_view op_name(Op op) {
  switch (op) {
    case Op::Encode: return "encode";
    case Op::Decode: return "decode";
    case Op::Score: return "score";
    case Op::Accumulate: return "accumulate";
    case Op::Finish: return "finish";
  }
  return "?";
}

std::string_view status_name(CellStatus status) {
  switch (status) {
    case CellStatus::Passed: return "passed";
    case CellStatus::Failed: return "failed";
    case CellStatus::Missing: return "missing";
  }
  return "?";
}

int Report::count(CellStatus status) const {
  return int(std::count_if(cells.begin(), cells.end(), [&](const Cell& c) { return c.status == status; }));
}

int Report::attention_count(CellStatus status) const {
  return int(std::count_if(attention.begin(), attention.end(),
                           [&](const AttentionCell& c) { return c.status == status; }));
}

bool Report::all_passed() const {
  return !cells.empty() && count(CellStatus::Passed) == int(cells.size()) &&
         attention_count(CellStatus::Passed) == int(attention.size());
}

Report run_verify(const Target& target, const Fixtures& fixtures, std::span<const KvCodecInfo> codecs) {
  Report report;
  report.backend = target.name;
  report.unavailable = target.unavailable;
  for (const KvCodecInfo& info : codecs) {
    const std::string name(info.name);
    const auto fixture = fixtures.codecs.find(name);
    for (Op op : kOps) {
      for (int d : kHeadDims) {
        const int total = case_count(op, fixtures.inputs.at(d));
        if (!report.unavailable.empty()) {
          report.cells.push_back(not_run(info, op, d, CellStatus::Missing, report.unavailable, 0));
        } else if (fixture == fixtures.codecs.end()) {
          const auto problem = fixtures.problems.find(name);
          report.cells.push_back(not_run(info, op, d, CellStatus::Missing,
                                         problem != fixtures.problems.end() ? problem->second : "no fixture", 0));
        } else if (std::string drift = layout_drift(info, fixture->second.at(d)); !drift.empty()) {
          report.cells.push_back(not_run(info, op, d, CellStatus::Failed, drift, total));
        } else {
          CellContext c{*target.backend, info, fixtures.inputs.at(d), fixture->second.at(d), fixture->second.tolerances};
          report.cells.push_back(run_cell(op, c));
        }
      }
    }
    // The statistic only for codecs whose cells ran: a codec without a fixture is not measured either.
    report.codecs.push_back(
        summarize(target.backend.get(), info, fixtures, target.backend && fixture != fixtures.codecs.end()));
  }
  return report;
}

namespace {

std::string cell_text(const Cell& c) {
  char buf[64];
  switch (c.status) {
    case CellStatus::Missing: return "missing";
    case CellStatus::Passed: std::snprintf(buf, sizeof buf, "%d/%d %.1e", c.passed, c.total, c.max_err); break;
    case CellStatus::Failed:
      if (std::isnan(c.max_err) && c.passed == 0)
        std::snprintf(buf, sizeof buf, "FAIL error");
      else
        std::snprintf(buf, sizeof buf, "FAIL %d/%d %.1e", c.passed, c.total, c.max_err);
      break;
  }
  return buf;
}

void pad_to(std::string& s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
}

}  // namespace

std::string format_report(const Report& report) {
  std::ostringstream out;
  out << "backend " << report.backend;
  if (!report.unavailable.empty()) out << ": unavailable: " << report.unavailable;
  out << "\n";
  std::string header = "codec";
  pad_to(header, 8);
  header += "op";
  pad_to(header, 20);
  for (int d : kHeadDims) {
    std::string col = "d=" + std::to_string(d);
    pad_to(col, 20);
    header += col;
  }
  while (header.back() == ' ') header.pop_back();
  out << header << "\n";
  for (size_t i = 0; i < report.cells.size(); i += kHeadDims.size()) {
    std::string row = report.cells[i].codec;
    pad_to(row, 8);
    row += std::string(op_name(report.cells[i].op));
    pad_to(row, 20);
    for (size_t k = 0; k < kHeadDims.size() && i + k < report.cells.size(); ++k) {
      std::string col = cell_text(report.cells[i + k]);
      pad_to(col, 20);
      row += col;
    }
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out << row << "\n";
  }
  const int n = int(report.cells.size());
  out << n << " cells: " << report.count(CellStatus::Passed) << " passed, " << report.count(CellStatus::Failed)
      << " failed, " << report.count(CellStatus::Missing) << " missing\n";
  // One note per distinct reason, with the cell it first appeared in.
  std::set<std::string> seen;
  for (const Cell& c : report.cells) {
    if (c.status == CellStatus::Passed || !seen.insert(c.codec + "\n" + c.note).second) continue;
    out << "  " << c.codec << " " << op_name(c.op) << " d=" << c.head_dim << ": " << status_name(c.status) << ": "
        << c.note << "\n";
  }
  out << "mse of unit-Gaussian vectors (encode + decode), bits per element at d=128:\n";
  for (const CodecSummary& s : report.codecs) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-7s %6.3f bpe", s.name.c_str(), s.bits_per_element);
    out << line;
    for (const auto& [d, mse] : s.mse_unit_gaussian) {
      std::snprintf(line, sizeof line, "  d=%d %.4g", d, mse);
      out << line;
    }
    if (s.mse_unit_gaussian.empty()) out << "  (not measured)";
    out << "\n";
  }
  if (!report.attention.empty()) out << format_attention_cells(report.attention);
  return out.str();
}

}  // namespace sparrow::verify
