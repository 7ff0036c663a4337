// ProcessGroup: LibTorch tensors over a backplane communicator (bpl_comm), through the C ABI only.
//
// Tensors are CPU tensors of a dtype backplane carries (f32, f64, f16, bf16, i8, u8, i32, i64).
// Contiguous tensors are handed to the backend as they are, without copies; other tensors go through a
// contiguous copy (and, for in-place operations, are written back). Every operation has a blocking form
// and an `_async` form that returns a Work to wait on. Failures throw parallel::Error with the
// backend's message.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "backplane/parallel/error.h"

namespace backplane::parallel {

enum class ReduceOp : int32_t {
  Sum = BPL_OP_SUM,
  Prod = BPL_OP_PROD,
  Min = BPL_OP_MIN,
  Max = BPL_OP_MAX,
  Avg = BPL_OP_AVG,
  BitAnd = BPL_OP_BAND,
  BitOr = BPL_OP_BOR,
  BitXor = BPL_OP_BXOR,
};

// The bpl_dtype of a LibTorch scalar type; Error naming the type if backplane does not carry it.
bpl_dtype to_bpl_dtype(at::ScalarType type);

class ProcessGroup;
namespace detail {
struct RuntimeLink;
void renew_group(ProcessGroup& group, ProcessGroup& fresh, bool renumber);
}

// An operation in flight. Waiting returns once it has ended and throws if it failed; the tensors it
// uses stay alive until then. Destroying a Work that was never waited on waits for it (bounded by the
// communicator's timeout) and reports a failure on stderr, since a destructor cannot throw.
class Work {
 public:
  Work() = default;
  Work(Work&& other) noexcept;
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  ~Work();

  // True once the operation has ended successfully; throws if it failed. Never blocks.
  bool is_completed();
  // Waits up to timeout_ms (BPL_TIMEOUT_DEFAULT: the communicator's timeout). Throws Error with
  // BPL_ERR_TIMEOUT if it has not ended (the operation is then still in flight and may be waited on
  // again), or the operation's error.
  void wait(int64_t timeout_ms = BPL_TIMEOUT_DEFAULT);
  // Waits, then returns the operation's output: the reduced, gathered or received tensor (the
  // in-place tensor for all_reduce, broadcast and recv; undefined for send and barrier).
  at::Tensor result(int64_t timeout_ms = BPL_TIMEOUT_DEFAULT);

 private:
  friend class ProcessGroup;
  void release() noexcept;

  std::shared_ptr<const ProcessGroup> group_;  // keeps the communicator alive while in flight
  bpl_request* request_ = nullptr;
  std::vector<at::Tensor> buffers_;            // what the backend reads and writes
  std::function<at::Tensor()> finish_;         // runs once, after success: copies back or reshapes
  at::Tensor output_;
  bool done_ = false;
};

// A group of ranks: the world, or a group made by splitting another. All members must call the same
// collectives in the same order with matching shapes and dtypes.
class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  // The world group of an initialised frontend; see distributed.h. `ranks` are the global ranks of the
  // members, in group-rank order.
  ProcessGroup(std::shared_ptr<detail::RuntimeLink> runtime, bpl_comm* comm, bool owns_comm, std::vector<int> ranks);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  // Global ranks of the members, in group-rank order.
  const std::vector<int>& ranks() const { return ranks_; }
  // The underlying communicator (owned by this group or by the runtime). Throws after
  // destroy_process_group.
  bpl_comm* comm() const;

  // Makes subgroups: ranks passing the same color form one group, ordered by key then by rank
  // (bpl_comm_split). Collective over this group. nullptr for a rank passing BPL_COLOR_UNDEFINED.
  std::shared_ptr<ProcessGroup> split(int color, int key) const;

  // tensor = op over the group's tensors, in place.
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum) const;
  // output = op over the group's inputs; input is not modified. An undefined output, or one whose shape,
  // dtype or layout does not fit, is replaced by a new tensor.
  void all_reduce(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::Sum) const;
  Work all_reduce_async(const at::Tensor& tensor, ReduceOp op = ReduceOp::Sum) const;

  // The group's inputs concatenated along `dim` in rank order. Inputs must have equal shapes.
  at::Tensor all_gather(const at::Tensor& input, int64_t dim = 0) const;
  Work all_gather_async(const at::Tensor& input, int64_t dim = 0) const;

  // The reduction of the inputs, split along `dim` into size() equal blocks; this rank's block. A real
  // reduce-scatter: no rank holds the whole reduction. input.size(dim) must divide by size().
  at::Tensor reduce_scatter(const at::Tensor& input, int64_t dim = 0, ReduceOp op = ReduceOp::Sum) const;
  Work reduce_scatter_async(const at::Tensor& input, int64_t dim = 0, ReduceOp op = ReduceOp::Sum) const;

  // tensor on every rank = tensor on group rank `root`, in place.
  void broadcast(at::Tensor& tensor, int root) const;
  Work broadcast_async(const at::Tensor& tensor, int root) const;

  // Point to point with group rank `peer`; a recv matches the peer's send of the same tag, in order.
  // A blocking send may wait for the matching recv: to exchange, post one side asynchronously.
  void send(const at::Tensor& tensor, int peer, int tag = 0) const;
  Work send_async(const at::Tensor& tensor, int peer, int tag = 0) const;
  void recv(at::Tensor& tensor, int peer, int tag = 0) const;
  Work recv_async(const at::Tensor& tensor, int peer, int tag = 0) const;

  void barrier() const;
  Work barrier_async() const;

  // Byte strings of any length (a folder name, a configuration, metadata): group rank `root`'s, on every
  // rank (`bytes` is ignored elsewhere); every rank's, in group rank order. Each is two collectives:
  // the lengths, then the bytes.
  std::string broadcast_bytes(const std::string& bytes, int root) const;
  std::vector<std::string> all_gather_bytes(const std::string& bytes) const;

  // Going on after a member fails, with ULFM's semantics (bpl_comm_revoke, _agree, _shrink, _grow; see
  // docs/faults.md). Error with BPL_ERR_UNSUPPORTED on a backend that cannot.
  //
  // Every member's operations on the group, in flight or later, fail at once with BPL_ERR_REVOKED.
  void revoke() const;
  // The AND of the flags of the members that take part, and the group ranks of those that failed, the
  // same on every member that returns (a member failing during the call included).
  struct Agreement {
    int32_t flags = 0;
    std::vector<int> failed;
  };
  Agreement agree(int32_t flags) const;
  // The members alive, as a new group numbered in their order here; `failed` holds the group ranks of
  // the others. Error (BPL_ERR_REMOTE) on a member the others counted out or that is cut off from the
  // job's store: it must not go on.
  struct Shrunk {
    std::shared_ptr<ProcessGroup> group;
    std::vector<int> failed;
  };
  Shrunk shrink() const;
  // A group of the members and `joiners` newcomers (processes started with BPL_JOIN=1, whose
  // init_process_group waits to be admitted), numbered after the members; in ranks() the newcomers
  // follow the highest member. Error with BPL_ERR_TIMEOUT if fewer came within the group's timeout, or
  // BPL_ERR_REMOTE if a member failed meanwhile (the newcomers then wait for the next grow).
  std::shared_ptr<ProcessGroup> grow(int joiners) const;

 private:
  friend void detail::renew_group(ProcessGroup& group, ProcessGroup& fresh, bool renumber);
  struct Pending;
  Work start(Pending pending, bool async) const;
  Pending all_reduce_op(const at::Tensor& input, const at::Tensor& output, ReduceOp op) const;
  Pending all_gather_op(const at::Tensor& input, int64_t dim) const;
  Pending reduce_scatter_op(const at::Tensor& input, int64_t dim, ReduceOp op) const;
  Pending broadcast_op(const at::Tensor& tensor, int root) const;
  Pending send_op(const at::Tensor& tensor, int peer, int tag) const;
  Pending recv_op(const at::Tensor& tensor, int peer, int tag) const;
  Pending barrier_op() const;
  void check_peer(int peer, const char* what) const;

  std::shared_ptr<detail::RuntimeLink> runtime_;
  bpl_comm* comm_;
  bool owns_comm_;
  std::vector<int> ranks_;
  int rank_ = 0;
};

}  // namespace backplane::parallel
