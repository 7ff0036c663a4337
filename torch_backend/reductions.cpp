// The reducing operations of BackendBackplane: all_reduce (dense; sparse in composed_operations.cpp),
// its coalesced form, reduce, and the reduce_scatter forms.
#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "list_buffers.h"
#include "tensor_arguments.h"

namespace backplane::torch_backend {

c10::intrusive_ptr<c10d::Work> BackendBackplane::allreduce(std::vector<at::Tensor>& tensors,
                                                                const c10d::AllreduceOptions& opts) {
  const char* op_name = "allreduce";
  require_some(tensors, op_name);
  if (std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.is_sparse(); })) {
    return sparse_allreduce(tensors, opts);
  }
  const bpl_dtype dtype = dtype_of(tensors[0], op_name);
  for (size_t i = 1; i < tensors.size(); ++i) require_same(tensors[0], tensors[i], op_name, "tensor " + std::to_string(i), i);
  std::optional<double> factor;
  bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  // Several tensors (as Gloo's CPU allreduce takes): each gets the reduction over all of them on every rank.
  at::Tensor buffer = backend_buffer(tensors[0]);
  if (tensors.size() > 1) {
    buffer = buffer.clone();
    for (size_t i = 1; i < tensors.size(); ++i) {
      switch (op) {
        case BPL_OP_PROD: buffer.mul_(tensors[i]); break;
        case BPL_OP_MIN: buffer = at::minimum(buffer, tensors[i]); break;
        case BPL_OP_MAX: buffer = at::maximum(buffer, tensors[i]); break;
        case BPL_OP_BAND: buffer.bitwise_and_(tensors[i]); break;
        case BPL_OP_BOR: buffer.bitwise_or_(tensors[i]); break;
        case BPL_OP_BXOR: buffer.bitwise_xor_(tensors[i]); break;
        default: buffer.add_(tensors[i]); break;
      }
    }
    if (op == BPL_OP_AVG) buffer.div_(static_cast<double>(tensors.size()));
  }
  if (factor) buffer = buffer.mul(*factor);
  const int64_t count = buffer.numel();
  std::vector<at::Tensor> targets = tensors;
  return post(
      {c10d::OpType::ALLREDUCE, op_name, tensors},
      [&](bpl_request** req) { return bpl_allreduce(comm_, buffer.data_ptr(), buffer.data_ptr(), count, dtype, op, req); },
      [buffer, targets] {
        for (const at::Tensor& t : targets) write_back(t, buffer);
      },
      tensors, {buffer});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                          const c10d::AllreduceCoalescedOptions& opts) {
  const char* op_name = "allreduce_coalesced";
  if (tensors.empty()) fail("allreduce_coalesced: no tensor given");
  const bpl_dtype dtype = dtype_of(tensors[0], op_name);
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].scalar_type() != tensors[0].scalar_type()) {
      fail(std::string(op_name) + ": tensor " + std::to_string(i) + " is " + std::string(c10::toString(tensors[i].scalar_type())) +
           ", tensor 0 " + std::string(c10::toString(tensors[0].scalar_type())) + ": one dtype per call");
    }
    dtype_of(tensors[i], op_name);
  }
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  at::Tensor flat = flat_of(tensors, scratch_->take(total_numel(tensors), tensors[0].scalar_type()));
  if (factor) flat.mul_(*factor);
  const int64_t count = flat.numel();
  std::vector<at::Tensor> targets = tensors;
  return post(
      {c10d::OpType::ALLREDUCE_COALESCED, op_name, tensors},
      [&](bpl_request** req) { return bpl_allreduce(comm_, flat.data_ptr(), flat.data_ptr(), count, dtype, op, req); },
      [flat, targets] { copy_slices(flat, targets); }, tensors, {flat});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::reduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::ReduceOptions& opts) {
  const char* op_name = "reduce";
  checked_root_tensor(tensors, opts.rootTensor, op_name);
  const at::Tensor& tensor = single(tensors, op_name);
  const bpl_dtype dtype = dtype_of(tensor, op_name);
  const int64_t root = checked_rank(opts.rootRank, getSize(), op_name);
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  at::Tensor buffer = factor ? tensor.mul(*factor) : backend_buffer(tensor);
  // Only the root's tensor receives the result (as torch's backends); the others keep their input.
  at::Tensor result = scratch_->take(buffer.numel(), buffer.scalar_type());
  const bool at_root = root == getRank();
  return post(
      {c10d::OpType::REDUCE, op_name, tensors},
      [&](bpl_request** req) {
        return bpl_reduce(comm_, buffer.data_ptr(), result.data_ptr(), buffer.numel(), dtype, op, static_cast<int32_t>(root), req);
      },
      [result, tensor, at_root] {
        if (at_root) write_back(tensor, result);
      },
      tensors, {buffer, result});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                                     const c10d::ReduceScatterOptions& opts) {
  const char* op_name = "reduce_scatter";
  const at::Tensor& output = single(outputs, op_name);
  const bpl_dtype dtype = dtype_of(output, op_name);
  if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize()) {
    fail(std::string(op_name) + ": expected one list of " + std::to_string(getSize()) + " input tensors (one per rank)");
  }
  const auto same_size = [&](const at::Tensor& t) { return t.numel() == output.numel(); };
  if (!std::all_of(inputs[0].begin(), inputs[0].end(), same_size)) return reduce_scatter_uneven(outputs[0], inputs[0], opts);
  for (size_t r = 0; r < inputs[0].size(); ++r) require_same(output, inputs[0][r], op_name, "input tensor " + std::to_string(r), r);
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  at::Tensor flat = flat_of(inputs[0], scratch_->take(getSize() * output.numel(), output.scalar_type()));
  if (factor) flat.mul_(*factor);
  at::Tensor result = backend_buffer(output);
  return post(
      {c10d::OpType::REDUCE_SCATTER, op_name, inputs.empty() ? outputs : inputs[0]},
      [&](bpl_request** req) { return bpl_reduce_scatter(comm_, flat.data_ptr(), result.data_ptr(), result.numel(), dtype, op, req); },
      [result, output] { write_back(output, result); }, outputs, {flat, result});
}

// Blocks of different sizes (rank r's is inputs[r], as Gloo's CPU reduce_scatter takes them): the whole
// list reduced on every rank, each keeping its own block. It moves every block to every rank, where
// equal blocks move each to its own rank only.
c10::intrusive_ptr<c10d::Work> BackendBackplane::reduce_scatter_uneven(at::Tensor& output, std::vector<at::Tensor>& inputs,
                                                                       const c10d::ReduceScatterOptions& opts) {
  const char* op_name = "reduce_scatter";
  const bpl_dtype dtype = dtype_of(output, op_name);
  int64_t total = 0, offset = 0;
  for (size_t r = 0; r < inputs.size(); ++r) {
    if (inputs[r].scalar_type() != output.scalar_type()) {
      fail(std::string(op_name) + ": invalid tensor type at index " + std::to_string(r) + " (expected " +
           std::string(c10::toString(output.scalar_type())) + ", got " + std::string(c10::toString(inputs[r].scalar_type())) + ")");
    }
    if (static_cast<int>(r) == getRank()) offset = total;
    total += inputs[r].numel();
  }
  const at::Tensor& mine = inputs[static_cast<size_t>(getRank())];
  if (mine.numel() != output.numel()) {
    fail(std::string(op_name) + ": invalid tensor size at index " + std::to_string(getRank()) + ": this rank's block has " +
         std::to_string(mine.numel()) + " elements, its output " + std::to_string(output.numel()));
  }
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  at::Tensor flat = flat_of(inputs, at::empty({total}, output.options()));
  if (factor) flat.mul_(*factor);
  std::vector<at::Tensor> outputs{output};
  return post(
      {c10d::OpType::REDUCE_SCATTER, op_name, inputs},
      [&](bpl_request** req) { return bpl_allreduce(comm_, flat.data_ptr(), flat.data_ptr(), total, dtype, op, req); },
      [flat, output, offset] { write_back(output, flat.slice(0, offset, offset + output.numel())); }, outputs, {flat});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                           const c10d::ReduceScatterOptions& opts) {
  const char* op_name = "_reduce_scatter_base";
  const bpl_dtype dtype = dtype_of(output, op_name);
  dtype_of(input, op_name);
  if (output.scalar_type() != input.scalar_type() || input.numel() != getSize() * output.numel()) {
    fail(std::string(op_name) + ": the input has " + std::to_string(input.numel()) + " elements; expected " +
         std::to_string(getSize() * output.numel()) + " (world size x output) of the output's dtype");
  }
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  at::Tensor source = factor ? input.mul(*factor) : backend_buffer(input);
  at::Tensor result = backend_buffer(output);
  return post(
      {c10d::OpType::_REDUCE_SCATTER_BASE, op_name, {input}},
      [&](bpl_request** req) { return bpl_reduce_scatter(comm_, source.data_ptr(), result.data_ptr(), result.numel(), dtype, op, req); },
      [result, output] { write_back(output, result); }, {output}, {source, result});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::ReduceScatterOptions& opts) {
  const char* op_name = "reduce_scatter_tensor_coalesced";
  if (outputs.size() != inputs.size()) {
    fail(std::string(op_name) + ": " + std::to_string(outputs.size()) + " outputs for " + std::to_string(inputs.size()) + " inputs");
  }
  std::optional<double> factor;
  const bpl_reduce_op op = reduce_op_of(opts.reduceOp, op_name, &factor);
  std::vector<at::Tensor> sources, results;
  std::vector<bpl_dtype> dtypes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    dtypes.push_back(dtype_of(outputs[i], op_name));
    if (outputs[i].scalar_type() != inputs[i].scalar_type() || inputs[i].numel() != getSize() * outputs[i].numel()) {
      fail(std::string(op_name) + ": input " + std::to_string(i) + " has " + std::to_string(inputs[i].numel()) +
           " elements; expected " + std::to_string(getSize() * outputs[i].numel()) + " (world size x output " +
           std::to_string(i) + ") of its dtype");
    }
    sources.push_back(factor ? inputs[i].mul(*factor) : backend_buffer(inputs[i]));
    results.push_back(backend_buffer(outputs[i]));
  }
  return post_pairs({c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, op_name, inputs}, sources, results, outputs,
                    [&](int i, bpl_request** req) {
                      return bpl_reduce_scatter(comm_, sources[i].data_ptr(), results[i].data_ptr(), results[i].numel(),
                                                dtypes[i], op, req);
                    });
}

}  // namespace backplane::torch_backend
