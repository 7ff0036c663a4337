// BPL_MPI_WATCHDOG=1: the timeout promise in the form c10d gives NCCL's collectives.
//
// In this mode a blocking operation is MPI's own blocking call (MPI_Allreduce, MPI_Send, …), which
// runs at Open MPI's own speed but cannot be bounded or cancelled. The watchdog is one thread that
// looks at the communicators' blocking calls a few times per timeout; one still in the same call a
// whole timeout later (or on a communicator aborted meanwhile) ends the job: it logs what the call
// was and what can be said of the peers (what each rank called, or which peer of this machine is
// stopped), then MPI_Abort. The calls themselves pay two stores and a compare-and-swap, and no clock.
//
// While a blocking call runs and asynchronous operations are in flight, the watchdog also steps their
// schedules (mpi_comm.h), every kStepInterval: the rank in MPI's call cannot. A blocking call on a
// communicator with operations in flight wakes it (a call elsewhere is seen at its next look).
//
// What the mode gives up against the default (mpi_comm.h): the survivors get no error to handle (the
// job ends), a waiting rank spins in MPI's progress loop as Open MPI's own blocking calls do, and ranks
// that disagree on a collective's size are MPI's undefined behaviour (BPL_DEBUG=detail compares every
// collective's arguments first).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "fingerprint.h"

namespace backplane::mpi_plugin {

class MpiComm;

// What a communicator's blocking call is, written by the calling thread and read by the watchdog.
class WatchedCall {
 public:
  // Marks the communicator's call `what` as running; false when another thread's call on it already
  // runs (the caller then makes its own the bounded way).
  bool enter(const Fingerprint& what);
  void leave() { calls_.store(calls_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  // Odd while a call runs; each call adds 2.
  uint64_t calls() const { return calls_.load(std::memory_order_acquire); }
  Fingerprint what() const;

 private:
  std::atomic<uint64_t> calls_{0};
  std::atomic<int64_t> what_[kFingerprintWords] = {};
};

class Watchdog {
 public:
  // The exit code of a job the watchdog ends (as timeout(1)'s).
  static constexpr int kExitCode = 124;
  // How often it steps the asynchronous operations in flight while a blocking call runs.
  static constexpr std::chrono::milliseconds kStepInterval{1};

  ~Watchdog();  // (at exit: stops its thread, runtimes finalized or not)
  // Its thread runs between the first start and the stop after the last (the process's runtimes).
  void start();
  void stop();
  void watch(MpiComm* comm);
  // Waits for a look at `comm` in progress: the watchdog never looks at a communicator freed.
  void forget(MpiComm* comm);
  // Looks now (a communicator was aborted).
  void wake() { wake_.notify_all(); }

 private:
  struct Watched {
    MpiComm* comm;
    uint64_t seen_calls = 0;                          // its calls() when last looked at
    std::chrono::steady_clock::time_point seen_since;  // when that value was first seen
  };
  void run();
  // Ends the job: `comm`'s call has run its timeout (or the communicator was aborted during it).
  [[noreturn]] void end_the_job(MpiComm& comm);

  std::mutex mutex_;  // guards everything below; held while the watchdog looks
  std::condition_variable wake_;
  std::vector<Watched> watched_;
  std::thread thread_;
  int starts_ = 0;
  bool stopping_ = false;
};

}  // namespace backplane::mpi_plugin
