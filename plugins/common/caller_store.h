// A key-value store given as bpl_store callbacks (a caller's, ABI 1.2, or the gloo plugin's torch store
// module's) as C++: every callback's failure a plugin::Error with its status and the store's own
// message, values as bytes, waits bounded. The gloo plugin meets through it (kv_store.h); the MPI
// plugin exchanges its members' world ranks through it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backplane/backplane.h"
#include "plugin_support.h"

namespace backplane::plugin {

class CallerStore {
 public:
  // `name` says whose store it is in messages ("the caller's store").
  explicit CallerStore(const bpl_store& store, std::string name = "the caller's store")
      : store_(store), name_(std::move(name)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) const {
    require_ok(store_.set(store_.context, key.c_str(), value.data(), value.size()), "set", key);
  }
  // The value of `key` once it is set, waiting at most `timeout`; TIMEOUT after that.
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) const {
    std::vector<uint8_t> value(256);
    for (;;) {
      size_t size = 0;
      require_ok(store_.get(store_.context, key.c_str(), at_least_1ms(timeout), value.data(), value.size(), &size), "get",
                 key, timeout);
      const bool complete = size <= value.size();
      value.resize(size);
      if (complete) return value;
    }
  }
  // Waits at most `timeout` for `key` to be set, reading nothing.
  void wait(const std::string& key, std::chrono::milliseconds timeout) const {
    size_t size = 0;
    require_ok(store_.get(store_.context, key.c_str(), at_least_1ms(timeout), nullptr, 0, &size), "get", key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) const {
    int64_t result = 0;
    require_ok(store_.add(store_.context, key.c_str(), delta, &result), "add", key);
    return result;
  }
  bool check(const std::string& key) const {
    int32_t found = 0;
    require_ok(store_.check(store_.context, key.c_str(), &found), "check", key);
    return found != 0;
  }

 private:
  static int64_t at_least_1ms(std::chrono::milliseconds timeout) { return std::max<int64_t>(1, timeout.count()); }

  void require_ok(bpl_status status, const char* call, const std::string& key,
                  std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const {
    if (status == BPL_OK) return;
    std::string text = name_ + " failed " + std::string(call) + "('" + key + "') with status " + std::to_string(status);
    if (status == BPL_ERR_TIMEOUT) text += " (the key was not set within " + std::to_string(timeout.count()) + " ms)";
    const char* message = store_.last_error != nullptr ? store_.last_error(store_.context) : nullptr;
    if (message != nullptr && *message != '\0') text += ": " + std::string(message);
    throw Error(status, text);
  }

  bpl_store store_;
  std::string name_;
};

}  // namespace backplane::plugin
