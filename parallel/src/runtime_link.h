// What every ProcessGroup shares with the frontend's runtime (private to the library).
#pragma once

#include <atomic>
#include <mutex>
#include <set>

#include "backplane/backplane.h"

namespace backplane::parallel::detail {

// destroy_process_group destroys the communicators of groups still alive (modules hold their groups),
// then finalises and sets `runtime` to null, so a group that outlives it fails with a clear error
// instead of touching a finalised handle.
struct RuntimeLink {
  std::atomic<bpl_runtime*> runtime{nullptr};  // read by every operation, without the lock
  std::mutex mutex;                            // guards split_comms and the closing
  std::set<bpl_comm*> split_comms;
};

}  // namespace backplane::parallel::detail
