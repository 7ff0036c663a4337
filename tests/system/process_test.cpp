// Real processes: the launcher, the C embedder, failures a user sees from the command line, training
// runs (faults in the middle of collectives: fault_test.cpp). The binary doubles as the rank program
// (--worker=SCENARIO).
#include <gtest/gtest.h>
#include <sched.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backplane/backplane.h"
#include "support/process.h"

namespace {

using backplane::test::ProcessResult;
using backplane::test::run_process;

std::string self_path;
const std::string kBin = BPL_BIN_DIR;
const std::string bpl_run = kBin + "/bpl-run";
const std::string embed = kBin + "/embed";

std::string describe(const ProcessResult& r) {
  return "exit " + std::to_string(r.exit_code) + ", signal " + std::to_string(r.signal) +
         (r.timed_out ? ", TIMED OUT" : "") + ", output:\n" + r.output;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/* ---- worker scenarios, run as ranks ---- */

int fail(const char* what, bpl_status status) {
  std::printf("worker: %s failed: %s: %s\n", what, bpl_status_name(status), bpl_last_error());
  return 2;
}

// Rank 1 exits with code 7 at once; the others wait in a barrier.
int rank_one_exits() {
  bpl_runtime* runtime = nullptr;
  if (bpl_status s = bpl_init(nullptr, &runtime)) return fail("bpl_init", s);
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_runtime_describe(runtime, &info);
  if (info.rank == 1) std::_Exit(7);
  bpl_comm* world = nullptr;
  bpl_comm_world(runtime, &world);
  bpl_barrier(world, nullptr);
  return 0;
}

// Prints "ready" and sleeps: for signal forwarding.
int sleeper() {
  std::printf("ready %s\n", std::getenv("RANK") ? std::getenv("RANK") : "?");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

// Prints the launch variables it was given.
int print_env() {
  const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR"};
  std::string line = "env";
  for (const char* name : names) line += std::string(" ") + name + "=" + (std::getenv(name) ? std::getenv(name) : "");
  std::printf("%s\n", line.c_str());
  return 0;
}

// The CPUs this process may run on.
std::set<int> own_cpus() {
  cpu_set_t set;
  std::set<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.insert(cpu);
  }
  return cpus;
}

// Prints the CPUs it may run on.
int print_cpus() {
  std::string line = std::string("cpus LOCAL_RANK=") + (std::getenv("LOCAL_RANK") ? std::getenv("LOCAL_RANK") : "") + ":";
  for (int cpu : own_cpus()) line += " " + std::to_string(cpu);
  std::printf("%s\n", line.c_str());
  return 0;
}

// The CPUs each rank printed (print_cpus), by local rank.
std::map<int, std::set<int>> cpus_of_ranks(const std::string& output) {
  std::map<int, std::set<int>> cpus;
  for (const std::string& line : backplane::test::rank_output_lines(output)) {
    int rank = 0;
    int consumed = 0;
    if (std::sscanf(line.c_str(), "cpus LOCAL_RANK=%d:%n", &rank, &consumed) != 1) continue;
    std::istringstream listed(line.substr(static_cast<size_t>(consumed)));
    for (int cpu = 0; listed >> cpu;) cpus[rank].insert(cpu);
  }
  return cpus;
}

/* ---- the launcher ---- */

TEST(BplRun, SetsTorchrunVariablesForEveryRank) {
  ProcessResult r = run_process({bpl_run, "--nproc_per_node", "2", "--nnodes", "2", "--node-rank", "1",
                                 "--master-port", "29999", self_path, "--worker=print_env"},
                                {});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.output.find("env RANK=2 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 MASTER_ADDR=127.0.0.1"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("env RANK=3 WORLD_SIZE=4 LOCAL_RANK=1"), std::string::npos) << r.output;
}

// --bind-to core: each rank on its own CPUs, together the launcher's; unbound, each on all of them.
TEST(BplRun, BindsEachRankToItsOwnCpusWhenAsked) {
  const std::set<int> all = own_cpus();
  if (all.size() < 2) GTEST_SKIP() << "needs 2 CPUs to bind 2 ranks apart; this process may use " << all.size();
  ProcessResult bound = run_process({bpl_run, "--nproc-per-node", "2", "--bind-to", "core", self_path, "--worker=print_cpus"}, {});
  ASSERT_EQ(bound.exit_code, 0) << describe(bound);
  std::map<int, std::set<int>> cpus = cpus_of_ranks(bound.output);
  ASSERT_EQ(cpus.size(), 2u) << bound.output;
  EXPECT_FALSE(cpus[0].empty()) << bound.output;
  EXPECT_FALSE(cpus[1].empty()) << bound.output;
  std::set<int> both = cpus[0];
  for (int cpu : cpus[1]) EXPECT_TRUE(both.insert(cpu).second) << "CPU " << cpu << " is in both ranks' shares: " << bound.output;
  EXPECT_EQ(both, all) << bound.output;

  ProcessResult unbound = run_process({bpl_run, "--nproc-per-node", "2", self_path, "--worker=print_cpus"}, {});
  ASSERT_EQ(unbound.exit_code, 0) << describe(unbound);
  cpus = cpus_of_ranks(unbound.output);
  ASSERT_EQ(cpus.size(), 2u) << unbound.output;
  EXPECT_EQ(cpus[0], all) << unbound.output;
  EXPECT_EQ(cpus[1], all) << unbound.output;

  const std::string too_many = std::to_string(all.size() + 1);
  ProcessResult refused = run_process({bpl_run, "--nproc-per-node", too_many, "--bind-to", "core", "true"}, {});
  EXPECT_EQ(refused.exit_code, 2) << describe(refused);
  EXPECT_NE(refused.output.find("--nproc-per-node " + too_many + ": only " + std::to_string(all.size()) + " CPU(s)"),
            std::string::npos) << refused.output;
}

TEST(BplRun, RejectsBadFlagsWithTheValue) {
  ProcessResult r = run_process({bpl_run, "--nproc-per-node", "0", "true"}, {});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.output.find("--nproc-per-node 0"), std::string::npos) << r.output;
}

TEST(BplRun, NamesTheRankThatExitedAndStopsTheOthers) {
  ProcessResult r = run_process({bpl_run, "--nproc-per-node", "3", self_path, "--worker=rank_one_exits"},
                                {{"BPL_TIMEOUT_MS", "30000"}}, std::chrono::seconds(25));
  EXPECT_FALSE(r.timed_out) << describe(r);
  EXPECT_EQ(r.exit_code, 7) << describe(r);
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 7"), std::string::npos) << r.output;
  // The survivors were waiting in a barrier with a 30 s timeout: bpl-run stopped them, not the timeout.
  EXPECT_LT(r.seconds, 20.0);
}

TEST(BplRun, ForwardsSignalsToEveryRank) {
  auto process = backplane::test::start_process({bpl_run, "--nproc-per-node", "2", self_path, "--worker=sleeper"}, {});
  // Wait for both ranks to report, then signal the launcher alone.
  std::string output;
  char buffer[256];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (count_of(output, "ready") < 2 && std::chrono::steady_clock::now() < deadline) {
    ssize_t n = read(process.output_fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  ASSERT_EQ(count_of(output, "ready"), 2u) << output;
  kill(process.pid, SIGTERM);
  ProcessResult r = backplane::test::finish_process(process, std::chrono::seconds(15));
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << describe(r);
  EXPECT_LT(r.seconds, 10.0) << "ranks were not stopped by the forwarded signal";
}

TEST(BplInfo, ListsPluginsSelectionAndCapabilities) {
  ProcessResult r = run_process({kBin + "/bpl-info", "--init"}, {{"NXD_CPU_MODE", "1"}, {"BPL_BACKEND", ""}});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.output.find("libbackplane-gloo.so"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("because      NXD_CPU_MODE=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kernels      gemm add scale axpby cast"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("programs     torchscript"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dtypes       f32 f64 f16 bf16 i8 u8 i32 i64"), std::string::npos) << r.output;
  // Every kind of the ABI's list, the newest included.
  EXPECT_NE(r.output.find("gather scatter allgatherv alltoallv recv_any"), std::string::npos) << r.output;
}

TEST(BplInfo, HelpVersionAndUnknownArgumentsAsOtherTools) {
  // --help on stdout, exit 0; --version; an unknown argument refused with exit 2, naming it.
  ProcessResult help = run_process({"sh", "-c", kBin + "/bpl-info --help 2>/dev/null"}, {});
  EXPECT_EQ(help.exit_code, 0) << describe(help);
  EXPECT_NE(help.output.find("usage: bpl-info"), std::string::npos) << help.output;
  ProcessResult version = run_process({kBin + "/bpl-info", "--version"}, {});
  EXPECT_EQ(version.exit_code, 0) << describe(version);
  EXPECT_NE(version.output.find("bpl-info (backplane) " + std::to_string(BPL_ABI_MAJOR) + "."), std::string::npos)
      << version.output;
  ProcessResult unknown = run_process({kBin + "/bpl-info", "--frobnicate"}, {});
  EXPECT_EQ(unknown.exit_code, 2) << describe(unknown);
  EXPECT_NE(unknown.output.find("'--frobnicate'"), std::string::npos) << unknown.output;
}

/* ---- the C embedder and its failures ---- */

TEST(Embed, CpuModeTwoRanksAndGlooThreeRanksPrintCorrectResults) {
  ProcessResult two = run_process({bpl_run, "--nproc-per-node", "2", embed}, {{"NXD_CPU_MODE", "1"}});
  ASSERT_EQ(two.exit_code, 0) << describe(two);
  EXPECT_NE(two.output.find("(NXD_CPU_MODE=1)"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("rank 1: world sum = [3 6 9 12]; odd group rank 0/1"), std::string::npos) << two.output;
  EXPECT_EQ(count_of(two.output, "  ok"), 2u) << two.output;

  ProcessResult three = run_process({bpl_run, "--nproc-per-node", "3", embed}, {{"BPL_BACKEND", "gloo"}});
  ASSERT_EQ(three.exit_code, 0) << describe(three);
  EXPECT_NE(three.output.find("rank 2: world sum = [6 12 18 24]; even group rank 1/2, sum of group ranks = 2"),
            std::string::npos) << three.output;
  EXPECT_EQ(count_of(three.output, "  ok"), 3u) << three.output;
}

// In a setuid process (secure execution: the real and effective users differ) the variables that name
// code to load are ignored: BPL_BACKEND set to a plugin file of the caller's choosing has no effect.
TEST(Embed, SetuidProcessIgnoresPathVariables) {
  if (getuid() != 0) GTEST_SKIP() << "needs root: the test makes a setuid-root copy of embed and runs it as nobody";
  char dir_template[] = "/tmp/bpl-setuid-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::filesystem::path dir = dir_template;
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                        std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                                        std::filesystem::perms::others_exec);
  const std::string copy = (dir / "embed").string();
  const std::string planted = (dir / "libplanted.so").string();  // a plugin the core must refuse to load
  std::filesystem::copy_file(embed, copy);
  std::filesystem::copy_file(std::string(BPL_TEST_PLUGIN_DIR) + "/libbpl-test-wrong-abi.so", planted);
  ASSERT_EQ(chmod(copy.c_str(), 04755), 0);
  const std::map<std::string, std::string> env = {{"BPL_BACKEND", planted}, {"NXD_CPU_MODE", "1"}};

  // Honoured normally: the planted file is loaded (and refused for its ABI).
  ProcessResult normal = run_process({copy}, env);
  EXPECT_NE(normal.exit_code, 0) << describe(normal);
  EXPECT_NE(normal.output.find(planted), std::string::npos) << normal.output;

  // Ignored in secure execution: the selection falls to NXD_CPU_MODE=1, and the job runs on gloo.
  ProcessResult secure = run_process({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", copy}, env);
  std::filesystem::remove_all(dir);
  if (secure.output.find("Permission denied") != std::string::npos) {
    GTEST_SKIP() << "nobody cannot reach the build tree here: " << secure.output;
  }
  EXPECT_EQ(secure.exit_code, 0) << describe(secure);
  EXPECT_EQ(secure.output.find(planted), std::string::npos) << secure.output;
  EXPECT_NE(secure.output.find("backend gloo"), std::string::npos) << secure.output;
}

TEST(Embed, BadBackendsEndWithAClearMessageAndNonZeroExit) {
  struct Case {
    std::string backend;
    std::vector<std::string> fragments;
  };
  const std::string wrong_abi = std::string(BPL_TEST_PLUGIN_DIR) + "/libbpl-test-wrong-abi.so";
  const Case cases[] = {
      {"nosuch", {"BPL_ERR_NOT_FOUND", "unknown backend 'nosuch'", "known backends: gloo, mpi, neuron"}},
      {wrong_abi, {"BPL_ERR_ABI_MISMATCH", wrong_abi, "implements ABI 2.3", "this libbackplane is ABI 1."}},
      {"/nonexistent/libbackplane-gloo.so", {"BPL_ERR_NOT_FOUND", "/nonexistent/libbackplane-gloo.so", "does not exist"}},
  };
  for (const Case& c : cases) {
    ProcessResult r = run_process({embed}, {{"BPL_BACKEND", c.backend}}, std::chrono::seconds(20));
    EXPECT_FALSE(r.timed_out) << c.backend;
    EXPECT_EQ(r.exit_code, 1) << describe(r);
    for (const std::string& fragment : c.fragments) {
      EXPECT_NE(r.output.find(fragment), std::string::npos) << "'" << fragment << "' missing from: " << r.output;
    }
  }
}

TEST(Embed, ARankThatNeverArrivesFailsTheRendezvousAtTheTimeout) {
  // Rank 0 of 2 alone: it hosts the store and waits for rank 1, which never comes.
  auto env = backplane::test::rank_env(0, 2, backplane::test::free_port());
  env["BPL_BACKEND"] = "gloo";
  env["BPL_TIMEOUT_MS"] = "2000";
  ProcessResult r = run_process({embed}, env, std::chrono::seconds(30));
  EXPECT_FALSE(r.timed_out) << describe(r);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.output.find("BPL_ERR_TIMEOUT"), std::string::npos) << r.output;
  EXPECT_GE(r.seconds, 1.9);
  EXPECT_LT(r.seconds, 12.0);
}

/* ---- training: dp_train resumed, and killed while saving ---- */

// The "step N loss … grad_norm …" lines of a dp_train run.
std::vector<std::string> step_lines(const std::string& output) {
  std::vector<std::string> lines;
  for (const std::string& line : backplane::test::rank_output_lines(output)) {
    if (line.rfind("step ", 0) == 0) lines.push_back(line);
  }
  return lines;
}

std::string fresh_dir(const std::string& name) {
  std::string dir = "/tmp/bpl-process-test-" + name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// A run resumed from a checkpoint prints exactly the losses of the run that never stopped.
void expect_resumed_run_repeats_losses(const std::string& program,
                                       const std::function<std::vector<std::string>(std::vector<std::string>)>& launch,
                                       const std::map<std::string, std::string>& env, const std::vector<std::string>& flags) {
  const std::string dir = fresh_dir(program);
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {kBin + "/" + program};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    ProcessResult r = run_process(launch(argv), env, std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    return r;
  };
  ProcessResult straight = run({"--steps", "30"});
  ProcessResult first = run({"--steps", "20", "--save-every", "10", "--checkpoint-dir", dir});
  ProcessResult resumed = run({"--steps", "30", "--checkpoint-dir", dir, "--resume"});
  EXPECT_NE(resumed.output.find("resumed from step 20"), std::string::npos) << resumed.output;
  std::vector<std::string> expected = step_lines(straight.output);
  ASSERT_EQ(expected.size(), 30u) << straight.output;
  EXPECT_EQ(step_lines(first.output), std::vector<std::string>(expected.begin(), expected.begin() + 20));
  EXPECT_EQ(step_lines(resumed.output), std::vector<std::string>(expected.begin() + 20, expected.end()));
  std::filesystem::remove_all(dir);
}

std::vector<std::string> under_bpl_run(int ranks, std::vector<std::string> program) {
  std::vector<std::string> argv = {bpl_run, "--nproc-per-node", std::to_string(ranks)};
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

TEST(DpTrain, TensorTimesDataParallelWithZero1OnFourRanks) {
  expect_resumed_run_repeats_losses("dp_train", [](std::vector<std::string> p) { return under_bpl_run(4, p); },
                                    {{"NXD_CPU_MODE", "1"}}, {"--tp", "2", "--zero1"});
}

// The GPT example at TP 2 x PP 2 x DP 2 (8 ranks) trains as the unsharded model does, step by step.
TEST(GptTrain, TensorPipelineAndDataParallelLossesMatchTheUnshardedModel) {
  ProcessResult r = run_process(under_bpl_run(8, {kBin + "/gpt_train", "--tp", "2", "--pp", "2", "--steps", "5",
                                                  "--microbatches", "2", "--recompute", "--check"}),
                                {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(180));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.output.find("tp 2 x pp 2 x dp 2, 2 microbatches, blocks recomputed"), std::string::npos) << r.output;
  EXPECT_EQ(step_lines(r.output).size(), 5u) << r.output;
  EXPECT_NE(r.output.find("check: every step's loss matches the unsharded model's"), std::string::npos) << r.output;
}

// Resumed from a checkpoint (each stage's files), the pipeline repeats the losses of the run that never
// stopped.
TEST(GptTrain, AResumedPipelineRepeatsTheLosses) {
  expect_resumed_run_repeats_losses("gpt_train", [](std::vector<std::string> p) { return under_bpl_run(4, p); },
                                    {{"NXD_CPU_MODE", "1"}}, {"--tp", "2", "--pp", "2", "--zero1"});
}

// 6. A checkpoint damaged after it was written (four bytes of its model shard flipped, the size
//    unchanged) is passed over on resume, said so on every rank: the run resumes from the newest
//    intact one, where before it went on from the damaged weights.
TEST(DpTrain, ResumingPassesOverACorruptedNewestCheckpoint) {
  const std::string dir = fresh_dir("corrupted");
  ProcessResult first = run_process(
      under_bpl_run(2, {kBin + "/dp_train", "--steps", "20", "--save-every", "10", "--checkpoint-dir", dir}),
      {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(120));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const std::string shard = dir + "/step_00020/model/dp_rank_00_tp_rank_00_pp_rank_00.pt";
  {
    std::fstream bytes(shard, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(bytes.good()) << shard;
    const auto middle = static_cast<std::streamoff>(std::filesystem::file_size(shard) / 2);
    char four[4];
    bytes.seekg(middle);
    bytes.read(four, 4);
    for (char& c : four) c = static_cast<char>(~c);
    bytes.seekp(middle);
    bytes.write(four, 4);
  }
  ProcessResult resumed = run_process(
      under_bpl_run(2, {kBin + "/dp_train", "--steps", "25", "--checkpoint-dir", dir, "--resume"}),
      {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(120));
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_NE(resumed.output.find("resumed from step 10 "), std::string::npos) << resumed.output;
  for (int rank : {0, 1}) {
    EXPECT_NE(resumed.output.find("rank " + std::to_string(rank) + ": checkpoint " + dir +
                                  "/step_00020 cannot be loaded by every rank (here: checkpoint file " + shard +
                                  " is corrupt"),
              std::string::npos)
        << resumed.output;
  }
  std::filesystem::remove_all(dir);
}

// 6. A checkpoint one of whose files was deleted (a tensor-parallel shard, with its checksum file) is
//    passed over on resume, naming the missing file, on every rank: its layout is the one it recorded,
//    not the one the remaining files suggest (with one TP file left it was read as TP 1 and resharded,
//    and the run went on from other weights).
TEST(DpTrain, ResumingPassesOverACheckpointMissingAFileNamingIt) {
  const std::string dir = fresh_dir("missing");
  const std::vector<std::string> layout = {"--tp", "2"};
  std::vector<std::string> train = {kBin + "/dp_train", "--steps", "20", "--save-every", "10", "--checkpoint-dir", dir};
  train.insert(train.end(), layout.begin(), layout.end());
  ProcessResult first = run_process(under_bpl_run(4, train), {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(180));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const std::string shard = dir + "/step_00020/model/dp_rank_00_tp_rank_01_pp_rank_00.pt";
  ASSERT_TRUE(std::filesystem::remove(shard)) << shard;
  std::filesystem::remove(shard + ".crc32");
  std::vector<std::string> resume = {kBin + "/dp_train", "--steps", "25", "--checkpoint-dir", dir, "--resume"};
  resume.insert(resume.end(), layout.begin(), layout.end());
  ProcessResult resumed = run_process(under_bpl_run(4, resume), {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(180));
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_NE(resumed.output.find("resumed from step 10 "), std::string::npos) << resumed.output;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(resumed.output.find("rank " + std::to_string(rank) + ": checkpoint " + dir +
                                  "/step_00020 cannot be loaded by every rank (here: checkpoint " + dir +
                                  "/step_00020 is missing " + shard),
              std::string::npos)
        << resumed.output;
  }
  std::filesystem::remove_all(dir);
}

// The pid of the process whose command line contains `marker` and whose environment has RANK=`rank`.
pid_t find_rank(const std::string& marker, int rank) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmdline(entry.path() / "cmdline"), environ(entry.path() / "environ");
    std::string command((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    std::string variables((std::istreambuf_iterator<char>(environ)), std::istreambuf_iterator<char>());
    if (command.find(marker) != std::string::npos && command.find("dp_train") != std::string::npos &&
        command.rfind("python", 0) == std::string::npos &&
        variables.find(std::string("\0RANK=", 6) + std::to_string(rank) + std::string("\0", 1)) != std::string::npos) {
      return static_cast<pid_t>(std::stoi(name));
    }
  }
  return -1;
}

TEST(DpTrain, ARankKilledWhileSavingLeavesTheNewestCompleteCheckpointLoadable) {
  const std::string dir = fresh_dir("killed-save");
  // A checkpoint every step, written in the background: a kill lands in the middle of one.
  backplane::test::Process job = backplane::test::start_process(
      under_bpl_run(2, {kBin + "/dp_train", "--steps", "100000", "--save-every", "1", "--async-save", "--keep", "3",
                        "--checkpoint-dir", dir}),
      {{"NXD_CPU_MODE", "1"}, {"BPL_TIMEOUT_MS", "5000"}});
  std::string output;
  ASSERT_TRUE(backplane::test::wait_for_output(job, output, "step 30 ", std::chrono::seconds(60))) << output;
  const pid_t victim = find_rank(dir, 1);
  ASSERT_GT(victim, 0) << "rank 1 of the job not found";
  kill(victim, SIGKILL);
  ProcessResult killed = backplane::test::finish_process(job, std::chrono::seconds(60));
  killed.output = output + killed.output;
  EXPECT_FALSE(killed.timed_out) << describe(killed);
  EXPECT_NE(killed.exit_code, 0) << describe(killed);
  EXPECT_NE(killed.output.find("rank 1 (pid " + std::to_string(victim) + ") was killed by SIGKILL"), std::string::npos)
      << killed.output;

  // Every tag marked complete has all its files; the newest one resumes.
  int newest = -1;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!std::filesystem::exists(entry.path() / "done")) continue;
    for (const char* file : {"checkpoint", "user_content.pt", "model/dp_rank_00_tp_rank_00_pp_rank_00.pt",
                             "optim/dp_rank_00_tp_rank_00_pp_rank_00.pt"}) {
      EXPECT_TRUE(std::filesystem::exists(entry.path() / file)) << entry.path() << " is marked done without " << file;
    }
    newest = std::max(newest, std::stoi(entry.path().filename().string().substr(5)));
  }
  ASSERT_GE(newest, 1) << "no complete checkpoint survived";
  ProcessResult resumed = run_process(
      under_bpl_run(2, {kBin + "/dp_train", "--steps", std::to_string(newest + 2), "--checkpoint-dir", dir, "--resume"}),
      {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(60));
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_NE(resumed.output.find("resumed from step " + std::to_string(newest)), std::string::npos) << resumed.output;
  std::printf("killed rank 1 after step 30; newest complete checkpoint: step %d\n", newest);
  std::filesystem::remove_all(dir);
}

/* ---- the MPI backend under a real mpirun ---- */

using backplane::test::kNoMpi;
using backplane::test::mpi_backend_built;
using backplane::test::mpi_env;
using backplane::test::mpirun;

// The "rank N: …" lines, sorted: ranks print in order, but mpirun may forward them in any order.
std::vector<std::string> rank_lines(const std::string& output) {
  std::vector<std::string> lines;
  for (const std::string& line : backplane::test::rank_output_lines(output)) {
    if (line.rfind("rank ", 0) == 0) lines.push_back(line);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

TEST(Mpi, EmbedUnderMpirunPrintsWhatItPrintsOnGloo) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  ProcessResult mpi = run_process(mpirun(3, {embed}), mpi_env({{"BPL_BACKEND", "mpi"}}));
  ASSERT_EQ(mpi.exit_code, 0) << describe(mpi);
  EXPECT_NE(mpi.output.find("backend mpi"), std::string::npos) << mpi.output;
  ProcessResult gloo = run_process({bpl_run, "--nproc-per-node", "3", embed}, {{"BPL_BACKEND", "gloo"}});
  ASSERT_EQ(gloo.exit_code, 0) << describe(gloo);
  EXPECT_EQ(rank_lines(mpi.output).size(), 3u) << mpi.output;
  EXPECT_EQ(rank_lines(mpi.output), rank_lines(gloo.output));
}

// The value of the first "Output sum is X" line, or NaN.
double output_sum(const std::string& output) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex("Output sum is ([-0-9.e+]+)"))) return std::nan("");
  return std::stod(match[1]);
}

TEST(TpMlp, CpuModeAndMpiPrintTheSumOfTheUnshardedMlp) {
  const std::string tp_mlp = kBin + "/tp_mlp";
  ProcessResult gloo = run_process({bpl_run, "--nproc-per-node", "2", tp_mlp, "--check"}, {{"NXD_CPU_MODE", "1"}});
  ASSERT_EQ(gloo.exit_code, 0) << describe(gloo);
  ProcessResult mpi = run_process(mpirun(2, {tp_mlp, "--check"}), mpi_env({}));
  ASSERT_EQ(mpi.exit_code, 0) << describe(mpi);
  for (const ProcessResult* r : {&gloo, &mpi}) {
    EXPECT_EQ(count_of(r->output, "Output sum is "), 1u) << "printed on rank 0 only:\n" << r->output;
    EXPECT_NE(r->output.find("(tp 2, max |difference| "), std::string::npos) << r->output;
    EXPECT_NE(r->output.find("): match"), std::string::npos) << r->output;
  }
  EXPECT_NEAR(output_sum(gloo.output), output_sum(mpi.output), 1e-4) << gloo.output << mpi.output;
}

TEST(DpTrain, ResumingFromACheckpointRepeatsTheLossesOnGlooAndMpi) {
  expect_resumed_run_repeats_losses("dp_train", [](std::vector<std::string> p) { return under_bpl_run(2, p); },
                                    {{"NXD_CPU_MODE", "1"}}, {});
  expect_resumed_run_repeats_losses("dp_train", [](std::vector<std::string> p) { return mpirun(2, p); }, mpi_env({}), {});
}

TEST(Mpi, AutoSelectedUnderMpirunAndDescribedByBplInfo) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  ProcessResult r = run_process(mpirun(2, {kBin + "/bpl-info", "--init"}), mpi_env({}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.output.find("auto: no Neuron device, launched by an MPI launcher"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("backend      mpi"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("library=Open MPI v"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("thread_level=MPI_THREAD_"), std::string::npos) << r.output;
}

TEST(Mpi, RefusesSeveralRanksWithoutAnMpiLauncher) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  ProcessResult r = run_process({bpl_run, "--nproc-per-node", "2", embed}, {{"BPL_BACKEND", "mpi"}});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.output.find("BPL_ERR_UNAVAILABLE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("run `mpirun -np 2 <program>`"), std::string::npos) << r.output;
}


#ifdef BPL_NRT_TEST_DOUBLE_DIR
// The examples, unchanged, with BPL_BACKEND=neuron over the test double of libnrt: the frontend's host
// tensors go through the plugin's staging and the double's collectives over sockets. This proves the
// plugin's and the frontend's logic on the runtime's API, not the hardware.
const std::map<std::string, std::string> kNeuronDouble = {
    {"BPL_BACKEND", "neuron"}, {"NEURON_RT_LIB", BPL_NRT_TEST_DOUBLE_DIR "/complete"}, {"NRT_TEST_DOUBLE_CORES", "4"}};

TEST(Neuron, TpMlpAndDpTrainOnTheTestDoubleMatchCpuMode) {
  const std::string tp_mlp = kBin + "/tp_mlp";
  ProcessResult neuron = run_process({bpl_run, "--nproc-per-node", "2", tp_mlp, "--check"}, kNeuronDouble);
  ASSERT_EQ(neuron.exit_code, 0) << describe(neuron);
  EXPECT_NE(neuron.output.find("): match"), std::string::npos) << neuron.output;
  ProcessResult gloo = run_process({bpl_run, "--nproc-per-node", "2", tp_mlp, "--check"}, {{"NXD_CPU_MODE", "1"}});
  EXPECT_NEAR(output_sum(neuron.output), output_sum(gloo.output), 1e-4) << neuron.output << gloo.output;

  const std::vector<std::string> train = {kBin + "/dp_train", "--steps", "8", "--tp", "2", "--zero1"};
  ProcessResult trained = run_process(under_bpl_run(4, train), kNeuronDouble, std::chrono::seconds(120));
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  EXPECT_NE(trained.output.find("backend neuron, 4 rank(s)"), std::string::npos) << trained.output;
  ProcessResult reference = run_process(under_bpl_run(4, train), {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(120));
  // Same losses; the gradient norm crosses ranks in f32 there (the runtime has no f64), in f64 on Gloo.
  const std::vector<std::string> got = step_lines(trained.output), want = step_lines(reference.output);
  ASSERT_EQ(got.size(), 8u) << trained.output;
  ASSERT_EQ(want.size(), 8u) << reference.output;
  for (size_t i = 0; i < got.size(); ++i) {
    const size_t norm = got[i].find(" grad_norm ");
    EXPECT_EQ(got[i].substr(0, norm), want[i].substr(0, want[i].find(" grad_norm ")));
    EXPECT_NEAR(std::stod(got[i].substr(norm + 11)), std::stod(want[i].substr(norm + 11)), 1e-5) << got[i];
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  char resolved[4096] = {};
  self_path = realpath("/proc/self/exe", resolved) ? resolved : argv[0];
  if (argc > 1 && std::strncmp(argv[1], "--worker=", 9) == 0) {
    const std::string scenario = argv[1] + 9;
    if (scenario == "rank_one_exits") return rank_one_exits();
    if (scenario == "sleeper") return sleeper();
    if (scenario == "print_env") return print_env();
    if (scenario == "print_cpus") return print_cpus();
    std::fprintf(stderr, "unknown worker scenario %s\n", scenario.c_str());
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
