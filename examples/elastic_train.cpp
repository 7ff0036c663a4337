// elastic_train: training with the LibTorch frontend that survives the loss of ranks (ElasticTrainer):
//
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 3 --keep-going elastic_train --fail-rank 1 --fail-at 5
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 4 --replace elastic_train --tp 2 --replace --fail-rank 1 --fail-at 5
//
// A small MLP (its hidden layer split over tensor-parallel ranks) trains with Adam on a synthetic task,
// in double precision. Every rank draws the same global batch for a step (seeded by the step number)
// and trains on its replica's share, so the parameters at the end do not depend on how many replicas
// shared each step, nor on when a rank failed.
//
// --fail-rank R --fail-at S make rank R fail in step S: --fail-how kill (SIGKILL) or stop (SIGSTOP:
// found at the timeout, BPL_TIMEOUT_MS), --fail-delay-us D microseconds into the step (anywhere in its
// forward, backward, reductions or commit); --fail-also R2 kills rank R2 as the others recover, a second
// failure while they shrink or (--fail-also-during grow) while they grow back. Each rank prints what it
// went through, one line per event, and at the end the whole model's parameters. A rank whose
// tensor-parallel replica lost a rank leaves the job with status 3 (bpl-run --replace then starts a
// newcomer in its place too).
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <signal.h>
#include <torch/optim/adam.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>

#include "backplane/parallel.h"

namespace bp = backplane::parallel;

namespace {

constexpr int64_t kGlobalBatch = 24;

// 6 -> 16 -> 3, the hidden layer split over tensor-parallel ranks.
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : up(register_module("up", bp::ColumnParallelLinear(bp::ColumnParallelLinearOptions(6, 16)
                                                              .gather_output(false)
                                                              .dtype(at::kDouble)))),
        down(register_module("down", bp::RowParallelLinear(bp::RowParallelLinearOptions(16, 3)
                                                               .input_is_parallel(true)
                                                               .dtype(at::kDouble)))) {}
  at::Tensor forward(const at::Tensor& x) { return down(at::tanh(up(x))); }
  bp::ColumnParallelLinear up;
  bp::RowParallelLinear down;
};
TORCH_MODULE(Mlp);

// The global batch of a step: y = sin(x W), W fixed.
std::pair<at::Tensor, at::Tensor> global_batch(int64_t step) {
  at::manual_seed(12345);
  at::Tensor w = at::randn({6, 3}, at::kDouble);
  at::manual_seed(static_cast<uint64_t>(1000 + step));
  at::Tensor x = at::randn({kGlobalBatch, 6}, at::kDouble);
  return {x, at::sin(x.matmul(w))};
}

// Milliseconds of the machine's monotonic clock, which every process reads alike.
double monotonic_ms() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

// Kills or stops this process `delay_us` from now, wherever the training then is: the kernel sends the
// signal when a timer expires (no thread of ours need be scheduled in time). A stopped one is killed by
// a helper process after 4 timeouts, by when the others went on.
void fail_after(const std::string& how, int64_t delay_us, int64_t timeout_ms) {
  const int signal = how == "kill" ? SIGKILL : SIGSTOP;
  const pid_t me = getpid();
  if (signal == SIGSTOP && fork() == 0) {  // only async-signal-safe calls in the child
    const int64_t us = delay_us + 4 * timeout_ms * 1000;
    struct timespec pause = {static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
    nanosleep(&pause, nullptr);
    kill(me, SIGKILL);
    _exit(0);
  }
  if (delay_us == 0) {
    raise(signal);
    return;
  }
  sigevent event{};
  event.sigev_notify = SIGEV_SIGNAL;
  event.sigev_signo = signal;
  timer_t timer;
  itimerspec when{};
  when.it_value = {static_cast<time_t>(delay_us / 1000000), static_cast<long>(delay_us % 1000000) * 1000};
  if (timer_create(CLOCK_MONOTONIC, &event, &timer) != 0 || timer_settime(timer, 0, &when, nullptr) != 0) {
    std::perror("elastic_train: arming the failure");
    std::exit(2);
  }
}

// The whole model's parameters, tensor-parallel partitions put back together, as text.
std::string whole_parameters(torch::nn::Module& module) {
  std::string text;
  for (const at::Tensor& p : module.parameters()) {
    at::Tensor whole = p.detach();
    if (auto partition = bp::tensor_model_parallel_attributes(p)) {
      whole = bp::get_tensor_model_parallel_group()->all_gather(whole, partition->partition_dim);
    }
    whole = whole.contiguous();
    const double* values = whole.data_ptr<double>();
    for (int64_t i = 0; i < whole.numel(); ++i) {
      char number[32];
      std::snprintf(number, sizeof(number), " %.17g", values[i]);
      text += number;
    }
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 20, fail_at = 5, fail_delay_us = 0, pause_ms = 0;
  int tp = 1, fail_rank = -1, fail_also = -1;
  bool replace = false;
  std::string fail_how = "kill", fail_also_during = "shrink", save_dir, load_dir;
  CLI::App app{"Training that survives the loss of ranks (the LibTorch frontend's ElasticTrainer)", "elastic_train"};
  app.add_option("--steps", steps, "steps to train")->check(CLI::NonNegativeNumber);
  app.add_option("--tp", tp, "tensor-parallel size")->check(CLI::PositiveNumber);
  app.add_option("--fail-rank", fail_rank, "the rank that fails (default: none)");
  app.add_option("--fail-at", fail_at, "the step it fails in")->check(CLI::NonNegativeNumber);
  app.add_option("--fail-how", fail_how, "kill or stop")->check(CLI::IsMember({"kill", "stop"}));
  app.add_option("--fail-delay-us", fail_delay_us, "how far into the step it fails")->check(CLI::NonNegativeNumber);
  app.add_option("--fail-also", fail_also, "a rank killed while the others recover from the first failure");
  app.add_option("--fail-also-during", fail_also_during, "shrink (as its step fails) or grow (once shrunk)")
      ->check(CLI::IsMember({"shrink", "grow"}));
  app.add_option("--pause-ms", pause_ms, "a pause after each step")->check(CLI::NonNegativeNumber);
  app.add_flag("--replace", replace, "after a failure, grow back with newcomers (as bpl-run --replace starts them)");
  app.add_option("--save", save_dir, "save a checkpoint here at the end");
  app.add_option("--load", load_dir, "load the checkpoint saved here before training");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::string name = "rank ?";
  try {
    bp::init_process_group();  // a newcomer (BPL_JOIN=1) waits here to be admitted
    name = bp::joined_running_job() ? "newcomer" : "rank " + std::to_string(bp::get_rank());
    const bool second_to_fail = !bp::joined_running_job() && bp::get_rank() == fail_also;
    // --fail-also: this rank dies a moment after its step failed (while the others shrink), or after the
    // shrink (while they grow back, with --replace).
    const std::string second_failure_after = fail_also_during == "shrink" ? " failed: " : " survive";
    auto say = [&name, second_to_fail, second_failure_after](const std::string& line) {
      std::printf("%s: %s\n", name.c_str(), line.c_str());
      std::fflush(stdout);
      if (second_to_fail && line.find(second_failure_after) != std::string::npos) fail_after("kill", 2000, 0);
    };
    bp::ParallelConfig config;
    config.tensor_parallel_size = tp;
    auto model = bp::initialize_parallel_model(config, [] {
      at::manual_seed(0);
      return Mlp();
    });
    auto optimizer = bp::initialize_parallel_optimizer<torch::optim::Adam>(config, model.parameters(),
                                                                           torch::optim::AdamOptions(1e-2));
    if (!load_dir.empty()) bp::load_checkpoint(load_dir, "final", model.module().ptr().get(), &optimizer, nullptr);
    bp::ElasticOptions options;
    options.global_batch_size = kGlobalBatch;
    options.replace = replace;
    options.report = say;
    bp::ElasticTrainer trainer(*model.module(), optimizer, options);
    const int world_rank = bp::joined_running_job() ? -1 : bp::get_rank();
    while (trainer.steps_done() < steps) {
      const int64_t step = trainer.steps_done();
      if (world_rank == fail_rank && step == fail_at) {
        say("failing in step " + std::to_string(step) + " (" + fail_how + ", " + std::to_string(fail_delay_us) +
            " us in) at " + std::to_string(monotonic_ms()) + " ms of the monotonic clock");
        int64_t timeout_ms = 0;
        bpl_comm_get_timeout(bp::get_world_group()->comm(), &timeout_ms);
        fail_after(fail_how, fail_delay_us, timeout_ms);
      }
      const int failures = trainer.failures();
      const bool stepped = trainer.step([&](const bp::BatchShare& share) {
        auto [x, y] = global_batch(share.step);
        x = x.slice(0, share.begin, share.end);
        y = y.slice(0, share.begin, share.end);
        at::Tensor loss = at::mse_loss(model.run_train(x), y) * share.loss_scale;
        loss.backward();
      });
      if (!stepped) {
        say("left the job");
        bp::destroy_process_group();
        return 3;
      }
      if (trainer.failures() > failures) {
        say("resumed: step " + std::to_string(trainer.steps_done() - 1) + " done at " +
            std::to_string(monotonic_ms()) + " ms of the monotonic clock");
      }
      if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    }
    if (!save_dir.empty()) {
      bp::save_checkpoint(save_dir, "final", model.module().ptr().get(), &optimizer, nullptr, {}, 1, false);
      bp::finalize_checkpoint();
    }
    say("done: " + std::to_string(trainer.steps_done()) + " steps, " + std::to_string(trainer.failures()) +
        " failure(s) survived, " + std::to_string(trainer.steps_redone()) + " step(s) redone, " +
        std::to_string(bp::get_world_size()) + " rank(s) left; w =" + whole_parameters(*model.module()));
    bp::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::printf("%s: %s\n", name.c_str(), e.what());
    std::fflush(stdout);
    return 1;
  }
}
