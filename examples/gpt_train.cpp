// A small GPT-like decoder trained with tensor, pipeline and data parallelism in CPU mode: the program to
// copy to start. A vocabulary-parallel embedding, decoder blocks (grouped-query attention through
// GQAQKVColumnParallelLinear, a column/row-parallel MLP) and a column-parallel head, as a Sequential that
// the pipeline cuts into stages; AdamW with clipping (ZeRO-1 optional), checkpoints and resumption.
//
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 8 gpt_train --tp 2 --pp 2 --steps 20 --check   (TP 2 x PP 2 x DP 2)
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 4 gpt_train --tp 2 --pp 2 --steps 20 --save-every 10 --checkpoint-dir ckpt
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 4 gpt_train --tp 2 --pp 2 --steps 30 --checkpoint-dir ckpt --resume
//
// The task: sequences of a fixed affine recurrence modulo the vocabulary, from random starts; the model
// learns to predict the next token. Every rank draws the same global batch for a step (seeded by the
// step), so runs of any layout, resumed or not, see the same data. --check also trains the unsharded model
// (every layer on a group of one rank) on the whole batch in each process and fails (exit 3) unless every
// step's loss matches.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backplane/parallel.h"

namespace bp = backplane::parallel;

namespace {

struct Args {
  int steps = 20;
  int tp = 1;
  int pp = 1;
  int microbatches = 2;
  bool zero1 = false;
  bool recompute = false;
  bool check = false;
  int save_every = 0;
  std::string checkpoint_dir = "gpt_train_checkpoints";
  bool resume = false;
};

// The model's sizes.
constexpr int64_t kVocab = 32, kSequence = 8, kHidden = 32, kHeads = 4, kKvHeads = 2, kHeadDim = kHidden / kHeads;
constexpr int kBlocks = 2;
constexpr int64_t kGlobalBatch = 8;

// Token and position embeddings; the vocabulary split over tensor-parallel ranks.
struct EmbedImpl : torch::nn::Module {
  explicit EmbedImpl(const bp::GroupPtr& group)
      : tokens(register_module("tokens", bp::ParallelEmbedding(bp::ParallelEmbeddingOptions(kVocab, kHidden)
                                                                  .init_method([](at::Tensor& w) { w.normal_(0, 0.02); })
                                                                  .tensor_model_parallel_group(group)))),
        positions(register_module("positions", torch::nn::Embedding(kSequence, kHidden))) {
    at::NoGradGuard no_grad;
    positions->weight.normal_(0, 0.02);
  }
  at::Tensor forward(const at::Tensor& ids) {  // (batch, sequence) -> (batch, sequence, hidden)
    return tokens(ids) + positions(at::arange(ids.size(1), at::kLong));
  }
  bp::ParallelEmbedding tokens;
  torch::nn::Embedding positions;
};
TORCH_MODULE(Embed);

// Pre-norm decoder block: causal grouped-query attention, then an MLP; each rank holds its heads and its
// part of the MLP's hidden layer.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const bp::GroupPtr& group)
      : attention_norm(register_module("attention_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})))),
        qkv(register_module("qkv", bp::GQAQKVColumnParallelLinear(
                                       bp::GQAQKVColumnParallelLinearOptions(kHidden, kHeads * kHeadDim, kKvHeads * kHeadDim)
                                           .gather_output(false)
                                           .bias(false)
                                           .tensor_model_parallel_group(group)))),
        attention_out(register_module("attention_out", bp::RowParallelLinear(bp::RowParallelLinearOptions(kHeads * kHeadDim, kHidden)
                                                                                 .input_is_parallel(true)
                                                                                 .tensor_model_parallel_group(group)))),
        mlp_norm(register_module("mlp_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})))),
        up(register_module("up", bp::ColumnParallelLinear(bp::ColumnParallelLinearOptions(kHidden, 4 * kHidden)
                                                              .gather_output(false)
                                                              .tensor_model_parallel_group(group)))),
        down(register_module("down", bp::RowParallelLinear(bp::RowParallelLinearOptions(4 * kHidden, kHidden)
                                                               .input_is_parallel(true)
                                                               .tensor_model_parallel_group(group)))) {}

  at::Tensor forward(const at::Tensor& x) {  // (batch, sequence, hidden)
    auto [q, k, v] = qkv(attention_norm(x));
    auto heads = [&](const at::Tensor& t) {  // (batch, sequence, n * head_dim) -> (batch, n, sequence, head_dim)
      return t.view({t.size(0), t.size(1), t.size(2) / kHeadDim, kHeadDim}).transpose(1, 2);
    };
    at::Tensor qh = heads(q), kh = heads(k), vh = heads(v);
    const int64_t group_size = qh.size(1) / kh.size(1);  // query heads per key/value head, on this rank too
    kh = kh.repeat_interleave(group_size, 1);
    vh = vh.repeat_interleave(group_size, 1);
    const int64_t s = x.size(1);
    const at::Tensor future = at::ones({s, s}, at::kBool).triu(1);
    at::Tensor scores = at::matmul(qh, kh.transpose(-1, -2)) / std::sqrt(static_cast<double>(kHeadDim));
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    at::Tensor attended = at::matmul(at::softmax(scores, -1), vh).transpose(1, 2).contiguous();
    at::Tensor h = x + attention_out(attended.view({x.size(0), s, -1}));
    return h + down(at::gelu(up(mlp_norm(h))));
  }

  torch::nn::LayerNorm attention_norm;
  bp::GQAQKVColumnParallelLinear qkv;
  bp::RowParallelLinear attention_out;
  torch::nn::LayerNorm mlp_norm;
  bp::ColumnParallelLinear up;
  bp::RowParallelLinear down;
};
TORCH_MODULE(Block);

// Final norm and the vocabulary projection, gathered: (batch, sequence, vocabulary) logits everywhere.
struct HeadImpl : torch::nn::Module {
  explicit HeadImpl(const bp::GroupPtr& group)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})))),
        logits(register_module("logits", bp::ColumnParallelLinear(bp::ColumnParallelLinearOptions(kHidden, kVocab)
                                                                      .gather_output(true)
                                                                      .tensor_model_parallel_group(group)))) {}
  at::Tensor forward(const at::Tensor& x) { return logits(norm(x)); }
  torch::nn::LayerNorm norm;
  bp::ColumnParallelLinear logits;
};
TORCH_MODULE(Head);

// The decoder as layers a pipeline can cut: "0" the embedding, "1".."kBlocks" the blocks, then the head.
// `group`: the layers' tensor-parallel group (default: the model-parallel state's).
torch::nn::Sequential gpt(const bp::GroupPtr& group = nullptr) {
  at::manual_seed(0);  // the same weights in every process and every layout
  torch::nn::Sequential model{Embed(group)};
  for (int b = 0; b < kBlocks; ++b) model->push_back(Block(group));
  model->push_back(Head(group));
  return model;
}

at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& labels) {
  return at::cross_entropy_loss(logits.flatten(0, 1), labels.flatten());
}

// The global batch of a step: x[t+1] = (5 x[t] + 3) mod vocabulary from random starts; labels are the
// inputs shifted by one.
std::pair<at::Tensor, at::Tensor> batch(int step) {
  at::manual_seed(static_cast<uint64_t>(1000 + step));
  at::Tensor tokens = at::empty({kGlobalBatch, kSequence + 1}, at::kLong);
  tokens.select(1, 0).copy_(at::randint(kVocab, {kGlobalBatch}, at::kLong));
  for (int64_t t = 1; t <= kSequence; ++t) tokens.select(1, t).copy_((tokens.select(1, t - 1) * 5 + 3) % kVocab);
  return {tokens.narrow(1, 0, kSequence), tokens.narrow(1, 1, kSequence)};
}

std::string tag_of(int step) {
  char tag[32];
  std::snprintf(tag, sizeof(tag), "step_%05d", step);
  return tag;
}

// The unsharded model in this process, trained on the whole batch as the job trains on its shares.
struct Unsharded {
  explicit Unsharded(const bp::GroupPtr& alone) : model(gpt(alone)), optimizer(model->parameters(), options()) {}
  static torch::optim::AdamWOptions options() { return torch::optim::AdamWOptions(3e-3).weight_decay(0.01); }
  double step(int step) {
    auto [x, y] = batch(step);
    optimizer.zero_grad();
    at::Tensor loss = next_token_loss(model->forward(x), y);
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    optimizer.step();
    return loss.item<double>();
  }
  torch::nn::Sequential model;
  torch::optim::AdamW optimizer;
};

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"A small GPT-like decoder trained with tensor, pipeline and data parallelism, with checkpoints.", "gpt_train"};
  app.add_option("--steps", args.steps, "training steps")->check(CLI::Range(0, 1000000));
  app.add_option("--tp", args.tp, "tensor-parallel size")->check(CLI::Range(0, 1000000));
  app.add_option("--pp", args.pp, "pipeline-parallel size")->check(CLI::Range(0, 1000000));
  app.add_option("--microbatches", args.microbatches, "microbatches per step")->check(CLI::Range(0, 1000000));
  app.add_flag("--zero1", args.zero1, "shard the optimizer's state over data-parallel ranks (ZeRO-1)");
  app.add_flag("--recompute", args.recompute, "recompute the blocks' activations in the backward pass");
  app.add_flag("--check", args.check, "also train the unsharded model and fail (exit 3) unless every step's loss matches");
  app.add_option("--save-every", args.save_every, "save a checkpoint every N steps (0: never)")->check(CLI::Range(0, 1000000));
  app.add_option("--checkpoint-dir", args.checkpoint_dir, "where checkpoints go");
  app.add_flag("--resume", args.resume, "resume from the newest complete checkpoint");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a bad flag or value: 2, as other tools
  }
  try {
    bp::init_process_group();
    bp::ParallelConfig config;
    config.tensor_parallel_size = args.tp;
    config.pipeline_parallel_size = args.pp;
    config.pipeline_config.num_microbatches = args.microbatches;
    config.pipeline_config.loss_fn = next_token_loss;
    config.optimizer_config.zero_one_enabled = args.zero1;
    config.optimizer_config.max_grad_norm = 1.0;
    if (args.recompute) config.activation_checkpoint_config = bp::ActivationCheckpointConfig::selective<BlockImpl>();
    auto model = bp::initialize_parallel_model(config, [] { return gpt(); });
    auto optimizer = bp::initialize_parallel_optimizer<torch::optim::AdamW>(config, model.parameters(), Unsharded::options());
    const int dp = bp::get_data_parallel_size(), dp_rank = bp::get_data_parallel_rank();
    bp::master_print("gpt_train: backend " + bp::get_backend() + ", " + std::to_string(bp::get_world_size()) +
                     " rank(s): tp " + std::to_string(bp::get_tensor_model_parallel_size()) + " x pp " +
                     std::to_string(bp::get_pipeline_model_parallel_size()) + " x dp " + std::to_string(dp) + ", " +
                     std::to_string(args.microbatches) + " microbatches" + (args.zero1 ? ", ZeRO-1" : "") +
                     (args.recompute ? ", blocks recomputed" : ""));

    int start = 0;
    if (args.resume && bp::has_checkpoint(args.checkpoint_dir)) {
      bp::UserContent content =
          bp::load_checkpoint(args.checkpoint_dir, "", model.module().ptr().get(), &optimizer, nullptr);
      start = static_cast<int>(content.at("step").toInt());
      bp::master_print("gpt_train: resumed from step " + std::to_string(start));
    }
    std::unique_ptr<Unsharded> unsharded;
    if (args.check) {
      if (start > 0) throw bp::Error(BPL_ERR_INVALID_ARGUMENT, "--check trains the unsharded model from step 1: not with --resume");
      unsharded = std::make_unique<Unsharded>(bp::get_world_group()->split(bp::get_rank(), 0));
    }
    int mismatches = 0;
    for (int step = start + 1; step <= args.steps; ++step) {
      auto [x, y] = batch(step);
      optimizer.zero_grad();
      at::Tensor loss = model.run_train(x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]).reshape({1}).clone();
      optimizer.step();
      bp::get_data_parallel_group()->all_reduce(loss, bp::ReduceOp::Sum);
      const double mean = loss.item<double>() / dp;
      char line[160];
      std::snprintf(line, sizeof(line), "step %d loss %.6f grad_norm %.6f", step, mean, optimizer.grad_norm().value_or(0.0));
      bp::master_print(line);
      if (unsharded) {
        const double expected = unsharded->step(step);
        if (std::abs(mean - expected) > 1e-4 * (1 + std::abs(expected))) {
          ++mismatches;
          std::fprintf(stderr, "gpt_train: rank %d: step %d loss %.6f, the unsharded model's %.6f\n", bp::get_rank(), step,
                       mean, expected);
        }
      }
      if (args.save_every > 0 && step % args.save_every == 0) {
        bp::save_checkpoint(args.checkpoint_dir, tag_of(step), model.module().ptr().get(), &optimizer, nullptr,
                            {{"step", c10::IValue(int64_t{step})}});
      }
    }
    if (unsharded) {
      at::Tensor failed = at::full({1}, mismatches, at::kInt);
      bp::get_world_group()->all_reduce(failed, bp::ReduceOp::Sum);
      bp::master_print(failed.item<int>() == 0 ? "check: every step's loss matches the unsharded model's"
                                               : "check: FAILED: " + std::to_string(failed.item<int>()) +
                                                     " step losses differ from the unsharded model's");
      if (failed.item<int>() != 0) {
        bp::destroy_process_group();
        return 3;
      }
    }
    bp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_train: %s\n", e.what());
    return 1;
  }
}
