#include "watchdog.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "mpi_comm.h"
#include "plugin_support.h"

namespace backplane::mpi_plugin {

bool WatchedCall::enter(const Fingerprint& what) {
  uint64_t calls = calls_.load(std::memory_order_relaxed);
  if ((calls & 1) != 0 || !calls_.compare_exchange_strong(calls, calls + 1, std::memory_order_acquire)) return false;
  // Written after the mark: the watchdog reads them only once the same call has run a whole look
  // interval, long after these stores.
  const FingerprintWords words = encode(what);
  for (size_t i = 0; i < kFingerprintWords; ++i) what_[i].store(words[i], std::memory_order_relaxed);
  return true;
}

Fingerprint WatchedCall::what() const {
  FingerprintWords words;
  for (size_t i = 0; i < kFingerprintWords; ++i) words[i] = what_[i].load(std::memory_order_relaxed);
  return decode(words).value_or(Fingerprint{});
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (starts_++ > 0) return;
  stopping_ = false;
  thread_ = std::thread([this] { run(); });
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (starts_ == 0 || --starts_ > 0) return;
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch(MpiComm* comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_.push_back(Watched{comm, 0, {}});
}

void Watchdog::forget(MpiComm* comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_.erase(std::remove_if(watched_.begin(), watched_.end(), [&](const Watched& w) { return w.comm == comm; }),
                 watched_.end());
}

void Watchdog::run() {
  using namespace std::chrono;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const auto now = steady_clock::now();
    milliseconds shortest = seconds(16);
    bool call_running = false, operations_in_flight = false;
    for (Watched& w : watched_) {
      MpiComm& comm = *w.comm;
      shortest = std::min(shortest, comm.timeout());
      operations_in_flight = operations_in_flight || comm.has_operations_in_flight();
      const uint64_t calls = comm.watched_call().calls();
      if ((calls & 1) == 0) continue;
      call_running = true;
      if (calls != w.seen_calls) {
        w.seen_calls = calls;
        w.seen_since = now;
      }
      if (comm.aborted() || now - w.seen_since >= comm.timeout()) end_the_job(comm);
    }
    // A rank in a blocking call of MPI's does not step its asynchronous operations' schedules, and a
    // peer may be waiting for one before it comes to the same blocking call: step them here, often
    // enough not to hold that peer long (ranks that wait in the same order never need this). Only
    // where MPI is thread-multiple: elsewhere they are MPI's own calls (MpiComm::schedulable), and MPI's
    // lock is the blocking call's.
    if (call_running && operations_in_flight) {
      for (Watched& w : watched_) {
        if (w.comm->process().serialize == nullptr) w.comm->progress_others(nullptr);
      }
    }
    // A call is first seen up to one look after it began: the job ends between one timeout and two
    // looks more (2/16 of the timeout, at least 20 ms, at most 2 s) after the call began.
    const milliseconds look = std::clamp(shortest / 16, milliseconds(10), milliseconds(1000));
    wake_.wait_for(lock, call_running && operations_in_flight ? std::min(look, kStepInterval) : look);
  }
}

void Watchdog::end_the_job(MpiComm& comm) {
  const Fingerprint what = comm.watched_call().what();
  const std::string call = describe(what) + " on rank " + std::to_string(comm.rank()) + " of a communicator of " +
                           std::to_string(comm.size());
  const std::string message =
      (comm.aborted() ? "the communicator was aborted (bpl_comm_abort) during " + call + ", which MPI cannot release"
                      : call + " did not complete within " + std::to_string(comm.timeout().count()) +
                            " ms (the communicator's timeout)") +
      comm.describe_stall(what) + "; BPL_MPI_WATCHDOG=1 ends the job (MPI cannot cancel its own blocking calls): " +
      "MPI_Abort, exit code " + std::to_string(kExitCode);
  plugin::log(BPL_LOG_ERROR, "mpi", message);
  MPI_Abort(MPI_COMM_WORLD, kExitCode);
  std::_Exit(kExitCode);  // (MPI_Abort does not return)
}

}  // namespace backplane::mpi_plugin
