// LoRA fine-tuning (neuronx-distributed's LoraConfig and LoRAModel): a trainable low-rank addition
// scaling * B A to the weight of chosen linear layers, the rest of the model frozen.
//
// An adapted layer computes base(x) + scaling * B(A(dropout(x))), A of (rank, in) and B of (out, rank), B
// starting at zero so that the adapted model starts equal to the base model. On tensor-parallel layers
// the adapter is split to match, so that it needs no collective the layer does not already make:
//   ColumnParallelLinear (weight split by output rows): A whole on every rank, B split by rows like the
//     weight (a ColumnParallelLinear of its own: its input's gradient is summed over the group);
//   RowParallelLinear (weight split by input columns): A split by columns like the weight (a
//     RowParallelLinear: its output is summed over the group), B whole on every rank.
// A and B are drawn whole from the generator and then split, like the layers' weights, so an adapter
// computes the same function at every tensor-parallel degree.
//
// Names: an adapter lives under its layer as "lora" ("3.lora.A.weight", "mlp.up.lora.B.weight"); the
// base parameters keep their names.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backplane/parallel/layers.h"

namespace backplane::parallel {

struct LoraConfig {
  bool enable_lora = false;
  int lora_rank = 16;
  double lora_alpha = 32;
  double lora_dropout = 0.05;
  // Which biases train: "none", "all" (every bias of the model), "lora_only" (the adapted layers').
  std::string bias = "none";
  // A layer is adapted when its qualified name is one of these or ends with "." and one of them
  // ("q_proj" adapts "layers.0.attn.q_proj").
  std::vector<std::string> target_modules;
  // The scaling: lora_alpha / sqrt(lora_rank) (rank-stabilised), else lora_alpha / lora_rank.
  bool use_rslora = false;
  // A's initialisation: "default" (kaiming_uniform_, a = sqrt(5), as torch::nn::Linear) or "gaussian"
  // (normal_, std 1 / lora_rank). B starts at zero either way.
  std::string init_lora_weights = "default";

  // save_checkpoint of an adapted model writes: the adapter alone (neither flag), the base model and the
  // adapter separately (save_lora_base), or the base model with the adapter merged in (both).
  bool save_lora_base = false;
  bool merge_lora = false;
  // The configuration goes in the adapter's files; false: also as <tag>/lora_adapter/adapter_config.json.
  bool save_lora_config_adapter = true;
  // initialize_parallel_model loads the adapter (and its configuration) from lora_save_dir, tag
  // lora_load_tag (empty: the newest complete one).
  bool load_lora_from_ckpt = false;
  std::string lora_save_dir;
  std::string lora_load_tag;

  double scaling() const;
  // Error naming the first bad value.
  void validate() const;
  // The fields that shape an adapter, as JSON (what adapter_config.json holds).
  std::string to_json() const;
};

// The adapter of one linear layer.
class LoraAdapterImpl : public LinearAdapter {
 public:
  LoraAdapterImpl(const torch::nn::LinearImpl& base, const LoraConfig& config);
  LoraAdapterImpl(const ColumnParallelLinearImpl& base, const LoraConfig& config);
  LoraAdapterImpl(const RowParallelLinearImpl& base, const LoraConfig& config);

  at::Tensor delta(const at::Tensor& input) override;
  // scaling * B A, shaped like the base layer's weight on this rank.
  at::Tensor weight_delta() const;
  const LoraConfig& config() const { return config_; }
  at::Tensor a_weight() const;
  at::Tensor b_weight() const;

 private:
  void init_plain_a(int64_t in, at::ScalarType dtype);
  void init_plain_b(int64_t out, at::ScalarType dtype);

  LoraConfig config_;
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear plain_a_{nullptr}, plain_b_{nullptr};
  RowParallelLinear row_a_{nullptr};
  ColumnParallelLinear column_b_{nullptr};
};
TORCH_MODULE(LoraAdapter);

// A torch::nn::Linear of a Sequential with an adapter: LibTorch modules call their submodules' forward
// directly, so a plain linear layer can take an adapter only where a Sequential runs it. Holds the
// layer's weight and bias under their own names.
class LoraLinearImpl : public torch::nn::Module {
 public:
  LoraLinearImpl(torch::nn::Linear base, LoraAdapter adapter);
  at::Tensor forward(const at::Tensor& input);
  torch::nn::Linear base;
  LoraAdapter adapter{nullptr};  // null once merged
};
TORCH_MODULE(LoraLinear);

// Adds adapters to the layers config.target_modules names and freezes every other parameter (but the
// biases config.bias keeps trainable). Tensor-parallel linear layers anywhere in `model`; the Sequential
// form also adapts torch::nn::Linear layers of the Sequential itself (it returns the model with those
// wrapped in LoraLinear; the same layers, not copies). Error naming the value for a bad config, a target
// that matches no linear layer, a layer that cannot take an adapter, or one that has one already.
void apply_lora(torch::nn::Module& model, const LoraConfig& config);
torch::nn::Sequential apply_lora(const torch::nn::Sequential& model, const LoraConfig& config);

// The adapters of `model`, by the qualified name of the layer each adapts (in the model's order).
std::vector<std::pair<std::string, std::shared_ptr<LoraAdapterImpl>>> lora_adapters(torch::nn::Module& model);
// True for a parameter or buffer name inside an adapter.
bool is_lora_name(const std::string& name);

// The names of what an adapter's checkpoint holds besides its configuration: the adapters' parameters
// and the biases their LoraConfig trains (bias "all" or "lora_only"). Empty without adapters.
std::vector<std::string> lora_adapter_state_names(torch::nn::Module& model);

// Adds each adapter's weight_delta() into its layer's weight and removes the adapter: the model then
// computes what it computed with the adapter, as a plain (tensor-parallel) model.
void merge_lora(torch::nn::Module& model);

// The base model's parameters and buffers with the adapters merged in, by name, without changing
// `model` (what save_checkpoint writes with merge_lora).
std::vector<std::pair<std::string, at::Tensor>> merged_lora_state(torch::nn::Module& model);

}  // namespace backplane::parallel
