// How the ranks of a world meet in the job's store before any connection is made. A store may outlive
// a world (bpl-run's bpl-store, a torchrun agent's, a caller's) while its processes call bpl_finalize
// and bpl_init again: each bpl_init therefore enters a world of its own, numbered per rank by the
// store, so that no key of an earlier world is taken for this one's, and the store forgets a world's
// keys once every rank has entered the next.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "kv_store.h"

namespace backplane::gloo_plugin {

// A world's place in the job's store: every key of it under `prefix`, "<base>/world<number>".
struct World {
  std::string base;
  int64_t number = 0;
  std::string prefix;
};

// Where the job's store says that `process` (rendezvous.h's process_key) ended, under a world's prefix.
inline std::string gone_key(const std::string& process) { return "gone/" + process; }

// Where the members of a job say that they counted `process` out of it (a shrink): under no world, so
// that a launcher finds it (bpl-run kills and replaces a stopped rank once it is there; run/job.py),
// spaces made '_' for the line-based client it asks through (bpl-store --client).
inline std::string counted_out_key(std::string process) {
  std::replace(process.begin(), process.end(), ' ', '_');
  return "backplane/counted_out/" + process;
}

// The world that `process` (this one's process_key) enters as `rank` under `base`: the next one
// `rank` has not been in yet. Another process that holds `rank` in the world before (a duplicate RANK)
// fails every rank waiting there at once, naming both (MISMATCH); a holder that ended (one that a
// newcomer replaced) does not.
World enter_world(KvStore& store, const std::string& base, int32_t rank, const std::string& process,
                  std::chrono::milliseconds timeout);

// Waits, bounded by `timeout`, until all `size` ranks arrived in `world`; the first rank to find the
// arrival failed (a duplicate, ranks disagreeing on the size, or ranks missing at the timeout) records
// why, and every rank waiting fails at once with the same message. Then newcomers are told that
// `world` is the job's (current_world), and rank 0 has the store forget the world before it.
void arrive(KvStore& store, const World& world, int32_t rank, int32_t size, std::chrono::milliseconds timeout);

// The world a newcomer joins (bpl_comm_join): the latest all of whose ranks arrived, else the first.
World current_world(KvStore& store, const std::string& base, std::chrono::milliseconds timeout);

}  // namespace backplane::gloo_plugin
