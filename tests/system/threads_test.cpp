// Ranks as threads of one process (in addition to the real multi-process suites): each thread is a
// rank with explicit bpl_init options, all meeting over real Gloo sockets on loopback.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "backplane/backplane.h"
#include "support/process.h"

namespace {

// Waits (bounded) for another rank's thread to set `flag`: false, with the test failed, if it never
// does, as when that rank's own assertion failed first.
bool wait_for(const std::atomic<bool>& flag, const char* what) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!flag) {
    if (std::chrono::steady_clock::now() >= give_up) {
      ADD_FAILURE() << what << " did not happen within 30 s";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Runs body(rank, runtime, world) on `world_size` threads; returns how many ranks failed to start.
template <typename Body>
void run_ranks(int world_size, Body body) {
  const int port = backplane::test::free_port();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([=] {
      bpl_init_options options = BPL_INIT_OPTIONS_INIT;
      options.backend = "gloo";
      options.rank = rank;
      options.world_size = world_size;
      options.master_addr = "127.0.0.1";
      options.master_port = port;
      options.timeout_ms = 20000;
      bpl_runtime* runtime = nullptr;
      bpl_status status = bpl_init(&options, &runtime);
      EXPECT_EQ(status, BPL_OK) << "rank " << rank << ": " << bpl_last_error();
      if (status != BPL_OK) return;
      bpl_comm* world = nullptr;
      bpl_comm_world(runtime, &world);
      body(rank, runtime, world);
      EXPECT_EQ(bpl_finalize(runtime), BPL_OK) << bpl_last_error();
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(ThreadsAsRanks, AllreduceAndSplitWithFourRanks) {
  run_ranks(4, [](int rank, bpl_runtime*, bpl_comm* world) {
    double value = rank + 1;
    EXPECT_EQ(bpl_allreduce(world, &value, &value, 1, BPL_DTYPE_F64, BPL_OP_SUM, nullptr), BPL_OK) << bpl_last_error();
    EXPECT_EQ(value, 10.0);
    bpl_comm* pair = nullptr;
    EXPECT_EQ(bpl_comm_split(world, rank / 2, rank, &pair), BPL_OK) << bpl_last_error();
    int32_t sum = rank;
    EXPECT_EQ(bpl_allreduce(pair, &sum, &sum, 1, BPL_DTYPE_I32, BPL_OP_SUM, nullptr), BPL_OK);
    EXPECT_EQ(sum, rank < 2 ? 1 : 5);
    EXPECT_EQ(bpl_comm_destroy(pair), BPL_OK);
  });
}

TEST(ThreadsAsRanks, ConcurrentAsyncFromTwoThreadsPerRank) {
  // Two application threads per rank post async allreduces on two communicators at once.
  run_ranks(2, [](int rank, bpl_runtime*, bpl_comm* world) {
    bpl_comm* other = nullptr;
    ASSERT_EQ(bpl_comm_split(world, 0, rank, &other), BPL_OK) << bpl_last_error();
    auto work = [rank](bpl_comm* comm, float scale) {
      std::vector<float> data(50000, scale * (rank + 1));
      for (int round = 0; round < 5; ++round) {
        bpl_request* request = nullptr;
        EXPECT_EQ(bpl_allreduce(comm, data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_MAX, &request), BPL_OK);
        EXPECT_EQ(bpl_request_wait(request, BPL_TIMEOUT_DEFAULT), BPL_OK) << bpl_last_error();
        EXPECT_EQ(bpl_request_free(request), BPL_OK);
      }
      EXPECT_EQ(data.front(), scale * 2);
      EXPECT_EQ(data.back(), scale * 2);
    };
    std::thread a(work, world, 1.0f);
    std::thread b(work, other, 3.0f);
    a.join();
    b.join();
    EXPECT_EQ(bpl_comm_destroy(other), BPL_OK);
  });
}

TEST(ThreadsAsRanks, WaitWithShortTimeoutLeavesRequestInFlight) {
  // Rank 1 joins the allreduce late: rank 0's 50 ms wait times out, and a later wait completes it.
  std::atomic<bool> rank0_timed_out{false};
  run_ranks(2, [&](int rank, bpl_runtime*, bpl_comm* world) {
    int64_t value = rank == 0 ? 1234 : 1;
    if (rank == 1) {
      if (!wait_for(rank0_timed_out, "rank 0's short wait")) return;
    }
    bpl_request* request = nullptr;
    ASSERT_EQ(bpl_allreduce(world, &value, &value, 1, BPL_DTYPE_I64, BPL_OP_SUM, &request), BPL_OK);
    if (rank == 0) {
      EXPECT_EQ(bpl_request_wait(request, 50), BPL_ERR_TIMEOUT);
      EXPECT_NE(std::string(bpl_last_error()).find("still in flight"), std::string::npos) << bpl_last_error();
      int32_t done = 1;
      EXPECT_EQ(bpl_request_test(request, &done), BPL_OK);
      EXPECT_EQ(done, 0);
      rank0_timed_out = true;
    }
    EXPECT_EQ(bpl_request_wait(request, BPL_TIMEOUT_DEFAULT), BPL_OK) << bpl_last_error();
    EXPECT_EQ(bpl_request_free(request), BPL_OK);
    EXPECT_EQ(value, 1235);
  });
}

TEST(ThreadsAsRanks, AbortReleasesAWaitAndThePeerFailsAtOnce) {
  // Rank 0 waits for an allreduce rank 1 has not joined; a third thread aborts rank 0's world. The
  // wait ends with ABORTED, and rank 1, joining afterwards, fails at once on the closed connection.
  std::atomic<bool> aborted{false};
  run_ranks(2, [&](int rank, bpl_runtime*, bpl_comm* world) {
    float value = 1.0f;
    if (rank == 1) {
      if (!wait_for(aborted, "the abort of rank 0's world")) return;
      const auto start = std::chrono::steady_clock::now();
      EXPECT_EQ(bpl_allreduce(world, &value, &value, 1, BPL_DTYPE_F32, BPL_OP_SUM, nullptr), BPL_ERR_REMOTE);
      const std::string error = bpl_last_error();
      EXPECT_NE(error.find("bpl_allreduce #1 on world (rank 1 of 2): gloo: "), std::string::npos) << error;
      EXPECT_NE(error.find("rank 0 of this communicator"), std::string::npos) << error;
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
      return;
    }
    ASSERT_EQ(bpl_comm_set_timeout(world, 2000), BPL_OK) << bpl_last_error();  // bounds the free below
    bpl_request* request = nullptr;
    ASSERT_EQ(bpl_allreduce(world, &value, &value, 1, BPL_DTYPE_F32, BPL_OP_SUM, &request), BPL_OK);
    std::chrono::steady_clock::time_point aborted_at;
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      aborted_at = std::chrono::steady_clock::now();
      EXPECT_EQ(bpl_comm_abort(world), BPL_OK);
      aborted = true;
    });
    EXPECT_EQ(bpl_request_wait(request, BPL_TIMEOUT_DEFAULT), BPL_ERR_ABORTED) << bpl_last_error();
    const auto released = std::chrono::steady_clock::now();
    aborter.join();
    EXPECT_LT(released - aborted_at, std::chrono::seconds(1));
    EXPECT_EQ(bpl_comm_abort(world), BPL_OK);  // a second abort is a no-op
    EXPECT_EQ(bpl_barrier(world, nullptr), BPL_ERR_ABORTED);
    bpl_request_free(request);  // ends with the operation, within the 2 s timeout
  });
}

}  // namespace
