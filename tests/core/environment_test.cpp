// The environment contract (docs/environment.md), tested on given environments (no process variables).
#include <gtest/gtest.h>

#include <algorithm>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "backplane/plugin.h"
#include "environment.h"
#include "error.h"
#include "selection.h"
#include "trace.h"

namespace backplane {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

const bpl_init_options kNoOptions = BPL_INIT_OPTIONS_INIT;

// Runs `body`, expecting an Error with `status` whose message contains every fragment.
template <typename Body>
void expect_error(Body&& body, bpl_status status, std::initializer_list<const char*> fragments) {
  try {
    body();
    ADD_FAILURE() << "expected " << bpl_status_name(status);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    for (const char* fragment : fragments) EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(ParseInteger, AcceptsWholeIntegersOnly) {
  EXPECT_EQ(parse_integer("42"), 42);
  EXPECT_EQ(parse_integer("-1"), -1);
  EXPECT_EQ(parse_integer("+7"), 7);
  EXPECT_FALSE(parse_integer(""));
  EXPECT_FALSE(parse_integer("4x"));
  EXPECT_FALSE(parse_integer(" 4"));
  EXPECT_FALSE(parse_integer("1.5"));
  EXPECT_FALSE(parse_integer("99999999999999999999"));
}

TEST(Launch, SingleProcessWithoutLauncher) {
  LaunchInfo info = resolve_launch(kNoOptions, env_of({}));
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.launcher, "none");
  EXPECT_EQ(info.timeout_ms, kDefaultTimeoutMs);
  EXPECT_EQ(info.master_port, -1);
}

TEST(Launch, Torchrun) {
  LaunchInfo info = resolve_launch(kNoOptions, env_of({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                                       {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"},
                                                       {"MASTER_PORT", "29500"}, {"BPL_TIMEOUT_MS", "1500"}}));
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_addr, "node0");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_EQ(info.timeout_ms, 1500);
}

TEST(Launch, PrecedenceOptionsThenTorchrunThenOpenMpiThenMpichThenSlurm) {
  auto all = env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "2"},
                     {"OMPI_COMM_WORLD_SIZE", "4"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}});
  EXPECT_EQ(resolve_launch(kNoOptions, all).launcher, "torchrun");

  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.rank = 0;
  options.world_size = 3;
  LaunchInfo explicit_info = resolve_launch(options, all);
  EXPECT_EQ(explicit_info.launcher, "options");
  EXPECT_EQ(explicit_info.world_size, 3);

  LaunchInfo mpi = resolve_launch(kNoOptions, env_of({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                      {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}}));
  EXPECT_EQ(mpi.launcher, "openmpi");
  EXPECT_EQ(mpi.rank, 2);
  EXPECT_EQ(mpi.local_world_size, 2);

  // MPICH's and Intel MPI's mpiexec (Hydra): the PMI-1 variables and Hydra's local ones
  LaunchInfo mpich = resolve_launch(kNoOptions, env_of({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"},
                                                        {"MPI_LOCALNRANKS", "2"}, {"SLURM_PROCID", "5"},
                                                        {"SLURM_NTASKS", "6"}, {"SLURM_STEP_ID", "0"}}));
  EXPECT_EQ(mpich.launcher, "mpich");
  EXPECT_EQ(mpich.rank, 3);
  EXPECT_EQ(mpich.world_size, 4);
  EXPECT_EQ(mpich.local_rank, 1);
  EXPECT_EQ(mpich.local_world_size, 2);
  // srun's PMI-2 sets PMI_RANK and PMI_SIZE but not Hydra's local variables: Slurm's count
  LaunchInfo srun = resolve_launch(kNoOptions, env_of({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"SLURM_PROCID", "3"},
                                                       {"SLURM_NTASKS", "4"}, {"SLURM_STEP_ID", "0"},
                                                       {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}}));
  EXPECT_EQ(srun.launcher, "slurm");
  EXPECT_EQ(srun.local_rank, 1);

  LaunchInfo slurm = resolve_launch(kNoOptions, env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_STEP_ID", "0"},
                                                        {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "2(x3)"}}));
  EXPECT_EQ(slurm.launcher, "slurm");
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.world_size, 6);
  EXPECT_EQ(slurm.local_rank, 1);
  EXPECT_EQ(slurm.local_world_size, 2);
}

// sbatch's script is no task of a step: it has SLURM_PROCID=0 and SLURM_NTASKS of the allocation, but no
// SLURM_STEP_ID, and runs as one process. A step's own tasks per node count before the allocation's.
TEST(Launch, SlurmCountsOnlyInAStepAndTakesTheStepsTasksPerNode) {
  LaunchInfo batch = resolve_launch(kNoOptions, env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"},
                                                        {"SLURM_LOCALID", "0"}, {"SLURM_TASKS_PER_NODE", "4"}}));
  EXPECT_EQ(batch.launcher, "none");
  EXPECT_EQ(batch.world_size, 1);
  LaunchInfo step = resolve_launch(kNoOptions, env_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "3"},
                                                       {"SLURM_LOCALID", "1"}, {"SLURM_TASKS_PER_NODE", "4"},
                                                       {"SLURM_STEP_TASKS_PER_NODE", "2"}}));
  EXPECT_EQ(step.launcher, "slurm");
  EXPECT_EQ(step.world_size, 2);
  EXPECT_EQ(step.local_world_size, 2);
}

TEST(Launch, ExplicitAddressAndTimeoutBeatTheEnvironment) {
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.master_addr = "10.0.0.1";
  options.master_port = 1234;
  options.timeout_ms = 77;
  LaunchInfo info = resolve_launch(options, env_of({{"MASTER_ADDR", "a"}, {"MASTER_PORT", "5"}, {"BPL_TIMEOUT_MS", "9"}}));
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 1234);
  EXPECT_EQ(info.timeout_ms, 77);
}

TEST(Launch, BadValuesNameTheVariable) {
  expect_error([] { resolve_launch(kNoOptions, env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}})); },
               BPL_ERR_INVALID_ARGUMENT, {"RANK='x'"});
  expect_error([] { resolve_launch(kNoOptions, env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}})); },
               BPL_ERR_INVALID_ARGUMENT, {"rank 2", "world size 2"});
  expect_error([] { resolve_launch(kNoOptions, env_of({{"RANK", "0"}})); }, BPL_ERR_INVALID_ARGUMENT,
               {"RANK is set but WORLD_SIZE is not"});
  expect_error([] { resolve_launch(kNoOptions, env_of({{"RANK", "0"}, {"WORLD_SIZE", "0"}})); },
               BPL_ERR_INVALID_ARGUMENT, {"WORLD_SIZE='0'"});
  expect_error([] { resolve_launch(kNoOptions, env_of({{"MASTER_PORT", "70000"}})); }, BPL_ERR_INVALID_ARGUMENT,
               {"MASTER_PORT='70000'", "65535"});
  expect_error([] { resolve_launch(kNoOptions, env_of({{"BPL_TIMEOUT_MS", "-5"}})); }, BPL_ERR_INVALID_ARGUMENT,
               {"BPL_TIMEOUT_MS='-5'"});
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.rank = 1;
  expect_error([&] { resolve_launch(options, env_of({})); }, BPL_ERR_INVALID_ARGUMENT, {"options.world_size"});
}

// 5. A timeout longer than any deadline can hold means the longest one; BPL_TIMEOUT_MS refuses it.
TEST(Launch, TimeoutsSaturateAtTheLongestAndTheVariableRefusesMore) {
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.timeout_ms = INT64_MAX;
  EXPECT_EQ(resolve_launch(options, env_of({})).timeout_ms, kLongestTimeoutMs);
  EXPECT_EQ(resolve_launch(kNoOptions, env_of({{"BPL_TIMEOUT_MS", std::to_string(kLongestTimeoutMs)}})).timeout_ms,
            kLongestTimeoutMs);
  expect_error([] { resolve_launch(kNoOptions, env_of({{"BPL_TIMEOUT_MS", "9223372036854775807"}})); },
               BPL_ERR_INVALID_ARGUMENT, {"BPL_TIMEOUT_MS='9223372036854775807'", "1099511627776"});
}

// 11. BPL_LOG_LEVEL: a name or 0-3; anything else is refused naming it (bpl_init calls this).
TEST(LogLevel, NamesNumbersAndRefusals) {
  EXPECT_EQ(log_level_setting(env_of({})), BPL_LOG_WARN);
  EXPECT_EQ(log_level_setting(env_of({{"BPL_LOG_LEVEL", "debug"}})), BPL_LOG_DEBUG);
  EXPECT_EQ(log_level_setting(env_of({{"BPL_LOG_LEVEL", "0"}})), BPL_LOG_ERROR);
  expect_error([] { log_level_setting(env_of({{"BPL_LOG_LEVEL", "loud"}})); }, BPL_ERR_INVALID_ARGUMENT,
               {"BPL_LOG_LEVEL='loud' is not valid"});
  expect_error([] { log_level_setting(env_of({{"BPL_LOG_LEVEL", "4"}})); }, BPL_ERR_INVALID_ARGUMENT, {"'4'"});
}

// 12. BPL_TRACE: off when unset; its folder made; BPL_TRACE_EVENTS a positive count, refused naming it.
TEST(TraceSetting, FolderAndRingSize) {
  EXPECT_EQ(Trace::from_environment(env_of({}), 0, 1, "gloo"), nullptr);
  char scratch[] = "/tmp/bpl-trace-test-XXXXXX";
  ASSERT_NE(mkdtemp(scratch), nullptr);
  const std::string nested = std::string(scratch) + "/a/b";
  EXPECT_NE(Trace::from_environment(env_of({{"BPL_TRACE", nested}}), 0, 1, "gloo"), nullptr);
  struct stat made {};
  EXPECT_EQ(stat(nested.c_str(), &made), 0) << "the folder and its parents are made";
  expect_error([&] { Trace::from_environment(env_of({{"BPL_TRACE", nested}, {"BPL_TRACE_EVENTS", "0"}}), 0, 1, "gloo"); },
               BPL_ERR_INVALID_ARGUMENT, {"BPL_TRACE_EVENTS='0'"});
  expect_error([] { Trace::from_environment(env_of({{"BPL_TRACE", "/proc/no/such/folder"}}), 0, 1, "gloo"); },
               BPL_ERR_INVALID_ARGUMENT, {"BPL_TRACE='/proc/no/such/folder': cannot create the folder"});
  std::system(("rm -rf " + std::string(scratch)).c_str());
}

TEST(Selection, PrecedenceOfBackendSources) {
  MachineProbe no_neuron{false};
  auto env = env_of({{"BPL_BACKEND", "mpi"}, {"NXD_CPU_MODE", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  Selection chosen = select_backend("neuron", env, no_neuron);
  ASSERT_EQ(chosen.candidates.size(), 1u);
  EXPECT_TRUE(chosen.explicit_choice);
  EXPECT_EQ(chosen.candidates[0].backend, "neuron");

  chosen = select_backend(nullptr, env, no_neuron);
  EXPECT_EQ(chosen.candidates[0].backend, "mpi");
  EXPECT_EQ(chosen.candidates[0].reason, "BPL_BACKEND=mpi");

  chosen = select_backend(nullptr, env_of({{"NXD_CPU_MODE", "1"}}), no_neuron);
  EXPECT_EQ(chosen.candidates[0].backend, "gloo");
  EXPECT_EQ(chosen.candidates[0].reason, "NXD_CPU_MODE=1");
  chosen = select_backend(nullptr, env_of({{"NXD_CPU_MODE", "0"}}), no_neuron);
  EXPECT_EQ(chosen.candidates[0].backend, "neuron");
  EXPECT_TRUE(chosen.explicit_choice);
}

TEST(Selection, AutoPrefersNeuronThenMpiThenGloo) {
  Selection chosen = select_backend(nullptr, env_of({{"OMPI_COMM_WORLD_SIZE", "2"}}), MachineProbe{true});
  EXPECT_FALSE(chosen.explicit_choice);
  ASSERT_EQ(chosen.candidates.size(), 3u);
  EXPECT_EQ(chosen.candidates[0].backend, "neuron");
  EXPECT_EQ(chosen.candidates[1].backend, "mpi");
  EXPECT_EQ(chosen.candidates[2].backend, "gloo");

  chosen = select_backend(nullptr, env_of({}), MachineProbe{false});
  ASSERT_EQ(chosen.candidates.size(), 1u);
  EXPECT_EQ(chosen.candidates[0].backend, "gloo");
  EXPECT_NE(chosen.candidates[0].reason.find("no Neuron device"), std::string::npos);
}

TEST(Selection, NonIntegerCpuModeIsAnError) {
  expect_error([] { select_backend(nullptr, env_of({{"NXD_CPU_MODE", "yes"}}), MachineProbe{}); },
               BPL_ERR_INVALID_ARGUMENT, {"NXD_CPU_MODE='yes'"});
  // A negative value is no setting (the reference's CPU mode is any value > 0): refused, not neuron.
  expect_error([] { select_backend(nullptr, env_of({{"NXD_CPU_MODE", "-3"}}), MachineProbe{}); },
               BPL_ERR_INVALID_ARGUMENT, {"NXD_CPU_MODE='-3' is negative", "0 for the accelerator, Neuron"});
}

class PluginLookup : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/bpl-lookup-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    first_ = std::string(pattern) + "/first";
    second_ = std::string(pattern) + "/second";
    ASSERT_EQ(::mkdir(first_.c_str(), 0700), 0);
    ASSERT_EQ(::mkdir(second_.c_str(), 0700), 0);
    root_ = pattern;
  }
  void TearDown() override { std::system(("rm -rf '" + root_ + "'").c_str()); }
  void touch(const std::string& path) { std::ofstream(path) << "x"; }
  std::string root_, first_, second_;
};

TEST_F(PluginLookup, SearchesFoldersInOrder) {
  touch(second_ + "/libbackplane-foo.so");
  EXPECT_EQ(find_plugin("foo", {first_, second_}), second_ + "/libbackplane-foo.so");
  touch(first_ + "/libbackplane-foo.so");
  EXPECT_EQ(find_plugin("foo", {first_, second_}), first_ + "/libbackplane-foo.so");
}

// Each MPI launcher's ABI, read from what it sets (as each sets it here: Open MPI 4.1's and 5's mpirun,
// MPICH's and Intel MPI's mpiexec).
TEST(Launch, TheLaunchersMpiAbi) {
  EXPECT_EQ(mpi_launcher_abi(env_of({{"OMPI_COMM_WORLD_SIZE", "2"}, {"PMIX_RANK", "0"}})), "openmpi");
  EXPECT_EQ(mpi_launcher_abi(env_of({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_VERSION", "5.0.11"}, {"PRTE_LAUNCHED", "1"}})),
            "openmpi5");
  EXPECT_EQ(mpi_launcher_abi(env_of({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"PMI_FD", "9"}, {"MPI_LOCALNRANKS", "2"}})),
            "mpich");
  EXPECT_EQ(mpi_launcher_abi(env_of({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALNRANKS", "2"},
                                     {"I_MPI_HYDRA_UUID", "e37a"}})),
            "mpich");
  // srun's PMI-2 sets PMI_RANK too, for whichever MPI the program is built with
  EXPECT_EQ(mpi_launcher_abi(env_of({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"SLURM_PROCID", "0"}})), "");
  EXPECT_EQ(mpi_launcher_abi(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}})), "");
}

// mpi: the plugin built for the launcher's MPI ABI, in any folder, before the system MPI's.
TEST_F(PluginLookup, MpiPrefersThePluginOfTheLaunchersAbi) {
  touch(first_ + "/libbackplane-mpi.so");
  EXPECT_EQ(find_plugin("mpi", {first_, second_}, "mpich"), first_ + "/libbackplane-mpi.so");
  touch(second_ + "/libbackplane-mpi-mpich.so");
  EXPECT_EQ(find_plugin("mpi", {first_, second_}, "mpich"), second_ + "/libbackplane-mpi-mpich.so");
  EXPECT_EQ(find_plugin("mpi", {first_, second_}, "openmpi"), first_ + "/libbackplane-mpi.so");
  EXPECT_EQ(find_plugin("mpi", {first_, second_}), first_ + "/libbackplane-mpi.so");
  expect_error([&] { find_plugin("mpi", {}, "openmpi5"); }, BPL_ERR_NOT_FOUND, {"plugin for backend 'mpi' not found"});
}

TEST_F(PluginLookup, PathPluginPathAndDirsFromEnvironment) {
  touch(first_ + "/libbackplane-x.so");
  EXPECT_EQ(find_plugin(first_ + "/libbackplane-x.so", {}), first_ + "/libbackplane-x.so");
  std::vector<std::string> dirs = plugin_search_dirs(env_of({{"BPL_PLUGIN_PATH", first_ + "::" + second_}}));
  ASSERT_GE(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], first_);
  EXPECT_EQ(dirs[1], second_);
}

// BPL_PLUGIN_PATH's folders, then the one beside the core, and nothing else. This test links the core's
// objects itself, so "beside the core" is its own tree's lib/ (build/bin/../lib/backplane/plugins).
TEST_F(PluginLookup, SearchesThePathThenTheCoresOwnFolderOnly) {
  std::vector<std::string> dirs = plugin_search_dirs(env_of({{"BPL_PLUGIN_PATH", first_}}));
  ASSERT_EQ(dirs.size(), 2u);
  EXPECT_EQ(dirs[0], first_);
  const std::string suffix = "/lib/backplane/plugins";
  EXPECT_EQ(dirs[1].substr(dirs[1].size() - std::min(dirs[1].size(), suffix.size())), suffix) << dirs[1];
  EXPECT_EQ(plugin_search_dirs(env_of({})).size(), 1u);
}

TEST_F(PluginLookup, FailuresNameValuePathsAndAlternatives) {
  expect_error([&] { find_plugin("nosuch", {first_, second_}); }, BPL_ERR_NOT_FOUND,
               {"unknown backend 'nosuch'", "libbackplane-nosuch.so", "known backends: gloo, mpi, neuron"});
  expect_error([&] { find_plugin("mpi", {first_}); }, BPL_ERR_NOT_FOUND,
               {"plugin for backend 'mpi' not found", first_.c_str()});
  expect_error([&] { find_plugin(first_ + "/missing.so", {}); }, BPL_ERR_NOT_FOUND, {"missing.so", "does not exist"});
  expect_error([&] { find_plugin("Bad Name", {}); }, BPL_ERR_INVALID_ARGUMENT, {"'Bad Name'"});
}

}  // namespace
}  // namespace backplane
