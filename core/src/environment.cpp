#include "environment.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "backplane/plugin.h"
#include "error.h"

namespace backplane {

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    // Variables that name files to load or write: never honoured in secure-execution mode.
    static const std::set<std::string> path_like = {"BPL_BACKEND",     "BPL_PLUGIN_PATH", "BPL_CACHE_DIR",
                                                    "BPL_TORCH_DIR",   "VIRTUAL_ENV",     "CONDA_PREFIX",
                                                    "NEURON_RT_LIB",   "NEURON_CC_FLAGS"};
    const char* value = path_like.count(name) ? secure_getenv(name.c_str()) : std::getenv(name.c_str());
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
  };
}

std::optional<int64_t> parse_integer(const std::string& text) {
  if (text.empty() || text.size() > 24) return std::nullopt;
  const char* begin = text.c_str();
  if (!(std::isdigit(static_cast<unsigned char>(begin[0])) || begin[0] == '-' || begin[0] == '+')) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(begin, &end, 10);
  if (errno != 0 || end != begin + text.size() || end == begin) return std::nullopt;
  return static_cast<int64_t>(value);
}

std::optional<int64_t> env_integer(const EnvLookup& env, const std::string& name, int64_t min, int64_t max) {
  std::optional<std::string> text = env(name);
  if (!text) return std::nullopt;
  std::optional<int64_t> value = parse_integer(*text);
  if (!value || *value < min || *value > max) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, name + "='" + *text + "' is not valid: expected an integer in [" +
                                              std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return value;
}

std::vector<std::string> split_path_list(const std::string& text) {
  std::vector<std::string> items;
  std::string::size_type start = 0;
  while (start <= text.size()) {
    std::string::size_type colon = text.find(':', start);
    if (colon == std::string::npos) colon = text.size();
    if (colon > start) items.push_back(text.substr(start, colon - start));
    start = colon + 1;
  }
  return items;
}

bool debug_detail(const EnvLookup& env) {
  std::optional<std::string> text = env("BPL_DEBUG");
  if (!text) return false;
  std::string value;
  for (char c : *text) value += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (value == "detail") return true;
  if (value == "off") return false;
  throw Error(BPL_ERR_INVALID_ARGUMENT, "BPL_DEBUG='" + *text + "' is not valid: expected 'detail' or 'off'");
}

std::optional<int32_t> parse_log_level(const std::string& text) {
  static const char* const names[] = {"error", "warn", "info", "debug"};
  for (int32_t level = 0; level < 4; ++level) {
    if (text == names[level]) return level;
  }
  std::optional<int64_t> number = parse_integer(text);
  if (number && *number >= 0 && *number <= 3) return static_cast<int32_t>(*number);
  return std::nullopt;
}

int32_t log_level_setting(const EnvLookup& env) {
  std::optional<std::string> text = env("BPL_LOG_LEVEL");
  if (!text) return BPL_LOG_WARN;
  if (std::optional<int32_t> level = parse_log_level(*text)) return *level;
  throw Error(BPL_ERR_INVALID_ARGUMENT,
              "BPL_LOG_LEVEL='" + *text + "' is not valid: expected error, warn, info, debug or 0-3");
}

bool launched_by_mpi(const EnvLookup& env) {
  return env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_RANK");
}

std::string mpi_launcher_abi(const EnvLookup& env) {
  // Open MPI 5's mpirun (PRRTE) says its version; Open MPI 4's does not, and sets the ORTE variables.
  if (std::optional<std::string> version = env("OMPI_VERSION")) {
    if (version->rfind("5.", 0) == 0) return "openmpi5";
  }
  if (env("OMPI_COMM_WORLD_SIZE")) return "openmpi";
  if (env("PMI_RANK") && env("MPI_LOCALNRANKS")) return "mpich";  // Hydra (not srun's PMI-2)
  return "";
}

namespace {

constexpr int64_t kMaxRanks = 1 << 24;

// The variable names one launcher uses for rank, world size, local rank and local world size, and the one
// that must be set too for them to count (nullptr: none).
struct LauncherVariables {
  const char* launcher;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
  const char* only_with;
};

// Slurm's count only in a task of an srun step (SLURM_STEP_ID): the batch script itself also has
// SLURM_PROCID=0 and SLURM_NTASKS=N, and is no rank of N.
constexpr LauncherVariables kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", nullptr},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
    // MPICH's and Intel MPI's mpiexec (Hydra, which alone sets MPI_LOCALNRANKS: srun's PMI-2 sets PMI_RANK
    // too, and its ranks' local ones are Slurm's)
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "MPI_LOCALNRANKS"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_STEP_ID"},
};

// The step's tasks per node (else the allocation's) look like "4" or "4(x2),3": the first count is this
// node's when nodes are filled evenly, the common case; anything else leaves the local size unknown.
std::optional<int64_t> slurm_tasks_per_node(const EnvLookup& env) {
  std::optional<std::string> text = env("SLURM_STEP_TASKS_PER_NODE");
  if (!text) text = env("SLURM_TASKS_PER_NODE");
  if (!text) return std::nullopt;
  if (text->find(',') != std::string::npos) return std::nullopt;  // nodes hold different counts
  return parse_integer(text->substr(0, text->find('(')));
}

}  // namespace

LaunchInfo resolve_launch(const bpl_init_options& options, const EnvLookup& env) {
  LaunchInfo info;
  const LauncherVariables* source = nullptr;

  if (options.native_comm != nullptr) {
    // The communicator says where this process sits; the core reads it once the world exists.
    if (options.rank >= 0 || options.world_size >= 0 || options.local_rank >= 0 || options.local_world_size >= 0) {
      throw Error(BPL_ERR_INVALID_ARGUMENT,
                  "options.native_comm is given, and with it rank and world size: expected options.rank, "
                  "world_size, local_rank and local_world_size -1 (got " + std::to_string(options.rank) + ", " +
                      std::to_string(options.world_size) + ", " + std::to_string(options.local_rank) + ", " +
                      std::to_string(options.local_world_size) + ")");
    }
    info.launcher = "native communicator";
  } else if (options.rank >= 0 || options.world_size >= 0) {
    if (options.rank < 0 || options.world_size <= 0) {
      throw Error(BPL_ERR_INVALID_ARGUMENT,
                  "options.rank = " + std::to_string(options.rank) + " and options.world_size = " +
                      std::to_string(options.world_size) + ": give both (rank >= 0, world_size >= 1) or neither");
    }
    info.rank = options.rank;
    info.world_size = options.world_size;
    info.local_rank = options.rank;
    info.local_world_size = options.world_size;
    info.launcher = "options";
  } else {
    for (const LauncherVariables& vars : kLaunchers) {
      if (vars.only_with != nullptr && !env(vars.only_with)) continue;
      bool has_rank = env(vars.rank).has_value();
      bool has_world = env(vars.world_size).has_value();
      if (!has_rank && !has_world) continue;
      if (!has_rank || !has_world) {
        throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(has_rank ? vars.rank : vars.world_size) + " is set but " +
                                                  (has_rank ? vars.world_size : vars.rank) +
                                                  " is not: a " + vars.launcher + " launch sets both");
      }
      info.world_size = static_cast<int32_t>(*env_integer(env, vars.world_size, 1, kMaxRanks));
      info.rank = static_cast<int32_t>(*env_integer(env, vars.rank, 0, kMaxRanks - 1));
      info.local_rank = info.rank;
      info.local_world_size = info.world_size;
      info.launcher = vars.launcher;
      source = &vars;
      break;
    }
  }
  if (info.rank >= info.world_size) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "rank " + std::to_string(info.rank) + " (from " + info.launcher +
                                              ") is not below the world size " + std::to_string(info.world_size));
  }

  // Local placement: explicit options, else the launcher's own variables, else "one node".
  if (source != nullptr) {
    if (auto local = env_integer(env, source->local_rank, 0, kMaxRanks - 1)) info.local_rank = static_cast<int32_t>(*local);
    std::optional<int64_t> local_size = source->local_world_size
                                            ? env_integer(env, source->local_world_size, 1, kMaxRanks)
                                            : slurm_tasks_per_node(env);
    if (local_size) info.local_world_size = static_cast<int32_t>(*local_size);
  }
  if (options.local_rank >= 0) info.local_rank = options.local_rank;
  if (options.local_world_size >= 0) info.local_world_size = options.local_world_size;
  if (info.local_world_size < 1 || info.local_rank < 0 || info.local_rank >= info.local_world_size) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "local rank " + std::to_string(info.local_rank) +
                                              " is not in [0, local world size " +
                                              std::to_string(info.local_world_size) + ")");
  }

  if (options.master_addr != nullptr && *options.master_addr != '\0') {
    info.master_addr = options.master_addr;
  } else if (auto addr = env("MASTER_ADDR")) {
    info.master_addr = *addr;
  }
  if (options.master_port >= 0) {
    if (options.master_port < 1 || options.master_port > 65535) {
      throw Error(BPL_ERR_INVALID_ARGUMENT,
                  "options.master_port = " + std::to_string(options.master_port) + ": expected 1..65535");
    }
    info.master_port = options.master_port;
  } else if (auto port = env_integer(env, "MASTER_PORT", 1, 65535)) {
    info.master_port = static_cast<int32_t>(*port);
  }

  if (options.timeout_ms > 0) {
    info.timeout_ms = std::min(options.timeout_ms, kLongestTimeoutMs);
  } else if (options.timeout_ms != -1) {
    throw Error(BPL_ERR_INVALID_ARGUMENT,
                "options.timeout_ms = " + std::to_string(options.timeout_ms) + ": expected > 0, or -1 for the default");
  } else if (auto timeout = env_integer(env, "BPL_TIMEOUT_MS", 1, kLongestTimeoutMs)) {
    info.timeout_ms = *timeout;
  }
  return info;
}

}  // namespace backplane
