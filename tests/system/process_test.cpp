// Real processes: the launcher, the C embedder, failures a user sees from the command line, training
// runs (faults in the middle of collectives: tests/system/fault/). The binary doubles as the rank program
// (--worker=SCENARIO).
#include "system/process_test_support.h"

namespace {

using namespace backplane::test::processes;

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
  EXPECT_NE(r.output.find("bpl-run: received SIGTERM; passed it on to the 2 running rank(s), stopping the job"),
            std::string::npos)
      << describe(r);
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
