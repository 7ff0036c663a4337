// A communicator of the Gloo plugin: one Gloo context (a full mesh of TCP pairs), the path its
// operations take (shared memory, hierarchical or TCP: collective_paths.h, chosen once), and the
// queue that orders its operations. Collectives block, so asynchronous requests run them on the
// queue's worker; point-to-point transfers are posted at once and only their completion is waited for.
// Defined in gloo_comm.cpp (making, aborting and watching a communicator, its shared memory, posting),
// gloo_collectives.cpp (the collectives and split), gloo_point_to_point.cpp (sends and receives) and
// gloo_failures.cpp (naming a failure, with the peers its PeerDirectory knows); gloo_comm_internal.h
// holds what those files share.
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
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "peer_directory.h"
#include "backplane/plugin.h"
#include "collective_paths.h"
#include "connection_watch.h"
#include "kv_store.h"
#include "fingerprint.h"
#include "op_queue.h"
#include "plugin_support.h"
#include "releasable_context.h"
#include "rendezvous.h"
#include "shm_group.h"
#include "stall_report.h"

namespace backplane::gloo_plugin {

// A request handed to the core as bpl_plugin_request*.
class Request {
 public:
  virtual ~Request() = default;
  virtual bpl_status test(int32_t* done) = 0;
  virtual bpl_status wait(std::chrono::milliseconds timeout) = 0;
  // Waits for the operation to end (bounded), so no buffer is touched after the request is freed.
  virtual bpl_status finish() = 0;
  // bpl_request_free.
  static bpl_status free(std::unique_ptr<Request> request) { return request->finish(); }
};

// What every communicator of one runtime shares: the rendezvous store and the transport device.
struct Shared {
  std::shared_ptr<::gloo::rendezvous::Store> store;
  std::shared_ptr<::gloo::transport::Device> device;
  std::chrono::milliseconds timeout;
  std::shared_ptr<FailureBoard> board;  // each communicator's first failure, and what each rank ran
  std::shared_ptr<ConnectionWatch> watch;  // null for a world of one
  int store_host_rank = -1;  // the world rank whose process hosts the store (and every failure record); -1: none
  std::shared_ptr<TcpStoreServer> server;  // the store this process serves for its peers (rank 0), or null
  // The job's store itself, whose calls fail when it cannot be reached (the agreements of
  // gloo_fault_tolerance.cpp go through it), and its keys' prefix; null for a world of one.
  std::shared_ptr<KvStore> kv;
  std::string prefix;
  std::shared_ptr<KvStore> liveness;  // see Rendezvous::liveness; null where the store cannot tell
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
  const std::string& path() const { return path_->description(); }
  // How many of the communicator's ranks run on this machine (this one included).
  int ranks_on_this_machine() const;
  // How operation `op` (BPL_COLL_*) of `bytes` travels, for BPL_TRACE: "shared memory" (", single
  // copy"), "hierarchical" (each machine's segment and a leaders' mesh), or "tcp" (Gloo's pairs).
  const char* path_of(bpl_collective op, uint64_t bytes) const;

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed)); }
  // Bounds the operations started from now on.
  void set_timeout(std::chrono::milliseconds timeout);
  // Fails every connection of the communicator: operations in flight here end at once with ABORTED,
  // the peers' with a connection error naming this rank (which it first records as the communicator's
  // first failure, within the store's short bound).
  void abort();
  // Going on after a failure (ULFM's semantics; gloo_fault_tolerance.cpp). Revoke: this rank's and
  // every member's operations end with REVOKED naming this rank (recorded in the store, then every
  // connection and the shared memory failed), and so do their later ones.
  void revoke();
  // The members alive agree, through the job's store, on the AND of their flags and on who failed (in
  // ascending order): the store's first decision stands for everyone.
  void agree(int32_t* flags, int32_t* failed, int32_t* num_failed);
  // The survivors of an agreement, as a communicator numbered in their order here.
  std::unique_ptr<GlooComm> shrink(int32_t* failed, int32_t* num_failed);
  // The members and `joiners` newcomers (join), met through the job's lobby in the store: the members
  // keep their ranks, the newcomers follow in the order they came.
  std::unique_ptr<GlooComm> grow(int32_t joiners);
  // A newcomer: takes a place in the job's lobby and waits, up to `timeout`, for a grow to admit it.
  static std::unique_ptr<GlooComm> join(std::shared_ptr<Shared> job, std::chrono::milliseconds timeout);
  // Whether an operation of this communicator has failed (or it was aborted): it meets no peer again.
  bool has_failed() const { return failed_.load(); }
  // Leaving the world after it failed, when no barrier can gather the ranks: where a rank hosts the
  // store, each says it is done with it, and the host waits, within a bound, until the peers still
  // running have said so, lest one lose the failure record it was about to read (it would then name
  // only what it saw itself, such as the connection the host's failure closed).
  void leave_after_failure();

  // The plugin's entries (plugin_entry.h): each runs its operation in this communicator's order, now
  // (req == NULL) or as a request in *req.
  void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, bpl_plugin_request** req) {
    submit(count * plugin::dtype_size(dtype), [=] { run_allreduce(send, recv, count, dtype, op); }, req);
  }
  void broadcast(void* buf, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req) {
    submit(count * plugin::dtype_size(dtype), [=] { run_broadcast(buf, count, dtype, root); }, req);
  }
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root,
              bpl_plugin_request** req) {
    submit(count * plugin::dtype_size(dtype), [=] { run_reduce(send, recv, count, dtype, op, root); }, req);
  }
  void allgather(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req) {
    submit(count * plugin::dtype_size(dtype), [=] { run_allgather(send, recv, count, dtype); }, req);
  }
  void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op,
                      bpl_plugin_request** req) {
    submit(recvcount * plugin::dtype_size(dtype), [=] { run_reduce_scatter(send, recv, recvcount, dtype, op); }, req);
  }
  void alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req) {
    submit(count * plugin::dtype_size(dtype), [=] { run_alltoall(send, recv, count, dtype); }, req);
  }
  void barrier(bpl_plugin_request** req) {
    submit(0, [=] { run_barrier(); }, req);
  }
  // The barrier of bpl_finalize (the core names it as finalizing, not as a bpl_barrier).
  void barrier_at_finalize() {
    submit(0, [=] { run_barrier(); }, nullptr, fingerprint_of(static_cast<bpl_collective>(kFinalizeOp)));
  }
  void gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req) {
    submit(count * plugin::dtype_size(dtype), [=] { run_gather(send, recv, count, dtype, root); }, req);
  }
  void scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req) {
    submit(count * plugin::dtype_size(dtype), [=] { run_scatter(send, recv, count, dtype, root); }, req);
  }
  void allgatherv(const void* send, size_t sendcount, void* recv, plugin::CountsView recvcounts, plugin::CountsView displs,
                  bpl_dtype dtype, bpl_plugin_request** req) {
    submit(sendcount * plugin::dtype_size(dtype), [=, recvcounts = recvcounts.copy(), displs = displs.copy()] {
      run_allgatherv(send, sendcount, recv, recvcounts, displs, dtype);
    }, req);
  }
  void alltoallv(const void* send, plugin::CountsView sendcounts, plugin::CountsView sdispls, void* recv,
                 plugin::CountsView recvcounts, plugin::CountsView rdispls, bpl_dtype dtype, bpl_plugin_request** req) {
    submit(sendcounts.sum() * plugin::dtype_size(dtype),
           [=, sendcounts = sendcounts.copy(), sdispls = sdispls.copy(), recvcounts = recvcounts.copy(),
            rdispls = rdispls.copy()] { run_alltoallv(send, sendcounts, sdispls, recv, recvcounts, rdispls, dtype); },
           req);
  }
  std::unique_ptr<GlooComm> split(int color, int key) {
    std::unique_ptr<GlooComm> child;
    submit(0, [&] { child = run_split(color, key); }, nullptr);
    return child;
  }
  // Point to point: posted now, in call order; completion waited for here (req == NULL) or by a request.
  void send(const void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req);
  void recv(void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req);
  // From whichever rank sends first with `tag`; *source is that rank once done.
  void recv_any(void* buf, size_t count, bpl_dtype dtype, int tag, int32_t* source, bpl_plugin_request** req);

 private:
  friend class CollectivePath;
  friend class ShmPath;
  friend class TcpPath;
  friend class HierarchicalPath;
  // Slot prefixes for the transfers this plugin makes itself; Gloo's own algorithms use 0x01..0x08.
  static constexpr uint8_t kReduceScatterSlotPrefix = 0x40;
  static constexpr uint8_t kPointToPointSlotPrefix = 0x41;
  static constexpr uint8_t kCollectiveSlotPrefix = 0x42;  // gather, scatter, allgatherv, alltoallv

  // Runs `body`, a collective on `bytes` per rank, in this communicator's order, under the identity
  // the core gave it (`otherwise` where the core gave none): now (req == NULL) or as a request in *req.
  // Now, on an idle communicator, it runs on this thread without being copied.
  template <typename Body>
  void submit(size_t bytes, Body&& body, bpl_plugin_request** req, const Fingerprint& otherwise = Fingerprint{}) {
    // Owns `body`: it may run on the worker (queued behind a request), even after a caller gave up.
    auto checked = [this, call = fingerprint_of(plugin::current_operation(), otherwise),
                    body = std::forward<Body>(body)]() mutable {
      try {
        const auto running = begin(call);
        body();
      } catch (...) {
        rethrow_classified(std::current_exception());
      }
    };
    if (req != nullptr) return post(bytes, std::function<void()>(std::move(checked)), req);
    try {
      queue_.run(std::move(checked));
    } catch (const plugin::OpQueue::QueuedFailure&) {
      rethrow_classified(std::current_exception());
    }
  }

  // The operations themselves; they run inside submit's order, each begun as the core numbered it,
  // and block until done.
  void run_allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op);
  void run_broadcast(void* buf, size_t count, bpl_dtype dtype, int root);
  void run_reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root);
  void run_allgather(const void* send, void* recv, size_t count, bpl_dtype dtype);
  void run_reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op);
  void run_alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype);
  void run_barrier();
  void run_gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root);
  void run_scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root);
  void run_allgatherv(const void* send, size_t sendcount, void* recv, const plugin::Counts& recvcounts,
                      const plugin::Counts& displs, bpl_dtype dtype);
  void run_alltoallv(const void* send, const plugin::Counts& sendcounts, const plugin::Counts& sdispls, void* recv,
                     const plugin::Counts& recvcounts, const plugin::Counts& rdispls, bpl_dtype dtype);
  std::unique_ptr<GlooComm> run_split(int color, int key);
  // Makes `call` the running collective, on every path; it runs until the returned mark is dropped
  // (stall_report.h).
  [[nodiscard]] StallReport::Running begin(const Fingerprint& call);
  // The Gloo tag of the running collective: its identity's hash, so that ranks that disagree on it
  // post messages that never match (they stall, time out, and explain_stall says why) instead of one
  // overflowing the other's buffer, which Gloo's transport answers with abort().
  uint32_t tag() const;
  // After a failure on Gloo's transport: the ranks' word on the stalled collective (stall.h), carried
  // through the store, waiting up to `wait` for all of it. The report of MISMATCH when they disagree.
  std::optional<std::string> explain_stall(std::chrono::milliseconds wait);
  // A send or recv that failed: named, explained (a size or tag its peer does not share) and recorded.
  Error point_to_point_failure(const std::exception& e, bool is_send, int peer, int tag, size_t bytes);
  // A per-communicator scratch buffer, reused across operations (they never overlap in time).
  char* scratch(size_t slot, size_t bytes);
  void point_to_point(void* buf, size_t bytes, int peer, int tag, bool is_send, bpl_plugin_request** req);
  // Posts one transfer on Gloo's pairs (slot_prefix: the caller's send/recv or a collective's) and
  // returns what waits, within the timeout, for its end.
  std::function<void()> post_pair_transfer(void* buf, size_t bytes, int peer, int tag, bool is_send, uint8_t slot_prefix);
  // The same for a caller's recv from any rank, whose wait also writes the sender to *source.
  std::function<void()> post_pair_recv_from_any(void* buf, size_t bytes, int tag, int32_t* source);
  // The Gloo slot of a transfer of `bytes` with `tag`: the prefix, the tag and a hash of the size.
  static uint64_t slot_of(uint8_t slot_prefix, int tag, size_t bytes);
  // Maps the shared-memory segment of the ranks on this machine, and connects the leaders' mesh when
  // the ranks span machines (BPL_GLOO_SHM); sets path_, which owns them.
  void set_up_shared_memory(::gloo::rendezvous::Store& store);
  std::unique_ptr<ShmGroup> map_machine_segment(::gloo::rendezvous::Store& store, const std::vector<int>& local_ranks,
                                                bool wanted, std::string& refusal);
  // The sockets of this communicator's pairs (and of the leaders' mesh), found among the process's
  // descriptors by their local address (unique: each pair listened on a port of its own, or connected
  // from one), held through descriptors of its own and put under the connection watch.
  void watch_connections();
  // Shuts down every one of those sockets: each pair then sees its connection end, fails, and wakes
  // its waiters, as when a peer dies (Gloo's closeConnections only closes them, which wakes no one,
  // and its call that fails a pair is protected); the peers see this rank's connections end. Then
  // releases the contexts (ReleasableContext): the waits a failed pair leaves asleep end too.
  void shut_down_connections();
  // The watch's call when a connection of this communicator ends: unless that peer left normally (it
  // destroyed the communicator, and said so first), fail every connection here too, after saying in
  // the store which peer's end this rank follows (when the communicator spans machines and has more
  // than two ranks: a third rank that sees this rank's connections end then names that peer, not
  // this rank).
  void connection_ended(int peer);
  // Waits (200 ms at most) until Gloo has read what `peer` sent before its connection ended: the watch
  // sees the end when it arrives, perhaps before Gloo's thread read the bytes ahead of it, and an
  // operation those bytes complete (a peer that finished it, then left) must not be failed.
  void let_gloo_read_what_arrived(int peer) const;
  // The rank whose connection's end made `peer` close its own connections, as it said in the store
  // before closing them; `peer` itself when it said nothing (it ended, or failed on its own).
  int closed_after(int peer) const;
  // Where a third rank could blame the wrong one: no segment naming ended processes, more than 2 ranks.
  bool says_whose_end_it_follows() const { return !path_->segment_holds_every_rank() && size() > 2; }
  std::string closed_after_key(int rank) const { return uid_ + "/closed_after/" + std::to_string(rank); }
  // The rank a closed_after record names, if it is a valid one other than this rank; else `peer`.
  int cause_in(const std::optional<std::string>& said, int peer) const;
  // Queues `body`, an operation on `bytes` per rank, behind this communicator's earlier operations,
  // as the request in *req.
  void post(size_t bytes, std::function<void()> body, bpl_plugin_request** req);
  // Throws what a body threw as the plugin's Error: Gloo's and the queue's failures classified, the
  // plugin's own and bad_alloc as they are.
  [[noreturn]] void rethrow_classified(const std::exception_ptr& thrown);
  // " (…)" naming the peer behind a failed operation's `message`, or "" when none can be named.
  // `pair_peer`: the peer whose connection Gloo's failure came from, when the operation tells (a send
  // or recv fails only by its own pair); -1 for a collective, whose message's address is looked up.
  std::string failed_peers_note(const std::string& message, bpl_status status, int pair_peer = -1) const;
  // " (rank R at HOST is unreachable: …)" for each peer on another machine whose connection waits
  // unanswered (peer_reachability.h), or "".
  std::string unreachable_peers_note() const;
  // What a failed Gloo call becomes: its status, its message with the peer's rank named, and, if the
  // group is now broken, every connection closed so that the peers fail at once instead of waiting
  // out their timeout. A rank that fails because a peer closed on it reports the communicator's first
  // failure (recorded in the store), so that every rank names the same cause.
  Error failure(const std::exception& e);
  // The status of an operation's exception (classify_exception), seen on this communicator: once a
  // peer's connection ended, the pairs released under operations still running may trip Gloo's
  // transport on a closed descriptor (an enforce, not an IoException), which that end caused: REMOTE.
  bpl_status status_of(const std::exception& e) const;
  // How long a failure waits, before it records itself, for a rank of another machine to record the
  // cause (see the definition).
  std::chrono::milliseconds record_defer(bpl_status status, const std::string& peers_note) const;
  struct Agreement {
    int32_t flags;
    std::vector<int32_t> failed;  // ascending
  };
  // One agreement (numbered by agreements_, alike on every member), counting as failed a member that
  // has not taken part after `patience`, and without waiting the members `counted_out` (ascending) by an
  // agreement before: see agree.
  Agreement run_agreement(int32_t flags, std::chrono::milliseconds patience,
                          const std::vector<int32_t>& counted_out = {});
  // Whether member `member`'s process is known to have ended (gloo_fault_tolerance.cpp).
  bool has_ended(int member) const;
  // A step of a recovery, told to newcomers waiting in the lobby; and the members a shrink counts out,
  // told to the launcher (arrival.h's counted_out_key).
  void say_recovering();
  void say_counted_out(const std::vector<int32_t>& members);
  // The rank of the member that revoked this communicator, when one did (read from the store), or -1.
  int revoked_by() const;
  // Records a REMOTE, TIMEOUT or MISMATCH failure as the communicator's first unless one was recorded
  // before (or, with `defer`, is recorded by another rank within that long), shuts the connections
  // down, and returns the first failure; a MISMATCH, which names every rank's call, is returned as
  // found here (any other status is returned as is, nothing recorded).
  Error recorded_failure(bpl_status status, const std::string& message,
                         std::chrono::milliseconds defer = std::chrono::milliseconds(0));

  std::shared_ptr<Shared> shared_;
  std::string uid_;
  std::atomic<int64_t> timeout_ms_;
  std::shared_ptr<ReleasableContext> context_;
  PeerDirectory peers_;  // each rank's process and machine, and the rank behind each connection end
  struct PairSocket {
    int fd;    // this communicator's own descriptor of the socket (closed with it)
    int peer;  // rank in this communicator
  };
  std::vector<PairSocket> sockets_;
  ConnectionWatch::Handle watched_ = 0;
  std::unique_ptr<StallReport> stall_report_;  // collectives over TCP, at info level; else null
  std::atomic<int> first_ended_{-1};  // the peer whose connection the watch saw end first
  // This rank ended its connections for a cause of its own (its abort, revoke, or a failure no peer's
  // end caused): the ends its watch then sees follow no peer's.
  std::atomic<bool> ended_own_connections_{false};
  std::unique_ptr<CollectivePath> path_;  // how the operations travel (collective_paths.h)
  plugin::OpQueue queue_;
  Fingerprint current_;  // the collective running now
  std::atomic<bool> aborted_{false};
  std::atomic<bool> revoked_{false};  // by this rank
  uint32_t agreements_ = 0;           // agreements (and shrinks) run so far: numbers the next
  uint32_t grows_ = 0;                // grows run so far: numbers the next
  // Set on this rank's first failure or abort: the communicator then does not leave normally.
  std::atomic<bool> failed_{false};
  std::vector<std::vector<char>> scratch_;
};

// Maps what Gloo, LibTorch or the plugin threw to a status: Gloo's timeouts to TIMEOUT, its I/O
// errors (a peer closed or reset the connection) to REMOTE.
bpl_status classify_exception(const std::exception& e);

}  // namespace backplane::gloo_plugin
