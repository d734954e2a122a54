// verify::Lockstep: a forward pass on two backends op by op. Two CPU backends agree exactly; a backend with one
// deliberately wrong op is caught at that op alone (the reference's outputs are forced into the test side, so the
// fault does not spread to the ops after it).
#include "verify/lockstep.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <span>

#include "cli_test_util.h"
#include "forwarding_backend.h"
#include "runtime/model.h"
#include "runtime/session.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;

const fs::path& tiny_model() {
  return testing::mkmodel_once("--arch gemma4 --preset tiny-ple --type q8_0 --seed 5");
}

// Every op forwarded to a CPU backend, except that rms_norm's output comes out 0.1% too large (the fused ops
// that normalize, add_rms_norm and rms_norm_rope, go to the CPU backend whole and stay right).
class ScaledNormBackend final : public testing::ForwardingBackend {
 public:
  ScaledNormBackend() : ForwardingBackend(make_cpu_backend(1)) {}
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y) override {
    inner().rms_norm(x, w, rows, dim, eps, y);
    inner().scale(y, 1.001f, rows * dim);
  }
};

// Every matrix product 1e-5 too large, as another summation order might make it in its last bits (exaggerated,
// so that some gate products cross an f16 rounding boundary of the gelu's table).
class NudgedProductBackend : public testing::ForwardingBackend {
 public:
  NudgedProductBackend() : ForwardingBackend(make_cpu_backend(1)) {}
  void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) override {
    inner().matmul(w, x, n, y);
    inner().scale(y, kNudge, n * w.n_out);
  }
  void matmuls(const float* x, int64_t n, std::span<const MatmulTarget> targets) override {
    inner().matmuls(x, n, targets);
    for (const MatmulTarget& t : targets) inner().scale(t.y, kNudge, n * t.w.n_out);
  }
  static constexpr float kNudge = 1.00001f;
};

// The same, and a gelu computed exactly instead of by the table: an error of the gated product itself.
class ExactGeluBackend final : public NudgedProductBackend {
 public:
  void gelu_mul(const float* g, const float* u, int64_t n, float* y) override {
    for (int64_t i = 0; i < n; ++i) {
      const double x = g[i];
      const double gelu = 0.5 * x * (1 + std::tanh(0.7978845608028654 * x * (1 + 0.044715 * x * x)));
      y[i] = float(gelu * (u ? u[i] : 1.0f));
    }
  }
};

// Runs the tiny model's prompt and two decode steps in lockstep; returns the records.
std::vector<verify::LockstepRecord> run_in_lockstep(std::unique_ptr<Backend> test) {
  verify::Lockstep lockstep(make_cpu_weight_store(), make_cpu_weight_store(), std::move(test),
                            make_cpu_backend(1));
  ModelLoadOptions load;
  load.make_store = [&] { return lockstep.make_weight_store(); };
  const auto model = Model::load(tiny_model().string(), load);
  SessionOptions options;
  options.n_ctx = 32;
  options.k_codec = options.v_codec = formats::KvCodec::Q8_0;
  options.make_backend = [&] { return lockstep.make_backend(); };
  {
    Session session(*model, options);
    const std::vector<int32_t> prompt = {2, 17, 300, 41, 5, 9};
    session.decode(prompt.data(), int32_t(prompt.size()), true);
    for (int32_t next : {7, 8}) session.decode(&next, 1, false);
  }
  return lockstep.records();
}

TEST(Lockstep, TwoCpuBackendsAgreeOnEveryOp) {
  const auto records = run_in_lockstep(make_cpu_backend(1));
  std::set<std::string> kinds;
  for (const auto& r : records) {
    EXPECT_EQ(r.relative(), 0.0) << r.op << " #" << r.index;
    EXPECT_FALSE(r.mismatched_nan) << r.op;
    kinds.insert(r.op.substr(0, r.op.find(' ')));
  }
  // A Gemma 4 pass with PLE and a quantized KV cache goes through every op the model uses.
  for (const char* op : {"matmul", "matmuls", "gated_matmul", "matmul_residual", "embed", "rms_norm", "rms_norm_rope",
                         "add", "scale", "kv_store", "attention", "softcap"})
    EXPECT_TRUE(kinds.count(op)) << op << " was not compared";
}

TEST(Lockstep, AWrongOpIsCaughtWhereItHappensAndNowhereElse) {
  const auto records = run_in_lockstep(std::make_unique<ScaledNormBackend>());
  int64_t norms = 0;
  for (const auto& r : records) {
    if (r.op.rfind("rms_norm dim", 0) == 0) {
      ++norms;
      EXPECT_NEAR(r.relative(), 1e-3, 1e-4) << r.op << " #" << r.index;
    } else {
      EXPECT_EQ(r.relative(), 0.0) << r.op << " #" << r.index << ": the fault spread past the op that made it";
    }
  }
  EXPECT_GT(norms, 0);
}

// A gated product whose gate products differ in their last bits (as a GPU's and a CPU's do) differs by whole gelu
// table steps where a gate value crosses an f16 rounding boundary: the lockstep explains those from the two
// sides' gate products and judges the rest; a gelu that is wrong is still caught.
TEST(Lockstep, GeluTableStepsOfDifferingGateProductsAreExplainedAndAWrongGeluIsNot) {
  bool stepped = false;
  for (const auto& r : run_in_lockstep(std::make_unique<NudgedProductBackend>())) {
    if (r.op.rfind("gated_matmul", 0) != 0) continue;
    if (r.op.find("(gate product)") != std::string::npos) {
      EXPECT_NEAR(r.relative(), 1e-5, 2e-6) << r.op << " #" << r.index;
      continue;
    }
    // Left after the steps: the multiplier's nudge (and that of the gate where no step happened).
    EXPECT_LE(r.relative(), 3e-5) << r.op << " #" << r.index;
    if (r.n_excused > 0 && r.max_abs_diff_raw > 10 * r.max_abs_diff) stepped = true;
  }
  EXPECT_TRUE(stepped) << "no gate product crossed a rounding boundary: the nudge is too small to test this";

  double worst_gated = 0;
  for (const auto& r : run_in_lockstep(std::make_unique<ExactGeluBackend>())) {
    if (r.op.rfind("gated_matmul", 0) == 0 && r.op.find("(gate product)") == std::string::npos)
      worst_gated = std::max(worst_gated, r.relative());
  }
  EXPECT_GT(worst_gated, 1e-4) << "the exact gelu differs from the table's by ~3e-4 (ops/gelu.h)";
}

}  // namespace
}  // namespace sparrow
