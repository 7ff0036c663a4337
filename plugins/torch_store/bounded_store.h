// A connection to a c10d::TCPStore (LibTorch's, so a torchrun agent's store too) whose every operation
// ends within a deadline.
//
// LibTorch's TCPStore client has not always bounded its calls (1.13's bounded only wait(): it set the
// socket's receive timeout, SO_RCVTIMEO, to the wait's and left it set, and every other call on a store
// whose host is stopped, or on a port held by a program that is not a store, never returned), so
// BoundedStore bounds them itself, whatever the client does: it arms that receive timeout at once with an
// empty wait (which also proves a store answers), re-arms it after any wait of another length, and
// treats any failed call as the end of the connection: a reply that comes late would otherwise be read
// as the answer to the next request. Every later call then fails at once with the first failure.
#pragma once

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "backplane/plugin.h"

namespace backplane::torch_store {

class BoundedStore : public c10d::Store {
 public:
  // Connects to the store at `host`:options.port (hosting it when options.isServer), then checks that
  // a store answers. Each later operation waits at most `operation_timeout` for its reply. `where`
  // ("127.0.0.1:29500") and `host_name` ("rank 0", "the torchrun agent") name the store in messages.
  // Throws plugin::Error: TIMEOUT when nothing answered in time, IO when the connection failed.
  BoundedStore(const std::string& host, const c10d::TCPStoreOptions& options, std::chrono::milliseconds operation_timeout,
               std::string where, std::string host_name);

  // Not cloned: the gloo plugin holds the one connection, and hands the store to nothing of torch's.
  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  // Runs `call` on the connection unless it already failed; a failure ends the connection and is
  // thrown as a plugin::Error naming the store.
  template <typename Call>
  auto bounded(const char* operation, Call&& call) -> decltype(call());
  void arm();

  c10::intrusive_ptr<c10d::TCPStore> store_;
  const std::chrono::milliseconds operation_timeout_;
  const std::string where_;
  const std::string host_name_;
  std::mutex mutex_;         // one operation at a time: a re-armed timeout belongs to the next call
  bpl_status failed_ = BPL_OK;
  std::string failure_;      // the first failure, repeated by every later call
};

// True for the exceptions of LibTorch's store that mean a timeout (its TimeoutError, or a c10::Error
// saying so).
bool is_store_timeout(const std::exception& e);

}  // namespace backplane::torch_store
