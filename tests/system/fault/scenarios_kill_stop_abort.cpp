// Rank programs: a rank killed or stopped mid-collective, per-call timeouts, abort, values at the top of
// their types.
#include "system/fault/scenarios.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace backplane::test::faults {

// 64 MiB allreduces.
int kill_mid_allreduce() {
  Rank r = join();
  std::vector<float> data(16u << 20, 1.0f);
  return kill_mid(r, "allreduce", 20, [&] {
    return bpl_allreduce(r.world, data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
  });
}

// 256 MiB broadcasts from rank 0 (the faulty rank is stopped first: BPL_TEST_STOPPED_MS), long
// enough over TCP that it stops mid-transfer.
int kill_mid_broadcast() {
  Rank r = join();
  std::vector<float> data(64u << 20, 1.0f);
  return kill_mid(r, "broadcast", 20, [&] { return bpl_broadcast(r.world, data.data(), data.size(), BPL_DTYPE_F32, 0, nullptr); });
}

// the same in alltoallv (ABI 1.3; on gloo, transfers between each pair of ranks), 4 MiB blocks.
int kill_mid_alltoallv() {
  Rank r = join();
  const size_t block = 1u << 20;  // elements each rank sends each other
  const auto ranks = static_cast<size_t>(r.size);
  std::vector<float> send(block * ranks, 1.0f), recv(block * ranks);
  std::vector<int64_t> counts(ranks, static_cast<int64_t>(block)), displs(ranks);
  for (size_t q = 0; q < ranks; ++q) displs[q] = static_cast<int64_t>(block * q);
  return kill_mid(r, "alltoallv", 200, [&] {
    return bpl_alltoallv(r.world, send.data(), counts.data(), displs.data(), recv.data(), counts.data(), displs.data(),
                         BPL_DTYPE_F32, nullptr);
  });
}

// Tests 2 and 4: 1 MiB allreduces; the faulty rank is stopped (SIGSTOP) at the second. Survivors time
// out, the failed world refuses the next operation at once, a communicator split off before (without
// the stopped rank) keeps working, and on gloo the survivors then start a new job of their own. Rank
// 0 starts that allreduce BPL_TEST_RANK0_LATE_MS late (default 0). Each survivor reports the CPU time
// its failed allreduce used ("cpu_ms=N"): waiting for a stopped peer must not spin a core. With
// BPL_TEST_OP=alltoallv the operation is an alltoallv of the same size instead (ABI 1.3: transfers
// between each pair of ranks).
int stop_mid_allreduce() {
  Rank r = join();
  const int stopped = faulty_rank();
  bpl_comm* survivors = nullptr;
  bpl_comm_split(r.world, r.rank == stopped ? BPL_COLOR_UNDEFINED : 0, r.rank, &survivors);
  std::vector<float> data(256u << 10, 1.0f), received(data.size());
  const auto ranks = static_cast<size_t>(r.size);
  std::vector<int64_t> counts(ranks, static_cast<int64_t>(data.size() / ranks)), displs(ranks);
  for (size_t q = 0; q < ranks; ++q) displs[q] = counts[q] * static_cast<int64_t>(q);
  const bool alltoallv = env_text("BPL_TEST_OP") == "alltoallv";
  for (int iteration = 0; iteration < 20; ++iteration) {
    if (r.rank == stopped && iteration == 1) stop_self_until_killed(r.timeout_ms + 3000);
    if (r.rank == 0 && iteration == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(env_int("BPL_TEST_RANK0_LATE_MS", 0)));
    }
    const auto start = Clock::now();
    const int64_t cpu_before = cpu_ms();
    bpl_status status =
        alltoallv ? bpl_alltoallv(r.world, data.data(), counts.data(), displs.data(), received.data(), counts.data(),
                                  displs.data(), BPL_DTYPE_F32, nullptr)
                  : bpl_allreduce(r.world, data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    if (status == BPL_OK) continue;
    report(r, "failed", status, start, " cpu_ms=" + std::to_string(cpu_ms() - cpu_before));
    retry_fails_at_once(r);
    float one = 1.0f, sum = 0.0f;
    const auto split_start = Clock::now();
    status = bpl_allreduce(survivors, &one, &sum, 1, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    report(r, "survivors", status, split_start, " sum=" + std::to_string(static_cast<int>(sum)));
    bpl_comm_destroy(survivors);
    finalize(r);
    if (r.backend == "gloo") {
      // A new job of the survivors alone, on another port: what an elastic restart does.
      bpl_init_options options = BPL_INIT_OPTIONS_INIT;
      options.rank = r.rank < stopped ? r.rank : r.rank - 1;
      options.world_size = r.size - 1;
      options.local_rank = options.rank;
      options.local_world_size = options.world_size;
      options.master_port = env_int("BPL_TEST_SECOND_PORT", -1);
      const auto restart = Clock::now();
      bpl_runtime* again = nullptr;
      status = bpl_init(&options, &again);
      if (status == BPL_OK) {
        bpl_comm* world = nullptr;
        bpl_comm_world(again, &world);
        sum = 0.0f;
        status = bpl_allreduce(world, &one, &sum, 1, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
      }
      report(r, "new_job", status, restart, " sum=" + std::to_string(static_cast<int>(sum)));
      bpl_finalize(again);
    }
    return 3;
  }
  std::printf("rank %d: every allreduce succeeded\n", r.rank);
  bpl_finalize(r.runtime);
  return 0;
}

// 2 ranks, rank 1 stopped. Rank 0 sets the world's timeout to BPL_TEST_COMM_TIMEOUT_MS, then
// waits for an allreduce first shorter than it (a poll: still in flight, communicator still usable),
// then far longer (ends at the communicator's timeout).
int per_call_timeouts() {
  Rank r = join();
  const int64_t comm_timeout = env_int("BPL_TEST_COMM_TIMEOUT_MS", 1500);
  if (r.rank == 1) stop_self_until_killed(comm_timeout + 2500);
  report(r, "set_timeout", bpl_comm_set_timeout(r.world, comm_timeout), Clock::now());
  int64_t got = 0;
  bpl_comm_get_timeout(r.world, &got);
  std::printf("rank %d: comm timeout %lld ms\n", r.rank, static_cast<long long>(got));
  std::vector<float> data(1024, 1.0f);
  bpl_request* req = nullptr;
  const auto posted = Clock::now();
  bpl_status status = bpl_allreduce(r.world, data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_SUM, &req);
  if (status != BPL_OK) {
    report(r, "post", status, Clock::now());
    return 2;
  }
  auto start = Clock::now();
  report(r, "short_wait", bpl_request_wait(req, comm_timeout / 5), start);
  int32_t done = -1;
  status = bpl_request_test(req, &done);
  report(r, "test", status, Clock::now(), " done=" + std::to_string(done));
  start = Clock::now();
  status = bpl_request_wait(req, 10 * comm_timeout);
  report(r, "long_wait", status, start, " since_post=" + std::to_string(ms_since(posted)));
  retry_fails_at_once(r);
  start = Clock::now();
  report(r, "free", bpl_request_free(req), start);
  finalize(r);
  return 3;
}

// 2 ranks. Rank 0 posts a recv from rank 1, which sends nothing (it waits in a barrier), and only
// tests the request, every millisecond, until it ends (at most ten timeouts).
int recv_tested_past_its_deadline() {
  Rank r = join();
  const auto start = Clock::now();
  if (r.rank == 0) {
    std::vector<float> data(64 * 1024);  // beyond every backend's size for a message copied at once
    bpl_request* req = nullptr;
    bpl_status status = bpl_recv(r.world, data.data(), data.size(), BPL_DTYPE_F32, 1, 9, &req);
    int32_t done = 0;
    while (status == BPL_OK && done == 0 && ms_since(start) < 10 * r.timeout_ms) {
      status = bpl_request_test(req, &done);
      if (status == BPL_OK && done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    report(r, "tested", status, start, " done=" + std::to_string(done));
    bpl_request_free(req);
  } else {
    report(r, "barrier", bpl_barrier(r.world, nullptr), start);
  }
  finalize(r);
  return 3;
}

// 2 ranks, rank 1 stopped. Rank 0 waits for an allreduce; another thread aborts the world
// 500 ms later.
int abort_from_another_thread() {
  Rank r = join();
  if (r.rank == 1) stop_self_until_killed(r.timeout_ms + 2500);
  std::vector<float> data(1024, 1.0f);
  bpl_request* req = nullptr;
  bpl_allreduce(r.world, data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_SUM, &req);
  std::atomic<int64_t> aborted_at_ms{0};
  const auto start = Clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    aborted_at_ms = ms_since(start);
    report(r, "abort", bpl_comm_abort(r.world), Clock::now());
    report(r, "abort_again", bpl_comm_abort(r.world), Clock::now());
  });
  const bpl_status status = bpl_request_wait(req, BPL_TIMEOUT_DEFAULT);
  const int64_t released = ms_since(start) - aborted_at_ms;
  aborter.join();
  report(r, "wait", status, start, " released_after_abort=" + std::to_string(released));
  retry_fails_at_once(r);
  const auto free_start = Clock::now();
  report(r, "free", bpl_request_free(req), free_start);
  finalize(r);
  return 3;
}

// bpl_comm_abort on gloo closes the connections: a peer in a collective learns of it at once.
int abort_notifies_peers() {
  Rank r = join();
  if (r.rank == 0) {
    report(r, "abort", bpl_comm_abort(r.world), Clock::now());
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // stays alive: the peer must not rely on an exit
    finalize(r);
    return 3;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::vector<float> data(1024, 1.0f);
  const auto start = Clock::now();
  report(r, "failed", bpl_allreduce(r.world, data.data(), data.data(), 1024, BPL_DTYPE_F32, BPL_OP_SUM, nullptr), start);
  finalize(r);
  return 3;
}

// 3 ranks, rank 1 stopped. Rank 0 is inside a blocking allreduce (no request) when another
// thread aborts the world 500 ms in; rank 2 is in the same allreduce, and must learn of the abort.
int abort_blocking_call() {
  Rank r = join();
  if (r.rank == 1) stop_self_until_killed(r.timeout_ms + 2500);
  std::vector<float> data(1024, 1.0f);
  const auto start = Clock::now();
  std::atomic<int64_t> aborted_at_ms{-1};
  std::thread aborter;
  if (r.rank == 0) {
    aborter = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      aborted_at_ms = ms_since(start);
      bpl_comm_abort(r.world);
    });
  }
  const bpl_status status = bpl_allreduce(r.world, data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
  const int64_t ended_ms = ms_since(start);
  if (aborter.joinable()) aborter.join();
  report(r, "blocked", status, start, " released_after_abort=" + std::to_string(ended_ms - 500));
  // Every rank stays until all have reported: rank 0 hosts gloo's store that tells the others why, and
  // under mpirun a rank's exit ends the job.
  std::this_thread::sleep_until(start + std::chrono::milliseconds(r.timeout_ms + 1500));
  finalize(r);
  return 3;
}

// Every collective succeeds; then rank 1 is stopped before it finalizes. The others' bpl_finalize must
// still return within its bound (MPI_Finalize, say, waits for every rank with none).
int stop_before_finalize() {
  Rank r = join();
  float value = 1.0f, sum = 0.0f;
  const auto start = Clock::now();
  report(r, "allreduce", bpl_allreduce(r.world, &value, &sum, 1, BPL_DTYPE_F32, BPL_OP_SUM, nullptr), start);
  if (r.rank == 1) stop_self_until_killed(r.timeout_ms + 3000);
  finalize(r);
  return 0;
}

// Huge values where the API takes a size or a time: a timeout of INT64_MAX or 2^45 ms is a timeout
// that never runs out (operations and waits succeed), and counts no address space can hold are
// refused before anything is sent, leaving the communicator usable.
int huge_values() {
  Rank r = join();
  float value = 1.0f, sum = 0.0f;
  auto allreduce_one = [&] { return bpl_allreduce(r.world, &value, &sum, 1, BPL_DTYPE_F32, BPL_OP_SUM, nullptr); };
  for (const int64_t timeout : {INT64_MAX, int64_t{1} << 45}) {
    const std::string suffix = timeout == INT64_MAX ? "max" : "2p45";
    auto start = Clock::now();
    report(r, ("set_timeout_" + suffix).c_str(), bpl_comm_set_timeout(r.world, timeout), start);
    start = Clock::now();
    sum = 0.0f;
    const bpl_status reduced = allreduce_one();
    report(r, ("allreduce_" + suffix).c_str(), reduced, start, " sum=" + std::to_string(static_cast<int>(sum)));
    bpl_request* req = nullptr;
    start = Clock::now();
    bpl_status status = bpl_allreduce(r.world, &value, &sum, 1, BPL_DTYPE_F32, BPL_OP_SUM, &req);
    if (status == BPL_OK) status = bpl_request_wait(req, timeout);
    if (req != nullptr) bpl_request_free(req);
    report(r, ("wait_" + suffix).c_str(), status, start);
  }
  std::vector<char> buffer(64);
  const int64_t huge = INT64_MAX;
  auto start = Clock::now();
  report(r, "huge_allreduce", bpl_allreduce(r.world, buffer.data(), buffer.data(), huge, BPL_DTYPE_I8, BPL_OP_SUM, nullptr), start);
  start = Clock::now();
  report(r, "huge_broadcast", bpl_broadcast(r.world, buffer.data(), int64_t{1} << 50, BPL_DTYPE_I8, 0, nullptr), start);
  start = Clock::now();
  const int peer = r.rank == 0 ? 1 : 0;
  report(r, "huge_send", r.rank == 0 ? bpl_send(r.world, buffer.data(), huge / 8, BPL_DTYPE_I64, peer, 1, nullptr)
                                     : bpl_recv(r.world, buffer.data(), huge / 8, BPL_DTYPE_I64, peer, 1, nullptr),
         start);
  start = Clock::now();
  sum = 0.0f;
  const bpl_status after = allreduce_one();
  report(r, "after", after, start, " sum=" + std::to_string(static_cast<int>(sum)));
  finalize(r);
  return 0;
}


}  // namespace backplane::test::faults
