// A c10d::Store (torch.distributed's: a TCPStore, or the PrefixStore torch gives each group; a torchrun
// agent's TCPStore, in the gloo plugin's torch store module) as the C ABI's bpl_store, so that
// backplane's plugins meet through a store torch has.
//
// Every call is bounded, whatever the store's client does: LibTorch's TCPStore has not always bounded
// its calls (1.13 bounded only its waits), and a call to a store whose host stopped answering (a stopped
// rank 0 hosts the store of torch's env:// rendezvous) would block the plugin's failure path, which reads
// and writes the store to name the rank that failed. So the calls run on a thread of this object's and
// the caller stops waiting at the bound; a call past its bound ends the store for backplane (a late
// reply would be read as the answer to the next request), and every later call fails at once with that
// first failure.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "backplane/backplane.h"

namespace backplane::torch_backend {

class StoreCalls;

class StoreCallbacks {
 public:
  // A healthy store answers in well under a millisecond; one that has not answered a set, add or check
  // in this long, or in a quarter of its own timeout (torch's: the group's) if that is shorter, or a get
  // this long after the wait's own timeout, is taken for gone. Half the grace at most that the core
  // gives a plugin past a timeout (bpl_request_wait): a failure path that meets a dead store still ends
  // with its own message, naming the rank.
  static constexpr std::chrono::milliseconds kCallBound{1000};

  // A torch group's store: bounded by kCallBound, or by a quarter of the store's own timeout if shorter.
  explicit StoreCallbacks(c10::intrusive_ptr<c10d::Store> store);
  // Any store, each call bounded by `call_bound` (a get: past its own wait's timeout); `name` says
  // whose store it is in messages ("the store at 127.0.0.1:29500, hosted by the torchrun agent").
  StoreCallbacks(c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds call_bound,
                 std::string name = "the store");
  ~StoreCallbacks();
  StoreCallbacks(const StoreCallbacks&) = delete;
  StoreCallbacks& operator=(const StoreCallbacks&) = delete;

  // Valid while this object lives; hand it to bpl_init_options.store or bpl_comm_create_from_store.
  const bpl_store* table() const { return &table_; }

 private:
  std::shared_ptr<StoreCalls> calls_;  // shared with its thread, which a call past its bound may still hold
  bpl_store table_;
};

}  // namespace backplane::torch_backend
