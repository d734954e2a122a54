// Calibrated key transforms (model/key_transform.h) on the CUDA backend: two F32 products per layer after RoPE,
// through Backend::matmul. The transforms leave the model's output as it was (within what an exact rescaling
// moves it on this random model), and decode steps through them replay as CUDA graphs bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <vector>

#include "gpu_test_util.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "unit/cli_test_util.h"
#include "unit/key_transform_test_util.h"

namespace sparrow {
namespace {

namespace fs = std::filesystem;

const fs::path& tiny_model() {
  return testing::mkmodel_once("--arch gemma4 --preset tiny-ple --type f32 --seed 21");
}

std::unique_ptr<Model> load_on_gpu(const std::string& transforms) {
  ModelLoadOptions load;
  load.device = Device::Cuda;
  load.n_gpu_layers = 99;
  load.key_transforms = transforms;
  return Model::load(tiny_model().string(), load);
}

const fs::path& transforms_file() {
  static const fs::path path = [] {
    ModelLoadOptions cpu;
    cpu.key_transforms = "off";
    const std::unique_ptr<Model> model = Model::load(tiny_model().string(), cpu);
    const fs::path p = testing::scratch_dir() / "gpu.key-transforms.gguf";
    write_key_transform_file(p.string(), testing::random_transforms(*model, model->fingerprint()));
    return p;
  }();
  return path;
}

// Logits of a 20-token prompt (several batches) and then `steps` greedy steps, each kept row.
std::vector<std::vector<float>> run(const Model& model, formats::KvCodec k_codec, KeyBalancing balance, int steps,
                                    bool graphs = true) {
  SessionOptions o;
  o.n_ctx = 128;
  o.n_batch = 8;
  o.k_codec = k_codec;
  o.v_codec = formats::KvCodec::F32;
  o.balance_keys = balance;
  o.record_decode = graphs;
  Session s(model, o);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back(2 + (i * 37) % 200);
  s.decode(tokens.data(), int32_t(tokens.size()), false);
  std::vector<std::vector<float>> rows;
  for (int step = 0; step <= steps; ++step) {
    const float* logits = s.logits(-1);
    rows.emplace_back(logits, logits + model.config.n_vocab);
    if (step == steps) break;
    int32_t next = 0;
    for (int32_t i = 1; i < model.config.n_vocab; ++i) next = logits[i] > logits[next] ? i : next;
    s.decode(&next, 1, false);
  }
  return rows;
}

float max_difference(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b, float* peak) {
  float worst = 0;
  *peak = 0;
  for (size_t r = 0; r < a.size(); ++r)
    for (size_t i = 0; i < a[r].size(); ++i) {
      *peak = std::max(*peak, std::abs(a[r][i]));
      worst = std::max(worst, std::abs(a[r][i] - b[r][i]));
    }
  return worst;
}

TEST(CudaKeyTransforms, LeaveTheModelsOutputUnchanged) {
  SPARROW_REQUIRE_GPU();
  const auto plain = load_on_gpu("off");
  const auto transformed = load_on_gpu(transforms_file().string());
  // The prompt's last row and 8 decode steps whose keys were stored through the transforms (f32 keys, balancing
  // forced on so that the transforms apply); the balanced gains, an exact rescaling too, are the yardstick.
  const auto reference = run(*plain, formats::KvCodec::F32, KeyBalancing::Off, 8);
  const auto through = run(*transformed, formats::KvCodec::F32, KeyBalancing::On, 8);
  const auto gains = run(*plain, formats::KvCodec::F32, KeyBalancing::On, 8);
  float peak = 0;
  const float worst = max_difference(reference, through, &peak);
  const float gains_worst = max_difference(reference, gains, &peak);
  EXPECT_LT(worst, 2 * gains_worst + 1e-4f * peak) << "max|diff| " << worst << ", balanced gains' " << gains_worst;
  EXPECT_LT(worst, 2e-3f * peak) << "max|diff| " << worst << " of max|logit| " << peak;
  EXPECT_GT(worst, 0.0f) << "the transforms were not applied";
}

TEST(CudaKeyTransforms, ReplayedStepsEqualStepsLaunchedOneByOne) {
  SPARROW_REQUIRE_GPU();
  const auto transformed = load_on_gpu(transforms_file().string());
  EXPECT_EQ(run(*transformed, formats::KvCodec::TBQ4, KeyBalancing::Auto, 40, true),
            run(*transformed, formats::KvCodec::TBQ4, KeyBalancing::Auto, 40, false));
}

}  // namespace
}  // namespace sparrow
