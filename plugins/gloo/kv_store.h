// The key-value store the ranks of a gloo runtime meet through, whichever it is: backplane's own TCP
// store (tcp_store.h), a caller's (bpl_store, ABI 1.2), or a torchrun agent's torch TCPStore reached
// through the torch store module (torch_store_module.h). Every call is bounded; failures are
// plugin::Error naming the store.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "caller_store.h"
#include "plugin_support.h"

namespace backplane::gloo_plugin {

class KvStore {
 public:
  virtual ~KvStore() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // The value of `key` once it is set, waiting at most `timeout`; plugin::Error TIMEOUT after that.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Whether `key` is set within `within` (false: not yet; the store is still usable).
  virtual bool wait_for(const std::string& key, std::chrono::milliseconds within) = 0;
  // Adds `delta` to the integer under `key` (absent: 0) and returns the sum.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual bool check(const std::string& key) = 0;
  // Forgets every key that starts with `prefix`; false where the store cannot (a caller's, torch's).
  virtual bool erase_prefix(const std::string& prefix) {
    (void)prefix;
    return false;
  }
};

// A bpl_store's callbacks (a caller's, or the torch store module's) as a KvStore.
class CallbackKvStore : public KvStore {
 public:
  explicit CallbackKvStore(const bpl_store& store, std::string name) : store_(store, std::move(name)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override { store_.set(key, value); }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return store_.get(key, timeout);
  }
  // Polled: a get that runs out of time may leave a callback's connection unusable (torch's TCPStore
  // client reads the late answer as the next one's), so this never lets one.
  bool wait_for(const std::string& key, std::chrono::milliseconds within) override {
    const auto give_up = plugin::deadline_after(within);
    for (;;) {
      if (store_.check(key)) return true;
      if (std::chrono::steady_clock::now() >= give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_.add(key, delta); }
  bool check(const std::string& key) override { return store_.check(key); }

 private:
  plugin::CallerStore store_;
};

// Sets `key` to `value` unless it was set by this function already, and returns the value that stands:
// `value` for the first caller, the first caller's for every other (which waits for it at most
// `timeout`). A counter beside the key decides who is first, so it needs no compare-and-set.
inline std::vector<uint8_t> set_first(KvStore& store, const std::string& key, const std::vector<uint8_t>& value,
                                      std::chrono::milliseconds timeout) {
  if (store.add(key + "/claimed", 1) == 1) {
    store.set(key, value);
    return value;
  }
  return store.get(key, timeout);
}

inline std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
inline std::vector<uint8_t> bytes_of(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

}  // namespace backplane::gloo_plugin
