// libbackplane-gloo.so: CPU mode. Collectives on Gloo over TCP, rendezvous through LibTorch's
// TCPStore, one host device. This file is the C boundary: it unwraps handles and converts exceptions.
#include <gloo/config.h>
#include <signal.h>

#include <memory>
#include <string>

#include "backplane/plugin.h"
#include "cpu_kernels.h"
#include "dtypes.h"
#include "gloo_comm.h"
#include "host_device.h"
#include "plugin_support.h"
#include "rendezvous.h"

#ifndef BPL_VERSION
#define BPL_VERSION "0.0.0"
#endif

struct bpl_plugin_runtime {
  std::shared_ptr<backplane::gloo_plugin::Shared> shared;
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

GlooComm* unwrap(bpl_plugin_comm* comm) { return reinterpret_cast<GlooComm*>(comm); }
bpl_plugin_comm* wrap(GlooComm* comm) { return reinterpret_cast<bpl_plugin_comm*>(comm); }
Request* unwrap(bpl_plugin_request* req) { return reinterpret_cast<Request*>(req); }

size_t bytes_of(int64_t count, bpl_dtype dtype) { return static_cast<size_t>(count) * plugin::dtype_size(dtype); }

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
    ignore_sigpipe_unless_handled();
    auto runtime = std::make_unique<bpl_plugin_runtime>();
    Rendezvous joined = rendezvous(*launch);
    runtime->shared = std::make_shared<Shared>(
        Shared{joined.store, joined.device, std::chrono::milliseconds(launch->timeout_ms), joined.board,
               launch->world_size > 1 ? std::make_shared<ConnectionWatch>() : nullptr});
    runtime->world = std::make_unique<GlooComm>(runtime->shared, "world", launch->rank, launch->world_size,
                                                std::chrono::milliseconds(launch->timeout_ms));
    runtime->details = "gloo=" + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) + "." +
                       std::to_string(GLOO_VERSION_PATCH) + "; " + joined.description + "; collectives of world: " +
                       runtime->world->path() + "; a split takes its path from where its own ranks run";
    *out = runtime.release();
    return BPL_OK;
  });
}

bpl_status runtime_destroy(bpl_plugin_runtime* rt) {
  return guarded([&] {
    std::unique_ptr<bpl_plugin_runtime> runtime(rt);
    // Rank 0 hosts the store: leave together, so that no rank still needs it when it goes away.
    // A failing barrier (a peer already gone) must not stop the local cleanup.
    try {
      runtime->world->submit([&] { runtime->world->barrier(); }, nullptr);
    } catch (const std::exception& e) {
      plugin::log(BPL_LOG_INFO, kName, std::string("barrier at finalize failed: ") + e.what());
    }
    return BPL_OK;
  });
}

bpl_status runtime_describe(bpl_plugin_runtime* rt, bpl_plugin_caps* out) {
  out->collectives = plugin::kAllCollectives;
  out->dtypes = plugin::kAllDtypes;
  out->reduce_ops = plugin::kAllReduceOps;
  out->details = rt->details.c_str();
  out->kernels = cpu_kernels::kKernels;
  out->program_formats = cpu_kernels::kProgramFormats;
  return BPL_OK;
}

/* ---- communicators ---- */

bpl_status comm_world(bpl_plugin_runtime* rt, bpl_plugin_comm** out) {
  *out = wrap(rt->world.get());
  return BPL_OK;
}

bpl_status comm_split(bpl_plugin_comm* parent, int32_t color, int32_t key, bpl_plugin_comm** out) {
  return guarded([&] {
    GlooComm* comm = unwrap(parent);
    std::unique_ptr<GlooComm> child;
    comm->submit([&] { child = comm->split(color, key); }, nullptr);
    *out = wrap(child.release());
    return BPL_OK;
  });
}

bpl_status comm_destroy(bpl_plugin_comm* comm) {
  return guarded([&] {
    delete unwrap(comm);
    return BPL_OK;
  });
}

bpl_status comm_rank_size(bpl_plugin_comm* comm, int32_t* rank, int32_t* size) {
  *rank = unwrap(comm)->rank();
  *size = unwrap(comm)->size();
  return BPL_OK;
}

/* ---- collectives: bound into a body that runs in the communicator's order ---- */

bpl_status allreduce(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                     bpl_reduce_op op, bpl_plugin_request** req) {
  return guarded([&] {
    GlooComm* comm = unwrap(c);
    comm->submit([=] { comm->allreduce(send, recv, static_cast<size_t>(count), dtype, op); }, req);
    return BPL_OK;
  });
}

bpl_status broadcast(bpl_plugin_comm* c, void* buf, int64_t count, bpl_dtype dtype, int32_t root,
                     bpl_plugin_request** req) {
  return guarded([&] {
    GlooComm* comm = unwrap(c);
    comm->submit([=] { comm->broadcast(buf, static_cast<size_t>(count), dtype, root); }, req);
    return BPL_OK;
  });
}

bpl_status reduce(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype, bpl_reduce_op op,
                  int32_t root, bpl_plugin_request** req) {
  return guarded([&] {
    GlooComm* comm = unwrap(c);
    comm->submit([=] { comm->reduce(send, recv, static_cast<size_t>(count), dtype, op, root); }, req);
    return BPL_OK;
  });
}

bpl_status allgather(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                     bpl_plugin_request** req) {
  return guarded([&] {
    GlooComm* comm = unwrap(c);
    comm->submit([=] { comm->allgather(send, recv, static_cast<size_t>(count), dtype); }, req);
    return BPL_OK;
  });
}

bpl_status reduce_scatter(bpl_plugin_comm* c, const void* send, void* recv, int64_t recvcount, bpl_dtype dtype,
                          bpl_reduce_op op, bpl_plugin_request** req) {
  return guarded([&] {
    GlooComm* comm = unwrap(c);
    comm->submit([=] { comm->reduce_scatter(send, recv, static_cast<size_t>(recvcount), dtype, op); }, req);
    return BPL_OK;
  });
}

bpl_status alltoall(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                    bpl_plugin_request** req) {
  return guarded([&] {
    GlooComm* comm = unwrap(c);
    comm->submit([=] { comm->alltoall(send, recv, static_cast<size_t>(count), dtype); }, req);
    return BPL_OK;
  });
}

bpl_status barrier(bpl_plugin_comm* c, bpl_plugin_request** req) {
  return guarded([&] {
    GlooComm* comm = unwrap(c);
    comm->submit([=] { comm->barrier(); }, req);
    return BPL_OK;
  });
}

bpl_status send(bpl_plugin_comm* c, const void* buf, int64_t count, bpl_dtype dtype, int32_t peer, int32_t tag,
                bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->send(buf, bytes_of(count, dtype), peer, tag, req);
    return BPL_OK;
  });
}

bpl_status recv(bpl_plugin_comm* c, void* buf, int64_t count, bpl_dtype dtype, int32_t peer, int32_t tag,
                bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->recv(buf, bytes_of(count, dtype), peer, tag, req);
    return BPL_OK;
  });
}

bpl_status comm_set_timeout(bpl_plugin_comm* c, int64_t timeout_ms) {
  return guarded([&] {
    unwrap(c)->set_timeout(std::chrono::milliseconds(timeout_ms));
    return BPL_OK;
  });
}

bpl_status comm_abort(bpl_plugin_comm* c) {
  return guarded([&] {
    unwrap(c)->abort();
    return BPL_OK;
  });
}

/* ---- requests ---- */

bpl_status request_test(bpl_plugin_request* req, int32_t* done) {
  return guarded([&] { return unwrap(req)->test(done); });
}

bpl_status request_wait(bpl_plugin_request* req, int64_t timeout_ms) {
  return guarded([&] { return unwrap(req)->wait(std::chrono::milliseconds(timeout_ms)); });
}

bpl_status request_free(bpl_plugin_request* req) {
  return guarded([&] {
    std::unique_ptr<Request> request(unwrap(req));
    return request->finish();
  });
}

const bpl_plugin_api kApi = {
    sizeof(bpl_plugin_api),
    BPL_ABI_MAJOR,
    BPL_ABI_MINOR,
    kName,
    BPL_VERSION,
    runtime_create,
    runtime_destroy,
    runtime_describe,
    plugin::host_device::count,
    plugin::host_device::properties,
    plugin::host_device::alloc,
    plugin::host_device::free,
    plugin::host_device::copy,
    nullptr,  // synchronize: every operation is complete when it returns
    comm_world,
    comm_split,
    comm_destroy,
    comm_rank_size,
    allreduce,
    broadcast,
    reduce,
    allgather,
    reduce_scatter,
    alltoall,
    barrier,
    send,
    recv,
    request_test,
    request_wait,
    request_free,
    cpu_kernels::gemm,
    cpu_kernels::elementwise,
    cpu_kernels::cast,
    cpu_kernels::program_compiler,
    cpu_kernels::program_compile,
    cpu_kernels::artifact_free,
    cpu_kernels::program_load,
    cpu_kernels::program_run,
    cpu_kernels::program_destroy,
    comm_set_timeout,
    comm_abort,
};

}  // namespace
}  // namespace backplane::gloo_plugin

extern "C" bpl_status bpl_plugin_open_v1(const bpl_host_api* host, const bpl_plugin_api** out) {
  return backplane::plugin::open_plugin(host, backplane::gloo_plugin::kName, &backplane::gloo_plugin::kApi, out);
}
