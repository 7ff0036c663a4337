// How a Gloo communicator's operations travel, chosen once when the communicator is made
// (GlooComm::set_up_shared_memory) and never re-decided per call:
//
//   TcpPath           Gloo's collectives over the communicator's TCP mesh (also a world of one)
//   ShmPath           every rank on this machine: one shared-memory segment (ShmGroup), which the path
//                     owns; sends and receives through its mailboxes where single copy is on
//   HierarchicalPath  ranks on several machines, some sharing one: allreduce, reduce and barrier in two
//                     levels (each machine's segment, then the leaders' Gloo mesh, both the path's)
//
// The other two derive from TcpPath: an operation they do not take over runs on Gloo's TCP mesh.
//
// A path runs an operation that GlooComm has begun (begin: the core's identity of it); sizes are in
// bytes except where a reduction needs elements. Reductions run in the accumulation dtype (dtypes.h):
// when it differs from the caller's, the data is widened into the communicator's scratch, reduced,
// divided for AVG, and narrowed once at the end. What a path's segments know of failures (a rank's
// call, its failure, its leaving) is told through the path too.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backplane/plugin.h"
#include "dtypes.h"
#include "fingerprint.h"
#include "plugin_support.h"
#include "releasable_context.h"
#include "shm_group.h"

namespace backplane::gloo_plugin {

// Calls fn(T{}) with T a type of `dtype`'s size, for Gloo options that only need the element size.
template <typename Fn>
void with_element_type(bpl_dtype dtype, Fn&& fn) {
  plugin::visit_dtype(dtype, std::forward<Fn>(fn));
}

class GlooComm;
class Request;

class CollectivePath {
 public:
  CollectivePath(GlooComm& comm, std::string description) : comm_(comm), description_(std::move(description)) {}
  virtual ~CollectivePath() = default;
  CollectivePath(const CollectivePath&) = delete;
  CollectivePath& operator=(const CollectivePath&) = delete;

  // "shared memory (…)", "shared memory within each of N machines, …", "gloo over tcp (…)".
  const std::string& description() const { return description_; }
  // How operation `op` (BPL_COLL_*) of `bytes` travels, for BPL_TRACE: "shared memory" (", single
  // copy"), "hierarchical" or "tcp" (Gloo's pairs).
  virtual const char* name_of(bpl_collective op, uint64_t bytes) const;

  virtual void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) = 0;
  virtual void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void allgather(const void* send, void* recv, size_t block) = 0;
  virtual void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) = 0;
  virtual void alltoall(const void* send, void* recv, size_t block) = 0;
  virtual void barrier() = 0;
  virtual void gather(const void* send, void* recv, size_t block, int root) = 0;
  virtual void scatter(const void* send, void* recv, size_t block, int root) = 0;
  // `pairing`: the ranks' shares of what each pair exchanges (pairing_share), which a segment checks.
  virtual void allgatherv(const void* send, size_t send_bytes, void* recv, const plugin::Counts& recv_bytes,
                          const plugin::Counts& recv_offsets, int64_t pairing) = 0;
  virtual void alltoallv(const void* send, const plugin::Counts& send_bytes, const plugin::Counts& send_offsets,
                         void* recv, const plugin::Counts& recv_bytes, const plugin::Counts& recv_offsets,
                         int64_t pairing) = 0;

  // The caller's send or recv of `bytes` with `tag`, posted now; returns what waits, within the
  // timeout, for its end. Here: over Gloo's pairs (GlooComm::post_pair_transfer).
  virtual std::function<void()> post_transfer(void* buf, size_t bytes, int peer, int tag, bool is_send);
  // A recv from whichever rank sends first with `tag`, whose wait also writes that rank to *source.
  virtual std::function<void()> post_recv_from_any(void* buf, size_t bytes, int tag, int32_t* source);
  // Either of them as a request, whose end the caller waits for or tests later (`source` non-null: a
  // recv from any rank, `peer` unused). Here a PointToPointRequest of the completion above.
  virtual std::unique_ptr<Request> post_request(void* buf, size_t bytes, int peer, int tag, bool is_send,
                                                int32_t* source);

  // What the path's segments are told of the communicator (none over TCP): the collective about to run
  // (they check that ranks call the same), a failure that ends every wait on them with `status`.
  virtual void set_call(const Fingerprint&) {}
  virtual void fail(bpl_status, const std::string&) {}
  // Whether one segment holds every rank: it then says who left, whose process ended, and explains a
  // mismatch or a stall itself, and the store is not asked.
  virtual bool segment_holds_every_rank() const { return false; }
  // Tells the peers through the segment that this rank leaves normally (false: the path cannot).
  virtual bool say_left() { return false; }
  // Whether `peer` left normally, as the segment says; nullopt where the path cannot tell.
  virtual std::optional<bool> has_left(int) const { return std::nullopt; }
  // Connections of the path's own beyond the communicator's mesh: their local ends (for the connection
  // watch) and their release (GlooComm::shut_down_connections).
  virtual void add_connection_ends(std::map<std::string, int>&) const {}
  virtual void release_connections() {}

 protected:
  // `send` in the accumulation dtype `acc`: widened into scratch slot 0, or copied there (`work` may
  // be given instead, a buffer of the caller's own that is not `send`).
  void* accumulation_copy(const void* send, bpl_dtype dtype, bpl_dtype acc, size_t count, void* work = nullptr);
  // Where a reduce accumulates: `recv` on the root when no widening is needed, else scratch (Gloo's
  // reduce uses its buffer as scratch on every rank, so non-roots never reduce in `recv`).
  void* reduce_work(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_dtype acc, int root);

  GlooComm& comm_;

 private:
  std::string description_;
};

class TcpPath : public CollectivePath {
 public:
  using CollectivePath::CollectivePath;
  void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) override;
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t block) override;
  void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) override;
  void alltoall(const void* send, void* recv, size_t block) override;
  void barrier() override;
  void gather(const void* send, void* recv, size_t block, int root) override;
  void scatter(const void* send, void* recv, size_t block, int root) override;
  void allgatherv(const void* send, size_t send_bytes, void* recv, const plugin::Counts& recv_bytes,
                  const plugin::Counts& recv_offsets, int64_t pairing) override;
  void alltoallv(const void* send, const plugin::Counts& send_bytes, const plugin::Counts& send_offsets, void* recv,
                 const plugin::Counts& recv_bytes, const plugin::Counts& recv_offsets, int64_t pairing) override;

 protected:
  // The reductions proper, on `work` in the accumulation dtype; the hierarchical path replaces them.
  virtual void allreduce_work(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op);
  virtual void reduce_work_to_root(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op, int root);

 private:
  // One transfer of a collective composed of sends and receives.
  struct Transfer {
    void* buffer;
    size_t bytes;
    int peer;
    bool is_send;
  };
  // Posts every transfer (those of no bytes are skipped), runs `meanwhile` (a rank's copy of its own
  // block, while its peers read or write theirs), then waits for them, each within the timeout.
  void exchange(const std::vector<Transfer>& transfers, const std::function<void()>& meanwhile = {});
};

class ShmPath : public TcpPath {
 public:
  ShmPath(GlooComm& comm, std::string description, std::unique_ptr<ShmGroup> segment)
      : TcpPath(comm, std::move(description)), segment_(std::move(segment)) {}
  const char* name_of(bpl_collective op, uint64_t bytes) const override;
  void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) override;
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t block) override;
  void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) override;
  void alltoall(const void* send, void* recv, size_t block) override;
  void barrier() override;
  void gather(const void* send, void* recv, size_t block, int root) override;
  void scatter(const void* send, void* recv, size_t block, int root) override;
  void allgatherv(const void* send, size_t send_bytes, void* recv, const plugin::Counts& recv_bytes,
                  const plugin::Counts& recv_offsets, int64_t pairing) override;
  void alltoallv(const void* send, const plugin::Counts& send_bytes, const plugin::Counts& send_offsets, void* recv,
                 const plugin::Counts& recv_bytes, const plugin::Counts& recv_offsets, int64_t pairing) override;
  std::function<void()> post_transfer(void* buf, size_t bytes, int peer, int tag, bool is_send) override;
  std::function<void()> post_recv_from_any(void* buf, size_t bytes, int tag, int32_t* source) override;
  // Through the mailboxes, a request that the rank's waits and its tests move on (MailboxRequest).
  std::unique_ptr<Request> post_request(void* buf, size_t bytes, int peer, int tag, bool is_send,
                                        int32_t* source) override;
  void set_call(const Fingerprint& call) override { segment_->set_call(call); }
  void fail(bpl_status status, const std::string& reason) override { segment_->fail(status, reason); }
  bool segment_holds_every_rank() const override { return true; }
  bool say_left() override {
    segment_->mark_left();
    return true;
  }
  std::optional<bool> has_left(int peer) const override { return segment_->has_left(peer); }

 private:
  std::unique_ptr<ShmGroup> segment_;
};

class HierarchicalPath : public TcpPath {
 public:
  // `machine_segment`: this machine's ranks' (null where this rank is alone on it); `leaders`: on each
  // machine's lowest rank, a mesh of one rank per machine (else null).
  HierarchicalPath(GlooComm& comm, std::string description, std::unique_ptr<ShmGroup> machine_segment,
                   std::shared_ptr<ReleasableContext> leaders)
      : TcpPath(comm, std::move(description)), machine_segment_(std::move(machine_segment)), leaders_(std::move(leaders)) {}
  const char* name_of(bpl_collective op, uint64_t bytes) const override;
  void barrier() override;
  void set_call(const Fingerprint& call) override {
    if (machine_segment_) machine_segment_->set_call(call);
  }
  void fail(bpl_status status, const std::string& reason) override {
    if (machine_segment_) machine_segment_->fail(status, reason);
  }
  void add_connection_ends(std::map<std::string, int>& peer_of_end) const override;
  void release_connections() override {
    if (leaders_) leaders_->release();
  }

 protected:
  // Within each machine through its segment, between machines over the leaders' mesh, then from each
  // leader back to its machine: every rank ends with the leaders' result, bit-identical everywhere.
  void allreduce_work(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op) override;
  void reduce_work_to_root(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op, int) override {
    allreduce_work(work, count, acc, op);
  }

 private:
  // Runs one collective of the two levels. A failure on this machine's segment reaches the other
  // machines as the leaders' mesh and the communicator's connections close (their leaders then fail
  // their own segments); a failure between machines reaches this machine's ranks through its segment's
  // failure record. Either way the communicator's first failure is recorded in the store, so every
  // rank names the same cause.
  void across_machines(const std::function<void()>& body);

  std::unique_ptr<ShmGroup> machine_segment_;
  std::shared_ptr<ReleasableContext> leaders_;
};

}  // namespace backplane::gloo_plugin
