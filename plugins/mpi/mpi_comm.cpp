#include "mpi_comm.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>

#include <boost/container/small_vector.hpp>

#include "caller_store.h"
#include "dtypes.h"
#include "local_process.h"
#include "plugin_support.h"

namespace backplane::mpi_plugin {

using plugin::Error;

namespace {

// Holds the process-wide MPI lock when MPI was not granted MPI_THREAD_MULTIPLE.
class MpiLock {
 public:
  explicit MpiLock(const MpiProcess& process) : mutex_(process.serialize) {
    if (mutex_ != nullptr) mutex_->lock();
  }
  ~MpiLock() {
    if (mutex_ != nullptr) mutex_->unlock();
  }

 private:
  std::mutex* mutex_;
};

using plugin::Backoff;

MPI_Datatype mpi_type(bpl_dtype dtype) {
  switch (dtype) {
    case BPL_DTYPE_F32: return MPI_FLOAT;
    case BPL_DTYPE_F64: return MPI_DOUBLE;
    case BPL_DTYPE_F16:
    case BPL_DTYPE_BF16: return MPI_UINT16_T;  // moved as 2-byte words; reduced in f32 (dtypes.h)
    case BPL_DTYPE_I8: return MPI_INT8_T;
    case BPL_DTYPE_U8: return MPI_UINT8_T;
    case BPL_DTYPE_I32: return MPI_INT32_T;
    default: return MPI_INT64_T;
  }
}

MPI_Op mpi_op(bpl_reduce_op op) {
  switch (op) {
    case BPL_OP_PROD: return MPI_PROD;
    case BPL_OP_MIN: return MPI_MIN;
    case BPL_OP_MAX: return MPI_MAX;
    default: return MPI_SUM;  // SUM, and AVG's sum before the division
  }
}

// MPI-3 counts are int.
int mpi_count(size_t count) {
  if (count > static_cast<size_t>(INT_MAX)) {
    throw Error(BPL_ERR_UNSUPPORTED, "count " + std::to_string(count) + " exceeds MPI's int counts (at most " +
                                         std::to_string(INT_MAX) + " elements per call)");
  }
  return static_cast<int>(count);
}

const void* in_place_or(const void* send, const void* recv) { return send == recv ? MPI_IN_PLACE : send; }

bool is_collective(const Fingerprint& f) { return f.op != BPL_COLL_SEND && f.op != BPL_COLL_RECV; }

// The variable-size collectives' fingerprints: the total count, or none, and this rank's share of the
// pairing of counts (fingerprint.h).
Fingerprint allgatherv_fingerprint(bpl_dtype dtype, size_t sendcount, plugin::CountsView recvcounts, int rank, int size) {
  Fingerprint f = fingerprint_of(BPL_COLL_ALLGATHERV, dtype, static_cast<int64_t>(recvcounts.sum()));
  f.pairing = pairing_share(rank, size, [&](int) { return sendcount; },
                            [&](int q) { return recvcounts[static_cast<size_t>(q)]; });
  return f;
}
Fingerprint alltoallv_fingerprint(bpl_dtype dtype, plugin::CountsView sendcounts, plugin::CountsView recvcounts, int rank,
                                  int size) {
  Fingerprint f = fingerprint_of(BPL_COLL_ALLTOALLV, dtype);
  f.pairing = pairing_share(rank, size, [&](int q) { return sendcounts[static_cast<size_t>(q)]; },
                            [&](int q) { return recvcounts[static_cast<size_t>(q)]; });
  return f;
}

// MPI's int counts and displacements of a variable-size collective, one array after another (inline
// up to 8 ranks, as plugin::Counts).
using MpiCounts = boost::container::small_vector<int, 32>;

// Appends `arrays` to `out`, each value as MPI's int count; false (out partly filled) where one is
// beyond an int.
template <typename Out>
bool append_mpi_counts(Out& out, std::initializer_list<plugin::CountsView> arrays) {
  for (const plugin::CountsView& values : arrays) {
    for (size_t r = 0; r < values.size(); ++r) {
      if (values[r] > static_cast<size_t>(INT_MAX)) return false;
      out.push_back(static_cast<int>(values[r]));
    }
  }
  return true;
}

// UNSUPPORTED for a variable-size collective `op` whose counts or displacements MPI cannot take.
Error beyond_mpi_counts(const char* op) {
  return Error(BPL_ERR_UNSUPPORTED, std::string(op) + ": a count or displacement exceeds MPI's int counts (at most " +
                                        std::to_string(INT_MAX) + " elements)");
}

// MISMATCH's message for a recv of `bytes` from `peer` under the caller's `tag`, whose sender sent `arrived`.
std::string recv_mismatch_message(int peer, int tag, int arrived, size_t bytes) {
  return "rank " + std::to_string(peer) + " sent " + std::to_string(arrived) + " bytes with tag " + std::to_string(tag) +
         "; this recv expects " + std::to_string(bytes) + " bytes: the ranks disagree on the size";
}

// What an MPI error of operation `op` is to backplane.
std::pair<bpl_status, std::string> failure_of(const char* op, int mpi_error) {
  if (mpi_error == MPI_ERR_TRUNCATE) {
    return {BPL_ERR_MISMATCH, std::string(op) + " received more than this rank's buffer holds (MPI_ERR_TRUNCATE): the "
                                                "ranks disagree on the size"};
  }
  return {BPL_ERR_REMOTE, std::string(op) + " failed: " + mpi_error_string(mpi_error)};
}

// The fingerprints of a completed exchange, compared: "" when all agree.
std::string compared(const std::vector<FingerprintWords>& all) {
  std::vector<std::pair<int, Fingerprint>> by_rank;
  for (size_t r = 0; r < all.size(); ++r) {
    if (std::optional<Fingerprint> theirs = decode(all[r])) by_rank.emplace_back(static_cast<int>(r), *theirs);
  }
  return compare(by_rank, static_cast<int>(all.size()));
}

// Every recv of the process not matched yet, in the order they were posted. Any wait of the plugin
// matches them, as MPI matches a posted receive while it progresses anything: a sender of a large
// message waits for its receiver's match, and that receiver may be waiting for something else.
class PendingReceives {
 public:
  void add(Request* request) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(request);
    count_.store(pending_.size(), std::memory_order_release);
  }
  void forget(Request* request) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(std::remove(pending_.begin(), pending_.end(), request), pending_.end());
    count_.store(pending_.size(), std::memory_order_release);
  }
  // Calls match(request, blocked) for each, in order, as MPI orders receives: the first posted of those
  // a message could match takes it. So once a recv did not match, a later one of the same communicator
  // and tag is skipped where it could take what the earlier one waits for (one from the same rank, or
  // any recv behind a recv from any rank), and a later recv from any rank may take a message only from
  // a rank no earlier recv waits on (`blocked`, the ranks to leave alone). Drops those that matched.
  // Under the lock: a matched request's new state is seen by the next thread to take it.
  template <typename Match>
  void match_all(Match&& match) {
    if (count_.load(std::memory_order_acquire) == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    unmatched_.clear();
    for (auto it = pending_.begin(); it != pending_.end();) {
      const auto [comm, peer, tag] = (*it)->match_key();
      const auto waiting = [&, comm = comm, tag = tag](int rank) {
        return std::find(unmatched_.begin(), unmatched_.end(), std::make_tuple(comm, rank, tag)) != unmatched_.end();
      };
      bool skipped = waiting(MPI_ANY_SOURCE) || (peer != MPI_ANY_SOURCE && waiting(peer));
      if (!skipped) {
        blocked_.clear();
        if (peer == MPI_ANY_SOURCE) {
          for (const auto& [c, rank, t] : unmatched_) {
            if (c == comm && t == tag) blocked_.push_back(rank);
          }
        }
        skipped = !match(**it, blocked_);
        if (skipped) unmatched_.emplace_back(comm, peer, tag);
      }
      it = skipped ? std::next(it) : pending_.erase(it);
    }
    count_.store(pending_.size(), std::memory_order_release);
  }

 private:
  std::mutex mutex_;
  std::deque<Request*> pending_;
  // match_all's receives that did not match and the ranks a recv from any rank leaves alone, kept
  // between calls so that a test allocates nothing; few, so searched in a line.
  std::vector<std::tuple<MpiComm*, int, int>> unmatched_;
  std::vector<int> blocked_;
  std::atomic<size_t> count_{0};
};

PendingReceives& pending_receives() {
  static PendingReceives* receives = new PendingReceives;  // outlives every request, at exit too
  return *receives;
}

}  // namespace

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

/* ---- requests ---- */

Request::Request(MpiComm* comm, const char* op, Fingerprint fingerprint, size_t bytes, std::function<int(MPI_Request*)> post)
    : PolledRequest(op, comm->timeout(), bytes),
      comm_(comm),
      fingerprint_(fingerprint),
      bytes_(bytes),
      post_(std::move(post)),
      state_(comm->take_state()) {}

Request::Request(MpiComm* comm, void* buf, int count, MPI_Datatype type, size_t bytes, int peer, int tag)
    : PolledRequest("recv", comm->timeout(), bytes),
      comm_(comm),
      fingerprint_(fingerprint_of(BPL_COLL_RECV)),
      bytes_(bytes),
      phase_(Phase::kProbing),
      receive_(true),
      recv_buf_(buf),
      recv_count_(count),
      recv_type_(type),
      peer_(peer),
      tag_(tag),
      state_(comm->take_state()) {}

Request::~Request() {
  if (registered_) comm_->unregister_in_flight(this);
  if (receive_) pending_receives().forget(this);
  comm_->keep_state(std::move(state_));
}

void Request::fail(bpl_status status, const std::string& message) {
  // A peer still waiting in this collective explains its stall with what this rank called.
  if (is_collective(fingerprint_)) comm_->post_explanation(fingerprint_);
  finish(status, message);
  on_complete_ = nullptr;
  comm_->poison(status, message);
}

void Request::complete(int mpi_error) {
  if (mpi_error != MPI_SUCCESS) {
    const auto [status, message] = failure_of(op(), mpi_error);
    fail(status, message);
  } else {
    if (on_complete_) on_complete_();
    finish(BPL_OK, "");
  }
  on_complete_ = nullptr;
}

void Request::run_schedule(plugin::ReduceFn reduce) {
  scheduled_ = true;
  fold_ = reduce;
  // Up to the eager size in all, ranks that disagree on the count stall (the count is in the tag's
  // hash) and the fingerprints name them at the timeout; above it, the messages' sizes tell at once.
  schedule_tag_ = comm_->next_schedule_tag(fingerprint_, /*with_count=*/bytes_ <= comm_->eager_bytes());
}

namespace {

void run_fold(plugin::ReduceFn fold, const Fold& then) {
  if (then.count > 0) fold(then.into, then.first_operand(), then.from, then.count);
}

}  // namespace

int Request::post_round() {
  RunState& state = *state_;
  const Schedule& schedule = state.schedule;
  for (; round_ < schedule.rounds(); ++round_) {
    state.requests.clear();
    state.transfers.clear();
    state.expected.clear();
    round_unmatched_ = 0;
    {
      MpiLock lock(comm_->process());
      for (const bool sends : {false, true}) {  // receives first: a message then finds its buffer posted
        for (const Transfer* t = schedule.begin(round_); t != schedule.end(round_); ++t) {
          if (t->is_send != sends) continue;
          MPI_Request r = MPI_REQUEST_NULL;
          const int n = static_cast<int>(t->bytes);
          const int tag = comm_->wire_tag(schedule_tag_, t->bytes);
          int error = MPI_SUCCESS;
          if (t->is_send) {
            error = MPI_Isend(t->buffer, n, MPI_BYTE, t->peer, tag, comm_->agree_, &r);
          } else if (comm_->probes_all() || t->bytes > comm_->eager_bytes()) {
            ++round_unmatched_;  // match_round receives it once it arrived and its size is known
          } else {
            error = MPI_Irecv(t->buffer, n, MPI_BYTE, t->peer, tag, comm_->agree_, &r);
          }
          if (error != MPI_SUCCESS) return error;
          state.requests.push_back(r);
          state.transfers.push_back(t);
          state.expected.push_back(t->is_send ? -1 : n);
        }
      }
    }
    state.statuses.resize(state.requests.size());
    if (!state.requests.empty()) return MPI_SUCCESS;
    run_fold(fold_, schedule.then(round_));  // nothing to move
  }
  complete(MPI_SUCCESS);
  return MPI_SUCCESS;
}

bool Request::match_round() {
  int error = MPI_SUCCESS;
  std::string mismatch;
  {
    RunState& state = *state_;
    MpiLock lock(comm_->process());
    for (size_t i = 0; i < state.requests.size() && round_unmatched_ > 0; ++i) {
      const Transfer& t = *state.transfers[i];
      // Only probed receives: a posted one (its request set at posting) is MPI's to match, and a probe
      // under its tag could take a later message from the same peer.
      if (t.is_send || state.expected[i] < 0 || state.requests[i] != MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      error = MPI_Improbe(t.peer, comm_->wire_tag(schedule_tag_, t.bytes), comm_->agree_, &flag, &message, &status);
      if (error != MPI_SUCCESS) break;
      if (!flag) continue;
      int arrived = 0;
      MPI_Get_count(&status, MPI_BYTE, &arrived);
      if (arrived != state.expected[i]) {
        // Left unreceived: MPI would write all of it. Its sender learns of the mismatch from this
        // rank's fingerprint when its own wait times out.
        mismatch = std::string(op()) + ": rank " + std::to_string(t.peer) + " sends " + std::to_string(arrived) +
                   " bytes where this rank expects " + std::to_string(state.expected[i]) +
                   ": the ranks disagree on the size (found before it was received)";
        break;
      }
      error = MPI_Imrecv(t.buffer, arrived, MPI_BYTE, &message, &state.requests[i]);
      if (error != MPI_SUCCESS) break;
      state.expected[i] = -1;  // its size is checked
      --round_unmatched_;
    }
  }
  if (!mismatch.empty()) {
    fail(BPL_ERR_MISMATCH, mismatch);
    return false;
  }
  if (error != MPI_SUCCESS) {
    complete(error);
    return false;
  }
  return round_unmatched_ == 0;
}

void Request::poll_round() {
  if (round_unmatched_ > 0 && !match_round()) return;
  RunState& state = *state_;
  int flag = 0;
  int error = MPI_SUCCESS;
  {
    MpiLock lock(comm_->process());
    error = MPI_Testall(static_cast<int>(state.requests.size()), state.requests.data(), &flag, state.statuses.data());
  }
  if (error == MPI_SUCCESS && !flag) return;
  if (error == MPI_ERR_IN_STATUS) {
    for (const MPI_Status& status : state.statuses) {
      if (status.MPI_ERROR != MPI_SUCCESS && status.MPI_ERROR != MPI_ERR_PENDING) {
        error = status.MPI_ERROR;
        break;
      }
    }
  }
  if (error != MPI_SUCCESS) return complete(error);
  for (size_t i = 0; i < state.requests.size(); ++i) {
    if (state.expected[i] < 0) continue;
    int arrived = 0;
    MPI_Get_count(&state.statuses[i], MPI_BYTE, &arrived);
    if (arrived != state.expected[i]) {
      return fail(BPL_ERR_MISMATCH, std::string(op()) + ": rank " + std::to_string(state.statuses[i].MPI_SOURCE) +
                                        " sent " + std::to_string(arrived) + " bytes where this rank expects " +
                                        std::to_string(state.expected[i]) + ": the ranks disagree on the size");
    }
  }
  run_fold(fold_, state.schedule.then(round_));
  ++round_;
  error = post_round();
  if (error != MPI_SUCCESS) complete(error);
}

bool Request::in_flight() const {
  return request_ != MPI_REQUEST_NULL || std::any_of(state_->requests.begin(), state_->requests.end(),
                                                      [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
}

void Request::poll() {
  if (registered_) {
    std::lock_guard<std::recursive_mutex> lock(step_mutex_);
    step();
  } else {
    step();  // a blocking operation: no other thread moves it on (progress_others takes registered ones)
  }
  if (!done()) comm_->progress_others(this);
}

void Request::step() {
  if (done()) return;
  pending_receives().match_all([](Request& r, const std::vector<int>& blocked) { return r.comm_->match(r, blocked); });
  if (done()) return;  // its match failed
  if (receive_ && !matched_.load(std::memory_order_acquire)) return;  // (whichever thread matched it)
  if (scheduled_ && phase_ == Phase::kRunning) return poll_round();
  int flag = 0;
  MPI_Status status;
  int error = MPI_SUCCESS;
  {
    MpiLock lock(comm_->process());
    error = MPI_Test(&request_, &flag, &status);
  }
  if (!flag && error == MPI_SUCCESS) return;
  if (error == MPI_ERR_IN_STATUS) error = status.MPI_ERROR;
  switch (phase_) {
    case Phase::kAgreeing: {
      if (error != MPI_SUCCESS) return complete(error);
      const std::string report = compared(agreement_all_);
      if (!report.empty()) return fail(BPL_ERR_MISMATCH, report + " (found before any data moved)");
      phase_ = Phase::kRunning;
      if (!scheduled_) {
        MpiLock lock(comm_->process());
        error = post_(&request_);
      } else {
        error = post_round();  // takes the lock itself
      }
      if (error != MPI_SUCCESS) complete(error);
      return;
    }
    case Phase::kDraining:
      return fail(BPL_ERR_MISMATCH, recv_mismatch(arrived_bytes_, peer_));
    default:
      if (error == MPI_SUCCESS && posted_recv_) {  // a shorter message is MISMATCH too
        int arrived = 0;
        MPI_Get_count(&status, MPI_BYTE, &arrived);
        if (static_cast<size_t>(arrived) != bytes_) return fail(BPL_ERR_MISMATCH, recv_mismatch(arrived, status.MPI_SOURCE));
        if (source_ != nullptr) *source_ = status.MPI_SOURCE;
      }
      return complete(error);
  }
}

std::chrono::milliseconds Request::timeout() const { return comm_->timeout(); }

bool Request::aborted() const { return comm_->aborted(); }

bpl_status Request::free(std::unique_ptr<Request> request) {
  return PolledRequest::free(std::move(request), [](std::unique_ptr<Request> kept) { kept->comm().abandon(std::move(kept)); });
}

int Request::user_tag() const { return comm_->probes_all() ? tag_ : tag_ & ~MpiComm::kLargeMessageTag; }

std::string Request::recv_mismatch(int arrived, int sender) const {
  return recv_mismatch_message(sender, user_tag(), arrived, bytes_);
}

std::string Request::message_of_the_other_class() {
  if (!(posted_recv_ || receive_) || comm_->probes_all()) return "";
  int flag = 0;
  MPI_Status status;
  {
    MpiLock lock(comm_->process());
    const int other = tag_ ^ MpiComm::kLargeMessageTag;
    if (MPI_Iprobe(peer_, other, comm_->comm_, &flag, &status) != MPI_SUCCESS || !flag) return "";
  }
  int arrived = 0;
  MPI_Get_count(&status, MPI_BYTE, &arrived);
  return recv_mismatch(arrived, status.MPI_SOURCE) + " (the message was not received)";
}

void Request::expire() {
  std::lock_guard<std::recursive_mutex> lock(step_mutex_);
  if (done()) return;
  if (receive_) pending_receives().forget(this);  // not to be matched any more (MPI has nothing of it yet)
  const std::string late = std::string(op()) + " did not complete within " +
                           std::to_string(comm_->timeout().count()) + " ms (the communicator's timeout)";
  std::pair<bpl_status, std::string> explained{BPL_ERR_TIMEOUT, ""};
  if (phase_ == Phase::kAgreeing) {
    // Its agreement is the exchange a peer that timed out in another operation answers.
    const auto give_up = plugin::deadline_after(explanation_window(comm_->timeout()));
    Backoff backoff(0);
    while (phase_ == Phase::kAgreeing && !done() && std::chrono::steady_clock::now() < give_up) {
      poll();
      backoff.pause();
    }
    if (done()) return;  // the agreement told (or the operation ended after all)
    explained.second = comm_->stopped_peers_note(false);
  } else if (is_collective(fingerprint_)) {
    explained = comm_->explain_stall(fingerprint_);
  } else if (const std::string other = message_of_the_other_class(); !other.empty()) {
    explained = {BPL_ERR_MISMATCH, other};
  } else {
    explained.second = comm_->explain_stall(fingerprint_).second;
  }
  std::string message = explained.first == BPL_ERR_MISMATCH ? explained.second : late + explained.second;
  if (in_flight()) {
    expired(explained.first, std::move(message));  // MPI still owns it
  } else {
    finish(explained.first, std::move(message));
  }
  on_complete_ = nullptr;
  comm_->poison(status(), this->message());
}

/* ---- communicator ---- */

namespace {
void check_call(int code, const char* call) {
  if (code != MPI_SUCCESS) throw Error(BPL_ERR_REMOTE, std::string(call) + " failed: " + mpi_error_string(code));
}
}  // namespace

MPI_Comm duplicate_within(const MpiProcess& process, MPI_Comm comm, std::chrono::milliseconds timeout) {
  MPI_Comm copy = MPI_COMM_NULL;
  MPI_Request duplicated = MPI_REQUEST_NULL;
  {
    MpiLock lock(process);
    check_call(MPI_Comm_idup(comm, &copy, &duplicated), "MPI_Comm_idup");
  }
  const auto give_up = plugin::deadline_after(timeout);
  Backoff backoff(0);
  for (int done = 0; !done;) {
    {
      MpiLock lock(process);
      check_call(MPI_Test(&duplicated, &done, MPI_STATUS_IGNORE), "MPI_Comm_idup");
    }
    if (done) break;
    if (std::chrono::steady_clock::now() >= give_up) {
      process.communicator_failed = true;  // the duplication stays MPI's, with the rank it waits for
      throw Error(BPL_ERR_TIMEOUT, "duplicating the communicator did not complete within " +
                                       std::to_string(timeout.count()) + " ms: a rank is missing or stuck");
    }
    backoff.pause();
  }
  MpiLock lock(process);
  check_call(MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return copy;
}

MpiComm::MpiComm(const MpiProcess& process, MPI_Comm comm, std::chrono::milliseconds timeout)
    : process_(process), comm_(comm), timeout_ms_(timeout.count()) {
  {
    MpiLock lock(process_);
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  agree_ = duplicate_within(process_, comm_, timeout);
  learn_peers();
  if (process_.watchdog != nullptr) process_.watchdog->watch(this);
}

MpiComm::~MpiComm() {
  if (process_.watchdog != nullptr) process_.watchdog->forget(this);
  // Requests MPI still owns cannot be freed safely; after a failure the job is ending anyway.
  for (auto& request : abandoned_) (void)request.release();
  if (explanation_) (void)explanation_.release();  // MPI may still own its buffers
  delete spare_state_.exchange(nullptr);
  MpiLock lock(process_);
  MPI_Comm_free(&agree_);
  MPI_Comm_free(&comm_);
}

int MpiComm::next_schedule_tag(const Fingerprint& f, bool with_count) {
  const uint32_t sequence = schedules_.fetch_add(1, std::memory_order_relaxed);
  // The largest tag, MPI_TAG_UB, is the explanations' (explanation_tag): no schedule's reaches it.
  if (probes_all()) return static_cast<int>(sequence % static_cast<uint32_t>(process_.tag_upper_bound));
  // Bits 16-29: the sequence, below 0x3fff; bits 0-15: the call's hash. (Bit 30: the message's size
  // class, wire_tag.)
  Fingerprint call = f;
  if (!with_count) call.count = -1;
  return static_cast<int>(((sequence % 0x3fffu) << 16) | static_cast<uint32_t>(call_hash(call) & 0xffffu));
}

void MpiComm::check(int code, const char* call) const { check_call(code, call); }

void MpiComm::poison(bpl_status status, const std::string& cause) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (poisoned_.empty()) {
    poisoned_status_ = status;
    poisoned_ = cause;
    poisoned_flag_.store(true, std::memory_order_release);
  }
  // An abort fails nothing by itself (MPI cannot tell the peers); an operation it leaves in flight
  // does, once its request is abandoned to MPI (abandon).
  if (status != BPL_ERR_ABORTED) process_.communicator_failed = true;
}

void MpiComm::abandon(std::unique_ptr<Request> request) {
  if (request->registered_) {  // before mutex_: a step another thread runs under in_flight_mutex_ may take it
    unregister_in_flight(request.get());
    request->registered_ = false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  abandoned_.push_back(std::move(request));
  process_.communicator_failed = true;  // MPI_Finalize with an operation MPI still owns is erroneous
}

void MpiComm::register_in_flight(Request* request) {
  std::lock_guard<std::mutex> lock(in_flight_mutex_);
  in_flight_.push_back(request);
  request->registered_ = true;
  in_flight_count_.store(in_flight_.size(), std::memory_order_release);
}

void MpiComm::unregister_in_flight(Request* request) {
  std::lock_guard<std::mutex> lock(in_flight_mutex_);  // waits for a thread stepping it
  in_flight_.erase(std::remove(in_flight_.begin(), in_flight_.end(), request), in_flight_.end());
  in_flight_count_.store(in_flight_.size(), std::memory_order_release);
}

void MpiComm::progress_others(const Request* self) {
  const size_t count = in_flight_count_.load(std::memory_order_acquire);
  if (count == 0 || (count == 1 && self != nullptr && self->registered_)) return;
  std::lock_guard<std::mutex> lock(in_flight_mutex_);
  for (Request* other : in_flight_) {
    if (other == self) continue;
    std::unique_lock<std::recursive_mutex> stepping(other->step_mutex_, std::try_to_lock);
    if (stepping) other->step();
  }
}

std::unique_ptr<RunState> MpiComm::take_state() {
  std::unique_ptr<RunState> state(spare_state_.exchange(nullptr, std::memory_order_acquire));
  return state ? std::move(state) : std::make_unique<RunState>();
}

void MpiComm::keep_state(std::unique_ptr<RunState> state) {
  if (!state) return;
  // Staging above this is given back to the allocator: a communicator does not hold on to a large
  // operation's memory (and allocating it again costs little beside moving it).
  constexpr size_t kKeptBytes = size_t{4} << 20;
  state->schedule.clear();
  for (std::vector<char>& buffer : state->buffers) {
    if (buffer.capacity() > kKeptBytes) std::vector<char>().swap(buffer);
  }
  state->counts.clear();
  delete spare_state_.exchange(state.release(), std::memory_order_acq_rel);  // one kept is enough
}

void MpiComm::abort() {
  aborted_.store(true, std::memory_order_release);
  poison(BPL_ERR_ABORTED, "the communicator was aborted (bpl_comm_abort) on this rank");
  if (process_.watchdog != nullptr) process_.watchdog->wake();  // a blocking call of MPI's cannot be released
}

void MpiComm::require_usable() const {
  if (!poisoned_flag_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!poisoned_.empty()) {
    throw Error(poisoned_status_ == BPL_OK ? BPL_ERR_REMOTE : poisoned_status_,
                "the communicator failed earlier and cannot be used: " + poisoned_);
  }
}

void MpiComm::start(std::unique_ptr<Request> request, bpl_plugin_request** req) {
  require_usable();
  Request& r = *request;
  if (r.receive_) {
    pending_receives().add(&r);
    r.poll();
  } else if (r.request_ == MPI_REQUEST_NULL) {
    MpiLock lock(process_);
    // MPI's own collective: an alltoallv's bytes differ from rank to rank, so its ranks could not
    // decide alike by size: they always agree first. Not with BPL_MPI_WATCHDOG=1, where MPI's own
    // calls are posted at once, so that MPI moves them on while this rank is in a blocking call.
    const bool agree = !r.scheduled_ && !own_calls() &&
                       (r.bytes_ > eager_bytes() || r.fingerprint_.op == BPL_COLL_ALLTOALLV);
    if (size_ > 1 && agree && is_collective(r.fingerprint_)) {
      r.phase_ = Request::Phase::kAgreeing;
      r.agreement_mine_ = encode(r.fingerprint_);
      r.agreement_all_.resize(static_cast<size_t>(size_));
      check(MPI_Iallgather(r.agreement_mine_.data(), kFingerprintWords, MPI_INT64_T, r.agreement_all_.data(),
                           kFingerprintWords, MPI_INT64_T, agree_, &r.request_),
            "posting the size agreement");
    } else if (!r.scheduled_ && r.post_) {
      check(r.post_(&r.request_), "posting the operation");
    }
  }
  if (r.phase_ == Request::Phase::kRunning && r.scheduled_) {
    check(r.post_round(), "posting the operation");
  }
  if (req != nullptr) {
    r.start_clock();
    if (!r.done()) register_in_flight(&r);
    *req = reinterpret_cast<bpl_plugin_request*>(request.release());
    return;
  }
  try {
    // The request's own deadline (the communicator's timeout) comes before this wait's.
    r.wait(timeout() + std::chrono::milliseconds(1));
  } catch (const Error& e) {
    const bool released = e.status() == BPL_ERR_ABORTED;
    const std::string message = released ? "the communicator was aborted (bpl_comm_abort) on this rank during " +
                                               std::string(r.op()) + "; MPI keeps its buffers"
                                         : e.what();
    // MPI cannot cancel an operation: the request stays with MPI, and so must its buffers.
    if (released || r.owned_by_backend()) abandon(std::move(request));
    throw Error(e.status(), message);
  }
}

// A recv matched by probe: received into its buffer when the sizes agree, else whole into one of its
// own (so that the sender completes and nothing overflows) and then failed with MISMATCH.
bool MpiComm::match(Request& r, const std::vector<int>& blocked) {
  int flag = 0;
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status;
  MpiLock serialized(process_);
  int peer = r.peer_;
  if (peer == MPI_ANY_SOURCE && !blocked.empty()) {
    // Only from a rank no earlier recv waits on: the first such rank with a message here (a probe that
    // does not match, then one from that rank alone, under the same lock).
    peer = MPI_PROC_NULL;
    for (int rank = 0; rank < size_ && peer == MPI_PROC_NULL; ++rank) {
      if (std::find(blocked.begin(), blocked.end(), rank) != blocked.end()) continue;
      int arrived = 0;
      if (MPI_Iprobe(rank, r.tag_, comm_, &arrived, MPI_STATUS_IGNORE) == MPI_SUCCESS && arrived) peer = rank;
    }
    if (peer == MPI_PROC_NULL) return false;
  }
  int error = MPI_Improbe(peer, r.tag_, comm_, &flag, &message, &status);
  if (error == MPI_SUCCESS && !flag) return false;
  int arrived = 0;
  if (error == MPI_SUCCESS) error = MPI_Get_count(&status, MPI_BYTE, &arrived);
  if (error == MPI_SUCCESS && r.source_ != nullptr) {  // a recv from any rank: now from this one
    r.peer_ = status.MPI_SOURCE;
    *r.source_ = status.MPI_SOURCE;
  }
  if (error == MPI_SUCCESS && static_cast<size_t>(arrived) == r.bytes_) {
    error = MPI_Imrecv(r.recv_buf_, r.recv_count_, r.recv_type_, &message, &r.request_);
    r.phase_ = Request::Phase::kRunning;
  } else if (error == MPI_SUCCESS) {
    r.arrived_bytes_ = arrived;
    error = MPI_Imrecv(r.staging(0, static_cast<size_t>(arrived)), arrived, MPI_BYTE, &message, &r.request_);
    r.phase_ = Request::Phase::kDraining;
  }
  if (error != MPI_SUCCESS) {
    r.phase_ = Request::Phase::kRunning;
    r.finish(BPL_ERR_REMOTE, "recv failed: " + mpi_error_string(error));
  }
  r.matched_.store(true, std::memory_order_release);
  return true;
}

MpiComm::Exchange* MpiComm::post_explanation(const Fingerprint& mine) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (explanation_) return explanation_.get();
  auto exchange = std::make_unique<Exchange>();
  exchange->mine = encode(mine);
  exchange->theirs.resize(static_cast<size_t>(size_));
  MpiLock serialized(process_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(exchange->mine.data(), kFingerprintWords, MPI_INT64_T, r, explanation_tag(), agree_, &request) !=
        MPI_SUCCESS) {
      break;
    }
    exchange->sends.push_back(request);
  }
  explanation_ = std::move(exchange);
  return explanation_.get();
}

// Takes the words of the peers that have sent theirs; true once every peer's is in.
bool MpiComm::receive_explanations(Exchange& exchange) {
  MpiLock lock(process_);
  for (;;) {
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, explanation_tag(), agree_, &flag, &message, &status) != MPI_SUCCESS || !flag) break;
    FingerprintWords words{};
    int count = 0;
    MPI_Get_count(&status, MPI_INT64_T, &count);
    if (count != static_cast<int>(kFingerprintWords) ||
        MPI_Mrecv(words.data(), kFingerprintWords, MPI_INT64_T, &message, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      char ignored[8 * kFingerprintWords];
      MPI_Mrecv(ignored, 0, MPI_BYTE, &message, MPI_STATUS_IGNORE);  // (truncated: dropped)
      continue;
    }
    exchange.theirs[static_cast<size_t>(status.MPI_SOURCE)] = words;
  }
  int answered = 1;
  for (const auto& words : exchange.theirs) answered += words.has_value() ? 1 : 0;
  return answered == size_;
}

std::pair<bpl_status, std::string> MpiComm::explain_stall(const Fingerprint& mine) {
  Exchange* exchange = post_explanation(mine);
  if (exchange == nullptr || !is_collective(mine)) return {BPL_ERR_TIMEOUT, stopped_peers_note(false)};
  // The peers that stalled in this operation too time out at about the same moment, give or take how
  // late each came to it: within the window, each one's word arrives.
  const auto give_up = plugin::deadline_after(explanation_window(timeout()));
  Backoff backoff(0);
  bool everyone = false;
  while (!(everyone = receive_explanations(*exchange)) && std::chrono::steady_clock::now() < give_up) backoff.pause();
  std::vector<std::pair<int, Fingerprint>> by_rank;
  std::string silent;
  for (int r = 0; r < size_; ++r) {
    const std::optional<FingerprintWords>& words = r == rank_ ? std::optional<FingerprintWords>(exchange->mine)
                                                               : exchange->theirs[static_cast<size_t>(r)];
    const std::optional<Fingerprint> call = words ? decode(*words) : std::nullopt;
    if (call) {
      by_rank.emplace_back(r, *call);
    } else {
      silent += (silent.empty() ? "" : ",") + std::to_string(r);
    }
  }
  if (!silent.empty()) silent = (silent.find(',') == std::string::npos ? "rank " : "ranks ") + silent;
  const std::string report = compare(by_rank, size_);
  if (!report.empty()) {
    return {BPL_ERR_MISMATCH, report + (silent.empty() ? "" : "; no word from " + silent + ", which left the operation or never came") +
                                  " (found when the operation stalled)"};
  }
  return {BPL_ERR_TIMEOUT, stopped_peers_note(everyone, silent)};
}

std::string MpiComm::describe_stall(const Fingerprint& mine) {
  // explain_stall calls MPI; the stalled call holds MPI's lock where MPI is not thread-multiple.
  if (process_.serialize != nullptr) return stopped_peers_note(false);
  const auto [status, explanation] = explain_stall(mine);
  return status == BPL_ERR_MISMATCH ? ": " + explanation : explanation;
}

std::string MpiComm::stopped_peers_note(bool every_rank_answered, const std::string& silent) const {
  std::string stopped;
  for (int r = 0; r < size_; ++r) {
    const pid_t pid = local_pid_of_rank_.empty() ? 0 : local_pid_of_rank_[static_cast<size_t>(r)];
    if (pid == 0) continue;
    const plugin::ProcessState state = plugin::process_state(pid);
    if (state == plugin::ProcessState::kRunning) continue;
    stopped += (stopped.empty() ? " (" : "; ") + plugin::local_peer_description(r, pid, state);
  }
  if (!stopped.empty()) return stopped + ")";
  if (every_rank_answered) return " (every rank is in this operation: one is slow)";
  if (!silent.empty()) {
    return " (no word from " + silent + " of this communicator, stopped, stuck or far behind, on another machine or in another "
           "operation)";
  }
  return " (a peer is stopped, stuck or far behind, on another machine or in another operation: it cannot be "
         "named from here)";
}

int MpiComm::local_ranks() const {
  return 1 + static_cast<int>(std::count_if(local_pid_of_rank_.begin(), local_pid_of_rank_.end(), [](pid_t pid) { return pid != 0; }));
}

void MpiComm::learn_peers() {
  if (size_ == 1) return;
  // This rank's process space (machine and pid namespace) and pid, as two words.
  const std::vector<int64_t> mine = {static_cast<int64_t>(std::hash<std::string>()(plugin::process_space_identity())),
                                     static_cast<int64_t>(::getpid())};
  std::vector<int64_t> all(2 * static_cast<size_t>(size_));
  start(std::make_unique<Request>(this, "learning where the ranks run", fingerprint_of(BPL_COLL_ALLGATHER), 0,
                                  [&](MPI_Request* r) { return MPI_Iallgather(mine.data(), 2, MPI_INT64_T, all.data(), 2,
                                                                              MPI_INT64_T, agree_, r); }),
        nullptr);
  local_pid_of_rank_.assign(static_cast<size_t>(size_), 0);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && all[2 * static_cast<size_t>(r)] == mine[0]) {
      local_pid_of_rank_[static_cast<size_t>(r)] = static_cast<pid_t>(all[2 * static_cast<size_t>(r) + 1]);
    }
  }
}

// Reductions whose dtype accumulates in a wider type (dtypes.h) are widened into the request's own
// buffers and narrowed into the caller's buffer when MPI completes.
void MpiComm::allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op,
                        bpl_plugin_request** req) {
  if (watching(req) && watched_allreduce(send, recv, count, dtype, op)) return;
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  const int n = mpi_count(count);
  void* work = recv;
  const void* input = in_place_or(send, recv);
  const size_t element = plugin::dtype_size(acc), bytes = count * element;
  auto request = std::make_unique<Request>(this, "allreduce", fingerprint_of(BPL_COLL_ALLREDUCE, dtype, count, -1, op),
                                           bytes, nullptr);
  if (acc != dtype) {
    work = request->staging(0, bytes);
    plugin::convert(send, dtype, work, acc, count);
    input = MPI_IN_PLACE;
  }
  if (schedulable(bytes)) {
    // The plugin's own schedule (schedules.h) into `work`: the ring reads the input where it lies.
    const bool ring = ring_allreduce(count, bytes);
    const void* values = input == MPI_IN_PLACE ? work : send;
    if (!ring && values != work && bytes > 0) std::memcpy(work, send, bytes);
    char* scratch = request->staging(1, allreduce_scratch_bytes(count, element, size_, ring));
    allreduce_rounds(request->schedule(), static_cast<const char*>(ring ? values : work), static_cast<char*>(work), scratch,
                     count, element, rank_, size_, ring);
    request->run_schedule(plugin::reduce_function(acc, op));
  } else {
    // The post may run later (after an agreement): it holds what it needs by value.
    request->post_ = [input, work, n, acc, op, comm = comm_](MPI_Request* r) {
      return MPI_Iallreduce(input, work, n, mpi_type(acc), mpi_op(op), comm, r);
    };
  }
  if (op == BPL_OP_AVG || acc != dtype) {
    request->on_complete([=] { plugin::finish_reduction(work, acc, recv, dtype, count, op, size_); });
  }
  start(std::move(request), req);
}

void MpiComm::broadcast(void* buf, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req) {
  if (watching(req) && watched_broadcast(buf, count, dtype, root)) return;
  const size_t bytes = count * plugin::dtype_size(dtype);
  auto request = std::make_unique<Request>(this, "broadcast", fingerprint_of(BPL_COLL_BROADCAST, dtype, count, root), bytes,
                                           nullptr);
  if (schedulable(bytes)) {
    broadcast_rounds(request->schedule(), static_cast<char*>(buf), bytes, root, rank_, size_);
    request->run_schedule();
  } else {
    const int n = mpi_count(count);
    request->post_ = [=, comm = comm_](MPI_Request* r) { return MPI_Ibcast(buf, n, mpi_type(dtype), root, comm, r); };
  }
  start(std::move(request), req);
}

void MpiComm::reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root,
                     bpl_plugin_request** req) {
  if (watching(req) && watched_reduce(send, recv, count, dtype, op, root)) return;
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  const bool is_root = rank_ == root;
  const size_t element = plugin::dtype_size(acc), bytes = count * element;
  auto request = std::make_unique<Request>(this, "reduce", fingerprint_of(BPL_COLL_REDUCE, dtype, count, root, op), bytes,
                                           nullptr);
  const void* input = send;
  void* output = is_root ? recv : nullptr;
  if (acc != dtype) {  // widened: reduced in the request's copy, the root's result narrowed from it
    char* staging = request->staging(0, bytes);
    plugin::convert(send, dtype, staging, acc, count);
    input = staging;
    if (is_root) output = staging;
  }
  if (schedulable(bytes)) {
    char* work = is_root ? nullptr : request->staging(1, bytes);  // a rank with children folds into it
    reduce_rounds(request->schedule(), static_cast<const char*>(input), static_cast<char*>(output), work,
                  request->staging(2, reduce_scratch_bytes(count, element)), count, element, root, rank_, size_);
    request->run_schedule(plugin::reduce_function(acc, op));
  } else {
    const int n = mpi_count(count);
    const void* mpi_input = is_root && input == output ? MPI_IN_PLACE : input;
    request->post_ = [mpi_input, output, n, acc, op, root, comm = comm_](MPI_Request* r) {
      return MPI_Ireduce(mpi_input, output, n, mpi_type(acc), mpi_op(op), root, comm, r);
    };
  }
  if (is_root && (op == BPL_OP_AVG || acc != dtype)) {
    request->on_complete([=] { plugin::finish_reduction(output, acc, recv, dtype, count, op, size_); });
  }
  start(std::move(request), req);
}

void MpiComm::allgather(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req) {
  if (watching(req) && watched_allgather(send, recv, count, dtype)) return;
  const size_t block = count * plugin::dtype_size(dtype);
  auto request = std::make_unique<Request>(this, "allgather", fingerprint_of(BPL_COLL_ALLGATHER, dtype, count),
                                           block * static_cast<size_t>(size_), nullptr);
  // In place, the caller's block already sits at recv + rank*count: MPI_IN_PLACE means exactly that.
  char* own = static_cast<char*>(recv) + block * static_cast<size_t>(rank_);
  const bool in_place = send == own;
  if (schedulable(block)) {
    if (!in_place && block > 0) std::memcpy(own, send, block);
    allgather_rounds(request->schedule(), static_cast<char*>(recv), static_cast<const char*>(send),
                     Blocks::equal(block), rank_, size_);
    request->run_schedule();
  } else {
    const int n = mpi_count(count);
    const void* input = in_place ? MPI_IN_PLACE : send;
    request->post_ = [=, comm = comm_](MPI_Request* r) {
      return MPI_Iallgather(input, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm, r);
    };
  }
  start(std::move(request), req);
}

void MpiComm::reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op,
                             bpl_plugin_request** req) {
  const bpl_dtype acc = plugin::accumulation_dtype(dtype, op);
  const size_t total = recvcount * static_cast<size_t>(size_), element = plugin::dtype_size(acc);
  auto request = std::make_unique<Request>(this, "reduce_scatter",
                                           fingerprint_of(BPL_COLL_REDUCE_SCATTER, dtype, recvcount, -1, op),
                                           total * element, nullptr);
  const void* input = send;
  void* output = recv;
  if (acc != dtype) {  // widened: reduced from the request's copy into its buffer, then narrowed
    char* staging = request->staging(0, total * element);
    plugin::convert(send, dtype, staging, acc, total);
    input = staging;
    output = request->staging(1, recvcount * element);
  }
  if (schedulable(recvcount * element)) {
    reduce_scatter_rounds(request->schedule(), static_cast<const char*>(input), static_cast<char*>(output),
                          request->staging(2, reduce_scatter_scratch_bytes(recvcount, element, size_)), recvcount, element,
                          rank_, size_);
    request->run_schedule(plugin::reduce_function(acc, op));
  } else {
    const int n = mpi_count(recvcount);
    mpi_count(total);
    // MPI's in-place form leaves the result at the start of the buffer, ours at the rank's block:
    // the result lands in the request's buffer first.
    if (output == static_cast<const char*>(input) + recvcount * element * static_cast<size_t>(rank_)) {
      output = request->staging(1, recvcount * element);
    }
    request->post_ = [input, output, n, acc, op, comm = comm_](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(input, output, n, mpi_type(acc), mpi_op(op), comm, r);
    };
  }
  if (output != recv || op == BPL_OP_AVG) {
    request->on_complete([=] { plugin::finish_reduction(output, acc, recv, dtype, recvcount, op, size_); });
  }
  start(std::move(request), req);
}

void MpiComm::alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req) {
  if (watching(req) && watched_alltoall(send, recv, count, dtype)) return;
  const int n = mpi_count(count);
  mpi_count(count * static_cast<size_t>(size_));
  auto request = std::make_unique<Request>(this, "alltoall", fingerprint_of(BPL_COLL_ALLTOALL, dtype, count),
                                           count * static_cast<size_t>(size_) * plugin::dtype_size(dtype), nullptr);
  const size_t block = count * plugin::dtype_size(dtype), bytes = block * static_cast<size_t>(size_);
  const bool in_place = send == recv;
  if (schedulable(block)) {
    // In place, the blocks go out from the caller's buffer and arrive in the request's, copied over
    // the caller's once every send completed (the own block stays where it is).
    const Blocks blocks = Blocks::equal(block);
    char* arrivals = in_place ? request->staging(0, bytes) : static_cast<char*>(recv);
    const size_t own = block * static_cast<size_t>(rank_);
    if (!in_place && block > 0) std::memcpy(arrivals + own, static_cast<const char*>(send) + own, block);
    alltoall_rounds(request->schedule(), static_cast<const char*>(send), blocks, arrivals, blocks, rank_, size_);
    request->run_schedule();
    if (in_place && size_ > 1) {
      request->on_complete([=] {
        auto* out = static_cast<char*>(recv);
        if (own > 0) std::memcpy(out, arrivals, own);
        if (own + block < bytes) std::memcpy(out + own + block, arrivals + own + block, bytes - own - block);
      });
    }
  } else {
    const void* input = send;
    if (in_place) {  // MPI's non-blocking alltoall has no in-place form everywhere: copy the input
      char* copy = request->staging(0, bytes);
      std::memcpy(copy, send, bytes);
      input = copy;
    }
    request->post_ = [input, recv, n, dtype, comm = comm_](MPI_Request* r) {
      return MPI_Ialltoall(input, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm, r);
    };
  }
  start(std::move(request), req);
}

void MpiComm::gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req) {
  if (watching(req) && watched_gather(send, recv, count, dtype, root)) return;
  const int n = mpi_count(count);
  mpi_count(count * static_cast<size_t>(size_));
  const size_t block = count * plugin::dtype_size(dtype);
  // In place, the root's block already sits at recv + root*count: MPI_IN_PLACE means exactly that.
  const bool in_place = rank_ == root && send == static_cast<char*>(recv) + block * static_cast<size_t>(root);
  auto request = std::make_unique<Request>(this, "gather", fingerprint_of(BPL_COLL_GATHER, dtype, count, root),
                                           block * static_cast<size_t>(size_), nullptr);
  if (schedulable(block)) {
    if (rank_ == root && !in_place && block > 0) std::memcpy(static_cast<char*>(recv) + block * static_cast<size_t>(root), send, block);
    gather_rounds(request->schedule(), static_cast<const char*>(send), static_cast<char*>(recv),
                  Blocks::equal(block), root, rank_, size_);
    request->run_schedule();
  } else {
    const void* input = in_place ? MPI_IN_PLACE : send;
    request->post_ = [=, comm = comm_](MPI_Request* r) {
      return MPI_Igather(input, n, mpi_type(dtype), recv, n, mpi_type(dtype), root, comm, r);
    };
  }
  start(std::move(request), req);
}

void MpiComm::scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req) {
  if (watching(req) && watched_scatter(send, recv, count, dtype, root)) return;
  const int n = mpi_count(count);
  mpi_count(count * static_cast<size_t>(size_));
  const size_t block = count * plugin::dtype_size(dtype);
  const bool in_place = rank_ == root && recv == static_cast<const char*>(send) + block * static_cast<size_t>(root);
  auto request = std::make_unique<Request>(this, "scatter", fingerprint_of(BPL_COLL_SCATTER, dtype, count, root),
                                           block * static_cast<size_t>(size_), nullptr);
  if (schedulable(block)) {
    if (rank_ == root && !in_place && block > 0) std::memcpy(recv, static_cast<const char*>(send) + block * static_cast<size_t>(root), block);
    scatter_rounds(request->schedule(), static_cast<const char*>(send), static_cast<char*>(recv),
                   Blocks::equal(block), root, rank_, size_);
    request->run_schedule();
  } else {
    void* output = in_place ? MPI_IN_PLACE : recv;
    request->post_ = [=, comm = comm_](MPI_Request* r) {
      return MPI_Iscatter(send, n, mpi_type(dtype), output, n, mpi_type(dtype), root, comm, r);
    };
  }
  start(std::move(request), req);
}

void MpiComm::allgatherv(const void* send, size_t sendcount, void* recv, plugin::CountsView recvcounts,
                         plugin::CountsView displs, bpl_dtype dtype, bpl_plugin_request** req) {
  if (watching(req) && watched_allgatherv(send, sendcount, recv, recvcounts, displs, dtype)) return;
  const int n = mpi_count(sendcount);
  const Fingerprint f = allgatherv_fingerprint(dtype, sendcount, recvcounts, rank_, size_);
  auto request = std::make_unique<Request>(this, "allgatherv", f, static_cast<size_t>(f.count) * plugin::dtype_size(dtype),
                                           nullptr);
  const size_t element = plugin::dtype_size(dtype);
  if (schedulable(recvcounts.max() * element)) {
    char* own = static_cast<char*>(recv) + displs[static_cast<size_t>(rank_)] * element;
    if (own != send && sendcount > 0) std::memcpy(own, send, sendcount * element);
    const Blocks blocks(displs.copy(element), recvcounts.copy(element));
    allgather_rounds(request->schedule(), static_cast<char*>(recv), static_cast<const char*>(send), blocks, rank_, size_);
    request->run_schedule();
    return start(std::move(request), req);
  }
  // MPI's arrays must live as long as the operation: the request keeps them.
  std::vector<int>& layout = request->counts();
  if (!append_mpi_counts(layout, {recvcounts, displs})) throw beyond_mpi_counts("allgatherv");
  const int* counts = layout.data();
  const int* offsets = layout.data() + size_;
  const bool in_place = send == static_cast<char*>(recv) + displs[static_cast<size_t>(rank_)] * plugin::dtype_size(dtype);
  const void* input = in_place ? MPI_IN_PLACE : send;
  request->post_ = [=, comm = comm_](MPI_Request* r) {
    return MPI_Iallgatherv(input, n, mpi_type(dtype), recv, counts, offsets, mpi_type(dtype), comm, r);
  };
  start(std::move(request), req);
}

void MpiComm::alltoallv(const void* send, plugin::CountsView sendcounts, plugin::CountsView sdispls, void* recv,
                        plugin::CountsView recvcounts, plugin::CountsView rdispls, bpl_dtype dtype,
                        bpl_plugin_request** req) {
  if (watching(req) && watched_alltoallv(send, sendcounts, sdispls, recv, recvcounts, rdispls, dtype)) return;
  const size_t element = plugin::dtype_size(dtype);
  // This rank's share of the bytes: it sizes the busy part of the waits.
  const size_t moved = (sendcounts.sum() + recvcounts.sum()) * element;
  auto request = std::make_unique<Request>(this, "alltoallv",
                                           alltoallv_fingerprint(dtype, sendcounts, recvcounts, rank_, size_), moved, nullptr);
  if (schedulable(std::max(sendcounts.max(), recvcounts.max()) * element)) {
    const auto me = static_cast<size_t>(rank_);
    if (sendcounts[me] > 0) {
      std::memcpy(static_cast<char*>(recv) + rdispls[me] * element, static_cast<const char*>(send) + sdispls[me] * element,
                  sendcounts[me] * element);
    }
    const Blocks sent(sdispls.copy(element), sendcounts.copy(element));
    const Blocks received(rdispls.copy(element), recvcounts.copy(element));
    alltoall_rounds(request->schedule(), static_cast<const char*>(send), sent, static_cast<char*>(recv), received, rank_,
                    size_);
    request->run_schedule();
    return start(std::move(request), req);
  }
  std::vector<int>& layout = request->counts();
  if (!append_mpi_counts(layout, {sendcounts, sdispls, recvcounts, rdispls})) throw beyond_mpi_counts("alltoallv");
  const int* arrays = layout.data();
  const int ranks = size_;
  request->post_ = [=, comm = comm_](MPI_Request* r) {
    return MPI_Ialltoallv(send, arrays, arrays + ranks, mpi_type(dtype), recv, arrays + 2 * ranks, arrays + 3 * ranks,
                          mpi_type(dtype), comm, r);
  };
  start(std::move(request), req);
}

void MpiComm::barrier(bpl_plugin_request** req) {
  if (watching(req) && watched_barrier()) return;
  auto request = std::make_unique<Request>(this, "barrier", fingerprint_of(BPL_COLL_BARRIER), 0, nullptr);
  if (schedulable(0)) {
    barrier_rounds(request->schedule(), rank_, size_);
    request->run_schedule();
  } else {
    request->post_ = [comm = comm_](MPI_Request* r) { return MPI_Ibarrier(comm, r); };
  }
  start(std::move(request), req);
}

void MpiComm::check_tag(int tag) const {
  if (probes_all() && tag > process_.tag_upper_bound) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "tag = " + std::to_string(tag) + " exceeds this MPI's MPI_TAG_UB (" +
                                              std::to_string(process_.tag_upper_bound) + ")");
  }
  if (!probes_all() && tag >= kLargeMessageTag) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "tag = " + std::to_string(tag) + " exceeds the MPI backend's largest tag (" +
                                              std::to_string(kLargeMessageTag - 1) +
                                              ": one bit of MPI_TAG_UB tells large messages apart)");
  }
}

void MpiComm::send(const void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req) {
  check_tag(tag);
  const int n = mpi_count(count);
  const size_t bytes = count * plugin::dtype_size(dtype);
  if (watching(req) && watched_send(buf, count, dtype, peer, tag)) return;
  const int on_wire = wire_tag(tag, bytes);
  start(std::make_unique<Request>(this, "send", fingerprint_of(BPL_COLL_SEND), bytes,
                                  [=, comm = comm_](MPI_Request* r) {
                                    return MPI_Isend(buf, n, mpi_type(dtype), peer, on_wire, comm, r);
                                  }),
        req);
}

void MpiComm::recv(void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req) {
  check_tag(tag);
  const int n = mpi_count(count);
  const size_t bytes = count * plugin::dtype_size(dtype);
  if (watching(req) && watched_recv(buf, count, dtype, peer, tag)) return;
  // Posted at once up to the eager size (wire_tag); with BPL_MPI_WATCHDOG=1 at every size, so that MPI
  // matches it while this rank is in MPI's own blocking calls.
  if ((!probes_all() && bytes <= eager_bytes()) || own_calls()) {
    const int on_wire = wire_tag(tag, bytes);
    auto request = std::make_unique<Request>(this, "recv", fingerprint_of(BPL_COLL_RECV), bytes,
                                             [=, comm = comm_](MPI_Request* r) {
                                               return MPI_Irecv(buf, n, mpi_type(dtype), peer, on_wire, comm, r);
                                             });
    request->posted_recv_ = true;
    request->peer_ = peer;
    request->tag_ = on_wire;
    return start(std::move(request), req);
  }
  start(std::make_unique<Request>(this, buf, n, mpi_type(dtype), bytes, peer, wire_tag(tag, bytes)), req);
}

void MpiComm::recv_any(void* buf, size_t count, bpl_dtype dtype, int tag, int32_t* source, bpl_plugin_request** req) {
  check_tag(tag);
  const int n = mpi_count(count);
  const size_t bytes = count * plugin::dtype_size(dtype);
  const int on_wire = wire_tag(tag, bytes);
  std::unique_ptr<Request> request;
  if ((!probes_all() && bytes <= eager_bytes()) || own_calls()) {  // posted at once, as recv's
    request = std::make_unique<Request>(this, "recv", fingerprint_of(BPL_COLL_RECV_ANY), bytes, [=, comm = comm_](MPI_Request* r) {
      return MPI_Irecv(buf, n, mpi_type(dtype), MPI_ANY_SOURCE, on_wire, comm, r);
    });
    request->posted_recv_ = true;
    request->tag_ = on_wire;
  } else {
    request = std::make_unique<Request>(this, buf, n, mpi_type(dtype), bytes, MPI_ANY_SOURCE, on_wire);
  }
  request->peer_ = MPI_ANY_SOURCE;
  request->source_ = source;
  start(std::move(request), req);
}

/* ---- MPI's own blocking calls, watched (BPL_MPI_WATCHDOG=1) ---- */

template <typename Call>
bool MpiComm::watched(const Fingerprint& what, Call&& call) {
  require_usable();
  if (!watched_call_.enter(what)) return false;
  if (has_operations_in_flight()) process_.watchdog->wake();  // to step them while MPI's call runs
  int error = MPI_SUCCESS;
  {
    MpiLock lock(process_);
    error = call();
  }
  watched_call_.leave();
  if (error == MPI_SUCCESS) return true;
  const auto [status, message] = failure_of(describe(what).c_str(), error);
  poison(status, message);
  throw Error(status, message);
}

namespace {

bool fits_int(size_t count) { return count <= static_cast<size_t>(INT_MAX); }

}  // namespace

bool MpiComm::watched_allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) {
  if (plugin::accumulation_dtype(dtype, op) != dtype || !fits_int(count)) return false;
  if (count * plugin::dtype_size(dtype) > kWatchedAllreduceMaxBytes) return false;
  if (!watched(fingerprint_of(BPL_COLL_ALLREDUCE, dtype, static_cast<int64_t>(count), -1, op), [&] {
        return MPI_Allreduce(in_place_or(send, recv), recv, static_cast<int>(count), mpi_type(dtype), mpi_op(op), comm_);
      })) {
    return false;
  }
  if (op == BPL_OP_AVG) plugin::finish_reduction(recv, dtype, recv, dtype, count, op, size_);
  return true;
}

bool MpiComm::watched_broadcast(void* buf, size_t count, bpl_dtype dtype, int root) {
  if (!fits_int(count)) return false;
  return watched(fingerprint_of(BPL_COLL_BROADCAST, dtype, static_cast<int64_t>(count), root),
                 [&] { return MPI_Bcast(buf, static_cast<int>(count), mpi_type(dtype), root, comm_); });
}

bool MpiComm::watched_reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) {
  if (plugin::accumulation_dtype(dtype, op) != dtype || !fits_int(count)) return false;
  const bool is_root = rank_ == root;
  if (!watched(fingerprint_of(BPL_COLL_REDUCE, dtype, static_cast<int64_t>(count), root, op), [&] {
        return MPI_Reduce(is_root ? in_place_or(send, recv) : send, is_root ? recv : nullptr, static_cast<int>(count),
                          mpi_type(dtype), mpi_op(op), root, comm_);
      })) {
    return false;
  }
  if (is_root && op == BPL_OP_AVG) plugin::finish_reduction(recv, dtype, recv, dtype, count, op, size_);
  return true;
}

bool MpiComm::watched_allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  if (!fits_int(count * static_cast<size_t>(size_))) return false;
  const size_t block = count * plugin::dtype_size(dtype);
  const bool in_place = send == static_cast<char*>(recv) + block * static_cast<size_t>(rank_);
  const int n = static_cast<int>(count);
  return watched(fingerprint_of(BPL_COLL_ALLGATHER, dtype, static_cast<int64_t>(count)), [&] {
    return MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_);
  });
}

bool MpiComm::watched_alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  if (!fits_int(count * static_cast<size_t>(size_))) return false;
  const int n = static_cast<int>(count);
  return watched(fingerprint_of(BPL_COLL_ALLTOALL, dtype, static_cast<int64_t>(count)), [&] {
    return MPI_Alltoall(send == recv ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_);
  });
}

bool MpiComm::watched_gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) {
  if (!fits_int(count * static_cast<size_t>(size_))) return false;
  const size_t block = count * plugin::dtype_size(dtype);
  const bool in_place = rank_ == root && send == static_cast<char*>(recv) + block * static_cast<size_t>(root);
  const int n = static_cast<int>(count);
  return watched(fingerprint_of(BPL_COLL_GATHER, dtype, static_cast<int64_t>(count), root), [&] {
    return MPI_Gather(in_place ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n, mpi_type(dtype), root, comm_);
  });
}

bool MpiComm::watched_scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) {
  if (!fits_int(count * static_cast<size_t>(size_))) return false;
  const size_t block = count * plugin::dtype_size(dtype);
  const bool in_place = rank_ == root && recv == static_cast<const char*>(send) + block * static_cast<size_t>(root);
  const int n = static_cast<int>(count);
  return watched(fingerprint_of(BPL_COLL_SCATTER, dtype, static_cast<int64_t>(count), root), [&] {
    return MPI_Scatter(send, n, mpi_type(dtype), in_place ? MPI_IN_PLACE : recv, n, mpi_type(dtype), root, comm_);
  });
}

bool MpiComm::watched_allgatherv(const void* send, size_t sendcount, void* recv, plugin::CountsView recvcounts,
                                 plugin::CountsView displs, bpl_dtype dtype) {
  MpiCounts layout;
  if (!fits_int(sendcount) || !append_mpi_counts(layout, {recvcounts, displs})) return false;
  const Fingerprint f = allgatherv_fingerprint(dtype, sendcount, recvcounts, rank_, size_);
  const bool in_place = send == static_cast<char*>(recv) + displs[static_cast<size_t>(rank_)] * plugin::dtype_size(dtype);
  return watched(f, [&] {
    return MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, static_cast<int>(sendcount), mpi_type(dtype), recv,
                          layout.data(), layout.data() + size_, mpi_type(dtype), comm_);
  });
}

bool MpiComm::watched_alltoallv(const void* send, plugin::CountsView sendcounts, plugin::CountsView sdispls, void* recv,
                                plugin::CountsView recvcounts, plugin::CountsView rdispls, bpl_dtype dtype) {
  MpiCounts layout;
  if (!append_mpi_counts(layout, {sendcounts, sdispls, recvcounts, rdispls})) return false;
  const int* arrays = layout.data();
  return watched(alltoallv_fingerprint(dtype, sendcounts, recvcounts, rank_, size_), [&] {
    return MPI_Alltoallv(send, arrays, arrays + size_, mpi_type(dtype), recv, arrays + 2 * size_, arrays + 3 * size_,
                         mpi_type(dtype), comm_);
  });
}

bool MpiComm::watched_barrier() {
  return watched(fingerprint_of(BPL_COLL_BARRIER), [&] { return MPI_Barrier(comm_); });
}

bool MpiComm::watched_send(const void* buf, size_t count, bpl_dtype dtype, int peer, int tag) {
  if (!fits_int(count)) return false;
  const int on_wire = wire_tag(tag, count * plugin::dtype_size(dtype));
  return watched(fingerprint_of(BPL_COLL_SEND),
                 [&] { return MPI_Send(buf, static_cast<int>(count), mpi_type(dtype), peer, on_wire, comm_); });
}

bool MpiComm::watched_recv(void* buf, size_t count, bpl_dtype dtype, int peer, int tag) {
  if (!fits_int(count)) return false;
  const size_t bytes = count * plugin::dtype_size(dtype);
  const int on_wire = wire_tag(tag, bytes);
  int arrived = 0;
  const auto mismatch = [&] {
    const std::string message = recv_mismatch_message(peer, tag, arrived, bytes);
    poison(BPL_ERR_MISMATCH, message);
    return Error(BPL_ERR_MISMATCH, message);
  };
  if (bytes <= eager_bytes() && !probes_all()) {  // only eagerly copied messages travel under its tag
    MPI_Status status;
    if (!watched(fingerprint_of(BPL_COLL_RECV), [&] {
          return MPI_Recv(buf, static_cast<int>(count), mpi_type(dtype), peer, on_wire, comm_, &status);
        })) {
      return false;
    }
    MPI_Get_count(&status, MPI_BYTE, &arrived);
    if (static_cast<size_t>(arrived) != bytes) throw mismatch();
    return true;
  }
  // Above the eager size (or where tags do not tell the classes apart) Open MPI may write a message
  // whole: its size is checked before it is received.
  MPI_Message message = MPI_MESSAGE_NULL;
  std::vector<char> drained;
  if (!watched(fingerprint_of(BPL_COLL_RECV), [&] {
        MPI_Status status;
        int error = MPI_Mprobe(peer, on_wire, comm_, &message, &status);
        if (error == MPI_SUCCESS) error = MPI_Get_count(&status, MPI_BYTE, &arrived);
        if (error != MPI_SUCCESS) return error;
        if (static_cast<size_t>(arrived) == bytes) {
          return MPI_Mrecv(buf, static_cast<int>(count), mpi_type(dtype), &message, MPI_STATUS_IGNORE);
        }
        drained.resize(static_cast<size_t>(arrived));  // received whole, so that the sender completes
        return MPI_Mrecv(drained.data(), arrived, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      })) {
    return false;
  }
  if (static_cast<size_t>(arrived) != bytes) throw mismatch();
  return true;
}

void MpiComm::finalize_barrier() {
  start(std::make_unique<Request>(this, "bpl_finalize", fingerprint_of(static_cast<bpl_collective>(kFinalizeOp)), 0,
                                  [comm = comm_](MPI_Request* r) { return MPI_Ibarrier(comm, r); }),
        nullptr);
}

std::unique_ptr<MpiComm> MpiComm::split(int color, int key) {
  // MPI_Comm_split blocks without a timeout. First a bounded allgather proves every rank has arrived,
  // so the split itself only waits for peers that are already there.
  int arrived[1] = {1};
  std::vector<int> everyone(static_cast<size_t>(size_));
  start(std::make_unique<Request>(this, "comm_split (arrival check)", fingerprint_of(BPL_COLL_COMM_SPLIT), 0,
                                  [&, comm = comm_](MPI_Request* r) {
                                    return MPI_Iallgather(arrived, 1, MPI_INT, everyone.data(), 1, MPI_INT, comm, r);
                                  }),
        nullptr);
  MPI_Comm child = MPI_COMM_NULL;
  {
    MpiLock lock(process_);
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child), "MPI_Comm_split");
  }
  if (child == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiComm>(process_, child, timeout());
}

std::unique_ptr<MpiComm> MpiComm::create_from_store(const MpiProcess& process, const bpl_store& store, int rank,
                                                    int size, std::chrono::milliseconds timeout) {
  const plugin::CallerStore members(store);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (members.add("backplane/mpi/rank/" + std::to_string(rank), 1) != 1) {
    throw Error(BPL_ERR_MISMATCH, "two members of the new communicator claim rank " + std::to_string(rank) +
                                      ": each rank 0.." + std::to_string(size - 1) + " must be given to one process");
  }
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  // "<world rank> <size>" under each member's rank.
  const std::string mine = std::to_string(world_rank) + " " + std::to_string(size);
  members.set("backplane/mpi/member/" + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<int> world_ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const std::string key = "backplane/mpi/member/" + std::to_string(r);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    std::vector<uint8_t> value;
    try {
      value = members.get(key, left);
    } catch (const plugin::Error& e) {
      if (e.status() != BPL_ERR_TIMEOUT) throw;
      std::string missing;
      for (int m = r; m < size; ++m) {
        if (!members.check("backplane/mpi/member/" + std::to_string(m))) missing += (missing.empty() ? "" : ", ") + std::to_string(m);
      }
      throw Error(BPL_ERR_TIMEOUT, "making a communicator of " + std::to_string(size) + " ranks through the caller's store: ranks [" +
                                       missing + "] did not come within " + std::to_string(timeout.count()) + " ms");
    }
    const std::string text(value.begin(), value.end());
    const size_t space = text.find(' ');
    const int their_size = space == std::string::npos ? -1 : std::atoi(text.c_str() + space + 1);
    if (their_size != size) {
      throw Error(BPL_ERR_MISMATCH, "members disagree on the new communicator's size: rank " + std::to_string(rank) +
                                        " says " + std::to_string(size) + ", rank " + std::to_string(r) + " says " +
                                        std::to_string(their_size));
    }
    world_ranks[static_cast<size_t>(r)] = std::atoi(text.c_str());
  }
  // Every member is there, so MPI_Comm_create_group, which has no timeout, only waits for peers that
  // are already calling it.
  MPI_Comm created = MPI_COMM_NULL;
  {
    MpiLock lock(process);
    MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, size, world_ranks.data(), &group);
    // The tag only tells apart creations that overlapping groups run at once; a process makes one at
    // a time (the lock) and its groups' members make them in the same order, so one tag serves all.
    constexpr int kCreateGroupTag = 0x6270;  // "bp"
    const int code = MPI_Comm_create_group(MPI_COMM_WORLD, group, kCreateGroupTag, &created);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (code != MPI_SUCCESS) throw Error(BPL_ERR_INTERNAL, "MPI_Comm_create_group failed");
  }
  return std::make_unique<MpiComm>(process, created, timeout);
}

}  // namespace backplane::mpi_plugin
