// Tensor-parallel layers as torch::nn modules (nxd-behaviour.md §4).
//
// Weights are initialised the CPU way of neuronx-distributed: the full ("master") weight is made in
// fp32 with init_method, cast to the layer's dtype, and each rank keeps its partition. With the same
// seed on every rank the layer therefore computes the same function for any tensor-parallel degree;
// keep_master_weight keeps the full weight (as master_weight()) so tests and examples can compare with an
// unsharded layer.
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <optional>
#include <tuple>

#include "backplane/parallel/mappings.h"

namespace backplane::parallel {

// While one lives on a thread, the parallel layers made there build as initialize_parallel_model's
// model_init_config and pad_model say. DeferredInit: parameters are allocated at their local shard's
// shape and left uninitialised, with no full master weight made or drawn (keep_master_weight then keeps
// a meta tensor, its shape only); whoever made the scope initialises them (param_init_fn). PadModel: the
// linear layers pad (their `pad` option) unless their sizes already divide.
struct DeferredInitScope {
  DeferredInitScope();
  ~DeferredInitScope();
  DeferredInitScope(const DeferredInitScope&) = delete;
  DeferredInitScope& operator=(const DeferredInitScope&) = delete;
};
struct PadModelScope {
  PadModelScope();
  ~PadModelScope();
  PadModelScope(const PadModelScope&) = delete;
  PadModelScope& operator=(const PadModelScope&) = delete;
};

// Initialises a full fp32 weight in place. nullptr: the layer's default (kaiming_uniform_(a=sqrt(5)) for
// linear layers, normal_(0, 1) for embeddings).
using InitMethod = std::function<void(at::Tensor&)>;

// This rank's partition of `full` along `partition_dim` for a layer split `world` ways with `stride`
// interleaved blocks per rank: split into blocks of per_partition/stride, take blocks rank, rank+world, …
at::Tensor create_local_weight(const at::Tensor& full, int64_t partition_dim, int64_t per_partition_size,
                               int64_t stride, int rank, int world);

// A trainable addition to a linear layer's output, computed from the layer's input (LoRA's adapter: see
// lora.h). A layer with one adds adapter->delta(input) to its output, before its bias.
class LinearAdapter : public torch::nn::Module {
 public:
  virtual at::Tensor delta(const at::Tensor& input) = 0;
};

struct ColumnParallelLinearOptions {
  ColumnParallelLinearOptions(int64_t input_size, int64_t output_size)
      : input_size_(input_size), output_size_(output_size) {}
  TORCH_ARG(int64_t, input_size);
  TORCH_ARG(int64_t, output_size);  // full size; each rank holds output_size / tp rows
  TORCH_ARG(bool, bias) = true;
  // All-gather the output along the last dim (full output on every rank), else keep this rank's part.
  TORCH_ARG(bool, gather_output) = true;
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(int64_t, stride) = 1;
  TORCH_ARG(InitMethod, init_method) = nullptr;
  // The input arrives split along sequence_dimension; it is all-gathered first (needs !gather_output).
  TORCH_ARG(bool, sequence_parallel_enabled) = false;
  TORCH_ARG(int64_t, sequence_dimension) = 0;
  TORCH_ARG(bool, keep_master_weight) = false;
  // forward_with_bias returns the bias instead of adding it (to fuse it into what follows).
  TORCH_ARG(bool, skip_bias_add) = false;
  // Pads output_size with zero rows up to a multiple of tp * pad_alignment_size_per_rank (on by default
  // while initialize_parallel_model builds a model with pad_model). The padded rows start at zero and
  // stay there in training when what reads them ignores them (attention heads of zero weights). Without
  // pad, output_size must be such a multiple.
  TORCH_ARG(bool, pad) = false;
  // What each rank's part must be a multiple of: a head's size, so that heads are not split.
  TORCH_ARG(int64_t, pad_alignment_size_per_rank) = 1;
  // With gather_output, keep the padded columns of the output (else it is narrowed to output_size).
  TORCH_ARG(bool, keep_padded_output) = false;
  TORCH_ARG(GroupPtr, tensor_model_parallel_group) = nullptr;
};

// y = x W^T + b with W split by rows (output features) over the tensor-parallel group.
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  explicit ColumnParallelLinearImpl(ColumnParallelLinearOptions options);
  // The output (with the bias added). Error if skip_bias_add is set: use forward_with_bias.
  at::Tensor forward(const at::Tensor& input);
  // (output, bias): with skip_bias_add the bias is not added and returned instead; else (output + bias,
  // undefined).
  std::tuple<at::Tensor, at::Tensor> forward_with_bias(const at::Tensor& input);

  const ColumnParallelLinearOptions& options() const { return options_; }
  GroupPtr group() const { return group_; }
  // output_size with its padding (output_size without pad).
  int64_t padded_output_size() const { return padded_size_; }
  at::Tensor weight;        // (output_size / tp, input_size)
  at::Tensor bias;          // (output_size) if gather_output, else (output_size / tp); undefined without bias
  at::Tensor master_weight; // (output_size, input_size) fp32, with keep_master_weight
  std::shared_ptr<LinearAdapter> adapter;  // set by apply_lora

 private:
  ColumnParallelLinearOptions options_;
  GroupPtr group_;
  int64_t padded_size_ = 0;
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelLinearOptions {
  RowParallelLinearOptions(int64_t input_size, int64_t output_size)
      : input_size_(input_size), output_size_(output_size) {}
  TORCH_ARG(int64_t, input_size);  // full size; each rank holds input_size / tp columns
  TORCH_ARG(int64_t, output_size);
  TORCH_ARG(bool, bias) = true;
  // The input is already split along its last dim (e.g. a ColumnParallelLinear without gather_output).
  TORCH_ARG(bool, input_is_parallel) = false;
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(int64_t, stride) = 1;
  TORCH_ARG(InitMethod, init_method) = nullptr;
  // Reduce-scatter the output along sequence_dimension instead of all-reducing it (needs input_is_parallel).
  TORCH_ARG(bool, sequence_parallel_enabled) = false;
  TORCH_ARG(int64_t, sequence_dimension) = 0;
  TORCH_ARG(bool, keep_master_weight) = false;
  TORCH_ARG(bool, skip_bias_add) = false;
  // false: leave the partial sums unreduced.
  TORCH_ARG(bool, reduce_output) = true;
  // The partial sums are reduced in this dtype, then cast back.
  TORCH_ARG(at::ScalarType, reduce_dtype) = at::kFloat;
  // Pads input_size with zero columns up to a multiple of tp * pad_alignment_size_per_rank (see
  // ColumnParallelLinearOptions::pad); a parallel input must then come padded (from a padded
  // ColumnParallelLinear), a whole one is padded here.
  TORCH_ARG(bool, pad) = false;
  TORCH_ARG(int64_t, pad_alignment_size_per_rank) = 1;
  TORCH_ARG(GroupPtr, tensor_model_parallel_group) = nullptr;
};

// y = x W^T + b with W split by columns (input features); partial products are all-reduced, then the
// (unsplit) bias is added.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  explicit RowParallelLinearImpl(RowParallelLinearOptions options);
  at::Tensor forward(const at::Tensor& input);
  std::tuple<at::Tensor, at::Tensor> forward_with_bias(const at::Tensor& input);

  const RowParallelLinearOptions& options() const { return options_; }
  GroupPtr group() const { return group_; }
  // input_size with its padding (input_size without pad).
  int64_t padded_input_size() const { return padded_size_; }
  at::Tensor weight;        // (output_size, input_size / tp)
  at::Tensor bias;          // (output_size), the same on every rank
  at::Tensor master_weight; // (output_size, input_size) fp32, with keep_master_weight
  std::shared_ptr<LinearAdapter> adapter;  // set by apply_lora

 private:
  RowParallelLinearOptions options_;
  GroupPtr group_;
  int64_t padded_size_ = 0;
};
TORCH_MODULE(RowParallelLinear);

struct ParallelEmbeddingOptions {
  ParallelEmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  TORCH_ARG(int64_t, num_embeddings);
  TORCH_ARG(int64_t, embedding_dim);
  // Its row is zero and gets no gradient, as in torch::nn::Embedding.
  TORCH_ARG(std::optional<int64_t>, padding_idx) = std::nullopt;
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(InitMethod, init_method) = nullptr;
  // Split the embedding dim instead of the vocabulary (output all-gathered along the last dim).
  TORCH_ARG(bool, shard_across_embedding) = false;
  // Vocabulary split only: the output (batch, seq, dim) is reduce-scattered along seq as (seq/tp, batch, dim).
  TORCH_ARG(bool, sequence_parallel_enabled) = false;
  TORCH_ARG(bool, keep_master_weight) = false;
  TORCH_ARG(GroupPtr, tensor_model_parallel_group) = nullptr;
};

// An embedding table split by vocabulary rows: each rank looks up the ids in its range, zeroes the others,
// and the partial outputs are all-reduced.
class ParallelEmbeddingImpl : public torch::nn::Module {
 public:
  explicit ParallelEmbeddingImpl(ParallelEmbeddingOptions options);
  at::Tensor forward(const at::Tensor& input);

  const ParallelEmbeddingOptions& options() const { return options_; }
  // The vocabulary range [start, end) this rank holds (vocabulary split).
  int64_t vocab_start() const { return vocab_start_; }
  int64_t vocab_end() const { return vocab_end_; }
  at::Tensor weight;        // (V / tp, D), or (V, D / tp) with shard_across_embedding
  at::Tensor master_weight; // (V, D) fp32, with keep_master_weight

 private:
  ParallelEmbeddingOptions options_;
  GroupPtr group_;
  int64_t vocab_start_ = 0;
  int64_t vocab_end_ = 0;
  std::optional<int64_t> local_padding_idx_;
};
TORCH_MODULE(ParallelEmbedding);

// How the kv_out rows of the K and V master weights are replicated kv_size_multiplier times before they
// are split: Repeat gives K0..Kn,K0..Kn (trn1), RepeatInterleave K0,K0,..,K1,K1,.. (trn2).
enum class KvReplication { Repeat, RepeatInterleave };

struct GQAQKVColumnParallelLinearOptions {
  GQAQKVColumnParallelLinearOptions(int64_t input_size, int64_t q_output_size, int64_t kv_output_size)
      : input_size_(input_size), q_output_size_(q_output_size), kv_output_size_(kv_output_size) {}
  TORCH_ARG(int64_t, input_size);
  TORCH_ARG(int64_t, q_output_size);
  TORCH_ARG(int64_t, kv_output_size);
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(bool, gather_output) = true;
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  TORCH_ARG(InitMethod, init_method) = nullptr;
  TORCH_ARG(bool, sequence_parallel_enabled) = false;
  TORCH_ARG(int64_t, sequence_dimension) = 0;
  TORCH_ARG(bool, keep_master_weight) = false;
  // Each KV head is held by this many ranks, for when there are fewer KV heads than TP ranks.
  // tp % kv_size_multiplier == 0 and (kv_output_size * kv_size_multiplier) % tp == 0.
  TORCH_ARG(int64_t, kv_size_multiplier) = 1;
  TORCH_ARG(KvReplication, kv_replication) = KvReplication::Repeat;
  // One weight_qkv (rows [Q | K | V] of this rank) instead of weight_q, weight_k, weight_v.
  TORCH_ARG(bool, fuse_qkv) = true;
  TORCH_ARG(GroupPtr, tensor_model_parallel_group) = nullptr;
};

// Q, K and V projections of grouped-query attention, split by output features.
class GQAQKVColumnParallelLinearImpl : public torch::nn::Module {
 public:
  explicit GQAQKVColumnParallelLinearImpl(GQAQKVColumnParallelLinearOptions options);
  // (q, k, v): this rank's parts, or the full (K/V replicated) outputs with gather_output.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& input);

  const GQAQKVColumnParallelLinearOptions& options() const { return options_; }
  // This rank's Q, K and V weights (views of weight_qkv when fused) and biases (undefined without bias).
  at::Tensor weight_q() const;
  at::Tensor weight_k() const;
  at::Tensor weight_v() const;
  at::Tensor bias_q() const;
  at::Tensor bias_k() const;
  at::Tensor bias_v() const;
  // The unreplicated fp32 masters, with keep_master_weight: (q_out, in), (kv_out, in), (kv_out, in).
  at::Tensor master_weight_q, master_weight_k, master_weight_v;

 private:
  at::Tensor part(const at::Tensor& fused, const at::Tensor& separate, int which) const;

  GQAQKVColumnParallelLinearOptions options_;
  GroupPtr group_;
  int64_t q_local_ = 0;
  int64_t kv_local_ = 0;
  at::Tensor weight_qkv_, bias_qkv_;                             // fused
  at::Tensor weight_q_, weight_k_, weight_v_, bias_q_, bias_k_, bias_v_;  // unfused
};
TORCH_MODULE(GQAQKVColumnParallelLinear);

}  // namespace backplane::parallel
