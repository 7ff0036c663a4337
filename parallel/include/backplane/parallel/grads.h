// Gradient norms, clipping and gradient reductions over the model-parallel groups
// (nxd-behaviour.md §5).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "backplane/parallel/mappings.h"

namespace backplane::parallel {

// `norm_type` for the infinity norm.
constexpr double kInfinityNorm = std::numeric_limits<double>::infinity();

// The norm of the gradients of `parameters` (those with a gradient) as if the model were unsharded, the
// same on every rank: partitioned parameters count their shard, parameters every tensor-parallel rank
// holds whole count 1/tp on each rank (so once in total), and the local sums are added over the
// tensor- and pipeline-parallel groups (gradients are already averaged over data parallelism). The
// infinity norm takes the maximum instead. Requires the model-parallel state.
double get_grad_norm(const std::vector<at::Tensor>& parameters, double norm_type = 2.0);

// Scales every gradient by max_norm / (norm + 1e-6) when that is below 1; returns the norm.
double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0);

// Averages the gradients over `group` (default: the data-parallel group): each is divided by the group
// size, then they are summed in buckets of up to bucket_cap_mb megabytes per dtype, in reverse parameter
// order (the order backward produces them), one all-reduce per bucket; a gradient larger than the cap is
// reduced on its own.
void bucket_allreduce_gradients(const std::vector<at::Tensor>& parameters, GroupPtr group = nullptr,
                                double bucket_cap_mb = 512);

// Sums over the tensor-parallel group the gradients of parameters marked sequence-parallel
// (set_sequence_parallel_enabled): each rank computed them from its part of the sequence only.
void allreduce_sequence_parallel_gradients(const std::vector<at::Tensor>& parameters);

namespace detail {
// The norm of gradients split into partitioned ones and tensor-parallel duplicates, reduced over
// `groups` in order (ZeRO-1 adds the data-parallel group: its shards are disjoint there).
double grad_norm(const std::vector<at::Tensor>& partitioned, const std::vector<at::Tensor>& duplicated,
                 double norm_type, const std::vector<GroupPtr>& groups);
void scale_gradients(const std::vector<at::Tensor>& grads, double max_norm, double norm);
}  // namespace detail

}  // namespace backplane::parallel
