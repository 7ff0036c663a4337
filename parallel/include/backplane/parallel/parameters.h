// What neuronx-distributed keeps as attributes on parameter tensors (tensor_model_parallel,
// partition_dim, …, sequence_parallel_enabled): LibTorch tensors carry no attributes, so they live in a
// registry keyed by the tensor's storage object, valid as long as the tensor lives.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace backplane::parallel {

struct TensorParallelAttributes {
  int64_t partition_dim = 0;    // the dim split over the tensor-parallel ranks
  int64_t partition_stride = 1; // interleaved blocks per rank (see create_local_weight)
  int num_partitions = 1;       // the tensor-parallel size
  // The whole size along partition_dim before padding (pad_model): the partitions together hold it and
  // then zeros. -1: no padding.
  int64_t unpadded_size = -1;
  // Whether the whole tensor is the partitions put back together (checkpoints can then move between
  // tensor-parallel degrees). Not for GQA's fused QKV weights, whose partitions interleave replicated heads.
  bool reshardable = true;
};

// Marks `parameter` as one rank's partition. Error if it is marked already (as neuronx-distributed asserts).
void set_tensor_model_parallel_attributes(const at::Tensor& parameter, TensorParallelAttributes attributes);
// The attributes, or nullopt for a parameter every tensor-parallel rank holds whole (a duplicate).
std::optional<TensorParallelAttributes> tensor_model_parallel_attributes(const at::Tensor& parameter);
// True for partitioned parameters, and for duplicates on tensor-parallel rank 0: the parameters that,
// counted on every rank, count each value once.
bool param_is_not_tensor_parallel_duplicate(const at::Tensor& parameter);

// A duplicated parameter whose gradient each rank computes from its part of the sequence only (the
// row-parallel bias and layer norms under sequence parallelism): allreduce_sequence_parallel_gradients
// sums these over the tensor-parallel group.
void set_sequence_parallel_enabled(const at::Tensor& parameter);
bool is_sequence_parallel_enabled(const at::Tensor& parameter);

}  // namespace backplane::parallel
