// A collective stalled over Gloo's TCP pairs says, at each quarter of its timeout, which ranks have
// not arrived (at info level, BPL_LOG_LEVEL=info; a collective on shared memory says it itself,
// shm_internal.h). Gloo's waits cannot be looked into, so the ranks tell each other through the store:
// the communicator's thread only marks when its collective starts and ends; the connection watch's
// thread (connection_watch.h) looks every interval(), announces a collective that has run longer than
// that under "<prefix>/waits_in/<rank>" (its fingerprint, numbered alike on every rank), and at each
// quarter of the timeout reads every rank's announcement and logs which ranks wait in it too, which
// have gone past it and which have not arrived. A rank whose part ended without waiting (a broadcast's
// root) and that waits in nothing since counts as not arrived.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "fingerprint.h"
#include "rendezvous.h"

namespace backplane::gloo_plugin {

class StallReport {
 public:
  // Null unless info lines are on: nothing is marked or looked at otherwise.
  static std::unique_ptr<StallReport> make_if_wanted(std::shared_ptr<FailureBoard> board, std::string prefix,
                                                     int rank, int size);
  // How often the watch looks, for a communicator with this timeout.
  static std::chrono::milliseconds interval(std::chrono::milliseconds timeout);

  // The collective `call` runs from now until the returned mark is dropped (`report` may be null).
  class Running {
   public:
    explicit Running(StallReport* report) : report_(report) {}
    ~Running() {
      if (report_ != nullptr) report_->end();
    }
    Running(Running&& other) noexcept : report_(other.report_) { other.report_ = nullptr; }
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;
    Running& operator=(Running&&) = delete;

   private:
    StallReport* report_;
  };
  [[nodiscard]] static Running begin(StallReport* report, const Fingerprint& call);

  // The watch's look (never throws): announces, and reports at each quarter of `timeout`.
  void check(std::chrono::milliseconds timeout);

  StallReport(std::shared_ptr<FailureBoard> board, std::string prefix, int rank, int size)
      : board_(std::move(board)), prefix_(std::move(prefix)), rank_(rank), size_(size) {}

 private:
  void end();
  // The line that says who has not arrived in `call`, from every rank's announcement.
  std::string describe_waiting(const Fingerprint& call, std::chrono::milliseconds waited,
                               std::chrono::milliseconds timeout) const;
  std::string key(int rank) const { return prefix_ + "/waits_in/" + std::to_string(rank); }

  std::shared_ptr<FailureBoard> board_;
  std::string prefix_;
  int rank_, size_;
  std::mutex mutex_;  // the two threads' view of the running collective
  std::optional<Fingerprint> running_;
  std::chrono::steady_clock::time_point since_;
  // The watch's thread only: what it last announced, and how many quarters of it were reported.
  int64_t announced_ = 0;
  int64_t quarters_reported_ = 0;
};

}  // namespace backplane::gloo_plugin
