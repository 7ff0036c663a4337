// libbpl-torch-store.so: torch's own TCPStore client, for the gloo plugin under a torchrun whose agent
// hosts the job's store (plugins/gloo/torch_store_module.h). It hands the plugin a bpl_store whose every
// call is bounded (bounded_store.h). It also serves a TCPStore, for bpl-store's torch clients.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "bounded_store.h"
#include "plugin_support.h"

namespace backplane::torch_store {
namespace {

thread_local std::string last_error;

// Runs `call`; a failure becomes its status, with its message kept for last_error().
template <typename Call>
bpl_status answered(Call&& call) noexcept {
  try {
    call();
    return BPL_OK;
  } catch (const plugin::Error& e) {
    last_error = e.what();
    return e.status();
  } catch (const std::exception& e) {
    last_error = e.what();
    return is_store_timeout(e) ? BPL_ERR_TIMEOUT : BPL_ERR_REMOTE;
  }
}

BoundedStore& store_of(void* context) { return *static_cast<BoundedStore*>(context); }

bpl_status set(void* context, const char* key, const void* value, size_t size) {
  return answered([&] {
    const auto* bytes = static_cast<const uint8_t*>(value);
    store_of(context).set(key, std::vector<uint8_t>(bytes, bytes + size));
  });
}

// Only ever called for keys that must come: a wait that runs out ends the connection (bounded_store.h).
bpl_status get(void* context, const char* key, int64_t timeout_ms, void* value, size_t capacity, size_t* size) {
  return answered([&] {
    BoundedStore& store = store_of(context);
    store.wait({key}, std::chrono::milliseconds(timeout_ms));
    const std::vector<uint8_t> bytes = store.get(key);
    *size = bytes.size();
    if (value != nullptr) std::memcpy(value, bytes.data(), std::min(capacity, bytes.size()));
  });
}

bpl_status add(void* context, const char* key, int64_t delta, int64_t* result) {
  return answered([&] { *result = store_of(context).add(key, delta); });
}

bpl_status check(void* context, const char* key, int32_t* found) {
  return answered([&] { *found = store_of(context).check({key}) ? 1 : 0; });
}

const char* error_text(void*) { return last_error.c_str(); }

}  // namespace
}  // namespace backplane::torch_store

extern "C" __attribute__((visibility("default"))) bpl_status bpl_torch_store_open_v1(
    const bpl_host_api* host, const char* address, int32_t port, int64_t connect_timeout_ms,
    int64_t operation_timeout_ms, const char* host_name, bpl_store* out, char* error, size_t error_size) {
  using namespace backplane::torch_store;
  backplane::plugin::host() = host;
  const std::string where = std::string(address) + ":" + std::to_string(port);
  std::unique_ptr<BoundedStore> store;
  const bpl_status status = answered([&] {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = std::chrono::milliseconds(connect_timeout_ms);  // c10d retries the connect until then
    store = std::make_unique<BoundedStore>(address, options, std::chrono::milliseconds(operation_timeout_ms), where,
                                           host_name);
  });
  if (status != BPL_OK) {
    if (error_size > 0) std::snprintf(error, error_size, "%s", last_error.c_str());
    return status;
  }
  *out = bpl_store{sizeof(bpl_store), store.release(), set, get, add, check, error_text};
  return BPL_OK;
}

extern "C" __attribute__((visibility("default"))) void bpl_torch_store_close_v1(bpl_store* store) {
  if (store != nullptr) delete static_cast<backplane::torch_store::BoundedStore*>(store->context);
}

// A TCPStore served on this host's loopback at a port of the system's choosing, for the rest of the
// process; *port is that port. Called once (bpl-store's torch side).
extern "C" __attribute__((visibility("default"))) bpl_status bpl_torch_store_serve_v1(int32_t* port, char* error,
                                                                                      size_t error_size) {
  using namespace backplane::torch_store;
  static c10d::TCPStore* served = nullptr;  // never destroyed: it serves until the process ends
  const bpl_status status = answered([&] {
    c10d::TCPStoreOptions options;
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    served = new c10d::TCPStore("127.0.0.1", options);
    *port = static_cast<int32_t>(served->getPort());
  });
  if (status != BPL_OK && error_size > 0) std::snprintf(error, error_size, "%s", last_error.c_str());
  return status;
}
