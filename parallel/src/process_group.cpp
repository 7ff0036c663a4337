// ProcessGroup and Work: LibTorch tensors in, backplane.h calls out.
#include "backplane/parallel/process_group.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "runtime_link.h"
#include "tensor_bridge.h"

namespace backplane::parallel {

void check(bpl_status status, const char* what) {
  if (status != BPL_OK) throw Error(status, std::string(what) + ": " + bpl_last_error());
}

bpl_dtype to_bpl_dtype(at::ScalarType type) {
  const std::optional<bpl_dtype> dtype = bpl_dtype_of(type);
  if (!dtype) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "the tensor " + unmoved_dtype(type));
  }
  return *dtype;
}

namespace {

// The buffer the backend is handed for `tensor` (tensor_bridge.h), or the refusal naming the operation
// and the argument (`name`).
at::Tensor backend_view(const at::Tensor& tensor, const char* op, const char* name) {
  if (const std::optional<std::string> why = why_unmovable(tensor)) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(op) + ": the " + name + " " + *why);
  }
  return backend_buffer(tensor);
}

int64_t normalize_dim(const at::Tensor& tensor, int64_t dim, const char* op) {
  const int64_t rank = tensor.dim();
  if (rank == 0 || dim < -rank || dim >= rank) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(op) + ": dim " + std::to_string(dim) +
                                              " is out of range for a tensor of " + std::to_string(rank) +
                                              " dim(s)");
  }
  return dim < 0 ? dim + rank : dim;
}

bpl_reduce_op to_bpl(ReduceOp op) { return static_cast<bpl_reduce_op>(op); }
bpl_dtype dtype_of(const at::Tensor& tensor) { return to_bpl_dtype(tensor.scalar_type()); }

// For in-place operations on a tensor the backend got a copy of: write the result back.
std::function<at::Tensor()> copy_back(const at::Tensor& tensor, const at::Tensor& buffer) {
  if (buffer.is_same(tensor)) return nullptr;
  return [tensor, buffer] {
    write_back(tensor, buffer);
    return tensor;
  };
}

}  // namespace

// An operation described once (tensors captured by value, so that an async operation keeps them alive);
// the blocking and the _async forms differ only in how start() runs it.
struct ProcessGroup::Pending {
  const char* what;
  std::function<bpl_status(bpl_request**)> post;
  std::vector<at::Tensor> buffers;
  std::function<at::Tensor()> finish;  // after success; its result replaces `output`
  at::Tensor output;
};

/* ---- Work ---- */

Work::Work(Work&& other) noexcept { *this = std::move(other); }

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    release();
    group_ = std::move(other.group_);
    request_ = std::exchange(other.request_, nullptr);
    buffers_ = std::move(other.buffers_);
    finish_ = std::move(other.finish_);
    output_ = std::move(other.output_);
    done_ = std::exchange(other.done_, false);
  }
  return *this;
}

Work::~Work() { release(); }

void Work::release() noexcept {
  if (request_ != nullptr) {
    // Never waited on: bpl_request_free waits (bounded by the communicator's timeout) so that no buffer
    // is freed while the backend may still use it.
    if (bpl_request_free(request_) != BPL_OK) {
      std::fprintf(stderr, "backplane::parallel: an operation that was never waited on failed: %s\n",
                   bpl_last_error());
    }
    request_ = nullptr;
  }
  buffers_.clear();
  finish_ = nullptr;
  group_.reset();
}

bool Work::is_completed() {
  if (done_ || request_ == nullptr) return true;
  int32_t ended = 0;
  if (bpl_request_test(request_, &ended) == BPL_OK && !ended) return false;
  wait(0);  // ended (or the test failed): wait returns its result at once, or throws it
  return true;
}

void Work::wait(int64_t timeout_ms) {
  if (done_ || request_ == nullptr) return;
  bpl_status status = bpl_request_wait(request_, timeout_ms);
  if (status != BPL_OK) {
    std::string message = bpl_last_error();
    int32_t ended = 0;
    // A wait that ran out of time leaves the operation in flight, to be waited on again.
    if (status == BPL_ERR_TIMEOUT && bpl_request_test(request_, &ended) == BPL_OK && !ended) {
      throw Error(status, "wait: " + message);
    }
    bpl_request_free(request_);  // it has ended: freeing does not wait
    request_ = nullptr;
    release();
    done_ = true;
    throw Error(status, message);
  }
  status = bpl_request_free(request_);
  request_ = nullptr;
  done_ = true;
  if (status == BPL_OK && finish_) output_ = finish_();
  release();
  check(status, "bpl_request_free");
}

at::Tensor Work::result(int64_t timeout_ms) {
  wait(timeout_ms);
  return output_;
}

/* ---- ProcessGroup ---- */

ProcessGroup::ProcessGroup(std::shared_ptr<detail::RuntimeLink> runtime, bpl_comm* comm, bool owns_comm,
                           std::vector<int> ranks)
    : runtime_(std::move(runtime)), comm_(comm), owns_comm_(owns_comm), ranks_(std::move(ranks)) {
  int32_t rank = 0;
  check(bpl_comm_rank(comm_, &rank), "bpl_comm_rank");
  rank_ = rank;
  if (owns_comm_) {
    std::lock_guard<std::mutex> lock(runtime_->mutex);
    runtime_->split_comms.insert(comm_);
  }
}

ProcessGroup::~ProcessGroup() {
  if (!owns_comm_) return;
  std::lock_guard<std::mutex> lock(runtime_->mutex);
  // Gone already if destroy_process_group ran while this group was still held.
  if (runtime_->split_comms.erase(comm_) != 0 && bpl_comm_destroy(comm_) != BPL_OK) {
    std::fprintf(stderr, "backplane::parallel: destroying a process group failed: %s\n", bpl_last_error());
  }
}

bpl_comm* ProcessGroup::comm() const {
  if (runtime_->runtime == nullptr) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "a process group was used after destroy_process_group()");
  }
  return comm_;
}

void ProcessGroup::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size()) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(what) + ": rank " + std::to_string(peer) +
                                              " is not in this group of " + std::to_string(size()) + " rank(s)");
  }
}

Work ProcessGroup::start(Pending pending, bool async) const {
  Work work;
  if (!async) {
    check(pending.post(nullptr), pending.what);
    work.output_ = pending.finish ? pending.finish() : std::move(pending.output);
    work.done_ = true;
    return work;
  }
  std::shared_ptr<const ProcessGroup> self = weak_from_this().lock();
  if (!self) throw Error(BPL_ERR_INVALID_ARGUMENT, "async operations need a ProcessGroup owned by a std::shared_ptr");
  check(pending.post(&work.request_), pending.what);
  work.group_ = std::move(self);
  work.buffers_ = std::move(pending.buffers);
  work.finish_ = std::move(pending.finish);
  work.output_ = std::move(pending.output);
  return work;
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) const {
  bpl_comm* child = nullptr;
  check(bpl_comm_split(comm(), color, key, &child), "bpl_comm_split");
  if (child == nullptr) return nullptr;
  // The C ABI numbers the members within the new group; learn their global ranks from them.
  int32_t size = 0;
  bpl_status status = bpl_comm_size(child, &size);
  std::vector<int32_t> members(static_cast<size_t>(size));
  const int32_t global_rank = ranks_[static_cast<size_t>(rank_)];
  if (status == BPL_OK) status = bpl_allgather(child, &global_rank, members.data(), 1, BPL_DTYPE_I32, nullptr);
  if (status != BPL_OK) {
    std::string message = bpl_last_error();
    bpl_comm_destroy(child);
    throw Error(status, "comm_split: exchanging global ranks: " + message);
  }
  return std::make_shared<ProcessGroup>(runtime_, child, true, std::vector<int>(members.begin(), members.end()));
}

/* ---- all_reduce ---- */

// `output` undefined: in place on `input`. Otherwise into `output` if it fits, else into a new tensor.
ProcessGroup::Pending ProcessGroup::all_reduce_op(const at::Tensor& input, const at::Tensor& output,
                                                  ReduceOp op) const {
  at::Tensor send = backend_view(input, "all_reduce", "input");
  at::Tensor recv = send;
  at::Tensor result = input;
  if (output.defined() && !output.is_same(input)) {
    const bool usable = output.is_contiguous() && output.sizes() == input.sizes() &&
                        output.scalar_type() == input.scalar_type() && output.device().is_cpu();
    recv = usable ? output : at::empty(input.sizes(), send.options());
    result = recv;
  }
  bpl_comm* c = comm();
  return {"all_reduce",
          [c, send, recv, op](bpl_request** req) {
            return bpl_allreduce(c, send.data_ptr(), recv.data_ptr(), send.numel(), dtype_of(send), to_bpl(op), req);
          },
          {send, recv}, copy_back(result, recv), result};
}

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) const { start(all_reduce_op(tensor, {}, op), false); }

void ProcessGroup::all_reduce(const at::Tensor& input, at::Tensor& output, ReduceOp op) const {
  if (!output.defined()) output = at::empty(input.sizes(), input.options());
  output = start(all_reduce_op(input, output, op), false).output_;
}

Work ProcessGroup::all_reduce_async(const at::Tensor& tensor, ReduceOp op) const {
  return start(all_reduce_op(tensor, {}, op), true);
}

/* ---- all_gather ---- */

ProcessGroup::Pending ProcessGroup::all_gather_op(const at::Tensor& input, int64_t dim) const {
  dim = normalize_dim(input, dim, "all_gather");
  at::Tensor send = backend_view(input, "all_gather", "input");
  std::vector<int64_t> gathered_sizes = send.sizes().vec();
  gathered_sizes[static_cast<size_t>(dim)] *= size();
  // Along dim 0 the rank blocks laid end to end are the result; along another dim, gather into
  // (world, …) and interleave once at the end.
  std::vector<int64_t> recv_sizes = gathered_sizes;
  if (dim != 0) {
    recv_sizes = send.sizes().vec();
    recv_sizes.insert(recv_sizes.begin(), size());
  }
  at::Tensor recv = at::empty(recv_sizes, send.options());
  std::function<at::Tensor()> finish;
  if (dim != 0) finish = [recv, dim, gathered_sizes] { return recv.movedim(0, dim).reshape(gathered_sizes); };
  bpl_comm* c = comm();
  return {"all_gather",
          [c, send, recv](bpl_request** req) {
            return bpl_allgather(c, send.data_ptr(), recv.data_ptr(), send.numel(), dtype_of(send), req);
          },
          {send, recv}, std::move(finish), recv};
}

at::Tensor ProcessGroup::all_gather(const at::Tensor& input, int64_t dim) const {
  return start(all_gather_op(input, dim), false).output_;
}

Work ProcessGroup::all_gather_async(const at::Tensor& input, int64_t dim) const {
  return start(all_gather_op(input, dim), true);
}

/* ---- reduce_scatter ---- */

ProcessGroup::Pending ProcessGroup::reduce_scatter_op(const at::Tensor& input, int64_t dim, ReduceOp op) const {
  dim = normalize_dim(input, dim, "reduce_scatter");
  backend_view(input, "reduce_scatter", "input");
  const int64_t length = input.size(dim);
  if (length % size() != 0) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "reduce_scatter: dim " + std::to_string(dim) + " has size " +
                                              std::to_string(length) + ", which does not divide into " +
                                              std::to_string(size()) + " equal blocks");
  }
  std::vector<int64_t> block_sizes = input.sizes().vec();
  block_sizes[static_cast<size_t>(dim)] = length / size();
  // Lay the rank blocks end to end: free along dim 0, one copy along another dim.
  at::Tensor send;
  if (dim == 0) {
    send = input.contiguous();
  } else {
    std::vector<int64_t> split_sizes = block_sizes;
    split_sizes.insert(split_sizes.begin() + dim, size());
    send = input.reshape(split_sizes).movedim(dim, 0).contiguous();
  }
  at::Tensor recv = at::empty(block_sizes, send.options());
  bpl_comm* c = comm();
  return {"reduce_scatter",
          [c, send, recv, op](bpl_request** req) {
            return bpl_reduce_scatter(c, send.data_ptr(), recv.data_ptr(), recv.numel(), dtype_of(send), to_bpl(op),
                                      req);
          },
          {send, recv}, nullptr, recv};
}

at::Tensor ProcessGroup::reduce_scatter(const at::Tensor& input, int64_t dim, ReduceOp op) const {
  return start(reduce_scatter_op(input, dim, op), false).output_;
}

Work ProcessGroup::reduce_scatter_async(const at::Tensor& input, int64_t dim, ReduceOp op) const {
  return start(reduce_scatter_op(input, dim, op), true);
}

/* ---- broadcast ---- */

ProcessGroup::Pending ProcessGroup::broadcast_op(const at::Tensor& tensor, int root) const {
  check_peer(root, "broadcast");
  at::Tensor buffer = backend_view(tensor, "broadcast", "tensor");
  bpl_comm* c = comm();
  return {"broadcast",
          [c, buffer, root](bpl_request** req) {
            return bpl_broadcast(c, buffer.data_ptr(), buffer.numel(), dtype_of(buffer), root, req);
          },
          {buffer}, copy_back(tensor, buffer), tensor};
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) const { start(broadcast_op(tensor, root), false); }

Work ProcessGroup::broadcast_async(const at::Tensor& tensor, int root) const {
  return start(broadcast_op(tensor, root), true);
}

/* ---- send / recv ---- */

ProcessGroup::Pending ProcessGroup::send_op(const at::Tensor& tensor, int peer, int tag) const {
  check_peer(peer, "send");
  at::Tensor buffer = backend_view(tensor, "send", "tensor");
  bpl_comm* c = comm();
  return {"send",
          [c, buffer, peer, tag](bpl_request** req) {
            return bpl_send(c, buffer.data_ptr(), buffer.numel(), dtype_of(buffer), peer, tag, req);
          },
          {buffer}, nullptr, {}};
}

void ProcessGroup::send(const at::Tensor& tensor, int peer, int tag) const { start(send_op(tensor, peer, tag), false); }

Work ProcessGroup::send_async(const at::Tensor& tensor, int peer, int tag) const {
  return start(send_op(tensor, peer, tag), true);
}

ProcessGroup::Pending ProcessGroup::recv_op(const at::Tensor& tensor, int peer, int tag) const {
  check_peer(peer, "recv");
  at::Tensor buffer = backend_view(tensor, "recv", "tensor");
  bpl_comm* c = comm();
  return {"recv",
          [c, buffer, peer, tag](bpl_request** req) {
            return bpl_recv(c, buffer.data_ptr(), buffer.numel(), dtype_of(buffer), peer, tag, req);
          },
          {buffer}, copy_back(tensor, buffer), tensor};
}

void ProcessGroup::recv(at::Tensor& tensor, int peer, int tag) const { start(recv_op(tensor, peer, tag), false); }

Work ProcessGroup::recv_async(const at::Tensor& tensor, int peer, int tag) const {
  return start(recv_op(tensor, peer, tag), true);
}

/* ---- barrier ---- */

ProcessGroup::Pending ProcessGroup::barrier_op() const {
  bpl_comm* c = comm();
  return {"barrier", [c](bpl_request** req) { return bpl_barrier(c, req); }, {}, nullptr, {}};
}

void ProcessGroup::barrier() const { start(barrier_op(), false); }

Work ProcessGroup::barrier_async() const { return start(barrier_op(), true); }

/* ---- byte strings ---- */

std::string ProcessGroup::broadcast_bytes(const std::string& bytes, int root) const {
  check_peer(root, "broadcast_bytes");
  bpl_comm* c = comm();
  int64_t length = rank() == root ? static_cast<int64_t>(bytes.size()) : 0;
  check(bpl_broadcast(c, &length, 1, BPL_DTYPE_I64, root, nullptr), "broadcast_bytes (the length)");
  std::string received = rank() == root ? bytes : std::string(static_cast<size_t>(length), '\0');
  check(bpl_broadcast(c, received.data(), length, BPL_DTYPE_U8, root, nullptr), "broadcast_bytes");
  return received;
}

std::vector<std::string> ProcessGroup::all_gather_bytes(const std::string& bytes) const {
  bpl_comm* c = comm();
  const auto mine = static_cast<int64_t>(bytes.size());
  std::vector<int64_t> lengths(static_cast<size_t>(size())), offsets(static_cast<size_t>(size()));
  check(bpl_allgather(c, &mine, lengths.data(), 1, BPL_DTYPE_I64, nullptr), "all_gather_bytes (the lengths)");
  int64_t total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(static_cast<size_t>(total), '\0');
  check(bpl_allgatherv(c, bytes.data(), mine, all.data(), lengths.data(), offsets.data(), BPL_DTYPE_U8, nullptr),
        "all_gather_bytes");
  std::vector<std::string> each;
  for (size_t r = 0; r < lengths.size(); ++r) {
    each.push_back(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lengths[r])));
  }
  return each;
}

}  // namespace backplane::parallel
