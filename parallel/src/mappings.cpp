// The tensor-parallel mappings: one autograd function, parameterised by the collective it runs forward
// and the one it runs backward.
#include "backplane/parallel/mappings.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "backplane/parallel/parallel_state.h"

namespace backplane::parallel {

at::Tensor split_along_dim(const at::Tensor& input, int64_t dim, int parts, int index) {
  const int64_t rank = input.dim();
  if (rank == 0 || dim < -rank || dim >= rank) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "split: dim " + std::to_string(dim) + " is out of range for a tensor of " +
                                              std::to_string(rank) + " dim(s)");
  }
  if (dim < 0) dim += rank;
  const int64_t length = input.size(dim);
  if (length % parts != 0) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "split: dim " + std::to_string(dim) + " has size " + std::to_string(length) +
                                              ", which does not divide into " + std::to_string(parts) +
                                              " equal parts");
  }
  const int64_t block = length / parts;
  return input.narrow(dim, index * block, block);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a mapping does in one direction over its group.
enum class Collective : int64_t { Identity, AllReduce, Split, AllGather, ReduceScatter };

at::Tensor apply_collective(Collective collective, const at::Tensor& x, int64_t dim, const ProcessGroup& group) {
  if (group.size() == 1) return x;  // neuronx-distributed skips every collective on a group of one
  switch (collective) {
    case Collective::Identity: return x;
    case Collective::AllReduce: {
      at::Tensor out;
      group.all_reduce(x, out);
      return out;
    }
    case Collective::Split:
      return split_along_dim(x, dim, group.size(), group.rank()).contiguous();
    case Collective::AllGather: return group.all_gather(x, dim);
    case Collective::ReduceScatter: return group.reduce_scatter(x, dim);
  }
  throw Error(BPL_ERR_INTERNAL, "unknown collective in a mapping");
}

// Autograd keeps non-tensor state as IValues; a capsule carries the group so that the graph keeps it
// alive until backward runs.
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(GroupPtr g) : group(std::move(g)) {}
  GroupPtr group;
};

struct RegionMapping : torch::autograd::Function<RegionMapping> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, Collective forward_collective,
                            Collective backward_collective, int64_t dim, GroupPtr group,
                            std::optional<at::ScalarType> grad_dtype) {
    ctx->saved_data["backward"] = static_cast<int64_t>(backward_collective);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(group));
    if (grad_dtype) ctx->saved_data["grad_dtype"] = static_cast<int64_t>(*grad_dtype);
    return apply_collective(forward_collective, input, dim, *group);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto backward_collective = static_cast<Collective>(ctx->saved_data["backward"].toInt());
    const int64_t dim = ctx->saved_data["dim"].toInt();
    GroupPtr group = c10::static_intrusive_pointer_cast<GroupCapsule>(ctx->saved_data["group"].toCapsule())->group;
    at::Tensor grad = grad_outputs[0];
    auto grad_dtype = ctx->saved_data.find("grad_dtype");
    if (grad_dtype != ctx->saved_data.end()) grad = grad.to(static_cast<at::ScalarType>(grad_dtype->second.toInt()));
    // One gradient per forward argument; only the input has one.
    return {apply_collective(backward_collective, grad, dim, *group), {}, {}, {}, {}, {}};
  }
};

struct ScaleGradient : torch::autograd::Function<ScaleGradient> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, double factor) {
    ctx->saved_data["factor"] = factor;
    return input;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return {grad_outputs[0] * ctx->saved_data["factor"].toDouble(), {}};
  }
};

GroupPtr or_tensor_parallel(GroupPtr group) { return group ? group : get_tensor_model_parallel_group(); }

at::Tensor map(const at::Tensor& input, Collective forward, Collective backward, int64_t dim, GroupPtr group,
               std::optional<at::ScalarType> grad_dtype = std::nullopt) {
  return RegionMapping::apply(input, forward, backward, dim, or_tensor_parallel(std::move(group)), grad_dtype);
}

int64_t last_dim(const at::Tensor& input) {
  if (input.dim() == 0) throw Error(BPL_ERR_INVALID_ARGUMENT, "a tensor-parallel mapping needs a tensor of at least one dim");
  return input.dim() - 1;
}

}  // namespace

at::Tensor copy_to_tensor_model_parallel_region(const at::Tensor& input, GroupPtr group) {
  return map(input, Collective::Identity, Collective::AllReduce, 0, std::move(group));
}

at::Tensor reduce_from_tensor_model_parallel_region(const at::Tensor& input, GroupPtr group) {
  return map(input, Collective::AllReduce, Collective::Identity, 0, std::move(group));
}

at::Tensor scatter_to_tensor_model_parallel_region(const at::Tensor& input, GroupPtr group) {
  return map(input, Collective::Split, Collective::AllGather, last_dim(input), std::move(group));
}

at::Tensor gather_from_tensor_model_parallel_region(const at::Tensor& input, GroupPtr group) {
  return map(input, Collective::AllGather, Collective::Split, last_dim(input), std::move(group));
}

at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& input, int64_t sequence_dim, GroupPtr group) {
  return map(input, Collective::Split, Collective::AllGather, sequence_dim, std::move(group));
}

at::Tensor gather_from_sequence_parallel_region(const at::Tensor& input, int64_t sequence_dim, bool to_model_parallel,
                                                GroupPtr group) {
  return map(input, Collective::AllGather, to_model_parallel ? Collective::ReduceScatter : Collective::Split,
             sequence_dim, std::move(group));
}

at::Tensor reduce_scatter_to_sequence_parallel_region(const at::Tensor& input, int64_t sequence_dim,
                                                      std::optional<at::ScalarType> grad_dtype, GroupPtr group) {
  return map(input, Collective::ReduceScatter, Collective::AllGather, sequence_dim, std::move(group), grad_dtype);
}

at::Tensor scale_gradient(const at::Tensor& input, double factor) { return ScaleGradient::apply(input, factor); }

}  // namespace backplane::parallel
