#include "rendezvous.h"

#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

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

const char* env(const char* name) {
  using backplane::plugin::host;
  const char* value = host() != nullptr ? host()->get_env(name) : std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> bytes_of(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

// Before any connection is made, every rank announces itself in the store and waits, bounded by the
// timeout, for all the others. The first rank to find the rendezvous failed (a duplicate rank, ranks
// disagreeing on the world size, or, at its timeout, ranks missing) records why in the store, and
// every rank waiting there fails at once with the same message.
void check_arrivals(c10d::Store& store, const std::string& prefix, const bpl_launch_info& launch,
                    std::chrono::milliseconds timeout, const std::string& where) {
  using backplane::plugin::Error;
  const std::string outcome_key = prefix + "failed";
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = "rank " + std::to_string(launch.rank) + " (" + host + " pid " + std::to_string(::getpid()) + ")";
  // "<status>|<message>": the first failure recorded wins, so that every rank reports the same one.
  auto fail_everyone = [&](bpl_status status, const std::string& reason) {
    const std::string first =
        text_of(store.compareSet(outcome_key, {}, bytes_of(std::to_string(status) + "|" + reason)));
    const size_t bar = first.find('|');
    throw Error(static_cast<bpl_status>(std::atoi(first.c_str())), "rendezvous at " + where + " failed: " +
                                                                        first.substr(bar == std::string::npos ? 0 : bar + 1));
  };

  const std::string world = std::to_string(launch.world_size);
  const std::string agreed = text_of(store.compareSet(prefix + "world_size", {}, bytes_of(world)));
  if (agreed != world) {
    fail_everyone(BPL_ERR_MISMATCH, me + " was started with WORLD_SIZE=" + world + " but an earlier rank with WORLD_SIZE=" +
                                        agreed + ": every rank must be given the same world size");
  }
  const std::string rank_key = prefix + "rank/" + std::to_string(launch.rank);
  if (store.add(rank_key, 1) > 1) {
    fail_everyone(BPL_ERR_MISMATCH, me + " joined, but another process already joined as rank " +
                                        std::to_string(launch.rank) + ": each rank must be started once (check RANK / the launcher)");
  }

  std::vector<std::string> rank_keys;
  for (int32_t r = 0; r < launch.world_size; ++r) rank_keys.push_back(prefix + "rank/" + std::to_string(r));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (store.check({outcome_key})) fail_everyone(BPL_ERR_INTERNAL, "");  // reports the recorded failure
    if (store.check(rank_keys)) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string missing;
  int32_t joined = 0;
  for (int32_t r = 0; r < launch.world_size; ++r) {
    if (store.check({rank_keys[static_cast<size_t>(r)]})) {
      ++joined;
    } else {
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  fail_everyone(BPL_ERR_TIMEOUT, "timed out after " + std::to_string(timeout.count()) + " ms (BPL_TIMEOUT_MS): " +
                                     std::to_string(joined) + "/" + std::to_string(launch.world_size) +
                                     " joined, missing ranks [" + missing + "]");
}

}  // namespace

bool is_store_timeout(const std::exception& e) {
  const char* what = e.what();
  return std::strstr(what, "imed out") != nullptr || std::strstr(what, "imeout") != nullptr;
}

Rendezvous rendezvous(const bpl_launch_info& launch, const RendezvousOptions& rendezvous_options) {
  using backplane::plugin::Error;
  Rendezvous result;
  const std::string addr = launch.master_addr != nullptr ? launch.master_addr : "";
  const auto timeout = std::chrono::milliseconds(launch.timeout_ms);

  // The transport: loopback when the job is on this host; otherwise the interface named by
  // GLOO_SOCKET_IFNAME, else the address this host's name resolves to (as torch's Gloo does).
  ::gloo::transport::tcp::attr attr;
  std::string transport;
  if (launch.world_size == 1 || is_loopback(addr)) {
    attr.hostname = "127.0.0.1";
    transport = "tcp 127.0.0.1";
  } else if (const char* iface = env("GLOO_SOCKET_IFNAME")) {
    attr.iface = iface;
    transport = std::string("tcp iface ") + iface;
  } else {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    attr.hostname = name;
    transport = std::string("tcp host ") + name;
  }
  result.device = ::gloo::transport::tcp::CreateDevice(attr);

  if (launch.world_size == 1) {
    result.store = std::make_shared<::gloo::rendezvous::HashStore>();
    result.description = "store=in-process; transport=" + transport;
    result.record_first = [](const std::string&, const std::string& value, std::chrono::milliseconds) { return value; };
    return result;
  }
  if (addr.empty() || launch.master_port <= 0) {
    throw Error(BPL_ERR_INVALID_ARGUMENT,
                "a world of " + std::to_string(launch.world_size) + " ranks needs MASTER_ADDR and MASTER_PORT (got '" +
                    addr + "' and " + std::to_string(launch.master_port) + "); launch with bpl-run or torchrun");
  }

  // A torchrun agent hosts the store itself and tells its workers so; otherwise rank 0 hosts it.
  const char* agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
  const bool agent_hosts = agent_store != nullptr && std::string(agent_store) == "True";
  const bool hosted_elsewhere = agent_hosts || rendezvous_options.store_hosted_elsewhere;
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(launch.master_port);
  options.isServer = launch.rank == 0 && !hosted_elsewhere;
  options.numWorkers = static_cast<size_t>(launch.world_size);
  options.waitWorkers = false;  // the full-mesh connect below waits for every rank, with the timeout
  options.timeout = timeout;
  const std::string where = addr + ":" + std::to_string(launch.master_port);
  c10::intrusive_ptr<c10d::Store> tcp_store;
  try {
    tcp_store = c10::make_intrusive<c10d::TCPStore>(addr, options);
  } catch (const std::exception& e) {
    std::string hint;
    if (options.isServer) {
      hint = " (is MASTER_PORT " + std::to_string(launch.master_port) + " used by another job or another rank 0?)";
    } else if (is_store_timeout(e)) {
      hint = " (rank 0, which hosts the store, never came)";
    }
    throw Error(is_store_timeout(e) ? BPL_ERR_TIMEOUT : BPL_ERR_IO,
                "rendezvous at " + where + " as rank " + std::to_string(launch.rank) +
                    (options.isServer ? " (store server)" : " (store client)") + " failed: " + e.what() + hint);
  }
  // A restarted torchrun job reuses the agent's store: keep each attempt's keys apart.
  const char* restart = env("TORCHELASTIC_RESTART_COUNT");
  const std::string prefix = rendezvous_options.key_prefix + "/" + (restart ? restart : "0");
  try {
    check_arrivals(*tcp_store, prefix + "/arrival/", launch, timeout, where);
  } catch (const Error&) {
    // The store ends with this process: give the other ranks a moment to read the failure from it.
    if (options.isServer) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    throw;
  } catch (const std::exception& e) {
    throw Error(is_store_timeout(e) ? BPL_ERR_TIMEOUT : BPL_ERR_IO,
                "rendezvous at " + where + " as rank " + std::to_string(launch.rank) + " failed: " + e.what() +
                    (options.isServer ? "" : " (the store's host, rank 0, went away: it may have failed the rendezvous)"));
  }
  auto adapter = std::make_shared<c10d::ProcessGroupGloo::GlooStore>(tcp_store);
  result.store = std::make_shared<PrefixedStore>(adapter, prefix);
  // A connection of its own whose operations give up soon: a failure report must not wait out the
  // job's timeout on a store whose host is stopped. (Connecting keeps the full timeout: c10d retries
  // a refused connect with a back-off longer than the short one.)
  c10d::TCPStoreOptions board_options = options;
  board_options.isServer = false;
  c10::intrusive_ptr<c10d::Store> board;
  try {
    board = c10::make_intrusive<c10d::TCPStore>(addr, board_options);
    board->setTimeout(std::min(timeout, std::chrono::milliseconds(500)));
  } catch (const std::exception& e) {
    throw Error(BPL_ERR_IO, "rendezvous at " + where + " as rank " + std::to_string(launch.rank) +
                                " failed to open a second connection to the store: " + e.what());
  }
  result.record_first = [board, prefix](const std::string& key, const std::string& value,
                                        std::chrono::milliseconds defer) {
    try {
      // Polled: this TCPStore's wait is not woken by a compareSet.
      const auto give_up = std::chrono::steady_clock::now() + defer;
      while (std::chrono::steady_clock::now() < give_up && !board->check({prefix + "/" + key})) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return text_of(board->compareSet(prefix + "/" + key, {}, bytes_of(value)));
    } catch (const std::exception&) {
      return value;
    }
  };
  result.description = "store=" + addr + ":" + std::to_string(launch.master_port) +
                       (options.isServer ? " (server)" : agent_hosts ? " (torchrun agent)" : " (client)") +
                       "; transport=" + transport;
  return result;
}

}  // namespace backplane::gloo_plugin
