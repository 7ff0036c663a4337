// The exchanging operations of BackendBackplane: all_to_all (single tensor and lists, even or by
// splits), barrier, and the point-to-point send and recv.
#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "list_buffers.h"
#include "tensor_arguments.h"
#include "work.h"

namespace backplane::torch_backend {

namespace {
// Counts and displacements, in elements, of blocks of `sizes` elements laid end to end.
struct Layout {
  std::vector<int64_t> counts, displs;
  explicit Layout(const std::vector<int64_t>& sizes) {
    int64_t next = 0;
    for (int64_t n : sizes) {
      counts.push_back(n);
      displs.push_back(next);
      next += n;
    }
  }
  bool even() const { return std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == counts[0]; }); }
};

// all_to_all_single's splits (rows of dim 0 per rank; none: equal) as element counts per rank.
std::vector<int64_t> split_elements(const std::vector<int64_t>& splits, const at::Tensor& t, int size, const char* op,
                                    const char* which) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row = rows == 0 ? 0 : t.numel() / rows;
  if (splits.empty()) {
    if (rows % size != 0) {
      fail(std::string(op) + ": the " + which + "'s " + std::to_string(rows) + " rows do not split evenly over " +
           std::to_string(size) + " ranks (give split sizes)");
    }
    return std::vector<int64_t>(static_cast<size_t>(size), rows / size * row);
  }
  if (static_cast<int>(splits.size()) != size) {
    fail(std::string(op) + ": " + std::to_string(splits.size()) + " " + which + " split sizes for " + std::to_string(size) +
         " ranks");
  }
  int64_t total = 0;
  std::vector<int64_t> elements;
  for (int64_t n : splits) {
    if (n < 0) fail(std::string(op) + ": " + which + " split size " + std::to_string(n) + " is negative");
    total += n;
    elements.push_back(n * row);
  }
  if (total != rows) {
    fail(std::string(op) + ": the " + which + " split sizes add up to " + std::to_string(total) + " rows; the " + which +
         " has " + std::to_string(rows));
  }
  return elements;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> BackendBackplane::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                    std::vector<int64_t>& output_splits,
                                                                    std::vector<int64_t>& input_splits,
                                                                    const c10d::AllToAllOptions&) {
  const char* op_name = "alltoall_base";
  const bpl_dtype dtype = dtype_of(input, op_name);
  dtype_of(output, op_name);
  if (output.scalar_type() != input.scalar_type()) {
    fail(std::string(op_name) + ": the output is " + std::string(c10::toString(output.scalar_type())) + ", the input " +
         std::string(c10::toString(input.scalar_type())));
  }
  const int size = getSize();
  const Layout sent(split_elements(input_splits, input, size, op_name, "input"));
  const Layout received(split_elements(output_splits, output, size, op_name, "output"));
  at::Tensor source = backend_buffer(input);
  at::Tensor result = backend_buffer(output);
  const bool even = sent.even() && received.even() && sent.counts[0] == received.counts[0];
  return post(
      {c10d::OpType::ALLTOALL_BASE, op_name, {input}},
      [&](bpl_request** req) {
        if (even) return bpl_alltoall(comm_, source.data_ptr(), result.data_ptr(), sent.counts[0], dtype, req);
        return bpl_alltoallv(comm_, source.data_ptr(), sent.counts.data(), sent.displs.data(), result.data_ptr(),
                             received.counts.data(), received.displs.data(), dtype, req);
      },
      [result, output] { write_back(output, result); }, {output}, {source, result});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                               const c10d::AllToAllOptions&) {
  const char* op_name = "alltoall";
  const int size = getSize();
  if (static_cast<int>(inputs.size()) != size || static_cast<int>(outputs.size()) != size) {
    fail(std::string(op_name) + ": expected " + std::to_string(size) + " input and output tensors (one per rank), got " +
         std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
  }
  const bpl_dtype dtype = dtype_of(inputs[0], op_name);
  std::vector<int64_t> send_sizes, recv_sizes;
  for (int r = 0; r < size; ++r) {
    for (const at::Tensor* t : {&inputs[r], &outputs[r]}) {
      dtype_of(*t, op_name);
      if (t->scalar_type() != inputs[0].scalar_type()) {
        fail(std::string(op_name) + ": tensor " + std::to_string(r) + " is " + std::string(c10::toString(t->scalar_type())) +
             ", input 0 " + std::string(c10::toString(inputs[0].scalar_type())) + ": one dtype per call");
      }
    }
    send_sizes.push_back(inputs[r].numel());
    recv_sizes.push_back(outputs[r].numel());
  }
  const Layout sent(send_sizes), received(recv_sizes);
  at::Tensor source = flat_of(inputs, scratch_->take(total_numel(inputs), inputs[0].scalar_type()));
  at::Tensor result = scratch_->take(total_numel(outputs), inputs[0].scalar_type());
  std::vector<at::Tensor> targets = outputs;
  const bool even = sent.even() && received.even() && sent.counts[0] == received.counts[0];
  return post(
      {c10d::OpType::ALLTOALL, op_name, inputs},
      [&](bpl_request** req) {
        if (even) return bpl_alltoall(comm_, source.data_ptr(), result.data_ptr(), sent.counts[0], dtype, req);
        return bpl_alltoallv(comm_, source.data_ptr(), sent.counts.data(), sent.displs.data(), result.data_ptr(),
                             received.counts.data(), received.displs.data(), dtype, req);
      },
      [result, targets] { copy_slices(result, targets); }, outputs, {source, result});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::barrier(const c10d::BarrierOptions&) {
  return post(
      {c10d::OpType::BARRIER, "barrier", {}}, [&](bpl_request** req) { return bpl_barrier(comm_, req); }, nullptr, {}, {});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  const char* op_name = "send";
  const at::Tensor& tensor = single(tensors, op_name);
  const bpl_dtype dtype = dtype_of(tensor, op_name);
  checked_rank(dst_rank, getSize(), op_name, "destination");
  at::Tensor buffer = backend_buffer(tensor);
  return post(
      {c10d::OpType::SEND, op_name, tensors},
      [&](bpl_request** req) { return bpl_send(comm_, buffer.data_ptr(), buffer.numel(), dtype, dst_rank, tag, req); }, nullptr,
      tensors, {buffer});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  const char* op_name = "recv";
  const at::Tensor& tensor = single(tensors, op_name);
  const bpl_dtype dtype = dtype_of(tensor, op_name);
  checked_rank(src_rank, getSize(), op_name, "source");
  at::Tensor buffer = backend_buffer(tensor);
  return post(
      {c10d::OpType::RECV, op_name, tensors},
      [&](bpl_request** req) { return bpl_recv(comm_, buffer.data_ptr(), buffer.numel(), dtype, src_rank, tag, req); },
      [buffer, tensor] { write_back(tensor, buffer); }, tensors, {buffer});
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const char* op_name = "recv (from any source)";
  const at::Tensor& tensor = single(tensors, op_name);
  const bpl_dtype dtype = dtype_of(tensor, op_name);
  at::Tensor buffer = backend_buffer(tensor);
  auto source = std::make_shared<int32_t>(-1);
  c10::intrusive_ptr<c10d::Work> work = post(
      {c10d::OpType::RECVANYSOURCE, op_name, tensors},
      [&](bpl_request** req) {
        return bpl_recv_any(comm_, buffer.data_ptr(), buffer.numel(), dtype, tag, source.get(), req);
      },
      [buffer, tensor] { write_back(tensor, buffer); }, tensors, {buffer});
  static_cast<BackplaneWork*>(work.get())->set_source(std::move(source));
  return work;
}

}  // namespace backplane::torch_backend
