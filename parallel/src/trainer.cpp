// The training wrappers.
#include "backplane/parallel/trainer.h"

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>

#include "backplane/parallel/checkpoint.h"
#include "backplane/parallel/distributed.h"
#include "backplane/parallel/parameters.h"

namespace backplane::parallel {
namespace {

void require(bool condition, const std::string& message) {
  if (!condition) throw Error(BPL_ERR_INVALID_ARGUMENT, "ParallelConfig: " + message);
}

bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return false;
  const std::string text(value);
  if (text == "0") return false;
  if (text == "1") return true;
  throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(name) + "='" + text + "' is not valid: expected 0 or 1");
}

// `t` with zero rows appended up to `rows` on dim 0 (ZeRO-1 shards every parameter evenly).
at::Tensor pad_rows(const at::Tensor& t, int64_t rows) {
  if (t.size(0) == rows) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[0] = rows - t.size(0);
  return at::cat({t, at::zeros(shape, t.options())});
}

int64_t padded_rows(const at::Tensor& t, int parts) { return (t.size(0) + parts - 1) / parts * parts; }

}  // namespace

ParallelConfig initialize_parallel_config(ParallelConfig config) {
  require(config.tensor_parallel_size >= 1, "tensor_parallel_size " + std::to_string(config.tensor_parallel_size) +
                                                " must be >= 1");
  require(config.pipeline_parallel_size >= 1, "pipeline_parallel_size " + std::to_string(config.pipeline_parallel_size) +
                                                  " must be >= 1");
  require(config.pipeline_parallel_size == 1 || config.pipeline_config.loss_fn,
          "pipeline_parallel_size " + std::to_string(config.pipeline_parallel_size) +
              " needs pipeline_config.loss_fn: run_train runs forward and backward through the stages and needs "
              "the loss to start the backward from");
  require(config.pipeline_config.num_microbatches >= 1,
          "num_microbatches " + std::to_string(config.pipeline_config.num_microbatches) + " must be >= 1");
  require(!config.optimizer_config.grad_clipping || config.optimizer_config.max_grad_norm > 0,
          "max_grad_norm " + std::to_string(config.optimizer_config.max_grad_norm) +
              " must be > 0 when grad_clipping is on");
  require(config.model_init_config.sequential_move_factor >= 1 && config.model_init_config.sequential_move_factor <= 32,
          "sequential_move_factor " + std::to_string(config.model_init_config.sequential_move_factor) +
              " must be in 1..32");
  require(!config.model_init_config.meta_device_init || config.param_init_fn,
          "meta_device_init needs param_init_fn: the parallel layers' shards are left uninitialised");
  if (config.lora_config.enable_lora) config.lora_config.validate();
  require(config.allreduce_bucket_cap_mb > 0,
          "allreduce_bucket_cap_mb " + std::to_string(config.allreduce_bucket_cap_mb) + " must be > 0");
  require(!config.sequence_parallel || config.tensor_parallel_size > 1,
          "sequence_parallel needs tensor_parallel_size > 1");
  if (!is_initialized()) init_process_group();
  require(config.tensor_parallel_size <= get_world_size(),
          "tensor_parallel_size " + std::to_string(config.tensor_parallel_size) + " exceeds the world size " +
              std::to_string(get_world_size()));
  require(config.pipeline_parallel_size <= get_world_size(),
          "pipeline_parallel_size " + std::to_string(config.pipeline_parallel_size) + " exceeds the world size " +
              std::to_string(get_world_size()));
  if (!model_parallel_is_initialized()) {
    initialize_model_parallel(config.tensor_parallel_size, config.pipeline_parallel_size);
  } else {
    require(get_tensor_model_parallel_size() == config.tensor_parallel_size,
            "tensor_parallel_size " + std::to_string(config.tensor_parallel_size) +
                " differs from the initialised model-parallel state (" +
                std::to_string(get_tensor_model_parallel_size()) + ")");
    require(get_pipeline_model_parallel_size() == config.pipeline_parallel_size,
            "pipeline_parallel_size " + std::to_string(config.pipeline_parallel_size) +
                " differs from the initialised model-parallel state (" +
                std::to_string(get_pipeline_model_parallel_size()) + ")");
  }
  return config;
}

namespace detail {

std::pair<int, int> model_build_turns(int sequential_move_factor) {
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_runtime_describe(get_runtime(), &info);
  // A newcomer builds alone while the members it joined wait for it: nothing to take turns with.
  if (joined_running_job()) return {1, 0};
  const int local_rank = std::max(0, info.local_rank);
  at::Tensor most = at::full({1}, std::max(1, info.local_world_size), at::kInt);  // the fullest machine's ranks
  get_world_group()->all_reduce(most, ReduceOp::Max);
  const int turns = (most.item<int>() + sequential_move_factor - 1) / sequential_move_factor;
  return {turns, local_rank / sequential_move_factor};
}

void end_model_build_turn() { get_world_group()->barrier(); }

// With load_lora_from_ckpt, the adapter is built as it was saved and its weights are read back.
LoraConfig lora_config_to_apply(const LoraConfig& config) {
  if (!config.load_lora_from_ckpt) return config;
  config.validate();
  return saved_lora_config(config.lora_save_dir, config.lora_load_tag, config);
}

void load_lora_checkpoint(torch::nn::Module& model, const LoraConfig& config) {
  if (config.load_lora_from_ckpt) load_checkpoint(config.lora_save_dir, config.lora_load_tag, &model, nullptr, nullptr);
}

torch::nn::Sequential prepare_sequential(torch::nn::Sequential model, const ParallelConfig& config) {
  if (config.lora_config.enable_lora) model = apply_lora(model, lora_config_to_apply(config.lora_config));
  if (config.pipeline_config.loss_fn) {
    model = select_pipeline_stage(model, config.pipeline_config.pipeline_cuts, get_pipeline_model_parallel_rank(),
                                  get_pipeline_model_parallel_size());
  }
  if (config.activation_checkpoint_config.mode != ActivationCheckpointConfig::Mode::kNone) {
    model = apply_activation_checkpointing(model, config.activation_checkpoint_config);
  }
  return model;
}

void prepare_module(torch::nn::Module& model, const ParallelConfig& config) {
  require(config.pipeline_parallel_size == 1 && !config.pipeline_config.loss_fn,
          "pipeline parallelism needs model_fn to return a torch::nn::Sequential (the stages are cut between its "
          "layers)");
  require(config.activation_checkpoint_config.mode == ActivationCheckpointConfig::Mode::kNone,
          "activation_checkpoint_config needs model_fn to return a torch::nn::Sequential (its layers are what is "
          "recomputed); other modules can call checkpoint()");
  if (config.lora_config.enable_lora) apply_lora(model, lora_config_to_apply(config.lora_config));
}

}  // namespace detail

at::ScalarType apply_bf16_environment(torch::nn::Module& module) {
  const bool use_bf16 = env_flag("XLA_USE_BF16");
  const bool downcast = env_flag("XLA_DOWNCAST_BF16");
  if (use_bf16 || downcast) {
    at::NoGradGuard no_grad;
    auto convert = [&](at::Tensor& t) {
      if (t.scalar_type() == at::kFloat) t.set_data(t.to(at::kBFloat16));
      else if (t.scalar_type() == at::kDouble) t.set_data(t.to(use_bf16 ? at::kBFloat16 : at::kFloat));
    };
    for (at::Tensor& p : module.parameters()) convert(p);
    for (at::Tensor& b : module.buffers()) convert(b);
  }
  for (const at::Tensor& p : module.parameters()) {
    if (at::isFloatingType(p.scalar_type())) return p.scalar_type();
  }
  return at::kFloat;
}

void broadcast_from_data_parallel_source(torch::nn::Module& module) {
  GroupPtr dp = get_data_parallel_group();
  if (dp->size() == 1) return;
  at::NoGradGuard no_grad;
  for (at::Tensor& p : module.parameters()) dp->broadcast(p, 0);
  for (at::Tensor& b : module.buffers()) dp->broadcast(b, 0);
}

/* ---- ParallelOptimizer ---- */

ParallelOptimizer::ParallelOptimizer(const ParallelConfig& config, const Factory& make_optimizer,
                                     std::vector<at::Tensor> parameters)
    : config_(initialize_parallel_config(config)), parameters_(std::move(parameters)) {
  if (!config_.optimizer_config.zero_one_enabled) {
    base_ = make_optimizer(parameters_);
    return;
  }
  // ZeRO-1: pad dim 0 to a multiple of the DP size, keep chunk dp_rank as an fp32 leaf.
  GroupPtr dp = get_data_parallel_group();
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : parameters_) {
    if (p.dim() == 0) throw Error(BPL_ERR_INVALID_ARGUMENT, "ZeRO-1 shards parameters on dim 0: a 0-dim parameter cannot be sharded");
    at::Tensor padded = pad_rows(p.detach().to(at::kFloat), padded_rows(p, dp->size()));
    shards_.push_back(padded.chunk(dp->size(), 0)[static_cast<size_t>(dp->rank())].clone().requires_grad_(true));
  }
  base_ = make_optimizer(shards_);
}

void ParallelOptimizer::zero_grad() {
  for (at::Tensor& p : parameters_) {
    if (p.grad().defined()) p.mutable_grad().reset();
  }
  base_->zero_grad();
}

void ParallelOptimizer::step() {
  if (zero_one()) {
    if (config_.sequence_parallel) allreduce_sequence_parallel_gradients(parameters_);
    zero_one_step();
    return;
  }
  reduce_gradients();
  apply_gradients();
}

void ParallelOptimizer::reduce_gradients() {
  if (zero_one()) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "reduce_gradients: with ZeRO-1 the step is one piece: call step()");
  }
  if (config_.sequence_parallel) allreduce_sequence_parallel_gradients(parameters_);
  bucket_allreduce_gradients(parameters_, get_data_parallel_group(), config_.allreduce_bucket_cap_mb);
  if (config_.optimizer_config.grad_clipping) {
    grad_norm_ = clip_grad_norm(parameters_, config_.optimizer_config.max_grad_norm);
  }
}

void ParallelOptimizer::apply_gradients() {
  if (zero_one()) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "apply_gradients: with ZeRO-1 the step is one piece: call step()");
  }
  base_->step();
}

void ParallelOptimizer::zero_one_step() {
  GroupPtr dp = get_data_parallel_group();
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> partitioned, duplicated, shard_grads;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const at::Tensor& p = parameters_[i];
    at::Tensor& shard = shards_[i];
    if (!p.grad().defined()) {
      shard.mutable_grad().reset();
      continue;
    }
    // Average over DP, each rank receiving its own rows: pad like the shard, then reduce-scatter.
    at::Tensor g = pad_rows(p.grad().to(at::kFloat), padded_rows(p, dp->size()));
    at::Tensor reduced = dp->size() > 1 ? dp->reduce_scatter(g, 0) : g.clone();
    reduced.div_(dp->size());
    shard.mutable_grad() = reduced;
    (tensor_model_parallel_attributes(p) ? partitioned : duplicated).push_back(reduced);
    shard_grads.push_back(reduced);
  }
  if (config_.optimizer_config.grad_clipping) {
    // The shards are disjoint over DP: their norms add up there too.
    grad_norm_ = detail::grad_norm(partitioned, duplicated, 2.0,
                                   {dp, get_tensor_model_parallel_group(), get_pipeline_model_parallel_group()});
    detail::scale_gradients(shard_grads, config_.optimizer_config.max_grad_norm, *grad_norm_);
  }
  base_->step();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor full = dp->size() > 1 ? dp->all_gather(shards_[i].detach(), 0) : shards_[i].detach();
    parameters_[i].detach().copy_(full.narrow(0, 0, parameters_[i].size(0)));
  }
}

int64_t ParallelOptimizer::state_bytes() const {
  torch::serialize::OutputArchive archive;
  base_->save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  return static_cast<int64_t>(bytes.str().size());
}

int64_t ParallelOptimizer::master_bytes() const {
  int64_t total = 0;
  for (const at::Tensor& shard : shards_) total += shard.numel() * static_cast<int64_t>(shard.element_size());
  return total;
}

void ParallelOptimizer::save(torch::serialize::OutputArchive& archive) const {
  torch::serialize::OutputArchive base;
  base_->save(base);
  archive.write("base", base);
  for (size_t i = 0; i < shards_.size(); ++i) archive.write("shard_" + std::to_string(i), shards_[i].detach());
}

void ParallelOptimizer::load(torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive base;
  archive.read("base", base);
  base_->load(base);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < shards_.size(); ++i) {
    at::Tensor saved;
    archive.read("shard_" + std::to_string(i), saved);
    if (!saved.sizes().equals(shards_[i].sizes())) {
      throw Error(BPL_ERR_MISMATCH, "optimizer shard " + std::to_string(i) + " has shape " + c10::str(saved.sizes()) +
                                        " in the checkpoint, " + c10::str(shards_[i].sizes()) + " here");
    }
    shards_[i].copy_(saved);
  }
}

}  // namespace backplane::parallel
