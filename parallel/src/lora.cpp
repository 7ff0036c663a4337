// LoRA adapters on plain and tensor-parallel linear layers.
#include "backplane/parallel/lora.h"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <torch/nn/init.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace backplane::parallel {
namespace {

Error invalid(const std::string& message) { return Error(BPL_ERR_INVALID_ARGUMENT, "LoraConfig: " + message); }

bool targets(const LoraConfig& config, const std::string& name) {
  for (const std::string& target : config.target_modules) {
    if (name == target || (name.size() > target.size() && name.compare(name.size() - target.size(), target.size(), target) == 0 &&
                           name[name.size() - target.size() - 1] == '.')) {
      return true;
    }
  }
  return false;
}

// A's initialisation on the whole (rank, in) matrix, as the config says.
InitMethod a_init(const LoraConfig& config) {
  if (config.init_lora_weights == "gaussian") {
    const double std = 1.0 / config.lora_rank;
    return [std](at::Tensor& w) { torch::nn::init::normal_(w, 0.0, std); };
  }
  return [](at::Tensor& w) { torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0)); };
}

void zero_init(at::Tensor& w) { w.zero_(); }

std::string json_string(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace

/* ---- LoraConfig ---- */

double LoraConfig::scaling() const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(lora_rank)) : lora_alpha / lora_rank;
}

void LoraConfig::validate() const {
  if (lora_rank < 1) throw invalid("lora_rank " + std::to_string(lora_rank) + " must be >= 1");
  if (!(lora_alpha > 0)) throw invalid("lora_alpha " + std::to_string(lora_alpha) + " must be > 0");
  if (!(lora_dropout >= 0 && lora_dropout < 1)) {
    throw invalid("lora_dropout " + std::to_string(lora_dropout) + " must be in [0, 1)");
  }
  if (bias != "none" && bias != "all" && bias != "lora_only") {
    throw invalid("bias '" + bias + "' is not one of none, all, lora_only");
  }
  if (init_lora_weights != "default" && init_lora_weights != "gaussian") {
    throw invalid("init_lora_weights '" + init_lora_weights + "' is not one of default, gaussian");
  }
  if (target_modules.empty() && !load_lora_from_ckpt) throw invalid("target_modules is empty: name the layers to adapt");
  if (merge_lora && !save_lora_base) throw invalid("merge_lora needs save_lora_base (the merged base is what is saved)");
  if (load_lora_from_ckpt && lora_save_dir.empty()) throw invalid("load_lora_from_ckpt needs lora_save_dir");
}

std::string LoraConfig::to_json() const {
  std::ostringstream json;
  json << "{\"lora_rank\": " << lora_rank << ", \"lora_alpha\": " << lora_alpha << ", \"lora_dropout\": " << lora_dropout
       << ", \"bias\": " << json_string(bias) << ", \"target_modules\": [";
  for (size_t i = 0; i < target_modules.size(); ++i) json << (i ? ", " : "") << json_string(target_modules[i]);
  json << "], \"use_rslora\": " << (use_rslora ? "true" : "false")
       << ", \"init_lora_weights\": " << json_string(init_lora_weights) << "}\n";
  return json.str();
}

/* ---- LoraAdapter ---- */

void LoraAdapterImpl::init_plain_a(int64_t in, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  at::Tensor master = at::empty({config_.lora_rank, in}, at::kFloat);
  a_init(config_)(master);
  plain_a_ = register_module("A", torch::nn::Linear(torch::nn::LinearOptions(in, config_.lora_rank).bias(false)));
  plain_a_->weight.set_data(master.to(dtype));
}

void LoraAdapterImpl::init_plain_b(int64_t out, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  plain_b_ = register_module("B", torch::nn::Linear(torch::nn::LinearOptions(config_.lora_rank, out).bias(false)));
  plain_b_->weight.set_data(at::zeros({out, config_.lora_rank}, at::TensorOptions().dtype(dtype)));
}

LoraAdapterImpl::LoraAdapterImpl(const torch::nn::LinearImpl& base, const LoraConfig& config) : config_(config) {
  dropout_ = register_module("dropout", torch::nn::Dropout(config_.lora_dropout));
  init_plain_a(base.options.in_features(), base.weight.scalar_type());
  init_plain_b(base.options.out_features(), base.weight.scalar_type());
}

LoraAdapterImpl::LoraAdapterImpl(const ColumnParallelLinearImpl& base, const LoraConfig& config) : config_(config) {
  const ColumnParallelLinearOptions& o = base.options();
  dropout_ = register_module("dropout", torch::nn::Dropout(config_.lora_dropout));
  init_plain_a(o.input_size(), o.dtype());
  column_b_ = register_module(
      "B", ColumnParallelLinear(ColumnParallelLinearOptions(config_.lora_rank, o.output_size())
                                    .bias(false)
                                    .gather_output(o.gather_output())
                                    .dtype(o.dtype())
                                    .stride(o.stride())
                                    .init_method(zero_init)
                                    .pad(o.pad())
                                    .pad_alignment_size_per_rank(o.pad_alignment_size_per_rank())
                                    .keep_padded_output(o.keep_padded_output())
                                    .sequence_parallel_enabled(o.sequence_parallel_enabled())
                                    .sequence_dimension(o.sequence_dimension())
                                    .tensor_model_parallel_group(base.group())));
}

LoraAdapterImpl::LoraAdapterImpl(const RowParallelLinearImpl& base, const LoraConfig& config) : config_(config) {
  const RowParallelLinearOptions& o = base.options();
  dropout_ = register_module("dropout", torch::nn::Dropout(config_.lora_dropout));
  row_a_ = register_module("A", RowParallelLinear(RowParallelLinearOptions(o.input_size(), config_.lora_rank)
                                                      .bias(false)
                                                      .input_is_parallel(o.input_is_parallel())
                                                      .dtype(o.dtype())
                                                      .stride(o.stride())
                                                      .init_method(a_init(config_))
                                                      .pad(o.pad())
                                                      .pad_alignment_size_per_rank(o.pad_alignment_size_per_rank())
                                                      .sequence_parallel_enabled(o.sequence_parallel_enabled())
                                                      .sequence_dimension(o.sequence_dimension())
                                                      .tensor_model_parallel_group(base.group())));
  init_plain_b(o.output_size(), o.dtype());
}

at::Tensor LoraAdapterImpl::delta(const at::Tensor& input) {
  at::Tensor h = config_.lora_dropout > 0 ? dropout_(input) : input;
  h = row_a_ ? row_a_(h) : plain_a_(h);
  h = column_b_ ? column_b_(h) : plain_b_(h);
  return h * config_.scaling();
}

at::Tensor LoraAdapterImpl::a_weight() const { return row_a_ ? row_a_->weight : plain_a_->weight; }
at::Tensor LoraAdapterImpl::b_weight() const { return column_b_ ? column_b_->weight : plain_b_->weight; }

at::Tensor LoraAdapterImpl::weight_delta() const {
  at::NoGradGuard no_grad;
  return at::matmul(b_weight(), a_weight()) * config_.scaling();
}

/* ---- LoraLinear ---- */

LoraLinearImpl::LoraLinearImpl(torch::nn::Linear base_layer, LoraAdapter lora) : base(std::move(base_layer)) {
  register_parameter("weight", base->weight, base->weight.requires_grad());
  if (base->bias.defined()) register_parameter("bias", base->bias, base->bias.requires_grad());
  adapter = register_module("lora", std::move(lora));
}

at::Tensor LoraLinearImpl::forward(const at::Tensor& input) {
  at::Tensor output = base(input);
  return adapter ? output + adapter->delta(input) : output;
}

/* ---- applying, merging ---- */

bool is_lora_name(const std::string& name) {
  std::istringstream parts(name);
  for (std::string part; std::getline(parts, part, '.');) {
    if (part == "lora") return true;
  }
  return false;
}

namespace {

// Whether LoRA trains parameter `name`: an adapter's, or a bias that `bias` ("all", "lora_only") keeps
// trainable, given the names of the adapted layers.
bool trained_with_lora(const std::string& name, const std::string& bias, const std::vector<std::string>& adapted) {
  const size_t dot = name.rfind('.');
  const std::string owner = dot == std::string::npos ? "" : name.substr(0, dot);
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  return is_lora_name(name) ||
         (leaf == "bias" && (bias == "all" || (bias == "lora_only" && std::count(adapted.begin(), adapted.end(), owner) > 0)));
}

// Adapts the tensor-parallel linear layers `config` targets (adding their names to `adapted`) and
// notes the names of every linear layer (for the error when nothing matches).
void adapt_parallel_layers(torch::nn::Module& model, const LoraConfig& config, std::vector<std::string>& adapted,
                           std::vector<std::string>& linear_layers) {
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    const std::shared_ptr<torch::nn::Module>& module = item.value();
    if (is_lora_name(name)) continue;  // an adapter's own layers
    auto column = std::dynamic_pointer_cast<ColumnParallelLinearImpl>(module);
    auto row = std::dynamic_pointer_cast<RowParallelLinearImpl>(module);
    auto plain = std::dynamic_pointer_cast<torch::nn::LinearImpl>(module);
    auto wrapped = std::dynamic_pointer_cast<LoraLinearImpl>(module);
    auto gqa = std::dynamic_pointer_cast<GQAQKVColumnParallelLinearImpl>(module);
    if (!column && !row && !plain && !wrapped && !gqa) continue;
    linear_layers.push_back(name);
    if (!targets(config, name)) continue;
    if ((column && column->adapter) || (row && row->adapter) || (wrapped && !std::count(adapted.begin(), adapted.end(), name))) {
      throw invalid("layer '" + name + "' has a LoRA adapter already");
    }
    if (column) {
      auto adapter = column->register_module("lora", LoraAdapter(*column, config));
      column->adapter = adapter;
    } else if (row) {
      if (!row->options().reduce_output()) {
        throw invalid("layer '" + name + "' is a RowParallelLinear with reduce_output=false: its partial sums and an "
                      "adapter's whole output cannot be added");
      }
      auto adapter = row->register_module("lora", LoraAdapter(*row, config));
      row->adapter = adapter;
    } else if (gqa) {
      throw invalid("layer '" + name + "' is a GQAQKVColumnParallelLinear, which takes no LoRA adapter here; target "
                    "the layers after it, or use separate ColumnParallelLinear projections");
    } else if (plain) {
      throw invalid("layer '" + name + "' is a torch::nn::Linear inside another module: LibTorch modules call their "
                    "submodules' forward directly, so no adapter can be put around it; use ColumnParallelLinear or "
                    "RowParallelLinear (plain linear layers at tensor-parallel size 1), or make it a layer of the "
                    "model's Sequential");
    } else {
      continue;  // wrapped just now by the Sequential form
    }
    adapted.push_back(name);
  }
}

void freeze_all_but_adapters(torch::nn::Module& model, const LoraConfig& config, const std::vector<std::string>& adapted) {
  for (auto& item : model.named_parameters()) item.value().requires_grad_(trained_with_lora(item.key(), config.bias, adapted));
}

void finish(torch::nn::Module& model, const LoraConfig& config, const std::vector<std::string>& adapted,
            const std::vector<std::string>& linear_layers) {
  if (adapted.empty()) {
    throw invalid("target_modules [" + c10::Join(", ", config.target_modules) + "] match none of the model's linear layers (" +
                  (linear_layers.empty() ? std::string("it has none") : c10::Join(", ", linear_layers)) + ")");
  }
  freeze_all_but_adapters(model, config, adapted);
}

}  // namespace

void apply_lora(torch::nn::Module& model, const LoraConfig& config) {
  if (!config.enable_lora) return;
  config.validate();
  std::vector<std::string> adapted, linear_layers;
  adapt_parallel_layers(model, config, adapted, linear_layers);
  finish(model, config, adapted, linear_layers);
}

torch::nn::Sequential apply_lora(const torch::nn::Sequential& model, const LoraConfig& config) {
  if (!config.enable_lora) return model;
  config.validate();
  std::vector<std::string> adapted, linear_layers;
  torch::nn::Sequential result;
  auto layer = model->begin();
  for (const auto& child : model->named_children()) {
    std::string name = child.key();  // an rvalue for push_back: a const one picks its variadic overload
    torch::nn::AnyModule any = *layer++;
    auto plain = std::dynamic_pointer_cast<torch::nn::LinearImpl>(child.value());
    if (plain && targets(config, name)) {
      adapted.push_back(name);
      result->push_back(std::move(name), LoraLinear(torch::nn::Linear(plain), LoraAdapter(*plain, config)));
    } else {
      result->push_back(std::move(name), std::move(any));
    }
  }
  adapt_parallel_layers(*result, config, adapted, linear_layers);
  finish(*result, config, adapted, linear_layers);
  return result;
}

std::vector<std::pair<std::string, std::shared_ptr<LoraAdapterImpl>>> lora_adapters(torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<LoraAdapterImpl>>> adapters;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto adapter = std::dynamic_pointer_cast<LoraAdapterImpl>(item.value())) {
      const std::string& name = item.key();
      adapters.emplace_back(name.size() > 5 ? name.substr(0, name.size() - 5) : "", adapter);  // less ".lora"
    }
  }
  return adapters;
}

std::vector<std::string> lora_adapter_state_names(torch::nn::Module& model) {
  const auto adapters = lora_adapters(model);
  if (adapters.empty()) return {};
  std::vector<std::string> adapted;
  for (const auto& adapter : adapters) adapted.push_back(adapter.first);
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) {
    if (trained_with_lora(item.key(), adapters.front().second->config().bias, adapted)) names.push_back(item.key());
  }
  return names;
}

void merge_lora(torch::nn::Module& model) {
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::shared_ptr<torch::nn::Module>& module = item.value();
    if (auto column = std::dynamic_pointer_cast<ColumnParallelLinearImpl>(module); column && column->adapter) {
      column->weight.add_(std::static_pointer_cast<LoraAdapterImpl>(column->adapter)->weight_delta());
      column->adapter = nullptr;
      column->unregister_module("lora");
    } else if (auto row = std::dynamic_pointer_cast<RowParallelLinearImpl>(module); row && row->adapter) {
      row->weight.add_(std::static_pointer_cast<LoraAdapterImpl>(row->adapter)->weight_delta());
      row->adapter = nullptr;
      row->unregister_module("lora");
    } else if (auto wrapped = std::dynamic_pointer_cast<LoraLinearImpl>(module); wrapped && wrapped->adapter) {
      wrapped->base->weight.add_(wrapped->adapter->weight_delta());
      wrapped->adapter = nullptr;
      wrapped->unregister_module("lora");
    }
  }
}

std::vector<std::pair<std::string, at::Tensor>> merged_lora_state(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> deltas;
  for (const auto& [layer, adapter] : lora_adapters(model)) deltas.emplace_back(layer + ".weight", adapter->weight_delta());
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& item : model.named_parameters()) {
    if (is_lora_name(item.key())) continue;
    at::Tensor value = item.value().detach();
    for (const auto& [name, delta] : deltas) {
      if (name == item.key()) value = value + delta;
    }
    state.emplace_back(item.key(), value);
  }
  return state;
}

}  // namespace backplane::parallel
