#include "gloo_comm.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
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
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "dtypes.h"
#include "local_process.h"
#include "peer_reachability.h"
#include "plugin_support.h"
#include "rendezvous.h"
#include "shm_group.h"
#include "gloo_comm_internal.h"

namespace backplane::gloo_plugin {

bpl_status classify_exception(const std::exception& e) {
  if (auto* error = dynamic_cast<const Error*>(&e)) return error->status();
  if (auto* io = dynamic_cast<const ::gloo::IoException*>(&e)) {
    // Gloo has one exception type for a wait that timed out and a connection that failed: only its
    // text ("Timed out waiting ...") tells them apart.
    return std::strstr(io->what(), "Timed out") != nullptr ? BPL_ERR_TIMEOUT : BPL_ERR_REMOTE;
  }
  return BPL_ERR_INTERNAL;
}

GlooComm::GlooComm(std::shared_ptr<Shared> shared, std::string uid, int rank, int size,
                   std::chrono::milliseconds timeout)
    : shared_(std::move(shared)),
      uid_(std::move(uid)),
      timeout_ms_(timeout.count()),
      queue_(classify, timeout),
      scratch_(2) {
  auto context = std::make_shared<ReleasableContext>(rank, size);
  context->setTimeout(timeout);
  ::gloo::rendezvous::PrefixStore store(uid_, *shared_->store);
  context->connect_full_mesh(store, shared_->device);
  context_ = std::move(context);
  // Unless set_up_shared_memory finds ranks sharing a machine.
  path_ = std::make_unique<TcpPath>(*this, size == 1 ? "single rank" : "gloo over tcp");
  std::vector<std::string> own_ends(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) own_ends[static_cast<size_t>(r)] = r == rank ? "" : context_->getPair(r)->address().str();
  peers_.learn(store, rank, own_ends);
  set_up_shared_memory(store);
  watch_connections();
}

GlooComm::~GlooComm() {
  queue_.shut_down();
  if (watched_ != 0) shared_->watch->unwatch(watched_);
  for (const PairSocket& socket : sockets_) ::close(socket.fd);
  // Before the connections close: the peers' watches then know this rank left, and did not fail.
  // Where every rank shares this machine the segment tells them; the store is not asked, as a torch
  // program's may have ended with rank 0, which served it.
  if (size() > 1 && !failed_.load() && !path_->say_left()) {
    shared_->board->publish(uid_ + "/left/" + std::to_string(rank()), "1");
  }
}

void GlooComm::set_timeout(std::chrono::milliseconds timeout) {
  timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  queue_.set_op_timeout(timeout);
}

void GlooComm::abort() {
  failed_ = true;
  ended_own_connections_ = true;
  if (aborted_.exchange(true)) return;
  const std::string reason = "the communicator was aborted (bpl_comm_abort) by rank " + std::to_string(rank()) +
                             " of this communicator";
  // Recorded first, so that a peer whose connection to this rank fails names the abort.
  if (size() > 1) shared_->board->record_first(uid_ + "/first_failure", std::to_string(BPL_ERR_REMOTE) + "|" +
                                                                         std::to_string(rank()) + "|" + reason,
                                               std::chrono::milliseconds(0));
  path_->fail(BPL_ERR_ABORTED, "shared memory: " + reason);
  shut_down_connections();
}

void GlooComm::watch_connections() {
  if (!shared_->watch) return;
  std::map<std::string, int> peer_of_end;  // a pair's local end → rank in this communicator
  for (int r = 0; r < size(); ++r) {
    if (r != rank() && context_->getPair(r)) peer_of_end[context_->getPair(r)->address().str()] = r;
  }
  path_->add_connection_ends(peer_of_end);
  DIR* descriptors = ::opendir("/proc/self/fd");
  if (descriptors == nullptr) return;
  while (dirent* entry = ::readdir(descriptors)) {
    const int fd = std::atoi(entry->d_name);
    struct stat status {};
    if (fd <= 2 || ::fstat(fd, &status) != 0 || !S_ISSOCK(status.st_mode)) continue;
    const auto peer = peer_of_end.find(address_of(fd, true));
    if (peer == peer_of_end.end()) continue;
    // A descriptor of its own for the same socket: still valid after Gloo closes its own (the watch
    // then still sees the connection end, and a shutdown never reaches a socket that took the number).
    const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (own >= 0) sockets_.push_back({own, peer->second});
  }
  ::closedir(descriptors);
  std::vector<std::pair<int, int>> watched;
  for (const PairSocket& socket : sockets_) {
    watched.emplace_back(socket.fd, socket.peer);
    if (peers_.on_another_machine(socket.peer)) probe_while_idle(socket.fd);
    // The leaders' mesh too: Gloo's messages name a pair by its peer's end.
    const std::string peer_end = address_of(socket.fd, false);
    if (!peer_end.empty()) peers_.add_end(peer_end, socket.peer);
  }
  // Shared memory says itself what its collectives wait for.
  if (!path_->segment_holds_every_rank()) stall_report_ = StallReport::make_if_wanted(shared_->board, uid_, rank(), size());
  std::function<void()> check;
  if (stall_report_) check = [this] { stall_report_->check(timeout()); };
  watched_ = shared_->watch->watch(watched, [this](int peer) { connection_ended(peer); }, std::move(check),
                                   StallReport::interval(timeout()));
}

void GlooComm::shut_down_connections() {
  for (const PairSocket& socket : sockets_) ::shutdown(socket.fd, SHUT_RDWR);
  // The sends and recvs in flight, Gloo's algorithms' too: released here, whatever state the
  // connection left Gloo's pair in.
  context_->release();
  path_->release_connections();
}

void GlooComm::connection_ended(int peer) {
  if (ended_own_connections_.load()) return;  // this rank shut them down: no peer's end to follow
  int cause = peer;
  if (const std::optional<bool> left = path_->has_left(peer)) {
    if (*left) return;  // the segment says who left (and the peers' processes who ended)
  } else {
    // One lookup for both, so that a stopped store's host costs one bound, not two: whether the peer
    // left, and whose end it followed if it did not.
    std::vector<std::string> keys = {uid_ + "/left/" + std::to_string(peer)};
    if (says_whose_end_it_follows()) keys.push_back(closed_after_key(peer));
    const std::vector<std::optional<std::string>> said = shared_->board->gather(keys, std::chrono::milliseconds(0));
    if (said[0]) return;
    if (said.size() > 1) cause = cause_in(said[1], peer);
  }
  int none = -1;
  first_ended_.compare_exchange_strong(none, cause);
  if (says_whose_end_it_follows()) {
    shared_->board->publish(closed_after_key(rank()), std::to_string(first_ended_.load()));
  }
  let_gloo_read_what_arrived(peer);
  shut_down_connections();
}

void GlooComm::let_gloo_read_what_arrived(int peer) const {
  constexpr auto kLongest = std::chrono::milliseconds(200);
  const auto give_up = plugin::deadline_after(kLongest);
  for (const PairSocket& socket : sockets_) {
    if (socket.peer != peer) continue;
    int unread = 0;
    while (::ioctl(socket.fd, FIONREAD, &unread) == 0 && unread > 0 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

int GlooComm::closed_after(int peer) const {
  if (!says_whose_end_it_follows() || peer < 0 || peer >= size()) return peer;
  return cause_in(shared_->board->gather({closed_after_key(peer)}, std::chrono::milliseconds(0)).front(), peer);
}

int GlooComm::cause_in(const std::optional<std::string>& said, int peer) const {
  const int cause = said ? std::atoi(said->c_str()) : -1;
  return cause >= 0 && cause < size() && cause != rank() ? cause : peer;
}

int GlooComm::ranks_on_this_machine() const {
  return static_cast<int>(peers_.ranks_beside(rank()).size());
}

// Ranks are grouped by machine (PeerDirectory). All on one: every collective goes through one segment.
// Spanning machines with some sharing one: each machine's ranks share a segment, and one rank per
// machine (its lowest) joins the leaders' Gloo mesh (hierarchical path). Otherwise: Gloo over TCP.
void GlooComm::set_up_shared_memory(::gloo::rendezvous::Store& store) {
  // BPL_GLOO_SHM: shared memory among the ranks that share a machine. BPL_GLOO_SINGLE_COPY: large
  // collectives, and send/recv, read the peers' buffers directly where the kernel allows (see
  // ShmGroup); off, every collective's bytes go through the segment, and send/recv over Gloo.
  const bool wanted = plugin::env_switch("BPL_GLOO_SHM", true);
  const bool single_copy = plugin::env_switch("BPL_GLOO_SINGLE_COPY", true);
  if (size() == 1) return;
  const int machines = peers_.machine_count();
  const std::vector<int> local_ranks = peers_.ranks_beside(rank());
  if (machines == size()) {
    path_ = std::make_unique<TcpPath>(*this, "gloo over tcp (each rank on a machine of its own)");
    return;
  }
  std::string refusal;
  std::unique_ptr<ShmGroup> group = map_machine_segment(store, local_ranks, wanted, refusal);
  if (!refusal.empty()) {
    path_ = std::make_unique<TcpPath>(*this, "gloo over tcp (shared memory not used: " + refusal + ")");
    return;
  }
  std::string copies;  // how large messages move within this machine
  if (group) {
    const std::string no_single_copy = group->enable_single_copy(single_copy, timeout());
    copies = no_single_copy.empty() ? "large messages in a single copy" : "no single copy: " + no_single_copy;
  }
  if (machines == 1) {
    path_ = std::make_unique<ShmPath>(
        *this, "shared memory (all " + std::to_string(size()) + " ranks on this machine; " + copies + ")", std::move(group));
    return;
  }
  std::shared_ptr<ReleasableContext> leaders;
  if (local_ranks.front() == rank()) {
    leaders = std::make_shared<ReleasableContext>(peers_.machine(rank()), machines);
    leaders->setTimeout(timeout());
    ::gloo::rendezvous::PrefixStore leaders_store("leaders", store);
    leaders->connect_full_mesh(leaders_store, shared_->device);
  }
  // `group` is null where this rank is alone on its machine.
  path_ = std::make_unique<HierarchicalPath>(
      *this,
      "shared memory within each of " + std::to_string(machines) + " machines, gloo over tcp between them (" +
          std::to_string(local_ranks.size()) + " of " + std::to_string(size()) + " ranks on this one" +
          (copies.empty() ? "" : "; " + copies) + ")",
      std::move(group), std::move(leaders));
}

// The lowest of `local_ranks` creates the machine's segment and publishes its name; the others map
// it; then every rank of the communicator says whether it could, and `refusal` names the first rank
// that could not ("" when all could: only then is shared memory used anywhere). The creator removes
// the name once every rank has answered, so nothing is left in /dev/shm whatever happens to the
// processes afterwards. Null for a rank alone on its machine.
std::unique_ptr<ShmGroup> GlooComm::map_machine_segment(::gloo::rendezvous::Store& store,
                                                        const std::vector<int>& local_ranks, bool wanted,
                                                        std::string& refusal) {
  const auto local_size = static_cast<int>(local_ranks.size());
  const auto local_rank = static_cast<int>(std::find(local_ranks.begin(), local_ranks.end(), rank()) - local_ranks.begin());
  const std::string name_key = "shm/name/" + std::to_string(local_ranks.front());
  std::unique_ptr<ShmGroup> group;
  std::string name;
  std::string answer = "1";  // or why this rank cannot use shared memory
  try {
    if (!wanted) throw Error(BPL_ERR_UNSUPPORTED, "BPL_GLOO_SHM=0");
    if (local_size > 1 && local_rank == 0) {
      name = ShmGroup::new_segment_name();
      ShmGroup::remove_abandoned_segments();
      group = ShmGroup::create(name, local_size);
    }
  } catch (const Error& e) {
    answer = e.what();
    name.clear();
  }
  if (local_size > 1 && local_rank == 0) {
    store.set(name_key, std::vector<char>(name.begin(), name.end()));
  } else if (local_size > 1) {
    const std::vector<char> published = store.get(name_key);
    name.assign(published.begin(), published.end());
    try {
      if (!wanted) throw Error(BPL_ERR_UNSUPPORTED, "BPL_GLOO_SHM=0");
      if (name.empty()) throw Error(BPL_ERR_UNSUPPORTED, "rank " + std::to_string(local_ranks.front()) + " has no segment");
      group = ShmGroup::open(name, local_rank, local_size);
    } catch (const Error& e) {
      answer = e.what();
    }
  }
  struct Unlink {
    const std::string& name;
    bool owner;
    ~Unlink() {
      if (owner && !name.empty()) ::shm_unlink(name.c_str());
    }
  } unlink{name, local_rank == 0};
  store.set("shm/answer/" + std::to_string(rank()), std::vector<char>(answer.begin(), answer.end()));
  for (int r = 0; r < size(); ++r) {
    const std::vector<char> theirs = store.get("shm/answer/" + std::to_string(r));
    if (refusal.empty() && std::string(theirs.begin(), theirs.end()) != "1") {
      refusal = "rank " + std::to_string(r) + ": " + std::string(theirs.begin(), theirs.end());
    }
  }
  if (!refusal.empty()) return nullptr;
  if (group) {
    std::vector<pid_t> pids;
    for (int r : local_ranks) pids.push_back(peers_.local_pid(r));
    group->set_peers(std::move(pids), local_ranks);
  }
  return group;
}

void GlooComm::post(size_t bytes, std::function<void()> body, bpl_plugin_request** req) {
  // A small request is left for its waiter to run (op_queue.h): waking the worker costs more than it.
  // A large one starts at once, so that it overlaps with what its caller does before waiting (a DDP
  // bucket's allreduce during the backward pass), and a wake is nothing beside it.
  constexpr size_t kLeftForWaiterBytes = 64 << 10;
  const auto start = bytes <= kLeftForWaiterBytes ? plugin::OpQueue::Start::when_unclaimed : plugin::OpQueue::Start::now;
  *req = reinterpret_cast<bpl_plugin_request*>(static_cast<Request*>(new QueuedRequest(queue_.post(std::move(body), start), &queue_)));
}

void GlooComm::rethrow_classified(const std::exception_ptr& thrown) {
  try {
    std::rethrow_exception(thrown);
  } catch (const Error&) {
    throw;  // the plugin's own, already classified
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const plugin::OpQueue::QueuedFailure& queued) {
    throw Error(queued.status, queued.message);
  } catch (const std::exception& e) {
    throw failure(e);
  }
}

char* GlooComm::scratch(size_t slot, size_t bytes) {
  std::vector<char>& buffer = scratch_[slot];
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

}  // namespace backplane::gloo_plugin
