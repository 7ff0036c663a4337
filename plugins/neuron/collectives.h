// Communicators of the Neuron plugin: replica groups of the runtime's host-driven collectives
// (nrta_cc_prepare / nrta_cc_schedule on the core's collectives queue). The runtime provides allreduce,
// allgather and reduce-scatter with sum, min and max; broadcast is its allgather (the root's block
// kept), reduce its allreduce (kept on the root), barrier a one-element allreduce. What it lacks
// (send/recv, alltoall, product, average, f64) is reported unsupported, never emulated on the host.
//
// Buffers may be device pointers (bpl_malloc) or host memory. Device buffers go to the runtime as
// slices of their tensors, without copies; host buffers are staged through device tensors the request
// owns, so a host buffer is written only when its request completes, and never after a timeout.
// Like MPI's, a buffer of an operation in flight must not be used by another one until it is waited for.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backplane/plugin.h"
#include "neuron_core.h"
#include "polled_request.h"

namespace backplane::neuron_plugin {

class NeuronComm;

// One scheduled runtime collective, and what to do once it has run (copy results out of staging).
class Request : public plugin::PolledRequest {
 public:
  // The operation is bounded by the communicator's timeout from now (it is scheduled right after).
  Request(NeuronComm& comm, const char* op);

  NeuronComm& comm() { return comm_; }
  // bpl_request_free: one the runtime may still use stays with its communicator, tensors and all.
  static bpl_status free(std::unique_ptr<Request> request);

 private:
  friend class NeuronComm;
  // Asks the runtime whether the sequence number completed, and how.
  void poll() override;
  void expire() override;
  std::chrono::milliseconds timeout() const override;
  std::string uncancellable() const override { return "the Neuron runtime cannot cancel it"; }
  // Ends the operation and lets its tensors go.
  void end(bpl_status status, const std::string& message);

  NeuronComm& comm_;
  nrta_seq_t sequence_ = 0;
  bool scheduled_ = false;             // false: nothing for the runtime to do (zero elements)
  std::vector<OwnedTensor> tensors_;   // alive until the runtime is done with them
  std::function<void()> deliver_;      // copies results to the caller's buffer
};

class NeuronComm {
 public:
  // `group`: the global ranks (device ids) of the members, in communicator order; `rank` is this
  // process's index in it.
  NeuronComm(NeuronCore& core, nrta_error_tracker_t* errors, std::vector<uint32_t> group, int rank, int world_rank,
             int world_size, std::chrono::milliseconds timeout);
  ~NeuronComm();

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed)); }
  // Bounds the operations started from now on.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ms_.store(timeout.count(), std::memory_order_relaxed); }

  int rank() const { return static_cast<int>(cc_.rank); }
  int size() const { return static_cast<int>(cc_.rank_n); }
  NeuronCore& core() { return core_; }
  nrta_error_tracker_t* errors() { return errors_; }

  void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, bpl_plugin_request** req);
  void broadcast(void* buf, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req);
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root,
              bpl_plugin_request** req);
  void allgather(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req);
  void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op,
                      bpl_plugin_request** req);
  void barrier(bpl_plugin_request** req);
  const char* path_of(bpl_collective, uint64_t) const { return "neuron"; }  // for BPL_TRACE
  // MPI_Comm_split over the runtime's allgather; nullptr for BPL_COLOR_UNDEFINED.
  std::unique_ptr<NeuronComm> split(int color, int key);

  // Keeps a request whose operation never completed: the runtime may still use its tensors.
  void abandon(std::unique_ptr<Request> request);

 private:
  // Where a collective's output goes: `bytes` from `offset` of the runtime's output, to `ptr` (NULL:
  // nowhere, as on a reduce's non-root ranks).
  struct Delivery {
    void* ptr;
    size_t bytes;
    size_t offset;
  };
  void run(const char* name, NrtCollective collective, const void* in, size_t in_bytes, size_t out_bytes,
           Delivery delivery, bpl_dtype dtype, bpl_reduce_op op, bpl_plugin_request** req);

  NeuronCore& core_;
  nrta_error_tracker_t* errors_;
  std::vector<uint32_t> group_;
  NrtCcComm cc_{};
  std::atomic<int64_t> timeout_ms_;
  std::mutex abandoned_mutex_;
  std::vector<std::unique_ptr<Request>> abandoned_;
};

}  // namespace backplane::neuron_plugin
