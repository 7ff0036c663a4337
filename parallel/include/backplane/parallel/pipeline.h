// Pipeline parallelism: a torch::nn::Sequential cut into stages, one per pipeline-parallel rank, trained
// microbatch by microbatch with the 1F1B schedule (one forward, one backward).
//
// Every rank builds the whole Sequential (so its weights do not depend on the layout) and keeps only its
// stage's layers, under their names in the whole model: "4.weight" is "4.weight" on whichever stage holds
// it, so checkpoints and comparisons with the unsharded model line up. Between neighbouring stages the
// activation of each microbatch goes forward and its gradient backward by send/recv on the
// pipeline-parallel group (sends asynchronous, so a stage never waits for its neighbour to receive).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <string>
#include <vector>

#include "backplane/parallel/mappings.h"

namespace backplane::parallel {

// A microbatch's loss from the last stage's output and the microbatch's labels: a scalar, the mean over
// the microbatch (as at::mse_loss or at::cross_entropy_loss return by default), so that the mean over
// equal microbatches is the mean over the batch.
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& labels)>;

// neuronx_distributed_config's pipeline_config.
struct PipelineConfig {
  // run_train splits its batch (dim 0 of inputs and labels) into this many equal microbatches.
  int num_microbatches = 1;
  // Names of the Sequential's layers after which a stage ends: pipeline_parallel_size - 1 of them, in
  // the model's order. Empty: stages of equal numbers of layers (the first ones one longer).
  std::vector<std::string> pipeline_cuts;
  // Set, run_train(inputs, labels) runs the whole iteration (forward and backward of every microbatch)
  // and returns the loss; required with pipeline_parallel_size > 1.
  LossFn loss_fn;
};

// The layers [first, end) of each of `stages` stages of a model whose layers are `layer_names`. Error
// naming the value for a cut that is not a layer, cuts out of order, a count of cuts other than
// stages - 1, or a stage left without layers.
std::vector<std::pair<size_t, size_t>> pipeline_stage_bounds(const std::vector<std::string>& layer_names,
                                                             const std::vector<std::string>& cuts, int stages);

// Stage `stage`'s layers of `model` (shared, not copied), under their names in `model`.
torch::nn::Sequential select_pipeline_stage(const torch::nn::Sequential& model, const std::vector<std::string>& cuts,
                                            int stage, int stages);

// One step of a stage's schedule: the forward or backward of a microbatch.
struct PipelineStep {
  enum Kind { kForward, kBackward } kind;
  int microbatch;
  bool operator==(const PipelineStep& other) const { return kind == other.kind && microbatch == other.microbatch; }
};

// The 1F1B schedule of stage `stage` of `stages` over `microbatches`: stages - stage - 1 forwards to fill
// the pipeline (at most all of them), then a forward and a backward in turn, then the backwards left.
// A stage holds at most stages - stage microbatches' activations at once.
std::vector<PipelineStep> one_f_one_b_schedule(int stage, int stages, int microbatches);

// Runs a stage's training iterations.
class PipelineEngine {
 public:
  // `group`: the pipeline-parallel group, whose rank is the stage's index.
  PipelineEngine(torch::nn::Sequential stage, PipelineConfig config, GroupPtr group);

  // Forward and backward of every microbatch of (inputs, labels) through the whole pipeline, gradients
  // accumulated into the stage's parameters (each microbatch's loss scaled by 1 / num_microbatches).
  // Returns the batch's loss (the mean over the microbatches), a float scalar, on every stage. Every rank
  // passes the whole batch: the first stage reads inputs, the last labels.
  at::Tensor run_train(const at::Tensor& inputs, const at::Tensor& labels);

 private:
  void forward(int microbatch, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& labels);
  void backward(int microbatch);

  torch::nn::Sequential stage_;
  PipelineConfig config_;
  GroupPtr group_;
  int stage_index_ = 0;
  int stages_ = 1;
  // Per microbatch in flight: what forward received (a leaf, for its gradient) and produced.
  std::vector<at::Tensor> received_, produced_;
  std::vector<Work> sends_;  // waited for at the end of each iteration
  at::Tensor loss_sum_;
};

}  // namespace backplane::parallel
