// BPL_TRACE=DIR: a timeline of what this rank ran. Every operation on a communicator (collectives and
// send/recv, blocking or as requests) is recorded with its communicator and number there, bytes, dtype,
// the path the backend takes for it, start, end and status, in a ring of the last BPL_TRACE_EVENTS
// (default 100000); the rank writes DIR/rank-<R>.json (Chrome's trace-event format, which Perfetto and
// chrome://tracing open) at bpl_finalize and when an operation fails, and at the process's exit for a
// runtime never finalized (a program that forgot to, or whose runtime something still holds). tools/bpl-trace merges the ranks'
// files into one timeline and says which rank the others waited for.
//
// Off (BPL_TRACE unset), an operation costs one pointer test.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "env_lookup.h"

namespace backplane {

class Trace {
 public:
  static constexpr int64_t kDefaultEvents = 100000;

  // From BPL_TRACE (the folder, created if absent) and BPL_TRACE_EVENTS; null when BPL_TRACE is unset.
  // Throws Error(INVALID_ARGUMENT) naming a bad value.
  static std::unique_ptr<Trace> from_environment(const EnvLookup& env, int32_t rank, int32_t world_size,
                                                 const std::string& backend);

  // What an operation is, as the trace shows it. `op` and `path` are static strings.
  struct What {
    const char* op;
    const std::string* comm;  // the communicator's name ("world", "world/split0/color1")
    uint64_t sequence;        // the operation's number on it
    uint64_t bytes;
    bpl_dtype dtype;          // 0 when it has none (barrier)
    const char* path;         // how the backend moves it ("shared memory, single copy", "tcp", "mpi", …)
  };

  // An operation starts; its ticket ends it.
  uint64_t begin(const What& what);
  void end(uint64_t ticket, bpl_status status);
  // Writes the ring (oldest first) to DIR/rank-<R>.json, through a temporary file renamed into place.
  // A failure to write is logged, never raised: tracing never fails the job.
  void write();

  ~Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

 private:
  Trace(std::string dir, size_t capacity, int32_t rank, int32_t world_size, std::string backend);
  // At exit, the traces still alive in the process that made them write themselves.
  static void write_those_alive_at_exit();

  struct Event {
    const char* op = "";
    std::string comm;
    uint64_t sequence = 0;
    uint64_t bytes = 0;
    bpl_dtype dtype = 0;
    const char* path = "";
    int64_t start_us = 0;  // wall clock, µs since the epoch (the ranks of a machine share it)
    int64_t end_us = -1;   // -1: not ended when written
    bpl_status status = BPL_OK;
  };
  int64_t now_us() const;

  const std::string dir_;
  const int32_t rank_;
  const int32_t world_size_;
  const std::string backend_;
  // Wall-clock time of the steady clock's origin here: durations from the steady clock, placed on
  // the wall clock so that the ranks' files line up.
  const std::chrono::steady_clock::time_point steady_origin_;
  const int64_t wall_origin_us_;
  const pid_t process_;  // a forked child's exit writes none of its parent's traces
  std::mutex mutex_;
  std::vector<Event> ring_;
  uint64_t begun_ = 0;  // tickets handed out; event `ticket` lives in ring_[ticket % size] while it is one of the last size
};

}  // namespace backplane
