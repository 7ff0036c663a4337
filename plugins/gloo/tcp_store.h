// backplane's own key-value store over TCP: where the ranks of a gloo job meet at
// MASTER_ADDR:MASTER_PORT when no store is handed to them. Rank 0's process serves it on a thread of
// its own; every rank (rank 0 too) is a client.
//
// Why a store of the project's own: Gloo ships an in-process store, a file store (a shared file
// system) and a Redis client (a server someone must run); the only TCP store at hand, torch's c10d
// TCPStore, comes with LibTorch, which a program that only communicates must not load. The store needs
// four operations (set, get that waits for its key, add, check), and one more that forgets a world's
// keys once it has ended (a launcher's store outlives many), and every one of them here has a
// deadline: a store whose host is stopped, or a port held by something that is not a store, is an
// error naming the address within the bound, never a hang. A torchrun agent's store, which is torch's
// TCPStore, is reached through torch's own client instead (torch_store_module.h).
//
// The protocol: a connection opens with a greeting that names the protocol, so that a client that
// reached something else says so; then each request is a frame (a 32-bit length and the bytes) and is
// answered by one frame, in order. A get whose key is absent is answered when the key is set or at
// the get's own deadline, by the server, so the connection stays in step either way.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kv_store.h"

namespace backplane::gloo_plugin {

// What keeps one client, or many, from taking a store's host down: what the values may hold together
// (a set past it is refused: the client's call fails with OUT_OF_MEMORY; a rendezvous holds kilobytes),
// and how long a connection may sit on part of a frame, or on no greeting, before it is closed. A
// connection's unread input, and its unsent answers, are each bounded by about a frame's bound
// (wire::kMaxFrame): past it, the store serves that connection again once its client reads.
struct TcpStoreLimits {
  size_t stored_bytes = size_t{1} << 30;
  std::chrono::milliseconds partial_frame_idle{30000};
};

// Who may reach a store. `listen_host`: the address its clients connect to (MASTER_ADDR): given as a
// number, or localhost, it listens there only (loopback alone for a job on one machine); as another
// name, or empty, or where that is no address of this host (behind NAT), on every interface. `secret`: a store with
// one serves only the connections that open with it, and refuses any other, logging where it came
// from; without one, any process that reaches the port is served, as torch's TCPStore serves any.
struct TcpStoreAdmission {
  std::string listen_host;
  std::string secret;
};

// The job's secret (BPL_STORE_SECRET; empty where unset): bpl-run hands every process of a job on one
// machine a new one; the user sets one for a job started otherwise. Throws plugin::Error
// INVALID_ARGUMENT when it is longer than kMaxStoreSecret bytes.
constexpr size_t kMaxStoreSecret = 1024;
std::string store_secret_from_environment();

// Serves the store on `port` (where `admission` says) until destroyed. Throws plugin::Error IO naming
// the port when it cannot listen there (for example, another program holds it).
class TcpStoreServer {
 public:
  // Where a connection goes that opens as torch's TCPStore client does (wire::kTorchStoreGreeting):
  // its socket (non-blocking, now the callee's) and the bytes read from it so far. Without one, such a
  // connection is closed as any that is not this store's client.
  using TorchClients = std::function<void(int fd, std::vector<uint8_t> received)>;

  using Limits = TcpStoreLimits;

  explicit TcpStoreServer(uint16_t port, TorchClients torch_clients = nullptr, Limits limits = Limits(),
                          TcpStoreAdmission admission = TcpStoreAdmission());
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // Takes no more connections (the port is free at once; those made go on): once every rank of the
  // job is connected, so that a process that starts a new job at the same port right after this one
  // ends never meets this job's store (it tries again until the new job's store listens).
  void stop_listening();

 private:
  class State;
  void serve();
  void wake();

  int listen_fd_ = -1;  // the serving thread's, once it runs
  int wake_fd_ = -1;    // an eventfd: written to stop listening, or to end the serving thread
  std::atomic<bool> stop_listening_{false};
  std::atomic<bool> ending_{false};
  std::unique_ptr<State> state_;
  std::thread thread_;
};

// A client connection, one call at a time. Every call waits at most the operation timeout for its
// answer (a get, its own timeout plus that) once it has the connection; a call that fails or runs out
// of time ends the connection (an answer that came late would be read as the next call's), and every
// later call fails at once with the same error.
class TcpStoreClient : public KvStore {
 public:
  // Connects to host:port, trying again while nothing listens there yet, for at most `connect_timeout`;
  // then the greeting must be answered within `operation_timeout`. `host_name` names the process that
  // serves the store in messages ("rank 0"). Throws plugin::Error: TIMEOUT when nothing answered in
  // time, IO when the connection failed or what answered is not a store, INVALID_ARGUMENT when the
  // store refused `secret` (the job's: store_secret_from_environment).
  TcpStoreClient(const std::string& host, uint16_t port, std::chrono::milliseconds connect_timeout,
                 std::chrono::milliseconds operation_timeout, std::string host_name,
                 const std::string& secret = store_secret_from_environment());
  ~TcpStoreClient() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  bool wait_for(const std::string& key, std::chrono::milliseconds within) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key) override;
  bool erase_prefix(const std::string& prefix) override;
  // Has the server set `key` to `value` once this connection ends: when this process ends, however it
  // ends (the kernel closes its connections), the others learn of it at once.
  void set_when_closed(const std::string& key, const std::vector<uint8_t>& value);

 private:
  // Sends `request` and returns the answer, which the server may hold for `server_holds` (a get's
  // wait) and must give within the operation timeout after that, counted from when the connection is
  // this call's (another thread's get may hold it first); ends the connection on any failure.
  std::vector<uint8_t> call(const char* operation, const std::vector<uint8_t>& request,
                            std::chrono::milliseconds server_holds);
  std::optional<std::vector<uint8_t>> get_within(const std::string& key, std::chrono::milliseconds timeout);
  void admit(const std::string& secret);
  [[noreturn]] void fail(bpl_status status, const std::string& message);

  const std::string where_;      // "host:port"
  const std::string host_name_;  // "rank 0"
  const std::chrono::milliseconds operation_timeout_;
  std::mutex mutex_;  // one call at a time on the connection
  int fd_ = -1;
  bpl_status failed_ = BPL_OK;
  std::string failure_;
};

}  // namespace backplane::gloo_plugin
