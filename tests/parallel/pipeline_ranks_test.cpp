// Pipeline parallelism on real ranks: PP 2 (with DP 2 on 4 ranks, ZeRO-1 on and off) and PP 2 x TP 2
// (with and without activation checkpointing, whose recomputation runs the tensor-parallel collectives
// again) train to the losses, gradient norms and parameters of the unsharded model on the whole batch; each
// stage checkpoints its own layers and a resumed pipeline continues exactly. Part of bpl-parallel-test.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "backplane/parallel.h"
#include "shared_dir.h"

namespace bp = backplane::parallel;

namespace backplane::test {
namespace {

// Seven layers, tensor-parallel where they can be; the pipeline is cut after "3" (two linear layers per
// stage). The same weights for every layout: every rank draws the whole model from one seed.
torch::nn::Sequential pipelined_mlp(uint64_t seed = 11) {
  at::manual_seed(seed);
  auto column = [](int64_t in, int64_t out) {
    return bp::ColumnParallelLinear(bp::ColumnParallelLinearOptions(in, out).gather_output(false).keep_master_weight(true));
  };
  auto row = [](int64_t in, int64_t out) {
    return bp::RowParallelLinear(bp::RowParallelLinearOptions(in, out).input_is_parallel(true).keep_master_weight(true));
  };
  return torch::nn::Sequential(column(6, 8), torch::nn::Tanh(), row(8, 8), torch::nn::Tanh(), column(8, 8),
                               torch::nn::Tanh(), row(8, 3));
}

// The unsharded model with the same weights: plain linear layers from the tensor-parallel layers'
// master weights and (gathered) biases.
torch::nn::Sequential unsharded(const torch::nn::Sequential& model) {
  torch::nn::Sequential plain;
  at::NoGradGuard no_grad;
  auto tp = bp::get_tensor_model_parallel_group();
  for (size_t i = 0; i < model->size(); ++i) {
    if (auto column = std::dynamic_pointer_cast<bp::ColumnParallelLinearImpl>(model->ptr(i))) {
      torch::nn::Linear linear(column->master_weight.size(1), column->master_weight.size(0));
      linear->weight.copy_(column->master_weight);
      linear->bias.copy_(tp->all_gather(column->bias.detach(), 0));
      plain->push_back(std::to_string(i), linear);
    } else if (auto row = std::dynamic_pointer_cast<bp::RowParallelLinearImpl>(model->ptr(i))) {
      torch::nn::Linear linear(row->master_weight.size(1), row->master_weight.size(0));
      linear->weight.copy_(row->master_weight);
      linear->bias.copy_(row->bias);
      plain->push_back(std::to_string(i), linear);
    } else {
      plain->push_back(std::to_string(i), torch::nn::Tanh());
    }
  }
  return plain;
}

std::pair<at::Tensor, at::Tensor> global_batch(int step) {
  at::manual_seed(2000 + step);
  at::Tensor x = at::randn({8, 6});
  at::Tensor y = at::cos(x.sum(1, true)).repeat({1, 3}) + 0.1 * at::randn({8, 3});
  return {x, y};
}

at::Tensor mse(const at::Tensor& output, const at::Tensor& labels) { return at::mse_loss(output, labels); }

bp::ParallelConfig pipeline_config(int tp, bool zero_one) {
  bp::ParallelConfig config;
  config.tensor_parallel_size = tp;
  config.pipeline_parallel_size = 2;
  config.pipeline_config.pipeline_cuts = {"3"};
  config.pipeline_config.loss_fn = mse;
  config.optimizer_config.zero_one_enabled = zero_one;
  config.optimizer_config.max_grad_norm = 0.5;  // low enough to clip in the first steps
  return config;
}

// This rank's part of the data-parallel share of the global batch.
std::pair<at::Tensor, at::Tensor> data_parallel_share(const std::pair<at::Tensor, at::Tensor>& batch) {
  const int dp = bp::get_data_parallel_size(), dp_rank = bp::get_data_parallel_rank();
  return {batch.first.chunk(dp)[dp_rank], batch.second.chunk(dp)[dp_rank]};
}

// `parameter` whole: gathered over tensor parallelism along its partition dim if it is partitioned.
at::Tensor whole(const at::Tensor& parameter) {
  auto attributes = bp::tensor_model_parallel_attributes(parameter);
  if (!attributes) return parameter.detach();
  return bp::get_tensor_model_parallel_group()->all_gather(parameter.detach(), attributes->partition_dim);
}

class PipelineTest : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {
 protected:
  void TearDown() override { bp::destroy_model_parallel(); }
};

TEST_P(PipelineTest, TrainingMatchesTheUnshardedModelOnTheWholeBatch) {
  const auto [tp, zero_one, recompute] = GetParam();
  const int world = bp::get_world_size();
  if (world % (2 * tp) != 0) GTEST_SKIP() << "PP 2 x TP " << tp << " needs a multiple of " << 2 * tp << " ranks";
  bp::ParallelConfig config = pipeline_config(tp, zero_one);
  config.pipeline_config.num_microbatches = 8 / (world / (2 * tp)) / 2;  // 2 rows each
  if (recompute) config.activation_checkpoint_config = bp::ActivationCheckpointConfig::full();
  auto model = bp::initialize_parallel_model(config, [] { return pipelined_mlp(); });
  auto optimizer = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, model.parameters(),
                                                                         torch::optim::AdamOptions(0.01));
  const int stage = bp::get_pipeline_model_parallel_rank();
  ASSERT_EQ(model.module()->size(), stage == 0 ? 4u : 3u) << "stage " << stage << " keeps only its layers";

  torch::nn::Sequential reference = unsharded(pipelined_mlp());
  torch::optim::Adam reference_optimizer(reference->parameters(), torch::optim::AdamOptions(0.01));
  for (int step = 0; step < 6; ++step) {
    const auto batch = global_batch(step);
    const auto [x, y] = data_parallel_share(batch);
    optimizer.zero_grad();
    at::Tensor loss = model.run_train(x, y).reshape({1}).clone();
    optimizer.step();
    bp::get_data_parallel_group()->all_reduce(loss, bp::ReduceOp::Avg);

    reference_optimizer.zero_grad();
    at::Tensor reference_loss = at::mse_loss(reference->forward(batch.first), batch.second);
    reference_loss.backward();
    const double reference_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.5);
    reference_optimizer.step();

    EXPECT_NEAR(loss.item<double>(), reference_loss.item<double>(), 1e-5) << "step " << step << ", stage " << stage;
    ASSERT_TRUE(optimizer.grad_norm().has_value());
    EXPECT_NEAR(*optimizer.grad_norm(), reference_norm, 1e-5 * (1 + reference_norm)) << "step " << step;
  }
  const auto expected = reference->named_parameters();
  for (const auto& parameter : model.module()->named_parameters()) {
    ASSERT_TRUE(expected.contains(parameter.key())) << parameter.key();
    EXPECT_TRUE(at::allclose(whole(parameter.value()), expected[parameter.key()], 1e-4, 1e-5))
        << parameter.key() << " on stage " << stage << " after 6 steps";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineTest,
                         ::testing::Values(std::tuple{1, false, false}, std::tuple{1, true, false},
                                           std::tuple{2, false, false}, std::tuple{2, false, true}),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool, bool>>& info) {
                           return "pp2_tp" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_zero1" : "") +
                                  (std::get<2>(info.param) ? "_recomputed" : "");
                         });

class PipelineCheckpointTest : public SharedDirTest {};

TEST_F(PipelineCheckpointTest, EachStageSavesItsOwnLayersAndAResumedPipelineContinuesExactly) {
  if (bp::get_world_size() % 2 != 0) GTEST_SKIP() << "PP 2 needs an even number of ranks";
  bp::ParallelConfig config = pipeline_config(1, false);
  config.pipeline_config.num_microbatches = 2;
  auto train = [&](auto& model, bp::ParallelOptimizer& optimizer, int step) {
    const auto [x, y] = data_parallel_share(global_batch(step));
    optimizer.zero_grad();
    const double loss = model.run_train(x, y).template item<double>();
    optimizer.step();
    return loss;
  };
  auto model = bp::initialize_parallel_model(config, [] { return pipelined_mlp(); });
  auto optimizer = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, model.parameters(),
                                                                         torch::optim::AdamOptions(0.01));
  for (int step = 0; step < 2; ++step) train(model, optimizer, step);
  bp::save_checkpoint(dir, "step_2", model.module().ptr().get(), &optimizer, nullptr);
  for (const char* file : {"dp_rank_00_tp_rank_00_pp_rank_00.pt", "dp_rank_00_tp_rank_00_pp_rank_01.pt"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/step_2/model/" + file)) << file;
  }
  std::vector<double> continued;
  for (int step = 2; step < 4; ++step) continued.push_back(train(model, optimizer, step));

  auto resumed = bp::initialize_parallel_model(config, [] { return pipelined_mlp(/*seed=*/99); });
  auto resumed_optimizer = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, resumed.parameters(),
                                                                                 torch::optim::AdamOptions(0.01));
  bp::load_checkpoint(dir, "step_2", resumed.module().ptr().get(), &resumed_optimizer, nullptr);
  for (int step = 2; step < 4; ++step) {
    EXPECT_EQ(train(resumed, resumed_optimizer, step), continued[static_cast<size_t>(step - 2)]) << "step " << step;
  }
}

}  // namespace
}  // namespace backplane::test
