// Model-parallel state and model initialisation on real ranks: the groups initialize_model_parallel
// makes hold the ranks of the layout; with pad_model and model_init_config, attention with heads that do
// not divide the tensor-parallel degree, padded with zero heads, computes and trains as the unpadded
// model does; meta_device_init builds only the local shards (less peak memory, measured);
// sequential_move_factor lets at most that many ranks of the machine run model_fn at once. Part of
// bpl-parallel-test.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "backplane/parallel.h"
#include "memory.h"

namespace bp = backplane::parallel;

namespace backplane::test {
namespace {

/* ---- model-parallel groups ---- */

TEST(ModelParallelTest, GroupsFollowTheLayoutAndReallyContainThoseRanks) {
  const int world = bp::get_world_size();
  const int me = bp::get_rank();
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2}) {
      if (tp * pp > world || world % (tp * pp) != 0) continue;
      SCOPED_TRACE("tp " + std::to_string(tp) + ", pp " + std::to_string(pp));
      bp::initialize_model_parallel(tp, pp);
      const bp::GroupLayout expected = bp::compute_group_layout(world, tp, pp);
      const bp::GroupLayout actual = bp::get_group_layout();
      EXPECT_EQ(actual.tensor_parallel, expected.tensor_parallel);
      EXPECT_EQ(actual.data_parallel, expected.data_parallel);
      EXPECT_EQ(actual.pipeline_parallel, expected.pipeline_parallel);
      auto check_group = [&](const bp::GroupPtr& group, const bp::Groups& groups, const char* kind) {
        for (const std::vector<int>& ranks : groups) {
          auto it = std::find(ranks.begin(), ranks.end(), me);
          if (it == ranks.end()) continue;
          EXPECT_EQ(group->ranks(), ranks) << kind;
          EXPECT_EQ(group->rank(), it - ranks.begin()) << kind;
          // The communicator holds exactly these ranks: the sum of their global ranks comes back.
          at::Tensor sum = at::full({1}, me, at::kLong);
          group->all_reduce(sum);
          int64_t expected_sum = 0;
          for (int r : ranks) expected_sum += r;
          EXPECT_EQ(sum.item<int64_t>(), expected_sum) << kind;
        }
      };
      check_group(bp::get_tensor_model_parallel_group(), expected.tensor_parallel, "tensor parallel");
      check_group(bp::get_data_parallel_group(), expected.data_parallel, "data parallel");
      check_group(bp::get_pipeline_model_parallel_group(), expected.pipeline_parallel, "pipeline parallel");
      EXPECT_EQ(bp::get_tensor_model_parallel_size(), tp);
      EXPECT_EQ(bp::get_pipeline_model_parallel_size(), pp);
      EXPECT_EQ(bp::get_data_parallel_size(), world / (tp * pp));
      EXPECT_EQ(bp::get_tensor_model_parallel_rank(), me % tp);
      EXPECT_EQ(bp::get_tensor_model_parallel_src_rank(), (me / tp) * tp);
      EXPECT_EQ(bp::get_pipeline_model_parallel_next_rank(), (me + world / pp) % world);
      EXPECT_EQ(bp::get_pipeline_model_parallel_prev_rank(), (me + world - world / pp) % world);
      EXPECT_EQ(bp::rank_prefix(), "[rank_" + std::to_string(me) + "_pp" + std::to_string(me / (world / pp)) + "_tp" +
                                       std::to_string(me % tp) + "_dp" + std::to_string((me / tp) % (world / (tp * pp))) +
                                       "_cp0]");
      bp::destroy_model_parallel();
    }
  }
  EXPECT_FALSE(bp::model_parallel_is_initialized());
}

/* ---- pad_model ---- */

// Self-attention whose projections are split by heads over the tensor-parallel group; each rank
// attends with the heads it holds (head_dim rows each), padded ones included.
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t hidden, int64_t heads, int64_t head_dim, const bp::GroupPtr& group) : head_dim(head_dim) {
    auto projection = [&] {
      return bp::ColumnParallelLinear(bp::ColumnParallelLinearOptions(hidden, heads * head_dim)
                                          .gather_output(false)
                                          .pad_alignment_size_per_rank(head_dim)
                                          .tensor_model_parallel_group(group));
    };
    q = register_module("q", projection());
    k = register_module("k", projection());
    v = register_module("v", projection());
    o = register_module("o", bp::RowParallelLinear(bp::RowParallelLinearOptions(heads * head_dim, hidden)
                                                       .input_is_parallel(true)
                                                       .pad_alignment_size_per_rank(head_dim)
                                                       .tensor_model_parallel_group(group)));
  }
  at::Tensor forward(const at::Tensor& x) {  // (batch, sequence, hidden)
    auto heads_of = [&](const at::Tensor& t) {
      return t.view({t.size(0), t.size(1), t.size(2) / head_dim, head_dim}).transpose(1, 2);
    };
    const at::Tensor qh = heads_of(q(x)), kh = heads_of(k(x)), vh = heads_of(v(x));
    const at::Tensor weights = at::softmax(at::matmul(qh, kh.transpose(-1, -2)) / std::sqrt(double(head_dim)), -1);
    const at::Tensor out = at::matmul(weights, vh).transpose(1, 2).contiguous();
    return o(out.view({out.size(0), out.size(1), -1}));
  }
  int64_t head_dim;
  bp::ColumnParallelLinear q{nullptr}, k{nullptr}, v{nullptr};
  bp::RowParallelLinear o{nullptr};
};
TORCH_MODULE(Attention);

// Three heads of 2: 6 rows, which 2 ranks cannot split into whole heads, nor 4.
Attention three_head_attention(const bp::GroupPtr& group = nullptr) {
  at::manual_seed(61);
  return Attention(6, 3, 2, group);
}

std::vector<double> train(Attention& model, int steps) {
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.02));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    at::manual_seed(70 + step);
    const at::Tensor x = at::randn({2, 5, 6}), y = at::randn({2, 5, 6});
    optimizer.zero_grad();
    at::Tensor loss = at::mse_loss(model->forward(x), y);
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

class PadModelTest : public ::testing::TestWithParam<int> {
 protected:
  void TearDown() override { bp::destroy_model_parallel(); }
};

TEST_P(PadModelTest, PaddedHeadsComputeAndTrainAsTheUnpaddedModel) {
  const int tp = GetParam();
  if (bp::get_world_size() % tp != 0) GTEST_SKIP() << "tensor-parallel size " << tp << " needs a multiple of " << tp << " ranks";
  bp::ParallelConfig config;
  config.tensor_parallel_size = tp;
  try {
    bp::initialize_parallel_model(config, [] { return three_head_attention(); });
    ADD_FAILURE() << "3 heads split over " << tp << " ranks without pad_model";
  } catch (const bp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("output_size 6 must be divisible by the tensor-parallel size " +
                                         std::to_string(tp) + " times pad_alignment_size_per_rank 2 (or set pad, or "
                                         "pad_model in the config)"),
              std::string::npos)
        << e.what();
  }
  config.pad_model = true;
  auto padded = bp::initialize_parallel_model(config, [] { return three_head_attention(); });
  Attention& model = padded.module();
  const int64_t padded_rows = (6 + 2 * tp - 1) / (2 * tp) * (2 * tp);
  EXPECT_EQ(model->q->padded_output_size(), padded_rows);
  EXPECT_EQ(model->o->padded_input_size(), padded_rows);
  EXPECT_EQ(model->q->weight.size(0), padded_rows / tp) << "whole heads on each rank";

  // The unpadded model: the same layers on a group of one rank.
  Attention single = three_head_attention(bp::get_world_group()->split(bp::get_rank(), 0));
  at::manual_seed(80);
  const at::Tensor x = at::randn({2, 5, 6});
  EXPECT_TRUE(at::allclose(model->forward(x), single->forward(x), 1e-5, 1e-6));
  const std::vector<double> losses = train(model, 4), expected = train(single, 4);
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], expected[i], 1e-5) << "step " << i;

  auto tp_group = bp::get_tensor_model_parallel_group();
  for (const auto& [name, layer, expected_layer] :
       {std::tuple{"q", model->q, single->q}, std::tuple{"k", model->k, single->k}, std::tuple{"v", model->v, single->v}}) {
    const at::Tensor whole = tp_group->all_gather(layer->weight.detach(), 0);
    EXPECT_TRUE(at::allclose(whole.narrow(0, 0, 6), expected_layer->weight, 1e-5, 1e-6)) << name << " real rows";
    EXPECT_TRUE(whole.narrow(0, 6, padded_rows - 6).eq(0).all().item<bool>()) << name << " padded rows stay zero";
  }
  const at::Tensor o_whole = tp_group->all_gather(model->o->weight.detach(), 1);
  EXPECT_TRUE(at::allclose(o_whole.narrow(1, 0, 6), single->o->weight, 1e-5, 1e-6));
  EXPECT_TRUE(o_whole.narrow(1, 6, padded_rows - 6).eq(0).all().item<bool>()) << "o's padded columns stay zero";
}

INSTANTIATE_TEST_SUITE_P(Tp, PadModelTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "tp" + std::to_string(info.param); });

/* ---- meta_device_init ---- */

class ModelInitTest : public ::testing::Test {
 protected:
  void TearDown() override { bp::destroy_model_parallel(); }
};

TEST_F(ModelInitTest, MetaDeviceInitBuildsOnlyTheLocalShardsAndParamInitFnInitialisesThem) {
  if (bp::get_world_size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  std::string why;
  if (!measurable_memory(why)) GTEST_SKIP() << why;
  auto build = [](bool meta) {
    bp::ParallelConfig config;
    config.tensor_parallel_size = 2;
    config.model_init_config.meta_device_init = meta;
    config.param_init_fn = [](torch::nn::Module& module) {
      at::NoGradGuard no_grad;
      for (at::Tensor& p : module.parameters()) p.fill_(0.25);
    };
    return bp::initialize_parallel_model(config, [] {
      return torch::nn::Sequential(
          bp::ColumnParallelLinear(bp::ColumnParallelLinearOptions(1024, 4096).gather_output(false).keep_master_weight(true)),
          bp::RowParallelLinear(bp::RowParallelLinearOptions(4096, 1024).input_is_parallel(true)));
    });
  };
  auto peak_of = [&](bool meta) {
    const int64_t before = memory_status("VmRSS");
    reset_peak_memory();
    auto model = build(meta);
    const int64_t peak = memory_status("VmHWM") - before;
    for (const at::Tensor& p : model.parameters()) {
      EXPECT_TRUE(p.eq(0.25).all().item<bool>()) << "param_init_fn initialised every parameter";
    }
    const auto column = model.module()->ptr<bp::ColumnParallelLinearImpl>(0);
    EXPECT_EQ(column->weight.sizes(), (at::IntArrayRef{2048, 1024})) << "the local shard";
    EXPECT_TRUE(bp::tensor_model_parallel_attributes(column->weight).has_value());
    EXPECT_EQ(column->master_weight.is_meta(), meta) << "no full master with meta_device_init";
    bp::destroy_model_parallel();
    return peak;
  };
  peak_of(false);  // warm-up
  const int64_t whole = peak_of(false), deferred = peak_of(true);
  if (bp::get_rank() == 0) {
    std::printf("[ memory   ] peak above the start while building two 8 MiB local shards of 16 MiB weights (TP 2): %.1f MiB with "
                "full master weights, %.1f MiB with meta_device_init (%.2f of it)\n",
                whole / 1048576.0, deferred / 1048576.0, static_cast<double>(deferred) / static_cast<double>(whole));
  }
  // Without, each 16 MiB weight is made whole before its 8 MiB shard is copied out of it.
  EXPECT_LT(deferred, whole * 3 / 4);
}

/* ---- sequential_move_factor ---- */

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The most ranks whose [start, end) intervals overlap at one time.
int most_at_once(const at::Tensor& intervals) {
  std::vector<std::pair<double, int>> events;
  for (int64_t r = 0; r < intervals.size(0); ++r) {
    events.emplace_back(intervals[r][0].item<double>(), 1);
    events.emplace_back(intervals[r][1].item<double>(), -1);
  }
  std::sort(events.begin(), events.end());  // at equal times an end (-1) comes before a start
  int inside = 0, most = 0;
  for (const auto& event : events) most = std::max(most, inside += event.second);
  return most;
}

TEST_F(ModelInitTest, AtMostSequentialMoveFactorRanksOfAMachineBuildAtOnce) {
  const int world = bp::get_world_size();
  for (int factor : {1, 2}) {
    if (factor >= world) continue;
    SCOPED_TRACE("sequential_move_factor " + std::to_string(factor));
    bp::ParallelConfig config;
    config.model_init_config.sequential_move_factor = factor;
    double start = 0, end = 0;
    bp::initialize_parallel_model(config, [&] {
      start = now_seconds();  // steady_clock: CLOCK_MONOTONIC, one clock for the machine's processes
      std::this_thread::sleep_for(std::chrono::milliseconds(80));
      end = now_seconds();
      return torch::nn::Sequential(torch::nn::Linear(2, 2));
    });
    at::Tensor intervals = bp::get_world_group()->all_gather(at::tensor({start, end}, at::kDouble).unsqueeze(0), 0);
    EXPECT_EQ(most_at_once(intervals), factor) << intervals;
    bp::destroy_model_parallel();
  }
}

}  // namespace
}  // namespace backplane::test
