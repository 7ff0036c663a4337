// Activation checkpointing: a part of the model keeps only its inputs during the forward and is run
// again during the backward to rebuild what the gradients need (neuronx_distributed_config's
// activation_checkpoint_config). Less memory held between forward and backward, for one more forward.
//
// The recomputation replays the forward's random numbers (the CPU generator's state is saved and
// restored), so dropout draws the same masks, and its collectives (a tensor-parallel layer's all-reduce)
// run again on every rank in the same order: gradients are the same as without checkpointing.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <memory>
#include <vector>

namespace backplane::parallel {

using TensorsFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// fn(inputs), keeping only `inputs` for the backward, which runs fn again (with gradients) and
// back-propagates through it. The parameters fn uses get their gradients then. fn must compute the same
// function when run again (its random numbers are replayed; other state it reads must not change).
std::vector<at::Tensor> checkpoint(const TensorsFn& fn, const std::vector<at::Tensor>& inputs);
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input);

// Which layers are recomputed.
struct ActivationCheckpointConfig {
  enum class Mode {
    kNone,       // nothing: every activation is kept
    kFull,       // every layer of the model's Sequential
    kSelective,  // the layers of the model's Sequential that `selects` accepts
  };
  Mode mode = Mode::kNone;
  std::function<bool(const torch::nn::Module&)> selects;

  static ActivationCheckpointConfig full() { return {Mode::kFull, nullptr}; }
  // The layers of the given module types (their Impl classes, e.g. DecoderLayerImpl).
  template <typename... ModuleImpls>
  static ActivationCheckpointConfig selective() {
    return {Mode::kSelective,
            [](const torch::nn::Module& m) { return ((dynamic_cast<const ModuleImpls*>(&m) != nullptr) || ...); }};
  }
};

// A layer whose forward runs under checkpoint(). It holds the wrapped layer's parameters, buffers and
// submodules under their own names (so "3.weight" stays "3.weight" for optimizers and checkpoints).
class CheckpointedLayerImpl : public torch::nn::Module {
 public:
  explicit CheckpointedLayerImpl(torch::nn::AnyModule layer);
  at::Tensor forward(const at::Tensor& input);
  const torch::nn::AnyModule& layer() const { return layer_; }

 private:
  torch::nn::AnyModule layer_;
};
TORCH_MODULE(CheckpointedLayer);

// `model` with the layers `config` selects wrapped in CheckpointedLayer (the same layers, not copies,
// under the same names). A LibTorch module calls its submodules' forward directly, so only layers that a
// Sequential runs can be selected; a module can call checkpoint() itself around any part of its forward.
torch::nn::Sequential apply_activation_checkpointing(const torch::nn::Sequential& model,
                                                     const ActivationCheckpointConfig& config);

}  // namespace backplane::parallel
