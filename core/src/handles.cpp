#include "handles.h"

#include <pthread.h>
#include <unistd.h>

#include <mutex>

#include "error.h"

namespace backplane {
namespace {

std::atomic<pid_t> current_process{0};

void after_fork_in_child() { current_process.store(::getpid(), std::memory_order_relaxed); }

}  // namespace

pid_t this_process_id() {
  static std::once_flag watched;
  std::call_once(watched, [] {
    current_process.store(::getpid(), std::memory_order_relaxed);
    ::pthread_atfork(nullptr, nullptr, after_fork_in_child);
  });
  return current_process.load(std::memory_order_relaxed);
}

void refuse_in_forked_child(const bpl_runtime* runtime, const char* param) {
  const pid_t here = current_process.load(std::memory_order_relaxed);  // set: a runtime exists
  if (runtime->process == here) return;
  throw Error(BPL_ERR_INVALID_ARGUMENT,
              std::string(param) + " belongs to process " + std::to_string(runtime->process) + ", which this process (" +
                  std::to_string(here) + ") was forked from after bpl_init: a forked child is no rank of its parent's "
                  "job and must not use its handles (bpl_init in the child makes a job of its own; see docs/faults.md)");
}

bpl_comm* wrap_comm(bpl_runtime* runtime, bpl_plugin_comm* impl, bool is_world, std::string name, int64_t timeout_ms) {
  auto comm = std::make_unique<bpl_comm>(timeout_ms);
  comm->runtime = runtime;
  comm->impl = impl;
  comm->is_world = is_world;
  bpl_status status = runtime->api().comm_rank_size(impl, &comm->rank, &comm->size);
  if (status != BPL_OK) throw Error(status, "comm_rank_size failed: " + last_error());
  comm->name = std::move(name);
  comm->label = comm->name + " (rank " + std::to_string(comm->rank) + " of " + std::to_string(comm->size) + ")";
  return comm.release();
}

void destroy_comm(bpl_comm* comm) {
  comm->runtime->api().comm_destroy(comm->impl);
  comm->magic = 0;
  delete comm;
}

}  // namespace backplane
