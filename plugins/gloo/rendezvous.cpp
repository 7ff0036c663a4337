#include "rendezvous.h"

#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <ifaddrs.h>
#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstddef>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "kv_store.h"
#include "local_process.h"
#include "plugin_support.h"
#include "store_views.h"
#include "tcp_store.h"
#include "torch_store_module.h"

namespace backplane::gloo_plugin {
namespace {

const char* env(const char* name) { return backplane::plugin::env(name); }

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

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

// BPL_STORE_PORT: the port at MASTER_ADDR where the launcher serves backplane's store (bpl-run's
// bpl-store), or -1 when it is not set.
int store_port_of_launcher() {
  using backplane::plugin::Error;
  const char* value = env("BPL_STORE_PORT");
  if (value == nullptr || *value == '\0') return -1;
  char* end = nullptr;
  const long port = std::strtol(value, &end, 10);
  if (*end != '\0' || port < 1 || port > 65535) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string("BPL_STORE_PORT='") + value + "': expected a TCP port, 1..65535");
  }
  return static_cast<int>(port);
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

std::string machine_partition() {
  const char* value = plugin::env("BPL_GLOO_HOST_ID");
  return value == nullptr ? "" : std::string(" host id ") + value;
}

std::string process_key(const std::string& process_space, const std::string& pid) { return process_space + "/" + pid; }

std::string this_process_key() {
  return process_key(plugin::process_space_identity() + machine_partition(), std::to_string(::getpid()));
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

// What the communicators see of the job's store, wherever it lives: the store itself, Gloo's view of it
// and the failure board on `board_store`, a connection of its own whose calls give up soon.
Rendezvous views_of(std::shared_ptr<KvStore> store, std::shared_ptr<KvStore> board_store, const World& world,
                    std::chrono::milliseconds timeout) {
  Rendezvous result;
  result.kv = store;
  result.prefix = world.prefix;
  result.store = std::make_shared<GlooKvStore>(std::move(store), world.prefix, timeout);
  result.board = make_store_board(std::move(board_store), world.prefix);
  return result;
}

// Waits for the arrivals of the `size` ranks in `world` on `store`, then makes its views.
Rendezvous meet(std::shared_ptr<KvStore> store, std::shared_ptr<KvStore> board_store, const World& world,
                int32_t rank, int32_t size, std::chrono::milliseconds timeout) {
  arrive(*store, world, rank, size, timeout);
  return views_of(std::move(store), std::move(board_store), world, timeout);
}

// Meets the other `size` ranks through a caller's store, every key under "backplane/". The failure
// board uses the same store with a short bound on its waits (a callback that blocks beyond it cannot
// be stopped: the caller's store must honour its own deadlines).
Rendezvous meet_through(const bpl_store& caller, int32_t rank, int32_t size, std::chrono::milliseconds timeout,
                        std::shared_ptr<::gloo::transport::Device> device, const std::string& transport) {
  Rendezvous result;
  try {
    auto store = std::make_shared<CallbackKvStore>(caller, "the caller's store");
    const World world = enter_world(*store, "backplane", rank, this_process_key(), timeout);
    result = meet(std::move(store), std::make_shared<CallbackKvStore>(caller, "the caller's store"), world, rank, size,
                  timeout);
  } catch (const plugin::Error& e) {
    throw plugin::Error(e.status(), "rendezvous through the caller's store as rank " + std::to_string(rank) + " of " +
                                        std::to_string(size) + " failed: " + e.what());
  }
  result.device = std::move(device);
  result.description = "store=the caller's (bpl_init_options.store); transport=" + transport;
  return result;
}

// The two connections to the store at MASTER_ADDR:MASTER_PORT (the second for the failure board, whose
// calls give up within 500 ms: a failure report must not wait out the job's timeout on a store whose
// host is stopped): a torchrun agent's through torch's client, else backplane's own.
std::pair<std::shared_ptr<KvStore>, std::shared_ptr<KvStore>> connect_to_store(const std::string& addr, int port,
                                                                               bool agent_hosts,
                                                                               std::chrono::milliseconds timeout,
                                                                               const std::string& store_host) {
  const auto board_timeout = std::min(timeout, std::chrono::milliseconds(500));
  if (agent_hosts) {
    return {connect_torch_store(addr, port, timeout, timeout, store_host),
            connect_torch_store(addr, port, timeout, board_timeout, store_host)};
  }
  const auto tcp_port = static_cast<uint16_t>(port);
  return {std::make_shared<TcpStoreClient>(addr, tcp_port, timeout, timeout, store_host),
          std::make_shared<TcpStoreClient>(addr, tcp_port, timeout, board_timeout, store_host)};
}

// Where the job's store is. bpl-run hosts backplane's own in a process beside the ranks (bpl-store) at
// MASTER_ADDR:BPL_STORE_PORT (MASTER_PORT, where the same process serves the program's torch store); a
// torchrun agent hosts torch's store at MASTER_PORT and tells its workers so; otherwise rank 0 hosts
// backplane's at MASTER_PORT.
struct JobStore {
  bool agent_hosts = false;
  bool launcher_hosts = false;
  int port = -1;
  std::string host_name;  // "rank 0", for messages
  std::string base;       // every key of the job's, each world's under "<base>/world<n>" (arrival.h)
};

JobStore job_store(int master_port) {
  JobStore job;
  const char* agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
  const int launcher_port = store_port_of_launcher();
  job.launcher_hosts = launcher_port > 0;
  // bpl-run's bpl-store serves both stores at one port: backplane's own protocol is the cheaper one.
  job.agent_hosts = !job.launcher_hosts && agent_store != nullptr && std::string(agent_store) == "True";
  job.port = job.launcher_hosts ? launcher_port : master_port;
  job.host_name = job.agent_hosts ? "the torchrun agent" : job.launcher_hosts ? "the launcher's bpl-store" : "rank 0";
  // A restarted torchrun job reuses the agent's store: keep each attempt's keys apart.
  const char* restart = env("TORCHELASTIC_RESTART_COUNT");
  job.base = std::string("backplane/") + (restart ? restart : "0");
  return job;
}

// The connection whose end the store reports as this process's (Rendezvous::liveness).
std::shared_ptr<KvStore> liveness_connection(const std::string& addr, int port, std::chrono::milliseconds timeout,
                                             const std::string& host_name, const std::string& prefix) {
  auto liveness = std::make_shared<TcpStoreClient>(addr, static_cast<uint16_t>(port), timeout, timeout, host_name);
  liveness->set_when_closed(prefix + "/" + gone_key(this_process_key()), bytes_of("1"));
  return liveness;
}

}  // namespace

bool joining() {
  const char* join = env("BPL_JOIN");
  return join != nullptr && std::string(join) == "1";
}

Rendezvous rendezvous_to_join(const bpl_launch_info& launch) {
  using backplane::plugin::Error;
  const std::string addr = launch.master_addr != nullptr ? launch.master_addr : "";
  const auto timeout = std::chrono::milliseconds(launch.timeout_ms);
  const JobStore job = job_store(launch.master_port);
  // Rank 0's store takes no connection after the job's first rendezvous (TcpStoreServer::stop_listening),
  // and a store that ends with rank 0 could not let a newcomer replace it: newcomers need bpl-store.
  if (addr.empty() || !job.launcher_hosts) {
    const char* agent = job.agent_hosts ? ", a torchrun agent's store" : "";
    throw Error(BPL_ERR_INVALID_ARGUMENT,
                "BPL_JOIN=1: a newcomer joins through a store that outlives the job's ranks, bpl-store at MASTER_ADDR "
                "and BPL_STORE_PORT (got MASTER_ADDR='" + addr + "' and " +
                    (job.launcher_hosts ? "BPL_STORE_PORT=" + std::to_string(job.port) : "no BPL_STORE_PORT") + agent +
                    "); rank 0's store admits no process after the job's first rendezvous: start the job with bpl-run "
                    "(--replace starts newcomers itself), or serve its store with 'bpl-store --port P' and give every "
                    "process BPL_STORE_PORT=P");
  }
  resolve_master_addr(addr, timeout);
  Rendezvous result;
  const std::string where = addr + ":" + std::to_string(job.port);
  try {
    auto [store, board_store] = connect_to_store(addr, job.port, false, timeout, job.host_name);
    const World world = current_world(*store, job.base, timeout);
    std::shared_ptr<KvStore> liveness = liveness_connection(addr, job.port, timeout, job.host_name, world.prefix);
    result = views_of(std::move(store), std::move(board_store), world, timeout);
    result.liveness = std::move(liveness);
  } catch (const Error& e) {
    throw Error(e.status(), "joining the job at " + where + " failed: " + e.what());
  }
  std::string transport;
  result.device = make_device(is_loopback(addr), transport);
  result.description = "joining the job at " + where + " (" + job.host_name + "'s store); transport=" + transport;
  return result;
}

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
    result.board = make_in_process_board();
    return result;
  }
  if (caller != nullptr) return meet_through(*caller, launch.rank, launch.world_size, timeout, device, transport);

  const JobStore job = job_store(launch.master_port);
  const bool agent_hosts = job.agent_hosts, launcher_hosts = job.launcher_hosts;
  const bool serves = launch.rank == 0 && !agent_hosts && !launcher_hosts;
  const std::string& store_host = job.host_name;
  const int port = job.port;
  const std::string where = addr + ":" + std::to_string(port);
  const std::string as_rank = "rendezvous at " + where + " as rank " + std::to_string(launch.rank);
  std::shared_ptr<TcpStoreServer> server;
  Rendezvous result;
  try {
    if (serves) {
      server = std::make_shared<TcpStoreServer>(static_cast<uint16_t>(port), nullptr, TcpStoreLimits(),
                                                TcpStoreAdmission{addr, store_secret_from_environment()});
    }
    auto [store, board_store] = connect_to_store(addr, port, agent_hosts, timeout, store_host);
    const World world = enter_world(*store, job.base, launch.rank, this_process_key(), timeout);
    std::shared_ptr<KvStore> liveness;
    if (!agent_hosts) liveness = liveness_connection(addr, port, timeout, store_host, world.prefix);
    result = meet(std::move(store), std::move(board_store), world, launch.rank, launch.world_size, timeout);
    result.liveness = std::move(liveness);
  } catch (const Error& e) {
    // The store ends with this process: give the other ranks a moment to read the failure from it.
    if (server != nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::string hint;
    if (serves && e.status() == BPL_ERR_IO && server == nullptr) {
      hint = " (is MASTER_PORT " + std::to_string(launch.master_port) + " used by another job or another rank 0?)";
    }
    throw Error(e.status(), as_rank + (serves ? " (store server)" : " (store client)") + " failed: " + e.what() + hint);
  }
  // Every rank is connected (each connects both its connections before it arrives).
  if (server != nullptr) server->stop_listening();
  result.server = std::move(server);
  result.device = device;
  result.store_host_rank = agent_hosts || launcher_hosts ? -1 : 0;
  result.description = "store=" + where +
                       (serves         ? " (server)"
                        : agent_hosts  ? " (torchrun agent's, through " + torch_store_module_path() + ")"
                        : launcher_hosts ? " (the launcher's bpl-store)"
                                       : " (client)") +
                       "; transport=" + transport;
  return result;
}

}  // namespace backplane::gloo_plugin
