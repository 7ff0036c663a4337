// Training APIs in the shape of neuronx-distributed's trainer: a config that sets up the parallel
// state, a model wrapper and an optimizer wrapper (data-parallel averaging, clipping, ZeRO-1).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "backplane/parallel/activation_checkpoint.h"
#include "backplane/parallel/distributed.h"
#include "backplane/parallel/grads.h"
#include "backplane/parallel/lora.h"
#include "backplane/parallel/parallel_state.h"
#include "backplane/parallel/pipeline.h"

namespace backplane::parallel {

struct OptimizerConfig {
  // Shard optimizer state and fp32 master weights over the data-parallel group.
  bool zero_one_enabled = false;
  bool grad_clipping = true;
  double max_grad_norm = 1.0;
};

// neuronx_distributed_config's model_init_config (its param_init_fn is ParallelConfig::param_init_fn).
struct ModelInitConfig {
  // At most this many ranks of a machine run model_fn at once (1 to 32); the others wait their turn, to
  // bound the host memory the builds take together.
  int sequential_move_factor = 11;
  // backplane's parallel layers made by model_fn allocate only this rank's shard, uninitialised: no full
  // master weight is made or drawn. param_init_fn (then required) initialises the model. (LibTorch cannot
  // move a parameter off the meta device in place, so the shards are allocated, untouched, on the CPU.)
  bool meta_device_init = false;
};

// neuronx_distributed_config's choices that apply here.
struct ParallelConfig {
  int tensor_parallel_size = 1;
  // Above 1, the model must be a torch::nn::Sequential and pipeline_config.loss_fn set.
  int pipeline_parallel_size = 1;
  PipelineConfig pipeline_config;
  // Layers recomputed in the backward instead of keeping their activations (a Sequential model).
  ActivationCheckpointConfig activation_checkpoint_config;
  // Adapters on the layers it targets, the rest frozen (enable_lora).
  LoraConfig lora_config;
  OptimizerConfig optimizer_config;
  // Sum the gradients of sequence-parallel parameters over TP in the optimizer step.
  bool sequence_parallel = false;
  // Gradients are averaged over data parallelism in buckets of this size.
  double allreduce_bucket_cap_mb = 512;
  // model_init_config's param_init_fn: run on the built model before its parameters are made identical
  // across data-parallel ranks (so rank 0's initialisation is the one every rank gets).
  std::function<void(torch::nn::Module&)> param_init_fn;
  ModelInitConfig model_init_config;
  // The parallel linear layers model_fn makes pad sizes that do not divide the tensor-parallel degree
  // (their `pad` option): attention heads padded with zero heads, when the layers are told a head's size
  // (pad_alignment_size_per_rank).
  bool pad_model = false;
};

// Checks `config` (every problem named, with its value) and initialises the process group and the
// model-parallel state it describes, or checks that the existing state matches it. Returns the config.
ParallelConfig initialize_parallel_config(ParallelConfig config);

// Applies the BF16 environment of torch-xla to `module`'s floating parameters and buffers:
// XLA_USE_BF16=1 makes f32 and f64 bf16; XLA_DOWNCAST_BF16=1 makes f32 bf16 and f64 f32. Returns the
// dtype of the first floating parameter afterwards (f32 without any).
at::ScalarType apply_bf16_environment(torch::nn::Module& module);

// Makes parameters and buffers identical across the data-parallel group (rank 0 of each group's values).
void broadcast_from_data_parallel_source(torch::nn::Module& module);

namespace detail {
// The turns in which the machines' ranks run model_fn, at most sequential_move_factor ranks of a machine
// per turn: (number of turns, this rank's). Collective over the world.
std::pair<int, int> model_build_turns(int sequential_move_factor);
void end_model_build_turn();
// What the config does to a built Sequential model, in this order: LoRA adapters (on the whole model, so
// that their draws do not depend on the layout), this rank's pipeline stage, recomputed layers.
torch::nn::Sequential prepare_sequential(torch::nn::Sequential model, const ParallelConfig& config);
// To another module: LoRA adapters; an error for what needs a Sequential (pipeline, recomputed layers).
void prepare_module(torch::nn::Module& model, const ParallelConfig& config);
// The LoRA config to build adapters with: with load_lora_from_ckpt, the saved adapter's.
LoraConfig lora_config_to_apply(const LoraConfig& config);
// With load_lora_from_ckpt, loads the adapter (and the base model if it was saved with it) into `model`.
void load_lora_checkpoint(torch::nn::Module& model, const LoraConfig& config);
}  // namespace detail

// A model built for the current parallel config: the module (with pipeline parallelism, this rank's
// stage of it), its dtype, and run_train.
template <typename ModuleType>
class ParallelModel {
 public:
  ParallelModel(ModuleType module, at::ScalarType dtype, std::shared_ptr<PipelineEngine> pipeline = nullptr)
      : module_(std::move(module)), dtype_(dtype), pipeline_(std::move(pipeline)) {}
  // The module this rank holds (neuronx-distributed's local_module()).
  ModuleType& module() { return module_; }
  auto operator->() { return module_.operator->(); }
  at::ScalarType dtype() const { return dtype_; }
  std::vector<at::Tensor> parameters() const { return module_->parameters(); }
  // With pipeline_config.loss_fn set (a Sequential model): run_train(inputs, labels) is a whole
  // training iteration, forward and backward of every microbatch through every stage, and returns the
  // batch's loss on every rank (PipelineEngine::run_train); optimizer.step() follows. Without: the
  // module's forward, whose output the caller turns into a loss and calls backward on.
  template <typename... Inputs>
  auto run_train(Inputs&&... inputs) {
    if constexpr (std::is_same_v<ModuleType, torch::nn::Sequential>) {
      if constexpr (sizeof...(Inputs) == 2) {
        if (pipeline_) return pipeline_->run_train(std::forward<Inputs>(inputs)...);
      }
      if (pipeline_) {
        throw Error(BPL_ERR_INVALID_ARGUMENT, "run_train: with pipeline_config.loss_fn set it takes (inputs, labels), not " +
                                                  std::to_string(sizeof...(Inputs)) + " argument(s)");
      }
    }
    return module_->forward(std::forward<Inputs>(inputs)...);
  }

 private:
  ModuleType module_;
  at::ScalarType dtype_;
  std::shared_ptr<PipelineEngine> pipeline_;
};

// Builds the model with model_fn() under the config's parallel state, applies the BF16 environment and
// makes its parameters identical across data-parallel ranks. ModuleType is a torch::nn module holder
// (what TORCH_MODULE defines) or a std::shared_ptr to a module. With pipeline_config.loss_fn set, the
// model must be a torch::nn::Sequential: every rank builds all of it (its weights then do not depend on
// the layout) and keeps its pipeline stage's layers.
template <typename ModelFn>
auto initialize_parallel_model(const ParallelConfig& config, ModelFn&& model_fn) {
  initialize_parallel_config(config);
  auto build = [&] {
    std::optional<DeferredInitScope> deferred;
    std::optional<PadModelScope> padded;
    if (config.model_init_config.meta_device_init) deferred.emplace();
    if (config.pad_model) padded.emplace();
    return model_fn();
  };
  std::optional<decltype(build())> built;
  const auto [turns, my_turn] = detail::model_build_turns(config.model_init_config.sequential_move_factor);
  for (int turn = 0; turn < turns; ++turn) {
    if (turn == my_turn) built.emplace(build());
    if (turns > 1) detail::end_model_build_turn();
  }
  auto module = std::move(*built);
  if (config.param_init_fn) config.param_init_fn(*module);
  if constexpr (std::is_same_v<decltype(module), torch::nn::Sequential>) {
    module = detail::prepare_sequential(module, config);
  } else {
    detail::prepare_module(*module, config);
  }
  const at::ScalarType dtype = apply_bf16_environment(*module);
  broadcast_from_data_parallel_source(*module);
  // A newcomer's model is the members' as broadcast: it reads no checkpoint.
  if (config.lora_config.enable_lora && !joined_running_job()) {
    detail::load_lora_checkpoint(*module, config.lora_config);
  }
  std::shared_ptr<PipelineEngine> pipeline;
  if constexpr (std::is_same_v<decltype(module), torch::nn::Sequential>) {
    if (config.pipeline_config.loss_fn) {
      pipeline = std::make_shared<PipelineEngine>(module, config.pipeline_config, get_pipeline_model_parallel_group());
    }
  }
  return ParallelModel<decltype(module)>(std::move(module), dtype, std::move(pipeline));
}

// Wraps an optimizer: step() averages gradients over data parallelism, clips by the global norm when
// configured, and steps; with ZeRO-1 the wrapped optimizer holds only this rank's shard of every
// parameter (fp32 master copies, padded on dim 0), gradients are reduce-scattered and the updated shards
// all-gathered back into the parameters.
class ParallelOptimizer {
 public:
  // Makes the wrapped optimizer over the given tensors (the parameters, or their ZeRO-1 shards).
  using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

  ParallelOptimizer(const ParallelConfig& config, const Factory& make_optimizer, std::vector<at::Tensor> parameters);

  void step();
  // step() in two halves, for a trainer that decides between them whether the step stands
  // (ElasticTrainer): every collective of the step (gradients averaged over data parallelism and
  // clipped), then the update, which is local. Not with ZeRO-1, whose update ends with a collective.
  void reduce_gradients();
  void apply_gradients();
  void zero_grad();
  // The global gradient norm of the last step: nullopt before the first step or with clipping off.
  std::optional<double> grad_norm() const { return grad_norm_; }
  torch::optim::Optimizer& base() { return *base_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  bool zero_one() const { return !shards_.empty(); }
  const ParallelConfig& config() const { return config_; }
  // Bytes of the wrapped optimizer's state on this rank (its serialised size: moments, step counts), for
  // comparing sharded and unsharded optimizers; and of the fp32 master shards ZeRO-1 keeps besides.
  int64_t state_bytes() const;
  int64_t master_bytes() const;

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  void zero_one_step();

  ParallelConfig config_;
  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> shards_;  // ZeRO-1: this rank's fp32 shard of each parameter
  std::unique_ptr<torch::optim::Optimizer> base_;
  std::optional<double> grad_norm_;
};

// The optimizer of type Optimizer (e.g. torch::optim::AdamW) with `options`, wrapped.
template <typename Optimizer, typename Options>
ParallelOptimizer initialize_parallel_optimizer(const ParallelConfig& config, std::vector<at::Tensor> parameters,
                                                Options options) {
  return ParallelOptimizer(
      config,
      [options](std::vector<at::Tensor> tensors) { return std::make_unique<Optimizer>(std::move(tensors), options); },
      std::move(parameters));
}

}  // namespace backplane::parallel
