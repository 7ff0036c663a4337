// Going on after a failure, in the frontend, on real ranks with nothing failing: ProcessGroup's revoke,
// agree and shrink on a group of its own (the world stays usable for the other tests), and
// ElasticTrainer's steps, which must equal one process training on every whole batch, however unevenly
// the batch divides among the replicas. What a failure does is elastic_training_test's (real kills).
// Part of bpl-parallel-test (main in parallel_ranks_test.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include "backplane/parallel.h"

namespace bp = backplane::parallel;

namespace backplane::test {
namespace {

bool backend_can_recover() { return bp::get_backend() == "gloo"; }

class RecoveryTest : public ::testing::Test {
 protected:
  void TearDown() override { bp::destroy_model_parallel(); }
};

TEST_F(RecoveryTest, AgreeRevokeAndShrinkAGroup) {
  std::shared_ptr<bp::ProcessGroup> world = bp::get_world_group();
  std::shared_ptr<bp::ProcessGroup> group = world->split(0, world->rank());
  const int n = group->size();
  if (!backend_can_recover()) {
    try {
      group->revoke();
      ADD_FAILURE() << "revoke on " << bp::get_backend() << " should be unsupported";
    } catch (const bp::Error& e) {
      EXPECT_EQ(e.status(), BPL_ERR_UNSUPPORTED) << e.what();
    }
    return;
  }
  // Each member passes every bit but its own rank's: the AND has none of the members' bits.
  const int32_t all = (1 << 8) - 1;
  const bp::ProcessGroup::Agreement agreed = group->agree(all & ~(1 << group->rank()));
  EXPECT_EQ(agreed.flags, all & ~((1 << n) - 1));
  EXPECT_TRUE(agreed.failed.empty());

  // Revoked by rank 0: every member's next operation fails so, the one blocked in it included.
  if (group->rank() == 0) group->revoke();
  at::Tensor one = at::ones({1}, at::kInt);
  try {
    group->all_reduce(one);
    ADD_FAILURE() << "an all_reduce on a revoked group succeeded";
  } catch (const bp::Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_REVOKED) << e.what();
    EXPECT_NE(std::string(e.what()).find("revoked (bpl_comm_revoke) by rank 0"), std::string::npos) << e.what();
  }

  // Nobody failed: the shrunk group has every member, in order, and works.
  const bp::ProcessGroup::Shrunk shrunk = group->shrink();
  EXPECT_TRUE(shrunk.failed.empty());
  ASSERT_NE(shrunk.group, nullptr);
  EXPECT_EQ(shrunk.group->size(), n);
  EXPECT_EQ(shrunk.group->rank(), group->rank());
  EXPECT_EQ(shrunk.group->ranks(), world->ranks());
  at::Tensor sum = at::ones({1}, at::kInt);
  shrunk.group->all_reduce(sum);
  EXPECT_EQ(sum.item<int>(), n);
}

// A 4 -> 3 linear model, in double precision.
torch::nn::Linear small_model() {
  at::manual_seed(11);
  torch::nn::Linear model(torch::nn::LinearOptions(4, 3));
  model->to(at::kDouble);
  return model;
}

std::pair<at::Tensor, at::Tensor> batch(int64_t step, int64_t rows) {
  at::manual_seed(static_cast<uint64_t>(500 + step));
  at::Tensor x = at::randn({rows, 4}, at::kDouble);
  return {x, at::cos(x.sum(1, true)).repeat({1, 3})};
}

// 7 rows per step: shares of 4 and 3 rows on 2 ranks, 2, 2, 2 and 1 on 4.
TEST_F(RecoveryTest, ElasticStepsEqualOneProcessOnTheWholeBatch) {
  const int64_t rows = 7, steps = 5;
  bp::ParallelConfig config;
  config.optimizer_config.grad_clipping = false;
  auto model = bp::initialize_parallel_model(config, small_model);
  auto optimizer = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, model.parameters(),
                                                                         torch::optim::AdamOptions(0.05));
  bp::ElasticOptions options;
  options.global_batch_size = rows;
  bp::ElasticTrainer trainer(*model.module(), optimizer, options);
  int64_t rows_seen = 0;
  while (trainer.steps_done() < steps) {
    const bool stepped = trainer.step([&](const bp::BatchShare& share) {
      auto [x, y] = batch(share.step, rows);
      rows_seen += share.end - share.begin;
      at::Tensor loss = at::mse_loss(model->forward(x.slice(0, share.begin, share.end)),
                                     y.slice(0, share.begin, share.end)) * share.loss_scale;
      loss.backward();
    });
    ASSERT_TRUE(stepped);
  }
  EXPECT_EQ(trainer.failures(), 0);
  at::Tensor seen = at::full({1}, rows_seen, at::kLong);
  bp::get_world_group()->all_reduce(seen);
  EXPECT_EQ(seen.item<int64_t>(), rows * steps) << "every row of every batch, once";

  torch::nn::Linear alone = small_model();
  torch::optim::Adam adam(alone->parameters(), torch::optim::AdamOptions(0.05));
  for (int64_t step = 0; step < steps; ++step) {
    auto [x, y] = batch(step, rows);
    adam.zero_grad();
    at::mse_loss(alone->forward(x), y).backward();
    adam.step();
  }
  const auto mine = model->parameters(), reference = alone->parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_TRUE(at::allclose(mine[i], reference[i], 1e-9, 1e-12))
        << "parameter " << i << ": max |difference| " << (mine[i] - reference[i]).abs().max().item<double>();
  }
}

TEST_F(RecoveryTest, ElasticTrainerRefusesWhatItCannotCarryOn) {
  bp::ParallelConfig config;
  config.optimizer_config.zero_one_enabled = true;
  auto model = bp::initialize_parallel_model(config, small_model);
  auto sharded = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, model.parameters(),
                                                                       torch::optim::AdamOptions(0.05));
  bp::ElasticOptions options;
  options.global_batch_size = 8;
  try {
    bp::ElasticTrainer trainer(*model.module(), sharded, options);
    ADD_FAILURE() << "ZeRO-1 accepted";
  } catch (const bp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_one_enabled"), std::string::npos) << e.what();
  }
  config.optimizer_config.zero_one_enabled = false;
  auto whole = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, model.parameters(),
                                                                     torch::optim::AdamOptions(0.05));
  options.global_batch_size = bp::get_data_parallel_size() - 1;
  try {
    bp::ElasticTrainer trainer(*model.module(), whole, options);
    ADD_FAILURE() << "a global batch smaller than the data-parallel size accepted";
  } catch (const bp::Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("global_batch_size " + std::to_string(options.global_batch_size)),
              std::string::npos) << e.what();
  }
  // Ranks that disagree on the batch get an error, every one of them.
  options.global_batch_size = 8 + (bp::get_rank() == 1 ? 1 : 0);
  try {
    bp::ElasticTrainer trainer(*model.module(), whole, options);
    ADD_FAILURE() << "rank " << bp::get_rank() << " accepted global batches of 8 and 9 rows";
  } catch (const bp::Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_MISMATCH) << e.what();
    EXPECT_NE(std::string(e.what()).find("global_batch_size from 8 to 9"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace backplane::test
