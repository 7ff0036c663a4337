// The LibTorch frontend in one process: the group layout (computed without processes), CPU mode,
// partitioning, the one-rank fallback of layers built before initialize_model_parallel, and errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "backplane/parallel.h"
#include "memory.h"

namespace bp = backplane::parallel;

namespace backplane::test {
namespace {

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const bp::Error& e) {
    return e.what();
  }
  return "(no error)";
}

/* ---- the layout, against neuronx-distributed's tables (nxd-behaviour.md §2) ---- */

TEST(GroupLayoutTest, World8Tp2Pp2) {
  bp::GroupLayout layout = bp::compute_group_layout(8, 2, 2);
  EXPECT_EQ(layout.data_parallel_size, 2);
  EXPECT_EQ(layout.tensor_parallel, (bp::Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layout.data_parallel, (bp::Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(layout.pipeline_parallel, (bp::Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(GroupLayoutTest, World8Tp4Pp1) {
  bp::GroupLayout layout = bp::compute_group_layout(8, 4, 1);
  EXPECT_EQ(layout.data_parallel_size, 2);
  EXPECT_EQ(layout.tensor_parallel, (bp::Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(layout.data_parallel, (bp::Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(layout.pipeline_parallel, (bp::Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
}

TEST(GroupLayoutTest, World8Tp1Pp8) {
  bp::GroupLayout layout = bp::compute_group_layout(8, 1, 8);
  EXPECT_EQ(layout.data_parallel_size, 1);
  EXPECT_EQ(layout.tensor_parallel, (bp::Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(layout.data_parallel, (bp::Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(layout.pipeline_parallel, (bp::Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
}

TEST(GroupLayoutTest, SizesAboveTheWorldAreClampedAndBadSizesAreErrors) {
  bp::GroupLayout layout = bp::compute_group_layout(4, 16, 1);
  EXPECT_EQ(layout.tensor_parallel_size, 4);
  EXPECT_EQ(layout.tensor_parallel, (bp::Groups{{0, 1, 2, 3}}));
  std::string message = error_of([] { bp::compute_group_layout(6, 4, 1); });
  EXPECT_NE(message.find("invalid implied data parallel degree: world size 6 is not divisible by "
                         "tensor_model_parallel_size (4) x pipeline_model_parallel_size (1)"),
            std::string::npos)
      << message;
  EXPECT_NE(error_of([] { bp::compute_group_layout(8, 0, 1); }).find("tensor_model_parallel_size 0"), std::string::npos);
  EXPECT_NE(error_of([] { bp::compute_group_layout(0, 1, 1); }).find("world size 0"), std::string::npos);
}

/* ---- CPU mode ---- */

class CpuModeTest : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("NXD_CPU_MODE"); }
};

TEST_F(CpuModeTest, IsReadOnEveryCallAndNonIntegersAreErrors) {
  unsetenv("NXD_CPU_MODE");
  EXPECT_FALSE(bp::cpu_mode());
  setenv("NXD_CPU_MODE", "1", 1);
  EXPECT_TRUE(bp::cpu_mode());
  setenv("NXD_CPU_MODE", "0", 1);
  EXPECT_FALSE(bp::cpu_mode());
  setenv("NXD_CPU_MODE", "2", 1);
  EXPECT_TRUE(bp::cpu_mode());
  setenv("NXD_CPU_MODE", "", 1);  // empty is unset, as everywhere
  EXPECT_FALSE(bp::cpu_mode());
  for (const char* bad : {"yes", "1.5", "1 "}) {
    setenv("NXD_CPU_MODE", bad, 1);
    std::string message = error_of([] { bp::cpu_mode(); });
    EXPECT_NE(message.find(std::string("NXD_CPU_MODE='") + bad + "' is not an integer"), std::string::npos) << message;
  }
  setenv("NXD_CPU_MODE", "-3", 1);
  const std::string negative = error_of([] { bp::cpu_mode(); });
  EXPECT_NE(negative.find("NXD_CPU_MODE='-3' is negative"), std::string::npos) << negative;
  EXPECT_TRUE(bp::get_device().is_cpu());
}

/* ---- partitioning ---- */

TEST(PartitionTest, LocalWeightsTakeInterleavedBlocksWithStride) {
  at::Tensor full = at::arange(8, at::kFloat).reshape({8, 1});
  // stride 1: contiguous blocks
  EXPECT_TRUE(bp::create_local_weight(full, 0, 4, 1, 1, 2).flatten().equal(at::arange(4, 8, at::kFloat)));
  // stride 2: blocks of 2, rank 1 takes blocks 1 and 3
  EXPECT_TRUE(bp::create_local_weight(full, 0, 4, 2, 1, 2).flatten().equal(at::tensor({2.f, 3.f, 6.f, 7.f})));
  EXPECT_NE(error_of([&] { bp::create_local_weight(full, 0, 4, 3, 0, 2); }).find("stride 3"), std::string::npos);
  EXPECT_NE(error_of([&] { bp::split_along_dim(full, 0, 3, 0); }).find("has size 8, which does not divide into 3"),
            std::string::npos);
}

/* ---- one process: the fallback state, world-1 groups, teardown ---- */

class OneRankTest : public ::testing::Test {
 protected:
  void TearDown() override { bp::destroy_process_group(); }
};

TEST_F(OneRankTest, LayersBuiltBeforeInitializeFallBackToOneRankWithAWarning) {
  ASSERT_FALSE(bp::is_initialized());
  EXPECT_EQ(bp::rank_prefix(), "[rank_-1_pp-1_tp-1_dp-1_cp-1]");
  ::testing::internal::CaptureStderr();
  at::manual_seed(3);
  bp::ColumnParallelLinear layer(bp::ColumnParallelLinearOptions(4, 6).keep_master_weight(true));
  const std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find("ColumnParallelLinear was built before initialize_model_parallel()"), std::string::npos)
      << warning;
  EXPECT_TRUE(bp::model_parallel_is_initialized());
  EXPECT_EQ(bp::get_world_size(), 1);
  EXPECT_EQ(bp::get_tensor_model_parallel_size(), 1);
  EXPECT_EQ(bp::rank_prefix(), "[rank_0_pp0_tp0_dp0_cp0]");
  EXPECT_EQ(bp::rmsg("hello"), "[rank_0_pp0_tp0_dp0_cp0] hello");

  at::Tensor x = at::randn({2, 4});
  EXPECT_TRUE(at::allclose(layer(x), at::linear(x, layer->master_weight, layer->bias)));
  EXPECT_TRUE(layer->weight.equal(layer->master_weight)) << "one rank holds the whole master weight";
}

TEST_F(OneRankTest, UsageErrorsAreClear) {
  EXPECT_NE(error_of([] { bp::get_world_group(); }).find("call init_process_group() first"), std::string::npos);
  EXPECT_NE(error_of([] { bp::get_tensor_model_parallel_group(); }).find("call initialize_model_parallel() first"),
            std::string::npos);
  bp::init_process_group();
  EXPECT_NE(error_of([] { bp::init_process_group(); }).find("already initialised"), std::string::npos);
  bp::initialize_model_parallel(1);
  EXPECT_NE(error_of([] { bp::initialize_model_parallel(1); }).find("destroy_model_parallel() first"), std::string::npos);
  EXPECT_NE(error_of([] { bp::ColumnParallelLinear(bp::ColumnParallelLinearOptions(4, 6).sequence_parallel_enabled(true)); })
                .find("sequence_parallel_enabled needs gather_output=false"),
            std::string::npos);
  EXPECT_NE(error_of([] { bp::RowParallelLinear(bp::RowParallelLinearOptions(4, 6).sequence_parallel_enabled(true)); })
                .find("needs input_is_parallel=true"),
            std::string::npos);
  EXPECT_NE(error_of([] { bp::GQAQKVColumnParallelLinear(bp::GQAQKVColumnParallelLinearOptions(4, 8, 4).kv_size_multiplier(2)); })
                .find("kv_size_multiplier 2 must be >= 1 and divide the tensor-parallel size 1"),
            std::string::npos);

  // A group a module still holds outlives destroy_process_group, and then says so when used.
  bp::GroupPtr held = bp::get_tensor_model_parallel_group();
  // The torch backend refuses such a tensor in the same words (test_process_group.py): one bridge.
  at::Tensor flags = at::ones({2}, at::kBool);
  EXPECT_NE(error_of([&] { held->all_reduce(flags); })
                .find("all_reduce: the input has dtype Bool, which backplane does not move (it moves float32,"),
            std::string::npos);
  bp::destroy_process_group();
  at::Tensor t = at::ones({2});
  EXPECT_NE(error_of([&] { held->all_reduce(t); }).find("used after destroy_process_group()"), std::string::npos);
}

TEST_F(OneRankTest, MasterPrintPrintsOnRankZero) {
  bp::init_process_group();
  ::testing::internal::CaptureStdout();
  bp::master_print("Output sum is 1.5");
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "Output sum is 1.5\n");
}

/* ---- BF16 environment ---- */

struct MixedModule : torch::nn::Module {
  MixedModule() {
    f32 = register_parameter("f32", at::ones({2}));
    f64 = register_parameter("f64", at::ones({2}, at::kDouble));
    steps = register_buffer("steps", at::zeros({1}, at::kLong));
  }
  at::Tensor f32, f64, steps;
};

class Bf16Test : public OneRankTest {
 protected:
  void TearDown() override {
    unsetenv("XLA_USE_BF16");
    unsetenv("XLA_DOWNCAST_BF16");
    OneRankTest::TearDown();
  }
};

TEST_F(Bf16Test, UseBf16AndDowncastBf16ChangeParameterDtypesAsDocumented) {
  {
    MixedModule m;
    EXPECT_EQ(bp::apply_bf16_environment(m), at::kFloat) << "nothing set: unchanged";
    EXPECT_EQ(m.f64.scalar_type(), at::kDouble);
  }
  setenv("XLA_USE_BF16", "1", 1);
  {
    MixedModule m;
    EXPECT_EQ(bp::apply_bf16_environment(m), at::kBFloat16);
    EXPECT_EQ(m.f32.scalar_type(), at::kBFloat16);
    EXPECT_EQ(m.f64.scalar_type(), at::kBFloat16);
    EXPECT_EQ(m.steps.scalar_type(), at::kLong) << "integers stay";
    EXPECT_TRUE(m.parameters()[0].requires_grad()) << "still a parameter";
  }
  unsetenv("XLA_USE_BF16");
  setenv("XLA_DOWNCAST_BF16", "1", 1);
  {
    MixedModule m;
    bp::apply_bf16_environment(m);
    EXPECT_EQ(m.f32.scalar_type(), at::kBFloat16);
    EXPECT_EQ(m.f64.scalar_type(), at::kFloat);
  }
  {
    auto model = bp::initialize_parallel_model(bp::ParallelConfig{}, [] { return std::make_shared<MixedModule>(); });
    EXPECT_EQ(model.dtype(), at::kBFloat16) << "the model wrapper applies it";
  }
  setenv("XLA_DOWNCAST_BF16", "yes", 1);
  MixedModule m;
  EXPECT_NE(error_of([&] { bp::apply_bf16_environment(m); }).find("XLA_DOWNCAST_BF16='yes' is not valid"), std::string::npos);
}

TEST_F(OneRankTest, InvalidConfigsAreClearErrors) {
  bp::ParallelConfig pipeline;
  pipeline.pipeline_parallel_size = 2;
  EXPECT_NE(error_of([&] { bp::initialize_parallel_config(pipeline); })
                .find("pipeline_parallel_size 2 needs pipeline_config.loss_fn"),
            std::string::npos);
  pipeline.pipeline_config.loss_fn = [](const at::Tensor& out, const at::Tensor& labels) { return at::mse_loss(out, labels); };
  EXPECT_NE(error_of([&] { bp::initialize_parallel_config(pipeline); }).find("pipeline_parallel_size 2 exceeds the world size 1"),
            std::string::npos);
  pipeline.pipeline_parallel_size = 1;
  pipeline.pipeline_config.num_microbatches = 0;
  EXPECT_NE(error_of([&] { bp::initialize_parallel_config(pipeline); }).find("num_microbatches 0 must be >= 1"),
            std::string::npos);
  bp::ParallelConfig too_wide;
  too_wide.tensor_parallel_size = 4;
  EXPECT_NE(error_of([&] { bp::initialize_parallel_config(too_wide); }).find("tensor_parallel_size 4 exceeds the world size 1"),
            std::string::npos);
  bp::ParallelConfig crowded;
  crowded.model_init_config.sequential_move_factor = 33;
  EXPECT_NE(error_of([&] { bp::initialize_parallel_config(crowded); }).find("sequential_move_factor 33 must be in 1..32"),
            std::string::npos);
  bp::ParallelConfig uninitialised;
  uninitialised.model_init_config.meta_device_init = true;
  EXPECT_NE(error_of([&] { bp::initialize_parallel_config(uninitialised); }).find("meta_device_init needs param_init_fn"),
            std::string::npos);
  bp::ParallelConfig no_norm;
  no_norm.optimizer_config.max_grad_norm = 0;
  EXPECT_NE(error_of([&] { bp::initialize_parallel_config(no_norm); }).find("max_grad_norm 0"), std::string::npos);
}

/* ---- pipeline parallelism without processes ---- */

TEST(PipelineStagesTest, CutsEndStagesAndWithoutCutsTheLayersSplitEvenly) {
  const std::vector<std::string> layers = {"embed", "0", "1", "2", "3", "head"};
  using Bounds = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(bp::pipeline_stage_bounds(layers, {"1"}, 2), (Bounds{{0, 3}, {3, 6}}));
  EXPECT_EQ(bp::pipeline_stage_bounds(layers, {"embed", "2"}, 3), (Bounds{{0, 1}, {1, 4}, {4, 6}}));
  EXPECT_EQ(bp::pipeline_stage_bounds(layers, {}, 4), (Bounds{{0, 2}, {2, 4}, {4, 5}, {5, 6}}));
  EXPECT_EQ(bp::pipeline_stage_bounds(layers, {}, 1), (Bounds{{0, 6}}));

  EXPECT_NE(error_of([&] { bp::pipeline_stage_bounds(layers, {"5"}, 2); })
                .find("pipeline_cuts names '5', which is not a layer of the model (its layers: embed, 0, 1, 2, 3, head)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { bp::pipeline_stage_bounds(layers, {"2", "1"}, 3); })
                .find("pipeline_cuts '1' does not come after '2'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { bp::pipeline_stage_bounds(layers, {"1", "1"}, 3); }).find("does not come after"),
            std::string::npos);
  EXPECT_NE(error_of([&] { bp::pipeline_stage_bounds(layers, {"1"}, 3); })
                .find("pipeline_cuts has 1 names (1) for pipeline_parallel_size 3: expected 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { bp::pipeline_stage_bounds(layers, {"head"}, 2); })
                .find("'head' is the model's last layer: the last stage would have none"),
            std::string::npos);
  EXPECT_NE(error_of([&] { bp::pipeline_stage_bounds({"a", "b"}, {}, 3); })
                .find("a model of 2 layers cannot make 3 stages"),
            std::string::npos);
}

TEST(PipelineStagesTest, AStageSharesTheModelsLayersUnderTheirNames) {
  at::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(2, 3), torch::nn::Tanh(), torch::nn::Linear(3, 4), torch::nn::Tanh(),
                              torch::nn::Linear(4, 1));
  torch::nn::Sequential second = bp::select_pipeline_stage(model, {"1"}, 1, 2);
  ASSERT_EQ(second->size(), 3u);
  std::vector<std::string> names;
  for (const auto& p : second->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"2.weight", "2.bias", "4.weight", "4.bias"}));
  EXPECT_TRUE(second->named_parameters()["2.weight"].is_same(model->named_parameters()["2.weight"])) << "shared, not copied";
  at::Tensor x = at::randn({5, 2});
  at::Tensor first_out = bp::select_pipeline_stage(model, {"1"}, 0, 2)->forward(x);
  EXPECT_TRUE(second->forward(first_out).equal(model->forward(x))) << "the stages compose to the model";
}

// Runs every stage's schedule together as the pipeline would: a forward waits for the previous stage's
// forward of the same microbatch, a backward for the next stage's backward and its own forward; sends
// never wait. Every schedule must run to its end (no stage waiting forever).
void expect_schedules_complete(int stages, int microbatches) {
  SCOPED_TRACE(std::to_string(stages) + " stages, " + std::to_string(microbatches) + " microbatches");
  std::vector<std::vector<bp::PipelineStep>> schedules;
  for (int s = 0; s < stages; ++s) schedules.push_back(bp::one_f_one_b_schedule(s, stages, microbatches));
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<std::vector<bool>> forward_done(static_cast<size_t>(stages), std::vector<bool>(static_cast<size_t>(microbatches)));
  auto backward_done = forward_done;
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < stages; ++s) {
      const auto si = static_cast<size_t>(s);
      if (next[si] == schedules[si].size()) continue;
      const bp::PipelineStep step = schedules[si][next[si]];
      const auto mb = static_cast<size_t>(step.microbatch);
      const bool ready = step.kind == bp::PipelineStep::kForward
                             ? (s == 0 || forward_done[si - 1][mb])
                             : (forward_done[si][mb] && (s == stages - 1 || backward_done[si + 1][mb]));
      if (!ready) continue;
      (step.kind == bp::PipelineStep::kForward ? forward_done : backward_done)[si][mb] = true;
      ++next[si];
      moved = true;
    }
  }
  for (int s = 0; s < stages; ++s) {
    const auto& schedule = schedules[static_cast<size_t>(s)];
    EXPECT_EQ(next[static_cast<size_t>(s)], schedule.size()) << "stage " << s << " stalls";
    ASSERT_EQ(schedule.size(), static_cast<size_t>(2 * microbatches)) << "stage " << s;
    int in_flight = 0, most = 0, forwards = 0, backwards = 0;
    for (const bp::PipelineStep& step : schedule) {
      if (step.kind == bp::PipelineStep::kForward) {
        EXPECT_EQ(step.microbatch, forwards++) << "forwards in order";
        most = std::max(most, ++in_flight);
      } else {
        EXPECT_EQ(step.microbatch, backwards++) << "backwards in order";
        EXPECT_LT(step.microbatch, forwards) << "a backward after its forward";
        --in_flight;
      }
    }
    EXPECT_LE(most, std::min(stages - s, microbatches)) << "stage " << s << " holds too many activations";
  }
}

TEST(OneFOneBScheduleTest, EveryStageRunsToItsEndHoldingAtMostStagesMinusItsIndexActivations) {
  for (int stages = 1; stages <= 4; ++stages) {
    for (int microbatches = 1; microbatches <= 6; ++microbatches) expect_schedules_complete(stages, microbatches);
  }
  using Step = bp::PipelineStep;
  // Stage 0 of 4 over 6 microbatches: 3 forwards to fill, then one forward and one backward in turn.
  EXPECT_EQ(bp::one_f_one_b_schedule(0, 4, 6),
            (std::vector<Step>{{Step::kForward, 0}, {Step::kForward, 1}, {Step::kForward, 2}, {Step::kForward, 3},
                               {Step::kBackward, 0}, {Step::kForward, 4}, {Step::kBackward, 1}, {Step::kForward, 5},
                               {Step::kBackward, 2}, {Step::kBackward, 3}, {Step::kBackward, 4}, {Step::kBackward, 5}}));
}

TEST_F(OneRankTest, PipelineUsageErrorsAreClear) {
  bp::ParallelConfig config;
  config.pipeline_config.num_microbatches = 3;
  config.pipeline_config.loss_fn = [](const at::Tensor& out, const at::Tensor& labels) { return at::mse_loss(out, labels); };
  auto model = bp::initialize_parallel_model(config, [] { return torch::nn::Sequential(torch::nn::Linear(4, 2)); });
  EXPECT_NE(error_of([&] { model.run_train(at::randn({8, 4}), at::randn({8, 2})); })
                .find("num_microbatches 3 does not divide the batch: inputs have 8 rows (dim 0)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model.run_train(at::randn({6, 4}), at::randn({3, 2})); })
                .find("inputs have 6 rows and labels 3: one label row per input row"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model.run_train(at::randn({6, 4})); }).find("it takes (inputs, labels), not 1 argument(s)"),
            std::string::npos);
  config.pipeline_config.loss_fn = [](const at::Tensor& out, const at::Tensor&) { return out; };
  auto unreduced = bp::initialize_parallel_model(config, [] { return torch::nn::Sequential(torch::nn::Linear(4, 2)); });
  EXPECT_NE(error_of([&] { unreduced.run_train(at::randn({6, 4}), at::randn({6, 2})); })
                .find("loss_fn returned a tensor of shape [2, 2]: expected a scalar"),
            std::string::npos);
  EXPECT_NE(error_of([&] { bp::initialize_parallel_model(config, [] { return std::make_shared<torch::nn::LinearImpl>(4, 2); }); })
                .find("pipeline parallelism needs model_fn to return a torch::nn::Sequential"),
            std::string::npos);
  // With one stage and microbatches the iteration accumulates the batch's gradient.
  config.pipeline_config.loss_fn = [](const at::Tensor& out, const at::Tensor& labels) { return at::mse_loss(out, labels); };
  at::manual_seed(4);
  auto accumulated = bp::initialize_parallel_model(config, [] { return torch::nn::Sequential(torch::nn::Linear(4, 2)); });
  at::manual_seed(4);
  torch::nn::Sequential whole(torch::nn::Linear(4, 2));
  const at::Tensor x = at::randn({6, 4}), y = at::randn({6, 2});
  const at::Tensor loss = accumulated.run_train(x, y);
  const at::Tensor expected = at::mse_loss(whole->forward(x), y);
  expected.backward();
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-6);
  EXPECT_TRUE(at::allclose(accumulated.parameters()[0].grad(), whole->parameters()[0].grad(), 1e-5, 1e-6));
}

/* ---- activation checkpointing ---- */

// A residual MLP block with dropout: what a transformer layer's MLP does, and random numbers to replay.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width)
      : up(register_module("up", torch::nn::Linear(width, 4 * width))),
        down(register_module("down", torch::nn::Linear(4 * width, width))),
        drop(register_module("drop", torch::nn::Dropout(0.2))) {}
  at::Tensor forward(const at::Tensor& x) { return x + down(drop(at::gelu(up(x)))); }
  torch::nn::Linear up, down;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

torch::nn::Sequential residual_mlp(int64_t width, int blocks) {
  at::manual_seed(21);
  torch::nn::Sequential model(torch::nn::Linear(width, width));
  for (int b = 0; b < blocks; ++b) model->push_back(Block(width));
  model->push_back(torch::nn::Linear(width, 1));
  return model;
}

// Forward and backward of `model` on a fixed batch with the generator seeded; returns the loss.
double train_once(torch::nn::Sequential model, int64_t width, int64_t rows) {
  at::manual_seed(22);
  const at::Tensor x = at::randn({rows, width});
  at::Tensor loss = model->forward(x).square().mean();
  loss.backward();
  return loss.item<double>();
}

TEST(ActivationCheckpointTest, GradientsAreIdenticalWithAndWithoutAndLayerNamesStay) {
  using Config = bp::ActivationCheckpointConfig;
  const torch::nn::Sequential plain = residual_mlp(8, 3);
  const double loss = train_once(plain, 8, 16);
  const double next_random = at::rand({1}).item<double>();  // where the generator stands after the step
  for (const Config& config : {Config::full(), Config::selective<BlockImpl>()}) {
    SCOPED_TRACE(config.mode == Config::Mode::kFull ? "full" : "selective");
    const torch::nn::Sequential checkpointed = bp::apply_activation_checkpointing(residual_mlp(8, 3), config);
    EXPECT_EQ(train_once(checkpointed, 8, 16), loss);
    EXPECT_EQ(at::rand({1}).item<double>(), next_random) << "the recomputation's draws are not the training's";
    const auto expected = plain->named_parameters();
    const auto got = checkpointed->named_parameters();
    ASSERT_EQ(got.keys(), expected.keys()) << "the same names";
    for (const auto& p : expected) {
      ASSERT_TRUE(got[p.key()].grad().defined()) << p.key();
      EXPECT_TRUE(got[p.key()].grad().equal(p.value().grad())) << p.key() << ": the same gradient, bit for bit";
    }
  }
  const torch::nn::Sequential selective = bp::apply_activation_checkpointing(plain, Config::selective<BlockImpl>());
  EXPECT_TRUE(selective->ptr(0)->as<torch::nn::Linear>() != nullptr) << "a Linear is not selected";
  EXPECT_TRUE(selective->ptr(1)->as<bp::CheckpointedLayer>() != nullptr) << "a Block is";
  EXPECT_NE(error_of([] { bp::apply_activation_checkpointing(residual_mlp(8, 1), {Config::Mode::kSelective, nullptr}); })
                .find("selective, but no module types given"),
            std::string::npos);
}

TEST(ActivationCheckpointTest, PeakActivationMemoryFalls) {
  std::string why;
  if (!measurable_memory(why)) GTEST_SKIP() << why;
  using Config = bp::ActivationCheckpointConfig;
  const int64_t width = 256, rows = 512, blocks = 8;
  auto peak_of = [&](const Config& config) {
    torch::nn::Sequential model = residual_mlp(width, blocks);
    if (config.mode != Config::Mode::kNone) model = bp::apply_activation_checkpointing(model, config);
    train_once(model, width, rows);  // the gradients' memory, allocated once
    const int64_t before = memory_status("VmRSS");
    reset_peak_memory();
    train_once(model, width, rows);
    return memory_status("VmHWM") - before;
  };
  peak_of(Config{});  // warm-up: thread pools and the like
  const int64_t none = peak_of(Config{}), full = peak_of(Config::full()),
                selective = peak_of(Config::selective<BlockImpl>());
  std::printf("[ memory   ] peak above the trained model's resident memory, %lld blocks of width %lld, %lld rows: "
              "%.1f MiB without checkpointing, %.1f MiB full (%.2f of it), %.1f MiB selective (%.2f)\n",
              static_cast<long long>(blocks), static_cast<long long>(width), static_cast<long long>(rows),
              none / 1048576.0, full / 1048576.0, static_cast<double>(full) / static_cast<double>(none),
              selective / 1048576.0, static_cast<double>(selective) / static_cast<double>(none));
  // Each block keeps about 9 MiB of activations without (its 4x-wide hidden layer, thrice); with, its
  // 0.5 MiB input, plus one block's worth while it is recomputed.
  EXPECT_LT(full, none / 2);
  EXPECT_LT(selective, none / 2);
}

}  // namespace
}  // namespace backplane::test
