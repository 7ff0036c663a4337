// Gradient norms, clipping and bucketed gradient reductions.
#include "backplane/parallel/grads.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>
#include <string>

#include "backplane/parallel/distributed.h"
#include "backplane/parallel/error.h"
#include "backplane/parallel/parallel_state.h"
#include "backplane/parallel/parameters.h"

namespace backplane::parallel {

namespace detail {

double grad_norm(const std::vector<at::Tensor>& partitioned, const std::vector<at::Tensor>& duplicated,
                 double norm_type, const std::vector<GroupPtr>& groups) {
  if (!(norm_type > 0)) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "norm_type " + std::to_string(norm_type) + " is not valid: expected > 0 or infinity");
  }
  const bool infinity = std::isinf(norm_type);
  const double tp = get_tensor_model_parallel_size();
  double local = 0;
  for (const at::Tensor& g : partitioned) {
    const double n = g.to(at::kDouble).norm(infinity ? INFINITY : norm_type).item<double>();
    local = infinity ? std::max(local, n) : local + std::pow(n, norm_type);
  }
  double duplicates = 0;
  for (const at::Tensor& g : duplicated) {
    const double n = g.to(at::kDouble).norm(infinity ? INFINITY : norm_type).item<double>();
    duplicates = infinity ? std::max(duplicates, n) : duplicates + std::pow(n, norm_type);
  }
  // Every tensor-parallel rank holds the duplicates: 1/tp of them on each adds up to one copy.
  local = infinity ? std::max(local, duplicates) : local + duplicates / tp;
  // The partial sums cross ranks in f64 where the backend reduces it; the Neuron runtime does not, and
  // there they go in f32, as neuronx-distributed reduces the norm.
  bool crosses_ranks = false;
  for (const GroupPtr& group : groups) crosses_ranks = crosses_ranks || (group && group->size() > 1);
  if (!crosses_ranks) return infinity ? local : std::pow(local, 1.0 / norm_type);
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  check(bpl_runtime_describe(get_runtime(), &info), "bpl_runtime_describe");
  at::Tensor total = at::full({1}, local, (info.dtypes & BPL_BIT(BPL_DTYPE_F64)) ? at::kDouble : at::kFloat);
  for (const GroupPtr& group : groups) {
    if (group && group->size() > 1) group->all_reduce(total, infinity ? ReduceOp::Max : ReduceOp::Sum);
  }
  const double reduced = total.item().toDouble();
  return infinity ? reduced : std::pow(reduced, 1.0 / norm_type);
}

void scale_gradients(const std::vector<at::Tensor>& grads, double max_norm, double norm) {
  const double factor = max_norm / (norm + 1e-6);
  if (factor >= 1) return;
  c10::NoGradGuard no_grad;
  for (const at::Tensor& g : grads) g.mul_(factor);  // in place: the gradients themselves
}

}  // namespace detail

namespace {

// Gradients of `parameters`, split into partitioned ones and tensor-parallel duplicates.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> split_gradients(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> partitioned, duplicated;
  for (const at::Tensor& p : parameters) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    (tensor_model_parallel_attributes(p) ? partitioned : duplicated).push_back(g);
  }
  return {partitioned, duplicated};
}

}  // namespace

double get_grad_norm(const std::vector<at::Tensor>& parameters, double norm_type) {
  auto [partitioned, duplicated] = split_gradients(parameters);
  return detail::grad_norm(partitioned, duplicated, norm_type,
                           {get_tensor_model_parallel_group(), get_pipeline_model_parallel_group()});
}

double clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type) {
  const double norm = get_grad_norm(parameters, norm_type);
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  detail::scale_gradients(grads, max_norm, norm);
  return norm;
}

void bucket_allreduce_gradients(const std::vector<at::Tensor>& parameters, GroupPtr group, double bucket_cap_mb) {
  if (!group) group = get_data_parallel_group();
  if (group->size() == 1) return;
  const auto cap = static_cast<int64_t>(bucket_cap_mb * 1024 * 1024);
  c10::NoGradGuard no_grad;
  // Per dtype, in reverse parameter order.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {
    at::Tensor g = it->grad();
    if (!g.defined()) continue;
    g.div_(group->size());
    by_dtype[g.scalar_type()].push_back(g);
  }
  auto flush = [&](std::vector<at::Tensor>& bucket) {
    if (bucket.empty()) return;
    if (bucket.size() == 1) {
      group->all_reduce(bucket.front());
    } else {
      std::vector<at::Tensor> flat_parts;
      std::vector<int64_t> sizes;
      for (const at::Tensor& g : bucket) {
        flat_parts.push_back(g.reshape({-1}));
        sizes.push_back(g.numel());
      }
      at::Tensor flat = at::cat(flat_parts);
      group->all_reduce(flat);
      std::vector<at::Tensor> reduced = flat.split_with_sizes(sizes);
      for (size_t i = 0; i < bucket.size(); ++i) bucket[i].copy_(reduced[i].view_as(bucket[i]));
    }
    bucket.clear();
  };
  for (auto& [dtype, grads] : by_dtype) {
    std::vector<at::Tensor> bucket;
    int64_t bytes = 0;
    for (at::Tensor& g : grads) {
      const int64_t size = g.numel() * static_cast<int64_t>(g.element_size());
      if (bytes + size > cap) {
        flush(bucket);
        bytes = 0;
      }
      bucket.push_back(g);
      bytes += size;
    }
    flush(bucket);
  }
}

void allreduce_sequence_parallel_gradients(const std::vector<at::Tensor>& parameters) {
  GroupPtr group = get_tensor_model_parallel_group();
  if (group->size() == 1) return;
  for (const at::Tensor& p : parameters) {
    if (is_sequence_parallel_enabled(p) && p.grad().defined()) {
      at::Tensor g = p.grad();
      group->all_reduce(g);
    }
  }
}

}  // namespace backplane::parallel
