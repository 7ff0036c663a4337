// A gloo rank's directory of its peers (peer_directory.h).
#include "peer_directory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <set>

#include "local_process.h"
#include "rendezvous.h"

namespace backplane::gloo_plugin {

namespace {

// The lines of a peer's record in the store.
std::vector<std::string> lines_of(const std::vector<char>& bytes) {
  std::vector<std::string> lines;
  std::string line;
  for (char c : bytes) {
    if (c == '\n') {
      lines.push_back(line);
      line.clear();
    } else {
      line += c;
    }
  }
  return lines;
}

}  // namespace

// A connected Gloo pair names its peer by the connection's remote end, which each rank publishes as
// its own end. (The addresses a pair announced before connecting are not used: a pair that connects
// gives up its listening port, which a later socket of any rank may then take, so that port would name
// the wrong rank.) The processes let a failure that names no known address still be traced to a peer
// on this machine that has ended or is stopped.
void PeerDirectory::learn(::gloo::rendezvous::Store& store, int rank, const std::vector<std::string>& own_ends) {
  const auto size = own_ends.size();
  self_ = rank;
  machines_.assign(size, 0);
  if (size == 1) return;
  const std::string my_process_space = plugin::process_space_identity() + machine_partition();
  std::string mine = my_process_space + "\n" + std::to_string(::getpid()) + "\n";
  for (const std::string& end : own_ends) mine += end + "\n";
  store.set("peers/" + std::to_string(rank), std::vector<char>(mine.begin(), mine.end()));
  local_pids_.assign(size, 0);
  processes_.assign(size, "");
  processes_[static_cast<size_t>(rank)] = process_key(my_process_space, std::to_string(::getpid()));
  std::vector<std::string> process_space_of_rank(size);
  for (size_t r = 0; r < size; ++r) {
    if (r == static_cast<size_t>(rank)) {
      process_space_of_rank[r] = my_process_space;
      continue;
    }
    const std::vector<std::string> theirs = lines_of(store.get("peers/" + std::to_string(r)));
    if (theirs.size() != size + 2) {
      process_space_of_rank[r] = "unknown: rank " + std::to_string(r);
      continue;
    }
    process_space_of_rank[r] = theirs[0];
    processes_[r] = process_key(theirs[0], theirs[1]);
    if (theirs[0] == my_process_space) local_pids_[r] = std::atoi(theirs[1].c_str());
    peer_of_address_[theirs[2 + static_cast<size_t>(rank)]] = static_cast<int>(r);
  }
  int machines = 0;
  for (size_t r = 0; r < size; ++r) {
    const auto first = static_cast<size_t>(
        std::find(process_space_of_rank.begin(), process_space_of_rank.end(), process_space_of_rank[r]) -
        process_space_of_rank.begin());
    machines_[r] = first == r ? machines++ : machines_[first];
  }
}

bool PeerDirectory::any_local_peer() const {
  return std::any_of(local_pids_.begin(), local_pids_.end(), [](pid_t pid) { return pid != 0; });
}

const std::string& PeerDirectory::process(int rank) const {
  static const std::string unknown;
  return processes_.empty() ? unknown : processes_[static_cast<size_t>(rank)];
}

int PeerDirectory::machine_count() const {
  return machines_.empty() ? 1 : 1 + *std::max_element(machines_.begin(), machines_.end());
}

int PeerDirectory::first_rank_on(int machine) const {
  return static_cast<int>(std::find(machines_.begin(), machines_.end(), machine) - machines_.begin());
}

std::vector<int> PeerDirectory::ranks_beside(int rank) const {
  std::vector<int> ranks;
  for (size_t r = 0; r < std::max<size_t>(machines_.size(), 1); ++r) {
    if (machine(static_cast<int>(r)) == machine(rank)) ranks.push_back(static_cast<int>(r));
  }
  return ranks;
}

int PeerDirectory::rank_named_in(const std::string& message) const {
  static const std::regex address_in_message(R"(\[[^\]]*\]:\d+)");
  auto host_of = [](const std::string& address) { return address.substr(0, address.rfind(':')); };
  for (std::sregex_iterator it(message.begin(), message.end(), address_in_message), end; it != end; ++it) {
    const auto known = peer_of_address_.find(it->str());
    if (known != peer_of_address_.end()) return known->second;
    // Gloo sometimes names a pair by a port of the peer that is neither end known here (seen across
    // test hosts): the host then tells, when a single rank of this communicator runs there.
    std::set<int> there;
    for (const auto& [address, peer] : peer_of_address_) {
      if (host_of(address) == host_of(it->str())) there.insert(peer);
    }
    if (there.size() == 1) return *there.begin();
  }
  return -1;
}

}  // namespace backplane::gloo_plugin
