// BackendBackplane: torch.distributed's backend "backplane", a c10d::Backend for CPU tensors on
// backplane's C ABI (torch 2's ProcessGroup dispatches each device's operations to its backend). Every
// operation is posted as a backplane request and returns at once; its Work completes when the caller
// waits, or, once its future is asked for (DDP's communication hooks), on the group's completion thread.
// Errors are backplane's messages, raised as RuntimeError (an operation's failure as torch's
// DistBackendError, a RuntimeError too) in Python.
#pragma once

#include <c10/util/SmallVector.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "store_callbacks.h"

namespace backplane::torch_backend {

class Runtime;
class Communicator;
// A Work's backplane requests, in posting order: most operations have one.
using Requests = c10::SmallVector<bpl_request*, 1>;

// An operation of the group: its kind and name (its messages say it), and the tensors torch.profiler
// shows as its inputs, as torch's own backends record them.
struct Operation {
  c10d::OpType type;
  const char* name;
  std::vector<at::Tensor> inputs;
};
class CompletionQueue;
class ScratchBuffers;

class BackendBackplane : public c10d::Backend {
 public:
  // torch's creator (Backend.register_backend): the first group of the process (the default group)
  // starts backplane's runtime with `store` as its meeting place (bpl_init_options.store); every later
  // group is made by its members alone through its own store (bpl_comm_create_from_store).
  static c10::intrusive_ptr<c10d::Backend> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                       std::chrono::milliseconds timeout);

  // `group_store`: the store torch gave the group; `store`, the same as backplane's bpl_store where
  // the communicator was made through it (kept while the communicator lives).
  // `parent`: the communicator a shrunk group's was made from (kept while it lives).
  BackendBackplane(std::shared_ptr<Runtime> runtime, bpl_comm* comm, bool owns_comm,
                   c10::intrusive_ptr<c10d::Store> group_store, std::unique_ptr<StoreCallbacks> store,
                   std::chrono::milliseconds timeout, std::shared_ptr<Communicator> parent = nullptr);
  ~BackendBackplane() override;

  const std::string getBackendName() const override { return "backplane"; }
  // torch 2's lifecycle of a backend: the group's timeout, its first failure, aborting and shutting
  // down, the number of operations posted, and subgroups made by their members alone (split).
  void setTimeout(std::chrono::milliseconds timeout) override;
  c10d::ErrorType getError() override;
  void abort() override;
  void shutdown() override;
  uint64_t getSequenceNumberForGroup() override { return sequence_; }
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return c10::make_intrusive<Options>("backplane", timeout_); }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  // torch.distributed.shrink_group: the members alive agree on who failed (bpl_comm_shrink), which must
  // be `ranks_to_exclude` (excluded ranks still running are counted out at the group's timeout); with
  // SHRINK_ABORT the group is revoked first, which releases every member still in an operation.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<Options>& opts_override) override;
  // What backplane chose for this process: backend, why, and its details (bpl_runtime_describe).
  std::string describe() const;
  // The group's communicator (for benchmarks that call the C ABI beside the group).
  bpl_comm* comm() const { return comm_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  // A sparse tensor's all_reduce, where torch dispatches it here rather than to allreduce.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override {
    return allreduce(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                     std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // Names the ranks that did not arrive within the timeout, on rank 0 (composed_operations.cpp).
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // Waits until every Work of the process whose future was asked for has completed and let go of its
  // future's callbacks. Python's atexit calls it (without the GIL): a callback released on the
  // completion thread once the interpreter has begun finalizing would end that thread in the middle of
  // a destructor, and the process with it.
  static void wait_for_completions();

 private:
  // Starts an operation: `start(req)` posts it; `finish` runs once it succeeded (copies results into
  // the caller's tensors); `outputs` are the Work's result; `keep` stays alive until it ends.
  c10::intrusive_ptr<c10d::Work> post(const Operation& operation, const std::function<bpl_status(bpl_request**)>& start,
                                      std::function<void()> finish, std::vector<at::Tensor> outputs,
                                      std::vector<at::Tensor> keep);
  // The same for an operation of `count` requests, `start(i, req)` posting the i-th; its Work ends
  // when all have, or with the first that failed.
  c10::intrusive_ptr<c10d::Work> post_each(const Operation& operation, int count,
                                           const std::function<bpl_status(int, bpl_request**)>& start,
                                           std::function<void()> finish, std::vector<at::Tensor> outputs,
                                           std::vector<at::Tensor> keep);

  // A coalesced operation on pairs of tensors: pair i posted by `start(i, req)` from sources[i] into
  // results[i]; once every one ended, results[i] is copied into outputs[i] (unless it is outputs[i]).
  c10::intrusive_ptr<c10d::Work> post_pairs(const Operation& operation, const std::vector<at::Tensor>& sources,
                                            const std::vector<at::Tensor>& results, const std::vector<at::Tensor>& outputs,
                                            const std::function<bpl_status(int, bpl_request**)>& start);

  // all_reduce of sparse COO tensors, summed here first (composed_operations.cpp).
  c10::intrusive_ptr<c10d::Work> sparse_allreduce(const std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);
  // all_gather of several inputs at once (gathers.cpp).
  c10::intrusive_ptr<c10d::Work> allgather_several(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs);
  // reduce_scatter of a list whose blocks differ in size (reductions.cpp).
  c10::intrusive_ptr<c10d::Work> reduce_scatter_uneven(at::Tensor& output, std::vector<at::Tensor>& inputs,
                                                       const c10d::ReduceScatterOptions& opts);

  // Shared with the group's works, which may outlive it: the destructor waits for neither (torch may
  // drop a group while holding Python's GIL, which its futures' callbacks need).
  std::shared_ptr<Communicator> communicator_;
  std::shared_ptr<CompletionQueue> completions_;
  std::unique_ptr<ScratchBuffers> scratch_;  // its buffers' storages live on in the works that use them
  bpl_comm* comm_;  // communicator_'s
  std::chrono::milliseconds timeout_;
  uint64_t sequence_ = 0;  // operations posted
  c10::intrusive_ptr<c10d::Store> store_;  // the group's, which monitored barriers speak through
  uint64_t monitored_barriers_ = 0;
};

}  // namespace backplane::torch_backend
