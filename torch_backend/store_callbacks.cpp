#include "store_callbacks.h"

#include <torch/csrc/distributed/c10d/exception.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace backplane::torch_backend {
namespace {

thread_local std::string last_failure;

c10d::Store& store_of(void* context) { return *static_cast<c10d::Store*>(context); }

// What a c10d::Store's exception means: LibTorch 1.13 throws its TimeoutError for a connect that timed
// out, and a plain c10::Error ("Socket Timeout", "Wait timeout") for a call that did.
bpl_status status_of(const std::exception& e) {
  if (dynamic_cast<const c10d::TimeoutError*>(&e) != nullptr) return BPL_ERR_TIMEOUT;
  const char* what = e.what();
  if (std::strstr(what, "imeout") != nullptr || std::strstr(what, "imed out") != nullptr) return BPL_ERR_TIMEOUT;
  return BPL_ERR_IO;
}

template <typename Body>
bpl_status guarded(Body&& body) noexcept {
  try {
    body();
    return BPL_OK;
  } catch (const std::exception& e) {
    last_failure = e.what();
    return status_of(e);
  } catch (...) {
    last_failure = "unknown exception";
    return BPL_ERR_INTERNAL;
  }
}

bpl_status set(void* context, const char* key, const void* value, size_t size) {
  return guarded([&] {
    const auto* bytes = static_cast<const uint8_t*>(value);
    store_of(context).set(key, std::vector<uint8_t>(bytes, bytes + size));
  });
}

bpl_status get(void* context, const char* key, int64_t timeout_ms, void* value, size_t capacity, size_t* size) {
  return guarded([&] {
    c10d::Store& store = store_of(context);
    store.wait({key}, std::chrono::milliseconds(timeout_ms));
    if (capacity == 0) {
      *size = 0;
      return;
    }
    const std::vector<uint8_t> found = store.get(key);
    *size = found.size();
    if (!found.empty()) std::memcpy(value, found.data(), std::min(capacity, found.size()));
  });
}

bpl_status add(void* context, const char* key, int64_t delta, int64_t* result) {
  return guarded([&] { *result = store_of(context).add(key, delta); });
}

bpl_status check(void* context, const char* key, int32_t* found) {
  return guarded([&] { *found = store_of(context).check({key}) ? 1 : 0; });
}

const char* last_error(void*) { return last_failure.c_str(); }

}  // namespace

StoreCallbacks::StoreCallbacks(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)), table_(BPL_STORE_INIT) {
  table_.context = store_.get();
  table_.set = set;
  table_.get = get;
  table_.add = add;
  table_.check = check;
  table_.last_error = last_error;
}

}  // namespace backplane::torch_backend
