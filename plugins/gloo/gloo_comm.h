// A communicator of the Gloo plugin: one Gloo context (a full mesh of TCP pairs) plus the queue that
// orders its operations. Collectives block in Gloo, so asynchronous requests run them on the queue's
// worker; point-to-point transfers are posted at once and only their completion is waited for.
#pragma once

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backplane/plugin.h"
#include "op_queue.h"
#include "plugin_support.h"
#include "rendezvous.h"
#include "shm_group.h"

namespace backplane::gloo_plugin {

// A request handed to the core as bpl_plugin_request*.
class Request {
 public:
  virtual ~Request() = default;
  virtual bpl_status test(int32_t* done) = 0;
  virtual bpl_status wait(std::chrono::milliseconds timeout) = 0;
  // Waits for the operation to end (bounded), so no buffer is touched after the request is freed.
  virtual bpl_status finish() = 0;
};

// What every communicator of one runtime shares: the rendezvous store and the transport device.
struct Shared {
  std::shared_ptr<::gloo::rendezvous::Store> store;
  std::shared_ptr<::gloo::transport::Device> device;
  std::chrono::milliseconds timeout;
  FirstRecord record_first;  // each communicator's first failure, so that ranks name its cause alike
};

using plugin::Error;

class GlooComm {
 public:
  // Connects the full mesh of `size` ranks whose store keys live under `uid`, within `timeout`,
  // which then bounds each of its operations.
  GlooComm(std::shared_ptr<Shared> shared, std::string uid, int rank, int size, std::chrono::milliseconds timeout);
  ~GlooComm();

  int rank() const { return context_->rank; }
  int size() const { return context_->size; }
  // How its collectives travel: "shared memory (…)", "shared memory within each of N machines, …" or
  // "gloo over tcp (…)".
  const std::string& path() const { return path_; }

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed)); }
  // Bounds the operations started from now on.
  void set_timeout(std::chrono::milliseconds timeout);
  // Closes every connection of the communicator: operations in flight here end at their timeout at
  // the latest, the peers' at once with a connection error naming this rank. Never blocks.
  void abort();

  // Runs `body` in this communicator's order: now (req == NULL) or as a request in *req. Now, on an
  // idle communicator, it runs on this thread without being copied.
  template <typename Body>
  void submit(Body&& body, bpl_plugin_request** req) {
    // Owns `body`: it may run on the worker (queued behind a request), even after a caller gave up.
    auto checked = [this, body = std::forward<Body>(body)]() mutable {
      try {
        body();
      } catch (...) {
        rethrow_classified(std::current_exception());
      }
    };
    if (req != nullptr) return post(std::function<void()>(std::move(checked)), req);
    try {
      queue_.run(std::move(checked));
    } catch (const plugin::OpQueue::QueuedFailure&) {
      rethrow_classified(std::current_exception());
    }
  }

  // The operations themselves; they run inside submit's order and block until done.
  void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op);
  void broadcast(void* buf, size_t count, bpl_dtype dtype, int root);
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root);
  void allgather(const void* send, void* recv, size_t count, bpl_dtype dtype);
  void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op);
  void alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype);
  void barrier();
  std::unique_ptr<GlooComm> split(int color, int key);

  // Point to point: posted now, in call order; completion waited for here (req == NULL) or by a request.
  void send(const void* buf, size_t bytes, int peer, int tag, bpl_plugin_request** req);
  void recv(void* buf, size_t bytes, int peer, int tag, bpl_plugin_request** req);

 private:
  uint32_t next_tag() { return next_tag_++; }
  // A per-communicator scratch buffer, reused across operations (they never overlap in time).
  char* scratch(size_t slot, size_t bytes);
  void point_to_point(void* buf, size_t bytes, int peer, int tag, bool is_send, bpl_plugin_request** req);
  // Publishes this rank's process and its end of each connection, and learns the peers', so that a
  // failure can name the rank behind it.
  void learn_peers(::gloo::rendezvous::Store& store);
  // Adds the addresses the peers' pairs announced before connecting, from Gloo's rendezvous records.
  void learn_announced_addresses(::gloo::rendezvous::Store& store);
  // Maps the shared-memory segment of the ranks on this machine, and connects the leaders' mesh when
  // the ranks span machines (BPL_GLOO_SHM); sets path_.
  void set_up_shared_memory(::gloo::rendezvous::Store& store);
  std::unique_ptr<ShmGroup> map_machine_segment(::gloo::rendezvous::Store& store, const std::vector<int>& local_ranks,
                                                bool wanted, std::string& refusal);
  // Spanning machines, with a segment on at least one: collectives with a hierarchical form use it.
  bool hierarchical() const { return machine_shm_ != nullptr || leaders_ != nullptr; }
  void hierarchical_allreduce(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op);
  // Queues `body` behind this communicator's earlier operations, as the request in *req.
  void post(std::function<void()> body, bpl_plugin_request** req);
  // Throws what a body threw as the plugin's Error: Gloo's and the queue's failures classified, the
  // plugin's own and bad_alloc as they are.
  [[noreturn]] void rethrow_classified(const std::exception_ptr& thrown);
  // Runs one hierarchical collective, carrying a failure on one machine to all the others.
  template <typename Body>
  void across_machines(Body&& body);
  // " (…)" naming the peer behind a failed operation's `message`, or "" when none can be named.
  std::string failed_peers_note(const std::string& message, bpl_status status) const;
  // What a failed Gloo call becomes: its status, its message with the peer's rank named, and, if the
  // group is now broken, every connection closed so that the peers fail at once instead of waiting
  // out their timeout. A rank that fails because a peer closed on it reports the communicator's first
  // failure (recorded in the store), so that every rank names the same cause.
  Error failure(const std::exception& e);
  // Records a REMOTE or TIMEOUT failure as the communicator's first unless one was recorded before
  // (or, with `defer`, is recorded by another rank within that long), closes the connections, and
  // returns the first failure (any other status is returned as is).
  Error recorded_failure(bpl_status status, const std::string& message,
                         std::chrono::milliseconds defer = std::chrono::milliseconds(0));

  std::shared_ptr<Shared> shared_;
  std::string uid_;
  std::atomic<int64_t> timeout_ms_;
  std::shared_ptr<::gloo::Context> context_;
  // A peer's connection end or announced address, as Gloo writes them → its rank.
  std::map<std::string, int> peer_of_address_;
  std::vector<pid_t> local_pid_of_peer_;  // by rank; 0 for this rank and for peers on other machines
  std::vector<int> machine_of_rank_;      // machines numbered in order of their lowest rank
  std::unique_ptr<ShmGroup> shm_;  // set when every rank runs on this machine: collectives go through it
  // The hierarchical path (ranks span machines, some share one): this machine's ranks' segment (none
  // if this rank is alone on it), and on each machine's lowest rank a mesh of one rank per machine.
  std::unique_ptr<ShmGroup> machine_shm_;
  std::shared_ptr<::gloo::Context> leaders_;
  uint32_t next_leaders_tag_ = 0;
  std::string path_ = "single rank";
  plugin::OpQueue queue_;
  uint32_t next_tag_ = 0;
  uint32_t splits_ = 0;
  std::vector<std::vector<char>> scratch_;
};

// Maps what Gloo, LibTorch or the plugin threw to a status: Gloo's timeouts to TIMEOUT, its I/O
// errors (a peer closed or reset the connection) to REMOTE.
bpl_status classify_exception(const std::exception& e);

}  // namespace backplane::gloo_plugin
