// LoRA on real ranks at tensor-parallel sizes 1, 2 and 4: an adapted model starts equal to its base and
// trains only its adapters; merged weights give the adapted outputs; TP 2 and 4 train as TP 1 does; the
// adapter saves alone, with its base, or merged, and loads back (its configuration with it). Part of
// bpl-parallel-test.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "backplane/parallel.h"
#include "shared_dir.h"

namespace bp = backplane::parallel;

namespace backplane::test {
namespace {

// Column- and row-parallel layers, and a plain linear head; on `group` (default: the TP group).
torch::nn::Sequential base_mlp(const bp::GroupPtr& group = nullptr) {
  at::manual_seed(31);
  return torch::nn::Sequential(
      bp::ColumnParallelLinear(
          bp::ColumnParallelLinearOptions(6, 8).gather_output(false).tensor_model_parallel_group(group)),
      torch::nn::Tanh(),
      bp::RowParallelLinear(bp::RowParallelLinearOptions(8, 8).input_is_parallel(true).tensor_model_parallel_group(group)),
      torch::nn::Tanh(), torch::nn::Linear(8, 3));
}

bp::LoraConfig lora_config(double dropout) {
  bp::LoraConfig config;
  config.enable_lora = true;
  config.lora_rank = 4;
  config.lora_alpha = 8;
  config.lora_dropout = dropout;
  config.bias = "lora_only";
  config.target_modules = {"0", "2", "4"};
  return config;
}

torch::nn::Sequential adapted_mlp(const bp::LoraConfig& config, const bp::GroupPtr& group = nullptr) {
  torch::nn::Sequential base = base_mlp(group);
  at::manual_seed(32);  // the adapters' draws
  return bp::apply_lora(base, config);
}

std::vector<at::Tensor> trainable(const torch::nn::Sequential& model) {
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : model->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  return params;
}

// Trains `model` for `steps` on a fixed regression task; returns the losses.
std::vector<double> train(torch::nn::Sequential& model, int steps) {
  torch::optim::Adam optimizer(trainable(model), torch::optim::AdamOptions(0.05));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    at::manual_seed(40 + step);
    const at::Tensor x = at::randn({5, 6}), y = at::randn({5, 3});
    optimizer.zero_grad();
    at::Tensor loss = at::mse_loss(model->forward(x), y);
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

at::Tensor probe_input() {
  at::manual_seed(50);
  return at::randn({7, 6});
}

at::Tensor whole(const at::Tensor& parameter) {
  auto attributes = bp::tensor_model_parallel_attributes(parameter);
  if (!attributes) return parameter.detach();
  return bp::get_tensor_model_parallel_group()->all_gather(parameter.detach(), attributes->partition_dim);
}

class LoraTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    tp = GetParam();
    if (tp > bp::get_world_size() || bp::get_world_size() % tp != 0) {
      GTEST_SKIP() << "tensor-parallel size " << tp << " needs a multiple of " << tp << " ranks";
    }
    bp::initialize_model_parallel(tp);
  }
  void TearDown() override { bp::destroy_model_parallel(); }
  int tp = 1;
};

TEST_P(LoraTest, StartsEqualToTheBaseModelAndTrainsOnlyItsAdapters) {
  torch::nn::Sequential base = base_mlp();
  torch::nn::Sequential adapted = adapted_mlp(lora_config(0.1));
  const at::Tensor x = probe_input();
  EXPECT_TRUE(adapted->forward(x).equal(base->forward(x))) << "B starts at zero";
  std::vector<std::string> trains;
  for (const auto& p : adapted->named_parameters()) {
    if (p.value().requires_grad()) trains.push_back(p.key());
  }
  EXPECT_EQ(trains, (std::vector<std::string>{"0.bias", "0.lora.A.weight", "0.lora.B.weight", "2.bias", "2.lora.A.weight",
                                              "2.lora.B.weight", "4.bias", "4.lora.A.weight", "4.lora.B.weight"}));
  // Sharded to match: B of the column-parallel layer by rows, A of the row-parallel one by columns.
  const auto params = adapted->named_parameters();
  EXPECT_EQ(params["0.lora.A.weight"].sizes(), (at::IntArrayRef{4, 6}));
  EXPECT_EQ(params["0.lora.B.weight"].sizes(), (at::IntArrayRef{8 / tp, 4}));
  EXPECT_EQ(params["2.lora.A.weight"].sizes(), (at::IntArrayRef{4, 8 / tp}));
  EXPECT_EQ(params["2.lora.B.weight"].sizes(), (at::IntArrayRef{8, 4}));

  train(adapted, 3);
  const auto trained = adapted->named_parameters();
  for (const char* frozen : {"0.weight", "2.weight", "4.weight"}) {
    EXPECT_TRUE(trained[frozen].equal(base->named_parameters()[frozen])) << frozen << " is frozen";
    EXPECT_FALSE(trained[frozen].grad().defined()) << frozen;
  }
  EXPECT_FALSE(trained["0.lora.B.weight"].eq(0).all().item<bool>()) << "the adapter trained";
}

TEST_P(LoraTest, MergedWeightsGiveTheAdaptedOutputs) {
  torch::nn::Sequential adapted = adapted_mlp(lora_config(0.1));
  train(adapted, 5);
  adapted->eval();  // no dropout: the adapted function itself
  const at::Tensor x = probe_input();
  const at::Tensor expected = adapted->forward(x);
  const at::Tensor base_weight = adapted->named_parameters()["2.weight"].clone();
  bp::merge_lora(*adapted);
  EXPECT_TRUE(at::allclose(adapted->forward(x), expected, 1e-5, 1e-6));
  EXPECT_FALSE(adapted->named_parameters()["2.weight"].equal(base_weight)) << "the adapter is in the weight now";
  for (const auto& p : adapted->named_parameters()) EXPECT_FALSE(bp::is_lora_name(p.key())) << p.key() << " is left";
  EXPECT_TRUE(bp::lora_adapters(*adapted).empty());
}

TEST_P(LoraTest, TensorParallelTrainsAsOneRankDoes) {
  // The same model on a group of one rank: the TP 1 computation, in the same job.
  const bp::GroupPtr alone = bp::get_world_group()->split(bp::get_rank(), 0);
  torch::nn::Sequential sharded = adapted_mlp(lora_config(0));
  torch::nn::Sequential single = adapted_mlp(lora_config(0), alone);
  const std::vector<double> sharded_losses = train(sharded, 4), single_losses = train(single, 4);
  for (size_t i = 0; i < single_losses.size(); ++i) {
    EXPECT_NEAR(sharded_losses[i], single_losses[i], 1e-5) << "step " << i;
  }
  const at::Tensor x = probe_input();
  EXPECT_TRUE(at::allclose(sharded->forward(x), single->forward(x), 1e-5, 1e-6));
  bp::merge_lora(*sharded);
  bp::merge_lora(*single);
  const auto expected = single->named_parameters();
  for (const auto& p : sharded->named_parameters()) {
    EXPECT_TRUE(at::allclose(whole(p.value()), expected[p.key()], 1e-5, 1e-6)) << p.key() << " merged";
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, LoraTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "tp" + std::to_string(info.param); });

class LoraCheckpointTest : public LoraTest {
 protected:
  void SetUp() override {
    LoraTest::SetUp();
    if (!IsSkipped()) dir = shared_temp_dir();
  }
  void TearDown() override {
    if (!dir.empty()) remove_shared_temp_dir(dir);
    LoraTest::TearDown();
  }
  std::string shard() const {
    return "dp_rank_00_tp_rank_0" + std::to_string(bp::get_tensor_model_parallel_rank()) + "_pp_rank_00.pt";
  }
  std::string dir;
};

std::vector<std::string> archive_keys(const std::string& file) {
  torch::serialize::InputArchive archive;
  archive.load_from(file);
  return archive.keys();
}

TEST_P(LoraCheckpointTest, TheAdapterSavesAloneOrMergedAndLoadsBackWithItsConfiguration) {
  bp::LoraConfig config = lora_config(0);
  config.save_lora_config_adapter = false;  // adapter_config.json besides
  torch::nn::Sequential adapted = adapted_mlp(config);
  train(adapted, 3);
  const at::Tensor x = probe_input();
  const at::Tensor expected = adapted->forward(x);

  bp::save_checkpoint(dir, "adapter", adapted.ptr().get(), nullptr, nullptr);
  const std::vector<std::string> keys = archive_keys(dir + "/adapter/lora_adapter/" + shard());
  for (const std::string& key : keys) {
    const bool trained_bias = key == "0.bias" || key == "2.bias" || key == "4.bias";  // bias "lora_only"
    EXPECT_TRUE(bp::is_lora_name(key) || trained_bias || key.rfind("__", 0) == 0) << key << ": the adapter alone";
  }
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "2.bias"), 1) << "a trained bias goes with the adapter";
  EXPECT_EQ(std::count(keys.begin(), keys.end(), "4.lora.A.weight"), 1);
  EXPECT_FALSE(std::filesystem::exists(dir + "/adapter/model/" + shard()));
  EXPECT_TRUE(std::filesystem::exists(dir + "/adapter/lora_adapter/adapter_config.json"));

  // Loaded into a fresh adapter on the same base.
  torch::nn::Sequential fresh = base_mlp();
  at::manual_seed(77);
  fresh = bp::apply_lora(fresh, config);
  bp::load_checkpoint(dir, "adapter", fresh.ptr().get(), nullptr, nullptr);
  EXPECT_TRUE(fresh->forward(x).equal(expected));

  // Through the trainer: the rank and targets come from the checkpoint, not from this config.
  bp::ParallelConfig parallel;
  parallel.tensor_parallel_size = tp;
  parallel.lora_config.enable_lora = true;
  parallel.lora_config.target_modules = {};  // from the checkpoint
  parallel.lora_config.lora_rank = 16;
  parallel.lora_config.load_lora_from_ckpt = true;
  parallel.lora_config.lora_save_dir = dir;
  parallel.lora_config.lora_load_tag = "adapter";
  auto resumed = bp::initialize_parallel_model(parallel, [] { return base_mlp(); });
  EXPECT_TRUE(resumed.module()->forward(x).equal(expected));
  EXPECT_EQ(resumed.module()->named_parameters()["0.lora.A.weight"].size(0), 4);

  // Merged: a model without adapters loads it and computes the adapted function.
  config.save_lora_base = true;
  config.merge_lora = true;
  torch::nn::Sequential merging = adapted_mlp(config);
  train(merging, 3);
  const at::Tensor merged_expected = merging->forward(x);
  bp::save_checkpoint(dir, "merged", merging.ptr().get(), nullptr, nullptr);
  EXPECT_FALSE(std::filesystem::exists(dir + "/merged/lora_adapter/" + shard()));
  torch::nn::Sequential plain = base_mlp();
  bp::load_checkpoint(dir, "merged", plain.ptr().get(), nullptr, nullptr);
  EXPECT_TRUE(at::allclose(plain->forward(x), merged_expected, 1e-5, 1e-6));
}

INSTANTIATE_TEST_SUITE_P(Tp, LoraCheckpointTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) { return "tp" + std::to_string(info.param); });

TEST(LoraConfigTest, BadValuesAndTargetsAreClearErrors) {
  bp::initialize_model_parallel(1);
  auto error_of = [](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const bp::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  bp::LoraConfig config = lora_config(0);
  config.bias = "some";
  EXPECT_NE(error_of([&] { bp::apply_lora(base_mlp(), config); }).find("bias 'some' is not one of none, all, lora_only"),
            std::string::npos);
  config = lora_config(0);
  config.lora_rank = 0;
  EXPECT_NE(error_of([&] { bp::apply_lora(base_mlp(), config); }).find("lora_rank 0 must be >= 1"), std::string::npos);
  config = lora_config(0);
  config.target_modules = {"q_proj"};
  EXPECT_NE(error_of([&] { bp::apply_lora(base_mlp(), config); })
                .find("target_modules [q_proj] match none of the model's linear layers (0, 2, 4)"),
            std::string::npos);
  config = lora_config(0);
  torch::nn::Sequential once = bp::apply_lora(base_mlp(), config);
  EXPECT_NE(error_of([&] { bp::apply_lora(once, config); }).find("layer '0' has a LoRA adapter already"), std::string::npos);
  config.merge_lora = true;
  EXPECT_NE(error_of([&] { bp::apply_lora(base_mlp(), config); }).find("merge_lora needs save_lora_base"),
            std::string::npos);
  bp::destroy_model_parallel();
}

}  // namespace
}  // namespace backplane::test
