// A deadline for the calls MPI gives none and that cannot be cancelled: MPI_Init_thread, which waits
// for every rank of the job to start, and MPI_Finalize, which waits for every rank to finalize. A rank
// stopped or stuck before either would hold the others there for as long as it stays so. The guard's
// thread sleeps until the call returns; at the deadline it writes what did not return, and why it
// may not have, and ends the process with status 124 (timeout's): the job's launcher then ends the
// others.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "plugin_support.h"

namespace backplane::mpi_plugin {

class DeadlineGuard {
 public:
  // `call` names the call (and the rank), `why` what may hold it there; `stopped` says, at the
  // deadline, which of the job's ranks on this machine are stopped or ended (job_siblings.h).
  DeadlineGuard(std::chrono::milliseconds timeout, std::string call, std::string why,
                std::function<std::string()> stopped = [] { return std::string(); })
      : thread_([this, deadline = plugin::deadline_after(timeout), timeout, call = std::move(call), why = std::move(why),
                 stopped = std::move(stopped)] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (done_cv_.wait_until(lock, deadline, [this] { return done_; })) return;
          plugin::log(BPL_LOG_ERROR, "mpi",
                      call + " did not return within " + std::to_string(timeout.count()) + " ms (BPL_TIMEOUT_MS): " +
                          why + stopped() + "; ending this process (exit code 124)");
          std::fflush(nullptr);
          std::_Exit(124);
        }) {}
  ~DeadlineGuard() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  DeadlineGuard(const DeadlineGuard&) = delete;
  DeadlineGuard& operator=(const DeadlineGuard&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace backplane::mpi_plugin
