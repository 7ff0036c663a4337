// What the core tracks of one communicator on this rank, the same for every backend: its timeout, the
// numbers of its operations, and whether it failed or was aborted. A failed communicator
// refuses every later operation at once, with the first failure's status and message, so that no
// rank sends into a group whose members have already diverged.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "backplane/backplane.h"

namespace backplane {

class CommState {
 public:
  explicit CommState(int64_t timeout_ms) : timeout_ms_(timeout_ms) {}

  int64_t timeout_ms() const { return timeout_ms_.load(std::memory_order_relaxed); }
  void set_timeout_ms(int64_t timeout_ms) { timeout_ms_.store(timeout_ms, std::memory_order_relaxed); }

  // The number of the next collective: 1, 2, …, alike on every rank as long as the ranks call the same
  // collectives in the same order (the plugin is handed it: bpl_operation_identity). Sends and
  // receives are numbered apart, on this rank only: ranks make different numbers of them.
  uint64_t next_collective() { return collectives_.fetch_add(1, std::memory_order_relaxed) + 1; }
  uint64_t next_point_to_point() { return point_to_point_.fetch_add(1, std::memory_order_relaxed) + 1; }

  // True once fail() or abort() ran. One acquire load: this runs before every operation.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Valid once failed(): the first failure.
  bpl_status status() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return status_;
  }
  std::string cause() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return cause_;
  }

  // Records a failure; only the first one is kept (later ones are its consequences).
  void fail(bpl_status status, const std::string& cause) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_.load(std::memory_order_relaxed)) return;
    status_ = status;
    cause_ = cause;
    failed_.store(true, std::memory_order_release);
  }

  // Marks the communicator aborted (and failed, unless it already had failed), for `cause`. False if
  // it already was aborted: a second abort is a no-op.
  bool abort(const std::string& cause = "the communicator was aborted by bpl_comm_abort on this rank") {
    if (aborted_.exchange(true, std::memory_order_acq_rel)) return false;
    fail(BPL_ERR_ABORTED, cause);
    return true;
  }

  // Marks the communicator revoked by this rank (bpl_comm_revoke): failed with REVOKED, unless it had
  // failed already. False if it already was revoked here.
  bool revoke(int32_t rank) {
    if (revoked_.exchange(true, std::memory_order_acq_rel)) return false;
    fail(BPL_ERR_REVOKED, "the communicator was revoked (bpl_comm_revoke) by rank " + std::to_string(rank) +
                              ", this rank");
    return true;
  }

  // Whether a failure with `status` leaves the group in an unknown state. Argument errors and
  // unsupported operations are found before anything is sent: the group is still in step.
  static bool poisons(bpl_status status) {
    return status != BPL_OK && status != BPL_ERR_INVALID_ARGUMENT && status != BPL_ERR_UNSUPPORTED;
  }

 private:
  std::atomic<int64_t> timeout_ms_;
  std::atomic<uint64_t> collectives_{0};
  std::atomic<uint64_t> point_to_point_{0};
  std::atomic<bool> failed_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> revoked_{false};
  mutable std::mutex mutex_;
  bpl_status status_ = BPL_OK;
  std::string cause_;
};

}  // namespace backplane
