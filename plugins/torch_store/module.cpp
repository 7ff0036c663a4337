// libbpl-torch-store.so: torch's own TCPStore client, for the gloo plugin under a torchrun whose agent
// hosts the job's store (plugins/gloo/torch_store_module.h). It hands the plugin a bpl_store whose every
// call is bounded: a c10d::Store as bpl_store callbacks, as the torch backend makes them
// (torch_backend/store_callbacks.h). It also serves a TCPStore, for bpl-store's torch clients.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/exception.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backplane/plugin.h"
#include "plugin_support.h"
#include "store_callbacks.h"

namespace backplane::torch_store {
namespace {

using torch_backend::StoreCallbacks;

// The connections open, by their table's context (what close is handed back).
std::mutex connections_mutex;
std::map<const void*, std::unique_ptr<StoreCallbacks>> connections;

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Connects to the TCPStore at address:port (c10d retries the connect until connect_timeout) and checks
// that a store answers there within operation_timeout. Throws plugin::Error naming the store and its host.
std::unique_ptr<StoreCallbacks> connect(const std::string& address, int32_t port, std::chrono::milliseconds connect_timeout,
                                        std::chrono::milliseconds operation_timeout, const std::string& host_name) {
  const std::string where = address + ":" + std::to_string(port);
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = connect_timeout;
    store = c10::make_intrusive<c10d::TCPStore>(address, options);
  } catch (const std::exception& e) {
    const bool timed_out = dynamic_cast<const c10d::TimeoutError*>(&e) != nullptr;
    throw plugin::Error(timed_out ? BPL_ERR_TIMEOUT : BPL_ERR_IO,
                        "cannot connect to the store at " + where + " (its host, " + host_name + "): " + first_line(e.what()));
  }
  auto callbacks = std::make_unique<StoreCallbacks>(store, operation_timeout,
                                                    "the store at " + where + " (its host, " + host_name + ")");
  const bpl_store* table = callbacks->table();
  int32_t found = 0;
  const bpl_status answered = table->check(table->context, "backplane/probe", &found);
  if (answered == BPL_ERR_TIMEOUT) {
    throw plugin::Error(BPL_ERR_TIMEOUT, "the store at " + where + " did not answer within " +
                                             std::to_string(operation_timeout.count()) + " ms (BPL_TIMEOUT_MS): its host, " +
                                             host_name + ", is stopped or stuck, or what listens there is not a store");
  }
  if (answered != BPL_OK) {
    throw plugin::Error(BPL_ERR_IO, "the store at " + where + " closed the connection before answering (" +
                                        first_line(table->last_error(table->context)) +
                                        "): what listens there is not a store, or its host, " + host_name + ", is ending");
  }
  return callbacks;
}

}  // namespace
}  // namespace backplane::torch_store

extern "C" __attribute__((visibility("default"))) bpl_status bpl_torch_store_open_v1(
    const bpl_host_api* host, const char* address, int32_t port, int64_t connect_timeout_ms,
    int64_t operation_timeout_ms, const char* host_name, bpl_store* out, char* error, size_t error_size) {
  using namespace backplane::torch_store;
  backplane::plugin::host() = host;
  try {
    auto callbacks = connect(address, port, std::chrono::milliseconds(connect_timeout_ms),
                             std::chrono::milliseconds(operation_timeout_ms), host_name);
    *out = *callbacks->table();
    std::lock_guard<std::mutex> lock(connections_mutex);
    connections[out->context] = std::move(callbacks);
    return BPL_OK;
  } catch (const backplane::plugin::Error& e) {
    if (error_size > 0) std::snprintf(error, error_size, "%s", e.what());
    return e.status();
  } catch (const std::exception& e) {
    if (error_size > 0) std::snprintf(error, error_size, "%s", e.what());
    return BPL_ERR_INTERNAL;
  }
}

extern "C" __attribute__((visibility("default"))) void bpl_torch_store_close_v1(bpl_store* store) {
  if (store == nullptr) return;
  std::unique_ptr<backplane::torch_backend::StoreCallbacks> closed;
  std::lock_guard<std::mutex> lock(backplane::torch_store::connections_mutex);
  auto found = backplane::torch_store::connections.find(store->context);
  if (found != backplane::torch_store::connections.end()) {
    closed = std::move(found->second);
    backplane::torch_store::connections.erase(found);
  }
}

// A TCPStore served on this host's loopback at a port of the system's choosing, for the rest of the
// process; *port is that port. Called once (bpl-store's torch side).
extern "C" __attribute__((visibility("default"))) bpl_status bpl_torch_store_serve_v1(int32_t* port, char* error,
                                                                                      size_t error_size) {
  static c10d::TCPStore* served = nullptr;  // never destroyed: it serves until the process ends
  try {
    c10d::TCPStoreOptions options;
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    served = new c10d::TCPStore("127.0.0.1", options);
    *port = static_cast<int32_t>(served->getPort());
    return BPL_OK;
  } catch (const std::exception& e) {
    if (error_size > 0) std::snprintf(error, error_size, "%s", backplane::torch_store::first_line(e.what()).c_str());
    return BPL_ERR_IO;
  }
}
