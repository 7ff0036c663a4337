// A key-value store (kv_store.h) as Gloo's rendezvous store, for connecting a Gloo context: the gloo
// plugin's full mesh, and the benchmarks' raw Gloo.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kv_store.h"

namespace backplane::gloo_plugin {

// The store as Gloo's interface: every key under `prefix` + "/", and a get or a wait bounded by `timeout`
// (Gloo waits only for keys that must come: running out is a TIMEOUT naming the keys).
class GlooKvStore : public ::gloo::rendezvous::Store {
 public:
  GlooKvStore(std::shared_ptr<KvStore> store, std::string prefix, std::chrono::milliseconds timeout);
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<KvStore> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace backplane::gloo_plugin
