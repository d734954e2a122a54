// verify::Lockstep: a forward pass on two backends op by op. Two CPU backends agree exactly; a backend with one
// deliberately wrong op is caught at that op alone (the reference's outputs are forced into the test side, so the
// fault does not spread to the ops after it).
#include "verify/lockstep.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

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

}  // namespace
}  // namespace sparrow
