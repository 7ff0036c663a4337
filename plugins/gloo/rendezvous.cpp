#include "rendezvous.h"

#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/exception.h>

#include <ifaddrs.h>
#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <typeinfo>

#include "bounded_store.h"
#include "caller_store.h"
#include "plugin_support.h"

namespace backplane::gloo_plugin {
namespace {

// Owns the c10d store the Gloo adapter points at, and puts every key under `prefix`.
class PrefixedStore : public ::gloo::rendezvous::Store {
 public:
  PrefixedStore(std::shared_ptr<::gloo::rendezvous::Store> base, const std::string& prefix)
      : base_(std::move(base)), prefixed_(prefix, *base_) {}
  void set(const std::string& key, const std::vector<char>& data) override { prefixed_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return prefixed_.get(key); }
  void wait(const std::vector<std::string>& keys) override { prefixed_.wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    prefixed_.wait(keys, timeout);
  }

 private:
  std::shared_ptr<::gloo::rendezvous::Store> base_;
  ::gloo::rendezvous::PrefixStore prefixed_;
};

const char* env(const char* name) { return backplane::plugin::env(name); }

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> bytes_of(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

// Before any connection is made, every rank announces itself in the store and waits, bounded by the
// timeout, for all the others. The first rank to find the rendezvous failed (a duplicate rank, ranks
// disagreeing on the world size, or, at its timeout, ranks missing) records why in the store, and
// every rank waiting there fails at once with the same message.
void check_arrivals(c10d::Store& store, const std::string& prefix, int32_t rank, int32_t world_size,
                    std::chrono::milliseconds timeout) {
  using backplane::plugin::Error;
  const std::string outcome_key = prefix + "failed";
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = "rank " + std::to_string(rank) + " (" + host + " pid " + std::to_string(::getpid()) + ")";
  // "<status>|<message>": the first failure recorded wins, so that every rank reports the same one.
  auto fail_everyone = [&](bpl_status status, const std::string& reason) {
    const std::string first =
        text_of(store.compareSet(outcome_key, {}, bytes_of(std::to_string(status) + "|" + reason)));
    const size_t bar = first.find('|');
    throw Error(static_cast<bpl_status>(std::atoi(first.c_str())), first.substr(bar == std::string::npos ? 0 : bar + 1));
  };

  const std::string world = std::to_string(world_size);
  const std::string agreed = text_of(store.compareSet(prefix + "world_size", {}, bytes_of(world)));
  if (agreed != world) {
    fail_everyone(BPL_ERR_MISMATCH, me + " was started with WORLD_SIZE=" + world + " but an earlier rank with WORLD_SIZE=" +
                                        agreed + ": every rank must be given the same world size");
  }
  const std::string rank_key = prefix + "rank/" + std::to_string(rank);
  if (store.add(rank_key, 1) > 1) {
    fail_everyone(BPL_ERR_MISMATCH, me + " joined, but another process already joined as rank " +
                                        std::to_string(rank) + ": each rank must be started once (check RANK / the launcher)");
  }

  std::vector<std::string> rank_keys;
  for (int32_t r = 0; r < world_size; ++r) rank_keys.push_back(prefix + "rank/" + std::to_string(r));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (store.check({outcome_key})) fail_everyone(BPL_ERR_INTERNAL, "");  // reports the recorded failure
    if (store.check(rank_keys)) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string missing;
  int32_t joined = 0;
  for (int32_t r = 0; r < world_size; ++r) {
    if (store.check({rank_keys[static_cast<size_t>(r)]})) {
      ++joined;
    } else {
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  fail_everyone(BPL_ERR_TIMEOUT, "timed out after " + std::to_string(timeout.count()) + " ms (BPL_TIMEOUT_MS): " +
                                     std::to_string(joined) + "/" + std::to_string(world_size) +
                                     " joined, missing ranks [" + missing + "]");
}

// A caller's store (bpl_store, ABI 1.2) as a c10d::Store, so that the rendezvous, Gloo's full mesh and
// the failure board meet through it as through a TCPStore. `timeout` bounds get and wait.
class CallerC10dStore : public c10d::Store {
 public:
  CallerC10dStore(const bpl_store& store, std::chrono::milliseconds timeout) : c10d::Store(timeout), store_(store) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override { store_.set(key, value); }
  std::vector<uint8_t> get(const std::string& key) override { return store_.get(key, timeout_); }
  int64_t add(const std::string& key, int64_t delta) override { return store_.add(key, delta); }
  bool check(const std::vector<std::string>& keys) override {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& key) { return store_.check(key); });
  }
  // The callbacks have no compare-and-set. Every use here sets a key unless it is set and returns the
  // value that stands, which a counter beside the key makes safe: the first to count sets it, the
  // others wait for that value.
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    if (!expected.empty()) {
      throw plugin::Error(BPL_ERR_INTERNAL, "compareSet with an expected value on a caller's store (key '" + key + "')");
    }
    if (store_.add(key + "/claimed", 1) == 1) {
      store_.set(key, desired);
      return desired;
    }
    return store_.get(key, timeout_);
  }
  bool deleteKey(const std::string& key) override {
    throw plugin::Error(BPL_ERR_UNSUPPORTED, "a caller's store cannot delete keys (key '" + key + "')");
  }
  int64_t getNumKeys() override { throw plugin::Error(BPL_ERR_UNSUPPORTED, "a caller's store cannot count its keys"); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const std::string& key : keys) {
      store_.wait(key, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
    }
  }

 private:
  plugin::CallerStore store_;
};

// A world of one: nobody to tell.
class InProcessBoard : public FailureBoard {
 public:
  std::string record_first(const std::string&, const std::string& value, std::chrono::milliseconds) override {
    return value;
  }
  void publish(const std::string&, const std::string&) override {}
  std::vector<std::optional<std::string>> gather(const std::vector<std::string>& keys, std::chrono::milliseconds) override {
    return std::vector<std::optional<std::string>>(keys.size());
  }
};

// On a BoundedStore connection of its own (every call bounded), keys under the job's prefix. Polled:
// this TCPStore's wait is not woken by a compareSet, and a wait that times out would end the connection.
class StoreBoard : public FailureBoard {
 public:
  StoreBoard(c10::intrusive_ptr<c10d::Store> store, std::string prefix) : store_(std::move(store)), prefix_(std::move(prefix)) {}

  std::string record_first(const std::string& key, const std::string& value, std::chrono::milliseconds defer) override {
    try {
      const auto give_up = std::chrono::steady_clock::now() + defer;
      while (std::chrono::steady_clock::now() < give_up && !store_->check({prefixed(key)})) {
        std::this_thread::sleep_for(kPoll);
      }
      return text_of(store_->compareSet(prefixed(key), {}, bytes_of(value)));
    } catch (const std::exception&) {
      return value;
    }
  }

  void publish(const std::string& key, const std::string& value) override {
    try {
      store_->set(prefixed(key), bytes_of(value));
    } catch (const std::exception&) {
      // unreachable: the others will find nothing, as if this rank had not answered
    }
  }

  std::vector<std::optional<std::string>> gather(const std::vector<std::string>& keys,
                                                 std::chrono::milliseconds within) override {
    std::vector<std::optional<std::string>> values(keys.size());
    try {
      std::vector<std::string> all;
      for (const std::string& key : keys) all.push_back(prefixed(key));
      const auto give_up = std::chrono::steady_clock::now() + within;
      while (std::chrono::steady_clock::now() < give_up && !store_->check(all)) std::this_thread::sleep_for(kPoll);
      for (size_t i = 0; i < keys.size(); ++i) {
        if (store_->check({all[i]})) values[i] = text_of(store_->get(all[i]));
      }
    } catch (const std::exception&) {
      // what was read so far stands
    }
    return values;
  }

 private:
  static constexpr std::chrono::milliseconds kPoll{5};
  std::string prefixed(const std::string& key) const { return prefix_ + "/" + key; }
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
};

// GLOO_SOCKET_IFNAME must name an interface of this host (Gloo's own check ends in an internal error).
void require_interface(const std::string& name) {
  using backplane::plugin::Error;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return;  // Gloo will say what it finds
  std::set<std::string> names;
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) names.insert(i->ifa_name);
  ::freeifaddrs(interfaces);
  if (names.count(name) != 0) return;
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  throw Error(BPL_ERR_INVALID_ARGUMENT, "GLOO_SOCKET_IFNAME='" + name + "' names no interface of this host (it has: " +
                                            known + ")");
}

// MASTER_ADDR must name a host before anything waits for it there: a name that does not resolve is
// said to be one, at once, rather than found out at the timeout as a store that never answered. A
// temporary failure (the name service unreachable) is retried until the timeout.
void resolve_master_addr(const std::string& addr, std::chrono::milliseconds timeout) {
  using backplane::plugin::Error;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  for (;;) {
    addrinfo* found = nullptr;
    const int error = ::getaddrinfo(addr.c_str(), nullptr, &hints, &found);
    if (found != nullptr) ::freeaddrinfo(found);
    if (error == 0) return;
    const std::string reason = error == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(error);
    if (error != EAI_AGAIN) {
      throw Error(BPL_ERR_INVALID_ARGUMENT, "MASTER_ADDR '" + addr + "' does not resolve: " + reason);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error(BPL_ERR_TIMEOUT, "MASTER_ADDR '" + addr + "' does not resolve: " + reason + " (still after " +
                                       std::to_string(timeout.count()) + " ms, BPL_TIMEOUT_MS)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

bool is_store_timeout(const std::exception& e) {
  if (dynamic_cast<const c10d::TimeoutError*>(&e) != nullptr) return true;  // a connect that timed out
  // LibTorch 1.13 reports a store call that ran past its timeout as an untyped error (TORCH_CHECK's
  // c10::Error "Socket Timeout", "Wait timeout"): for those only the text tells.
  if (dynamic_cast<const c10::Error*>(&e) == nullptr && typeid(e) != typeid(std::runtime_error)) return false;
  const char* what = e.what();
  return std::strstr(what, "imed out") != nullptr || std::strstr(what, "imeout") != nullptr;
}

namespace {

// The launch's store (ABI 1.2), where the core that filled `launch` knows the field.
const bpl_store* caller_store_of(const bpl_launch_info& launch) {
  const bool has_field = launch.struct_size >= offsetof(bpl_launch_info, store) + sizeof(launch.store);
  return has_field ? launch.store : nullptr;
}

// The transport: loopback when the job is on this host; otherwise the interface named by
// GLOO_SOCKET_IFNAME, else the address this host's name resolves to (as torch's Gloo does).
std::shared_ptr<::gloo::transport::Device> make_device(bool on_this_host, std::string& transport) {
  ::gloo::transport::tcp::attr attr;
  if (on_this_host) {
    attr.hostname = "127.0.0.1";
    transport = "tcp 127.0.0.1";
  } else if (const char* iface = env("GLOO_SOCKET_IFNAME")) {
    require_interface(iface);
    attr.iface = iface;
    transport = std::string("tcp iface ") + iface;
  } else {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    attr.hostname = name;
    transport = std::string("tcp host ") + name;
  }
  return ::gloo::transport::tcp::CreateDevice(attr);
}

// Meets the other `size` ranks through a caller's store: arrivals checked, every key under "backplane/".
// The failure board uses the same store with a short bound on its waits (a callback that blocks
// beyond it cannot be stopped: the caller's store must honour its own deadlines).
Rendezvous meet_through(const bpl_store& caller, int32_t rank, int32_t size, std::chrono::milliseconds timeout,
                        std::shared_ptr<::gloo::transport::Device> device, const std::string& transport) {
  Rendezvous result;
  result.device = std::move(device);
  const std::string prefix = "backplane";
  auto store = c10::make_intrusive<CallerC10dStore>(caller, timeout);
  try {
    check_arrivals(*store, prefix + "/arrival/", rank, size, timeout);
  } catch (const plugin::Error& e) {
    throw plugin::Error(e.status(), "rendezvous through the caller's store as rank " + std::to_string(rank) + " of " +
                                        std::to_string(size) + " failed: " + e.what());
  }
  result.store = std::make_shared<PrefixedStore>(std::make_shared<c10d::ProcessGroupGloo::GlooStore>(store), prefix);
  result.board = std::make_shared<StoreBoard>(
      c10::make_intrusive<CallerC10dStore>(caller, std::min(timeout, std::chrono::milliseconds(500))), prefix);
  result.description = "store=the caller's (bpl_init_options.store); transport=" + transport;
  return result;
}

}  // namespace

Rendezvous rendezvous_through(const bpl_store& store, int32_t rank, int32_t size, std::chrono::milliseconds timeout,
                              std::shared_ptr<::gloo::transport::Device> device) {
  return meet_through(store, rank, size, timeout, std::move(device), "the runtime's");
}

Rendezvous rendezvous(const bpl_launch_info& launch) {
  using backplane::plugin::Error;
  const std::string addr = launch.master_addr != nullptr ? launch.master_addr : "";
  const auto timeout = std::chrono::milliseconds(launch.timeout_ms);
  const bpl_store* caller = caller_store_of(launch);
  if (launch.world_size > 1 && caller == nullptr) {
    if (addr.empty() || launch.master_port <= 0) {
      throw Error(BPL_ERR_INVALID_ARGUMENT,
                  "a world of " + std::to_string(launch.world_size) + " ranks needs MASTER_ADDR and MASTER_PORT (got '" +
                      addr + "' and " + std::to_string(launch.master_port) +
                      "), or a store (bpl_init_options.store); launch with bpl-run or torchrun");
    }
    resolve_master_addr(addr, timeout);
  }
  // Through a caller's store the ranks' host is unknown unless MASTER_ADDR says loopback.
  std::string transport;
  auto device = make_device(launch.world_size == 1 || is_loopback(addr), transport);

  if (launch.world_size == 1) {
    Rendezvous result;
    result.device = device;
    result.store = std::make_shared<::gloo::rendezvous::HashStore>();
    result.description = "store=in-process; transport=" + transport;
    result.board = std::make_shared<InProcessBoard>();
    return result;
  }
  if (caller != nullptr) return meet_through(*caller, launch.rank, launch.world_size, timeout, device, transport);

  Rendezvous result;
  result.device = device;
  // A torchrun agent hosts the store itself and tells its workers so; otherwise rank 0 hosts it.
  const char* agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
  const bool agent_hosts = agent_store != nullptr && std::string(agent_store) == "True";
  const std::string store_host = agent_hosts ? "the torchrun agent" : "rank 0";
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(launch.master_port);
  options.isServer = launch.rank == 0 && !agent_hosts;
  options.numWorkers = static_cast<size_t>(launch.world_size);
  options.waitWorkers = false;  // the full-mesh connect below waits for every rank, with the timeout
  options.timeout = timeout;    // bounds the connect, which c10d retries while the store is not up yet
  const std::string where = addr + ":" + std::to_string(launch.master_port);
  const std::string as_rank = "rendezvous at " + where + " as rank " + std::to_string(launch.rank);
  c10::intrusive_ptr<c10d::Store> tcp_store;
  try {
    tcp_store = c10::make_intrusive<BoundedStore>(addr, options, timeout, where, store_host);
  } catch (const Error& e) {
    throw Error(e.status(), as_rank + " failed: " + e.what());
  } catch (const std::exception& e) {
    std::string hint;
    if (options.isServer) {
      hint = " (is MASTER_PORT " + std::to_string(launch.master_port) + " used by another job or another rank 0?)";
    } else if (is_store_timeout(e)) {
      hint = " (" + store_host + ", which hosts the store, never came)";
    }
    throw Error(is_store_timeout(e) ? BPL_ERR_TIMEOUT : BPL_ERR_IO,
                as_rank + (options.isServer ? " (store server)" : " (store client)") + " failed: " + e.what() + hint);
  }
  // A restarted torchrun job reuses the agent's store: keep each attempt's keys apart.
  const char* restart = env("TORCHELASTIC_RESTART_COUNT");
  const std::string prefix = std::string("backplane/") + (restart ? restart : "0");
  try {
    check_arrivals(*tcp_store, prefix + "/arrival/", launch.rank, launch.world_size, timeout);
  } catch (const Error& e) {
    // The store ends with this process: give the other ranks a moment to read the failure from it.
    if (options.isServer) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    throw Error(e.status(), as_rank + " failed: " + e.what());
  }
  auto adapter = std::make_shared<c10d::ProcessGroupGloo::GlooStore>(tcp_store);
  result.store = std::make_shared<PrefixedStore>(adapter, prefix);
  // A connection of its own whose operations give up soon: a failure report must not wait out the
  // job's timeout on a store whose host is stopped.
  c10d::TCPStoreOptions board_options = options;
  board_options.isServer = false;
  c10::intrusive_ptr<c10d::Store> board;
  try {
    board = c10::make_intrusive<BoundedStore>(addr, board_options, std::min(timeout, std::chrono::milliseconds(500)),
                                              where, store_host);
  } catch (const std::exception& e) {
    throw Error(BPL_ERR_IO, as_rank + " failed to open a second connection to the store: " + e.what());
  }
  result.board = std::make_shared<StoreBoard>(board, prefix);
  result.store_host_rank = agent_hosts ? -1 : 0;
  result.description = "store=" + where +
                       (options.isServer ? " (server)" : agent_hosts ? " (torchrun agent)" : " (client)") +
                       "; transport=" + transport;
  return result;
}

}  // namespace backplane::gloo_plugin
