// The process-wide runtime and world group.
#include "backplane/parallel/distributed.h"

#include <mutex>
#include <numeric>
#include <utility>

#include "backplane/parallel/parallel_state.h"
#include "runtime_link.h"

namespace backplane::parallel {
namespace {

struct Distributed {
  std::mutex mutex;
  std::shared_ptr<detail::RuntimeLink> link;
  std::shared_ptr<ProcessGroup> world;
  std::string backend;
};

Distributed& state() {
  static Distributed* instance = new Distributed;  // never destroyed: usable from other static destructors
  return *instance;
}

std::shared_ptr<ProcessGroup> world_or_throw() {
  Distributed& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.world) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "the process group is not initialised: call init_process_group() first");
  }
  return s.world;
}

}  // namespace

void init_process_group(const InitOptions& options) {
  Distributed& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.world) throw Error(BPL_ERR_INVALID_ARGUMENT, "init_process_group: the process group is already initialised");
  bpl_init_options init = BPL_INIT_OPTIONS_INIT;
  init.backend = options.backend.empty() ? nullptr : options.backend.c_str();
  init.rank = options.rank;
  init.world_size = options.world_size;
  init.timeout_ms = options.timeout_ms;
  bpl_runtime* runtime = nullptr;
  check(bpl_init(&init, &runtime), "init_process_group");
  auto link = std::make_shared<detail::RuntimeLink>();
  link->runtime = runtime;
  try {
    bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
    check(bpl_runtime_describe(runtime, &info), "bpl_runtime_describe");
    bpl_comm* world = nullptr;
    check(bpl_comm_world(runtime, &world), "bpl_comm_world");
    std::vector<int> ranks(static_cast<size_t>(info.world_size));
    std::iota(ranks.begin(), ranks.end(), 0);
    s.world = std::make_shared<ProcessGroup>(link, world, false, std::move(ranks));
    s.backend = info.backend;
    s.link = std::move(link);
  } catch (...) {
    bpl_finalize(runtime);
    throw;
  }
}

bool is_initialized() {
  Distributed& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.world != nullptr;
}

void destroy_process_group() {
  destroy_model_parallel();
  Distributed& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.link) return;
  bpl_runtime* runtime = nullptr;
  {
    std::lock_guard<std::mutex> link_lock(s.link->mutex);
    for (bpl_comm* comm : s.link->split_comms) bpl_comm_destroy(comm);  // any left, bpl_finalize destroys
    s.link->split_comms.clear();
    runtime = s.link->runtime.exchange(nullptr);
  }
  s.link.reset();
  s.world.reset();
  s.backend.clear();
  check(bpl_finalize(runtime), "destroy_process_group");
}

std::shared_ptr<ProcessGroup> get_world_group() { return world_or_throw(); }
int get_rank() { return world_or_throw()->rank(); }
int get_world_size() { return world_or_throw()->size(); }

std::string get_backend() {
  world_or_throw();
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().backend;
}

bpl_runtime* get_runtime() {
  world_or_throw();
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().link->runtime;
}

}  // namespace backplane::parallel
