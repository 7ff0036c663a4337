// Reading and parsing the environment contract (docs/environment.md).
//
// Everything here reads variables through an EnvLookup so that tests can give any environment
// without touching the process's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "env_lookup.h"

namespace backplane {

// Parses a whole base-10 integer ("42", "-1"); nullopt for anything else ("", "4x", " 4", overflow).
std::optional<int64_t> parse_integer(const std::string& text);

// The integer value of variable `name`, or nullopt when unset. Throws Error(INVALID_ARGUMENT) naming
// the variable, its value and the accepted range when it is not an integer in [min, max].
std::optional<int64_t> env_integer(const EnvLookup& env, const std::string& name, int64_t min, int64_t max);

// Splits "a:b::c" into {"a","b","c"} (empty items dropped).
std::vector<std::string> split_path_list(const std::string& text);

constexpr int64_t kDefaultTimeoutMs = 300000;
// The longest timeout any wait honours: 2^40 ms, about 35 years, which every backend's deadline
// arithmetic holds. A longer one given through the API (INT64_MAX for "no bound") means this one;
// BPL_TIMEOUT_MS refuses it, naming the range.
constexpr int64_t kLongestTimeoutMs = int64_t{1} << 40;

// Where this process sits in the job, from explicit options and the launch environment, highest first:
// options > torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) > Open MPI (OMPI_COMM_WORLD_*) >
// Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_TASKS_PER_NODE) > rank 0 of 1.
struct LaunchInfo {
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t local_rank = 0;
  int32_t local_world_size = 1;
  std::string master_addr;  // options > MASTER_ADDR; "" if unknown
  int32_t master_port = -1; // options > MASTER_PORT; -1 if unknown
  int64_t timeout_ms = kDefaultTimeoutMs; // options > BPL_TIMEOUT_MS > default
  std::string launcher = "none"; // "options", "torchrun", "openmpi", "mpich", "slurm", "none", "native communicator"
};

// Throws Error(INVALID_ARGUMENT) naming the variable or option when a value is malformed, out of
// range, or inconsistent (a rank without a world size, rank >= world size). Given options.native_comm,
// the placement is left to the communicator (bpl_init reads it from the world it makes).
LaunchInfo resolve_launch(const bpl_init_options& options, const EnvLookup& env);

// BPL_DEBUG: "detail" (any case) turns on the cross-rank check of every collective (fingerprint.h);
// unset or "off" leaves it off. Throws Error(INVALID_ARGUMENT) naming any other value.
bool debug_detail(const EnvLookup& env);

// BPL_LOG_LEVEL's value: "error", "warn", "info", "debug" or 0-3; nothing for any other.
std::optional<int32_t> parse_log_level(const std::string& text);
// BPL_LOG_LEVEL, warn when unset. Throws Error(INVALID_ARGUMENT) naming any other value.
int32_t log_level_setting(const EnvLookup& env);

// True when the environment shows an MPI launcher (mpirun/mpiexec of Open MPI, or a PMI/PMIx one).
bool launched_by_mpi(const EnvLookup& env);
// The MPI ABI of the launcher that started this process: "openmpi5" (Open MPI 5's mpirun), "openmpi"
// (Open MPI 4's), "mpich" (MPICH's or Intel MPI's mpiexec: MPICH's ABI), "" (none known).
std::string mpi_launcher_abi(const EnvLookup& env);

}  // namespace backplane
