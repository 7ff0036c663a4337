// The LibTorch frontend on real ranks: process groups, the mappings' backward
// passes and every tensor-parallel layer against an unsharded reference built from the same master
// weights. One binary for every backend, run under a launcher:
//
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 4 bpl-parallel-test
//   mpirun -np 4 bpl-parallel-test
//
// Layer tests run for every tensor-parallel size that divides the world (TP 1, 2 and 4 on 4 ranks).
// Every rank runs the same collectives in the same order, and checks only with EXPECT_*, so a failed
// check on one rank never leaves the others waiting.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backplane/parallel.h"
#include "support/ranks.h"

namespace bp = backplane::parallel;

namespace backplane::test {
namespace {

// Max |a - b| in the message, so a failure says how far off it was.
void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what,
                  double rtol = 1e-5, double atol = 1e-5) {
  ASSERT_TRUE(actual.defined()) << what << " is undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  EXPECT_TRUE(at::allclose(a, e, rtol, atol)) << what << ": max |difference| " << (a - e).abs().max().item<double>();
}

// The same values on every rank: drawn from a generator seeded identically everywhere.
at::Tensor shared_random(at::IntArrayRef shape, uint64_t seed, at::ScalarType dtype = at::kFloat) {
  at::manual_seed(seed);
  return at::randn(shape, at::TensorOptions().dtype(dtype));
}

// Different values on every rank.
at::Tensor rank_random(at::IntArrayRef shape, uint64_t seed, at::ScalarType dtype = at::kFloat) {
  return shared_random(shape, seed * 1000 + static_cast<uint64_t>(bp::get_rank()), dtype);
}

/* ---- process groups ---- */

TEST(ProcessGroupTest, AllGatherAndReduceScatterAlongEveryDim) {
  auto world = bp::get_world_group();
  const int n = world->size();
  at::Tensor mine = at::arange(24, at::kFloat).reshape({2, 3, 4}) + 100.0 * world->rank();
  for (int64_t dim : {0, 1, 2, -1}) {
    std::vector<at::Tensor> parts;
    for (int r = 0; r < n; ++r) parts.push_back(at::arange(24, at::kFloat).reshape({2, 3, 4}) + 100.0 * r);
    expect_close(world->all_gather(mine, dim), at::cat(parts, dim), "all_gather dim " + std::to_string(dim));
    expect_close(world->all_gather_async(mine, dim).result(), at::cat(parts, dim), "all_gather_async");

    at::Tensor full = at::cat(parts, dim);  // divisible along dim by n
    at::Tensor sum = full * 0;
    for (int r = 0; r < n; ++r) sum += full + r;
    at::Tensor expected = bp::split_along_dim(sum, dim, n, world->rank());
    expect_close(world->reduce_scatter(full + world->rank(), dim), expected, "reduce_scatter dim " + std::to_string(dim));
    expect_close(world->reduce_scatter_async(full + world->rank(), dim).result(), expected, "reduce_scatter_async");
  }
}

TEST(ProcessGroupTest, InPlaceOperationsWriteBackIntoNonContiguousTensors) {
  auto world = bp::get_world_group();
  const int n = world->size();
  at::Tensor base = at::ones({4, 6}, at::kDouble) * (world->rank() + 1);
  at::Tensor strided = base.t();  // not contiguous: the result must land in `base`
  world->all_reduce(strided);
  expect_close(base, at::ones({4, 6}, at::kDouble) * (n * (n + 1) / 2), "all_reduce through a transposed view");

  at::Tensor max = at::full({5}, world->rank(), at::kInt);
  world->all_reduce_async(max, bp::ReduceOp::Max).wait();
  EXPECT_TRUE(max.eq(n - 1).all().item<bool>());

  at::Tensor value = at::full({3, 2}, world->rank() == n - 1 ? 7.0 : 0.0, at::kBFloat16);
  at::Tensor column = value.select(1, 1);
  world->broadcast(column, n - 1);
  EXPECT_TRUE(value.select(1, 1).eq(7.0).all().item<bool>());

  at::Tensor input = at::ones({3}, at::kLong), out;
  world->all_reduce(input, out);
  EXPECT_TRUE(out.eq(n).all().item<bool>()) << "out-of-place all_reduce";
  EXPECT_TRUE(input.eq(1).all().item<bool>()) << "out-of-place all_reduce left its input alone";
}

TEST(ProcessGroupTest, SendAndRecvAroundARing) {
  auto world = bp::get_world_group();
  const int n = world->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int next = (world->rank() + 1) % n, prev = (world->rank() + n - 1) % n;
  at::Tensor received = at::zeros({2, 8}, at::kFloat);
  bp::Work receiving = world->recv_async(received.t(), prev, 5);  // a non-contiguous destination
  world->send(at::full({8, 2}, world->rank() * 10.0 + 1), next, 5);
  receiving.wait();
  EXPECT_TRUE(received.eq(prev * 10.0 + 1).all().item<bool>()) << received;
  world->barrier();
  world->barrier_async().wait();
}

// Byte strings of different lengths (the empty one and one with NUL bytes among them) reach every rank whole.
TEST(ProcessGroupTest, ByteStringsOfAnyLengthAreBroadcastAndGathered) {
  auto world = bp::get_world_group();
  const int n = world->size(), me = world->rank();
  const auto text_of = [](int rank) { return std::string(static_cast<size_t>(rank) * 1000 + 3, static_cast<char>('a' + rank)) + '\0' + "end"; };
  for (int root = 0; root < n; ++root) {
    const std::string sent = me == root ? text_of(root) : "ignored on this rank";
    EXPECT_EQ(world->broadcast_bytes(sent, root), text_of(root)) << "root " << root;
  }
  EXPECT_EQ(world->broadcast_bytes(me == 0 ? "" : "x", 0), "");
  const std::vector<std::string> all = world->all_gather_bytes(me == 1 ? std::string() : text_of(me));
  ASSERT_EQ(all.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) EXPECT_EQ(all[static_cast<size_t>(r)], r == 1 ? std::string() : text_of(r)) << "rank " << r;
  EXPECT_THROW(world->broadcast_bytes("x", n), bp::Error);
}

TEST(ProcessGroupTest, BadInputIsAnErrorNamingTheValue) {
  auto world = bp::get_world_group();
  try {
    at::Tensor flags = at::ones({3}, at::kBool);
    world->all_reduce(flags);
    ADD_FAILURE() << "a bool tensor was accepted";
  } catch (const bp::Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("Bool"), std::string::npos) << e.what();
  }
  try {
    world->reduce_scatter(at::ones({world->size() * 2 + 1, 2}), 0);
    if (world->size() > 1) ADD_FAILURE() << "an indivisible reduce_scatter was accepted";
  } catch (const bp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has size " + std::to_string(world->size() * 2 + 1)), std::string::npos) << e.what();
  }
  EXPECT_THROW(world->all_gather(at::ones({2}), 1), bp::Error);
  at::Tensor one = at::ones({1});
  EXPECT_THROW(world->broadcast(one, world->size()), bp::Error);
}

/* ---- mappings: backward is the adjoint of forward (gradcheck on doubles) ---- */

// The check torch's fast gradcheck makes, across ranks: for random u and g, the numerical directional
// derivative <g, (f(x + eps u) - f(x - eps u)) / 2 eps> equals the analytical <J^T g, u>, with every
// inner product taken over the whole job (a replicated tensor counts once, a sharded one is summed over
// the ranks).
struct MappingCase {
  std::string name;
  std::function<at::Tensor(const at::Tensor&)> map;
  bool input_replicated;
  bool output_replicated;
};

double job_inner_product(const at::Tensor& a, const at::Tensor& b, bool replicated, const bp::GroupPtr& group) {
  at::Tensor local = (a * b).sum().reshape({1});
  if (!replicated) group->all_reduce(local);
  return local.item<double>();
}

class TensorParallelTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const int tp = GetParam();
    if (tp > bp::get_world_size() || bp::get_world_size() % tp != 0) {
      GTEST_SKIP() << "tensor-parallel size " << tp << " needs a multiple of " << tp << " ranks";
    }
    bp::initialize_model_parallel(tp);
    group = bp::get_tensor_model_parallel_group();
    tp_size = group->size();
    tp_rank = group->rank();
  }
  void TearDown() override { bp::destroy_model_parallel(); }

  at::Tensor gather(const at::Tensor& local, int64_t dim) const { return group->all_gather(local.detach(), dim); }
  at::Tensor slice(const at::Tensor& full, int64_t dim) const {
    return bp::split_along_dim(full, dim, tp_size, tp_rank).clone();
  }

  bp::GroupPtr group;
  int tp_size = 1;
  int tp_rank = 0;
};

TEST_P(TensorParallelTest, MappingsBackwardIsTheAdjointOfForward) {
  const std::vector<MappingCase> cases = {
      {"copy_to", [](const at::Tensor& x) { return bp::copy_to_tensor_model_parallel_region(x); }, true, false},
      {"reduce_from", [](const at::Tensor& x) { return bp::reduce_from_tensor_model_parallel_region(x); }, false, true},
      {"scatter_to", [](const at::Tensor& x) { return bp::scatter_to_tensor_model_parallel_region(x); }, true, false},
      {"gather_from", [](const at::Tensor& x) { return bp::gather_from_tensor_model_parallel_region(x); }, false, true},
      {"scatter_to_sequence", [](const at::Tensor& x) { return bp::scatter_to_sequence_parallel_region(x, 1); }, true, false},
      {"gather_from_sequence", [](const at::Tensor& x) { return bp::gather_from_sequence_parallel_region(x, 1); }, false, false},
      {"gather_from_sequence !to_model_parallel",
       [](const at::Tensor& x) { return bp::gather_from_sequence_parallel_region(x, 1, false); }, false, true},
      {"reduce_scatter_to_sequence",
       [](const at::Tensor& x) { return bp::reduce_scatter_to_sequence_parallel_region(x, 1); }, false, false},
  };
  uint64_t seed = 100;
  for (const MappingCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto draw = [&](at::IntArrayRef shape, bool replicated) {
      ++seed;
      return replicated ? shared_random(shape, seed, at::kDouble) : rank_random(shape, seed, at::kDouble);
    };
    at::Tensor x = draw({3, 8, 4}, c.input_replicated).requires_grad_();
    at::Tensor u = draw({3, 8, 4}, c.input_replicated);
    at::Tensor y = c.map(x);
    at::Tensor g = draw(y.sizes(), c.output_replicated);
    y.backward(g);
    const double eps = 1e-6;
    at::Tensor derivative;
    {
      at::NoGradGuard no_grad;
      derivative = (c.map(x.detach() + eps * u) - c.map(x.detach() - eps * u)) / (2 * eps);
    }
    const double numerical = job_inner_product(g, derivative, c.output_replicated, group);
    const double analytical = job_inner_product(x.grad(), u, c.input_replicated, group);
    EXPECT_NEAR(numerical, analytical, 1e-6 * (1 + std::abs(analytical)));
  }
  at::Tensor x = shared_random({4}, 7, at::kDouble).requires_grad_();
  bp::scale_gradient(x, 0.25).sum().backward();
  expect_close(x.grad(), at::full({4}, 0.25, at::kDouble), "scale_gradient");
}

/* ---- layers against unsharded references ---- */

at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(); }

TEST_P(TensorParallelTest, ColumnParallelLinearMatchesAnUnshardedLinear) {
  for (bool gather_output : {true, false}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string("gather_output ") + (gather_output ? "on" : "off") + ", bias " + (bias ? "on" : "off"));
      at::manual_seed(11);
      bp::ColumnParallelLinear layer(
          bp::ColumnParallelLinearOptions(8, 12).bias(bias).gather_output(gather_output).keep_master_weight(true));
      ASSERT_EQ(layer->weight.sizes(), at::IntArrayRef({12 / tp_size, 8}));
      // The master weight is what torch draws for the full layer, whatever the TP degree, and each
      // rank holds its rows of it.
      at::manual_seed(11);
      at::Tensor master = at::empty({12, 8});
      torch::nn::init::kaiming_uniform_(master, std::sqrt(5.0));
      expect_close(layer->master_weight, master, "master weight", 0, 0);
      expect_close(layer->weight, slice(master, 0), "local weight", 0, 0);
      at::Tensor x = shared_random({3, 5, 8}, 12).requires_grad_();
      at::Tensor y = layer(x);
      at::Tensor g = shared_random({3, 5, 12}, 13);
      (y * (gather_output ? g : slice(g, -1))).sum().backward();

      at::Tensor x_ref = leaf(x), w_ref = leaf(layer->master_weight);
      at::Tensor b_ref = bias ? leaf(gather_output ? layer->bias : gather(layer->bias, 0)) : at::Tensor();
      at::Tensor y_ref = at::linear(x_ref, w_ref, b_ref);
      (y_ref * g).sum().backward();

      expect_close(gather_output ? y : gather(y, -1), y_ref, "output");
      expect_close(x.grad(), x_ref.grad(), "input gradient");
      expect_close(gather(layer->weight.grad(), 0), w_ref.grad(), "weight gradient");
      if (bias) expect_close(gather_output ? layer->bias.grad() : gather(layer->bias.grad(), 0), b_ref.grad(), "bias gradient");
    }
  }
  at::manual_seed(11);
  bp::ColumnParallelLinear skip(bp::ColumnParallelLinearOptions(8, 12).skip_bias_add(true));
  auto [output, bias] = skip->forward_with_bias(at::ones({2, 8}));
  EXPECT_TRUE(bias.is_same(skip->bias));
  EXPECT_THROW(skip(at::ones({2, 8})), bp::Error);
}

TEST_P(TensorParallelTest, RowParallelLinearMatchesAnUnshardedLinear) {
  for (bool input_is_parallel : {true, false}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(std::string("input_is_parallel ") + (input_is_parallel ? "on" : "off") + ", bias " + (bias ? "on" : "off"));
      at::manual_seed(21);
      bp::RowParallelLinear layer(
          bp::RowParallelLinearOptions(12, 8).bias(bias).input_is_parallel(input_is_parallel).keep_master_weight(true));
      ASSERT_EQ(layer->weight.sizes(), at::IntArrayRef({8, 12 / tp_size}));
      at::Tensor x_full = shared_random({3, 5, 12}, 22);
      at::Tensor x = (input_is_parallel ? slice(x_full, -1) : x_full.clone()).requires_grad_();
      at::Tensor y = layer(x);
      at::Tensor g = shared_random({3, 5, 8}, 23);
      (y * g).sum().backward();

      at::Tensor x_ref = leaf(x_full), w_ref = leaf(layer->master_weight);
      at::Tensor b_ref = bias ? leaf(layer->bias) : at::Tensor();
      at::Tensor y_ref = at::linear(x_ref, w_ref, b_ref);
      (y_ref * g).sum().backward();

      expect_close(y, y_ref, "output");
      expect_close(input_is_parallel ? gather(x.grad(), -1) : x.grad(), x_ref.grad(), "input gradient");
      expect_close(gather(layer->weight.grad(), 1), w_ref.grad(), "weight gradient");
      if (bias) expect_close(layer->bias.grad(), b_ref.grad(), "bias gradient");
    }
  }
}

TEST_P(TensorParallelTest, ParallelEmbeddingMatchesAnUnshardedEmbedding) {
  for (bool shard_across_embedding : {false, true}) {
    SCOPED_TRACE(shard_across_embedding ? "embedding dim split" : "vocabulary split");
    at::manual_seed(31);
    const int64_t padding = 5;
    bp::ParallelEmbedding layer(bp::ParallelEmbeddingOptions(16, 8)
                                    .padding_idx(padding)
                                    .shard_across_embedding(shard_across_embedding)
                                    .keep_master_weight(true));
    EXPECT_TRUE(layer->master_weight[padding].eq(0).all().item<bool>()) << "the padding row starts at zero";
    at::manual_seed(32);
    at::Tensor ids = at::randint(0, 16, {3, 7}, at::kLong);
    ids[0][0] = padding;
    at::Tensor y = layer(ids);
    at::Tensor g = shared_random({3, 7, 8}, 33);
    (y * g).sum().backward();

    at::Tensor w_ref = leaf(layer->master_weight);
    at::Tensor y_ref = at::embedding(w_ref, ids, padding);
    (y_ref * g).sum().backward();

    expect_close(y, y_ref, "output");
    expect_close(gather(layer->weight.grad(), shard_across_embedding ? 1 : 0), w_ref.grad(), "weight gradient");
    EXPECT_TRUE(w_ref.grad()[padding].eq(0).all().item<bool>()) << "the padding row gets no gradient";
  }
}

TEST_P(TensorParallelTest, ParallelEmbeddingWithSequenceParallelismReduceScattersAlongTheSequence) {
  at::manual_seed(35);
  bp::ParallelEmbedding layer(bp::ParallelEmbeddingOptions(16, 4).sequence_parallel_enabled(true).keep_master_weight(true));
  at::manual_seed(36);
  at::Tensor ids = at::randint(0, 16, {2, 8}, at::kLong);  // (batch, sequence)
  at::Tensor y = layer(ids);
  ASSERT_EQ(y.sizes(), at::IntArrayRef({8 / tp_size, 2, 4})) << "(sequence / tp, batch, dim)";
  at::Tensor g = shared_random({8, 2, 4}, 37);
  (y * slice(g, 0)).sum().backward();

  at::Tensor w_ref = leaf(layer->master_weight);
  at::Tensor y_ref = at::embedding(w_ref, ids).transpose(0, 1);
  (y_ref * g).sum().backward();
  expect_close(gather(y, 0), y_ref, "output");
  expect_close(gather(layer->weight.grad(), 0), w_ref.grad(), "weight gradient");
}

TEST_P(TensorParallelTest, GqaQkvLinearMatchesUnshardedProjectionsWithReplicatedKv) {
  const int64_t in = 6, q_out = 8, kv_out = 4;
  for (int64_t multiplier : {1, 2}) {
    if (tp_size % multiplier != 0) continue;
    for (bp::KvReplication replication : {bp::KvReplication::Repeat, bp::KvReplication::RepeatInterleave}) {
      if (multiplier == 1 && replication == bp::KvReplication::RepeatInterleave) continue;
      // K0..Kn,K0..Kn (trn1) or K0,K0,..,Kn,Kn (trn2) along the feature dim `dim`.
      auto replicate = [&](const at::Tensor& t, int64_t dim) {
        if (replication == bp::KvReplication::RepeatInterleave) return t.repeat_interleave(multiplier, dim);
        std::vector<int64_t> repeats(static_cast<size_t>(t.dim()), 1);
        repeats[static_cast<size_t>(dim < 0 ? dim + t.dim() : dim)] = multiplier;
        return t.repeat(repeats);
      };
      // The original rows back from the replicated ones.
      auto first_replica = [&](const at::Tensor& replicated) {
        return replication == bp::KvReplication::Repeat ? replicated.narrow(0, 0, kv_out)
                                                        : replicated.reshape({kv_out, multiplier}).select(1, 0);
      };
      for (bool fused : {true, false}) {
        SCOPED_TRACE("kv_size_multiplier " + std::to_string(multiplier) +
                     (replication == bp::KvReplication::Repeat ? ", repeat" : ", repeat_interleave") +
                     (fused ? ", fused" : ", unfused"));
        at::manual_seed(51);
        bp::GQAQKVColumnParallelLinear layer(bp::GQAQKVColumnParallelLinearOptions(in, q_out, kv_out)
                                                 .kv_size_multiplier(multiplier)
                                                 .kv_replication(replication)
                                                 .fuse_qkv(fused)
                                                 .keep_master_weight(true));
        at::Tensor x = shared_random({2, 3, in}, 52).requires_grad_();
        auto [q, k, v] = layer(x);
        at::Tensor gq = shared_random({2, 3, q_out}, 53), gk = shared_random({2, 3, kv_out}, 54),
                   gv = shared_random({2, 3, kv_out}, 55);
        // Replicas of one head receive the same gradient, as they do when each serves its share of Q heads.
        ((q * gq).sum() + (k * replicate(gk, -1)).sum() + (v * replicate(gv, -1)).sum()).backward();

        // The unsharded projections, with the full (unreplicated) biases gathered from the ranks.
        at::Tensor x_ref = leaf(x);
        at::Tensor wq = leaf(layer->master_weight_q), wk = leaf(layer->master_weight_k),
                   wv = leaf(layer->master_weight_v);
        at::Tensor bq = leaf(gather(layer->bias_q(), 0));
        at::Tensor bk = leaf(first_replica(gather(layer->bias_k(), 0)));
        at::Tensor bv = leaf(first_replica(gather(layer->bias_v(), 0)));
        at::Tensor q_ref = at::linear(x_ref, wq, bq), k_ref = at::linear(x_ref, wk, bk), v_ref = at::linear(x_ref, wv, bv);
        ((q_ref * gq).sum() + (k_ref * gk).sum() + (v_ref * gv).sum()).backward();

        expect_close(q, q_ref, "q");
        expect_close(k, replicate(k_ref, -1), "k");
        expect_close(v, replicate(v_ref, -1), "v");
        expect_close(x.grad(), x_ref.grad(), "input gradient (replicated KV heads counted once)");

        const int64_t q_local = q_out / tp_size, kv_local = kv_out * multiplier / tp_size;
        auto params = layer->named_parameters();
        at::Tensor grad_q, grad_v;
        if (fused) {
          at::Tensor fused_grad = params["weight_qkv"].grad();
          grad_q = fused_grad.narrow(0, 0, q_local);
          grad_v = fused_grad.narrow(0, q_local + kv_local, kv_local);
        } else {
          grad_q = params["weight_q"].grad();
          grad_v = params["weight_v"].grad();
        }
        expect_close(gather(grad_q.contiguous(), 0), wq.grad(), "q weight gradient");
        expect_close(gather(grad_v.contiguous(), 0), replicate(wv.grad(), 0), "v weight gradient (per replica)");
      }
    }
  }
}

TEST_P(TensorParallelTest, SequenceParallelMlpMatchesAnUnshardedMlp) {
  at::manual_seed(41);
  bp::ColumnParallelLinear column(bp::ColumnParallelLinearOptions(8, 12)
                                      .gather_output(false)
                                      .sequence_parallel_enabled(true)
                                      .sequence_dimension(0)
                                      .keep_master_weight(true));
  bp::RowParallelLinear row(bp::RowParallelLinearOptions(12, 8)
                                .input_is_parallel(true)
                                .sequence_parallel_enabled(true)
                                .sequence_dimension(0)
                                .keep_master_weight(true));
  at::Tensor x_full = shared_random({8, 2, 8}, 42);  // (sequence, batch, hidden)
  at::Tensor x = slice(x_full, 0).requires_grad_();
  at::Tensor y = row(column(x));
  ASSERT_EQ(y.size(0), 8 / tp_size) << "the output stays split along the sequence";
  at::Tensor g = shared_random({8, 2, 8}, 43);
  (y * slice(g, 0)).sum().backward();

  at::Tensor x_ref = leaf(x_full), wc = leaf(column->master_weight), wr = leaf(row->master_weight);
  at::Tensor bc = leaf(gather(column->bias, 0)), br = leaf(row->bias);
  at::Tensor y_ref = at::linear(at::linear(x_ref, wc, bc), wr, br);
  (y_ref * g).sum().backward();

  expect_close(gather(y, 0), y_ref, "output");
  expect_close(gather(x.grad(), 0), x_ref.grad(), "input gradient");
  expect_close(gather(column->weight.grad(), 0), wc.grad(), "column weight gradient");
  expect_close(gather(row->weight.grad(), 1), wr.grad(), "row weight gradient");
  expect_close(gather(column->bias.grad(), 0), bc.grad(), "column bias gradient");
  // Each rank adds the row bias to its own part of the sequence: the parts sum to the full gradient
  // (the all-reduce the training step does for sequence-parallel parameters).
  at::Tensor row_bias_grad = row->bias.grad().clone();
  group->all_reduce(row_bias_grad);
  expect_close(row_bias_grad, br.grad(), "row bias gradient, summed over the sequence parts");
}

INSTANTIATE_TEST_SUITE_P(Tp, TensorParallelTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "tp" + std::to_string(info.param); });

}  // namespace
}  // namespace backplane::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    bp::init_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bpl-parallel-test: %s\n", e.what());
    return 1;
  }
  if (bp::get_rank() == 0) {
    std::printf("bpl-parallel-test: backend %s, %d rank(s)\n", bp::get_backend().c_str(), bp::get_world_size());
  }
  backplane::test::report_failures_only_unless_rank_zero(bp::get_rank());
  const int result = RUN_ALL_TESTS();
  bp::destroy_process_group();
  return result;
}
