// The process-wide runtime and world group.
#include "backplane/parallel/distributed.h"

#include <cstdlib>
#include <mutex>
#include <numeric>
#include <utility>

#include "backplane/parallel/parallel_state.h"
#include "runtime_link.h"
#include "world_renewal.h"

namespace backplane::parallel {
namespace {

struct Distributed {
  std::mutex mutex;
  std::shared_ptr<detail::RuntimeLink> link;
  std::shared_ptr<ProcessGroup> world;
  std::string backend;
  bool joined = false;  // admitted into a running job (BPL_JOIN=1)
};

Distributed& state() {
  static Distributed* instance = new Distributed;  // never destroyed: usable from other static destructors
  return *instance;
}

// BPL_JOIN=1, as bpl-run --replace starts a newcomer; the backend checks the value.
bool starts_to_join() {
  const char* join = std::getenv("BPL_JOIN");
  return join != nullptr && std::string(join) == "1";
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
    bool owns_world = false;
    if (starts_to_join()) {
      // A replacement: the world is the running job's once its members admit this process.
      check(bpl_comm_join(runtime, &world), "init_process_group: joining the running job");
      owns_world = true;
    } else {
      check(bpl_comm_world(runtime, &world), "bpl_comm_world");
    }
    int32_t size = 0;
    check(bpl_comm_size(world, &size), "bpl_comm_size");
    std::vector<int> ranks(static_cast<size_t>(size));
    std::iota(ranks.begin(), ranks.end(), 0);
    s.world = std::make_shared<ProcessGroup>(link, world, owns_world, std::move(ranks));
    s.joined = owns_world;
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
  s.joined = false;
  check(bpl_finalize(runtime), "destroy_process_group");
}

std::shared_ptr<ProcessGroup> get_world_group() { return world_or_throw(); }

bool joined_running_job() {
  world_or_throw();
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().joined;
}

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

namespace detail {

void renew_world(ProcessGroup& fresh) { renew_group(*world_or_throw(), fresh, true); }

}  // namespace detail

}  // namespace backplane::parallel
