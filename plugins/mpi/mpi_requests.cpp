// The MPI plugin's requests (mpi_comm.h's Request): posting, stepping a schedule's rounds, matching
// receives by probe, and what a deadline that passed means.
#include "mpi_comm.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "mpi_internal.h"
#include "plugin_support.h"
#include "stall.h"

namespace backplane::mpi_plugin {

Request::Request(MpiComm* comm, const char* op, size_t bytes, std::function<int(MPI_Request*)> post, const Fingerprint& own)
    : PolledRequest(op, comm->timeout(), bytes),
      comm_(comm),
      fingerprint_(fingerprint_of(plugin::current_operation(), own)),
      bytes_(bytes),
      post_(std::move(post)),
      state_(comm->take_state()) {}

Request::Request(MpiComm* comm, void* buf, int count, MPI_Datatype type, size_t bytes, int peer, int tag)
    : PolledRequest("recv", comm->timeout(), bytes),
      comm_(comm),
      fingerprint_(fingerprint_of(plugin::current_operation(), fingerprint_of(BPL_COLL_RECV))),
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
  schedule_tag_ = comm_->schedule_tag(fingerprint_, /*with_count=*/bytes_ <= comm_->eager_bytes());
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

int Request::user_tag() const { return comm_->probes_all() ? tag_ : tag_ & ~comm_->large_message_tag(); }

std::string Request::recv_mismatch(int arrived, int sender) const {
  return recv_mismatch_message(sender, user_tag(), arrived, bytes_);
}

std::string Request::message_of_the_other_class() {
  if (!(posted_recv_ || receive_) || comm_->probes_all()) return "";
  int flag = 0;
  MPI_Status status;
  {
    MpiLock lock(comm_->process());
    const int other = tag_ ^ comm_->large_message_tag();
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
    // Posts its word for peers stalled in a collective meanwhile; a send, or a recv from one rank,
    // waited for that rank.
    explained.second = comm_->explain_stall(fingerprint_).second;
    if (peer_ >= 0) explained.second = comm_->silent_peer_note(peer_, receive_ || posted_recv_, user_tag());
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

}  // namespace backplane::mpi_plugin
