#include "rendezvous.h"

#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <cstring>

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
  c10::intrusive_ptr<c10d::Store> tcp_store;
  try {
    tcp_store = c10::make_intrusive<c10d::TCPStore>(addr, options);
  } catch (const std::exception& e) {
    throw Error(is_store_timeout(e) ? BPL_ERR_TIMEOUT : BPL_ERR_IO,
                std::string("rendezvous at ") + addr + ":" + std::to_string(launch.master_port) + " as rank " +
                    std::to_string(launch.rank) + (options.isServer ? " (store server)" : " (store client)") +
                    " failed: " + e.what());
  }
  auto adapter = std::make_shared<c10d::ProcessGroupGloo::GlooStore>(tcp_store);
  // A restarted torchrun job reuses the agent's store: keep each attempt's keys apart.
  const char* restart = env("TORCHELASTIC_RESTART_COUNT");
  result.store = std::make_shared<PrefixedStore>(adapter, rendezvous_options.key_prefix + "/" + (restart ? restart : "0"));
  result.description = "store=" + addr + ":" + std::to_string(launch.master_port) +
                       (options.isServer ? " (server)" : agent_hosts ? " (torchrun agent)" : " (client)") +
                       "; transport=" + transport;
  return result;
}

}  // namespace backplane::gloo_plugin
