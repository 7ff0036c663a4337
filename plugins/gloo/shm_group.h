// The shared-memory path of a Gloo communicator whose ranks all run on one machine: one POSIX shared
// memory segment per communicator, through which collectives copy in, reduce and copy out, with no
// socket involved. Communicators that span machines do not have one and go through Gloo over TCP.
//
// Layout: a header (the failure record, the count of sleeping waiters), one progress record per rank,
// two buffers of one slot per rank, then a mailbox per ordered pair of ranks (send/recv) and each
// pair's staging area. A collective is a sequence of steps; in step s a rank writes into its own slot
// of buffer s % 2, publishes s, waits until every peer published s, and reads. A peer that published s has finished reading step s - 1, so
// this rank may then write buffer (s+1) % 2 again: no other synchronisation guards a slot's reuse.
//
// Single copy: where the kernel lets the ranks read each other's memory (Linux cross-memory attach,
// process_vm_readv, as Open MPI's shared-memory transport uses), the collectives that only move data
// (broadcast, allgather, alltoall, gather, scatter and the v-forms) skip the segment at middling sizes
// (kSingleCopyMinBytes): each rank publishes its buffers' addresses in a step and reads its peers' data
// straight from their buffers, or writes into theirs (process_vm_writev: a broadcast's root, a
// gather's other ranks), so that every rank's core copies: one copy instead of two, and two steps in
// all instead of one per slot's worth. Above kSingleCopyMaxBytes the segment is faster again (the
// kernel's copy pins every page first), except for a scatter. Send and recv go that way at every size,
// through a mailbox per pair of ranks (see post_send). Whether every rank may is settled once,
// collectively (enable_single_copy).
//
// Waiting: a spin (20 us then yields where the machine's ranks outnumber its cores, else 1 ms without
// yielding), then futex waits in slices; every slice checks the deadline (the communicator's
// timeout), the failure record, and whether a peer's process has ended. A wait that
// ends within its first spins reads no clock: on a virtual machine a read is a noticeable share of a
// small collective's time (bench/results/design-choices.md#shared-memory-waits).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backplane/backplane.h"
#include "dtypes.h"
#include "fingerprint.h"
#include "plugin_support.h"

namespace backplane::gloo_plugin {

// An operation's deadline: `timeout` from the first time one of its waits does not end at once, when
// the clock is first read. Before that, every wait ended within its first spins, so the operation is
// progressing.
class Deadline {
 public:
  explicit Deadline(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  std::chrono::steady_clock::time_point at() const {
    if (at_ == std::chrono::steady_clock::time_point{}) at_ = plugin::deadline_after(timeout_);
    return at_;
  }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::chrono::milliseconds timeout_;
  mutable std::chrono::steady_clock::time_point at_{};
};

class ShmGroup {
 public:
  // Bytes of one rank's slot in one buffer: the largest piece a step moves per rank.
  static constexpr size_t kSlotBytes = 256 * 1024;
  // Up to this many bytes an allreduce is one step, every rank reducing the whole message; above it,
  // each rank reduces its share of every chunk (reduce-scatter) and then copies out the rest (all-gather),
  // which is the faster from 8 KiB (bench/results/design-choices.md#shared-memory-algorithms-by-size).
  static constexpr size_t kFlatAllreduceBytes = 4 * 1024;
  // Where single copy is enabled, the sizes (of a rank's largest buffer) at which allgather, alltoall,
  // gather and the v-forms (the ranks' largest block times their number), broadcast and scatter take
  // it. Allreduce and reduce_scatter never do: staging through the segment is faster at every size.
  // Below kSingleCopyMinBytes the system calls and the extra step cost more than the copy saves; above
  // kSingleCopyMaxBytes the kernel's copies, which pin every page first, fall behind memcpy's. A
  // broadcast's root, which reading peers would leave idle, writes a share of each peer's buffer itself
  // (ShmGroup::broadcast), and a gather's ranks write their blocks into the root's buffer, so that every
  // core copies; a scatter reads at every size from kSingleCopyMinBytes, as staged its root would copy
  // every block itself (bench/results/design-choices.md#shared-memory-algorithms-by-size).
  static constexpr size_t kSingleCopyMinBytes = 256 * 1024;
  static constexpr size_t kSingleCopyMaxBytes = 4 * 1024 * 1024;
  static constexpr size_t kSingleCopyBroadcastMaxBytes = 16 * 1024 * 1024;
  static constexpr size_t kSingleCopyScatterMaxBytes = SIZE_MAX;

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

  // Collective: every rank checks that it can read each peer's memory, and single copy is enabled
  // only where all can (and `wanted`). Returns "" when enabled, else why not, the same on every rank.
  std::string enable_single_copy(bool wanted, std::chrono::milliseconds timeout);
  bool single_copy() const { return single_copy_; }
  // How an operation `op` (BPL_COLL_*) whose largest buffer holds `bytes` moves here, for BPL_TRACE:
  // "shared memory" (through the segment) or "shared memory, single copy" (the peers' buffers read).
  const char* path_of(bpl_collective op, uint64_t bytes) const;
  // Send and recv: through the mailboxes where single copy is enabled, else not here.
  static bool through_mailboxes(bpl_collective op) { return op == BPL_COLL_SEND || op == BPL_COLL_RECV; }

  // Point to point, where single copy is enabled. A send announces its buffer in the mailbox of the
  // pair (this rank, peer) and is done once the peer has read it; a recv takes the oldest announcement
  // of its tag from `peer`, recvs matching in the order they were posted, and reads it straight from
  // the sender's buffer. A small send (kInlineSendBytes) is copied into its announcement instead, and
  // is done at once. A send waits for room when kMailboxSlots earlier sends to that peer are still
  // unmatched. Sizes must agree: a recv of another size fails with MISMATCH, and so does the send,
  // unless it was small.
  static constexpr uint32_t kMailboxSlots = 32;
  // Sends up to this size travel inside the announcement, and are done once announced: below it, two
  // copies through the segment cost less than the system call of a direct read
  // (bench/results/design-choices.md#sends-inside-the-announcement). The mailboxes, size * size of them,
  // then take 33 KiB each: 2.1 MiB for 8 ranks.
  static constexpr size_t kInlineSendBytes = 1024;
  // A larger send, up to staged_send_bytes(), is copied into the pair's staging area where that is free
  // (it holds one send at a time) and copied out by the receiver, which then frees it: below there two
  // copies cost less than the system call and page pinning of reading the sender's buffer
  // (bench/results/design-choices.md#staged-sends). The send is still done once received, so that it
  // learns whether the sizes matched. Each rank's staging areas, one per peer, take at most
  // kStagingBytesPerRank of the segment.
  static constexpr size_t kStagedSendMaxBytes = 64 * 1024;
  static constexpr size_t kStagingBytesPerRank = 256 * 1024;
  // The largest staged send in a group of `size` ranks; 0 where no larger than an inline send.
  static size_t staged_send_bytes(int size);
  // From this size a recv reads the sender's buffer with two threads (read_peer).
  static constexpr size_t kTwoThreadReadBytes = 1024 * 1024;
  struct SendTicket {
    int peer;
    int tag;
    uint64_t bytes;
    uint64_t sequence;  // of the sends from this rank to `peer`
  };
  struct PendingRecv;
  SendTicket post_send(const void* buf, size_t bytes, int peer, int tag, std::chrono::milliseconds timeout);
  void wait_sent(const SendTicket& ticket, std::chrono::milliseconds timeout);
  // A recv's peer that is whichever rank sends first with the tag; PendingRecv::source tells which.
  static constexpr int kAnyRank = -1;
  std::shared_ptr<PendingRecv> post_recv(void* buf, size_t bytes, int peer, int tag);
  // Returns the communicator's rank that sent (for a recv from kAnyRank).
  int wait_received(const std::shared_ptr<PendingRecv>& recv, std::chrono::milliseconds timeout);
  // The same without waiting: whether the send was received, or the recv matched and read (this call
  // reads it where its send has come); each throws what its wait would. A request's polls.
  bool sent(const SendTicket& ticket);
  bool received(const std::shared_ptr<PendingRecv>& recv, int* source);
  // A wait's or a request's deadline passed before its end: a recv (if given) is withdrawn, its buffer
  // the caller's again, and the group fails with TIMEOUT saying `what` (late: rank `peer`, whose
  // process is said to be stopped where it is). Returns the reason.
  std::string give_up(int peer, const std::shared_ptr<PendingRecv>& recv, const std::string& what);

  // Collectives, on this rank's buffers; each wait is bounded by `timeout`. Reductions run in `acc`
  // (the caller has widened the data) with `op` (its sum for AVG); send may equal recv.
  void allreduce(const void* send, void* recv, size_t count, bpl_dtype acc, bpl_reduce_op op,
                 std::chrono::milliseconds timeout);
  void broadcast(void* buf, size_t bytes, int root, std::chrono::milliseconds timeout);
  void allgather(const void* send, void* recv, size_t block_bytes, std::chrono::milliseconds timeout);
  // `send` holds size() blocks of `count` elements of `acc`; this rank's block of the reduction goes to recv.
  void reduce_scatter(const void* send, void* recv, size_t count, bpl_dtype acc, bpl_reduce_op op,
                      std::chrono::milliseconds timeout);
  // `send` holds size() blocks of `block_bytes`, block q for rank q; recv gets block `rank()` of every
  // rank, in rank order. send may equal recv.
  void alltoall(const void* send, void* recv, size_t block_bytes, std::chrono::milliseconds timeout);
  void barrier(std::chrono::milliseconds timeout);
  // ABI 1.3's gather and scatter, in blocks of `block_bytes`: recv on the root, send elsewhere, may be
  // NULL (no in-place form).
  void gather(const void* send, void* recv, size_t block_bytes, int root, std::chrono::milliseconds timeout);
  void scatter(const void* send, void* recv, size_t block_bytes, int root, std::chrono::milliseconds timeout);
  // ABI 1.3's variable-size collectives (no in-place form), in bytes: allgatherv sends this rank's
  // `send_bytes` to every rank and receives block q (bytes[q] at offsets[q] of recv) from rank q;
  // alltoallv sends send_bytes[q] at send_offsets[q] to rank q and receives recv_bytes[q] at
  // recv_offsets[q] from it. `pairing_share` is this rank's share of fingerprint.h's pairing sum of the
  // element counts. A first step checks that the counts pair up, before any data moves (MISMATCH on
  // every rank), and learns the largest block any rank sends; then, like allgather and alltoall, single
  // copy at its sizes or a slot's worth of every block per step.
  void allgatherv(const void* send, size_t send_bytes, void* recv, const plugin::Counts& bytes,
                  const plugin::Counts& offsets, int64_t pairing_share, std::chrono::milliseconds timeout);
  void alltoallv(const void* send, const plugin::Counts& send_bytes, const plugin::Counts& send_offsets,
                 void* recv, const plugin::Counts& recv_bytes, const plugin::Counts& recv_offsets,
                 int64_t pairing_share, std::chrono::milliseconds timeout);

  // Marks the group failed by this rank with `status` and `reason` (the first record wins) and wakes
  // every waiter: every rank's waits then fail at once with the first record's status and reason (an
  // abort is ABORTED on the rank that aborted, REMOTE on the others). `late_rank`: the rank a timeout
  // waited for, which reads the record as the peer giving up on it. Never blocks.
  void fail(bpl_status status, const std::string& reason, int late_rank = -1);
  // The collective the next steps belong to, as the core numbered it (GlooComm::begin): every
  // step compares it as it compares the step's kind and size, so that ranks that disagree on its op,
  // dtype, count, root or reduce op fail with MISMATCH at its first step, whatever bytes they move.
  void set_call(const Fingerprint& call);
  // Whether another rank failed the group (its record is the one every wait throws).
  bool failed_by_another_rank() const;
  // This rank leaves the group on purpose (its communicator is destroyed), before its connections
  // close: a peer whose watch sees them close reads here that it did not fail, without asking the
  // store (which may have ended with the rank that served it).
  void mark_left();
  bool has_left(int index) const;

 private:
  struct Header;
  struct Progress;
  struct Announcement;
  struct Mailbox;
  struct Arrival;
  ShmGroup(void* base, size_t bytes, int rank, int size);
  static size_t header_bytes();
  static size_t buffers_offset(int size);
  static size_t mailboxes_offset(int size);
  static size_t staging_offset(int size);
  // The mailbox of the sends from rank `from` to rank `to`, and its staging area.
  Mailbox& mailbox(int from, int to) const;
  char* staging(int from, int to) const;
  // Takes rank `peer`'s new announcements to this rank and completes the pending recvs they match.
  // Called with p2p_mutex_ held; does nothing once the group has failed (a pending recv's buffer may
  // be gone then).
  void match_arrivals(int peer);
  // match_arrivals for `peer`, or for every peer when it is kAnyRank.
  void match_arrivals_from(int peer);
  // A recv's bytes move only while its receiver reads the sender's buffer, so every wait on shared
  // memory (wait_until) reads for the recvs posted on every group of the process, as MPI's progress
  // rule asks: a rank blocked in a send, a collective or another communicator's wait still completes
  // the recvs it posted, which a peer's blocking send to it may be waiting for. A group is listed from
  // its first pending recv until a pass finds none left; a pass skips a group whose own thread is
  // matching, and never runs with a group's p2p_mutex_ held.
  static void drive_posted_receives() {
    if (groups_receiving_.load(std::memory_order_relaxed) != 0) drive_listed_receives();
  }
  static void drive_listed_receives();
  static inline std::atomic<size_t> groups_receiving_{0};  // listed groups: most waits read only this
  void list_as_receiving();  // under p2p_mutex_
  void withdraw_from_receiving();  // the destructor's
  void withdraw(const std::shared_ptr<PendingRecv>& recv);
  bool receiving_listed_ = false;  // under p2p_mutex_
  // The recvs waiting for `peer` (or kAnyRank); under p2p_mutex_.
  std::deque<std::shared_ptr<PendingRecv>>& pending_of(int peer);

  // Rank `rank`'s slot in the buffer that step `step` writes.
  char* slot(uint32_t step, int rank) const;
  // The step this rank publishes next.
  uint32_t next_step() const { return steps_ + 1; }
  // Publishes this rank's next step, doing `kind` of `bytes`, and returns its number.
  uint32_t publish(uint32_t kind, uint64_t bytes);
  // Waits until every peer published `step`, then checks that they all do what this rank does.
  void wait_for_all(uint32_t step, const Deadline& deadline);
  // The same, except that a group that has failed once every rank arrived is not this wait's error.
  void wait_for_peers(uint32_t step, const Deadline& deadline);
  std::string disagreement_at(uint32_t step) const;
  // Waits until rank `peer` has published step `step`; throws on failure, a peer's end or the deadline.
  void wait_for(int peer, uint32_t step, const Deadline& deadline);
  // Waits until reached() (which `word` changing may make true), with the same spin, yields and futex
  // slices as any wait, bounded by `deadline`; rank `peer`'s end is REMOTE, the deadline a TIMEOUT
  // saying late(). Both fail the group.
  template <typename Reached, typename Late>
  void wait_until(int peer, std::atomic<uint32_t>& word, Reached reached, const Deadline& deadline,
                  Late late);
  [[noreturn]] void throw_failure_record();
  // Publishes this rank's next step with the addresses of its buffers for it, and waits for every
  // peer's: the first step of a single-copy collective. Returns the step.
  uint32_t publish_buffers(uint32_t kind, uint64_t bytes, const void* send, const void* recv,
                           const Deadline& deadline);
  // The second step of a single-copy collective, after which no peer reads this rank's buffers.
  void finish_single_copy(uint32_t kind, uint64_t bytes, const Deadline& deadline);
  // The first step of a variable-size collective `kind` (whose ranks agree on `bytes`): fails with
  // MISMATCH on every rank unless the ranks' pairing shares sum to zero; returns the step and, in
  // *largest, the largest of the ranks' `largest_sent`. In that step's slot this rank leaves
  // `slot_words` for its peers to read (an alltoallv's offsets, for single copy).
  uint32_t agree_on_counts(uint32_t kind, uint64_t bytes, int64_t pairing_share, size_t largest_sent,
                           const std::vector<uint64_t>& slot_words, const Deadline& deadline, size_t* largest);
  // This rank's operand at `own` of a reduction (in rank order) into `result`, or a copy of it where
  // the reduction would overwrite it before reading it.
  const char* own_operand(const char* own, const char* result, size_t bytes);
  // out = inputs[0] op inputs[1] op ... (in rank order, so that every rank computes bit-identical
  // results) over `count` elements of `element` bytes. With `streamed` (plugin::Stores::kStreamed), the
  // last pass writes `out`; the passes before it, on more than 2 ranks, run in partial_, in cache.
  void reduce_in_rank_order(void* out, const std::vector<const char*>& inputs, size_t count, size_t element,
                            plugin::ReduceFn reduce, plugin::ReduceFn streamed = nullptr);
  // Whether collective `op` (not send or recv) whose largest buffer holds `bytes` reads the peers'
  // buffers directly: the one place each operation's sizes are chosen (path_of reports it).
  bool takes_single_copy(bpl_collective op, size_t bytes) const;
  pid_t peer_pid(int peer) const;
  // Copies `n` bytes at `address` in rank `peer`'s process to `to`; on failure, fails the group. With
  // `two_threads`, from kTwoThreadReadBytes a second thread reads half: for a receive, whose sender
  // waits meanwhile, not for a collective's reads, where every rank's thread is reading at once.
  void read_peer(int peer, void* to, uint64_t address, size_t n, bool two_threads = false);
  // Copies `n` bytes from `from` to `address` in rank `peer`'s process; on failure, fails the group.
  void write_peer(int peer, uint64_t address, const void* from, size_t n);
  // process_vm_readv (kRead: from `address` in `pid` to `local`) or process_vm_writev (kWrite: from
  // `local` to there) until all `n` bytes are copied: 0, or errno (EIO when a call copied nothing).
  enum class CrossCopy { kRead, kWrite };
  static int cross_copy(pid_t pid, char* local, uint64_t address, size_t n, CrossCopy direction);
  // What read_peer and write_peer throw when their copy with rank `peer` failed with `error`: the
  // failure record of a peer that failed first, the peer's end, or the failed call. Fails the group.
  [[noreturn]] void fail_cross_copy(int peer, int error, CrossCopy direction);
  class ReadHelper;
  // read_peer's second thread, once a read needed it; used by one receive at a time (they hold
  // p2p_mutex_ while they read).
  std::unique_ptr<ReadHelper> read_helper_;
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
  uint64_t call_hash_ = 0;            // set_call's
  FingerprintWords call_words_{};
  uint64_t words_published_[2] = {0, 0};  // whose fingerprint this rank's record holds, by step parity
  std::vector<const char*> inputs_;  // by rank: a reduction's operands, kept to spare an allocation per call
  bool single_copy_ = false;
  // Point to point, by peer, under p2p_mutex_: sends announced to it, its announcements taken, those
  // not matched yet, and this rank's recvs from it not matched yet, in posting order; then the recvs
  // from any rank, and the count of recvs posted, which orders them with the others.
  std::mutex p2p_mutex_;
  std::vector<uint64_t> sends_announced_;
  std::vector<uint32_t> arrivals_taken_;
  std::vector<std::deque<Arrival>> arrived_;
  std::vector<std::deque<std::shared_ptr<PendingRecv>>> pending_recvs_;
  std::deque<std::shared_ptr<PendingRecv>> pending_from_any_;
  uint64_t recvs_posted_ = 0;
  // How long a small operation's wait spins before it sleeps, in microseconds (shm_internal.h's
  // kLongSpin: adapted to whether peers keep their cores); read and written by every waiting thread.
  std::atomic<uint32_t> long_spin_us_;
  // Sends the receiver refused (by peer and sequence: the size its recv asked for) whose mailbox slot
  // a later send took before they were waited for.
  std::map<std::pair<int, uint64_t>, uint64_t> refused_sends_;
  std::vector<char> scratch_;  // see own_operand
  std::vector<char> partial_;  // see reduce_in_rank_order
  std::vector<pid_t> peer_pids_;
  std::vector<int> communicator_ranks_;
};

}  // namespace backplane::gloo_plugin
