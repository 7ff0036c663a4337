// The training APIs on real ranks: data-parallel training equals one process on the whole batch (ZeRO-1
// on and off), gradient clipping across tensor parallelism equals the unsharded model's, and ZeRO-1
// shards optimizer state. Part of bpl-parallel-test (main in parallel_ranks_test.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <string>
#include <vector>

#include "backplane/parallel.h"

namespace bp = backplane::parallel;

namespace backplane::test {
namespace {

torch::nn::Sequential small_mlp() {
  at::manual_seed(7);  // the same initial weights in every process
  return torch::nn::Sequential(torch::nn::Linear(6, 10), torch::nn::Tanh(), torch::nn::Linear(10, 3));
}

// A fixed synthetic regression task: global batch `step` of 8 rows.
std::pair<at::Tensor, at::Tensor> global_batch(int step) {
  at::manual_seed(1000 + step);
  at::Tensor x = at::randn({8, 6});
  at::Tensor y = at::sin(x.sum(1, true)).repeat({1, 3}) + 0.1 * at::randn({8, 3});
  return {x, y};
}

class DataParallelTest : public ::testing::TestWithParam<bool> {
 protected:
  void TearDown() override { bp::destroy_model_parallel(); }
};

TEST_P(DataParallelTest, TrainingMatchesOneProcessOnTheWholeBatch) {
  const bool zero_one = GetParam();
  const int world = bp::get_world_size();
  if (8 % world != 0) GTEST_SKIP() << "the batch of 8 does not split over " << world << " ranks";
  bp::ParallelConfig config;
  config.optimizer_config.zero_one_enabled = zero_one;
  config.optimizer_config.grad_clipping = true;
  config.optimizer_config.max_grad_norm = 0.5;  // low enough to clip in the first steps
  config.allreduce_bucket_cap_mb = 0.0002;      // ~200 bytes: several buckets, and a weight reduced alone
  auto model = bp::initialize_parallel_model(config, small_mlp);
  auto optimizer = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, model.parameters(),
                                                                         torch::optim::AdamOptions(0.01));
  EXPECT_EQ(optimizer.zero_one(), zero_one);
  EXPECT_FALSE(optimizer.grad_norm().has_value()) << "no norm before the first step";

  torch::nn::Sequential reference = small_mlp();
  torch::optim::Adam reference_optimizer(reference->parameters(), torch::optim::AdamOptions(0.01));

  const int dp = bp::get_data_parallel_size(), dp_rank = bp::get_data_parallel_rank();
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = global_batch(step);
    optimizer.zero_grad();
    at::Tensor local_loss = at::mse_loss(model.run_train(x.chunk(dp)[dp_rank]), y.chunk(dp)[dp_rank]);
    local_loss.backward();
    optimizer.step();
    at::Tensor loss = local_loss.detach().reshape({1}).clone();
    bp::get_data_parallel_group()->all_reduce(loss, bp::ReduceOp::Avg);

    reference_optimizer.zero_grad();
    at::Tensor reference_loss = at::mse_loss(reference->forward(x), y);
    reference_loss.backward();
    const double reference_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.5);
    reference_optimizer.step();

    EXPECT_NEAR(loss.item<double>(), reference_loss.item<double>(), 1e-5) << "step " << step;
    ASSERT_TRUE(optimizer.grad_norm().has_value());
    EXPECT_NEAR(*optimizer.grad_norm(), reference_norm, 1e-5 * (1 + reference_norm)) << "step " << step;
  }
  auto params = model.parameters(), expected = reference->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(at::allclose(params[i], expected[i], 1e-4, 1e-5)) << "parameter " << i << " after 20 steps";
  }
}

INSTANTIATE_TEST_SUITE_P(Zero1, DataParallelTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "zero1" : "plain"; });

TEST(Zero1Test, OptimizerStatePerRankIsAboutOneOverDp) {
  const int world = bp::get_world_size();
  bp::ParallelConfig plain_config, zero_config;
  zero_config.optimizer_config.zero_one_enabled = true;
  bp::initialize_parallel_config(plain_config);
  at::manual_seed(3);
  torch::nn::Linear layer(256, 256);  // 64 Ki weights: the state is dominated by tensors
  auto run_one_step = [&](bp::ParallelOptimizer& optimizer) {
    optimizer.zero_grad();
    layer(at::randn({4, 256})).sum().backward();
    optimizer.step();
    return optimizer.state_bytes();
  };
  auto plain = bp::initialize_parallel_optimizer<torch::optim::Adam>(plain_config, layer->parameters(),
                                                                     torch::optim::AdamOptions(1e-3));
  auto sharded = bp::initialize_parallel_optimizer<torch::optim::Adam>(zero_config, layer->parameters(),
                                                                       torch::optim::AdamOptions(1e-3));
  const int64_t plain_bytes = run_one_step(plain);
  const int64_t sharded_bytes = run_one_step(sharded);
  const int64_t parameter_bytes = (256 * 256 + 256) * 4;
  if (bp::get_rank() == 0) {
    std::printf("[ ZeRO-1   ] Adam state per rank: %lld bytes unsharded, %lld with ZeRO-1 over %d ranks (%.3f of "
                "unsharded; 1/dp = %.3f); fp32 master shards %lld bytes (%.3f of the parameters)\n",
                static_cast<long long>(plain_bytes), static_cast<long long>(sharded_bytes), world,
                static_cast<double>(sharded_bytes) / static_cast<double>(plain_bytes), 1.0 / world,
                static_cast<long long>(sharded.master_bytes()),
                static_cast<double>(sharded.master_bytes()) / static_cast<double>(parameter_bytes));
  }
  // Two moments, each 1/dp of the parameters (the serialised archive adds a few KiB of names and headers).
  EXPECT_GT(plain_bytes, 2 * parameter_bytes);
  EXPECT_LT(static_cast<double>(sharded_bytes), 2.0 * parameter_bytes / world * 1.05 + 8192);
  EXPECT_EQ(sharded.master_bytes(), parameter_bytes / world);  // 256 rows divide over 1, 2 and 4 ranks
  EXPECT_EQ(plain.master_bytes(), 0);
  bp::destroy_model_parallel();
}

/* ---- clipping across tensor parallelism ---- */

TEST(ClipGradNormTest, TheNormIsTheUnshardedModelsForTwoAndInfinityNorms) {
  const int world = bp::get_world_size();
  if (world % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  bp::initialize_model_parallel(2);
  for (double norm_type : {2.0, bp::kInfinityNorm}) {
    SCOPED_TRACE(std::isinf(norm_type) ? "inf norm" : "2-norm");
    at::manual_seed(61);
    bp::ColumnParallelLinear column(bp::ColumnParallelLinearOptions(8, 12).gather_output(false).keep_master_weight(true));
    bp::RowParallelLinear row(bp::RowParallelLinearOptions(12, 8).input_is_parallel(true).keep_master_weight(true));
    at::manual_seed(62);
    at::Tensor x = at::randn({5, 8});
    at::Tensor g = at::randn({5, 8}) * 50;  // large enough to clip
    (row(column(x)) * g).sum().backward();
    std::vector<at::Tensor> params = column->parameters();
    for (const at::Tensor& p : row->parameters()) params.push_back(p);

    torch::nn::Linear ref_column(8, 12), ref_row(12, 8);
    {
      at::NoGradGuard no_grad;
      auto tp = bp::get_tensor_model_parallel_group();
      ref_column->weight.copy_(column->master_weight);
      ref_column->bias.copy_(tp->all_gather(column->bias.detach(), 0));
      ref_row->weight.copy_(row->master_weight);
      ref_row->bias.copy_(row->bias);
    }
    (ref_row(ref_column(x)) * g).sum().backward();
    std::vector<at::Tensor> ref_params = {ref_column->weight, ref_column->bias, ref_row->weight, ref_row->bias};
    std::vector<at::Tensor> ref_grads;
    for (const at::Tensor& p : ref_params) ref_grads.push_back(p.grad().clone());

    const double norm = bp::clip_grad_norm(params, 1.0, norm_type);
    const double expected = torch::nn::utils::clip_grad_norm_(ref_params, 1.0, norm_type);
    EXPECT_NEAR(norm, expected, 1e-4 * expected);
    // Every gradient was scaled by the same factor the unsharded clip used.
    const double factor = 1.0 / (expected + 1e-6);
    auto tp = bp::get_tensor_model_parallel_group();
    EXPECT_TRUE(at::allclose(tp->all_gather(column->weight.grad(), 0), ref_grads[0] * factor, 1e-4, 1e-6));
    EXPECT_TRUE(at::allclose(row->bias.grad(), ref_grads[3] * factor, 1e-4, 1e-6));
  }
  bp::destroy_model_parallel();
}

}  // namespace
}  // namespace backplane::test
