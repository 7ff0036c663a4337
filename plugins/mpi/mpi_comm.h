// A communicator of the MPI plugin: an MPI communicator (with MPI_ERRORS_RETURN). Asynchronous bpl calls
// are MPI's non-blocking calls; a blocking bpl call posts the same request and waits for it with the
// communicator's timeout, or, for large collectives, runs MPI's faster blocking form on a worker thread
// and waits for that with the timeout. No call can wait forever on a peer that never comes.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backplane/plugin.h"
#include "op_queue.h"

namespace backplane::mpi_plugin {

// Process-wide MPI facts, fixed once MPI is initialised.
struct MpiProcess {
  int thread_level = MPI_THREAD_SINGLE;  // granted by MPI_Init_thread (or the embedder's init)
  std::mutex* serialize = nullptr;       // held around MPI calls unless MPI_THREAD_MULTIPLE was granted
  int tag_upper_bound = 32767;
  // Set once any communicator of the process failed: MPI_Finalize would then wait for the failed peer.
  mutable std::atomic<bool> communicator_failed{false};
};

class MpiComm;

// One posted MPI operation and what to do once it completes (narrow a widened result, …).
class Request {
 public:
  // The operation is bounded by the communicator's timeout from now (it is posted right after).
  Request(MpiComm* comm, const char* op);
  ~Request();

  MPI_Request* handle() { return &request_; }
  MpiComm& comm() { return *comm_; }
  std::vector<char>& buffer(size_t i) { return buffers_[i]; }  // staging owned by the request
  void on_complete(std::function<void()> fn) { on_complete_ = std::move(fn); }

  // Completes an operation MPI ran as a blocking call: its status, after the on_complete work.
  bpl_status finish(int mpi_error);
  const std::string& message() const { return message_; }
  // *done = 1 once complete, or once the communicator's timeout passed (the operation ended with
  // BPL_ERR_TIMEOUT); returns the operation's status then (and on every later call).
  bpl_status test(int32_t* done);
  // Polls until done or `timeout` passes (BPL_ERR_TIMEOUT; the request stays in flight).
  bpl_status wait(std::chrono::milliseconds timeout);
  // Ends the operation with BPL_ERR_TIMEOUT and poisons the communicator; MPI keeps the request.
  void expire();
  // True while MPI owns the request and its buffers (not completed, or expired).
  bool owned_by_mpi() const { return !done_ || expired_; }

 private:
  bpl_status complete(int mpi_error);
  MpiComm* comm_;
  const char* op_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  std::vector<char> buffers_[2];
  std::function<void()> on_complete_;
  std::chrono::steady_clock::time_point deadline_;
  bool done_ = false;
  bool expired_ = false;
  bpl_status status_ = BPL_OK;
  std::string message_;
};

class MpiComm {
 public:
  MpiComm(const MpiProcess& process, MPI_Comm comm, std::chrono::milliseconds timeout);
  ~MpiComm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const MpiProcess& process() const { return process_; }
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed)); }
  // Bounds the operations started from now on.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ms_.store(timeout.count(), std::memory_order_relaxed); }

  // Each posts one MPI request; with req == NULL it also waits for it (bounded by the timeout).
  void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, bpl_plugin_request** req);
  void broadcast(void* buf, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req);
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root,
              bpl_plugin_request** req);
  void allgather(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req);
  void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op,
                      bpl_plugin_request** req);
  void alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req);
  void barrier(bpl_plugin_request** req);
  void send(const void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req);
  void recv(void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req);
  std::unique_ptr<MpiComm> split(int color, int key);

  // Throws Error(MPI's own error string) unless `code` is MPI_SUCCESS.
  void check(int code, const char* call) const;
  // After a timed-out or failed operation the communicator is unusable: later calls fail at once.
  void poison(const std::string& cause);
  // Keeps a request MPI still owns alive after its caller gave up on it.
  void abandon(std::unique_ptr<Request> request);

 private:
  // `post(handle)` posts the operation's non-blocking form into *handle; `post(nullptr)` runs its
  // blocking form (for collectives that have one). An asynchronous call returns the request in *req; a
  // blocking call waits here, through run_blocking when `bytes` (what the call moves per rank) is at
  // least kBlockingCallMinBytes and MPI allows calls from any thread.
  static constexpr size_t kBlockingCallMinBytes = 4096;
  static constexpr size_t kNonBlockingOnly = 0;
  void start(std::unique_ptr<Request> request, size_t bytes, const std::function<int(MPI_Request*)>& post,
             bpl_plugin_request** req);
  void run_blocking(std::unique_ptr<Request> request, const std::function<int(MPI_Request*)>& call);
  void require_usable() const;
  // Tags above the MPI library's MPI_TAG_UB (at least 32767) are refused, naming the bound.
  void check_tag(int tag) const;

  const MpiProcess& process_;
  MPI_Comm comm_;
  std::atomic<int64_t> timeout_ms_;
  int rank_ = 0;
  int size_ = 1;
  std::string poisoned_;
  std::vector<std::unique_ptr<Request>> abandoned_;
  std::unique_ptr<plugin::OpQueue> blocking_calls_;  // the worker of run_blocking, started on first use
};

// MPI's text for an error code.
std::string mpi_error_string(int code);

}  // namespace backplane::mpi_plugin
