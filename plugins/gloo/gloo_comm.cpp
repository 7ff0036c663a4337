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

namespace {

std::pair<bpl_status, std::string> classify(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
    return {BPL_ERR_OUT_OF_MEMORY, "out of memory"};
  } catch (const std::exception& e) {
    return {classify_exception(e), e.what()};
  } catch (...) {
    return {BPL_ERR_INTERNAL, "unknown exception"};
  }
}

// A collective posted to the communicator's queue (`queue`, which outlives its requests). A wait for
// its end (as long as the operation's own bound, or longer) that finds it next in line, not yet taken
// by the worker, runs it on the waiting thread; a shorter wait only waits, so that it returns at its
// timeout with the operation in flight.
class QueuedRequest : public Request {
 public:
  explicit QueuedRequest(std::shared_ptr<plugin::Operation> op, plugin::OpQueue* queue = nullptr)
      : op_(std::move(op)), queue_(queue) {}
  bpl_status test(int32_t* done) override {
    *done = op_->ended() ? 1 : 0;
    if (!*done && queue_ != nullptr) queue_->hurry();  // whoever polls expects it to move now
    return *done ? result() : BPL_OK;
  }
  bpl_status wait(std::chrono::milliseconds timeout) override {
    if (queue_ != nullptr && !op_->ended()) {
      if (timeout < queue_->op_timeout() || !queue_->run_if_next(op_)) queue_->hurry();
    }
    if (!op_->wait_for(timeout)) {
      plugin::host()->set_error(("gloo: the operation has not ended after " + std::to_string(timeout.count()) +
                                 " ms; it is still in flight")
                                    .c_str());
      return BPL_ERR_TIMEOUT;
    }
    return result();
  }
  bpl_status finish() override {
    if (queue_ != nullptr && !op_->ended()) queue_->hurry();
    if (op_->wait_for_deadline()) return BPL_OK;
    plugin::host()->set_error("gloo: the operation did not end within its timeout; its buffers may still be in use");
    return BPL_ERR_TIMEOUT;
  }

 private:
  bpl_status result() {
    if (op_->status() != BPL_OK) plugin::host()->set_error(("gloo: " + op_->message()).c_str());
    return op_->status();
  }
  std::shared_ptr<plugin::Operation> op_;
  plugin::OpQueue* queue_;
};

// An asynchronous send or recv: posted to Gloo at once; a thread waits for its completion with the
// communicator's timeout, because Gloo's own wait with a shorter timeout would close the whole context.
class PointToPointRequest : public Request {
 public:
  // `complete` waits, within the communicator's timeout, for the posted transfer to finish.
  explicit PointToPointRequest(std::function<void()> complete)
      : op_(std::make_shared<plugin::Operation>(std::move(complete))) {
    waiter_ = std::thread([op = op_] { op->run(classify); });
  }
  ~PointToPointRequest() override {
    if (waiter_.joinable()) waiter_.join();
  }
  bpl_status test(int32_t* done) override { return QueuedRequest(op_).test(done); }
  bpl_status wait(std::chrono::milliseconds timeout) override { return QueuedRequest(op_).wait(timeout); }
  bpl_status finish() override {
    waiter_.join();  // the waiter ends within the communicator's timeout
    return BPL_OK;
  }

 private:
  std::shared_ptr<plugin::Operation> op_;
  std::thread waiter_;
};

}  // namespace

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
  path_ = std::make_unique<TcpPath>(*this);  // unless set_up_shared_memory finds ranks sharing a machine
  learn_peers(store);
  set_up_shared_memory(store);
  watch_connections();
}

GlooComm::~GlooComm() {
  queue_.shut_down();
  if (watched_ != 0) shared_->watch->unwatch(watched_);
  for (const PairSocket& socket : sockets_) ::close(socket.fd);
  // Before the connections close: the peers' watches then know this rank left, and did not fail.
  if (size() > 1 && !failed_.load()) shared_->board->publish(uid_ + "/left/" + std::to_string(rank()), "1");
}

void GlooComm::set_timeout(std::chrono::milliseconds timeout) {
  timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  queue_.set_op_timeout(timeout);
}

void GlooComm::abort() {
  failed_ = true;
  if (aborted_.exchange(true)) return;
  const std::string reason = "the communicator was aborted (bpl_comm_abort) by rank " + std::to_string(rank()) +
                             " of this communicator";
  // Recorded first, so that a peer whose connection to this rank fails names the abort.
  if (size() > 1) shared_->board->record_first(uid_ + "/first_failure", std::to_string(BPL_ERR_REMOTE) + "|" +
                                                                         std::to_string(rank()) + "|" + reason,
                                               std::chrono::milliseconds(0));
  if (shm_) shm_->fail(BPL_ERR_ABORTED, "shared memory: " + reason);
  if (machine_shm_) machine_shm_->fail(BPL_ERR_ABORTED, "shared memory: " + reason);
  shut_down_connections();
}

namespace {

std::string address_of(int fd, bool local) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  const int got = local ? ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length)
                        : ::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length);
  if (got != 0 || (address.ss_family != AF_INET && address.ss_family != AF_INET6)) return "";
  return ::gloo::transport::tcp::Address(address).str();
}

}  // namespace

void GlooComm::watch_connections() {
  if (!shared_->watch) return;
  std::map<std::string, int> peer_of_end;  // a pair's local end → rank in this communicator
  for (int r = 0; r < size(); ++r) {
    if (r != rank() && context_->getPair(r)) peer_of_end[context_->getPair(r)->address().str()] = r;
  }
  if (leaders_) {
    for (int m = 0; m < leaders_->size; ++m) {
      if (m == leaders_->rank || !leaders_->getPair(m)) continue;
      const int leader = static_cast<int>(std::find(machine_of_rank_.begin(), machine_of_rank_.end(), m) - machine_of_rank_.begin());
      peer_of_end[leaders_->getPair(m)->address().str()] = leader;
    }
  }
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
    if (on_another_machine(socket.peer)) probe_while_idle(socket.fd);
    // The leaders' mesh too: Gloo's messages name a pair by its peer's end.
    const std::string peer_end = address_of(socket.fd, false);
    if (!peer_end.empty()) peer_of_address_.emplace(peer_end, socket.peer);
  }
  watched_ = shared_->watch->watch(watched, [this](int peer) { connection_ended(peer); });
}

void GlooComm::shut_down_connections() {
  for (const PairSocket& socket : sockets_) ::shutdown(socket.fd, SHUT_RDWR);
  // The sends and recvs in flight, Gloo's algorithms' too: released here, whatever state the
  // connection left Gloo's pair in.
  context_->release();
  if (leaders_) leaders_->release();
}

void GlooComm::connection_ended(int peer) {
  if (aborted_.load()) return;  // this rank's own abort shut them down
  if (shared_->board->gather({uid_ + "/left/" + std::to_string(peer)}, std::chrono::milliseconds(0)).front()) return;
  int none = -1;
  first_ended_.compare_exchange_strong(none, peer);
  shut_down_connections();
}

namespace {

// BPL_GLOO_HOST_ID: ranks of one machine with different values are treated as on different machines
// (as NCCL_HOSTID does), to run the hierarchical path on one machine. It can only split a machine.
std::string machine_partition() {
  const char* value = plugin::env("BPL_GLOO_HOST_ID");
  return value == nullptr ? "" : std::string(" host id ") + value;
}

}  // namespace

int GlooComm::ranks_on_this_machine() const {
  if (machine_of_rank_.empty()) return 1;
  const int machine = machine_of_rank_[static_cast<size_t>(rank())];
  return static_cast<int>(std::count(machine_of_rank_.begin(), machine_of_rank_.end(), machine));
}

// Ranks are grouped by machine (learn_peers). All on one: every collective goes through one segment.
// Spanning machines with some sharing one: each machine's ranks share a segment, and one rank per
// machine (its lowest) joins the leaders' Gloo mesh (hierarchical path). Otherwise: Gloo over TCP.
void GlooComm::set_up_shared_memory(::gloo::rendezvous::Store& store) {
  // BPL_GLOO_SHM: shared memory among the ranks that share a machine. BPL_GLOO_SINGLE_COPY: large
  // collectives, and send/recv, read the peers' buffers directly where the kernel allows (see
  // ShmGroup); off, every collective's bytes go through the segment, and send/recv over Gloo.
  const bool wanted = plugin::env_switch("BPL_GLOO_SHM", true);
  const bool single_copy = plugin::env_switch("BPL_GLOO_SINGLE_COPY", true);
  if (size() == 1) return;
  const int machine = machine_of_rank_[static_cast<size_t>(rank())];
  const int machines = 1 + *std::max_element(machine_of_rank_.begin(), machine_of_rank_.end());
  std::vector<int> local_ranks;  // this machine's, ascending
  for (int r = 0; r < size(); ++r) {
    if (machine_of_rank_[static_cast<size_t>(r)] == machine) local_ranks.push_back(r);
  }
  if (machines == size()) {
    path_name_ = "gloo over tcp (each rank on a machine of its own)";
    return;
  }
  std::string refusal;
  std::unique_ptr<ShmGroup> group = map_machine_segment(store, local_ranks, wanted, refusal);
  if (!refusal.empty()) {
    path_name_ = "gloo over tcp (shared memory not used: " + refusal + ")";
    return;
  }
  std::string copies;  // how large messages move within this machine
  if (group) {
    const std::string no_single_copy = group->enable_single_copy(single_copy, timeout());
    copies = no_single_copy.empty() ? "large messages in a single copy" : "no single copy: " + no_single_copy;
  }
  if (machines == 1) {
    shm_ = std::move(group);
    path_ = std::make_unique<ShmPath>(*this);
    path_name_ = "shared memory (all " + std::to_string(size()) + " ranks on this machine; " + copies + ")";
    return;
  }
  machine_shm_ = std::move(group);  // none where this rank is alone on its machine
  if (local_ranks.front() == rank()) {
    auto leaders = std::make_shared<ReleasableContext>(machine, machines);
    leaders->setTimeout(timeout());
    ::gloo::rendezvous::PrefixStore leaders_store("leaders", store);
    leaders->connect_full_mesh(leaders_store, shared_->device);
    leaders_ = std::move(leaders);
  }
  path_ = std::make_unique<HierarchicalPath>(*this);
  path_name_ = "shared memory within each of " + std::to_string(machines) + " machines, gloo over tcp between them (" +
          std::to_string(local_ranks.size()) + " of " + std::to_string(size()) + " ranks on this one" +
          (copies.empty() ? "" : "; " + copies) + ")";
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
    for (int r : local_ranks) pids.push_back(local_pid_of_peer_[static_cast<size_t>(r)]);
    group->set_peers(std::move(pids), local_ranks);
  }
  return group;
}

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

// A connected Gloo pair names its peer by the connection's remote end. Each rank publishes its process
// (process space and pid) and its own end of each connection through the store. (The addresses a
// pair announced before connecting are not used: a pair that connects gives up its listening port,
// which a later socket of any rank may then take, so that port would name the wrong rank.) The
// processes let a failure that names no known address still be traced to a peer on this machine that
// has ended or is stopped.
void GlooComm::learn_peers(::gloo::rendezvous::Store& store) {
  machine_of_rank_.assign(static_cast<size_t>(size()), 0);
  if (size() == 1) return;
  const std::string my_process_space = plugin::process_space_identity() + machine_partition();
  std::string mine = my_process_space + "\n" + std::to_string(::getpid()) + "\n";
  for (int r = 0; r < size(); ++r) mine += (r == rank() ? "" : context_->getPair(r)->address().str()) + "\n";
  store.set("peers/" + std::to_string(rank()), std::vector<char>(mine.begin(), mine.end()));
  local_pid_of_peer_.assign(static_cast<size_t>(size()), 0);
  std::vector<std::string> process_space_of_rank(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) {
      process_space_of_rank[static_cast<size_t>(r)] = my_process_space;
      continue;
    }
    const std::vector<std::string> theirs = lines_of(store.get("peers/" + std::to_string(r)));
    if (theirs.size() != static_cast<size_t>(size()) + 2) {
      process_space_of_rank[static_cast<size_t>(r)] = "unknown: rank " + std::to_string(r);
      continue;
    }
    process_space_of_rank[static_cast<size_t>(r)] = theirs[0];
    if (theirs[0] == my_process_space) local_pid_of_peer_[static_cast<size_t>(r)] = std::atoi(theirs[1].c_str());
    peer_of_address_[theirs[2 + static_cast<size_t>(rank())]] = r;
  }
  // Machines numbered in order of their lowest rank, identically on every rank.
  int machines = 0;
  for (size_t r = 0; r < process_space_of_rank.size(); ++r) {
    const auto first = static_cast<size_t>(
        std::find(process_space_of_rank.begin(), process_space_of_rank.end(), process_space_of_rank[r]) -
        process_space_of_rank.begin());
    machine_of_rank_[r] = first == r ? machines++ : machine_of_rank_[first];
  }
}

// Names the peer behind a failure, or says what is unknown here, never a wrong one. The peers of this
// machine whose process ended (REMOTE) or is stopped (TIMEOUT) are named first; for a timeout, then the
// peers on machines that acknowledge nothing (unreachable_peers_note). A connection that
// ended names its peer as the cause only if that peer's process ended, or runs here and failed on its
// own (it aborted): a peer on another machine may have closed it after a failure it saw itself, and
// is then only said to have closed it (the store's record, when it can be read, names the cause).
std::string GlooComm::failed_peers_note(const std::string& message, bpl_status status, int pair_peer) const {
  // The watch saw this peer's connection end first: what this rank's own operation saw after that is
  // its own connections being failed in turn. Otherwise the pair the failure came from, when the
  // operation tells, or the address in Gloo's message, "[host]:port", looked up whole (one port may be
  // another's prefix).
  int closed_by = status == BPL_ERR_REMOTE ? first_ended_.load() : -1;
  if (closed_by < 0 && status == BPL_ERR_REMOTE) closed_by = pair_peer;
  static const std::regex address_in_message(R"(\[[^\]]*\]:\d+)");
  auto host_of = [](const std::string& address) { return address.substr(0, address.rfind(':')); };
  for (std::sregex_iterator it(message.begin(), message.end(), address_in_message), end; closed_by < 0 && it != end; ++it) {
    const auto known = peer_of_address_.find(it->str());
    if (known != peer_of_address_.end()) {
      closed_by = known->second;
      break;
    }
    // Gloo sometimes names a pair by a port of the peer that is neither end known here (seen across
    // test hosts): the host then tells, when a single rank of this communicator runs there.
    std::set<int> there;
    for (const auto& [address, peer] : peer_of_address_) {
      if (host_of(address) == host_of(it->str())) there.insert(peer);
    }
    if (there.size() == 1) closed_by = *there.begin();
  }
  auto local_pid = [&](int r) { return local_pid_of_peer_.empty() ? 0 : local_pid_of_peer_[static_cast<size_t>(r)]; };
  const bool any_local_peer = std::any_of(local_pid_of_peer_.begin(), local_pid_of_peer_.end(), [](pid_t pid) { return pid != 0; });
  if (any_local_peer) {
    // A killed peer's sockets close a moment before its process is marked ended, hence the short
    // wait for one.
    const auto wanted = status == BPL_ERR_TIMEOUT ? plugin::ProcessState::kStopped : plugin::ProcessState::kEnded;
    const auto give_up = std::chrono::steady_clock::now() +
                         (status == BPL_ERR_TIMEOUT ? std::chrono::milliseconds(0) : std::chrono::milliseconds(200));
    for (;;) {
      std::string note;
      for (int r = 0; r < size(); ++r) {
        const pid_t pid = local_pid(r);
        if (pid == 0 || plugin::process_state(pid) != wanted) continue;
        note += (note.empty() ? " (" : "; ") + plugin::local_peer_description(r, pid, wanted);
      }
      if (!note.empty()) return note + ")";
      if (std::chrono::steady_clock::now() >= give_up) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  if (status == BPL_ERR_TIMEOUT) {
    std::string unreachable = unreachable_peers_note();
    if (!unreachable.empty()) return unreachable;
  }
  if (closed_by < 0) return "";
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
    if (!on_another_machine(socket.peer)) continue;
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

namespace {

std::string words_text(const FingerprintWords& words) {
  std::string text;
  for (int64_t word : words) text += std::to_string(word) + " ";
  return text;
}

std::optional<Fingerprint> fingerprint_of_text(const std::string& text) {
  FingerprintWords words{};
  std::istringstream in(text);
  for (int64_t& word : words) {
    if (!(in >> word)) return std::nullopt;
  }
  return decode(words);
}

}  // namespace

Error GlooComm::failure(const std::exception& e) {
  if (aborted_.load()) {
    return Error(BPL_ERR_ABORTED, "the communicator was aborted (bpl_comm_abort) on this rank (" +
                                      std::string(e.what()) + ")");
  }
  const bpl_status status = classify_exception(e);
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
  const bool spans_machines =
      std::any_of(machine_of_rank_.begin(), machine_of_rank_.end(), [](int machine) { return machine > 0; });
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
    const pid_t pid = local_pid_of_peer_.empty() ? 0 : local_pid_of_peer_[static_cast<size_t>(r)];
    if (r == rank() || (pid != 0 && plugin::process_state(pid) != plugin::ProcessState::kRunning)) continue;
    running.push_back(key + std::to_string(r));
  }
  // Within the window in which ranks that fail at about the same moment wait for each other's word: a
  // peer that fails later than that names what it saw itself.
  shared_->board->gather(running, explanation_window(timeout()));
}

void GlooComm::begin(bpl_collective op, bpl_dtype dtype, int64_t count, int root, int reduce_op, int64_t pairing) {
  current_.sequence = static_cast<int64_t>(++collectives_);
  current_.op = op;
  current_.dtype = dtype;
  current_.count = count;
  current_.root = root;
  current_.reduce_op = reduce_op;
  current_.pairing = pairing;
  if (shm_) shm_->set_call(current_);
  if (machine_shm_) machine_shm_->set_call(current_);
}

uint32_t GlooComm::tag() const {
  const uint64_t hash = call_hash(current_);
  return static_cast<uint32_t>(hash ^ (hash >> 32));
}

std::optional<std::string> GlooComm::explain_stall(std::chrono::milliseconds wait) {
  if (shm_ || current_.sequence == 0) return std::nullopt;  // shared memory tells a mismatch itself
  // After its first failure a rank's operations say nothing of what it was called for: peers still in
  // the failed operation must not read them as the collective it calls instead.
  if (failed_.load()) return std::nullopt;
  const std::string key = uid_ + "/stalled/" + std::to_string(current_.sequence) + "/";
  shared_->board->publish(key + std::to_string(rank()), words_text(encode(current_)));
  std::vector<std::string> keys;
  for (int r = 0; r < size(); ++r) keys.push_back(key + std::to_string(r));
  const std::vector<std::optional<std::string>> said = shared_->board->gather(keys, wait);
  std::vector<std::pair<int, Fingerprint>> fingerprints;
  std::string silent;
  for (int r = 0; r < size(); ++r) {
    std::optional<Fingerprint> theirs = said[static_cast<size_t>(r)] ? fingerprint_of_text(*said[static_cast<size_t>(r)])
                                                                     : std::nullopt;
    if (!theirs) {
      silent += (silent.empty() ? "" : ",") + std::to_string(r);
      continue;
    }
    theirs->sequence = 0;  // this plugin's numbering, not the caller's
    fingerprints.emplace_back(r, *theirs);
  }
  const std::string report = compare(fingerprints, size());
  if (report.empty()) return std::nullopt;
  return report + " (found when the operation stalled over Gloo's TCP pairs" +
         (silent.empty() ? "" : "; ranks " + silent + " did not say what they call") + ")";
}

Error GlooComm::recorded_failure(bpl_status status, const std::string& message, std::chrono::milliseconds defer) {
  if (status != BPL_ERR_REMOTE && status != BPL_ERR_TIMEOUT && status != BPL_ERR_MISMATCH) return Error(status, message);
  // "<status>|<rank>|<message>": the first failure recorded for this communicator.
  const std::string mine = std::to_string(status) + "|" + std::to_string(rank()) + "|" + message;
  failed_ = true;
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

// Each collective is numbered and fingerprinted (begin) on every path, so that ranks number their
// collectives alike, then runs on the path chosen when the communicator was made.
void GlooComm::run_allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) {
  begin(BPL_COLL_ALLREDUCE, dtype, count, -1, op);
  if (count > 0) path_->allreduce(send, recv, count, dtype, op);
}

void GlooComm::run_broadcast(void* buf, size_t count, bpl_dtype dtype, int root) {
  begin(BPL_COLL_BROADCAST, dtype, count, root);
  if (count > 0) path_->broadcast(buf, count * plugin::dtype_size(dtype), root);
}

void GlooComm::run_reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) {
  begin(BPL_COLL_REDUCE, dtype, count, root, op);
  if (count > 0) path_->reduce(send, recv, count, dtype, op, root);
}

void GlooComm::run_allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  begin(BPL_COLL_ALLGATHER, dtype, count);
  if (count > 0) path_->allgather(send, recv, count * plugin::dtype_size(dtype));
}

void GlooComm::run_reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) {
  begin(BPL_COLL_REDUCE_SCATTER, dtype, recvcount, -1, op);
  if (recvcount > 0) path_->reduce_scatter(send, recv, recvcount, dtype, op);
}

void GlooComm::run_alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  begin(BPL_COLL_ALLTOALL, dtype, count);
  if (count > 0) path_->alltoall(send, recv, count * plugin::dtype_size(dtype));
}

void GlooComm::run_barrier(bpl_collective as) {
  begin(as);
  path_->barrier();
}

// A failure on this machine's segment reaches the other machines as the leaders' mesh and the
// communicator's connections close (their leaders then fail their own segments); a failure between
// machines reaches this machine's ranks through its segment's failure record. Either way the
// communicator's first failure is recorded in the store, so every rank names the same cause.
void GlooComm::across_machines(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    const auto* own = dynamic_cast<const Error*>(&e);
    // A failure another rank of this machine put in the machine's segment is that rank's to record in
    // the store: repeating it would only wait on a store that may be unreachable (a partition).
    const bool told_by_this_machine = own != nullptr && machine_shm_ && machine_shm_->failed_by_another_rank();
    if (told_by_this_machine) failed_ = true;
    Error error = told_by_this_machine ? *own : own != nullptr ? recorded_failure(own->status(), own->what()) : failure(e);
    if (machine_shm_) machine_shm_->fail(error.status(), error.what());
    shut_down_connections();
    throw error;
  }
}

std::unique_ptr<GlooComm> GlooComm::run_split(int color, int key) {
  // Every rank learns every (color, key), then each group connects its own mesh under a store prefix
  // that all its members derive alike: parent uid / split number / color.
  const int n = size();
  std::vector<int64_t> mine = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  run_allgather(mine.data(), all.data(), 2, BPL_DTYPE_I64);
  const uint32_t split_number = splits_++;
  if (color < 0) return nullptr;

  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  return std::make_unique<GlooComm>(shared_, uid_ + "/" + std::to_string(split_number) + "/" + std::to_string(color),
                                    new_rank, static_cast<int>(members.size()), timeout());
}

// Posted now; `complete` waits for the transfer, here (uncopied: a small send is a hot path) or on a
// request's waiter. Over Gloo's pairs the slot carries the tag and 24 bits of a hash of the size: a
// send and a recv of different sizes never match (they stall, time out, and are told why) instead of
// the larger overflowing the smaller, which Gloo's transport answers with abort().
const char* GlooComm::path_of(bpl_collective op, uint64_t bytes) const {
  if (shm_) {
    // Point to point goes over Gloo's pairs where single copy is off (post_transfer).
    if (ShmGroup::through_mailboxes(op) && !shm_->single_copy()) return "tcp";
    return shm_->path_of(op, bytes);
  }
  const bool hierarchical = dynamic_cast<const HierarchicalPath*>(path_.get()) != nullptr;
  if (hierarchical && (op == BPL_COLL_ALLREDUCE || op == BPL_COLL_REDUCE || op == BPL_COLL_BARRIER)) return "hierarchical";
  return "tcp";  // Gloo's own algorithms and pairs
}

void GlooComm::point_to_point(void* buf, size_t bytes, int peer, int tag, bool is_send, bpl_plugin_request** req) {
  std::function<void()> complete = post_transfer(buf, bytes, peer, tag, is_send, kPointToPointSlotPrefix);
  if (req == nullptr) return complete();
  *req = reinterpret_cast<bpl_plugin_request*>(static_cast<Request*>(new PointToPointRequest(std::move(complete))));
}

std::function<void()> GlooComm::post_transfer(void* buf, size_t bytes, int peer, int tag, bool is_send,
                                              uint8_t slot_prefix) {
  if (shm_ && shm_->single_copy()) {
    // Within the machine, the receiver reads the sender's buffer (ShmGroup's mailboxes).
    if (is_send) {
      return [group = shm_.get(), ticket = shm_->post_send(buf, bytes, peer, tag, timeout()), timeout = timeout()] {
        group->wait_sent(ticket, timeout);
      };
    }
    return [group = shm_.get(), recv = shm_->post_recv(buf, bytes, peer, tag), timeout = timeout()] {
      group->wait_received(recv, timeout);
    };
  }
  const uint64_t slot = slot_of(slot_prefix, tag, bytes);
  std::shared_ptr<::gloo::transport::UnboundBuffer> buffer = context_->createUnboundBuffer(buf, bytes);
  try {
    if (is_send) {
      buffer->send(peer, slot);
    } else {
      buffer->recv(peer, slot);
    }
  } catch (const ::gloo::Exception& e) {  // the pair had already failed
    if (slot_prefix != kPointToPointSlotPrefix) throw;  // a collective's: explained as a collective's
    throw point_to_point_failure(e, is_send, peer, tag, bytes);
  }
  return [this, buffer, is_send, peer, tag, bytes, slot_prefix, timeout = timeout()] {
    try {
      // Completed, or thrown: Gloo's failure, or TransferReleased when the connections were shut down.
      if (is_send) {
        buffer->waitSend(timeout);
      } else {
        buffer->waitRecv(timeout);
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      if (slot_prefix != kPointToPointSlotPrefix) throw;
      throw point_to_point_failure(e, is_send, peer, tag, bytes);
    }
  };
}

uint64_t GlooComm::slot_of(uint8_t slot_prefix, int tag, size_t bytes) {
  uint64_t size_hash = bytes * 0x9E3779B97F4A7C15ull;
  size_hash ^= size_hash >> 29;
  return (static_cast<uint64_t>(slot_prefix) << 56) | (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 24) |
         (size_hash & 0xffffff);
}

std::function<void()> GlooComm::post_recv_from_any(void* buf, size_t bytes, int tag, int32_t* source) {
  if (shm_ && shm_->single_copy()) {
    return [group = shm_.get(), recv = shm_->post_recv(buf, bytes, ShmGroup::kAnyRank, tag), source, timeout = timeout()] {
      *source = group->wait_received(recv, timeout);
    };
  }
  std::vector<int> others;
  for (int r = 0; r < size(); ++r) {
    if (r != rank()) others.push_back(r);
  }
  std::shared_ptr<::gloo::transport::UnboundBuffer> buffer = context_->createUnboundBuffer(buf, bytes);
  const auto explained = [this, tag](const std::exception& e) {
    if (aborted_.load()) return failure(e);
    std::string message = e.what();
    const bpl_status status = classify_exception(e);
    const std::string peers_note = failed_peers_note(message, status);
    message += peers_note;
    if (status == BPL_ERR_TIMEOUT) {
      message += " (no rank sent with tag " + std::to_string(tag) + " within " + std::to_string(timeout().count()) + " ms)";
    }
    return recorded_failure(status, message, record_defer(status, peers_note));
  };
  try {
    buffer->recv(others, slot_of(kPointToPointSlotPrefix, tag, bytes));
  } catch (const ::gloo::Exception& e) {  // a pair had already failed
    throw explained(e);
  }
  return [buffer, source, explained, timeout = timeout()] {
    try {
      int sender = -1;
      buffer->waitRecv(&sender, timeout);
      *source = sender;
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw explained(e);
    }
  };
}

// Sender and receiver each leave what they posted in the store, under the pair of ranks and the tag;
// each then compares with the other's.
Error GlooComm::point_to_point_failure(const std::exception& e, bool is_send, int peer, int tag, size_t bytes) {
  if (aborted_.load()) return failure(e);
  const bpl_status status = classify_exception(e);
  if (status == BPL_ERR_TIMEOUT) {
    const int sender = is_send ? rank() : peer, receiver = is_send ? peer : rank();
    const std::string key = uid_ + "/p2p/" + std::to_string(sender) + "-" + std::to_string(receiver) + "/" +
                            std::to_string(tag) + "/";
    shared_->board->publish(key + (is_send ? "send" : "recv"), std::to_string(bytes));
    const std::optional<std::string> theirs =
        shared_->board->gather({key + (is_send ? "recv" : "send")}, explanation_window(timeout())).front();
    if (theirs && *theirs != std::to_string(bytes)) {
      const std::string sent = is_send ? std::to_string(bytes) : *theirs;
      const std::string received = is_send ? *theirs : std::to_string(bytes);
      return recorded_failure(BPL_ERR_MISMATCH, "rank " + std::to_string(sender) + " sends " + sent + " bytes to rank " +
                                                    std::to_string(receiver) + " with tag " + std::to_string(tag) +
                                                    ", which receives " + received + " bytes with that tag");
    }
  }
  std::string message = e.what();
  // Gloo fails a transfer only by its own pair's failure; a released one says nothing about its peer.
  const bool released = dynamic_cast<const TransferReleased*>(&e) != nullptr;
  const std::string peers_note = failed_peers_note(message, status, released ? -1 : peer);
  message += peers_note;
  if (status == BPL_ERR_TIMEOUT) {
    message += std::string(" (rank ") + std::to_string(peer) + " posted no matching " + (is_send ? "recv" : "send") +
               " with tag " + std::to_string(tag) + " within " + std::to_string(timeout().count()) + " ms)";
  }
  return recorded_failure(status, message, record_defer(status, peers_note));
}

// Across machines, gather, scatter, allgatherv and alltoallv move each block straight from the rank
// that has it to the rank that wants it: one transfer per pair of ranks over Gloo's pairs (the
// hierarchical path's ranks on one machine too). Within one machine they run in the segment like
// allgather and alltoall (ShmGroup): the ranks' steps check that they call the same, and large blocks
// stream through the segment faster than process_vm_readv reads them. Their tags are negative, so that they never match the caller's
// sends and recvs (whose tags are >= 0), and carry the collective's number.
void GlooComm::exchange(const std::vector<Transfer>& transfers, const std::function<void()>& meanwhile) {
  const int tag = -1 - static_cast<int>(collectives_ & 0x3fffffff);
  std::vector<std::function<void()>> receives, sends;
  for (const Transfer& t : transfers) {
    if (t.bytes == 0) continue;
    (t.is_send ? sends : receives).push_back(post_transfer(t.buffer, t.bytes, t.peer, tag, t.is_send, kCollectiveSlotPrefix));
  }
  if (meanwhile) meanwhile();
  for (auto& received : receives) received();  // first: a send within the machine ends once its peer read it
  for (auto& sent : sends) sent();
}

void GlooComm::run_gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) {
  begin(BPL_COLL_GATHER, dtype, count, root);
  const size_t block = count * plugin::dtype_size(dtype);
  if (shm_) return shm_->gather(send, recv, block, root, timeout());
  if (rank() != root) return exchange({{const_cast<void*>(send), block, root, true}});
  auto* out = static_cast<char*>(recv);
  std::vector<Transfer> transfers;
  for (int q = 0; q < size(); ++q) {
    if (q != root) transfers.push_back({out + block * static_cast<size_t>(q), block, q, false});
  }
  char* own = out + block * static_cast<size_t>(root);
  exchange(transfers, [&] {
    if (own != send && block > 0) std::memcpy(own, send, block);
  });
}

void GlooComm::run_scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) {
  begin(BPL_COLL_SCATTER, dtype, count, root);
  const size_t block = count * plugin::dtype_size(dtype);
  if (shm_) return shm_->scatter(send, recv, block, root, timeout());
  if (rank() != root) return exchange({{recv, block, root, false}});
  const auto* in = static_cast<const char*>(send);
  std::vector<Transfer> transfers;
  for (int q = 0; q < size(); ++q) {
    if (q != root) transfers.push_back({const_cast<char*>(in + block * static_cast<size_t>(q)), block, q, true});
  }
  const char* own = in + block * static_cast<size_t>(root);
  exchange(transfers, [&] {
    if (own != recv && block > 0) std::memcpy(recv, own, block);
  });
}

void GlooComm::run_allgatherv(const void* send, size_t sendcount, void* recv, const plugin::Counts& recvcounts,
                              const plugin::Counts& displs, bpl_dtype dtype) {
  size_t total = 0;
  for (size_t c : recvcounts) total += c;
  const auto sent = [&](int) { return sendcount; };
  const auto received = [&](int q) { return recvcounts[static_cast<size_t>(q)]; };
  const int64_t pairing = pairing_share(rank(), size(), sent, received);
  begin(BPL_COLL_ALLGATHERV, dtype, static_cast<int64_t>(total), -1, -1, pairing);
  const size_t element = plugin::dtype_size(dtype);
  if (shm_) {
    return shm_->allgatherv(send, sendcount * element, recv, plugin::in_bytes(recvcounts, element),
                            plugin::in_bytes(displs, element), pairing, timeout());
  }
  auto* out = static_cast<char*>(recv);
  std::vector<Transfer> transfers;
  for (int q = 0; q < size(); ++q) {
    if (q == rank()) continue;
    transfers.push_back({const_cast<void*>(send), sendcount * element, q, true});
    transfers.push_back({out + displs[static_cast<size_t>(q)] * element, recvcounts[static_cast<size_t>(q)] * element, q, false});
  }
  char* own = out + displs[static_cast<size_t>(rank())] * element;
  exchange(transfers, [&] {
    if (own != send && sendcount > 0) std::memcpy(own, send, sendcount * element);
  });
}

void GlooComm::run_alltoallv(const void* send, const plugin::Counts& sendcounts, const plugin::Counts& sdispls, void* recv,
                             const plugin::Counts& recvcounts, const plugin::Counts& rdispls, bpl_dtype dtype) {
  const auto sent = [&](int q) { return sendcounts[static_cast<size_t>(q)]; };
  const auto received = [&](int q) { return recvcounts[static_cast<size_t>(q)]; };
  const int64_t pairing = pairing_share(rank(), size(), sent, received);
  begin(BPL_COLL_ALLTOALLV, dtype, -1, -1, -1, pairing);
  const size_t element = plugin::dtype_size(dtype);
  if (shm_) {
    return shm_->alltoallv(send, plugin::in_bytes(sendcounts, element), plugin::in_bytes(sdispls, element), recv,
                           plugin::in_bytes(recvcounts, element), plugin::in_bytes(rdispls, element), pairing, timeout());
  }
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  std::vector<Transfer> transfers;
  for (int q = 0; q < size(); ++q) {
    if (q == rank()) continue;
    const auto i = static_cast<size_t>(q);
    transfers.push_back({const_cast<char*>(in + sdispls[i] * element), sendcounts[i] * element, q, true});
    transfers.push_back({out + rdispls[i] * element, recvcounts[i] * element, q, false});
  }
  const auto me = static_cast<size_t>(rank());
  exchange(transfers, [&] {
    if (sendcounts[me] > 0) std::memcpy(out + rdispls[me] * element, in + sdispls[me] * element, sendcounts[me] * element);
  });
}

void GlooComm::send(const void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req) {
  point_to_point(const_cast<void*>(buf), count * plugin::dtype_size(dtype), peer, tag, true, req);
}

void GlooComm::recv(void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req) {
  point_to_point(buf, count * plugin::dtype_size(dtype), peer, tag, false, req);
}

void GlooComm::recv_any(void* buf, size_t count, bpl_dtype dtype, int tag, int32_t* source, bpl_plugin_request** req) {
  std::function<void()> complete = post_recv_from_any(buf, count * plugin::dtype_size(dtype), tag, source);
  if (req == nullptr) return complete();
  *req = reinterpret_cast<bpl_plugin_request*>(static_cast<Request*>(new PointToPointRequest(std::move(complete))));
}

}  // namespace backplane::gloo_plugin
