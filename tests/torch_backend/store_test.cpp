// Ranks that meet through a caller's key-value store (ABI 1.2): LibTorch's TCPStore, handed to bpl_init
// as callbacks (torch_backend/store_callbacks.h) with no MASTER_ADDR or MASTER_PORT in the environment,
// and communicators made by their members alone (bpl_comm_create_from_store), a rank outside taking no
// part. Real processes: gloo over shared memory and over TCP, and mpi under mpirun.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <limits.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backplane/backplane.h"
#include "store_callbacks.h"
#include "support/process.h"

namespace {

using backplane::torch_backend::StoreCallbacks;
namespace test = backplane::test;

std::string self_path;

// A rank's check: prints what failed and makes the process fail.
int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

c10::intrusive_ptr<c10d::Store> job_store(int rank, int world, int port) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = rank == 0;
  options.numWorkers = static_cast<size_t>(world);
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(30);
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

// One rank: joins through the store, allreduces over the world, over ranks 1.. (rank 0 outside), and
// over every rank in reverse order, each group through a prefix store of its own as torch makes them.
int run_rank(const std::string& backend, int rank, int world, int port) {
  auto store = job_store(rank, world, port);
  StoreCallbacks world_store(c10::make_intrusive<c10d::PrefixStore>("default_pg", store));
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = backend.c_str();
  if (backend != "mpi") {  // under mpirun, rank and world come from Open MPI
    options.rank = rank;
    options.world_size = world;
  }
  options.store = world_store.table();
  bpl_runtime* runtime = nullptr;
  if (bpl_init(&options, &runtime) != BPL_OK) {
    std::fprintf(stderr, "FAILED: bpl_init: %s\n", bpl_last_error());
    return 1;
  }
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_runtime_describe(runtime, &info);
  std::printf("rank %d: %s\n", rank, info.details);
  if (backend == "gloo") expect(std::strstr(info.details, "store=the caller's") != nullptr, "the world met through the caller's store");

  bpl_comm* world_comm = nullptr;
  bpl_comm_world(runtime, &world_comm);
  int64_t value = rank + 1, sum = 0;
  expect(bpl_allreduce(world_comm, &value, &sum, 1, BPL_DTYPE_I64, BPL_OP_SUM, nullptr) == BPL_OK, bpl_last_error());
  expect(sum == world * (world + 1) / 2, "world allreduce sum " + std::to_string(sum));

  if (rank >= 1) {  // ranks 1..world-1; rank 0 takes no part
    StoreCallbacks group_store(c10::make_intrusive<c10d::PrefixStore>("group_1", store));
    bpl_comm* group = nullptr;
    const bpl_status status = bpl_comm_create_from_store(runtime, group_store.table(), rank - 1, world - 1, &group);
    expect(status == BPL_OK, std::string("create_from_store (ranks 1..): ") + bpl_last_error());
    if (status == BPL_OK) {
      int32_t group_rank = -1, group_size = -1;
      bpl_comm_rank(group, &group_rank);
      bpl_comm_size(group, &group_size);
      expect(group_rank == rank - 1 && group_size == world - 1, "the group's rank and size");
      int64_t mine = rank, total = 0;
      expect(bpl_allreduce(group, &mine, &total, 1, BPL_DTYPE_I64, BPL_OP_SUM, nullptr) == BPL_OK, bpl_last_error());
      expect(total == world * (world - 1) / 2, "group allreduce sum " + std::to_string(total));
      expect(bpl_comm_destroy(group) == BPL_OK, bpl_last_error());
    }
  }
  {  // every rank, in reverse order: the new rank decides the order, not the world's
    StoreCallbacks group_store(c10::make_intrusive<c10d::PrefixStore>("group_2", store));
    bpl_comm* reversed = nullptr;
    const int new_rank = world - 1 - rank;
    const bpl_status status = bpl_comm_create_from_store(runtime, group_store.table(), new_rank, world, &reversed);
    expect(status == BPL_OK, std::string("create_from_store (reversed): ") + bpl_last_error());
    if (status == BPL_OK) {
      float data[4] = {0, 0, 0, 0};
      if (new_rank == 0) std::fill(data, data + 4, static_cast<float>(rank) + 0.5f);
      expect(bpl_broadcast(reversed, data, 4, BPL_DTYPE_F32, 0, nullptr) == BPL_OK, bpl_last_error());
      expect(data[3] == static_cast<float>(world - 1) + 0.5f, "broadcast from the new rank 0 (world rank " +
                                                                  std::to_string(world - 1) + ") gave " + std::to_string(data[3]));
      expect(bpl_comm_destroy(reversed) == BPL_OK, bpl_last_error());
    }
  }
  expect(bpl_barrier(world_comm, nullptr) == BPL_OK, bpl_last_error());
  expect(bpl_finalize(runtime) == BPL_OK, bpl_last_error());
  if (failures == 0) std::printf("rank %d: OK\n", rank);
  return failures == 0 ? 0 : 1;
}

// The launch environment removed, so that only the store can bring the ranks together.
std::map<std::string, std::string> without_launch_env(std::map<std::string, std::string> env) {
  for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) env[name] = "";
  env["BPL_TIMEOUT_MS"] = "20000";
  return env;
}

void expect_every_rank_ok(const std::vector<test::ProcessResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("OK"), std::string::npos) << results[r].output;
  }
}

std::vector<test::ProcessResult> run_gloo_ranks(int world, std::map<std::string, std::string> env) {
  const int port = test::free_port();
  std::vector<test::Process> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(test::start_process({self_path, "--rank", "gloo", std::to_string(r), std::to_string(world), std::to_string(port)},
                                        without_launch_env(env)));
  }
  std::vector<test::ProcessResult> results;
  for (auto& process : ranks) results.push_back(test::finish_process(process, std::chrono::seconds(60)));
  return results;
}

TEST(CallerStore, GlooRanksMeetThroughItOverSharedMemory) { expect_every_rank_ok(run_gloo_ranks(3, {})); }

TEST(CallerStore, GlooRanksMeetThroughItOverTcp) { expect_every_rank_ok(run_gloo_ranks(3, {{"BPL_GLOO_SHM", "0"}})); }

TEST(CallerStore, MpiRanksMakeGroupsThroughIt) {
  if (!test::mpi_backend_built()) GTEST_SKIP() << test::kNoMpi;
  const int port = test::free_port();
  // Each rank reads its rank from Open MPI's environment; the store is still LibTorch's at `port`.
  auto result = test::run_process(test::mpirun(3, {self_path, "--rank", "mpi", "-1", "3", std::to_string(port)}),
                                  test::mpi_env(without_launch_env({})), std::chrono::seconds(90));
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (int r = 0; r < 3; ++r) EXPECT_NE(result.output.find("rank " + std::to_string(r) + ": OK"), std::string::npos) << result.output;
}

// What a store must hold and what a group must agree on, refused with the value named.
TEST(CallerStore, BadStoresAndGroupsAreRefused) {
  bpl_store incomplete = BPL_STORE_INIT;
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = "gloo";
  options.rank = 0;
  options.world_size = 1;
  options.store = &incomplete;
  bpl_runtime* runtime = nullptr;
  EXPECT_EQ(bpl_init(&options, &runtime), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(bpl_last_error()).find("options->store->set is NULL"), std::string::npos) << bpl_last_error();

  options.store = nullptr;
  ASSERT_EQ(bpl_init(&options, &runtime), BPL_OK) << bpl_last_error();
  const int port = test::free_port();
  StoreCallbacks callbacks(job_store(0, 1, port));
  bpl_comm* comm = nullptr;
  EXPECT_EQ(bpl_comm_create_from_store(runtime, callbacks.table(), 2, 2, &comm), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(bpl_last_error()).find("rank = 2: expected 0..1"), std::string::npos) << bpl_last_error();
  EXPECT_EQ(bpl_comm_create_from_store(runtime, callbacks.table(), 0, 0, &comm), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(bpl_last_error()).find("size = 0"), std::string::npos) << bpl_last_error();
  EXPECT_EQ(bpl_comm_create_from_store(runtime, &incomplete, 0, 1, &comm), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(bpl_last_error()).find("store->set is NULL"), std::string::npos) << bpl_last_error();
  EXPECT_EQ(bpl_comm_create_from_store(runtime, nullptr, 0, 1, &comm), BPL_ERR_INVALID_ARGUMENT);

  // A member that never comes: a timeout naming it, within the communicator's bound.
  bpl_comm* world = nullptr;
  bpl_comm_world(runtime, &world);
  ASSERT_EQ(bpl_comm_set_timeout(world, 1500), BPL_OK);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(bpl_comm_create_from_store(runtime, callbacks.table(), 0, 2, &comm), BPL_ERR_TIMEOUT);
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  EXPECT_NE(std::string(bpl_last_error()).find("missing ranks [1]"), std::string::npos) << bpl_last_error();
  EXPECT_LT(waited.count(), 10000) << "the wait is bounded by the timeout";
  EXPECT_EQ(comm, nullptr);
  EXPECT_EQ(bpl_finalize(runtime), BPL_OK) << bpl_last_error();
}

// Two processes claiming the same rank of a new communicator: MISMATCH on both, naming the rank.
TEST(CallerStore, TwoMembersWithOneRankAreAMismatch) {
  const int port = test::free_port();
  std::vector<test::Process> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(test::start_process({self_path, "--duplicate", std::to_string(r), std::to_string(port)}, without_launch_env({})));
  }
  for (auto& process : ranks) {
    auto result = test::finish_process(process, std::chrono::seconds(60));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("MISMATCH"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("as rank 0"), std::string::npos) << result.output;
  }
}

// Both processes pass rank 0 of 2: the second to arrive, and then the first at its timeout or at
// once, fail with MISMATCH.
int run_duplicate(int process, int port) {
  auto store = job_store(process, 2, port);
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = "gloo";
  options.rank = 0;
  options.world_size = 1;
  options.timeout_ms = 5000;
  bpl_runtime* runtime = nullptr;
  if (bpl_init(&options, &runtime) != BPL_OK) return 2;
  StoreCallbacks callbacks(c10::make_intrusive<c10d::PrefixStore>("group", store));
  bpl_comm* comm = nullptr;
  const bpl_status status = bpl_comm_create_from_store(runtime, callbacks.table(), 0, 2, &comm);
  std::printf("%s: %s\n", bpl_status_name(status), bpl_last_error());
  bpl_finalize(runtime);
  // Rank 0's store lives in process 0: it stays until the other has read the failure.
  if (process == 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  return status == BPL_ERR_MISMATCH ? 0 : 1;
}

// A TCPStore host on a port its own bind chose (printed), until it is killed.
int run_store_host() {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  c10d::TCPStore host("127.0.0.1", options);
  std::printf("port %d\n", host.getPort());
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// A store whose host stops answering (as a stopped rank 0 does under torch's env:// rendezvous): the
// call it does not answer fails within the bound, naming the call, and every later call fails at once
// with that failure, never blocking the failure path of a plugin that reads it.
TEST(CallerStore, AStoreThatStopsAnsweringFailsEveryCallInTime) {
  test::Process host = test::start_process({self_path, "--store-host"}, {});
  std::string output;
  ASSERT_TRUE(test::wait_for_output(host, output, "\n", std::chrono::seconds(30))) << output;
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(std::atoi(output.c_str() + std::strlen("port ")));
  options.isServer = false;
  options.timeout = std::chrono::seconds(30);
  auto client = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  const auto bound = std::chrono::milliseconds(500);
  auto callbacks = std::make_unique<StoreCallbacks>(c10::make_intrusive<c10d::PrefixStore>("group", client), bound);
  const bpl_store* store = callbacks->table();
  int64_t sum = 0;
  ASSERT_EQ(store->add(store->context, "counter", 2, &sum), BPL_OK) << store->last_error(store->context);
  EXPECT_EQ(sum, 2);

  ASSERT_EQ(kill(host.pid, SIGSTOP), 0);
  int stopped = 0;  // a signal is delivered after kill returns: the host may answer one more call until then
  ASSERT_EQ(waitpid(host.pid, &stopped, WUNTRACED), host.pid);
  ASSERT_TRUE(WIFSTOPPED(stopped));
  auto start = std::chrono::steady_clock::now();
  int32_t found = -1;
  const bpl_status stalled = store->check(store->context, "key", &found);  // (a set is sent, never answered)
  const double stalled_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string message = store->last_error(store->context);
  EXPECT_EQ(stalled, BPL_ERR_TIMEOUT) << message;
  EXPECT_EQ(found, -1);
  EXPECT_GE(stalled_s, 0.45);
  EXPECT_LT(stalled_s, 2.0) << "a check of a stopped store ended after " << stalled_s << " s, its bound being 0.5 s";
  EXPECT_NE(message.find("check 'key' had no reply within 500 ms"), std::string::npos) << message;

  start = std::chrono::steady_clock::now();
  EXPECT_NE(store->add(store->context, "counter", 1, &sum), BPL_OK);
  EXPECT_EQ(std::string(store->last_error(store->context)), message);
  size_t size = 0;
  EXPECT_NE(store->get(store->context, "key", 10000, nullptr, 0, &size), BPL_OK);
  EXPECT_NE(store->set(store->context, "key", "v", 1), BPL_OK);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.2)
      << "the calls after a stalled one did not fail at once";
  EXPECT_EQ(sum, 2);

  // The host, resumed, answers the stalled call; the callbacks' thread then ends before the test does
  // (a thread left in a call to a killed host logs the reset, resolving its address, during the exit).
  ASSERT_EQ(kill(host.pid, SIGCONT), 0);
  callbacks.reset();
  kill(host.pid, SIGKILL);
  test::finish_process(host, std::chrono::seconds(10));
}

}  // namespace

int main(int argc, char** argv) {
  char resolved[PATH_MAX];
  self_path = realpath("/proc/self/exe", resolved) ? resolved : argv[0];
  if (argc == 6 && std::strcmp(argv[1], "--rank") == 0) {
    const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
    const int rank = std::atoi(argv[3]) >= 0 ? std::atoi(argv[3]) : (mpi_rank != nullptr ? std::atoi(mpi_rank) : 0);
    return run_rank(argv[2], rank, std::atoi(argv[4]), std::atoi(argv[5]));
  }
  if (argc == 2 && std::strcmp(argv[1], "--store-host") == 0) return run_store_host();
  if (argc == 4 && std::strcmp(argv[1], "--duplicate") == 0) return run_duplicate(std::atoi(argv[2]), std::atoi(argv[3]));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
