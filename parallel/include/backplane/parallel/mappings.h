// The tensor-parallel mappings as autograd functions (nxd-behaviour.md §3): each is a collective in the
// forward pass paired with its adjoint in the backward pass. `group` defaults to the tensor-parallel
// group; with a group of one rank every mapping is the identity.
//
//   mapping                                      forward                  backward
//   copy_to_tensor_model_parallel_region         identity                 all-reduce
//   reduce_from_tensor_model_parallel_region     all-reduce               identity
//   scatter_to_tensor_model_parallel_region      keep own last-dim slice  all-gather, last dim
//   gather_from_tensor_model_parallel_region     all-gather, last dim     keep own last-dim slice
//   scatter_to_sequence_parallel_region          keep own slice of dim    all-gather along dim
//   gather_from_sequence_parallel_region         all-gather along dim     reduce-scatter along dim
//                                                                         (own slice if !to_model_parallel)
//   reduce_scatter_to_sequence_parallel_region   reduce-scatter along dim all-gather along dim
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>

#include "backplane/parallel/process_group.h"

namespace backplane::parallel {

using GroupPtr = std::shared_ptr<ProcessGroup>;

at::Tensor copy_to_tensor_model_parallel_region(const at::Tensor& input, GroupPtr group = nullptr);
at::Tensor reduce_from_tensor_model_parallel_region(const at::Tensor& input, GroupPtr group = nullptr);
at::Tensor scatter_to_tensor_model_parallel_region(const at::Tensor& input, GroupPtr group = nullptr);
at::Tensor gather_from_tensor_model_parallel_region(const at::Tensor& input, GroupPtr group = nullptr);

at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& input, int64_t sequence_dim = 0,
                                               GroupPtr group = nullptr);
at::Tensor gather_from_sequence_parallel_region(const at::Tensor& input, int64_t sequence_dim = 0,
                                                bool to_model_parallel = true, GroupPtr group = nullptr);
// `grad_dtype`: the incoming gradient is cast to it before the backward all-gather.
at::Tensor reduce_scatter_to_sequence_parallel_region(const at::Tensor& input, int64_t sequence_dim = 0,
                                                      std::optional<at::ScalarType> grad_dtype = std::nullopt,
                                                      GroupPtr group = nullptr);

// Identity forward; the gradient is multiplied by `factor` on the way back. The GQA layer uses it so
// that K/V heads replicated kv_size_multiplier times contribute to the input gradient once.
at::Tensor scale_gradient(const at::Tensor& input, double factor);

// This rank's slice of `input` split into `parts` equal blocks along `dim` (a view). Error naming the
// sizes if the dim does not divide.
at::Tensor split_along_dim(const at::Tensor& input, int64_t dim, int parts, int index);

}  // namespace backplane::parallel
