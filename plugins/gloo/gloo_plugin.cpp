// libbackplane-gloo.so: CPU mode. Collectives on Gloo over TCP (and shared memory), rendezvous through
// backplane's own TCP store or the caller's, one host device. This file is the runtime's lifecycle; the shared entries (plugin_entry.h) are its C boundary.
#include <gloo/config.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>

#include "backplane/plugin.h"
#include "kernels_module.h"
#include "dtypes.h"
#include "gloo_comm.h"
#include "host_device.h"
#include "plugin_entry.h"
#include "plugin_support.h"
#include "polled_request.h"
#include "rendezvous.h"

struct bpl_plugin_runtime {
  std::shared_ptr<backplane::gloo_plugin::Shared> shared;
  std::shared_ptr<backplane::gloo_plugin::Shared> job;  // a joining process's way into the job (BPL_JOIN=1)
  std::unique_ptr<backplane::gloo_plugin::GlooComm> world;
  std::string details;
};

namespace backplane::gloo_plugin {
namespace {

constexpr const char* kName = "gloo";

template <typename Body>
bpl_status guarded(Body&& body) noexcept {
  return plugin::guarded(kName, classify_exception, std::forward<Body>(body));
}


// Gloo writes to its sockets with writev, and a peer that died or shut its connection down makes that
// raise SIGPIPE, whose default action ends the process silently. The failure must become an error on
// this rank instead (Gloo then sees EPIPE): SIGPIPE is ignored unless the program handles it itself,
// as network libraries that cannot pass MSG_NOSIGNAL do.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
    plugin::log(BPL_LOG_INFO, kName, "SIGPIPE is now ignored: a connection a peer closed is an error, not the end of this process");
  }
}

bpl_status runtime_create(const bpl_launch_info* launch, bpl_plugin_runtime** out) {
  return guarded([&] {
    plugin::refuse_native_comm(*launch, kName);
    ignore_sigpipe_unless_handled();
    auto runtime = std::make_unique<bpl_plugin_runtime>();
    if (joining()) {
      if (launch->world_size != 1) {
        throw Error(BPL_ERR_INVALID_ARGUMENT, "BPL_JOIN=1 with a world of " + std::to_string(launch->world_size) +
                                                  " ranks: a process that joins a running job is a world of its own "
                                                  "until bpl_comm_join; leave RANK and WORLD_SIZE unset");
      }
      Rendezvous job = rendezvous_to_join(*launch);
      runtime->job = std::make_shared<Shared>(Shared{job.store, job.device, std::chrono::milliseconds(launch->timeout_ms),
                                                     job.board, std::make_shared<ConnectionWatch>(), -1, nullptr, job.kv,
                                                     job.prefix, job.liveness});
    }
    Rendezvous joined = rendezvous(*launch);
    runtime->shared = std::make_shared<Shared>(
        Shared{joined.store, joined.device, std::chrono::milliseconds(launch->timeout_ms), joined.board,
               launch->world_size > 1 ? std::make_shared<ConnectionWatch>() : nullptr, joined.store_host_rank,
               joined.server, joined.kv, joined.prefix, joined.liveness});
    runtime->world = std::make_unique<GlooComm>(runtime->shared, "world", launch->rank, launch->world_size,
                                                std::chrono::milliseconds(launch->timeout_ms));
    // Waits in shared memory yield while they spin only where this machine's ranks outnumber its cores
    // (shm_internal.h's wait_until), as the MPI plugin's do.
    const int cores = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
    const int local = runtime->world->ranks_on_this_machine();
    const bool yield = local > cores;
    plugin::Backoff::yield_while_spinning().store(yield, std::memory_order_relaxed);
    runtime->details = "gloo=" + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) + "." +
                       std::to_string(GLOO_VERSION_PATCH) + "; " + joined.description + "; collectives of world: " +
                       runtime->world->path() + "; a split takes its path from where its own ranks run; " +
                       std::to_string(local) + " rank(s) on " + std::to_string(cores) + " core(s) here: waits " +
                       (yield ? "yield while they spin" : "spin without yielding, then sleep") + "; " +
                       (runtime->job ? "BPL_JOIN=1: " + std::string("joins the job through bpl_comm_join; ") : "") +
                       kernels_module::details();
    *out = runtime.release();
    return BPL_OK;
  });
}

bpl_status runtime_destroy(bpl_plugin_runtime* rt) {
  return guarded([&] {
    std::unique_ptr<bpl_plugin_runtime> runtime(rt);
    // Rank 0 hosts the store: leave together, so that no rank still needs it when it goes away.
    // A failing barrier (a peer already gone) must not stop the local cleanup; a world that failed
    // already cannot meet its peers.
    try {
      if (!runtime->world->has_failed()) runtime->world->barrier_at_finalize();
    } catch (const std::exception& e) {
      // Said, not returned: this rank's finalize is complete, but the job did not end together.
      plugin::log(BPL_LOG_WARN, kName, std::string("not every rank reached bpl_finalize: ") + e.what());
    }
    if (runtime->world->has_failed()) runtime->world->leave_after_failure();
    return BPL_OK;
  });
}

struct Traits {
  static constexpr const char* kName = gloo_plugin::kName;
  static bpl_status classify(const std::exception& e) { return classify_exception(e); }
  using Comm = GlooComm;
  using Request = gloo_plugin::Request;
  static Comm* world(bpl_plugin_runtime* rt) { return rt->world.get(); }
  // Its members meet through the caller's store on the runtime's device; its path (shared memory,
  // hierarchical, TCP) comes from where they run, as a split's does.
  static std::unique_ptr<Comm> create_from_store(bpl_plugin_runtime* rt, const bpl_store& store, int rank, int size,
                                                 std::chrono::milliseconds timeout) {
    Rendezvous joined = rendezvous_through(store, rank, size, timeout, rt->shared->device);
    std::shared_ptr<ConnectionWatch> watch = rt->shared->watch;
    if (watch == nullptr && size > 1) watch = std::make_shared<ConnectionWatch>();
    auto shared = std::make_shared<Shared>(
        Shared{joined.store, joined.device, timeout, joined.board, watch, -1, nullptr, joined.kv, joined.prefix, nullptr});
    return std::make_unique<GlooComm>(shared, "comm", rank, size, timeout);
  }
  // A process started to join a running job (BPL_JOIN=1), admitted by the members' grow.
  static std::unique_ptr<Comm> join(bpl_plugin_runtime* rt, std::chrono::milliseconds timeout) {
    if (!rt->job) {
      throw Error(BPL_ERR_INVALID_ARGUMENT, "bpl_comm_join: this process was not started to join a job: set BPL_JOIN=1 "
                                            "with the job's MASTER_ADDR and BPL_STORE_PORT (bpl-run --replace does)");
    }
    return GlooComm::join(rt->job, timeout);
  }
};

bpl_plugin_api make_table() {
  bpl_plugin_api api = plugin::comm_table<Traits>();
  api.runtime_create = runtime_create;
  api.runtime_destroy = runtime_destroy;
  api.runtime_describe = kernels_module::describe_cpu_runtime<bpl_plugin_runtime>;
  plugin::set_host_device(api);  // synchronize stays NULL: every operation is complete when it returns
  kernels_module::set_kernels(api);
  return api;
}

const bpl_plugin_api kApi = make_table();

}  // namespace
}  // namespace backplane::gloo_plugin

extern "C" bpl_status bpl_plugin_open_v1(const bpl_host_api* host, const bpl_plugin_api** out) {
  using namespace backplane::gloo_plugin;
  return backplane::plugin::open_plugin<Traits>(host, &kApi, out);
}
