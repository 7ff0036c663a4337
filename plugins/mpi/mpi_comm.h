// A communicator of the MPI plugin: an MPI communicator (with MPI_ERRORS_RETURN) and a duplicate of it
// on which the plugin's own schedules run and the ranks compare what they call (fingerprint.h).
// Defined in mpi_comm.cpp (making, splitting, failing and explaining a communicator), mpi_requests.cpp
// (Request) and mpi_collectives.cpp (the collectives and point-to-point calls); mpi_internal.h holds
// what those files share.
//
// Every bpl call is a schedule of the plugin's own of MPI's non-blocking point-to-point calls
// (schedules.h: every collective), or MPI's own non-blocking call (send, recv, and collectives beyond
// MPI's int counts or on one rank), tested here (blocking) or through its request until it completes
// or the communicator's timeout passes. MPI progresses only inside its calls, so a wait keeps
// testing, without pause while the operation may be moving its bytes, then with growing pauses: a rank
// waiting for a stopped or missing peer costs about one test a millisecond, not a core.
//
// Ranks that disagree on a transfer's size must not let MPI write past a buffer: Open MPI 4.1's
// shared-memory single copy (CMA) reads a larger message whole into a smaller buffer (any message
// above its eager limit, btl_vader_eager_limit with its headers: MpiProcess::eager_bytes). So messages travel in two size classes under tags apart (wire_tag): a
// receive of up to the eager size is posted at once and can only meet messages MPI copies eagerly,
// at most what was posted (a longer one is MPI_ERR_TRUNCATE, a shorter one counted: MISMATCH either
// way); a larger receive matches its message by probe and checks its size before receiving it
// (MISMATCH at once on the rank it reaches, nothing received). A receive and a message of different
// classes never meet: the receive's timeout names both sizes (recv), or the fingerprints do
// (collectives). Ranks calling different collectives (or, up to the eager size in all, different
// counts) post messages whose tags (the call's hash) never match: they stall, and at the timeout the
// fingerprints say what each called (below). MPI's own collectives (beyond int counts) exchange
// fingerprints first, before any data moves.
//
// An operation that times out (or is aborted) cannot be cancelled: MPI keeps the request and its
// buffers, and the communicator refuses every later operation. Before it reports the timeout, a rank
// exchanges on the duplicate what it was calling, for a moment: ranks that called different
// operations are MISMATCH naming them; otherwise the peers of this machine that are stopped are named.
//
// This is the plugin's one way to run an operation: MPI's own blocking calls would save at most a tenth
// of a microsecond per small call and keep none of those promises (bench/results/design-choices.md).
#pragma once

#include <mpi.h>
#include <sys/types.h>

#include <atomic>
#include <climits>
#include <chrono>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backplane/plugin.h"
#include "fingerprint.h"
#include "plugin_support.h"
#include "polled_request.h"
#include "schedules.h"

namespace backplane::mpi_plugin {

// Process-wide MPI facts, fixed once MPI is initialised.
struct MpiProcess {
  int thread_level = MPI_THREAD_SINGLE;  // granted by MPI_Init_thread (or the embedder's init)
  std::mutex* serialize = nullptr;       // held around MPI calls unless MPI_THREAD_MULTIPLE was granted
  int tag_upper_bound = 32767;
  // The tag's bits, all below MPI_TAG_UB: 31 on Open MPI, 29 on MPICH, at least 15 on any MPI.
  int tag_bits() const {
    int bits = 0;
    while (bits < 31 && (int64_t{1} << (bits + 1)) - 1 <= tag_upper_bound) ++bits;
    return bits;
  }
  // The largest message MPI copies eagerly, writing at most what the receive posted (eager_message_bytes
  // in mpi_plugin.cpp); a larger one may be written whole (the file comment of mpi_comm.h).
  size_t eager_bytes = 4096 - 128;
  // Set once any communicator of the process failed: MPI_Finalize would then wait for the failed peer.
  mutable std::atomic<bool> communicator_failed{false};
};

class MpiComm;

// What an operation needs besides its MPI request: its schedule, its rounds' bookkeeping and its
// staging buffers. The communicator keeps one between operations (MpiComm::take_state), so that a
// small operation allocates nothing but its Request.
struct RunState {
  Schedule schedule;
  std::vector<MPI_Request> requests;       // of the round in flight
  std::vector<MPI_Status> statuses;        // per request
  std::vector<const Transfer*> transfers;  // per request
  std::vector<int> expected;               // per request: the bytes a receive expects; -1 for a send, or once checked
  std::vector<char> buffers[3];            // staging: conversions, scratch
  std::vector<int> counts;                 // MPI's int counts and displacements
};

// One bpl operation: the plugin's own schedule, or MPI's request (after a size agreement for a large
// collective of MPI's own, after the matching probe for a recv), and what to do once it completes
// (narrow a widened result, …).
class Request : public plugin::PolledRequest {
 public:
  // Posts the operation the core is starting (its identity: plugin.h's bpl_operation_identity), or
  // its agreement or probe first; bounded by the communicator's timeout from now. `post(handle)` posts
  // the operation's non-blocking form into *handle. `own`: what the plugin's own exchanges, which no
  // call of the core starts (a communicator's making), are.
  Request(MpiComm* comm, const char* op, size_t bytes, std::function<int(MPI_Request*)> post,
          const Fingerprint& own = Fingerprint{});
  // A recv: matched by probe in posting order, its size checked before it is received.
  Request(MpiComm* comm, void* buf, int count, MPI_Datatype type, size_t bytes, int peer, int tag);
  ~Request() override;

  MpiComm& comm() { return *comm_; }
  const Fingerprint& signature() const { return fingerprint_; }  // what it runs
  // Staging buffer `i` (0-2) of at least `bytes`, owned by the request until it ends.
  char* staging(size_t i, size_t bytes) {
    std::vector<char>& buffer = state_->buffers[i];
    if (buffer.size() < bytes) buffer.resize(bytes);
    return buffer.data();
  }
  std::vector<int>& counts() { return state_->counts; }  // MPI's int counts and displacements, kept until it ends
  void on_complete(std::function<void()> fn) { on_complete_ = std::move(fn); }
  // The operation as the plugin's own rounds (schedules.h) instead of one MPI request: fill this
  // (empty) schedule, then run_schedule.
  Schedule& schedule() { return state_->schedule; }
  // Runs schedule()'s transfers on the communicator's duplicate under the next schedule tag, their folds
  // with `reduce` (nullptr where no round folds); each receive above the eager size probed (the file
  // comment).
  void run_schedule(plugin::ReduceFn reduce = nullptr);
  // What a recv matches on.
  std::tuple<MpiComm*, int, int> match_key() const { return {comm_, peer_, tag_}; }
  // bpl_request_free: one MPI still owns stays with its communicator (MPI cannot cancel it).
  static bpl_status free(std::unique_ptr<Request> request);

 private:
  friend class MpiComm;
  enum class Phase { kAgreeing, kProbing, kDraining, kRunning };
  // Moves the operation on (step), then the communicator's other asynchronous operations that no
  // thread is moving now (MpiComm::progress_others).
  void poll() override;
  // Moves the operation on: agreement → post, probe → receive, MPI_Test, a schedule's next round.
  // Under step_mutex_ where the operation is asynchronous.
  void step();
  // Ends the operation with BPL_ERR_TIMEOUT (explained: see the file's comment) and fails the
  // communicator; MPI keeps the request.
  void expire() override;
  std::chrono::milliseconds timeout() const override;
  bool aborted() const override;
  std::string uncancellable() const override { return "MPI cannot cancel it, and keeps its buffers"; }
  void complete(int mpi_error);
  // The tag the caller gave a recv (without the class bit of MpiComm::wire_tag).
  int user_tag() const;
  // MISMATCH's message for a recv whose sender sent `arrived` bytes.
  std::string recv_mismatch(int arrived, int sender) const;
  // A recv that timed out: the description of a message from its peer under its tag but of the other
  // size class (one it can never match), or "".
  std::string message_of_the_other_class();
  void fail(bpl_status status, const std::string& message);
  // Posts round round_ of the schedule, or completes the operation after the last.
  int post_round();
  // Tests the round in flight; once it completed, checks what arrived, runs its local work, posts the next.
  void poll_round();
  // Probed: receives the round's messages that arrived, each of the size expected (else MISMATCH).
  // False while one has not arrived, or when the operation failed.
  bool match_round();
  // Whether MPI holds a request of the operation (its buffers must then stay).
  bool in_flight() const;

  MpiComm* comm_;
  Fingerprint fingerprint_;
  size_t bytes_;
  Phase phase_ = Phase::kRunning;
  bool receive_ = false;
  std::function<int(MPI_Request*)> post_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  FingerprintWords agreement_mine_{};
  std::vector<FingerprintWords> agreement_all_;
  // A recv's match (peer_ and tag_ also a send's, which its timeout names).
  void* recv_buf_ = nullptr;
  int recv_count_ = 0;
  MPI_Datatype recv_type_ = MPI_BYTE;
  int peer_ = -1;
  int tag_ = -1;
  int arrived_bytes_ = 0;
  bool posted_recv_ = false;  // a recv posted at once (up to the eager size): its message must be bytes_
  int32_t* source_ = nullptr;  // a recv from any rank's: where the sender's rank goes once it is done
  std::atomic<bool> matched_{false};  // its phase and request are set (by whichever thread's wait matched it)
  // Held while a thread moves an asynchronous operation on: its owner's waits, or another thread's
  // (which only tries it); a blocking one only its own caller moves. Recursive: expire moves it on
  // while it holds it.
  std::recursive_mutex step_mutex_;
  bool registered_ = false;  // in its communicator's in-flight list (asynchronous operations)
  std::function<void()> on_complete_;
  std::unique_ptr<RunState> state_;
  // The plugin's own schedule (else one MPI request, request_).
  bool scheduled_ = false;
  plugin::ReduceFn fold_ = nullptr;
  size_t round_ = 0;
  int schedule_tag_ = 0;
  size_t round_unmatched_ = 0;  // probed receives of the round not received yet
};

// A duplicate of `comm` (MPI_ERRORS_RETURN set), made with MPI_Comm_idup and waited for within
// `timeout`: every rank of `comm` takes part, and one that does not is a TIMEOUT, not a wait for ever.
MPI_Comm duplicate_within(const MpiProcess& process, MPI_Comm comm, std::chrono::milliseconds timeout);

class MpiComm {
 public:
  // Duplicates `comm` for the agreements and learns where its ranks run; both bounded by `timeout`.
  MpiComm(const MpiProcess& process, MPI_Comm comm, std::chrono::milliseconds timeout);
  ~MpiComm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const MpiProcess& process() const { return process_; }
  // How many of its ranks run on this machine (this one included).
  int local_ranks() const;
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed)); }
  // Bounds the operations started from now on.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ms_.store(timeout.count(), std::memory_order_relaxed); }
  // Releases every wait on this communicator at once with BPL_ERR_ABORTED and refuses later
  // operations. MPI cannot cancel: the operations in flight keep their buffers, and the peers wait
  // out their own timeout.
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // Each posts one operation; with req == NULL it also waits for it (bounded by the timeout).
  void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, bpl_plugin_request** req);
  void broadcast(void* buf, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req);
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root,
              bpl_plugin_request** req);
  void allgather(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req);
  void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op,
                      bpl_plugin_request** req);
  void alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req);
  void barrier(bpl_plugin_request** req);
  const char* path_of(bpl_collective, uint64_t) const { return "mpi"; }  // for BPL_TRACE
  // ABI 1.3: MPI's own gather, scatter, allgatherv and alltoallv (non-blocking forms).
  void gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req);
  void scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req);
  void allgatherv(const void* send, size_t sendcount, void* recv, plugin::CountsView recvcounts, plugin::CountsView displs,
                  bpl_dtype dtype, bpl_plugin_request** req);
  void alltoallv(const void* send, plugin::CountsView sendcounts, plugin::CountsView sdispls, void* recv,
                 plugin::CountsView recvcounts, plugin::CountsView rdispls, bpl_dtype dtype, bpl_plugin_request** req);
  void send(const void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req);
  void recv(void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req);
  // From whichever rank sends first with `tag` (MPI_ANY_SOURCE), posted or matched by probe as recv's
  // are at its size, so that it keeps its place among the recvs of that size.
  void recv_any(void* buf, size_t count, bpl_dtype dtype, int tag, int32_t* source, bpl_plugin_request** req);
  std::unique_ptr<MpiComm> split(int color, int key);
  // The barrier of bpl_finalize (fingerprinted as finalizing, kFinalizeOp): returns once every rank has
  // called it, or throws at the timeout. MPI's own non-blocking barrier, waited for the bounded way.
  void finalize_barrier();
  // ABI 1.2: a communicator of `size` ranks that only they create (MPI_Comm_create_group), each passing
  // its `rank` in it; they learn each other's MPI_COMM_WORLD ranks through the caller's `store`, within
  // `timeout` (a member missing is TIMEOUT naming it, members disagreeing MISMATCH).
  static std::unique_ptr<MpiComm> create_from_store(const MpiProcess& process, const bpl_store& store, int rank,
                                                    int size, std::chrono::milliseconds timeout);

  // Throws Error(MPI's own error string) unless `code` is MPI_SUCCESS.
  void check(int code, const char* call) const;
  // After a timed-out or failed operation the communicator is unusable: later calls fail at once.
  void poison(bpl_status status, const std::string& cause);
  // Keeps a request MPI still owns alive after its caller gave up on it.
  void abandon(std::unique_ptr<Request> request);
  // Asynchronous operations in flight, which every wait on the communicator moves on too: a rank may
  // wait for them in another order than its peers (MPI asks only that they start them in the same
  // order), and a round of one moves only when this rank matches and posts it. A blocking operation's
  // own wait moves it on all the time.
  void register_in_flight(Request* request);
  void unregister_in_flight(Request* request);
  // Steps every registered operation but `self` (null: every one) that no other thread is moving now.
  void progress_others(const Request* self);
  // An operation's state: the one kept from an earlier operation, cleared, or a new one; and back.
  std::unique_ptr<RunState> take_state();
  void keep_state(std::unique_ptr<RunState> state);

 private:
  friend class Request;
  // Collectives moving more than this (the whole buffer) probe each message before receiving it
  // (schedules) or agree on their fingerprint first (MPI's own): up to it, Open MPI sends every
  // message eagerly, copying at most what the receiver posted; above it a message may be read whole
  // by the receiver (single copy).
  size_t eager_bytes() const { return process_.eager_bytes; }
  // Allreduces up to this size exchange whole buffers (recursive doubling: log2(n) rounds against the
  // ring's 2(n-1)), larger ones go round a ring of blocks, which moves 2(n-1)/n of the buffer per rank
  // instead of log2(n) times it. (ring_allreduce)
  static constexpr size_t kRecursiveDoublingMaxBytes = 65536;
  // Whether an allreduce of `count` elements, `bytes` in all, goes round the ring: above
  // kRecursiveDoublingMaxBytes, and where the whole buffer is above the eager size but the ring's
  // blocks are not (a message just above it waits for the probe: two eager rounds are faster than
  // one such exchange, bench/results/epyc/README.md#2026-11-25-raw-speed).
  bool ring_allreduce(size_t count, size_t bytes) const {
    if (count < static_cast<size_t>(size_)) return false;
    const bool blocks_eager = bytes > eager_bytes() && bytes / static_cast<size_t>(size_) + 1 <= eager_bytes();
    return bytes > kRecursiveDoublingMaxBytes || blocks_eager;
  }
  // The tag of a collective the plugin schedules itself, `f` as the core numbered it: its number
  // (operations in flight together never share a tag) and, where MPI's tags are wide enough, a hash of
  // its fingerprint (`with_count` or not), so that ranks calling different collectives post messages
  // that never match: they stall, and the explanation names what each calls. Where they are not,
  // every receive is probed (probes_all).
  int schedule_tag(const Fingerprint& f, bool with_count) const;
  // Below the class bit, a schedule's tag holds 14 bits of its number and the rest of the call's hash;
  // with fewer than 8 bits of hash left (MPI_TAG_UB below 2^23) every receive is probed instead.
  static constexpr int kSequenceBits = 14;
  static constexpr int kLeastHashBits = 8;
  int hash_bits() const { return process_.tag_bits() - 1 - kSequenceBits; }
  bool probes_all() const { return hash_bits() < kLeastHashBits; }
  // Whether a collective whose largest single transfer is `bytes` runs as the plugin's own schedule
  // (schedules.h): on more than one rank, and where MPI's int counts of bytes reach (else MPI's own
  // non-blocking collective, counting in elements).
  bool schedulable(size_t bytes) const { return size_ > 1 && bytes <= static_cast<size_t>(INT_MAX); }
  // Starts `request`; with req == NULL waits for it here.
  void start(std::unique_ptr<Request> request, bpl_plugin_request** req);
  void require_usable() const;
  // A message above eager_bytes() travels under its tag with this bit (the file comment), so that a
  // posted receive never meets one MPI would write whole; where MPI_TAG_UB leaves no bit for it,
  // every receive is probed. Within a class messages keep MPI's order.
  int large_message_tag() const { return 1 << (process_.tag_bits() - 1); }
  // The tag a message of `bytes` travels under (a caller's, or a schedule's).
  int wire_tag(int tag, size_t bytes) const {
    return probes_all() || bytes <= eager_bytes() ? tag : tag | large_message_tag();
  }
  // Tags above the largest a caller may use (MPI_TAG_UB, at least 32767, less the class bit) are
  // refused, naming the bound.
  void check_tag(int tag) const;
  // Matches recv `r` with an arrived message, if there is one (true); a recv from any rank leaves the
  // messages of the ranks in `blocked` alone (earlier receives wait on them).
  bool match(Request& r, const std::vector<int>& blocked);
  // What the ranks called, exchanged on the duplicate within a moment: the report of MISMATCH when
  // they differ, else a note naming the stopped peers of this machine (or "" when none can be named).
  std::pair<bpl_status, std::string> explain_stall(const Fingerprint& mine);
  // Posts this rank's part of that exchange (once: later calls return the first), so that ranks still
  // waiting can complete theirs; null if MPI refused it.
  struct Exchange;
  Exchange* post_explanation(const Fingerprint& mine);
  // " (rank 1 of this communicator, process 4242 on this machine, is stopped)", or what can be said
  // when no peer of this machine is stopped or ended.
  // `silent`: the ranks that gave no word about the operation ("rank 2", "ranks 2,5"), if known;
  // `answered[r]`: rank r's word came (it was in the operation: never named as what held it up).
  std::string stopped_peers_note(bool every_rank_answered, const std::string& silent = "",
                                 const std::vector<bool>& answered = {}) const;
  // What held up a send or a recv from `peer` that timed out: that rank, stopped or ended where this
  // machine can tell, else " (rank P posted no matching send with tag T)" (recv for a send).
  std::string silent_peer_note(int peer, bool is_recv, int tag) const;
  // Takes the explanations that arrived; true once every peer's is in.
  bool receive_explanations(Exchange& exchange);
  // Learns the process (machine and pid) of every rank, to name a stopped or ended one.
  void learn_peers();

  const MpiProcess& process_;
  MPI_Comm comm_;
  MPI_Comm agree_ = MPI_COMM_NULL;  // the duplicate: agreements and explanations
  std::atomic<int64_t> timeout_ms_;
  int rank_ = 0;
  int size_ = 1;
  std::atomic<bool> aborted_{false};
  std::atomic<RunState*> spare_state_{nullptr};  // take_state's
  std::mutex in_flight_mutex_;  // guards in_flight_; never taken while mutex_ is held
  std::vector<Request*> in_flight_;
  std::atomic<size_t> in_flight_count_{0};  // in_flight_.size(), read without the lock
  mutable std::mutex mutex_;  // guards poisoned_, abandoned_, explanation_
  bpl_status poisoned_status_ = BPL_OK;
  std::string poisoned_;
  std::atomic<bool> poisoned_flag_{false};  // poisoned_ is set: an operation's start reads it without the lock
  std::vector<std::unique_ptr<Request>> abandoned_;
  // The one exchange of fingerprints after this rank's first failure (explain_stall).
  // A rank's word about the operation it stalled or failed in: its fingerprint, sent to every other
  // rank under kExplanationTag on agree_ (point to point: a rank that left the operation, or never came,
  // cannot hold up the others' comparison), and the words received from the others.
  struct Exchange {
    FingerprintWords mine{};
    std::vector<MPI_Request> sends;
    std::vector<std::optional<FingerprintWords>> theirs;  // by rank
  };
  // The explanations' tag on agree_, which schedules never use (schedule_tag).
  int explanation_tag() const { return process_.tag_upper_bound; }
  std::unique_ptr<Exchange> explanation_;
  std::vector<pid_t> local_pid_of_rank_;   // 0 for this rank and for ranks on other machines
};

// MPI's text for an error code.
std::string mpi_error_string(int code);

}  // namespace backplane::mpi_plugin
