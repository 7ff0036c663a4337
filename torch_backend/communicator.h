// What a group's operations live on: the process's backplane runtime and a group's communicator, each
// released with the last group or work that holds it.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "backplane/backplane.h"
#include "store_callbacks.h"

namespace backplane::torch_backend {

// The process's backplane runtime, shared by every group torch makes; finalized with the last of them.
class Runtime {
 public:
  Runtime(bpl_runtime* handle, std::unique_ptr<StoreCallbacks> store) : handle_(handle), store_(std::move(store)) {}
  ~Runtime() { bpl_finalize(handle_); }
  bpl_runtime* handle() const { return handle_; }

  // The running one, if a group holds it.
  static std::shared_ptr<Runtime> current() {
    std::lock_guard<std::mutex> lock(mutex());
    return instance().lock();
  }
  static void set_current(const std::shared_ptr<Runtime>& runtime) {
    std::lock_guard<std::mutex> lock(mutex());
    instance() = runtime;
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::weak_ptr<Runtime>& instance() {
    static std::weak_ptr<Runtime> runtime;
    return runtime;
  }
  bpl_runtime* handle_;
  std::unique_ptr<StoreCallbacks> store_;  // the world's meeting place, used until bpl_finalize
};

// A group's communicator with what it lives on (the runtime, the store its members met through);
// destroyed with the last of the group and its works, so that no request outlives its communicator.
class Communicator {
 public:
  // `parent`: the group's communicator this one was shrunk from, which holds the store both met
  // through, kept while this one lives.
  Communicator(std::shared_ptr<Runtime> runtime, bpl_comm* comm, bool owns_comm, std::unique_ptr<StoreCallbacks> store,
               std::shared_ptr<Communicator> parent = nullptr)
      : runtime_(std::move(runtime)), comm_(comm), owns_comm_(owns_comm), store_(std::move(store)),
        parent_(std::move(parent)) {}
  ~Communicator() {
    if (owns_comm_) bpl_comm_destroy(comm_);
  }
  bpl_comm* get() const { return comm_; }
  bpl_runtime* runtime() const { return runtime_->handle(); }
  const std::shared_ptr<Runtime>& shared_runtime() const { return runtime_; }
  // The status of the first operation of the group that failed (BPL_OK while none has): getError.
  void record_failure(bpl_status status) {
    int none = BPL_OK;
    first_failure_.compare_exchange_strong(none, status);
  }
  bpl_status first_failure() const { return static_cast<bpl_status>(first_failure_.load()); }

 private:
  std::atomic<int> first_failure_{BPL_OK};
  std::shared_ptr<Runtime> runtime_;  // first in, last out: the communicator goes before the runtime
  bpl_comm* comm_;
  bool owns_comm_;
  std::unique_ptr<StoreCallbacks> store_;  // the store this group met through, while it lives
  std::shared_ptr<Communicator> parent_;
};

}  // namespace backplane::torch_backend
