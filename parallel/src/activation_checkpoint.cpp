// Activation checkpointing as a LibTorch autograd function.
#include "backplane/parallel/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/autograd.h>
#include <torch/custom_class_detail.h>

#include <mutex>

#include "backplane/parallel/error.h"

namespace backplane::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward needs besides the inputs: the function and the random state it started from.
struct Recompute : torch::CustomClassHolder {
  TensorsFn fn;
  at::Tensor rng_state;
};

at::Tensor cpu_rng_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// Runs with the generator at `state`, then puts back where it was (the training's own sequence of random
// numbers goes on as if the recomputation had not drawn any).
class ReplayedRandomness {
 public:
  explicit ReplayedRandomness(const at::Tensor& state) : resume_(cpu_rng_state()) { set_cpu_rng_state(state); }
  ~ReplayedRandomness() { set_cpu_rng_state(resume_); }
  ReplayedRandomness(const ReplayedRandomness&) = delete;
  ReplayedRandomness& operator=(const ReplayedRandomness&) = delete;

 private:
  at::Tensor resume_;
};

// inputs: the caller's inputs, then one tensor that requires a gradient, so that the outputs do too and
// the backward runs even when no input needs a gradient (the first layer's, say): the parameters inside
// fn get theirs only through it.
class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const TensorsFn& fn, at::TensorList inputs) {
    auto recompute = c10::make_intrusive<Recompute>();
    recompute->fn = fn;
    recompute->rng_state = cpu_rng_state();
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    ctx->save_for_backward(inputs.vec());
    return fn(std::vector<at::Tensor>(inputs.begin(), inputs.end() - 1));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto recompute = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    variable_list saved = ctx->get_saved_variables();
    saved.pop_back();  // the tensor that only made the outputs require a gradient
    std::vector<at::Tensor> inputs;
    for (const at::Tensor& input : saved) {
      inputs.push_back(input.defined() ? input.detach().requires_grad_(input.requires_grad()) : input);
    }
    std::vector<at::Tensor> outputs;
    {
      ReplayedRandomness replay(recompute->rng_state);
      at::AutoGradMode with_gradients(true);
      outputs = recompute->fn(inputs);
    }
    std::vector<at::Tensor> roots, gradients;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        gradients.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, gradients);
    variable_list result{at::Tensor()};  // for fn
    for (const at::Tensor& input : inputs) result.push_back(input.defined() && input.requires_grad() ? input.grad() : at::Tensor());
    result.emplace_back();  // for the tensor appended to the inputs
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(const TensorsFn& fn, const std::vector<at::Tensor>& inputs) {
  if (!at::GradMode::is_enabled()) return fn(inputs);  // nothing to keep: no backward will come
  std::vector<at::Tensor> with_anchor = inputs;
  with_anchor.push_back(at::empty({0}).requires_grad_(true));
  return CheckpointFunction::apply(fn, at::TensorList(with_anchor));
}

at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input) {
  return checkpoint([fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0])}; }, {input})[0];
}

/* ---- CheckpointedLayer ---- */

CheckpointedLayerImpl::CheckpointedLayerImpl(torch::nn::AnyModule layer) : layer_(std::move(layer)) {
  const std::shared_ptr<torch::nn::Module> inner = layer_.ptr();
  for (const auto& parameter : inner->named_parameters(/*recurse=*/false)) {
    register_parameter(parameter.key(), parameter.value(), parameter.value().requires_grad());
  }
  for (const auto& buffer : inner->named_buffers(/*recurse=*/false)) register_buffer(buffer.key(), buffer.value());
  for (const auto& child : inner->named_children()) register_module(child.key(), child.value());
}

at::Tensor CheckpointedLayerImpl::forward(const at::Tensor& input) {
  // The function outlives this call: the backward runs it again.
  torch::nn::AnyModule layer = layer_;
  return checkpoint([layer](const at::Tensor& x) mutable { return layer.forward<at::Tensor>(x); }, input);
}

torch::nn::Sequential apply_activation_checkpointing(const torch::nn::Sequential& model,
                                                     const ActivationCheckpointConfig& config) {
  using Mode = ActivationCheckpointConfig::Mode;
  if (config.mode == Mode::kSelective && !config.selects) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "activation_checkpoint_config: selective, but no module types given");
  }
  torch::nn::Sequential result;
  auto layer = model->begin();
  for (const auto& child : model->named_children()) {
    std::string name = child.key();  // an rvalue for push_back: a const one picks its variadic overload
    torch::nn::AnyModule any = *layer++;
    const bool selected = config.mode == Mode::kFull || (config.mode == Mode::kSelective && config.selects(*child.value()));
    if (selected) {
      result->push_back(std::move(name), CheckpointedLayer(std::move(any)));
    } else {
      result->push_back(std::move(name), std::move(any));
    }
  }
  return result;
}

}  // namespace backplane::parallel
