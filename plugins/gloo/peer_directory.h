// What a rank of a gloo communicator knows of its peers, learned once through the store: each rank's
// process and machine, and the rank behind each end of this rank's connections, so that a failure
// names the rank behind it (gloo_failures.cpp) and ranks sharing a machine find each other.
#pragma once

#include <gloo/rendezvous/store.h>

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace backplane::gloo_plugin {

class PeerDirectory {
 public:
  // Publishes this rank's process and `own_ends` (its end of the connection to each rank, "" for
  // itself) under "peers/<rank>" in `store`, and learns every peer's.
  void learn(::gloo::rendezvous::Store& store, int rank, const std::vector<std::string>& own_ends);
  // A connection end seen later (a socket's peer address, "[host]:port") and the rank behind it.
  void add_end(const std::string& address, int peer) { peer_of_address_.emplace(address, peer); }

  // The pid of `rank`'s process where it runs on this machine; 0 for this rank, for a peer elsewhere,
  // and before learn.
  pid_t local_pid(int rank) const { return local_pids_.empty() ? 0 : local_pids_[static_cast<size_t>(rank)]; }
  const std::vector<pid_t>& local_pids() const { return local_pids_; }
  bool any_local_peer() const;
  // `rank`'s process as the store knows it (rendezvous.h's process_key), "" where unknown.
  const std::string& process(int rank) const;
  // Machines are numbered in order of their lowest rank, identically on every rank; one before learn.
  int machine(int rank) const { return machines_.empty() ? 0 : machines_[static_cast<size_t>(rank)]; }
  int machine_count() const;
  // The lowest rank on machine `machine`.
  int first_rank_on(int machine) const;
  // The ranks on `rank`'s machine, ascending.
  std::vector<int> ranks_beside(int rank) const;
  bool on_another_machine(int peer) const { return machine(peer) != machine(self_); }
  // The rank an address in Gloo's `message` names ("[host]:port", looked up whole, or by its host
  // where a single rank runs there), or -1.
  int rank_named_in(const std::string& message) const;

 private:
  int self_ = 0;
  std::map<std::string, int> peer_of_address_;
  std::vector<pid_t> local_pids_;
  std::vector<std::string> processes_;
  std::vector<int> machines_;
};

}  // namespace backplane::gloo_plugin
