// libbackplane-mpi.so: collectives on Open MPI (any MPI-3 library), one host device. This file is
// MPI's process lifecycle, initialised only if the embedder has not, finalised only if initialised
// here; the shared entries (plugin_entry.h) are the C boundary.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backplane/plugin.h"
#include "deadline_guard.h"
#include "job_siblings.h"
#include "kernels_module.h"
#include "dtypes.h"
#include "host_device.h"
#include "mpi_comm.h"
#include "plugin_entry.h"
#include "plugin_support.h"

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

// MPI is initialised once per process; runtimes share it.
struct ProcessState {
  std::mutex mutex;
  int runtimes = 0;
  bool initialized_here = false;          // then MPI_Finalize runs at exit (finalize_at_exit)
  pid_t initialized_in = 0;               // the process that did: a child forked since must not finalize
  std::chrono::milliseconds exit_timeout{0};  // the last runtime's, which bounds MPI_Finalize at exit
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
  const char* value = plugin::env(name);
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

std::string this_plugin_file() {
  Dl_info info{};
  const bool found = dladdr(reinterpret_cast<void*>(&make_mpi_symbols_global), &info) != 0 && info.dli_fname != nullptr;
  return found ? info.dli_fname : "libbackplane-mpi";
}

bool file_mentions(const std::string& path, const std::string& text) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    if (line.find(text) != std::string::npos && line.find('#') != 0) return true;
  }
  return false;
}

// Whether the shared-memory eager limit may differ from Open MPI 4's default: another MPI library, or a
// setting of btl_vader_eager_limit (or its alias btl_sm_eager_limit) where Open MPI reads its parameters
// (its documented sources): the environment (what mpirun --mca and -x pass on), the system's and the
// user's parameter files, or parameter files named by the environment, which are not looked into.
bool eager_limit_may_be_set() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(version, &length);
  if (std::string(version).rfind("Open MPI v4.", 0) != 0) return true;
  for (const char* variable : {"OMPI_MCA_btl_vader_eager_limit", "OMPI_MCA_btl_sm_eager_limit",
                               "OMPI_MCA_mca_base_param_files", "OMPI_MCA_mca_base_param_file_prefix"}) {
    if (!env(variable).empty()) return true;
  }
  std::vector<std::string> files{"/etc/openmpi/openmpi-mca-params.conf"};
  if (!env("OPAL_PREFIX").empty()) files.push_back(env("OPAL_PREFIX") + "/etc/openmpi-mca-params.conf");
  if (!env("HOME").empty()) files.push_back(env("HOME") + "/.openmpi/mca-params.conf");
  return std::any_of(files.begin(), files.end(), [](const std::string& f) {
    return file_mentions(f, "vader_eager_limit") || file_mentions(f, "sm_eager_limit");
  });
}

// The largest message Open MPI's shared-memory transport copies eagerly: btl_vader_eager_limit
// (4096 by default, read through MPI's tool interface where it exists) less the headers it counts and a
// margin. Above it Open MPI 4.1's single copy writes a message whole, past a smaller receive buffer.
//
// Reading it through the tool interface opens every component of every framework (MPI_T_init_thread),
// as long as MPI_Init itself, so Open MPI 4's default is taken as it is unless one of the places Open
// MPI reads parameters from may set it (eager_limit_may_be_set;
// bench/results/design-choices.md#open-mpis-eager-limit).
size_t eager_message_bytes() {
  constexpr size_t kHeaderMargin = 128;
  unsigned long long limit = 4096;
  int provided = 0;
  if (eager_limit_may_be_set() && MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) == MPI_SUCCESS) {
    int index = -1;
    char name[256], description[1024];
    int name_length = sizeof(name), description_length = sizeof(description), verbosity = 0, binding = 0, scope = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum values;
    MPI_T_cvar_handle handle;
    int elements = 0;
    if (MPI_T_cvar_get_index("btl_vader_eager_limit", &index) == MPI_SUCCESS &&
        MPI_T_cvar_get_info(index, name, &name_length, &verbosity, &type, &values, description, &description_length,
                            &binding, &scope) == MPI_SUCCESS &&
        (type == MPI_UNSIGNED_LONG || type == MPI_UNSIGNED_LONG_LONG) &&
        MPI_T_cvar_handle_alloc(index, nullptr, &handle, &elements) == MPI_SUCCESS) {
      unsigned long long value = 0;  // the widest of the two
      if (elements == 1 && MPI_T_cvar_read(handle, &value) == MPI_SUCCESS) {
        limit = type == MPI_UNSIGNED_LONG ? static_cast<unsigned long>(value) : value;
      }
      MPI_T_cvar_handle_free(&handle);
    }
    MPI_T_finalize();
  }
  return limit > kHeaderMargin ? static_cast<size_t>(limit) - kHeaderMargin : 0;
}

// MPI can be initialised once in a process, so MPI that backplane initialised stays so from the last
// bpl_finalize to the process's exit (as PyTorch's MPI process group does): a bpl_init may follow a
// bpl_finalize any number of times. MPI_Finalize waits for every rank to finalize, under the timeout.
void finalize_at_exit() {
  ProcessState& s = state();
  // A child forked after MPI_Init shares its parent's MPI: its MPI_Finalize would end the parent's part
  // of the job (and wait for the others). Asked first, before a mutex some thread of the parent held.
  if (s.initialized_in != ::getpid()) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!s.initialized_here || finalized) return;
  if (s.process.communicator_failed) {
    // MPI_Finalize would wait for the failed rank: leaving MPI initialised is the bounded choice, and
    // mpirun then ends the job reporting this rank as ending without MPI_Finalize.
    plugin::log(BPL_LOG_WARN, kName, "MPI_Finalize skipped at exit: a communicator failed, and MPI_Finalize would "
                                     "wait for the failed rank");
    return;
  }
  // A runtime still open (a program that never called bpl_finalize, or whose torch backend outlives
  // Python) is left to MPI_Finalize, which frees its communicators.
  DeadlineGuard guard(s.exit_timeout, "MPI_Finalize at exit",
                      "it waits for every rank of the job to finalize, and a rank is stopped, stuck, or still "
                      "running long after this one",
                      stopped_job_siblings_note);
  const int code = MPI_Finalize();
  if (code != MPI_SUCCESS) plugin::log(BPL_LOG_ERROR, kName, "MPI_Finalize at exit failed: " + mpi_error_string(code));
}

// The MPI ABI this plugin is built for; a process started by a launcher of another ABI is refused before
// MPI_Init, which would abort the process (MPICH under Open MPI's mpirun: "unsupported PMI version
// PMIx") or make each rank a job of its own (Open MPI under MPICH's mpiexec). The core picks the plugin
// built for the launcher's ABI where it finds one (libbackplane-mpi-<abi>.so).
#if defined(OPEN_MPI)
constexpr const char* kBuiltFor = "Open MPI";
// Hydra, MPICH's and Intel MPI's process manager, alone sets MPI_LOCALNRANKS (srun's PMI-2 sets PMI_RANK).
bool launched_by_another_abi() { return !env("MPI_LOCALNRANKS").empty() && env("OMPI_COMM_WORLD_SIZE").empty(); }
constexpr const char* kLauncherSeen = "MPICH's or Intel MPI's mpiexec (MPI_LOCALNRANKS is set)";
constexpr const char* kPluginNeeded = "libbackplane-mpi-mpich.so, built where the build finds MPICH";
#elif defined(MPICH)
constexpr const char* kBuiltFor = "MPICH's ABI (MPICH, Intel MPI)";
bool launched_by_another_abi() { return !env("OMPI_COMM_WORLD_SIZE").empty(); }
constexpr const char* kLauncherSeen = "Open MPI's mpirun (OMPI_COMM_WORLD_SIZE is set)";
constexpr const char* kPluginNeeded = "libbackplane-mpi.so or libbackplane-mpi-openmpi5.so, built for Open MPI";
#else
constexpr const char* kBuiltFor = "";
bool launched_by_another_abi() { return false; }
constexpr const char* kLauncherSeen = "";
constexpr const char* kPluginNeeded = "";
#endif

void initialize_mpi(const bpl_launch_info& launch) {
  ProcessState& s = state();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    throw plugin::Error(BPL_ERR_UNAVAILABLE,
                        "MPI was finalised in this process by the program; MPI cannot be initialised twice");
  }
  if (s.process.communicator_failed) {
    // A new world duplicates MPI_COMM_WORLD, which waits for every rank, the failed one included.
    throw plugin::Error(BPL_ERR_UNAVAILABLE,
                        "a communicator of the mpi backend failed or was aborted earlier in this process, and Open MPI "
                        "cannot leave a failed rank behind: a new world needs a new job");
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
    if (launched_by_another_abi()) {
      throw plugin::Error(BPL_ERR_UNAVAILABLE, std::string("this mpi plugin (") + this_plugin_file() + ") is built for " +
                                                   kBuiltFor + ", but " + kLauncherSeen + " started this process: "
                                                   "start the job with its MPI's launcher, or use " + kPluginNeeded +
                                                   " (tools/install-deps installs MPICH and Open MPI 5)");
    }
    make_mpi_symbols_global();
    int provided = MPI_THREAD_SINGLE;
    int code;
    {
      DeadlineGuard guard(std::chrono::milliseconds(launch.timeout_ms),
                          "MPI_Init_thread (rank " + std::to_string(launch.rank) + " of " +
                              std::to_string(launch.world_size) + ")",
                          "it waits for every rank of the job to start, and another rank is stopped, stuck or "
                          "never started",
                          stopped_job_siblings_note);
      code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    }
    if (code != MPI_SUCCESS) throw plugin::Error(BPL_ERR_UNAVAILABLE, "MPI_Init_thread failed: " + mpi_error_string(code));
    s.initialized_here = true;
    s.initialized_in = ::getpid();
    // MPI_Finalize at exit is bounded from here on, also when this bpl_init fails after MPI_Init.
    s.exit_timeout = std::chrono::milliseconds(launch.timeout_ms);
    std::atexit(finalize_at_exit);
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
  s.process.eager_bytes = eager_message_bytes();
}

// The communicator the world duplicates: the caller's (ABI 1.4's native_comm, of an MPI the caller
// initialised), else MPI_COMM_WORLD.
MPI_Comm native_world(const bpl_launch_info& launch) {
  const void* native = plugin::native_comm_of(launch);
  if (native == nullptr) return MPI_COMM_WORLD;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    throw plugin::Error(BPL_ERR_INVALID_ARGUMENT, std::string("options->native_comm is given, but MPI is ") +
                                                      (finalized ? "finalised" : "not initialised") +
                                                      ": the program that hands over its MPI_Comm initialises MPI "
                                                      "before bpl_init and finalizes it after bpl_finalize");
  }
  const MPI_Comm comm = *static_cast<const MPI_Comm*>(native);
  int inter = 0;
  if (comm == MPI_COMM_NULL || MPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter) {
    throw plugin::Error(BPL_ERR_INVALID_ARGUMENT,
                        std::string("options->native_comm is ") +
                            (comm == MPI_COMM_NULL ? "MPI_COMM_NULL" : inter ? "an intercommunicator" : "not a communicator") +
                            ": expected the address of an intracommunicator this process belongs to");
  }
  return comm;
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<size_t>(length));
  version = version.substr(0, version.find_first_of(",\n"));  // "Open MPI v4.1.4", "MPICH Version:  5.0.2"
  version.erase(std::unique(version.begin(), version.end(), [](char a, char b) { return a == ' ' && b == ' '; }),
                version.end());
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return version + " (MPI " + std::to_string(major) + "." + std::to_string(minor) + ")";
}

bpl_status runtime_create(const bpl_launch_info* launch, bpl_plugin_runtime** out) {
  return guarded([&] {
    ProcessState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    const MPI_Comm base = native_world(*launch);
    if (s.runtimes == 0) initialize_mpi(*launch);
    if (base == MPI_COMM_WORLD) {
      int world_rank = 0, world_size = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
      MPI_Comm_size(MPI_COMM_WORLD, &world_size);
      if (world_size != launch->world_size || world_rank != launch->rank) {
        throw plugin::Error(BPL_ERR_MISMATCH, "MPI says rank " + std::to_string(world_rank) + " of " +
                                                  std::to_string(world_size) + " but the launch environment (" +
                                                  launch->launcher + ") says rank " + std::to_string(launch->rank) +
                                                  " of " + std::to_string(launch->world_size));
      }
    }
    // Within the timeout: every rank calls bpl_init (again, after a bpl_finalize) to get its world.
    const MPI_Comm world = duplicate_within(s.process, base, std::chrono::milliseconds(launch->timeout_ms));
    auto runtime = std::make_unique<bpl_plugin_runtime>();
    runtime->world = std::make_unique<MpiComm>(s.process, world, std::chrono::milliseconds(launch->timeout_ms));
    // Waits yield while they spin only where this machine's ranks outnumber its cores (polled_request.h;
    // not this process's affinity: mpirun binds each rank to a core of its own).
    const int cores = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
    const bool yield = runtime->world->local_ranks() > cores;
    plugin::Backoff::yield_while_spinning().store(yield, std::memory_order_relaxed);
    runtime->details = "library=" + library_version() + "; thread_level=" + thread_level_name(s.process.thread_level) +
                       "; " + std::to_string(runtime->world->local_ranks()) + " rank(s) on " + std::to_string(cores) +
                       " core(s) here: waits " + (yield ? "yield" : "do not yield") + " while they spin" +
                       "; eager messages up to " + std::to_string(s.process.eager_bytes) + " bytes" +
                       (s.initialized_here ? "; initialised by backplane" : "; initialised by the program") +
                       (base == MPI_COMM_WORLD ? "; world: MPI_COMM_WORLD" : "; world: the program's communicator") +
                       "; " + kernels_module::details();
    s.exit_timeout = std::chrono::milliseconds(launch->timeout_ms);
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
      // The ranks leave together, as on every backend: MPI_Finalize at exit then waits only for ranks
      // that came this far (a rank stopped or gone fails this, and MPI_Finalize is then skipped).
      try {
        rt->world->finalize_barrier();
      } catch (const std::exception& e) {
        plugin::log(BPL_LOG_WARN, kName, std::string("not every rank reached bpl_finalize: ") + e.what());
      }
    }
    delete rt;
    --s.runtimes;  // MPI that backplane initialised is finalised at exit (finalize_at_exit)
    return BPL_OK;
  });
}

struct Traits {
  static constexpr const char* kName = mpi_plugin::kName;
  static bpl_status classify(const std::exception& e) { return mpi_plugin::classify(e); }
  using Comm = MpiComm;
  using Request = mpi_plugin::Request;
  static Comm* world(bpl_plugin_runtime* rt) { return rt->world.get(); }
  static std::unique_ptr<Comm> create_from_store(bpl_plugin_runtime* rt, const bpl_store& store, int rank, int size,
                                                 std::chrono::milliseconds timeout) {
    return MpiComm::create_from_store(rt->world->process(), store, rank, size, timeout);
  }
};

bpl_plugin_api make_table() {
  bpl_plugin_api api = plugin::comm_table<Traits>();
  api.runtime_create = runtime_create;
  api.runtime_destroy = runtime_destroy;
  api.runtime_describe = kernels_module::describe_cpu_runtime<bpl_plugin_runtime>;
  plugin::set_host_device(api);  // synchronize stays NULL: host memory, nothing queued
  kernels_module::set_kernels(api);
  return api;
}

const bpl_plugin_api kApi = make_table();

}  // namespace
}  // namespace backplane::mpi_plugin

extern "C" bpl_status bpl_plugin_open_v1(const bpl_host_api* host, const bpl_plugin_api** out) {
  using namespace backplane::mpi_plugin;
  return backplane::plugin::open_plugin<Traits>(host, &kApi, out);
}
