#include "mpi_comm.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "caller_store.h"
#include "local_process.h"
#include "mpi_internal.h"
#include "plugin_support.h"
#include "stall.h"

namespace backplane::mpi_plugin {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

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
}

MpiComm::~MpiComm() {
  // Requests MPI still owns cannot be freed safely; after a failure the job is ending anyway.
  for (auto& request : abandoned_) (void)request.release();
  if (explanation_) (void)explanation_.release();  // MPI may still own its buffers
  delete spare_state_.exchange(nullptr);
  MpiLock lock(process_);
  MPI_Comm_free(&agree_);
  MPI_Comm_free(&comm_);
}

int MpiComm::schedule_tag(const Fingerprint& f, bool with_count) const {
  const auto sequence = static_cast<uint32_t>(f.sequence);
  // The largest tag, MPI_TAG_UB, is the explanations' (explanation_tag): no schedule's reaches it.
  if (probes_all()) return static_cast<int>(sequence % static_cast<uint32_t>(process_.tag_upper_bound));
  // Above the call's hash (hash_bits: 16 on Open MPI, 14 on MPICH), the sequence, never all ones (so no
  // tag with the size class above it, wire_tag, is MPI_TAG_UB).
  Fingerprint call = f;
  if (!with_count) call.count = -1;
  const uint32_t hash_mask = (1u << hash_bits()) - 1;
  const uint32_t numbers = (1u << kSequenceBits) - 1;
  return static_cast<int>(((sequence % numbers) << hash_bits()) | static_cast<uint32_t>(call_hash(call) & hash_mask));
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
    // decide alike by size: they always agree first.
    const bool agree = !r.scheduled_ && (r.bytes_ > eager_bytes() || r.fingerprint_.op == BPL_COLL_ALLTOALLV);
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
  const auto point_to_point = [&](const Fingerprint&, std::chrono::milliseconds window) {
    const auto give_up = plugin::deadline_after(window);
    Backoff backoff(0);
    while (!receive_explanations(*exchange) && std::chrono::steady_clock::now() < give_up) backoff.pause();
    std::vector<std::optional<Fingerprint>> said;
    for (const std::optional<FingerprintWords>& words : exchange->theirs) said.push_back(words ? decode(*words) : std::nullopt);
    return said;
  };
  const StallExplanation explained =
      backplane::explain_stall(mine, rank_, explanation_window(timeout()), point_to_point);
  if (!explained.mismatch.empty()) return {BPL_ERR_MISMATCH, explained.mismatch};
  // A peer whose word came was in this operation too (it may have ended since, having given up as
  // this rank does): it is not what held the operation up.
  return {BPL_ERR_TIMEOUT, stopped_peers_note(explained.everyone_answered, explained.silent, explained.answered)};
}

std::string MpiComm::stopped_peers_note(bool every_rank_answered, const std::string& silent,
                                       const std::vector<bool>& answered) const {
  std::vector<pid_t> suspects = local_pid_of_rank_;
  for (size_t r = 0; r < answered.size() && r < suspects.size(); ++r) {
    if (answered[r]) suspects[r] = 0;
  }
  const std::string stopped =
      plugin::local_peers_note(suspects, [](plugin::ProcessState state) { return state != plugin::ProcessState::kRunning; });
  if (!stopped.empty()) return stopped;
  if (every_rank_answered) return " (every rank is in this operation: one is slow)";
  if (!silent.empty()) {
    return " (no word from " + silent + " of this communicator, stopped, stuck or far behind, on another machine or in another "
           "operation)";
  }
  return " (a peer is stopped, stuck or far behind, on another machine or in another operation: it cannot be "
         "named from here)";
}

std::string MpiComm::silent_peer_note(int peer, bool is_recv, int tag) const {
  std::vector<pid_t> suspect(local_pid_of_rank_.size(), 0);
  if (static_cast<size_t>(peer) < suspect.size()) suspect[static_cast<size_t>(peer)] = local_pid_of_rank_[static_cast<size_t>(peer)];
  const std::string stopped =
      plugin::local_peers_note(suspect, [](plugin::ProcessState state) { return state != plugin::ProcessState::kRunning; });
  if (!stopped.empty()) return stopped;
  return " (rank " + std::to_string(peer) + " posted no matching " + (is_recv ? "send" : "recv") + " with tag " +
         std::to_string(tag) + ")";
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
  start(std::make_unique<Request>(this, "learning where the ranks run", 0,
                                  [&](MPI_Request* r) { return MPI_Iallgather(mine.data(), 2, MPI_INT64_T, all.data(), 2,
                                                                              MPI_INT64_T, agree_, r); },
                                  fingerprint_of(BPL_COLL_ALLGATHER)),
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

void MpiComm::finalize_barrier() {
  start(std::make_unique<Request>(this, "bpl_finalize", 0, [comm = comm_](MPI_Request* r) { return MPI_Ibarrier(comm, r); },
                                  fingerprint_of(static_cast<bpl_collective>(kFinalizeOp))),
        nullptr);
}

std::unique_ptr<MpiComm> MpiComm::split(int color, int key) {
  // MPI_Comm_split blocks without a timeout. First a bounded allgather proves every rank has arrived,
  // so the split itself only waits for peers that are already there.
  int arrived[1] = {1};
  std::vector<int> everyone(static_cast<size_t>(size_));
  start(std::make_unique<Request>(this, "comm_split (arrival check)", 0,
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
