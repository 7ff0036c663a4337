// The shared-memory path of a Gloo communicator whose ranks all run on one machine: one POSIX shared
// memory segment per communicator, through which collectives copy in, reduce and copy out, with no
// socket involved. Communicators that span machines do not have one and go through Gloo over TCP.
//
// Layout: a header (the failure record, the count of sleeping waiters), one progress record per rank,
// then two buffers of one slot per rank. A collective is a sequence of steps; in step s a rank writes
// into its own slot of buffer s % 2, publishes s, waits until every peer published s, and reads. A
// peer that published s has finished reading step s - 1, so this rank may then write buffer (s+1) % 2
// again: no other synchronisation guards a slot's reuse.
//
// Waiting: a short spin, then yields, then futex waits in slices; every slice checks the deadline (the
// communicator's timeout), the failure record, and whether a peer's process has ended.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "dtypes.h"

namespace backplane::gloo_plugin {

class ShmGroup {
 public:
  // Bytes of one rank's slot in one buffer: the largest piece a step moves per rank.
  static constexpr size_t kSlotBytes = 256 * 1024;
  // Up to this many bytes an allreduce is one step, every rank reducing the whole message; above it,
  // each rank reduces its share of every chunk (reduce-scatter) and then copies out the rest (all-gather).
  static constexpr size_t kFlatAllreduceBytes = 16 * 1024;

  // The segment's size for `size` ranks.
  static size_t segment_bytes(int size);
  // A new segment name for a communicator created by process `creator` (this one by default):
  // "/backplane-<pid>-<pid namespace>-<random>", unique per job. The creator's pid and namespace let
  // a later job tell a segment whose creator died before removing its name (remove_abandoned_segments).
  static std::string new_segment_name(pid_t creator = 0);
  // Removes this user's segments whose creator, in this pid namespace, has ended: what a rank 0 killed
  // between creating its segment and the last rank's mapping leaves in /dev/shm. Returns how many.
  static int remove_abandoned_segments();
  // Creates (rank 0) a new segment, or maps the one rank 0 created, under `name` (starting with '/').
  // Throws plugin::Error naming the segment and the system's error.
  static std::unique_ptr<ShmGroup> create(const std::string& name, int size);
  static std::unique_ptr<ShmGroup> open(const std::string& name, int rank, int size);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // The peers' processes (pid by index in this group, 0 for this rank), so that a wait can tell an
  // ended peer, and, when the group is part of a larger communicator, each index's rank in it, which
  // messages name (by default the group's own indices).
  void set_peers(std::vector<pid_t> pids, std::vector<int> communicator_ranks = {}) {
    peer_pids_ = std::move(pids);
    communicator_ranks_ = std::move(communicator_ranks);
  }

  // Collectives, on this rank's buffers; each wait is bounded by `timeout`. Reductions run in `acc`
  // (the caller has widened the data) with `reduce`; send may equal recv.
  void allreduce(const void* send, void* recv, size_t count, bpl_dtype acc, plugin::ReduceFn reduce,
                 std::chrono::milliseconds timeout);
  void broadcast(void* buf, size_t bytes, int root, std::chrono::milliseconds timeout);
  void allgather(const void* send, void* recv, size_t block_bytes, std::chrono::milliseconds timeout);
  // `send` holds size() blocks of `count` elements of `acc`; this rank's block of the reduction goes to recv.
  void reduce_scatter(const void* send, void* recv, size_t count, bpl_dtype acc, plugin::ReduceFn reduce,
                      std::chrono::milliseconds timeout);
  // `send` holds size() blocks of `block_bytes`, block q for rank q; recv gets block `rank()` of every
  // rank, in rank order. send may equal recv.
  void alltoall(const void* send, void* recv, size_t block_bytes, std::chrono::milliseconds timeout);
  void barrier(std::chrono::milliseconds timeout);

  // Marks the group failed by this rank with `status` and `reason` (the first record wins) and wakes
  // every waiter: every rank's waits then fail at once with the first record's status and reason (an
  // abort is ABORTED on the rank that aborted, REMOTE on the others). Never blocks.
  void fail(bpl_status status, const std::string& reason);

 private:
  struct Header;
  struct Progress;
  ShmGroup(void* base, size_t bytes, int rank, int size);
  static size_t header_bytes();
  static size_t buffers_offset(int size);

  // Rank `rank`'s slot in the buffer that step `step` writes.
  char* slot(uint32_t step, int rank) const;
  // The step this rank publishes next.
  uint32_t next_step() const { return steps_ + 1; }
  // Publishes this rank's next step, doing `kind` of `bytes`, and returns its number.
  uint32_t publish(uint32_t kind, uint64_t bytes);
  // Waits until every peer published `step`, then checks that they all do what this rank does.
  void wait_for_all(uint32_t step, std::chrono::steady_clock::time_point deadline);
  // Waits until rank `peer` has published step `step`; throws on failure, a peer's end or the deadline.
  void wait_for(int peer, uint32_t step, std::chrono::steady_clock::time_point deadline);
  [[noreturn]] void throw_failure_record();
  // Group index `index` as messages name it: its rank in the communicator.
  int rank_name(int index) const {
    return communicator_ranks_.empty() ? index : communicator_ranks_[static_cast<size_t>(index)];
  }

  void* base_;
  size_t bytes_;
  int rank_;
  int size_;
  Header* header_;
  Progress* progress_;  // by rank
  uint32_t steps_ = 0;  // this rank's published steps (= its counter)
  std::vector<const char*> inputs_;  // by rank: a reduction's operands, kept to spare an allocation per call
  std::vector<pid_t> peer_pids_;
  std::vector<int> communicator_ranks_;
};

}  // namespace backplane::gloo_plugin
