// The tensor-parallel layers.
#include "backplane/parallel/layers.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <cmath>

#include "backplane/parallel/parallel_state.h"
#include "backplane/parallel/parameters.h"

namespace backplane::parallel {

at::Tensor create_local_weight(const at::Tensor& full, int64_t partition_dim, int64_t per_partition_size,
                               int64_t stride, int rank, int world) {
  if (stride < 1 || per_partition_size % stride != 0) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "stride " + std::to_string(stride) +
                                              " must be >= 1 and divide the per-partition size " +
                                              std::to_string(per_partition_size));
  }
  std::vector<at::Tensor> blocks = full.split(per_partition_size / stride, partition_dim);
  std::vector<at::Tensor> mine;
  for (size_t i = static_cast<size_t>(rank); i < blocks.size(); i += static_cast<size_t>(world)) mine.push_back(blocks[i]);
  return at::cat(mine, partition_dim).contiguous();
}

namespace {

thread_local int deferred_init_scopes = 0;
thread_local int pad_model_scopes = 0;

}  // namespace

DeferredInitScope::DeferredInitScope() { ++deferred_init_scopes; }
DeferredInitScope::~DeferredInitScope() { --deferred_init_scopes; }
PadModelScope::PadModelScope() { ++pad_model_scopes; }
PadModelScope::~PadModelScope() { --pad_model_scopes; }

namespace {

// `size` rounded up to a multiple of tp * alignment with pad (or pad_model); without, Error unless it is
// one already.
int64_t padded_size(int64_t size, int tp, int64_t alignment, bool pad, const char* layer, const char* what) {
  if (alignment < 1) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(layer) + ": pad_alignment_size_per_rank " +
                                              std::to_string(alignment) + " must be >= 1");
  }
  if (size < 1) throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(layer) + ": " + what + " must be positive");
  const int64_t multiple = tp * alignment;
  if (size % multiple == 0) return size;
  if (pad || pad_model_scopes > 0) return (size + multiple - 1) / multiple * multiple;
  throw Error(BPL_ERR_INVALID_ARGUMENT,
              std::string(layer) + ": " + what + " " + std::to_string(size) + " must be divisible by the tensor-parallel size " +
                  std::to_string(tp) + (alignment > 1 ? " times pad_alignment_size_per_rank " + std::to_string(alignment) : "") +
                  " (or set pad, or pad_model in the config)");
}

// `t` with zeros appended along `dim` up to `size`.
at::Tensor zero_padded(const at::Tensor& t, int64_t dim, int64_t size) {
  if (t.size(dim) == size) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[static_cast<size_t>(dim)] = size - t.size(dim);
  return at::cat({t, at::zeros(shape, t.options())}, dim);
}

// The group a layer runs over: the one given, else the tensor-parallel group (initialising a one-rank
// state, with a warning, if the program did not).
GroupPtr layer_group(const char* layer, const GroupPtr& given) {
  if (given) return given;
  ensure_model_parallel_initialized(layer);
  return get_tensor_model_parallel_group();
}

int64_t divide(int64_t size, int64_t parts, const char* layer, const char* what) {
  if (size < 1 || size % parts != 0) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(layer) + ": " + what + " " + std::to_string(size) +
                                              " must be positive and divisible by the tensor-parallel size " +
                                              std::to_string(parts));
  }
  return size / parts;
}

void require(bool condition, const char* layer, const char* message) {
  if (!condition) throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(layer) + ": " + message);
}

void kaiming_uniform_default(at::Tensor& weight) { torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0)); }
void normal_default(at::Tensor& weight) { torch::nn::init::normal_(weight, 0.0, 1.0); }

// The full fp32 master weight, initialised on every rank from the same generator, so that the partition
// a rank keeps does not depend on how many ranks there are.
at::Tensor make_master_weight(at::IntArrayRef shape, const InitMethod& init, void (*default_init)(at::Tensor&)) {
  at::NoGradGuard no_grad;
  if (deferred_init_scopes > 0) return at::empty(shape, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  at::Tensor master = at::empty(shape, at::kFloat);
  if (init) init(master); else default_init(master);
  return master;
}

// A full bias drawn uniformly in ±1/sqrt(fan_in), as torch::nn::Linear does with the full input size.
// Drawn whole on every rank and then partitioned, like the weights, so it is also independent of the TP
// degree.
at::Tensor master_bias(int64_t size, int64_t fan_in) {
  at::NoGradGuard no_grad;
  if (deferred_init_scopes > 0) return at::empty({size}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return at::empty({size}, at::kFloat).uniform_(-bound, bound);
}

// A parameter of `value` in `dtype`; of a meta value (deferred initialisation), uninitialised memory of
// its shape.
at::Tensor as_parameter(const at::Tensor& value, at::ScalarType dtype) {
  if (value.is_meta()) return at::empty(value.sizes(), at::TensorOptions().dtype(dtype)).requires_grad_(true);
  return value.to(dtype).contiguous().detach().requires_grad_(true);
}

// Records that `parameter` is this rank's partition along `dim` (for clipping, checkpoints, ZeRO-1).
void mark_partitioned(const at::Tensor& parameter, int64_t dim, int64_t stride, int tp, int64_t unpadded_size = -1,
                      bool reshardable = true) {
  set_tensor_model_parallel_attributes(parameter, {dim, stride, tp, unpadded_size, reshardable});
}

// The unpadded size to record for a padded layer's partitions (-1 when it is not padded).
int64_t unpadded(int64_t real, int64_t padded) { return real == padded ? -1 : real; }

// (output + bias, undefined), or with skip_bias_add (output, bias) for the caller to fuse.
std::tuple<at::Tensor, at::Tensor> with_bias(const at::Tensor& output, const at::Tensor& bias, bool skip_bias_add) {
  if (skip_bias_add) return {output, bias};
  return {bias.defined() ? output + bias : output, at::Tensor()};
}

}  // namespace

/* ---- ColumnParallelLinear ---- */

ColumnParallelLinearImpl::ColumnParallelLinearImpl(ColumnParallelLinearOptions options)
    : options_(std::move(options)), group_(layer_group("ColumnParallelLinear", options_.tensor_model_parallel_group())) {
  const char* name = "ColumnParallelLinear";
  const int tp = group_->size();
  require(options_.input_size() > 0, name, "input_size must be positive");
  padded_size_ = padded_size(options_.output_size(), tp, options_.pad_alignment_size_per_rank(), options_.pad(), name,
                             "output_size");
  if (padded_size_ != options_.output_size()) options_.pad(true);
  const int64_t out_local = padded_size_ / tp;
  require(!(options_.sequence_parallel_enabled() && options_.gather_output()), name,
          "sequence_parallel_enabled needs gather_output=false");
  // Drawn at the real size, then padded: the real rows are those of the unpadded layer.
  at::Tensor master = make_master_weight({options_.output_size(), options_.input_size()}, options_.init_method(),
                                    kaiming_uniform_default);
  weight = register_parameter(
      "weight", as_parameter(create_local_weight(zero_padded(master, 0, padded_size_).to(options_.dtype()), 0,
                                                 out_local, options_.stride(), group_->rank(), tp),
                             options_.dtype()));
  mark_partitioned(weight, 0, options_.stride(), tp, unpadded(options_.output_size(), padded_size_));
  if (options_.keep_master_weight()) master_weight = master;
  if (options_.bias()) {
    at::Tensor full = zero_padded(master_bias(options_.output_size(), options_.input_size()), 0, padded_size_);
    // Added after the gather, to the output as returned: narrowed back unless keep_padded_output.
    if (options_.gather_output() && !options_.keep_padded_output()) full = full.narrow(0, 0, options_.output_size());
    // Gathered outputs get the whole bias after the gather; split outputs get this rank's part.
    at::Tensor local = options_.gather_output()
                           ? full
                           : create_local_weight(full, 0, out_local, options_.stride(), group_->rank(), tp);
    bias = register_parameter("bias", as_parameter(local, options_.dtype()));
    if (!options_.gather_output()) {
      mark_partitioned(bias, 0, options_.stride(), tp, unpadded(options_.output_size(), padded_size_));
    }
  }
}

std::tuple<at::Tensor, at::Tensor> ColumnParallelLinearImpl::forward_with_bias(const at::Tensor& input) {
  at::Tensor x = options_.sequence_parallel_enabled()
                     ? gather_from_sequence_parallel_region(input, options_.sequence_dimension(), true, group_)
                     : copy_to_tensor_model_parallel_region(input, group_);
  at::Tensor y = at::linear(x, weight);
  if (options_.gather_output()) {
    y = gather_from_tensor_model_parallel_region(y, group_);
    if (padded_size_ != options_.output_size() && !options_.keep_padded_output()) {
      y = y.narrow(-1, 0, options_.output_size());
    }
  }
  if (adapter) y = y + adapter->delta(input);
  return with_bias(y, bias, options_.skip_bias_add());
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& input) {
  require(!options_.skip_bias_add(), "ColumnParallelLinear", "skip_bias_add is set: call forward_with_bias");
  return std::get<0>(forward_with_bias(input));
}

/* ---- RowParallelLinear ---- */

RowParallelLinearImpl::RowParallelLinearImpl(RowParallelLinearOptions options)
    : options_(std::move(options)), group_(layer_group("RowParallelLinear", options_.tensor_model_parallel_group())) {
  const char* name = "RowParallelLinear";
  const int tp = group_->size();
  require(options_.output_size() > 0, name, "output_size must be positive");
  padded_size_ = padded_size(options_.input_size(), tp, options_.pad_alignment_size_per_rank(), options_.pad(), name,
                             "input_size");
  if (padded_size_ != options_.input_size()) options_.pad(true);
  const int64_t in_local = padded_size_ / tp;
  require(!options_.sequence_parallel_enabled() || options_.input_is_parallel(), name,
          "sequence_parallel_enabled needs input_is_parallel=true");
  at::Tensor master = make_master_weight({options_.output_size(), options_.input_size()}, options_.init_method(),
                                    kaiming_uniform_default);
  weight = register_parameter(
      "weight", as_parameter(create_local_weight(zero_padded(master, 1, padded_size_).to(options_.dtype()), 1,
                                                 in_local, options_.stride(), group_->rank(), tp),
                             options_.dtype()));
  mark_partitioned(weight, 1, options_.stride(), tp, unpadded(options_.input_size(), padded_size_));
  if (options_.keep_master_weight()) master_weight = master;
  if (options_.bias()) {
    bias = register_parameter("bias", as_parameter(master_bias(options_.output_size(), options_.input_size()),
                                                   options_.dtype()));
    // Added after the reduce-scatter, so each rank's gradient covers its part of the sequence only.
    if (options_.sequence_parallel_enabled()) set_sequence_parallel_enabled(bias);
  }
}

std::tuple<at::Tensor, at::Tensor> RowParallelLinearImpl::forward_with_bias(const at::Tensor& input) {
  at::Tensor x = options_.input_is_parallel()
                     ? input
                     : scatter_to_tensor_model_parallel_region(
                           padded_size_ != options_.input_size() ? zero_padded(input, input.dim() - 1, padded_size_) : input,
                           group_);
  at::Tensor y = at::linear(x, weight);
  if (options_.reduce_output()) {
    const at::ScalarType dtype = y.scalar_type();
    y = y.to(options_.reduce_dtype());
    y = options_.sequence_parallel_enabled()
            ? reduce_scatter_to_sequence_parallel_region(y, options_.sequence_dimension(), std::nullopt, group_)
            : reduce_from_tensor_model_parallel_region(y, group_);
    y = y.to(dtype);
  }
  if (adapter) y = y + adapter->delta(input);
  return with_bias(y, bias, options_.skip_bias_add());  // once, after the reduction
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& input) {
  require(!options_.skip_bias_add(), "RowParallelLinear", "skip_bias_add is set: call forward_with_bias");
  return std::get<0>(forward_with_bias(input));
}

/* ---- ParallelEmbedding ---- */

ParallelEmbeddingImpl::ParallelEmbeddingImpl(ParallelEmbeddingOptions options)
    : options_(std::move(options)), group_(layer_group("ParallelEmbedding", options_.tensor_model_parallel_group())) {
  const char* name = "ParallelEmbedding";
  const int tp = group_->size();
  const int64_t vocab = options_.num_embeddings();
  const int64_t dim = options_.embedding_dim();
  require(vocab > 0 && dim > 0, name, "num_embeddings and embedding_dim must be positive");
  require(!(options_.sequence_parallel_enabled() && options_.shard_across_embedding()), name,
          "sequence_parallel_enabled applies to the vocabulary split, not shard_across_embedding");
  int64_t padding_row = -1;  // none
  if (const std::optional<int64_t> padding = options_.padding_idx()) {
    require(*padding >= -vocab && *padding < vocab, name, "padding_idx is outside the vocabulary");
    padding_row = *padding < 0 ? *padding + vocab : *padding;
  }
  at::Tensor master = make_master_weight({vocab, dim}, options_.init_method(), normal_default);
  if (padding_row >= 0) {
    at::NoGradGuard no_grad;
    master[padding_row].zero_();
  }
  at::Tensor local;
  if (options_.shard_across_embedding()) {
    local = create_local_weight(master.to(options_.dtype()), 1, divide(dim, tp, name, "embedding_dim"), 1,
                                group_->rank(), tp);
    vocab_start_ = 0;
    vocab_end_ = vocab;
  } else {
    const int64_t rows = divide(vocab, tp, name, "num_embeddings");
    local = create_local_weight(master.to(options_.dtype()), 0, rows, 1, group_->rank(), tp);
    vocab_start_ = rows * group_->rank();
    vocab_end_ = vocab_start_ + rows;
  }
  if (padding_row >= vocab_start_ && padding_row < vocab_end_) local_padding_idx_ = padding_row - vocab_start_;
  weight = register_parameter("weight", as_parameter(local, options_.dtype()));
  mark_partitioned(weight, options_.shard_across_embedding() ? 1 : 0, 1, tp);
  if (options_.keep_master_weight()) master_weight = master;
}

at::Tensor ParallelEmbeddingImpl::forward(const at::Tensor& input) {
  const int64_t padding = local_padding_idx_.value_or(-1);
  if (options_.shard_across_embedding()) {
    return gather_from_tensor_model_parallel_region(at::embedding(weight, input, padding), group_);
  }
  at::Tensor output;
  if (group_->size() == 1) {
    output = at::embedding(weight, input, padding);
  } else {
    // Ids outside this rank's range look up row 0 and are zeroed; the reduction adds the owners' rows.
    at::Tensor in_range = (input >= vocab_start_).logical_and(input < vocab_end_);
    at::Tensor local_ids = (input - vocab_start_) * in_range;
    output = at::embedding(weight, local_ids, padding) * in_range.unsqueeze(-1).to(weight.scalar_type());
  }
  // (batch, sequence, dim) -> (sequence / tp, batch, dim), whatever the TP degree.
  if (options_.sequence_parallel_enabled()) {
    return reduce_scatter_to_sequence_parallel_region(output.transpose(0, 1), 0, std::nullopt, group_);
  }
  return reduce_from_tensor_model_parallel_region(output, group_);
}

/* ---- GQAQKVColumnParallelLinear ---- */

GQAQKVColumnParallelLinearImpl::GQAQKVColumnParallelLinearImpl(GQAQKVColumnParallelLinearOptions options)
    : options_(std::move(options)),
      group_(layer_group("GQAQKVColumnParallelLinear", options_.tensor_model_parallel_group())) {
  const char* name = "GQAQKVColumnParallelLinear";
  const int tp = group_->size();
  const int rank = group_->rank();
  const int64_t multiplier = options_.kv_size_multiplier();
  require(options_.input_size() > 0, name, "input_size must be positive");
  if (multiplier < 1 || tp % multiplier != 0) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(name) + ": kv_size_multiplier " + std::to_string(multiplier) +
                                              " must be >= 1 and divide the tensor-parallel size " + std::to_string(tp));
  }
  require(!(options_.sequence_parallel_enabled() && options_.gather_output()), name,
          "sequence_parallel_enabled needs gather_output=false");
  q_local_ = divide(options_.q_output_size(), tp, name, "q_output_size");
  kv_local_ = divide(options_.kv_output_size() * multiplier, tp, name, "kv_output_size * kv_size_multiplier");

  // Replicate the K/V rows before splitting them, so that each KV head is held by `multiplier` ranks.
  auto replicate = [&](const at::Tensor& master) {
    if (multiplier == 1) return master;
    if (options_.kv_replication() == KvReplication::Repeat) {
      std::vector<int64_t> repeats(static_cast<size_t>(master.dim()), 1);
      repeats[0] = multiplier;
      return master.repeat(repeats);
    }
    return master.repeat_interleave(multiplier, 0);
  };
  const at::ScalarType dtype = options_.dtype();
  auto local = [&](const at::Tensor& full, int64_t rows) { return create_local_weight(full.to(dtype), 0, rows, 1, rank, tp); };
  const int64_t in = options_.input_size();
  at::Tensor master_q = make_master_weight({options_.q_output_size(), in}, options_.init_method(), kaiming_uniform_default);
  at::Tensor master_k = make_master_weight({options_.kv_output_size(), in}, options_.init_method(), kaiming_uniform_default);
  at::Tensor master_v = make_master_weight({options_.kv_output_size(), in}, options_.init_method(), kaiming_uniform_default);
  at::Tensor wq = local(master_q, q_local_);
  at::Tensor wk = local(replicate(master_k), kv_local_);
  at::Tensor wv = local(replicate(master_v), kv_local_);
  if (options_.keep_master_weight()) {
    master_weight_q = master_q;
    master_weight_k = master_k;
    master_weight_v = master_v;
  }
  at::Tensor bq, bk, bv;
  if (options_.bias()) {
    bq = local(master_bias(options_.q_output_size(), in), q_local_);
    bk = local(replicate(master_bias(options_.kv_output_size(), in)), kv_local_);
    bv = local(replicate(master_bias(options_.kv_output_size(), in)), kv_local_);
  }
  if (options_.fuse_qkv()) {
    weight_qkv_ = register_parameter("weight_qkv", as_parameter(at::cat({wq, wk, wv}, 0), dtype));
    if (options_.bias()) bias_qkv_ = register_parameter("bias_qkv", as_parameter(at::cat({bq, bk, bv}, 0), dtype));
  } else {
    weight_q_ = register_parameter("weight_q", as_parameter(wq, dtype));
    weight_k_ = register_parameter("weight_k", as_parameter(wk, dtype));
    weight_v_ = register_parameter("weight_v", as_parameter(wv, dtype));
    if (options_.bias()) {
      bias_q_ = register_parameter("bias_q", as_parameter(bq, dtype));
      bias_k_ = register_parameter("bias_k", as_parameter(bk, dtype));
      bias_v_ = register_parameter("bias_v", as_parameter(bv, dtype));
    }
  }
  for (const at::Tensor& parameter : parameters()) mark_partitioned(parameter, 0, 1, tp, -1, /*reshardable=*/false);
}

// Part `which` (0 = Q, 1 = K, 2 = V) of the fused tensor, or the separate one.
at::Tensor GQAQKVColumnParallelLinearImpl::part(const at::Tensor& fused, const at::Tensor& separate, int which) const {
  if (!options_.fuse_qkv() || !fused.defined()) return separate;
  if (which == 0) return fused.narrow(0, 0, q_local_);
  return fused.narrow(0, q_local_ + (which - 1) * kv_local_, kv_local_);
}

at::Tensor GQAQKVColumnParallelLinearImpl::weight_q() const { return part(weight_qkv_, weight_q_, 0); }
at::Tensor GQAQKVColumnParallelLinearImpl::weight_k() const { return part(weight_qkv_, weight_k_, 1); }
at::Tensor GQAQKVColumnParallelLinearImpl::weight_v() const { return part(weight_qkv_, weight_v_, 2); }
at::Tensor GQAQKVColumnParallelLinearImpl::bias_q() const { return part(bias_qkv_, bias_q_, 0); }
at::Tensor GQAQKVColumnParallelLinearImpl::bias_k() const { return part(bias_qkv_, bias_k_, 1); }
at::Tensor GQAQKVColumnParallelLinearImpl::bias_v() const { return part(bias_qkv_, bias_v_, 2); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> GQAQKVColumnParallelLinearImpl::forward(const at::Tensor& input) {
  at::Tensor x = options_.sequence_parallel_enabled()
                     ? gather_from_sequence_parallel_region(input, options_.sequence_dimension(), true, group_)
                     : copy_to_tensor_model_parallel_region(input, group_);
  // Each KV head sits on kv_size_multiplier ranks: their input-gradient contributions are scaled down so
  // that, after the tensor-parallel all-reduce, each head counts once.
  at::Tensor x_kv = options_.kv_size_multiplier() > 1
                        ? scale_gradient(x, 1.0 / static_cast<double>(options_.kv_size_multiplier()))
                        : x;
  at::Tensor q = at::linear(x, weight_q(), bias_q());
  at::Tensor k = at::linear(x_kv, weight_k(), bias_k());
  at::Tensor v = at::linear(x_kv, weight_v(), bias_v());
  if (options_.gather_output()) {
    q = gather_from_tensor_model_parallel_region(q, group_);
    k = gather_from_tensor_model_parallel_region(k, group_);
    v = gather_from_tensor_model_parallel_region(v, group_);
  }
  return {q, k, v};
}

}  // namespace backplane::parallel
