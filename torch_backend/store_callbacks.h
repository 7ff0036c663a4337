// A c10d::Store (torch.distributed's: a TCPStore, or the PrefixStore torch gives each group) as the C
// ABI's bpl_store, so that backplane's plugins meet through the store torch already has.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backplane/backplane.h"

namespace backplane::torch_backend {

class StoreCallbacks {
 public:
  explicit StoreCallbacks(c10::intrusive_ptr<c10d::Store> store);
  StoreCallbacks(const StoreCallbacks&) = delete;
  StoreCallbacks& operator=(const StoreCallbacks&) = delete;

  // Valid while this object lives; hand it to bpl_init_options.store or bpl_comm_create_from_store.
  const bpl_store* table() const { return &table_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  bpl_store table_;
};

}  // namespace backplane::torch_backend
