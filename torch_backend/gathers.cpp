// The operations of BackendBackplane that move data without reducing it: broadcast, the all_gather
// forms, gather and scatter.
#include <ATen/ATen.h>

#include <string>
#include <type_traits>
#include <vector>

#include "backend.h"
#include "list_buffers.h"
#include "tensor_arguments.h"

namespace backplane::torch_backend {

namespace {

// The work's kind for allgather_into_tensor_coalesced: newer torch names it (2.15 does), older calls it
// ALLGATHER_COALESCED (the kind labels the work for torch's records; nothing else depends on it).
template <typename Kind, typename = void>
struct AllgatherIntoTensorCoalesced {
  static constexpr Kind value = Kind::ALLGATHER_COALESCED;
};
template <typename Kind>
struct AllgatherIntoTensorCoalesced<Kind, std::void_t<decltype(Kind::ALLGATHER_INTO_TENSOR_COALESCED)>> {
  static constexpr Kind value = Kind::ALLGATHER_INTO_TENSOR_COALESCED;
};
// From this size of a rank's block, all_gather into a list runs as one broadcast per rank, each into
// its tensor of the list, rather than as an allgather into a flat buffer copied out after: that copy
// (the whole list) costs more than the extra operations' fixed costs from there
// (bench/results/design-choices.md#the-torch-backends-lists).
constexpr int64_t kBroadcastListBytes = 256 * 1024;
}  // namespace

c10::intrusive_ptr<c10d::Work> BackendBackplane::broadcast(std::vector<at::Tensor>& tensors,
                                                                const c10d::BroadcastOptions& opts) {
  const char* op_name = "broadcast";
  // Several tensors (as Gloo's CPU broadcast takes): the root's tensor `rootTensor` goes to every one of
  // them on every rank.
  const int64_t root_tensor = checked_root_tensor(tensors, opts.rootTensor, op_name);
  const at::Tensor& tensor = tensors[static_cast<size_t>(root_tensor)];
  for (size_t i = 0; i < tensors.size(); ++i) require_same(tensor, tensors[i], op_name, "tensor " + std::to_string(i), i);
  const bpl_dtype dtype = dtype_of(tensor, op_name);
  const int64_t root = checked_rank(opts.rootRank, getSize(), op_name);
  at::Tensor buffer = backend_buffer(tensor);
  std::vector<at::Tensor> targets = tensors;
  return post(
      {c10d::OpType::BROADCAST, op_name, tensors},
      [&](bpl_request** req) {
        return bpl_broadcast(comm_, buffer.data_ptr(), buffer.numel(), dtype, static_cast<int32_t>(root), req);
      },
      [buffer, targets] {
        for (const at::Tensor& t : targets) write_back(t, buffer);
      },
      tensors, {buffer});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllgatherOptions&) {
  const char* op_name = "allgather";
  require_some(inputs, op_name);
  if (inputs.size() > 1) return allgather_several(outputs, inputs);
  const at::Tensor& input = inputs[0];
  const bpl_dtype dtype = dtype_of(input, op_name);
  if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()) {
    fail(std::string(op_name) + ": expected one list of " + std::to_string(getSize()) + " output tensors (one per rank)");
  }
  for (size_t r = 0; r < outputs[0].size(); ++r) require_same(input, outputs[0][r], op_name, "output tensor " + std::to_string(r), r);
  at::Tensor source = backend_buffer(input);
  std::vector<at::Tensor> targets = outputs[0];
  if (source.nbytes() >= kBroadcastListBytes) {
    // Each rank's block broadcast by it straight into its output tensor on every rank: no flat buffer
    // to copy out of, which from this size costs more than the operations' fixed costs. Chosen by the
    // size alone, which every rank shares; a tensor of the list that is not contiguous (a layout of
    // this rank's own) receives into a contiguous one, copied into it after.
    std::vector<at::Tensor> blocks;
    blocks.reserve(targets.size());
    for (const at::Tensor& t : targets) blocks.push_back(t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous));
    write_back(blocks[static_cast<size_t>(getRank())], source);
    return post_each(
        {c10d::OpType::ALLGATHER, op_name, inputs}, getSize(),
        [&](int root, bpl_request** req) {
          return bpl_broadcast(comm_, blocks[static_cast<size_t>(root)].data_ptr(), source.numel(), dtype, root, req);
        },
        [blocks, targets] {
          for (size_t r = 0; r < targets.size(); ++r) write_back(targets[r], blocks[r]);
        },
        targets, blocks);
  }
  at::Tensor gathered = scratch_->take(getSize() * input.numel(), input.scalar_type());
  return post(
      {c10d::OpType::ALLGATHER, op_name, inputs},
      [&](bpl_request** req) { return bpl_allgather(comm_, source.data_ptr(), gathered.data_ptr(), source.numel(), dtype, req); },
      [gathered, targets] { copy_slices(gathered, targets); }, targets, {source, gathered});
}

// Several inputs (as Gloo's CPU allgather takes): every rank's every input, rank by rank, in each of the
// output lists (outputs[i][r * inputs + j]: rank r's input j).
c10::intrusive_ptr<c10d::Work> BackendBackplane::allgather_several(std::vector<std::vector<at::Tensor>>& outputs,
                                                                   std::vector<at::Tensor>& inputs) {
  const char* op_name = "allgather";
  if (outputs.size() != inputs.size()) {
    fail(std::string(op_name) + " requires input/output tensor lists to have the same length (" +
         std::to_string(inputs.size()) + " inputs, " + std::to_string(outputs.size()) + " output lists)");
  }
  const size_t expected = inputs.size() * static_cast<size_t>(getSize());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].size() != expected) {
      fail(std::string(op_name) + ": invalid output tensor list at index " + std::to_string(i) + " (expected length " +
           std::to_string(expected) + ", got " + std::to_string(outputs[i].size()) + ")");
    }
    for (size_t j = 0; j < expected; ++j) {
      require_same(inputs[0], outputs[i][j], op_name, "output " + std::to_string(i) + "." + std::to_string(j), j);
    }
  }
  for (size_t j = 0; j < inputs.size(); ++j) require_same(inputs[0], inputs[j], op_name, "input " + std::to_string(j), j);
  const bpl_dtype dtype = dtype_of(inputs[0], op_name);
  const int64_t block = static_cast<int64_t>(inputs.size()) * inputs[0].numel();
  at::Tensor source = flat_of(inputs, at::empty({block}, inputs[0].options()));
  at::Tensor gathered = at::empty({block * getSize()}, inputs[0].options());
  std::vector<std::vector<at::Tensor>> targets = outputs;
  std::vector<at::Tensor> result;
  for (const std::vector<at::Tensor>& list : outputs) result.insert(result.end(), list.begin(), list.end());
  return post(
      {c10d::OpType::ALLGATHER, op_name, inputs},
      [&](bpl_request** req) { return bpl_allgather(comm_, source.data_ptr(), gathered.data_ptr(), block, dtype, req); },
      [gathered, targets] {
        for (const std::vector<at::Tensor>& list : targets) copy_slices(gathered, list);
      },
      result, {source, gathered});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::AllgatherOptions&) {
  const char* op_name = "_allgather_base";
  const bpl_dtype dtype = dtype_of(input, op_name);
  dtype_of(output, op_name);
  if (output.scalar_type() != input.scalar_type() || output.numel() != getSize() * input.numel()) {
    fail(std::string(op_name) + ": the output has " + std::to_string(output.numel()) + " elements of " +
         std::string(c10::toString(output.scalar_type())) + "; expected " + std::to_string(getSize() * input.numel()) +
         " (world size x input) of " + std::string(c10::toString(input.scalar_type())));
  }
  at::Tensor source = backend_buffer(input);
  at::Tensor gathered = backend_buffer(output);
  return post(
      {c10d::OpType::_ALLGATHER_BASE, op_name, {input}},
      [&](bpl_request** req) { return bpl_allgather(comm_, source.data_ptr(), gathered.data_ptr(), source.numel(), dtype, req); },
      [gathered, output] { write_back(output, gathered); }, {output}, {source, gathered});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions&) {
  const char* op_name = "allgather_into_tensor_coalesced";
  if (outputs.size() != inputs.size()) {
    fail(std::string(op_name) + ": " + std::to_string(outputs.size()) + " outputs for " + std::to_string(inputs.size()) + " inputs");
  }
  std::vector<at::Tensor> sources, results;
  std::vector<bpl_dtype> dtypes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    dtypes.push_back(dtype_of(inputs[i], op_name));
    if (outputs[i].scalar_type() != inputs[i].scalar_type() || outputs[i].numel() != getSize() * inputs[i].numel()) {
      fail(std::string(op_name) + ": output " + std::to_string(i) + " has " + std::to_string(outputs[i].numel()) +
           " elements; expected " + std::to_string(getSize() * inputs[i].numel()) + " (world size x input " +
           std::to_string(i) + ") of its dtype");
    }
    sources.push_back(backend_buffer(inputs[i]));
    results.push_back(backend_buffer(outputs[i]));
  }
  return post_pairs({AllgatherIntoTensorCoalesced<c10d::OpType>::value, op_name, inputs}, sources, results, outputs,
                    [&](int i, bpl_request** req) {
                      return bpl_allgather(comm_, sources[i].data_ptr(), results[i].data_ptr(), sources[i].numel(),
                                           dtypes[i], req);
                    });
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions&) {
  // output_lists[r][i]: rank r's input i.
  const char* op_name = "allgather_coalesced";
  if (output_lists.size() != static_cast<size_t>(getSize())) {
    fail(std::string(op_name) + ": " + std::to_string(output_lists.size()) + " output lists; expected one per rank (" +
         std::to_string(getSize()) + ")");
  }
  for (size_t r = 0; r < output_lists.size(); ++r) {
    if (output_lists[r].size() != inputs.size()) {
      fail(std::string(op_name) + ": output list " + std::to_string(r) + " has " + std::to_string(output_lists[r].size()) +
           " tensors; expected one per input (" + std::to_string(inputs.size()) + ")");
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      require_same(inputs[i], output_lists[r][i], op_name, "output " + std::to_string(i) + " of list " + std::to_string(r), i);
    }
  }
  // Each input gathered into a flat tensor of world x input, then spread over the lists.
  std::vector<at::Tensor> sources, flats;
  std::vector<bpl_dtype> dtypes;
  for (const at::Tensor& input : inputs) {
    dtypes.push_back(dtype_of(input, op_name));
    sources.push_back(backend_buffer(input));
    flats.push_back(at::empty({getSize() * input.numel()}, input.options()));
  }
  std::vector<at::Tensor> outputs;
  for (const auto& list : output_lists) outputs.insert(outputs.end(), list.begin(), list.end());
  std::vector<at::Tensor> keep = sources;
  keep.insert(keep.end(), flats.begin(), flats.end());
  return post_each(
      {c10d::OpType::ALLGATHER_COALESCED, op_name, inputs}, static_cast<int>(inputs.size()),
      [&](int i, bpl_request** req) {
        return bpl_allgather(comm_, sources[i].data_ptr(), flats[i].data_ptr(), sources[i].numel(), dtypes[i], req);
      },
      [flats, output_lists] {
        for (size_t i = 0; i < flats.size(); ++i) {
          const at::Tensor blocks = flats[i].view({static_cast<int64_t>(output_lists.size()), -1});
          for (size_t r = 0; r < output_lists.size(); ++r) output_lists[r][i].copy_(blocks[r].view_as(output_lists[r][i]));
        }
      },
      outputs, keep);
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  const char* op_name = "gather";
  const at::Tensor& input = single(inputs, op_name);
  const bpl_dtype dtype = dtype_of(input, op_name);
  const int64_t root = checked_rank(opts.rootRank, getSize(), op_name);
  const bool at_root = root == getRank();
  if (at_root) {
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != getSize()) {
      fail(std::string(op_name) + ": the root expects one list of " + std::to_string(getSize()) + " output tensors");
    }
    for (size_t r = 0; r < outputs[0].size(); ++r) require_same(input, outputs[0][r], op_name, "output tensor " + std::to_string(r), r);
  } else if (!outputs.empty() && !outputs[0].empty()) {
    fail(std::string(op_name) + ": only the root (rank " + std::to_string(root) + ") gives output tensors");
  }
  at::Tensor source = backend_buffer(input);
  at::Tensor gathered = at_root ? scratch_->take(getSize() * input.numel(), input.scalar_type()) : at::Tensor();
  std::vector<at::Tensor> targets = at_root ? outputs[0] : std::vector<at::Tensor>{};
  return post(
      {c10d::OpType::GATHER, op_name, inputs},
      [&](bpl_request** req) {
        return bpl_gather(comm_, source.data_ptr(), at_root ? gathered.data_ptr() : nullptr, source.numel(), dtype,
                          static_cast<int32_t>(root), req);
      },
      [gathered, targets] {
        if (!targets.empty()) copy_slices(gathered, targets);
      },
      targets, {source, gathered});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::scatter(std::vector<at::Tensor>& outputs,
                                                              std::vector<std::vector<at::Tensor>>& inputs,
                                                              const c10d::ScatterOptions& opts) {
  const char* op_name = "scatter";
  const at::Tensor& output = single(outputs, op_name);
  const bpl_dtype dtype = dtype_of(output, op_name);
  const int64_t root = checked_rank(opts.rootRank, getSize(), op_name);
  at::Tensor parts;  // the root's inputs, flat
  if (root == getRank()) {
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != getSize()) {
      fail(std::string(op_name) + ": the root expects one list of " + std::to_string(getSize()) + " input tensors");
    }
    for (size_t r = 0; r < inputs[0].size(); ++r) require_same(output, inputs[0][r], op_name, "input tensor " + std::to_string(r), r);
    parts = flat_of(inputs[0], scratch_->take(getSize() * output.numel(), output.scalar_type()));
  } else if (!inputs.empty() && !inputs[0].empty()) {
    fail(std::string(op_name) + ": only the root (rank " + std::to_string(root) + ") gives input tensors");
  }
  at::Tensor result = backend_buffer(output);
  return post(
      {c10d::OpType::SCATTER, op_name, inputs.empty() ? outputs : inputs[0]},
      [&](bpl_request** req) {
        return bpl_scatter(comm_, parts.defined() ? parts.data_ptr() : nullptr, result.data_ptr(), result.numel(), dtype,
                           static_cast<int32_t>(root), req);
      },
      [result, output] { write_back(output, result); }, outputs, {parts, result});
}

}  // namespace backplane::torch_backend
