// Under a real torchrun whose agent hosts the job's store (TORCHELASTIC_USE_AGENT_STORE=True), the store
// at MASTER_ADDR:MASTER_PORT is torch's c10d TCPStore, which only torch's own client speaks. That client
// is in a module of the gloo plugin's own, libbpl-torch-store.so (plugins/torch_store, linking LibTorch),
// loaded in that case alone; every other rendezvous maps no LibTorch.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "kv_store.h"

namespace backplane::gloo_plugin {

constexpr const char* kTorchStoreModule = "libbpl-torch-store.so";

// The module's entry points (plugins/torch_store/module.cpp). Open connects to the TCPStore at
// host:port (connect bounded by connect_timeout_ms, every later call by operation_timeout_ms) and fills
// `out` with callbacks on it; `host_name` names the store's host in messages. On failure it writes why
// into `error` (error_size bytes at most). Close ends the connection (NULL is accepted).
using TorchStoreOpen = bpl_status (*)(const bpl_host_api* host, const char* address, int32_t port,
                                      int64_t connect_timeout_ms, int64_t operation_timeout_ms, const char* host_name,
                                      bpl_store* out, char* error, size_t error_size);
using TorchStoreClose = void (*)(bpl_store* store);
constexpr const char* kTorchStoreOpenSymbol = "bpl_torch_store_open_v1";
constexpr const char* kTorchStoreCloseSymbol = "bpl_torch_store_close_v1";
// Serves a TCPStore on 127.0.0.1 at a port it writes to *port (bpl-store's torch side).
using TorchStoreServe = bpl_status (*)(int32_t* port, char* error, size_t error_size);
constexpr const char* kTorchStoreServeSymbol = "bpl_torch_store_serve_v1";

// A connection to a torch TCPStore through the module, loaded on first use. Throws plugin::Error:
// UNSUPPORTED when the module is not installed or cannot be loaded (naming it and where it was looked
// for), TIMEOUT or IO when the store does not answer.
std::unique_ptr<KvStore> connect_torch_store(const std::string& address, int port, std::chrono::milliseconds connect_timeout,
                                             std::chrono::milliseconds operation_timeout, const std::string& host_name);

// Where the module is looked for.
std::string torch_store_module_path();

}  // namespace backplane::gloo_plugin
