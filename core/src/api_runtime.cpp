// The C API of runtimes: init and finalize, what was chosen and why, backends and plugins.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "backplane/plugin.h"
#include "error.h"
#include "handles.h"
#include "operation.h"
#include "operation_identity.h"
#include "validation.h"
#include "compile_cache.h"
#include "environment.h"
#include "loader.h"
#include "log.h"
#include "selection.h"

using namespace backplane;

namespace {

const bpl_init_options kDefaultInitOptions = BPL_INIT_OPTIONS_INIT;

// An option that a plugin older than ABI 1.`minor` cannot honour is refused, naming the plugin.
void require_plugin_abi(const bpl_runtime& runtime, bool given, int32_t minor, const char* option, const char* what) {
  const bpl_plugin_api& api = runtime.api();
  if (!given || api.abi_minor >= minor) return;
  throw Error(BPL_ERR_UNSUPPORTED, std::string(option) + ", but the " + api.name + " plugin at " + runtime.plugin->path() +
                                       " is ABI " + std::to_string(api.abi_major) + "." + std::to_string(api.abi_minor) +
                                       ", older than 1." + std::to_string(minor) + ", and cannot " + what);
}

// The world made from a caller's communicator places this process: rank and size are the world's, and
// the local ones those of its ranks on this machine, found by splitting the world by host name (a
// collective over it, as bpl_init is).
void place_in_native_world(bpl_runtime& runtime) {
  LaunchInfo& launch = runtime.launch;
  launch.rank = runtime.world->rank;
  launch.world_size = runtime.world->size;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  uint32_t color = 2166136261u;  // FNV-1a of the host name, as a non-negative color
  for (const char* c = host; *c != '\0'; ++c) color = (color ^ static_cast<unsigned char>(*c)) * 16777619u;
  const bpl_plugin_api& api = runtime.api();
  bpl_plugin_comm* local = nullptr;
  clear_last_error();
  bpl_status status = BPL_ERR_UNSUPPORTED;
  if (api.comm_split != nullptr) {
    const OperationScope splitting(numbered(runtime.world, fingerprint_of(BPL_COLL_COMM_SPLIT)));
    status = api.comm_split(runtime.world->impl, static_cast<int32_t>(color & 0x7fffffff), launch.rank, &local);
  }
  if (status != BPL_OK) throw Error(status, "finding this machine's ranks of options->native_comm: " + last_error());
  status = api.comm_rank_size(local, &launch.local_rank, &launch.local_world_size);
  api.comm_destroy(local);
  if (status != BPL_OK) throw Error(status, "comm_rank_size failed: " + last_error());
  runtime.launch_c.rank = launch.rank;
  runtime.launch_c.world_size = launch.world_size;
  runtime.launch_c.local_rank = launch.local_rank;
  runtime.launch_c.local_world_size = launch.local_world_size;
}

// What an operator needs first, as NCCL's start-up line gives it: versions, host and process, placement,
// the backend and why, and how it moves data (the plugin's own description).
std::string start_up_line(const bpl_runtime& runtime) {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "unknown");
  const bpl_plugin_api& api = runtime.api();
  const LaunchInfo& launch = runtime.launch;
  std::string line = std::string("backplane ") + BPL_VERSION + " (ABI " + std::to_string(BPL_ABI_MAJOR) + "." +
                     std::to_string(BPL_ABI_MINOR) + "), host " + host + ", pid " + std::to_string(::getpid()) +
                     ": rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.world_size) + " (local " +
                     std::to_string(launch.local_rank) + " of " + std::to_string(launch.local_world_size) +
                     "), backend " + api.name + " " + api.version + " from " + runtime.plugin->path() + " (" +
                     runtime.selection_reason + ")";
  if (runtime.caps.details != nullptr && runtime.caps.details[0] != '\0') line += "; " + std::string(runtime.caps.details);
  return line;
}


// bpl_finalize while other threads of this rank are in calls on its handles: no call starts from now;
// those in progress are ended by aborting every communicator (the plugins release their waits), and
// waited for, bounded, before anything they use is freed, and so, for a moment, are the frees of the
// requests whose waits it ended. Throws TIMEOUT, freeing nothing, if the calls do not end.
void end_calls_in_progress(bpl_runtime* runtime) {
  runtime->finalizing.store(true);  // sequentially consistent, against RuntimeCall's count
  if (runtime->calls_in_progress.load() == 0) return;
  std::vector<bpl_comm*> comms = {runtime->world};
  {
    std::lock_guard<std::mutex> lock(runtime->mutex);
    comms.insert(comms.end(), runtime->split_comms.begin(), runtime->split_comms.end());
  }
  auto abort = runtime->api().comm_abort;
  for (bpl_comm* comm : comms) {
    if (comm->state.abort("bpl_finalize ended it: it was called on another thread of this rank") && abort != nullptr) {
      abort(comm->impl);
    }
  }
  // As long as an operation may take to notice (its communicator's bound), and the plugin to report it.
  const auto bound = std::chrono::milliseconds(runtime->launch.timeout_ms) + std::chrono::seconds(2);
  const auto requests_left = [&] {
    int64_t left = 0;
    for (bpl_comm* comm : comms) left += comm->live_requests.load();
    return left;
  };
  std::unique_lock<std::mutex> lock(runtime->calls_mutex);
  const auto ended = [&] { return runtime->calls_in_progress.load() == 0; };
  const auto deadline = std::chrono::steady_clock::now() + bound;
  const auto wait_for_calls = [&] {
    if (runtime->calls_ended.wait_until(lock, deadline, ended)) return;
    runtime->finalizing.store(false);
    throw Error(BPL_ERR_TIMEOUT, std::to_string(runtime->calls_in_progress.load()) +
                                     " call(s) on other threads of this rank did not end within " +
                                     std::to_string(bound.count()) + " ms of their communicators' abort: nothing "
                                     "was freed (call bpl_finalize again once they have returned)");
  };
  wait_for_calls();
  // The threads whose waits it ended free their requests right after: a moment for them to begin, and
  // any free that began runs to its end (a request's free may wait for its operation's peers).
  runtime->calls_ended.wait_for(lock, std::chrono::seconds(1), [&] { return ended() && requests_left() == 0; });
  wait_for_calls();
}

}  // namespace

extern "C" {

bpl_status bpl_set_log_callback(bpl_log_callback callback, void* user_data) {
  set_log_callback(callback, user_data);
  return BPL_OK;
}

bpl_status bpl_init(const bpl_init_options* options, bpl_runtime** out) {
  return guarded("bpl_init", [&] {
    REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    bpl_init_options opts = read_input(options, kDefaultInitOptions, "options");
    EnvLookup env = process_environment();
    auto runtime = std::make_unique<bpl_runtime>();
    runtime->process = this_process_id();
    if (opts.store != nullptr) runtime->store = read_store(opts.store, "options->store");
    runtime->launch = resolve_launch(opts, env);
    runtime->debug_detail = debug_detail(env);
    log_level_setting(env);  // a bad BPL_LOG_LEVEL is refused here, naming it
    Selection selection = select_backend(opts.backend, env, probe_machine());
    const std::vector<std::string> dirs = plugin_search_dirs(env);
    runtime->plugin = use_first_candidate(selection, [&](const Candidate& candidate, const std::string& reason) {
      std::shared_ptr<Plugin> plugin = Plugin::load(find_plugin(candidate.backend, dirs, mpi_launcher_abi(env)));
      runtime->selection_reason = reason;
      return plugin;
    });

    LaunchInfo& launch = runtime->launch;
    const bool native = opts.native_comm != nullptr;
    // Before any connection, so that a bad setting is refused first; given a native communicator, once
    // the world it makes tells this process's rank.
    if (!native) runtime->trace = Trace::from_environment(env, launch.rank, launch.world_size, runtime->api().name);
    // Given a native communicator, the plugin learns the placement from it: the core's is unknown yet.
    runtime->launch_c = {sizeof(bpl_launch_info), native ? -1 : launch.rank, native ? -1 : launch.world_size,
                         native ? -1 : launch.local_rank, native ? -1 : launch.local_world_size,
                         launch.master_addr.c_str(), launch.launcher.c_str(), launch.master_port, 0,
                         launch.timeout_ms, runtime->store.get(), opts.native_comm};
    const bpl_plugin_api& api = runtime->api();
    require_plugin_abi(*runtime, runtime->store != nullptr, 2, "options->store is given", "meet through a store");
    require_plugin_abi(*runtime, native, 4, "options->native_comm is given", "take a native communicator");
    clear_last_error();
    bpl_status status = api.runtime_create(&runtime->launch_c, &runtime->impl);
    if (status != BPL_OK) {
      throw Error(status, std::string(api.name) + " (" + runtime->selection_reason + "): " +
                              (last_error().empty() ? bpl_status_name(status) : last_error()));
    }
    try {
      runtime->caps.struct_size = sizeof(bpl_plugin_caps);
      if (api.runtime_describe != nullptr) {
        status = api.runtime_describe(runtime->impl, &runtime->caps);
        if (status != BPL_OK) throw Error(status, "runtime_describe failed: " + last_error());
      }
      bpl_plugin_comm* world = nullptr;
      status = api.comm_world(runtime->impl, &world);
      if (status != BPL_OK) throw Error(status, "comm_world failed: " + last_error());
      runtime->world = wrap_comm(runtime.get(), world, true, "world", launch.timeout_ms);
      runtime->launch_c.native_comm = nullptr;  // the caller's, valid during runtime_create only
      if (native) {
        place_in_native_world(*runtime);
        runtime->trace = Trace::from_environment(env, launch.rank, launch.world_size, api.name);
      }
    } catch (...) {
      delete runtime->world;  // the plugin's world is its runtime's
      runtime->world = nullptr;
      api.runtime_destroy(runtime->impl);
      throw;
    }
    if (log_level() >= BPL_LOG_INFO) log(BPL_LOG_INFO, "core", start_up_line(*runtime));
    *out = runtime.release();
    return BPL_OK;
  });
}

bpl_status bpl_finalize(bpl_runtime* runtime) {
  return guarded("bpl_finalize", [&] {
    if (runtime == nullptr) return BPL_OK;
    check_runtime(runtime);
    end_calls_in_progress(runtime);
    if (runtime->trace) runtime->trace->write();
    std::set<bpl_comm*> leftover;
    {
      std::lock_guard<std::mutex> lock(runtime->mutex);
      leftover.swap(runtime->split_comms);
    }
    if (!leftover.empty()) {
      log(BPL_LOG_WARN, "core", std::to_string(leftover.size()) + " communicator(s) were not destroyed before bpl_finalize");
    }
    for (bpl_comm* comm : leftover) destroy_comm(comm);
    std::set<bpl_program*> programs;
    {
      std::lock_guard<std::mutex> lock(runtime->mutex);
      programs.swap(runtime->programs);
    }
    for (bpl_program* program : programs) {
      runtime->api().program_destroy(program->impl);
      program->magic = 0;
      delete program;
    }
    // The plugin's last exchange, the finalize barrier, is the world's last collective.
    const Fingerprint finalizing = numbered(runtime->world, fingerprint_of(static_cast<bpl_collective>(kFinalizeOp)));
    runtime->world->magic = 0;
    delete runtime->world;
    bpl_status status;
    {
      const OperationScope scope(finalizing);
      status = runtime->api().runtime_destroy(runtime->impl);
    }
    std::string message = last_error();
    runtime->magic = 0;
    delete runtime;
    if (status != BPL_OK) throw Error(status, message);
    return BPL_OK;
  });
}

bpl_status bpl_runtime_describe(const bpl_runtime* runtime, bpl_runtime_info* out) {
  return guarded("bpl_runtime_describe", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    bpl_runtime_info info{};
    info.struct_size = sizeof(info);
    info.backend = rt->api().name;
    info.plugin_path = rt->plugin->path().c_str();
    info.plugin_version = rt->api().version;
    info.selection_reason = rt->selection_reason.c_str();
    info.launcher = rt->launch.launcher.c_str();
    info.details = rt->caps.details != nullptr ? rt->caps.details : "";
    info.plugin_abi_major = rt->api().abi_major;
    info.plugin_abi_minor = rt->api().abi_minor;
    info.rank = rt->launch.rank;
    info.world_size = rt->launch.world_size;
    info.local_rank = rt->launch.local_rank;
    info.local_world_size = rt->launch.local_world_size;
    info.device_count = device_count_of(rt);
    info.dtypes = rt->caps.dtypes;
    info.collectives = rt->caps.collectives;
    info.reduce_ops = rt->caps.reduce_ops;
    info.timeout_ms = rt->launch.timeout_ms;
    info.kernels = rt->caps.kernels;
    info.program_formats = rt->caps.program_formats != nullptr ? rt->caps.program_formats : "";
    write_output(info, out, "out");
    return BPL_OK;
  });
}

bpl_status bpl_select_backend(const bpl_init_options* options, bpl_selection* out) {
  return guarded("bpl_select_backend", [&] {
    REQUIRE(out != nullptr, "out is NULL");
    bpl_init_options opts = read_input(options, kDefaultInitOptions, "options");
    EnvLookup env = process_environment();
    Selection selection = select_backend(opts.backend, env, probe_machine());
    std::vector<std::string> dirs = plugin_search_dirs(env);
    check_struct_size(out->struct_size, "out");  // a bad output struct is the caller's error, not a candidate's
    bpl_selection result{};
    result.struct_size = sizeof(result);
    std::string folders;
    for (const std::string& dir : dirs) folders += (folders.empty() ? "" : ":") + dir;
    copy_text(result.plugin_folders, sizeof(result.plugin_folders), folders);
    // The backend and reason are written even when no plugin file is found (bpl-cache needs the name).
    return use_first_candidate(selection, [&](const Candidate& candidate, const std::string& reason) {
      copy_text(result.backend, sizeof(result.backend), candidate.backend);
      copy_text(result.reason, sizeof(result.reason), reason);
      write_output(result, out, "out");
      copy_text(result.plugin_path, sizeof(result.plugin_path), find_plugin(candidate.backend, dirs, mpi_launcher_abi(env)));
      write_output(result, out, "out");
      return BPL_OK;
    });
  });
}

bpl_status bpl_plugin_probe(const char* backend, bpl_plugin_info* out) {
  return guarded("bpl_plugin_probe", [&] {
    REQUIRE(backend != nullptr && *backend != '\0', "backend is " + quoted(backend) + ": expected a name or a path");
    REQUIRE(out != nullptr, "out is NULL");
    const EnvLookup env = process_environment();
    std::shared_ptr<Plugin> plugin = Plugin::load(find_plugin(backend, plugin_search_dirs(env), mpi_launcher_abi(env)));
    bpl_plugin_info info{};
    info.struct_size = sizeof(info);
    copy_text(info.name, sizeof(info.name), plugin->api().name);
    copy_text(info.version, sizeof(info.version), plugin->api().version);
    copy_text(info.path, sizeof(info.path), plugin->path());
    info.abi_major = plugin->api().abi_major;
    info.abi_minor = plugin->api().abi_minor;
    write_output(info, out, "out");
    return BPL_OK;
  });
}


}  // extern "C"
