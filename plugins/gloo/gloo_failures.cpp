// How the gloo communicator names a failure: which of its peers (PeerDirectory) failed, were
// unreachable or stalled, and the communicator's first failure recorded for every rank to see.
#include "gloo_comm.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <numeric>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "dtypes.h"
#include "local_process.h"
#include "peer_reachability.h"
#include "plugin_support.h"
#include "rendezvous.h"
#include "shm_group.h"
#include "stall.h"
#include "gloo_comm_internal.h"

namespace backplane::gloo_plugin {

// Names the peer behind a failure, or says what is unknown here, never a wrong one. The peers of this
// machine whose process ended (REMOTE) or is stopped (TIMEOUT) are named first; for a timeout, then the
// peers on machines that acknowledge nothing (unreachable_peers_note). A connection that
// ended names its peer as the cause only if that peer's process ended, or runs here and failed on its
// own (it aborted): a peer on another machine may have closed it after a failure it saw itself, and
// is then only said to have closed it, unless it said whose end it followed (closed_after).
std::string GlooComm::failed_peers_note(const std::string& message, bpl_status status, int pair_peer) const {
  // The watch saw this peer's connection end first: what this rank's own operation saw after that is
  // its own connections being failed in turn. Otherwise the pair the failure came from, when the
  // operation tells, or the address in Gloo's message.
  int closed_by = status == BPL_ERR_REMOTE ? first_ended_.load() : -1;
  if (closed_by < 0 && status == BPL_ERR_REMOTE) closed_by = pair_peer;
  if (closed_by < 0) closed_by = peers_.rank_named_in(message);
  const auto local_pid = [&](int r) { return peers_.local_pid(r); };
  if (peers_.any_local_peer()) {
    // A killed peer's sockets close a moment before its process is marked ended, hence the short
    // wait for one.
    const auto wanted = status == BPL_ERR_TIMEOUT ? plugin::ProcessState::kStopped : plugin::ProcessState::kEnded;
    const auto give_up = std::chrono::steady_clock::now() +
                         (status == BPL_ERR_TIMEOUT ? std::chrono::milliseconds(0) : std::chrono::milliseconds(200));
    // The peer whose connection the watch saw end first, where its process ended, is the cause: a peer
    // whose process ended after it (it failed in turn and exited) followed it, and is not named.
    std::vector<pid_t> suspects = peers_.local_pids();
    const int first = first_ended_.load();
    if (status == BPL_ERR_REMOTE && first >= 0 && local_pid(first) != 0 &&
        plugin::process_state(local_pid(first)) == plugin::ProcessState::kEnded) {
      suspects.assign(suspects.size(), 0);
      suspects[static_cast<size_t>(first)] = local_pid(first);
    }
    for (;;) {
      const std::string note =
          plugin::local_peers_note(suspects, [&](plugin::ProcessState state) { return state == wanted; });
      if (!note.empty()) return note;
      if (std::chrono::steady_clock::now() >= give_up) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (status == BPL_ERR_TIMEOUT) {
    std::string unreachable = unreachable_peers_note();
    if (!unreachable.empty()) return unreachable;
  }
  if (closed_by < 0) return "";
  if (status == BPL_ERR_REMOTE) closed_by = closed_after(closed_by);  // a peer that followed another's end
  if (local_pid(closed_by) == 0) {
    return " (the connection to rank " + std::to_string(closed_by) +
           ", on another machine, ended: it ended, aborted, or closed it after a failure of its own)";
  }
  return " (the connection to rank " + std::to_string(closed_by) + " ended while its process " +
         std::to_string(local_pid(closed_by)) + " on this machine runs: it aborted, or closed it after a failure of its own)";
}

std::string GlooComm::unreachable_peers_note() const {
  struct Silent {
    std::set<int> ranks;
    std::chrono::milliseconds longest{0};
  };
  std::map<std::string, Silent> silent_hosts;  // a peer machine's address → its ranks that do not answer
  for (const PairSocket& socket : sockets_) {
    if (!peers_.on_another_machine(socket.peer)) continue;
    const std::optional<std::chrono::milliseconds> waited = unanswered_for(socket.fd);
    if (!waited) continue;
    const std::string address = address_of(socket.fd, false);  // "[host]:port", or "" if it cannot be read
    const size_t end = address.rfind(']');
    Silent& host = silent_hosts[end == std::string::npos ? "an address unknown here" : address.substr(1, end - 1)];
    host.ranks.insert(socket.peer);
    host.longest = std::max(host.longest, *waited);
  }
  std::ostringstream note;
  note << std::fixed << std::setprecision(1);
  for (const auto& [host, seen] : silent_hosts) {
    note << (note.tellp() == 0 ? " (" : "; ") << (seen.ranks.size() == 1 ? "rank " : "ranks ");
    for (auto rank = seen.ranks.begin(); rank != seen.ranks.end(); ++rank) {
      note << (rank == seen.ranks.begin() ? "" : ", ") << *rank;
    }
    note << " at " << host << (seen.ranks.size() == 1 ? " is" : " are")
         << " unreachable: that machine acknowledged nothing this rank sent for " << seen.longest.count() / 1000.0 << " s";
  }
  if (silent_hosts.size() == 1) note << "; the network to it is cut, or it is down)";
  if (silent_hosts.size() > 1) note << "; the network to those machines is cut, or they are down)";
  return note.str();
}

bpl_status GlooComm::status_of(const std::exception& e) const {
  const bpl_status status = classify_exception(e);
  return status == BPL_ERR_INTERNAL && first_ended_.load() >= 0 ? BPL_ERR_REMOTE : status;
}

Error GlooComm::failure(const std::exception& e) {
  if (aborted_.load()) {
    return Error(BPL_ERR_ABORTED, "the communicator was aborted (bpl_comm_abort) on this rank (" +
                                      std::string(e.what()) + ")");
  }
  if (revoked_.load()) {
    return Error(BPL_ERR_REVOKED, "the communicator was revoked (bpl_comm_revoke) on this rank (" +
                                      std::string(e.what()) + ")");
  }
  const bpl_status status = status_of(e);
  // A member revoked it: what ended this operation is that (ULFM's MPI_ERR_REVOKED), whatever Gloo saw.
  if (status == BPL_ERR_REMOTE || status == BPL_ERR_TIMEOUT) {
    const int by = revoked_by();
    if (by >= 0) {
      failed_ = true;
      shut_down_connections();
      return Error(BPL_ERR_REVOKED, "the communicator was revoked (bpl_comm_revoke) by rank " + std::to_string(by) +
                                        " of this communicator (here: " + e.what() + ")");
    }
  }
  // A stall is explained by what the ranks called; so is a connection that ended because a peer's own
  // stall timed out (Gloo closes the pair it waited on), which this rank then only reads, not waits for.
  if (status == BPL_ERR_TIMEOUT || status == BPL_ERR_REMOTE) {
    const auto wait = status == BPL_ERR_TIMEOUT ? explanation_window(timeout()) : std::chrono::milliseconds(0);
    if (std::optional<std::string> mismatch = explain_stall(wait)) return recorded_failure(BPL_ERR_MISMATCH, *mismatch);
  }
  std::string message = e.what();
  const std::string peers_note =
      status == BPL_ERR_REMOTE || status == BPL_ERR_TIMEOUT ? failed_peers_note(message, status) : "";
  message += peers_note;
  if (status == BPL_ERR_TIMEOUT) {
    message += " (no peer of this rank in the operation made progress within " + std::to_string(timeout().count()) +
               (peers_note.empty() ? " ms: one is stopped, stuck or far behind)" : " ms)");
  }
  return recorded_failure(status, message, record_defer(status, peers_note));
}

// A failure whose cause may be on another machine is seen at about the same moment by a rank of that
// machine, which can name it (a stopped rank there, or a peer there whose process ended): a timeout
// this rank cannot explain, or a connection to another machine that ended (it may only have followed
// a failure there), waits a moment for that rank's record to come first.
std::chrono::milliseconds GlooComm::record_defer(bpl_status status, const std::string& peers_note) const {
  const bool spans_machines = peers_.machine_count() > 1;
  const bool unexplained = status == BPL_ERR_TIMEOUT ? peers_note.empty()
                                                     : peers_note.find("on another machine") != std::string::npos;
  return spans_machines && unexplained ? explanation_window(timeout()) : std::chrono::milliseconds(0);
}

void GlooComm::leave_after_failure() {
  if (size() == 1 || shared_->store_host_rank < 0) return;  // a store that outlives every rank
  const std::string key = uid_ + "/left_after_failure/";
  if (rank() != shared_->store_host_rank) {
    shared_->board->publish(key + std::to_string(rank()), "1");
    return;
  }
  // Not waited for: the peers of this machine whose process ended or is stopped.
  std::vector<std::string> running;
  for (int r = 0; r < size(); ++r) {
    const pid_t pid = peers_.local_pid(r);
    if (r == rank() || (pid != 0 && plugin::process_state(pid) != plugin::ProcessState::kRunning)) continue;
    running.push_back(key + std::to_string(r));
  }
  // Within the window in which ranks that fail at about the same moment wait for each other's word: a
  // peer that fails later than that names what it saw itself.
  shared_->board->gather(running, explanation_window(timeout()));
}

StallReport::Running GlooComm::begin(const Fingerprint& call) {
  current_ = call;
  path_->set_call(current_);
  return StallReport::begin(stall_report_.get(), current_);
}

uint32_t GlooComm::tag() const {
  const uint64_t hash = call_hash(current_);
  return static_cast<uint32_t>(hash ^ (hash >> 32));
}

std::optional<std::string> GlooComm::explain_stall(std::chrono::milliseconds wait) {
  // A segment of every rank tells a mismatch itself.
  if (path_->segment_holds_every_rank() || current_.sequence == 0) return std::nullopt;
  // After its first failure a rank's operations say nothing of what it was called for: peers still in
  // the failed operation must not read them as the collective it calls instead.
  if (failed_.load()) return std::nullopt;
  const std::string key = uid_ + "/stalled/" + std::to_string(current_.sequence) + "/";
  const auto through_the_store = [&](const Fingerprint& mine, std::chrono::milliseconds window) {
    shared_->board->publish(key + std::to_string(rank()), encode_text(mine));
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(key + std::to_string(r));
    std::vector<std::optional<Fingerprint>> said;
    for (const std::optional<std::string>& text : shared_->board->gather(keys, window)) {
      said.push_back(text ? decode_text(*text) : std::nullopt);
    }
    return said;
  };
  std::string mismatch = backplane::explain_stall(current_, rank(), wait, through_the_store).mismatch;
  if (mismatch.empty()) return std::nullopt;
  return mismatch;
}

Error GlooComm::recorded_failure(bpl_status status, const std::string& message, std::chrono::milliseconds defer) {
  if (status != BPL_ERR_REMOTE && status != BPL_ERR_TIMEOUT && status != BPL_ERR_MISMATCH) return Error(status, message);
  // "<status>|<rank>|<message>": the first failure recorded for this communicator.
  const std::string mine = std::to_string(status) + "|" + std::to_string(rank()) + "|" + message;
  failed_ = true;
  // A connection that ended is a peer's end, which the watch may still be following; any other failure
  // is this rank's own, and the ends the watch then sees are of the connections shut down here.
  if (status != BPL_ERR_REMOTE) ended_own_connections_ = true;
  const std::string first = shared_->board->record_first(uid_ + "/first_failure", mine, defer);
  shut_down_connections();
  // A rank that found the ranks disagreeing says so, whatever another rank recorded before it knew.
  if (status == BPL_ERR_MISMATCH) return Error(status, message);
  const size_t bar1 = first.find('|'), bar2 = first.find('|', bar1 + 1);
  if (first == mine || bar1 == std::string::npos || bar2 == std::string::npos) return Error(status, message);
  const auto first_status = static_cast<bpl_status>(std::atoi(first.c_str()));
  return Error(first_status, first.substr(bar2 + 1) + " [the communicator's first failure, seen by rank " +
                                 first.substr(bar1 + 1, bar2 - bar1 - 1) + "; here: " + message + "]");
}

}  // namespace backplane::gloo_plugin
