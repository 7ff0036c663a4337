// libbackplane-mpi.so: collectives on Open MPI (any MPI-3 library), one host device. This file is the
// C boundary and MPI's process lifecycle: initialise only if the embedder has not, finalise only what
// was initialised here.
#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <string>

#include "backplane/plugin.h"
#include "cpu_kernels.h"
#include "dtypes.h"
#include "host_device.h"
#include "mpi_comm.h"
#include "plugin_support.h"

#ifndef BPL_VERSION
#define BPL_VERSION "0.0.0"
#endif

struct bpl_plugin_runtime {
  std::unique_ptr<backplane::mpi_plugin::MpiComm> world;
  std::string details;
};

namespace backplane::mpi_plugin {
namespace {

constexpr const char* kName = "mpi";

bpl_status classify(const std::exception&) { return BPL_ERR_INTERNAL; }

template <typename Body>
bpl_status guarded(Body&& body) noexcept {
  return plugin::guarded(kName, classify, std::forward<Body>(body));
}

MpiComm* unwrap(bpl_plugin_comm* comm) { return reinterpret_cast<MpiComm*>(comm); }
bpl_plugin_comm* wrap(MpiComm* comm) { return reinterpret_cast<bpl_plugin_comm*>(comm); }
Request* unwrap(bpl_plugin_request* req) { return reinterpret_cast<Request*>(req); }

// MPI is initialised once per process; runtimes share it.
struct ProcessState {
  std::mutex mutex;
  int runtimes = 0;
  bool initialized_here = false;
  std::mutex serialize;  // for MpiProcess::serialize when MPI is not thread-multiple
  MpiProcess process;
};
ProcessState& state() {
  static ProcessState s;
  return s;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}

std::string env(const char* name) {
  const char* value = plugin::host()->get_env(name);
  return value != nullptr ? value : "";
}

// Open MPI loads its own components with dlopen and expects libmpi's symbols to be global; the core
// loads plugins RTLD_LOCAL, so promote the already-loaded libmpi (as mpi4py does).
void make_mpi_symbols_global() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init_thread), &info) != 0 && info.dli_fname != nullptr) {
    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
  }
}

void initialize_mpi(const bpl_launch_info& launch) {
  ProcessState& s = state();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    throw plugin::Error(BPL_ERR_UNAVAILABLE,
                        "MPI was already finalised in this process (an earlier bpl_finalize or the program); MPI "
                        "cannot be initialised twice");
  }
  if (!initialized) {
    // Without an MPI launcher, N ranks would each become a singleton MPI job: refuse instead.
    const bool under_mpi_launcher = !env("OMPI_COMM_WORLD_SIZE").empty() || !env("PMIX_RANK").empty() ||
                                    !env("PMI_RANK").empty();
    if (launch.world_size > 1 && !under_mpi_launcher) {
      throw plugin::Error(BPL_ERR_UNAVAILABLE,
                          "the mpi backend must be started by an MPI launcher, but this process has " +
                              std::string(launch.launcher) + "'s launch variables (bpl-run or torchrun) as rank " + std::to_string(launch.rank) + " of " +
                              std::to_string(launch.world_size) + ": run `mpirun -np " +
                              std::to_string(launch.world_size) + " <program>` instead, or use BPL_BACKEND=gloo");
    }
    make_mpi_symbols_global();
    int provided = MPI_THREAD_SINGLE;
    int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (code != MPI_SUCCESS) throw plugin::Error(BPL_ERR_UNAVAILABLE, "MPI_Init_thread failed: " + mpi_error_string(code));
    s.initialized_here = true;
    s.process.thread_level = provided;
    // Open MPI reports some failures of non-blocking collectives (a truncation inside libnbc's schedule)
    // on MPI_COMM_WORLD, whose default handler ends the job: they must come back as errors. A program
    // that initialised MPI itself keeps its own handler.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    MPI_Query_thread(&s.process.thread_level);
  }
  s.process.serialize = s.process.thread_level == MPI_THREAD_MULTIPLE ? nullptr : &s.serialize;
  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found);
  if (found && tag_ub != nullptr) s.process.tag_upper_bound = *tag_ub;
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<size_t>(length));
  version = version.substr(0, version.find_first_of(",\n"));  // "Open MPI v4.1.4"
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return version + " (MPI " + std::to_string(major) + "." + std::to_string(minor) + ")";
}

bpl_status runtime_create(const bpl_launch_info* launch, bpl_plugin_runtime** out) {
  return guarded([&] {
    ProcessState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.runtimes == 0) initialize_mpi(*launch);
    int world_rank = 0, world_size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (world_size != launch->world_size || world_rank != launch->rank) {
      throw plugin::Error(BPL_ERR_MISMATCH, "MPI says rank " + std::to_string(world_rank) + " of " +
                                                std::to_string(world_size) + " but the launch environment (" +
                                                launch->launcher + ") says rank " + std::to_string(launch->rank) +
                                                " of " + std::to_string(launch->world_size));
    }
    MPI_Comm world = MPI_COMM_NULL;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &world) != MPI_SUCCESS) {
      throw plugin::Error(BPL_ERR_INTERNAL, "MPI_Comm_dup(MPI_COMM_WORLD) failed");
    }
    auto runtime = std::make_unique<bpl_plugin_runtime>();
    runtime->world = std::make_unique<MpiComm>(s.process, world, std::chrono::milliseconds(launch->timeout_ms));
    runtime->details = "library=" + library_version() + "; thread_level=" + thread_level_name(s.process.thread_level) +
                       (s.initialized_here ? "; initialised by backplane" : "; initialised by the program");
    ++s.runtimes;
    *out = runtime.release();
    return BPL_OK;
  });
}

bpl_status runtime_destroy(bpl_plugin_runtime* rt) {
  return guarded([&] {
    ProcessState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.runtimes == 1 && s.initialized_here && !s.process.communicator_failed) {
      // MPI_Finalize waits for every rank with no timeout: first see, within the timeout, that all of
      // them came this far (a rank stopped or gone makes this fail, and MPI_Finalize is then skipped).
      try {
        rt->world->barrier(nullptr);
      } catch (const std::exception& e) {
        plugin::log(BPL_LOG_WARN, kName, std::string("not every rank reached bpl_finalize: ") + e.what());
      }
    }
    delete rt;
    if (--s.runtimes == 0 && s.initialized_here) {
      s.initialized_here = false;
      if (s.process.communicator_failed) {
        // MPI_Finalize synchronises with every rank, the failed or stopped one included, and has no
        // timeout: leaving MPI initialised is the bounded choice. The process can exit; mpirun then
        // ends the job and reports this rank as ending without MPI_Finalize.
        plugin::log(BPL_LOG_WARN, kName, "MPI_Finalize skipped: a communicator failed, and MPI_Finalize would wait for "
                                         "the failed rank");
        return BPL_OK;
      }
      int code = MPI_Finalize();
      if (code != MPI_SUCCESS) throw plugin::Error(BPL_ERR_REMOTE, "MPI_Finalize failed: " + mpi_error_string(code));
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
    *out = wrap(unwrap(parent)->split(color, key).release());
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

/* ---- collectives ---- */

bpl_status allreduce(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                     bpl_reduce_op op, bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->allreduce(send, recv, static_cast<size_t>(count), dtype, op, req);
    return BPL_OK;
  });
}

bpl_status broadcast(bpl_plugin_comm* c, void* buf, int64_t count, bpl_dtype dtype, int32_t root,
                     bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->broadcast(buf, static_cast<size_t>(count), dtype, root, req);
    return BPL_OK;
  });
}

bpl_status reduce(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype, bpl_reduce_op op,
                  int32_t root, bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->reduce(send, recv, static_cast<size_t>(count), dtype, op, root, req);
    return BPL_OK;
  });
}

bpl_status allgather(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                     bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->allgather(send, recv, static_cast<size_t>(count), dtype, req);
    return BPL_OK;
  });
}

bpl_status reduce_scatter(bpl_plugin_comm* c, const void* send, void* recv, int64_t recvcount, bpl_dtype dtype,
                          bpl_reduce_op op, bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->reduce_scatter(send, recv, static_cast<size_t>(recvcount), dtype, op, req);
    return BPL_OK;
  });
}

bpl_status alltoall(bpl_plugin_comm* c, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                    bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->alltoall(send, recv, static_cast<size_t>(count), dtype, req);
    return BPL_OK;
  });
}

bpl_status barrier(bpl_plugin_comm* c, bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->barrier(req);
    return BPL_OK;
  });
}

bpl_status send(bpl_plugin_comm* c, const void* buf, int64_t count, bpl_dtype dtype, int32_t peer, int32_t tag,
                bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->send(buf, static_cast<size_t>(count), dtype, peer, tag, req);
    return BPL_OK;
  });
}

bpl_status recv(bpl_plugin_comm* c, void* buf, int64_t count, bpl_dtype dtype, int32_t peer, int32_t tag,
                bpl_plugin_request** req) {
  return guarded([&] {
    unwrap(c)->recv(buf, static_cast<size_t>(count), dtype, peer, tag, req);
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
    // Bounded by the request's own deadline (the communicator's timeout from its start); an abort does
    // not cut it short, so that no buffer is touched after it returns.
    request->wait(request->comm().timeout() + std::chrono::milliseconds(1), /*released_by_abort=*/false);
    if (request->owned_by_mpi()) {
      // MPI still owns the operation and its buffers: keep them until the communicator goes.
      request->expire();
      plugin::host()->set_error(("mpi: " + request->message()).c_str());
      request->comm().abandon(std::move(request));
      return BPL_ERR_TIMEOUT;
    }
    return BPL_OK;
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
    nullptr,  // synchronize: host memory, nothing queued
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
}  // namespace backplane::mpi_plugin

extern "C" bpl_status bpl_plugin_open_v1(const bpl_host_api* host, const bpl_plugin_api** out) {
  return backplane::plugin::open_plugin(host, backplane::mpi_plugin::kName, &backplane::mpi_plugin::kApi, out);
}
