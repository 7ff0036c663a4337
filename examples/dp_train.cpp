// Data-parallel (and tensor-parallel) training of a small MLP on a synthetic regression task, with
// sharded checkpoints and resumption:
//
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 2 dp_train --steps 30 --save-every 10 --checkpoint-dir ckpt
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 2 dp_train --steps 40 --checkpoint-dir ckpt --resume
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 4 dp_train --tp 2 --zero1      (TP 2 x DP 2)
//   mpirun -np 2 dp_train --steps 30
//
// Every rank draws the same global batch of 16 rows for a step (seeded by the step number) and trains on
// its data-parallel share, so a run resumed from a checkpoint repeats the original run's losses.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adam.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backplane/parallel.h"

namespace bp = backplane::parallel;

namespace {

struct Args {
  int steps = 30;
  int tp = 1;
  bool zero1 = false;
  int save_every = 0;
  std::string checkpoint_dir = "dp_train_checkpoints";
  int keep = 2;
  bool async_save = false;
  bool resume = false;
};

// 8 -> 32 -> 4, the hidden layer split over tensor-parallel ranks.
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : up(register_module("up", bp::ColumnParallelLinear(bp::ColumnParallelLinearOptions(8, 32).gather_output(false)))),
        down(register_module("down", bp::RowParallelLinear(bp::RowParallelLinearOptions(32, 4).input_is_parallel(true)))) {}
  at::Tensor forward(const at::Tensor& x) { return down(at::tanh(up(x))); }
  bp::ColumnParallelLinear up;
  bp::RowParallelLinear down;
};
TORCH_MODULE(Mlp);

// The global batch of a step: y = sin(x W) + noise, W fixed.
std::pair<at::Tensor, at::Tensor> batch(int step) {
  at::manual_seed(12345);
  at::Tensor w = at::randn({8, 4});
  at::manual_seed(static_cast<uint64_t>(step));
  at::Tensor x = at::randn({16, 8});
  return {x, at::sin(x.matmul(w)) + 0.05 * at::randn({16, 4})};
}

std::string tag_of(int step) {
  char tag[32];
  std::snprintf(tag, sizeof(tag), "step_%05d", step);
  return tag;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"Data-parallel (and tensor-parallel) training of a small MLP, with sharded checkpoints and resumption.", "dp_train"};
  app.add_option("--steps", args.steps, "training steps")->check(CLI::Range(0, 1000000));
  app.add_option("--tp", args.tp, "tensor-parallel size")->check(CLI::Range(0, 1000000));
  app.add_flag("--zero1", args.zero1, "shard the optimizer's state over data-parallel ranks (ZeRO-1)");
  app.add_option("--save-every", args.save_every, "save a checkpoint every N steps (0: never)")->check(CLI::Range(0, 1000000));
  app.add_option("--checkpoint-dir", args.checkpoint_dir, "where checkpoints go");
  app.add_option("--keep", args.keep, "checkpoints kept")->check(CLI::Range(0, 1000000));
  app.add_flag("--async-save", args.async_save, "write checkpoints in the background");
  app.add_flag("--resume", args.resume, "resume from the newest complete checkpoint");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a bad flag or value: 2, as other tools
  }
  try {
    bp::ParallelConfig config;
    config.tensor_parallel_size = args.tp;
    config.optimizer_config.zero_one_enabled = args.zero1;
    config.optimizer_config.grad_clipping = true;
    config.optimizer_config.max_grad_norm = 1.0;
    auto model = bp::initialize_parallel_model(config, [] {
      at::manual_seed(0);
      return Mlp();
    });
    auto optimizer = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, model.parameters(),
                                                                           torch::optim::AdamOptions(1e-2));
    bp::master_print("dp_train: backend " + bp::get_backend() + ", " + std::to_string(bp::get_world_size()) +
                     " rank(s): tp " + std::to_string(bp::get_tensor_model_parallel_size()) + " x dp " +
                     std::to_string(bp::get_data_parallel_size()) + (args.zero1 ? ", ZeRO-1" : ""));
    int start = 0;
    if (args.resume && bp::has_checkpoint(args.checkpoint_dir)) {
      bp::UserContent content =
          bp::load_checkpoint(args.checkpoint_dir, "", model.module().ptr().get(), &optimizer, nullptr);
      start = static_cast<int>(content.at("step").toInt());
      bp::master_print("dp_train: resumed from step " + std::to_string(start) + " (" + args.checkpoint_dir + "/" +
                       tag_of(start) + ")");
    }
    const int dp = bp::get_data_parallel_size(), dp_rank = bp::get_data_parallel_rank();
    for (int step = start + 1; step <= args.steps; ++step) {
      auto [x, y] = batch(step);
      optimizer.zero_grad();
      at::Tensor loss = at::mse_loss(model.run_train(x.chunk(dp)[dp_rank]), y.chunk(dp)[dp_rank]);
      loss.backward();
      optimizer.step();
      at::Tensor mean_loss = loss.detach().reshape({1}).clone();
      // A sum, then divided: every backend sums (the Neuron runtime has no average).
      bp::get_data_parallel_group()->all_reduce(mean_loss, bp::ReduceOp::Sum);
      mean_loss /= dp;
      char line[128];
      std::snprintf(line, sizeof(line), "step %d loss %.6f grad_norm %.6f", step, mean_loss.item<double>(),
                    optimizer.grad_norm().value_or(0.0));
      bp::master_print(line);
      if (args.save_every > 0 && step % args.save_every == 0) {
        bp::save_checkpoint(args.checkpoint_dir, tag_of(step), model.module().ptr().get(), &optimizer, nullptr,
                            {{"step", c10::IValue(int64_t{step})}}, args.keep, args.async_save);
      }
    }
    bp::finalize_checkpoint();
    bp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp_train: %s\n", e.what());
    return 1;
  }
}
