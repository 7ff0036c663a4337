// What the gloo plugin makes of the store its ranks met through (kv_store.h): the store Gloo's full
// mesh connects through, and the failure board, both keeping their keys under the job's prefix.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kv_store.h"
#include "rendezvous.h"

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

// The failure board on a store connection whose every call gives up soon (the store's host may be the
// rank that failed), keys under `prefix` + "/". Nothing it does throws.
std::shared_ptr<FailureBoard> make_store_board(std::shared_ptr<KvStore> store, std::string prefix);

// A world of one: nobody to tell.
std::shared_ptr<FailureBoard> make_in_process_board();

}  // namespace backplane::gloo_plugin
