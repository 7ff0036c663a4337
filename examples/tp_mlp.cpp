// The CPU-mode tensor-parallel MLP of neuronx-distributed's documentation, in C++:
//
//   NXD_CPU_MODE=1 bpl-run --nproc-per-node 2 tp_mlp [--check] [--seed N] [--tp N]
//
// Two layers, ColumnParallelLinear (output kept split) then RowParallelLinear (input already split), no
// bias, hidden size 1024, input 4 x 1024. The same binary runs on any backend (BPL_BACKEND=mpi under
// mpirun, the accelerator without NXD_CPU_MODE). With --check, rank 0 also runs the unsharded MLP from
// the layers' master weights and compares.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/nn/modules/container/sequential.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backplane/parallel.h"

namespace bp = backplane::parallel;

namespace {

struct Args {
  bool check = false;
  uint64_t seed = 0;
  int tp = 0;  // 0: the world size
};

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{"The CPU-mode tensor-parallel MLP: ColumnParallelLinear then RowParallelLinear, on every rank.", "tp_mlp"};
  app.add_flag("--check", args.check, "rank 0 also runs the unsharded MLP from the master weights and compares");
  app.add_option("--seed", args.seed, "the seed of the master weights and the input");
  app.add_option("--tp", args.tp, "tensor-parallel size (0: the world size)")->check(CLI::Range(0, 1000000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a bad flag or value: 2, as other tools
  }
  try {
    bp::init_process_group();
    bp::initialize_model_parallel(args.tp > 0 ? args.tp : bp::get_world_size());

    // Every rank draws the same master weights and input.
    at::manual_seed(args.seed);
    const int64_t hidden_size = 1024;
    at::Tensor inputs = at::rand({4, hidden_size});
    bp::ColumnParallelLinear column(
        bp::ColumnParallelLinearOptions(hidden_size, hidden_size).bias(false).gather_output(false).keep_master_weight(true));
    bp::RowParallelLinear row(
        bp::RowParallelLinearOptions(hidden_size, hidden_size).bias(false).input_is_parallel(true).keep_master_weight(true));
    torch::nn::Sequential model(column, row);
    model->to(bp::get_device());
    inputs = inputs.to(bp::get_device());

    at::Tensor outputs = model->forward(inputs);
    bp::master_print("Output sum is " + std::to_string(outputs.sum().item<double>()));

    int status = 0;
    if (args.check && bp::get_rank() == 0) {
      at::Tensor expected = at::linear(at::linear(inputs, column->master_weight), row->master_weight);
      const double difference = (outputs - expected).abs().max().item<double>();
      const bool match = at::allclose(outputs, expected, 1e-4, 1e-5);
      std::printf("Unsharded output sum is %s (tp %d, max |difference| %.3g): %s\n",
                  std::to_string(expected.sum().item<double>()).c_str(), bp::get_tensor_model_parallel_size(),
                  difference, match ? "match" : "MISMATCH");
      status = match ? 0 : 1;
    }
    bp::destroy_process_group();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tp_mlp: %s\n", e.what());
    return 1;
  }
}
