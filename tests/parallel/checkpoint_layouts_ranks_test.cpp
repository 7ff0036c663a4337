// Checkpoints across layouts on real ranks: a model saved at TP 2 loads at TP 1, saved again loads at
// TP 4, and computes the same outputs each time (padded layers included); a pipeline saved at PP 2 loads
// unpipelined; an unsharded export reads with torch::load into a one-rank model and imports at any TP.
// Part of bpl-parallel-test.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/adam.h>
#include <torch/serialize.h>

#include <filesystem>
#include <string>

#include "backplane/parallel.h"
#include "shared_dir.h"

namespace bp = backplane::parallel;

namespace backplane::test {
namespace {

// Column- and row-parallel layers (the first pair with interleaved partitions: stride 2), a gathered output
// with its whole bias, and a pair padded to whole heads of 2 (6 rows: padded to 8 at TP 2 and 4, not at
// TP 1).
torch::nn::Sequential layered_model(uint64_t seed, const bp::GroupPtr& group = nullptr) {
  at::manual_seed(seed);
  return torch::nn::Sequential(
      bp::ColumnParallelLinear(
          bp::ColumnParallelLinearOptions(6, 8).gather_output(false).stride(2).tensor_model_parallel_group(group)),
      torch::nn::Tanh(),
      bp::RowParallelLinear(
          bp::RowParallelLinearOptions(8, 8).input_is_parallel(true).stride(2).tensor_model_parallel_group(group)),
      torch::nn::Tanh(),
      bp::ColumnParallelLinear(bp::ColumnParallelLinearOptions(8, 6)
                                   .gather_output(false)
                                   .pad(true)
                                   .pad_alignment_size_per_rank(2)
                                   .tensor_model_parallel_group(group)),
      torch::nn::Tanh(),
      bp::RowParallelLinear(bp::RowParallelLinearOptions(6, 4)
                                .input_is_parallel(true)
                                .pad(true)
                                .pad_alignment_size_per_rank(2)
                                .tensor_model_parallel_group(group)),
      bp::ColumnParallelLinear(bp::ColumnParallelLinearOptions(4, 4).gather_output(true).tensor_model_parallel_group(group)));
}

at::Tensor probe() {
  at::manual_seed(90);
  return at::randn({5, 6});
}

class LayoutCheckpointTest : public SharedDirTest {};

// One Adam step on a fixed batch through the wrapped optimizer.
void adam_step(torch::nn::Sequential& model, bp::ParallelOptimizer& optimizer, int step) {
  at::manual_seed(95 + step);
  const at::Tensor x = at::randn({5, 6}), y = at::randn({5, 4});
  optimizer.zero_grad();
  at::mse_loss(model->forward(x), y).backward();
  optimizer.step();
}

bp::ParallelOptimizer adam_of(torch::nn::Sequential& model) {
  bp::ParallelConfig config;
  config.tensor_parallel_size = bp::get_tensor_model_parallel_size();
  return bp::initialize_parallel_optimizer<torch::optim::Adam>(config, model->parameters(), torch::optim::AdamOptions(0.05));
}

TEST_F(LayoutCheckpointTest, RoundTripsTp2ToTp1ToTp4WithIdenticalOutputsAndOptimizerState) {
  const int world = bp::get_world_size();
  if (world % 2 != 0) GTEST_SKIP() << "TP 2 needs an even number of ranks";
  const at::Tensor x = probe();
  bp::initialize_model_parallel(2);
  torch::nn::Sequential tp2 = layered_model(1);
  bp::ParallelOptimizer tp2_adam = adam_of(tp2);
  for (int step = 0; step < 3; ++step) adam_step(tp2, tp2_adam, step);  // moments worth moving
  const at::Tensor expected = tp2->forward(x).detach();
  bp::save_checkpoint(dir, "tp2", tp2.ptr().get(), &tp2_adam, nullptr);
  if (bp::get_rank() == 0) bp::export_unsharded_checkpoint(dir, "tp2", dir + "/whole.pt");
  adam_step(tp2, tp2_adam, 3);  // where every layout must get to from the checkpoint in one step
  const at::Tensor after_step = tp2->forward(x).detach();
  bp::destroy_model_parallel();

  bp::initialize_model_parallel(1);
  torch::nn::Sequential tp1 = layered_model(2);
  bp::ParallelOptimizer tp1_adam = adam_of(tp1);
  ASSERT_FALSE(at::allclose(tp1->forward(x), expected)) << "different weights before loading";
  bp::load_checkpoint(dir, "tp2", tp1.ptr().get(), &tp1_adam, nullptr);
  EXPECT_TRUE(at::allclose(tp1->forward(x), expected, 1e-5, 1e-6)) << "TP 2 -> TP 1";
  bp::save_checkpoint(dir, "tp1", tp1.ptr().get(), &tp1_adam, nullptr);
  adam_step(tp1, tp1_adam, 3);
  EXPECT_TRUE(at::allclose(tp1->forward(x), after_step, 1e-5, 1e-6)) << "the next Adam step, with the moved moments";
  bp::destroy_model_parallel();

  if (world % 4 == 0) {
    bp::initialize_model_parallel(4);
    torch::nn::Sequential tp4 = layered_model(3);
    bp::ParallelOptimizer tp4_adam = adam_of(tp4);
    bp::load_checkpoint(dir, "tp1", tp4.ptr().get(), &tp4_adam, nullptr);
    EXPECT_TRUE(at::allclose(tp4->forward(x), expected, 1e-5, 1e-6)) << "TP 1 -> TP 4";
    adam_step(tp4, tp4_adam, 3);
    EXPECT_TRUE(at::allclose(tp4->forward(x), after_step, 1e-5, 1e-6)) << "the next Adam step at TP 4";
    torch::nn::Sequential imported = layered_model(4);
    bp::get_world_group()->barrier();  // rank 0 wrote whole.pt
    bp::load_unsharded_checkpoint(dir + "/whole.pt", *imported);
    EXPECT_TRUE(at::allclose(imported->forward(x), expected, 1e-5, 1e-6)) << "unsharded -> TP 4";
    bp::destroy_model_parallel();
  }

  // The unsharded file is what torch::save writes for a module: torch::load reads it into the model on
  // a group of one rank.
  bp::initialize_model_parallel(1);
  bp::get_world_group()->barrier();
  torch::nn::Sequential alone = layered_model(5, bp::get_world_group()->split(bp::get_rank(), 0));
  torch::load(alone, dir + "/whole.pt");
  EXPECT_TRUE(at::allclose(alone->forward(x), expected, 1e-5, 1e-6)) << "torch::load of the export";
  EXPECT_EQ(alone->named_parameters()["4.weight"].size(0), 6) << "the export holds no padding";

  // A ZeRO-1 optimizer's shards do not move between layouts: a clear error.
  bp::ParallelConfig zero;
  zero.optimizer_config.zero_one_enabled = true;
  torch::nn::Sequential sharded = layered_model(6);
  auto zero_adam = bp::initialize_parallel_optimizer<torch::optim::Adam>(zero, sharded->parameters(), torch::optim::AdamOptions(0.05));
  try {
    bp::load_checkpoint(dir, "tp2", sharded.ptr().get(), &zero_adam, nullptr);
    ADD_FAILURE() << "a ZeRO-1 optimizer loaded a non-ZeRO-1 state";
  } catch (const bp::Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_MISMATCH) << e.what();
    EXPECT_NE(std::string(e.what()).find("holds a non-ZeRO-1 optimizer; this optimizer is ZeRO-1 over " +
                                         std::to_string(world) + " data-parallel ranks"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(LayoutCheckpointTest, APipelineSavedAtPp2LoadsUnpipelined) {
  const int world = bp::get_world_size();
  if (world % 2 != 0) GTEST_SKIP() << "PP 2 needs an even number of ranks";
  bp::ParallelConfig config;
  config.pipeline_parallel_size = 2;
  config.tensor_parallel_size = world / 2;
  config.pipeline_config.pipeline_cuts = {"3"};
  config.pipeline_config.loss_fn = [](const at::Tensor& out, const at::Tensor& labels) { return at::mse_loss(out, labels); };
  at::manual_seed(91);
  const at::Tensor x = at::randn({4, 6}), y = at::randn({4, 4});
  auto pipelined = bp::initialize_parallel_model(config, [] { return layered_model(6); });
  const double expected = pipelined.run_train(x, y).item<double>();
  bp::save_checkpoint(dir, "pp2", pipelined.module().ptr().get(), nullptr, nullptr);
  bp::destroy_model_parallel();

  bp::initialize_model_parallel(1);
  torch::nn::Sequential whole = layered_model(7);
  bp::load_checkpoint(dir, "pp2", whole.ptr().get(), nullptr, nullptr);
  EXPECT_NEAR(at::mse_loss(whole->forward(x), y).item<double>(), expected, 1e-6);
}

}  // namespace
}  // namespace backplane::test
