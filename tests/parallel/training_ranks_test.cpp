// The training APIs on real ranks: data-parallel training equals one process on the whole batch (ZeRO-1
// on and off), gradient clipping across tensor parallelism equals the unsharded model's, and ZeRO-1
// shards optimizer state. Part of bpl-parallel-test (main in parallel_ranks_test.cpp).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backplane/parallel.h"
#include "shared_dir.h"

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

TEST(ModelWrapperTest, ParametersStartIdenticalOnEveryDataParallelRank) {
  auto model = bp::initialize_parallel_model(bp::ParallelConfig{}, [] {
    at::manual_seed(static_cast<uint64_t>(100 + bp::get_rank()));  // every rank draws different weights
    return torch::nn::Sequential(torch::nn::Linear(3, 4));
  });
  auto dp = bp::get_data_parallel_group();
  for (const at::Tensor& p : model.parameters()) {
    at::Tensor everyone = dp->all_gather(p.detach().unsqueeze(0), 0);
    for (int r = 0; r < dp->size(); ++r) {
      EXPECT_TRUE(everyone[r].equal(everyone[0])) << "rank " << r << " differs from the DP source";
    }
  }
  EXPECT_EQ(model.dtype(), at::kFloat);
  bp::destroy_model_parallel();
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

/* ---- checkpoints ---- */

// One DP training step of the small MLP on global batch `step`; returns the job-wide loss.
double train_step(bp::ParallelModel<torch::nn::Sequential>& model, bp::ParallelOptimizer& optimizer, int step) {
  auto [x, y] = global_batch(step);
  const int dp = bp::get_data_parallel_size(), dp_rank = bp::get_data_parallel_rank();
  optimizer.zero_grad();
  at::Tensor loss = at::mse_loss(model.run_train(x.chunk(dp)[dp_rank]), y.chunk(dp)[dp_rank]);
  loss.backward();
  optimizer.step();
  at::Tensor total = loss.detach().reshape({1}).clone();
  bp::get_data_parallel_group()->all_reduce(total, bp::ReduceOp::Avg);
  return total.item<double>();
}

// A learning-rate schedule's state, as a Stateful the checkpoint carries.
struct StepCounter : bp::Stateful {
  int64_t steps = 0;
  void save(torch::serialize::OutputArchive& archive) const override { archive.write("steps", c10::IValue(steps)); }
  void load(torch::serialize::InputArchive& archive) override {
    c10::IValue value;
    archive.read("steps", value);
    steps = value.toInt();
  }
};

class CheckpointTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { dir = shared_temp_dir(); }
  void TearDown() override {
    remove_shared_temp_dir(dir);
    bp::destroy_model_parallel();
  }
  std::string dir;
};

TEST_P(CheckpointTest, ResumingFromStep10RepeatsSteps11To20Exactly) {
  const bool zero_one = GetParam();
  if (8 % bp::get_world_size() != 0) GTEST_SKIP() << "the batch of 8 does not split over the ranks";
  bp::ParallelConfig config;
  config.optimizer_config.zero_one_enabled = zero_one;
  auto model = bp::initialize_parallel_model(config, small_mlp);
  auto optimizer = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, model.parameters(),
                                                                         torch::optim::AdamOptions(0.01));
  std::vector<double> first_run;
  StepCounter schedule;
  for (int step = 1; step <= 20; ++step) {
    first_run.push_back(train_step(model, optimizer, step));
    schedule.steps = step;
    // Step 10 asynchronously: it completes at the next save (step 15), which is synchronous.
    if (step == 10 || step == 15) {
      bp::save_checkpoint(dir, "step_" + std::to_string(step), model.module().ptr().get(), &optimizer, &schedule,
                          {{"step", c10::IValue(int64_t{step})}}, -1, /*async_save=*/step == 10);
    }
  }
  EXPECT_EQ(bp::list_completed_checkpoint_tags(dir), (std::vector<std::string>{"step_10", "step_15"}));

  // A new model and optimizer, resumed from step 10.
  auto resumed = bp::initialize_parallel_model(config, [] {
    at::manual_seed(99);  // different initial weights: the checkpoint must replace them
    return torch::nn::Sequential(torch::nn::Linear(6, 10), torch::nn::Tanh(), torch::nn::Linear(10, 3));
  });
  auto resumed_optimizer = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, resumed.parameters(),
                                                                                 torch::optim::AdamOptions(0.01));
  StepCounter resumed_schedule;
  bp::UserContent content =
      bp::load_checkpoint(dir, "step_10", resumed.module().ptr().get(), &resumed_optimizer, &resumed_schedule);
  ASSERT_EQ(content.count("step"), 1u);
  EXPECT_EQ(content["step"].toInt(), 10);
  EXPECT_EQ(resumed_schedule.steps, 10) << "the scheduler's state came back";
  for (int step = 11; step <= 20; ++step) {
    EXPECT_EQ(train_step(resumed, resumed_optimizer, step), first_run[static_cast<size_t>(step - 1)]) << "step " << step;
  }
  // Without a tag the newest complete one loads.
  EXPECT_EQ(bp::load_checkpoint(dir, "", resumed.module().ptr().get(), nullptr, nullptr)["step"].toInt(), 15);
}

INSTANTIATE_TEST_SUITE_P(Zero1, CheckpointTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "zero1" : "plain"; });

class CheckpointFilesTest : public CheckpointTest {};

TEST_F(CheckpointFilesTest, KeepsTheNewestTagsAndNamesABadFile) {
  bp::ParallelConfig config;
  auto model = bp::initialize_parallel_model(config, small_mlp);
  for (const char* tag : {"a", "b", "c"}) {
    bp::save_checkpoint(dir, tag, model.module().ptr().get(), nullptr, nullptr, {}, /*num_kept_ckpts=*/2);
  }
  EXPECT_EQ(bp::list_completed_checkpoint_tags(dir), (std::vector<std::string>{"b", "c"}));
  EXPECT_FALSE(std::filesystem::exists(dir + "/a")) << "the oldest tag is removed";
  EXPECT_TRUE(std::filesystem::exists(dir + "/c/model/dp_rank_00_tp_rank_00_pp_rank_00.pt"));

  // A truncated shard is an error naming the file, on every rank that reads it.
  const std::string shard = dir + "/c/model/dp_rank_00_tp_rank_00_pp_rank_00.pt";
  bp::get_world_group()->barrier();
  if (bp::get_rank() == 0) std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 2);
  bp::get_world_group()->barrier();
  try {
    bp::load_checkpoint(dir, "c", model.module().ptr().get(), nullptr, nullptr);
    ADD_FAILURE() << "a truncated shard loaded";
  } catch (const bp::Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_IO);
    EXPECT_NE(std::string(e.what()).find(shard + " is corrupt"), std::string::npos) << e.what();
  }
  try {
    bp::load_checkpoint(dir, "missing", model.module().ptr().get(), nullptr, nullptr);
    ADD_FAILURE() << "a missing tag loaded";
  } catch (const bp::Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_NOT_FOUND);
  }
}

// Flips four bytes in the middle of `file` (its size unchanged), on rank 0, between barriers.
void flip_four_bytes(const std::string& file) {
  bp::get_world_group()->barrier();
  if (bp::get_rank() == 0) {
    std::fstream bytes(file, std::ios::in | std::ios::out | std::ios::binary);
    bytes.seekg(static_cast<std::streamoff>(std::filesystem::file_size(file) / 2));
    char four[4];
    bytes.read(four, 4);
    for (char& c : four) c = static_cast<char>(~c);
    bytes.seekp(static_cast<std::streamoff>(std::filesystem::file_size(file) / 2));
    bytes.write(four, 4);
  }
  bp::get_world_group()->barrier();
}

// 6. A shard with four bytes flipped (same size: the archive still parses) is refused, naming it; with
//    no tag, the newest tag whose files every rank can read loads instead.
TEST_F(CheckpointFilesTest, ACorruptedShardIsRefusedAndTheNewestIntactTagLoadsInstead) {
  bp::ParallelConfig config;
  auto model = bp::initialize_parallel_model(config, small_mlp);
  bp::save_checkpoint(dir, "older", model.module().ptr().get(), nullptr, nullptr, {{"step", c10::IValue(int64_t{1})}});
  bp::save_checkpoint(dir, "newer", model.module().ptr().get(), nullptr, nullptr, {{"step", c10::IValue(int64_t{2})}});
  const std::string shard = dir + "/newer/model/dp_rank_00_tp_rank_00_pp_rank_00.pt";
  flip_four_bytes(shard);
  try {
    bp::load_checkpoint(dir, "newer", model.module().ptr().get(), nullptr, nullptr);
    ADD_FAILURE() << "a shard with flipped bytes loaded";
  } catch (const bp::Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_IO);
    EXPECT_NE(std::string(e.what()).find(shard + " is corrupt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("crc32="), std::string::npos) << e.what();
  }
  EXPECT_EQ(bp::load_checkpoint(dir, "", model.module().ptr().get(), nullptr, nullptr)["step"].toInt(), 1);

  // Nothing intact at all: a clear NOT_FOUND naming the newest tag's problem.
  flip_four_bytes(dir + "/older/model/dp_rank_00_tp_rank_00_pp_rank_00.pt");
  try {
    bp::load_checkpoint(dir, "", model.module().ptr().get(), nullptr, nullptr);
    ADD_FAILURE() << "a corrupted checkpoint loaded";
  } catch (const bp::Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_NOT_FOUND);
    EXPECT_NE(std::string(e.what()).find("can be loaded by every rank (the newest, newer: "), std::string::npos) << e.what();
  }
}

// 6. The temporaries a killed save left (its process ended) go at the next save; a live writer's stay.
TEST_F(CheckpointFilesTest, TheTemporariesOfAKilledSaveAreRemoved) {
  bp::ParallelConfig config;
  auto model = bp::initialize_parallel_model(config, small_mlp);
  bp::save_checkpoint(dir, "a", model.module().ptr().get(), nullptr, nullptr);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const pid_t ended = fork();
  if (ended == 0) _exit(0);
  waitpid(ended, nullptr, 0);
  const std::string dead = std::string(".tmp.") + host + "." + std::to_string(ended);
  const std::string alive = std::string(".tmp.") + host + "." + std::to_string(getppid());
  bp::get_world_group()->barrier();
  if (bp::get_rank() == 0) {
    for (const std::string& name : {"/a/checkpoint" + dead, "/a/model/x.pt" + dead, "/a/checkpoint.tmp." +
                                    std::to_string(ended), "/a/checkpoint" + alive}) {
      std::ofstream(dir + name) << "left";
    }
  }
  bp::get_world_group()->barrier();
  bp::save_checkpoint(dir, "a", model.module().ptr().get(), nullptr, nullptr);
  EXPECT_FALSE(std::filesystem::exists(dir + "/a/checkpoint" + dead));
  EXPECT_FALSE(std::filesystem::exists(dir + "/a/model/x.pt" + dead));
  EXPECT_FALSE(std::filesystem::exists(dir + "/a/checkpoint.tmp." + std::to_string(ended))) << "an older version's name";
  EXPECT_TRUE(std::filesystem::exists(dir + "/a/checkpoint" + alive)) << "a live process's temporary";
  EXPECT_EQ(bp::list_completed_checkpoint_tags(dir), (std::vector<std::string>{"a"}));
}

}  // namespace
}  // namespace backplane::test
