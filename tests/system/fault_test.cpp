// Faults in real processes, for every backend that runs here (gloo: ranks started as a launcher
// would; mpi: under a real mpirun): a rank killed, stopped or leaving in the middle of a collective,
// timeouts per call and per communicator, abort from another thread, mismatched collectives under
// BPL_DEBUG=detail, and a rendezvous that cannot complete. The promise checked everywhere: every
// surviving rank gets a clear error within its timeout, and nothing hangs.
//
// The binary doubles as the rank program (support/fault_job.h).
#include <gtest/gtest.h>

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

#include "backplane/backplane.h"
#include "support/fault_job.h"
#include "support/process.h"

namespace {

using namespace backplane::test::faults;
using backplane::test::kNoMpi;
using backplane::test::mpi_backend_built;
using backplane::test::ProcessResult;

// The rank a scenario fails (kills, stops, ends): BPL_TEST_FAULTY_RANK, rank 1 unless set. Rank 0
// hosts the gloo store.
int faulty_rank() { return env_int("BPL_TEST_FAULTY_RANK", 1); }

// Runs `operation` (one collective on r.world) `iterations` times; the faulty rank SIGKILLs itself 30 ms
// after starting the second, or, with BPL_TEST_STOPPED_MS set, stops itself then (SIGSTOP) and is
// killed that long later. A survivor reports the failure it sees ("failed") and that the world then
// refuses operations at once; every rank reports success if none failed.
template <typename Operation>
int kill_mid(Rank& r, const char* name, int iterations, Operation&& operation) {
  const int stopped_ms = env_int("BPL_TEST_STOPPED_MS", 0);
  for (int iteration = 0; iteration < iterations; ++iteration) {
    if (r.rank == faulty_rank() && iteration == 1 && stopped_ms == 0) sigkill_self_in(std::chrono::milliseconds(30));
    if (r.rank == faulty_rank() && iteration == 1 && stopped_ms > 0) {
      std::thread([stopped_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        stop_self_until_killed(stopped_ms);
      }).detach();
    }
    const auto start = Clock::now();
    const bpl_status status = operation();
    if (status != BPL_OK) {
      report(r, "failed", status, start);
      retry_fails_at_once(r);
      finalize(r);
      return 3;
    }
  }
  std::printf("rank %d: every %s succeeded\n", r.rank, name);
  bpl_finalize(r.runtime);
  return 0;
}

// Test 1: 64 MiB allreduces.
int kill_mid_allreduce() {
  Rank r = join();
  std::vector<float> data(16u << 20, 1.0f);
  return kill_mid(r, "allreduce", 20, [&] {
    return bpl_allreduce(r.world, data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
  });
}

// Test 1c: 256 MiB broadcasts from rank 0 (the faulty rank is stopped first: BPL_TEST_STOPPED_MS), long
// enough over TCP that it stops mid-transfer.
int kill_mid_broadcast() {
  Rank r = join();
  std::vector<float> data(64u << 20, 1.0f);
  return kill_mid(r, "broadcast", 20, [&] { return bpl_broadcast(r.world, data.data(), data.size(), BPL_DTYPE_F32, 0, nullptr); });
}

// Test 1b: the same in alltoallv (ABI 1.3; on gloo, transfers between each pair of ranks), 4 MiB blocks.
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

// Test 3: 2 ranks, rank 1 stopped. Rank 0 sets the world's timeout to BPL_TEST_COMM_TIMEOUT_MS, then
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

// Test 5: 2 ranks, rank 1 stopped. Rank 0 waits for an allreduce; another thread aborts the world
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

// Test 5b: 3 ranks, rank 1 stopped. Rank 0 is inside a blocking allreduce (no request) when another
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

// Test 6: the faulty rank exits with status 0 while the others are in an allreduce: without
// finalizing, or (BPL_TEST_CASE=finalize) after bpl_finalize. Rank 2 comes to the allreduce
// BPL_TEST_RANK2_LATE_MS late (default 0).
int exit_cleanly_mid_allreduce() {
  Rank r = join();
  if (r.rank == faulty_rank()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (env_text("BPL_TEST_CASE") == "finalize") finalize(r);
    std::printf("rank %d: exiting with status 0\n", r.rank);
    std::fflush(stdout);
    std::_Exit(0);
  }
  std::vector<float> data(256u << 10, 1.0f);
  if (r.rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(env_int("BPL_TEST_RANK2_LATE_MS", 0)));
  for (int iteration = 0; iteration < 3; ++iteration) {
    const auto start = Clock::now();
    bpl_status status = bpl_allreduce(r.world, data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    if (status != BPL_OK) {
      report(r, "failed", status, start);
      finalize(r);
      return 3;
    }
  }
  std::printf("rank %d: every allreduce succeeded\n", r.rank);
  bpl_finalize(r.runtime);
  return 0;
}

// Test 8: rounds of a ring exchange of 4 MiB messages (recv from the left, send to the right, both
// posted asynchronously); rank 1 SIGKILLs itself 30 ms into the second round.
int kill_mid_exchange() {
  Rank r = join();
  std::vector<float> out(1u << 20, static_cast<float>(r.rank)), in(out.size());
  const int right = (r.rank + 1) % r.size, left = (r.rank + r.size - 1) % r.size;
  for (int round = 0; round < 10000; ++round) {  // a round takes about a millisecond: rank 1 dies mid-way
    if (r.rank == 1 && round == 1) {
      sigkill_self_in(std::chrono::milliseconds(30));
    }
    const auto start = Clock::now();
    bpl_request* receiving = nullptr;
    bpl_request* sending = nullptr;
    // The first failure, with its message (a later successful call clears bpl_last_error).
    bpl_status status = BPL_OK;
    std::string error;
    auto keep_first = [&](bpl_status result) {
      if (status == BPL_OK && result != BPL_OK) {
        status = result;
        error = bpl_last_error();
      }
    };
    keep_first(bpl_recv(r.world, in.data(), in.size(), BPL_DTYPE_F32, left, round, &receiving));
    if (status == BPL_OK) keep_first(bpl_send(r.world, out.data(), out.size(), BPL_DTYPE_F32, right, round, &sending));
    // Both waited for whatever happens, so that neither buffer is still in use when it is freed.
    if (receiving != nullptr) keep_first(bpl_request_wait(receiving, BPL_TIMEOUT_DEFAULT));
    if (sending != nullptr) keep_first(bpl_request_wait(sending, BPL_TIMEOUT_DEFAULT));
    if (receiving != nullptr) bpl_request_free(receiving);
    if (sending != nullptr) bpl_request_free(sending);
    if (status != BPL_OK) {
      std::printf("rank %d: failed %s after %lld ms: %s\n", r.rank, bpl_status_name(status),
                  static_cast<long long>(ms_since(start)), error.c_str());
      std::fflush(stdout);
      finalize(r);
      return 3;
    }
    if (in.front() != static_cast<float>(left) || in.back() != static_cast<float>(left)) {
      std::printf("rank %d: round %d received wrong data\n", r.rank, round);
      return 5;
    }
  }
  std::printf("rank %d: every exchange succeeded\n", r.rank);
  bpl_finalize(r.runtime);
  return 0;
}

// Test 7: ranks call mismatched collectives (BPL_TEST_CASE): "op" (rank 1 broadcasts, the others
// allreduce), "count" (rank 1 one element more in a small allreduce), "skip" (rank 1 skips an
// allreduce and calls the next barrier), "dtype" (rank 1 allreduces i32, the others f32: the same
// bytes), "reduce_op" (rank 1 MAX, the others SUM), "reduce_root" (rank 1 reduces to itself, the
// others to rank 0); and, with 64 Ki elements (above every library's eager
// limit), one operation in which rank 1 gives 1000 elements fewer than the others: "allreduce",
// "reduce", "broadcast" (from rank 0), "allgather", "reduce_scatter", "alltoall", "gather" and
// "scatter" (root 0), "allgatherv" and "alltoallv" (each rank's counts all n: they do not pair up),
// "sendrecv" (rank 0 sends to rank 1), and "sendrecv_classes" and "sendrecv_short" (below); "recv_any" (rank
// 0 receives from any rank, and nobody sends; the others call a barrier). Every buffer is
// followed by guard words, checked afterwards: rank R reports
// "guard" BPL_OK if they are intact, BPL_ERR_INTERNAL if anything wrote past its buffer.
int mismatched_collectives() {
  Rank r = join();
  const std::string which = env_text("BPL_TEST_CASE");
  constexpr size_t kGuard = 4096;
  constexpr float kGuardValue = -12345.0f;
  const bool large = which != "op" && which != "count" && which != "skip" && which != "root" && which != "dtype" &&
                     which != "reduce_op" && which != "reduce_root" && which != "recv_any";
  // Send/recv of two sizes, the recv's buffer (rank 1) exactly its size: across the MPI backend's
  // size classes ("sendrecv_classes": 8 KiB sent, 2000 bytes expected) and within the eager one
  // ("sendrecv_short": 2000 bytes sent, 2400 expected).
  const bool classes = which == "sendrecv_classes", short_one = which == "sendrecv_short";
  const size_t count = classes ? (r.rank == 1 ? 500 : 2048)
                       : short_one ? (r.rank == 1 ? 600 : 500)
                       : !large ? 16
                                : (64u << 10) - (r.rank == 1 ? 1000 : 0);
  const bool per_rank = which == "allgather" || which == "reduce_scatter" || which == "alltoall" || which == "gather" ||
                        which == "scatter" || which == "allgatherv" || which == "alltoallv";
  const size_t blocks = per_rank ? static_cast<size_t>(r.size) : 1;
  std::vector<float> send(count * blocks + kGuard, 1.0f), recv(count * blocks + kGuard, 0.0f);
  std::fill(send.end() - kGuard, send.end(), kGuardValue);
  std::fill(recv.end() - kGuard, recv.end(), kGuardValue);
  const auto n = static_cast<int64_t>(count);
  const auto start = Clock::now();
  const int64_t cpu_before = cpu_ms();
  bpl_status status = bpl_barrier(r.world, nullptr);
  if (status == BPL_OK) {
    if (which == "op") {
      status = r.rank == 1 ? bpl_broadcast(r.world, recv.data(), 16, BPL_DTYPE_F32, 0, nullptr)
                           : bpl_allreduce(r.world, send.data(), recv.data(), 16, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    } else if (which == "count") {
      const int64_t small = r.rank == 1 ? 100 : 99;
      send.assign(100 + kGuard, 1.0f);
      std::fill(send.end() - kGuard, send.end(), kGuardValue);
      status = bpl_allreduce(r.world, send.data(), send.data(), small, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    } else if (which == "root") {  // rank 1 gathers to itself, the others to rank 0 (recv holds 3 blocks)
      status = bpl_gather(r.world, send.data(), recv.data(), 16, BPL_DTYPE_F32, r.rank == 1 ? 1 : 0, nullptr);
    } else if (which == "dtype") {
      status = bpl_allreduce(r.world, send.data(), recv.data(), 16, r.rank == 1 ? BPL_DTYPE_I32 : BPL_DTYPE_F32,
                             BPL_OP_SUM, nullptr);
    } else if (which == "reduce_op") {
      status = bpl_allreduce(r.world, send.data(), recv.data(), 16, BPL_DTYPE_F32, r.rank == 1 ? BPL_OP_MAX : BPL_OP_SUM,
                             nullptr);
    } else if (which == "reduce_root") {
      status = bpl_reduce(r.world, send.data(), recv.data(), 16, BPL_DTYPE_F32, BPL_OP_SUM, r.rank == 1 ? 1 : 0, nullptr);
    } else if (which == "skip") {
      if (r.rank != 1) status = bpl_allreduce(r.world, send.data(), recv.data(), 16, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
      if (status == BPL_OK) status = bpl_barrier(r.world, nullptr);
    } else if (which == "allreduce") {
      status = bpl_allreduce(r.world, send.data(), recv.data(), n, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    } else if (which == "reduce") {
      status = bpl_reduce(r.world, send.data(), recv.data(), n, BPL_DTYPE_F32, BPL_OP_SUM, 1, nullptr);
    } else if (which == "broadcast") {
      status = bpl_broadcast(r.world, recv.data(), n, BPL_DTYPE_F32, 0, nullptr);
    } else if (which == "allgather") {
      status = bpl_allgather(r.world, send.data(), recv.data(), n, BPL_DTYPE_F32, nullptr);
    } else if (which == "reduce_scatter") {
      status = bpl_reduce_scatter(r.world, send.data(), recv.data(), n, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    } else if (which == "alltoall") {
      status = bpl_alltoall(r.world, send.data(), recv.data(), n, BPL_DTYPE_F32, nullptr);
    } else if (which == "gather") {
      status = bpl_gather(r.world, send.data(), recv.data(), n, BPL_DTYPE_F32, 0, nullptr);
    } else if (which == "scatter") {
      status = bpl_scatter(r.world, send.data(), recv.data(), n, BPL_DTYPE_F32, 0, nullptr);
    } else if (which == "allgatherv" || which == "alltoallv") {  // each rank takes every block to hold n
      std::vector<int64_t> counts(blocks, n), displs(blocks);
      for (size_t q = 0; q < blocks; ++q) displs[q] = n * static_cast<int64_t>(q);
      status = which == "allgatherv"
                   ? bpl_allgatherv(r.world, send.data(), n, recv.data(), counts.data(), displs.data(), BPL_DTYPE_F32, nullptr)
                   : bpl_alltoallv(r.world, send.data(), counts.data(), displs.data(), recv.data(), counts.data(),
                                   displs.data(), BPL_DTYPE_F32, nullptr);
    } else if (which == "recv_any") {  // rank 0 waits for a message nobody sends, the others for rank 0
      int32_t source = -1;
      status = r.rank == 0 ? bpl_recv_any(r.world, recv.data(), 16, BPL_DTYPE_F32, 7, &source, nullptr)
                           : bpl_barrier(r.world, nullptr);
    } else if (which == "sendrecv" || classes || short_one) {
      if (r.rank == 0) status = bpl_send(r.world, send.data(), n, BPL_DTYPE_F32, 1, 7, nullptr);
      if (r.rank == 1) status = bpl_recv(r.world, recv.data(), n, BPL_DTYPE_F32, 0, 7, nullptr);
    }
  }
  report(r, "mismatch", status, start, " cpu_ms=" + std::to_string(cpu_ms() - cpu_before));
  const bool intact = std::all_of(send.end() - kGuard, send.end(), [&](float v) { return v == kGuardValue; }) &&
                      std::all_of(recv.end() - kGuard, recv.end(), [&](float v) { return v == kGuardValue; });
  std::printf("rank %d: guard %s after 0 ms: %s\n", r.rank, intact ? "BPL_OK" : "BPL_ERR_INTERNAL",
              intact ? "" : "a write past the end of a buffer");
  std::fflush(stdout);
  if (status != BPL_OK) retry_fails_at_once(r);
  // Under mpirun a rank that exits with an error ends the job: the others first get to their outcome.
  if (r.backend == "mpi") std::this_thread::sleep_for(std::chrono::milliseconds(r.timeout_ms + 1000));
  finalize(r);
  return status == BPL_OK ? 0 : 3;
}

// Test 9: bpl_init and bpl_finalize back to back, BPL_TEST_CYCLES times, each world's allreduce checked:
// rank R reports "cycles" BPL_OK with the number done, or the first failure and its cycle.
int reinit_cycles() {
  const int cycles = env_int("BPL_TEST_CYCLES", 30);
  const int rank = env_int("RANK", env_int("OMPI_COMM_WORLD_RANK", -1));
  const auto start = Clock::now();
  for (int cycle = 0; cycle < cycles; ++cycle) {
    bpl_runtime* runtime = nullptr;
    bpl_status status = bpl_init(nullptr, &runtime);
    std::string what = status == BPL_OK ? "" : bpl_last_error();
    if (status == BPL_OK) {
      bpl_comm* world = nullptr;
      int32_t size = 0;
      bpl_comm_world(runtime, &world);
      bpl_comm_size(world, &size);
      int64_t value = rank + 1 + cycle;
      status = bpl_allreduce(world, &value, &value, 1, BPL_DTYPE_I64, BPL_OP_SUM, nullptr);
      if (status != BPL_OK) what = bpl_last_error();
      if (status == BPL_OK && value != size * (size + 1) / 2 + static_cast<int64_t>(size) * cycle) {
        status = BPL_ERR_INTERNAL;
        what = "the allreduce gave " + std::to_string(value);
      }
      const bpl_status finalized = bpl_finalize(runtime);
      if (status == BPL_OK && finalized != BPL_OK) {
        status = finalized;
        what = bpl_last_error();
      }
    }
    if (status != BPL_OK) {
      std::printf("rank %d: cycles %s after %lld ms: cycle %d: %s\n", rank, bpl_status_name(status),
                  static_cast<long long>(ms_since(start)), cycle, what.c_str());
      return 3;
    }
  }
  std::printf("rank %d: cycles BPL_OK after %lld ms: %d cycles\n", rank, static_cast<long long>(ms_since(start)), cycles);
  return 0;
}

// Test 9 (mpi): rank 0's allreduce times out (rank 1 sleeps through it, until mpirun ends the job),
// which fails MPI for its process; it then finalizes and calls bpl_init again ("reinit"), which must
// be refused at once.
int reinit_after_failure() {
  Rank r = join();
  if (r.rank != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  }
  int64_t value = 1;
  auto start = Clock::now();
  report(r, "allreduce", bpl_allreduce(r.world, &value, &value, 1, BPL_DTYPE_I64, BPL_OP_SUM, nullptr), start);
  finalize(r);
  start = Clock::now();
  bpl_runtime* again = nullptr;
  const bpl_status status = bpl_init(nullptr, &again);
  report(r, "reinit", status, start);
  if (status == BPL_OK) bpl_finalize(again);
  return 0;
}

// Test 10: rank 0 leaves the job without a word (it exits after a barrier); the others stay idle for
// 2 s, calling nothing, and report "idle" with the CPU time their process used meanwhile.
int idle_after_rank0_exits() {
  Rank r = join();
  const bool finalizes = env_text("BPL_TEST_CASE") == "finalize";
  bpl_status status = bpl_barrier(r.world, nullptr);
  if (r.rank == 0) {
    if (finalizes) finalize(r);
    // Not before the others' barrier completed too (over TCP a peer may still be finishing it).
    if (!finalizes) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::fflush(stdout);
    std::_Exit(0);
  }
  // Rank 0 is gone by then (when it finalizes, its barrier waits for the others until the timeout).
  std::this_thread::sleep_for(std::chrono::milliseconds(finalizes ? r.timeout_ms + 1000 : 300));
  const int64_t before = cpu_ms();
  auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  report(r, "idle", status, start, " cpu_ms=" + std::to_string(cpu_ms() - before));
  std::vector<float> data(16, 1.0f);
  start = Clock::now();
  report(r, "next", bpl_allreduce(r.world, data.data(), data.data(), 16, BPL_DTYPE_F32, BPL_OP_SUM, nullptr), start);
  finalize(r);
  return 0;
}

// Test 11 (mpi): rank 1 stops before bpl_init (its helper kills it after T + 6 s); the others init.
int stop_before_init() {
  if (env_int("OMPI_COMM_WORLD_RANK", -1) == 1) stop_self_until_killed(kTimeoutMs + 6000);
  Rank r = join();
  finalize(r);
  return 0;
}

// Test 8: joins and leaves; the rendezvous tests start it with conflicting launch variables.
int join_and_leave() {
  Rank r = join();
  std::printf("rank %d: joined a world of %d\n", r.rank, r.size);
  bpl_finalize(r.runtime);
  return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* The tests.                                                                                     */

class Fault : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "mpi" && !mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  }
  const std::string& backend() const { return GetParam(); }
  bool is_mpi() const { return GetParam() == "mpi"; }
  // T of the mismatch jobs: their ranks that fail at once wait T + 1 s on MPI (mismatched_collectives),
  // and mpirun's ranks meet without the store whose rendezvous needs T to outlast loading the plugin.
  std::string mismatch_timeout() const { return is_mpi() ? "1500" : std::to_string(kTimeoutMs); }
};

// Every peer `message` names, as "rank N of this communicator" (the cause) or as "the connection to
// rank N" (what was seen of it from another machine), is `culprit`: a survivor never names another
// survivor. With `may_not_know`, naming none is allowed (a rank alone on its machine cannot see a
// peer's process, and may not learn what the others saw when the store's host is the one that failed).
// Where the message reports the communicator's first failure, what this rank saw itself ("; here: …",
// a survivor's connection closing after that failure, say) is context, not the culprit.
void expect_names_only(const std::string& message, int culprit, bool may_not_know = false) {
  const std::regex named("rank (\\d+) of this communicator|the connection to rank (\\d+)");
  const size_t first_failure = message.find("the communicator's first failure");
  const std::string claim =
      first_failure == std::string::npos ? message : message.substr(0, message.find("; here: ", first_failure));
  int names = 0;
  for (std::sregex_iterator it(claim.begin(), claim.end(), named), end; it != end; ++it, ++names) {
    EXPECT_EQ(std::stoi((*it)[1].matched ? (*it)[1] : (*it)[2]), culprit) << "names the wrong rank: " << message;
  }
  if (!may_not_know) {
    EXPECT_GT(names, 0) << "names no rank: " << message;
  }
}

std::vector<int> survivors_of(int faulty, int size) {
  std::vector<int> survivors;
  for (int r = 0; r < size; ++r) {
    if (r != faulty) survivors.push_back(r);
  }
  return survivors;
}

// 1. A rank SIGKILLed in a 64 MiB allreduce: every survivor fails with REMOTE naming it, within 2T.
//    Open MPI without fault tolerance tears the job down instead: mpirun exits non-zero naming the rank.
void expect_killed_rank_is_a_remote_error_on_every_survivor(const std::string& backend, int killed) {
  Job job = run_job(backend, 3, "kill_mid_allreduce", {{"BPL_TEST_FAULTY_RANK", std::to_string(killed)}});
  if (backend == "mpi") {
    const ProcessResult& mpirun = job.processes.front();
    EXPECT_FALSE(mpirun.timed_out) << job.output;
    EXPECT_NE(mpirun.exit_code, 0) << job.output;
    EXPECT_NE(job.output.find("process rank " + std::to_string(killed)), std::string::npos) << job.output;
    EXPECT_NE(job.output.find("signal 9"), std::string::npos) << job.output;
    EXPECT_EQ(job.output.find("every allreduce succeeded"), std::string::npos) << job.output;
    std::printf("mpi: mpirun ended the job %.1f s after it started\n", mpirun.seconds);
    return;
  }
  EXPECT_EQ(job.processes[static_cast<size_t>(killed)].signal, SIGKILL) << job.output;
  int first_failed_op = 0;
  for (int rank : survivors_of(killed, 3)) {
    EXPECT_FALSE(job.processes[static_cast<size_t>(rank)].timed_out) << job.output;
    EXPECT_EVENT(job, rank, "failed", "BPL_ERR_REMOTE");
    const Event& failed = *job.event(rank, "failed");
    EXPECT_LT(failed.ms, 2 * kTimeoutMs) << failed.message;
    // Named by the connection's address or, when Gloo names an unknown one, as an ended process.
    expect_names_only(failed.message, killed, backend == "gloo_machines" && rank == 2 && killed == 0);
    // The allreduce the rank died in: #2 or, where an allreduce of 64 MiB takes less than 30 ms (shared
    // memory), a later one. Every survivor fails in it or in the next: a survivor whose part of the
    // result was complete before the rank died (the dead rank had read what it needed of this one, and
    // this one all it needed of the dead rank) returns it, correct, and fails at its next call, while a
    // survivor still waiting for the dead rank's last step fails at once (seen on shared memory once in
    // about 50 runs; on machines of their own, rank 2's machine's result is often complete first).
    std::smatch op;
    ASSERT_TRUE(std::regex_search(failed.message, op, std::regex("bpl_allreduce #(\\d+) on world \\(rank " +
                                                                     std::to_string(rank) + " of 3\\)")))
        << failed.message;
    const int failed_op = std::stoi(op[1]);
    EXPECT_GE(failed_op, 2) << failed.message;
    if (first_failed_op == 0) first_failed_op = failed_op;
    EXPECT_LE(std::abs(failed_op - first_failed_op), 1) << job.output;
    std::printf("%s: rank %d failed %lld ms after the allreduce started: %s\n", backend.c_str(), rank,
                static_cast<long long>(failed.ms), failed.message.c_str());
    // 4. The failed communicator refuses the next operation at once, with the cause.
    EXPECT_EVENT(job, rank, "retry", "BPL_ERR_REMOTE");
    EXPECT_LT(job.event(rank, "retry")->ms, 50);
    EXPECT_NE(job.event(rank, "retry")->message.find("not started: the communicator failed earlier, at bpl_allreduce #" +
                                                     std::to_string(failed_op)),
              std::string::npos)
        << job.event(rank, "retry")->message;
    EXPECT_EVENT(job, rank, "finalize", "BPL_OK");
    EXPECT_LT(job.event(rank, "finalize")->ms, kTimeoutMs + 1000);
  }
}

TEST_P(Fault, KilledRankIsARemoteErrorNamingItOnEverySurvivor) {
  expect_killed_rank_is_a_remote_error_on_every_survivor(backend(), 1);
}

// Survivor `rank` of a job whose rank 1 was killed: it did not time out and failed with REMOTE in
// `op` within `within_ms`. Its event, or null (the failure is recorded).
const Event* expect_remote_failure_in(const Job& job, int rank, const std::string& op, int64_t within_ms) {
  EXPECT_FALSE(job.processes[static_cast<size_t>(rank)].timed_out) << job.output;
  const Event* failed = job.event(rank, "failed");
  EXPECT_NE(failed, nullptr) << "rank " << rank << " reported no failure:\n" << job.output;
  if (failed == nullptr) return nullptr;
  EXPECT_EQ(failed->status, "BPL_ERR_REMOTE") << "rank " << rank << ":\n" << job.output;
  EXPECT_LT(failed->ms, within_ms) << failed->message;
  EXPECT_NE(failed->message.find(op), std::string::npos) << failed->message;
  return failed;
}

// A rank killed in one of ABI 1.3's collectives (alltoallv: every pair of ranks exchanges) is named the
// same way. (Under mpirun the killed rank ends the job, as the test above checks for an allreduce.)
TEST_P(Fault, KilledRankInAlltoallvIsARemoteErrorNamingItOnEverySurvivor) {
  if (is_mpi()) GTEST_SKIP() << "under mpirun a killed rank ends the whole job (KilledRankIsARemoteError... checks it)";
  const Job job = run_job(backend(), 3, "kill_mid_alltoallv", {{"BPL_TEST_FAULTY_RANK", "1"}});
  EXPECT_EQ(job.processes[1].signal, SIGKILL) << job.output;
  for (int rank : survivors_of(1, 3)) {
    const Event* failed = expect_remote_failure_in(job, rank, "bpl_alltoallv", 2 * kTimeoutMs);
    if (failed != nullptr) {
      EXPECT_NE(failed->message.find("rank 1"), std::string::npos) << failed->message;
    }
  }
}

// 1c. A rank stopped in a 64 MiB broadcast from rank 0, then killed 600 ms later: the root's send to it
//     had filled its socket's buffers and was held up mid-write when it died, which Gloo's pairs do not
//     fail by themselves (its TCP transport wakes only the waits it has not begun writing for). Every
//     survivor still fails at once with REMOTE naming it, not at its timeout.
TEST_P(Fault, RankKilledWhileASendToItWasHeldUpIsARemoteErrorOnEverySurvivor) {
  if (is_mpi()) GTEST_SKIP() << "under mpirun a killed rank ends the whole job (KilledRankIsARemoteError... checks it)";
  constexpr int kStoppedMs = 600;
  const Job job = run_job(backend(), 3, "kill_mid_broadcast", {{"BPL_TEST_STOPPED_MS", std::to_string(kStoppedMs)}});
  EXPECT_EQ(job.processes[1].signal, SIGKILL) << job.output;
  for (int rank : survivors_of(1, 3)) {
    const Event* failed = expect_remote_failure_in(job, rank, "bpl_broadcast", kStoppedMs + 1000);
    if (failed == nullptr) continue;
    expect_names_only(failed->message, 1);
    std::printf("%s: rank %d failed %lld ms after its broadcast started: %s\n", backend().c_str(), rank,
                static_cast<long long>(failed->ms), failed->message.c_str());
  }
}

// Rank 0 hosts the store through which gloo's ranks agree on a communicator's first failure: without
// it, each survivor still names rank 0, never the other survivor whose connections closed after its
// own failure.
TEST_P(Fault, KilledStoreHostIsARemoteErrorNamingItOnEverySurvivor) {
  expect_killed_rank_is_a_remote_error_on_every_survivor(backend(), 0);
}

// 2 and 4. A rank SIGSTOPped: survivors fail with TIMEOUT after at least T/2 and at most T + 1 s,
// having used at most a quarter of that time on a core (no wait spins); the world then refuses
// operations at once, a split without the stopped rank keeps working, and (gloo) the survivors can
// start a new job of their own.
void expect_stopped_rank_is_a_timeout_on_every_survivor(const std::string& backend, int stopped,
                                                        std::map<std::string, std::string> env = {}) {
  env["BPL_TEST_FAULTY_RANK"] = std::to_string(stopped);
  const Job job = run_job(backend, 3, "stop_mid_allreduce", env);
  const bool is_mpi = backend == "mpi";
  for (int rank : survivors_of(stopped, 3)) {
    EXPECT_EVENT(job, rank, "failed", "BPL_ERR_TIMEOUT");
    const Event& failed = *job.event(rank, "failed");
    EXPECT_GE(failed.ms, kTimeoutMs / 2) << failed.message;
    EXPECT_LE(failed.ms, kTimeoutMs + 1000) << failed.message;
    std::printf("%s: rank %d timed out %lld ms after the operation started: %s\n", backend.c_str(), rank,
                static_cast<long long>(failed.ms), failed.message.c_str());
    // A rank alone on its machine can only name the stopped rank if another survivor told it.
    const bool alone = backend == "gloo_machines" && rank == 2;
    expect_names_only(failed.message, stopped, alone && stopped == 0);
    if (!alone) {
      EXPECT_NE(failed.message.find("rank " + std::to_string(stopped) + " of this communicator, process "),
                std::string::npos)
          << failed.message;
      EXPECT_NE(failed.message.find(" on this machine, is stopped"), std::string::npos) << failed.message;
    }
    std::smatch cpu;
    ASSERT_TRUE(std::regex_search(failed.message, cpu, std::regex("cpu_ms=(\\d+)"))) << failed.message;
    EXPECT_LT(std::stoll(cpu[1]), failed.ms / 4) << "the wait spun a core: " << failed.message;
    EXPECT_EVENT(job, rank, "retry", "BPL_ERR_TIMEOUT");
    EXPECT_LT(job.event(rank, "retry")->ms, 50);
    EXPECT_EVENT(job, rank, "survivors", "BPL_OK");
    EXPECT_NE(job.event(rank, "survivors")->message.find("sum=2"), std::string::npos) << job.output;
    EXPECT_EVENT(job, rank, "finalize", "BPL_OK");
    EXPECT_LT(job.event(rank, "finalize")->ms, kTimeoutMs + 1000) << job.output;
    if (!is_mpi) {
      EXPECT_EVENT(job, rank, "new_job", "BPL_OK");
      EXPECT_NE(job.event(rank, "new_job")->message.find("sum=2"), std::string::npos) << job.output;
    }
  }
}

TEST_P(Fault, StoppedRankIsATimeoutOnEverySurvivor) {
  expect_stopped_rank_is_a_timeout_on_every_survivor(backend(), 1);
}

// The same in alltoallv (ABI 1.3), whose transfers wait on each pair of ranks.
TEST_P(Fault, StoppedRankInAlltoallvIsATimeoutOnEverySurvivor) {
  expect_stopped_rank_is_a_timeout_on_every_survivor(backend(), 1, {{"BPL_TEST_OP", "alltoallv"}});
}

// The store's host stopped: a survivor's report of the failure through the store, and its finalize,
// give up on the store within their own short bound instead of waiting for it.
TEST_P(Fault, StoppedStoreHostIsATimeoutOnEverySurvivor) {
  expect_stopped_rank_is_a_timeout_on_every_survivor(backend(), 0);
}

// On machines of two ranks, rank 2 (alone on its machine) sees only that the other machine's leader,
// rank 0, does not come, while rank 0 sees rank 1 stopped. With rank 0 late, rank 2's wait ends first,
// and it still names rank 1: a timeout a rank cannot explain waits a moment for the explanation of a
// rank on another machine.
TEST(FaultGloo, StoppedRankIsNamedOnAnotherMachineThoughItsLeaderIsLate) {
  expect_stopped_rank_is_a_timeout_on_every_survivor("gloo_machines", 1, {{"BPL_TEST_RANK0_LATE_MS", "300"}});
}

// 3. A wait shorter than the communicator's timeout is a poll: TIMEOUT, still in flight, communicator
//    usable. A longer one ends at the communicator's timeout (as set by bpl_comm_set_timeout), which
//    then fails the communicator.
TEST_P(Fault, PerCallTimeoutsShorterAndLongerThanTheCommunicators) {
  constexpr int kCommTimeoutMs = 1500;
  Job job = run_job(backend(), 2, "per_call_timeouts",
                    {{"BPL_TIMEOUT_MS", "6000"}, {"BPL_TEST_COMM_TIMEOUT_MS", std::to_string(kCommTimeoutMs)}});
  EXPECT_EVENT(job, 0, "set_timeout", "BPL_OK");
  EXPECT_NE(job.output.find("rank 0: comm timeout 1500 ms"), std::string::npos) << job.output;
  EXPECT_EVENT(job, 0, "short_wait", "BPL_ERR_TIMEOUT");
  const Event& short_wait = *job.event(0, "short_wait");
  EXPECT_GE(short_wait.ms, kCommTimeoutMs / 5 - 10);
  EXPECT_LT(short_wait.ms, kCommTimeoutMs / 5 + 500);
  EXPECT_NE(short_wait.message.find("still in flight"), std::string::npos) << short_wait.message;
  EXPECT_EVENT(job, 0, "test", "BPL_OK");
  EXPECT_NE(job.event(0, "test")->message.find("done=0"), std::string::npos) << job.output;
  EXPECT_EVENT(job, 0, "long_wait", "BPL_ERR_TIMEOUT");
  std::smatch since_post;
  ASSERT_TRUE(std::regex_search(job.event(0, "long_wait")->message, since_post, std::regex("since_post=(\\d+)")));
  EXPECT_GE(std::stoi(since_post[1]), kCommTimeoutMs - 50) << job.output;
  EXPECT_LE(std::stoi(since_post[1]), kCommTimeoutMs + 1000) << job.output;
  std::printf("%s: a %d ms wait timed out after %lld ms; a %d ms wait ended %s ms after the post\n", backend().c_str(),
              kCommTimeoutMs / 5, static_cast<long long>(short_wait.ms), 10 * kCommTimeoutMs, since_post[1].str().c_str());
  EXPECT_EVENT(job, 0, "retry", "BPL_ERR_TIMEOUT");
  EXPECT_LT(job.event(0, "retry")->ms, 50);
  // The free returns at once (the operation ended); MPI, which cannot cancel it, says so with TIMEOUT.
  ASSERT_NE(job.event(0, "free"), nullptr) << job.output;
  EXPECT_LT(job.event(0, "free")->ms, 100) << job.output;
  EXPECT_EVENT(job, 0, "finalize", "BPL_OK");
}

// 5. bpl_comm_abort from another thread releases a blocked wait within 1 s; a second abort is a no-op;
//    later operations fail at once with ABORTED; the free stays bounded by the timeout.
TEST_P(Fault, AbortFromAnotherThreadReleasesAWait) {
  Job job = run_job(backend(), 2, "abort_from_another_thread", {});
  EXPECT_EVENT(job, 0, "abort", "BPL_OK");
  EXPECT_EVENT(job, 0, "abort_again", "BPL_OK");
  EXPECT_EVENT(job, 0, "wait", "BPL_ERR_ABORTED");
  std::smatch released;
  ASSERT_TRUE(std::regex_search(job.event(0, "wait")->message, released, std::regex("released_after_abort=(-?\\d+)")));
  EXPECT_LT(std::stoi(released[1]), 1000) << job.output;
  std::printf("%s: the wait returned %s ms after the abort\n", backend().c_str(), released[1].str().c_str());
  EXPECT_EVENT(job, 0, "retry", "BPL_ERR_ABORTED");
  EXPECT_LT(job.event(0, "retry")->ms, 50);
  ASSERT_NE(job.event(0, "free"), nullptr) << job.output;
  EXPECT_LE(job.event(0, "free")->ms, kTimeoutMs + 1500) << job.output;
  EXPECT_EVENT(job, 0, "finalize", "BPL_OK");
}

// 6. A rank that exits with status 0 in the middle of a collective: the others fail, none succeeds.
TEST_P(Fault, RankExitingCleanlyMidCollectiveFailsTheOthers) {
  for (const std::string which : {"exit", "finalize"}) {
    SCOPED_TRACE(which);
    Job job = run_job(backend(), 3, "exit_cleanly_mid_allreduce", {{"BPL_TEST_CASE", which}});
    EXPECT_EQ(job.output.find("every allreduce succeeded"), std::string::npos) << job.output;
    if (is_mpi()) {
      // Open MPI ends the job when a rank exits without MPI_Finalize, or the survivors time out and
      // leave without it.
      EXPECT_FALSE(job.processes.front().timed_out) << job.output;
      EXPECT_NE(job.processes.front().exit_code, 0) << job.output;
      continue;
    }
    SCOPED_TRACE(job.output);
    for (int rank : {0, 2}) {
      const Event* failed = job.event(rank, "failed");
      ASSERT_NE(failed, nullptr) << job.output;
      EXPECT_LE(failed->ms, kTimeoutMs + 1500) << failed->message;
      if (which == "finalize" && failed->status == "BPL_ERR_MISMATCH") {
        // bpl_finalize's barrier met the others' allreduce: named as what rank 1 called.
        EXPECT_NE(failed->message.find("rank 1 calls bpl_finalize"), std::string::npos) << failed->message;
      } else {
        EXPECT_TRUE(failed->status == "BPL_ERR_REMOTE" || failed->status == "BPL_ERR_TIMEOUT") << failed->message;
        expect_names_only(failed->message, 1, backend() == "gloo_machines" && rank == 2);
      }
      EXPECT_EQ(job.processes[static_cast<size_t>(rank)].exit_code, 3) << job.output;
    }
  }
}

// 6b. Rank 0 hosts the store, which ends with its process. Here it fails first (its segment peer, rank
//     1, exits) and finalizes at once, while rank 2, on a machine of its own, comes to the collective
//     BPL_TEST_RANK2_LATE_MS late: rank 0 waits at finalize until rank 2 has left too, so rank 2 still
//     reads the communicator's first failure and names rank 1, not the connection rank 0's failure closed.
TEST(FaultGloo, StoresHostWaitsAtFinalizeForALateSurvivorToReadTheFailure) {
  Job job = run_job("gloo_machines", 3, "exit_cleanly_mid_allreduce",
                    {{"BPL_TEST_CASE", "exit"}, {"BPL_TEST_RANK2_LATE_MS", "400"}});
  SCOPED_TRACE(job.output);
  EXPECT_EVENT(job, 0, "failed", "BPL_ERR_REMOTE");
  EXPECT_EVENT(job, 2, "failed", "BPL_ERR_REMOTE");
  const Event* late = job.event(2, "failed");
  ASSERT_NE(late, nullptr);
  EXPECT_NE(late->message.find("the communicator's first failure, seen by rank 0"), std::string::npos) << late->message;
  expect_names_only(late->message, 1);
  EXPECT_EVENT(job, 0, "finalize", "BPL_OK");
  EXPECT_LT(job.event(0, "finalize")->ms, kTimeoutMs) << "the store's host waits within a bound";
}

// 8. A rank SIGKILLed during a ring of sends and recvs (through shared memory's mailboxes, or Gloo's
//    pairs over TCP): both its neighbours fail with REMOTE naming it, well within the timeout.
TEST_P(Fault, KilledRankInSendsAndRecvsIsARemoteErrorOnItsPeers) {
  if (is_mpi()) GTEST_SKIP() << "mpirun ends the whole job when a rank is killed (the KilledRank test checks it)";
  Job job = run_job(backend(), 3, "kill_mid_exchange", {});
  EXPECT_EQ(job.processes[1].signal, SIGKILL) << job.output;
  EXPECT_EQ(job.output.find("every exchange succeeded"), std::string::npos) << job.output;
  for (int rank : {0, 2}) {
    EXPECT_FALSE(job.processes[rank].timed_out) << job.output;
    EXPECT_EVENT(job, rank, "failed", "BPL_ERR_REMOTE");
    const Event& failed = *job.event(rank, "failed");
    EXPECT_LT(failed.ms, kTimeoutMs) << failed.message;
    expect_names_only(failed.message, 1);  // a rank on another machine may only know its connection ended
    EXPECT_EQ(job.processes[rank].exit_code, 3) << job.output;
    std::printf("gloo: rank %d failed %lld ms into its exchange: %s\n", rank, static_cast<long long>(failed.ms),
                failed.message.c_str());
  }
}

// 7. BPL_DEBUG=detail: mismatched collectives are MISMATCH on every rank, naming the differing field
//    (and the rank, except where counts of alltoallv do not pair up: no rank's are wrong on their own).
TEST_P(Fault, DetailModeReportsMismatchedCollectivesOnEveryRank) {
  const std::map<std::string, std::string> differs = {{"op", "differ in: op"},     {"count", "differ in: count"},
                                                      {"skip", "differ in: op"},   {"root", "differ in: root"},
                                                      {"alltoallv", "differ in: counts"}};
  for (const auto& [which, field] : differs) {
    SCOPED_TRACE(which);
    Job job = run_job(backend(), 3, "mismatched_collectives",
                      {{"BPL_DEBUG", "detail"}, {"BPL_TEST_CASE", which}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EVENT(job, rank, "mismatch", "BPL_ERR_MISMATCH");
      const std::string& message = job.event(rank, "mismatch")->message;
      EXPECT_NE(message.find("BPL_DEBUG=detail: ranks disagree"), std::string::npos) << message;
      EXPECT_NE(message.find(field), std::string::npos) << message;
      if (which != "alltoallv") {
        EXPECT_NE(message.find("rank 1 differs from the others"), std::string::npos) << message;
      }
      EXPECT_EVENT(job, rank, "retry", "BPL_ERR_MISMATCH");
    }
    std::printf("%s %s: %s\n", backend().c_str(), which.c_str(), job.event(0, "mismatch")->message.c_str());
  }
}

// 7. Without detail, ranks that disagree on a transfer's size never write out of bounds, never crash,
//    and never all succeed. With 64 Ki elements (above every library's eager limit) every rank reports
//    MISMATCH: at once through shared memory; on MPI, at once where a rank receives (the probe that
//    matches a large collective's message or a recv checks its size first; a recv's sender completes:
//    MPI delivered the message) and a rank that only sends at its timeout, from the fingerprints;
//    over Gloo's TCP pairs, whose messages then never match, when the operation stalls, from the
//    ranks' records in the store. The sanitizer build runs this too.
TEST_P(Fault, MismatchedSizesWithoutDetailAreAnErrorOnEveryRankAndNeverCorruptMemory) {
  for (const std::string which :
       {"allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "alltoall", "gather", "scatter", "allgatherv",
        "alltoallv", "sendrecv"}) {
    SCOPED_TRACE(which);
    Job job = run_job(backend(), 2, "mismatched_collectives", {{"BPL_TEST_CASE", which}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
    EXPECT_EQ(job.output.find("AddressSanitizer"), std::string::npos) << job.output;
    const ProcessResult& launched = job.processes.front();
    EXPECT_FALSE(launched.timed_out) << job.output;
    for (int rank = 0; rank < 2; ++rank) {
      if (!is_mpi()) {
        EXPECT_EQ(job.processes[static_cast<size_t>(rank)].signal, 0) << job.output;
      }
      EXPECT_EVENT(job, rank, "guard", "BPL_OK");
      // MPI delivers a send whole (the receiver takes it into a buffer of its own and fails): the
      // sender's part succeeded.
      if (is_mpi() && which == "sendrecv" && rank == 0) continue;
      EXPECT_EVENT(job, rank, "mismatch", "BPL_ERR_MISMATCH");
      const Event& mismatch = *job.event(rank, "mismatch");
      EXPECT_LE(mismatch.ms, std::stoi(mismatch_timeout()) + 2000) << mismatch.message;
      std::printf("%s %s: rank %d after %lld ms: %s\n", backend().c_str(), which.c_str(), rank,
                  static_cast<long long>(mismatch.ms), mismatch.message.c_str());
    }
  }
}

// 7. A recv whose sender sends another size, where the MPI backend posts the recv at once (a message it
//    copies eagerly) or the sender's message is not one (it travels under a tag apart, mpi_comm.h):
//    the recv is MISMATCH naming both sizes, at once for a shorter eager message, at the timeout for
//    one of the other class; nothing is written past its buffer. (The sender's own outcome differs by
//    backend: MPI completes an eager send, and times out a large one nobody receives.)
TEST_P(Fault, RecvOfAnotherSizeThanItsSendIsMismatchNamingBoth) {
  for (const std::string which : {"sendrecv_short", "sendrecv_classes"}) {
    SCOPED_TRACE(which);
    Job job = run_job(backend(), 2, "mismatched_collectives", {{"BPL_TEST_CASE", which}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
    EXPECT_FALSE(job.processes.front().timed_out) << job.output;
    for (int rank = 0; rank < 2; ++rank) EXPECT_EVENT(job, rank, "guard", "BPL_OK");
    EXPECT_EVENT(job, 1, "mismatch", "BPL_ERR_MISMATCH");
    const Event& mismatch = *job.event(1, "mismatch");
    EXPECT_LE(mismatch.ms, std::stoi(mismatch_timeout()) + 2000) << mismatch.message;
    const std::string sent = which == "sendrecv_classes" ? "8192" : "2000", expected = which == "sendrecv_classes" ? "2000" : "2400";
    EXPECT_NE(mismatch.message.find(sent + " bytes"), std::string::npos) << mismatch.message;
    EXPECT_NE(mismatch.message.find(expected + " bytes"), std::string::npos) << mismatch.message;
    std::printf("%s %s: rank 1 after %lld ms: %s\n", backend().c_str(), which.c_str(), static_cast<long long>(mismatch.ms),
                mismatch.message.c_str());
  }
}

// 7. A recv from any rank that nobody answers is a point-to-point wait that ran out: TIMEOUT on its
//    rank, never a collective's MISMATCH beside the ranks that wait in a barrier for it (they fail,
//    and say that rank 0 is in the recv).
TEST_P(Fault, UnansweredRecvFromAnyRankIsATimeoutNotACollectiveMismatch) {
  Job job = run_job(backend(), 3, "mismatched_collectives", {{"BPL_TEST_CASE", "recv_any"}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
  EXPECT_FALSE(job.processes.front().timed_out) << job.output;
  const Event* recv = job.event(0, "mismatch");
  ASSERT_NE(recv, nullptr) << job.output;
  EXPECT_EQ(recv->status, "BPL_ERR_TIMEOUT") << recv->message;
  EXPECT_NE(recv->message.find("recv"), std::string::npos) << recv->message;
  for (int rank = 1; rank < 3; ++rank) {
    const Event* barrier = job.event(rank, "mismatch");
    ASSERT_NE(barrier, nullptr) << job.output;
    EXPECT_NE(barrier->status, "BPL_OK") << barrier->message;
    std::printf("%s: rank %d: %s: %s\n", backend().c_str(), rank, barrier->status.c_str(), barrier->message.c_str());
  }
  std::printf("%s: rank 0: %s after %lld ms: %s\n", backend().c_str(), recv->status.c_str(),
              static_cast<long long>(recv->ms), recv->message.c_str());
}

// 7. A small count mismatch (99 and 100 elements, below every eager limit), a rank that skips a
//    collective, and ranks that move the same bytes but disagree on the dtype, the reduce op or a
//    reduce's root: no rank crashes, none writes out of bounds, no rank's wait spins, and every rank
//    reports MISMATCH naming rank 1 (the ranks' messages never match: gloo's and the MPI plugin's schedules tag them with the
//    call's fingerprint, and shared memory compares it at every step).
TEST_P(Fault, SmallMismatchesAndSkippedCollectivesWithoutDetailAreErrors) {
  for (const std::string which : {"count", "skip", "dtype", "reduce_op", "reduce_root"}) {
    SCOPED_TRACE(which);
    // On MPI, rank 2 of a reduce whose root ranks disagree on is a leaf of both trees: its part reaches
    // rank 0, which agrees with it, and it returns BPL_OK, as from MPI's own reduce; ranks 0 and 1 stall
    // and find the difference in the words of the ranks still in the operation.
    const bool leaf_returns = is_mpi() && which == "reduce_root";
    Job job = run_job(backend(), 3, "mismatched_collectives", {{"BPL_TEST_CASE", which}, {"BPL_TIMEOUT_MS", mismatch_timeout()}});
    EXPECT_EQ(job.output.find("AddressSanitizer"), std::string::npos) << job.output;
    EXPECT_FALSE(job.processes.front().timed_out) << job.output;
    for (int rank = 0; rank < 3; ++rank) {
      if (!is_mpi()) {
        EXPECT_EQ(job.processes[static_cast<size_t>(rank)].signal, 0) << job.output;
      }
      EXPECT_EVENT(job, rank, "guard", "BPL_OK");
      const Event* mismatch = job.event(rank, "mismatch");
      ASSERT_NE(mismatch, nullptr) << job.output;
      std::printf("%s %s: rank %d: %s after %lld ms: %s\n", backend().c_str(), which.c_str(), rank,
                  mismatch->status.c_str(), static_cast<long long>(mismatch->ms), mismatch->message.c_str());
      if (leaf_returns && rank == 2) {
        EXPECT_EQ(mismatch->status, "BPL_OK") << mismatch->message;
        continue;
      }
      EXPECT_EQ(mismatch->status, "BPL_ERR_MISMATCH") << mismatch->message;
      // A wait for a peer that never comes uses no core: under a tenth of the time waited, beyond start-up.
      std::smatch cpu;
      ASSERT_TRUE(std::regex_search(mismatch->message, cpu, std::regex("cpu_ms=(\\d+)"))) << mismatch->message;
      EXPECT_LT(std::stoll(cpu[1]), 50 + mismatch->ms / 10) << "the wait spun: " << mismatch->message;
      // On machines of two ranks, ranks 0 and 1 find it in their segment, as MPI's ranks 0 and 1 do
      // without rank 2: two ranks, no majority.
      EXPECT_NE(mismatch->message.find(backend() == "gloo_machines" || leaf_returns ? "rank 1 calls"
                                                                                    : "rank 1 differs from the others"),
                std::string::npos)
          << mismatch->message;
      if (leaf_returns) {
        EXPECT_NE(mismatch->message.find("differ in: root; no word from rank 2"), std::string::npos) << mismatch->message;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Fault, ::testing::Values("gloo", "gloo_tcp", "gloo_machines", "mpi"),
                         [](const auto& info) { return info.param; });

// 9. bpl_init right after bpl_finalize, again and again, in every rank's process: each world is a new
//    one (no rank meets the store of the world before, whose host may still be ending it), through
//    shared memory and over TCP; and on MPI, which backplane initialises once and finalises at exit.
TEST(Reinit, InitRightAfterFinalizeWorksEveryTimeOnEveryBackend) {
  for (const std::string backend : {"gloo", "gloo_tcp", "mpi"}) {
    SCOPED_TRACE(backend);
    if (backend == "mpi" && !mpi_backend_built()) continue;
    Job job = run_job(backend, 2, "reinit_cycles", {{"BPL_TEST_CYCLES", "40"}}, std::chrono::seconds(120));
    for (int rank = 0; rank < 2; ++rank) EXPECT_EVENT(job, rank, "cycles", "BPL_OK");
    for (const auto& process : job.processes) EXPECT_EQ(process.exit_code, 0) << job.output;  // mpi: MPI_Finalize at exit
    std::printf("%s: rank 0: %s\n", backend.c_str(), job.event(0, "cycles") ? job.event(0, "cycles")->message.c_str() : "");
  }
}

// 9b. On MPI, a process whose communicator failed cannot make a new world (duplicating MPI_COMM_WORLD
//     would wait for the failed rank): bpl_init after bpl_finalize is refused at once, saying why.
TEST(FaultMpi, InitAfterAFailureIsRefusedSayingWhy) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  Job job = run_job("mpi", 2, "reinit_after_failure", {{"BPL_TIMEOUT_MS", "1000"}});
  EXPECT_FALSE(job.processes.front().timed_out) << job.output;
  EXPECT_EVENT(job, 0, "allreduce", "BPL_ERR_TIMEOUT");
  EXPECT_EVENT(job, 0, "reinit", "BPL_ERR_UNAVAILABLE");
  if (const Event* reinit = job.event(0, "reinit")) {
    EXPECT_LT(reinit->ms, 500) << reinit->message;
    EXPECT_NE(reinit->message.find("failed or was aborted earlier in this process"), std::string::npos) << reinit->message;
  }
  EXPECT_NE(job.output.find("MPI_Finalize skipped at exit"), std::string::npos) << job.output;
}

// 4. Idle ranks use no core while nothing happens, also after a peer left the job: over 2 s of calling
//    nothing after rank 0 exited, a survivor's process uses under 5% of a core. Their next call fails
//    at once naming rank 0.
TEST(FaultGloo, IdleSurvivorsOfAnExitedRankUseNoCore) {
  for (const std::string backend : {"gloo", "gloo_tcp"}) {
    SCOPED_TRACE(backend);
    Job job = run_job(backend, 3, "idle_after_rank0_exits", {});
    for (int rank : {1, 2}) {
      EXPECT_EVENT(job, rank, "idle", "BPL_OK");
      const Event* idle = job.event(rank, "idle");
      if (idle == nullptr) continue;
      std::smatch cpu;
      ASSERT_TRUE(std::regex_search(idle->message, cpu, std::regex("cpu_ms=(\\d+)"))) << job.output;
      EXPECT_LT(std::stoll(cpu[1]), 100) << "rank " << rank << " spun while idle: " << idle->message;
      std::printf("%s: rank %d used %s ms of CPU in 2 s idle\n", backend.c_str(), rank, cpu[1].str().c_str());
      EXPECT_EVENT(job, rank, "next", "BPL_ERR_REMOTE");
      if (const Event* next = job.event(rank, "next")) expect_names_only(next->message, 0);
    }
  }
}

// 7. Rank 0 finalizes alone: its barrier gives up on the others at the timeout and it exits. The
//    survivors' next call fails at once naming rank 0, which ended, not the rank it gave up waiting for
//    (on shared memory, rank 1 used to read rank 0's record as news of itself).
TEST(FaultGloo, ARankThatFinalizedAloneIsNamedAtTheSurvivorsNextCall) {
  for (const std::string backend : {"gloo", "gloo_tcp"}) {
    SCOPED_TRACE(backend);
    Job job = run_job(backend, 3, "idle_after_rank0_exits", {{"BPL_TEST_CASE", "finalize"}, {"BPL_TIMEOUT_MS", "1000"}});
    for (int rank : {1, 2}) {
      EXPECT_EVENT(job, rank, "next", "BPL_ERR_REMOTE");
      const Event* next = job.event(rank, "next");
      if (next == nullptr) continue;
      EXPECT_LT(next->ms, 500) << next->message;
      expect_names_only(next->message, 0);
      EXPECT_NE(next->message.find("has ended"), std::string::npos) << next->message;
      std::printf("%s: rank %d: %s\n", backend.c_str(), rank, next->message.c_str());
    }
  }
}

// bpl_comm_abort on gloo closes the connections: every peer in a collective learns of it at once,
// the third rank as well as the two the aborting rank's collective was exchanging with.
TEST(FaultGloo, AbortClosesTheConnectionsSoPeersFailAtOnce) {
  for (const std::string backend : {"gloo", "gloo_tcp"}) {
    SCOPED_TRACE(backend);
    Job job = run_job(backend, 3, "abort_notifies_peers", {});
    EXPECT_EVENT(job, 0, "abort", "BPL_OK");
    for (int rank : {1, 2}) {
      EXPECT_EVENT(job, rank, "failed", "BPL_ERR_REMOTE");
      EXPECT_LT(job.event(rank, "failed")->ms, 1000) << job.output;
      expect_names_only(job.event(rank, "failed")->message, 0);
      EXPECT_NE(job.event(rank, "failed")->message.find("aborted (bpl_comm_abort) by rank 0"), std::string::npos)
          << job.output;
    }
  }
}

// 5b. Abort from another thread releases a blocking call (not only a request's wait) within 1 s; on
//     gloo the third rank, in the same allreduce, fails at once too, naming the aborting rank. MPI
//     cannot tell its peers: rank 2 waits out its timeout there.
TEST_P(Fault, AbortFromAnotherThreadReleasesABlockingCall) {
  Job job = run_job(backend(), 3, "abort_blocking_call", {});
  EXPECT_EVENT(job, 0, "blocked", "BPL_ERR_ABORTED");
  std::smatch released;
  ASSERT_TRUE(std::regex_search(job.event(0, "blocked")->message, released, std::regex("released_after_abort=(-?\\d+)")));
  EXPECT_LT(std::stoi(released[1]), 1000) << job.output;
  EXPECT_GE(std::stoi(released[1]), 0) << job.output;
  EXPECT_EVENT(job, 0, "finalize", "BPL_OK");
  const Event* third = job.event(2, "blocked");
  ASSERT_NE(third, nullptr) << job.output;
  if (is_mpi()) {
    EXPECT_EQ(third->status, "BPL_ERR_TIMEOUT") << job.output;
  } else {
    EXPECT_EQ(third->status, "BPL_ERR_REMOTE") << job.output;
    EXPECT_LT(third->ms, 500 + 1000) << job.output;
    expect_names_only(third->message, 0);
  }
  std::printf("%s: the blocking call returned %s ms after the abort; rank 2: %s after %lld ms: %s\n", backend().c_str(),
              released[1].str().c_str(), third->status.c_str(), static_cast<long long>(third->ms), third->message.c_str());
}

// 1. A rank stopped before it finalizes: the others' bpl_finalize returns within T and a moment, and
//    says (a warning naming the stopped rank) that the job did not end together.
TEST_P(Fault, FinalizeReturnsThoughARankIsStopped) {
  Job job = run_job(backend(), 3, "stop_before_finalize", {});
  for (int rank : {0, 2}) {
    EXPECT_EVENT(job, rank, "allreduce", "BPL_OK");
    EXPECT_EVENT(job, rank, "finalize", "BPL_OK");
    EXPECT_LE(job.event(rank, "finalize")->ms, kTimeoutMs + 1500) << job.output;
  }
  EXPECT_TRUE(std::regex_search(job.output, std::regex("WARN: not every rank reached bpl_finalize: [^\\n]*rank 1\\b")))
      << job.output;
  std::printf("%s: bpl_finalize returned after %lld ms\n", backend().c_str(),
              static_cast<long long>(job.event(0, "finalize")->ms));
}

// 5. Values at the top of their types: an INT64_MAX (or 2^45 ms) timeout never runs out, and counts no
//    address space can hold are INVALID_ARGUMENT naming the count, with the communicator still usable.
TEST_P(Fault, HugeTimeoutsAndCountsAreHandled) {
  Job job = run_job(backend(), 2, "huge_values", {});
  for (int rank = 0; rank < 2; ++rank) {
    for (const std::string suffix : {"max", "2p45"}) {
      EXPECT_EVENT(job, rank, "set_timeout_" + suffix, "BPL_OK");
      EXPECT_EVENT(job, rank, "allreduce_" + suffix, "BPL_OK");
      EXPECT_NE(job.event(rank, "allreduce_" + suffix)->message.find("sum=2"), std::string::npos) << job.output;
      EXPECT_EVENT(job, rank, "wait_" + suffix, "BPL_OK");
    }
    for (const std::string huge : {"huge_allreduce", "huge_broadcast", "huge_send"}) {
      EXPECT_EVENT(job, rank, huge, "BPL_ERR_INVALID_ARGUMENT");
      EXPECT_NE(job.event(rank, huge)->message.find("count = "), std::string::npos) << job.output;
      EXPECT_NE(job.event(rank, huge)->message.find("address space"), std::string::npos) << job.output;
    }
    EXPECT_EVENT(job, rank, "after", "BPL_OK");
    EXPECT_NE(job.event(rank, "after")->message.find("sum=2"), std::string::npos) << job.output;
    EXPECT_EVENT(job, rank, "finalize", "BPL_OK");
  }
  std::printf("%s: %s\n", backend().c_str(), job.event(0, "huge_allreduce")->message.c_str());
}

// 5. A rank stopped before MPI_Init: MPI_Init_thread waits for every rank with no bound of its own.
//    Each other rank ends at T saying what it waited in, and mpirun then ends the job, well before the
//    stopped rank's helper would (before, they waited for as long as it stayed stopped).
TEST(FaultMpi, RankStoppedBeforeMpiInitEndsTheJobAtTheTimeout) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  const auto start = Clock::now();
  Job job = run_job("mpi", 3, "stop_before_init", {});
  const auto took = ms_since(start);
  const ProcessResult& mpirun = job.processes.front();
  EXPECT_FALSE(mpirun.timed_out) << job.output;
  EXPECT_NE(mpirun.exit_code, 0) << job.output;
  EXPECT_GE(took, kTimeoutMs) << job.output;
  EXPECT_LT(took, kTimeoutMs + 4000) << "the job waited for the stopped rank: " << job.output;
  EXPECT_TRUE(std::regex_search(job.output, std::regex("MPI_Init_thread \\(rank [02] of 3\\) did not return within 3000 ms "
                                                       "\\(BPL_TIMEOUT_MS\\): it waits for every rank of the job to start")))
      << job.output;
  std::printf("mpirun ended after %lld ms\n", static_cast<long long>(took));
}

/* BPL_MPI_WATCHDOG=1: MPI's own blocking calls, watched. A call past the timeout (or on a communicator
   aborted meanwhile) ends the job: mpirun exits with the watchdog's code, 124, and the ranks' log says
   what the call was and what is known of the peers. */

class FaultMpiWatchdog : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  }
  static Job run(int ranks, const std::string& scenario, std::map<std::string, std::string> env) {
    env["BPL_MPI_WATCHDOG"] = "1";
    return run_job("mpi", ranks, scenario, env);
  }
  // The job ended by the watchdog (not by the test's limit, not by success), its message matching
  // `pattern` on some rank.
  static void expect_ended_by_the_watchdog(const Job& job, const std::string& pattern) {
    const ProcessResult& mpirun = job.processes.front();
    EXPECT_FALSE(mpirun.timed_out) << job.output;
    EXPECT_EQ(mpirun.exit_code, 124) << job.output;
    const std::regex message("\\[backplane:mpi\\] ERROR: " + pattern +
                             "[^\\n]*; BPL_MPI_WATCHDOG=1 ends the job \\(MPI cannot cancel its own blocking calls\\): "
                             "MPI_Abort, exit code 124");
    EXPECT_TRUE(std::regex_search(job.output, message)) << "expected " << pattern << " in: " << job.output;
  }
};

// A rank stopped in the middle of blocking allreduces: the others' watchdog ends the job a timeout
// (and at most a few of its sixteenths) after the call began, naming the allreduce and the stopped rank.
TEST_F(FaultMpiWatchdog, StoppedRankEndsTheJobAtTheTimeoutNamingIt) {
  const Job job = run(3, "stop_mid_allreduce", {{"BPL_TEST_FAULTY_RANK", "1"}});
  expect_ended_by_the_watchdog(job, "allreduce \\(f32, count 262144, sum\\) on rank [02] of a communicator of 3 did not "
                                    "complete within " + std::to_string(kTimeoutMs) + " ms \\(the communicator's timeout\\) "
                                    "\\(rank 1 of this communicator, process \\d+ on this machine, is stopped\\)");
  EXPECT_EQ(job.event(0, "failed"), nullptr) << "the call returned instead: " << job.output;
  EXPECT_EQ(job.output.find("every allreduce succeeded"), std::string::npos) << job.output;
  // Started, ran one allreduce, waited out the timeout, explained (a moment), ended.
  const double seconds = job.processes.front().seconds;
  EXPECT_GE(seconds, kTimeoutMs / 1000.0) << job.output;
  EXPECT_LT(seconds, kTimeoutMs * 1.25 / 1000.0 + 10) << job.output;
  std::printf("mpi watchdog: the job ended %.1f s after mpirun started\n", seconds);
}

// Ranks calling different collectives: MPI's calls stall, and the watchdog says what each called.
TEST_F(FaultMpiWatchdog, MismatchedCollectivesEndTheJobNamingWhatEachCalled) {
  const Job job = run(3, "mismatched_collectives", {{"BPL_TEST_CASE", "op"}, {"BPL_TIMEOUT_MS", "1500"}});
  expect_ended_by_the_watchdog(job, "(allreduce|broadcast) \\(f32, count 16, [^)]*\\) on rank \\d of a communicator of 3 did "
                                    "not complete within 1500 ms \\(the communicator's timeout\\): ranks disagree on the "
                                    "collective they call: ranks 0,2 call allreduce \\(f32, count 16, sum\\); rank 1 calls "
                                    "broadcast \\(f32, count 16, root 0\\); rank 1 differs from the others");
  EXPECT_EQ(job.event(0, "mismatch"), nullptr) << job.output;
}

// bpl_comm_abort from another thread cannot release MPI's blocking call: the watchdog ends the job at
// once rather than at the timeout.
TEST_F(FaultMpiWatchdog, AbortDuringABlockingCallEndsTheJobAtOnce) {
  const Job job = run(3, "abort_blocking_call", {});
  expect_ended_by_the_watchdog(job, "the communicator was aborted \\(bpl_comm_abort\\) during allreduce \\(f32, count "
                                    "1024, sum\\) on rank 0 of a communicator of 3, which MPI cannot release");
  EXPECT_EQ(job.output.find("did not complete within"), std::string::npos) << "ended at the timeout: " << job.output;
}

// A recv of another size than its send is MISMATCH on the receiver, its buffer intact: above the eager
// size the watched recv probes the message's size first; within it MPI copies at most what was posted.
TEST_F(FaultMpiWatchdog, RecvOfAnotherSizeIsMismatchAndWritesNothingPastItsBuffer) {
  for (const std::string which : {"sendrecv", "sendrecv_short"}) {
    SCOPED_TRACE(which);
    const Job job = run(2, "mismatched_collectives", {{"BPL_TEST_CASE", which}, {"BPL_TIMEOUT_MS", "1500"}});
    EXPECT_FALSE(job.processes.front().timed_out) << job.output;
    EXPECT_EVENT(job, 0, "mismatch", "BPL_OK");
    EXPECT_EVENT(job, 1, "mismatch", "BPL_ERR_MISMATCH");
    EXPECT_NE(job.event(1, "mismatch")->message.find("rank 0 sent "), std::string::npos) << job.output;
    EXPECT_NE(job.event(1, "mismatch")->message.find("the ranks disagree on the size"), std::string::npos) << job.output;
    for (int rank = 0; rank < 2; ++rank) EXPECT_EVENT(job, rank, "guard", "BPL_OK");
    std::printf("mpi watchdog %s: %s\n", which.c_str(), job.event(1, "mismatch")->message.c_str());
  }
}

TEST(FaultGloo, BplRunNamesTheKilledRankAndStopsTheOthers) {
  ProcessResult r = backplane::test::run_process(
      {std::string(BPL_BIN_DIR) + "/bpl-run", "--nproc-per-node", "3", self_path(), "--worker=kill_mid_allreduce"},
      {{"BPL_BACKEND", "gloo"}, {"BPL_TIMEOUT_MS", std::to_string(kTimeoutMs)}});
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bpl-run: rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by SIGKILL"), std::string::npos) << r.output;
}

/* ---- 8. rendezvous ---- */

// Starts join_and_leave as the given (rank, world size) pairs on one port; returns their results.
std::vector<ProcessResult> start_ranks(const std::vector<std::pair<int, int>>& ranks, int port,
                                       int timeout_ms = kTimeoutMs) {
  std::vector<backplane::test::Process> started;
  for (const auto& [rank, world] : ranks) {
    auto env = backplane::test::rank_env(rank, world, port);
    env["BPL_BACKEND"] = "gloo";
    env["BPL_TIMEOUT_MS"] = std::to_string(timeout_ms);
    started.push_back(backplane::test::start_process({self_path(), "--worker=join_and_leave"}, env));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // in order: the first is the earlier rank
  }
  std::vector<ProcessResult> results;
  for (auto& process : started) results.push_back(backplane::test::finish_process(process, std::chrono::seconds(30)));
  return results;
}

// What a bpl_init that fails at its timeout may take beyond it: mostly loading the plugin (LibTorch's
// c10d), 0.7 s here and 1.5-2.1 s under sanitizers beside another test (4.56 s in all was seen there
// with a 3 s timeout). Less than a second timeout, so that a rank that waited for it twice fails.
constexpr int64_t kInitBeyondTimeoutMs = 2900;

// How long the rank's bpl_init took to fail, as it reported.
int64_t init_ms(const ProcessResult& r) {
  std::smatch match;
  if (!std::regex_search(r.output, match, std::regex("init BPL_\\w+ after (\\d+) ms"))) return -1;
  return std::stoll(match[1]);
}

TEST(Rendezvous, PortInUseFailsAtOnceNamingIt) {
  const int port = backplane::test::free_port();
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  auto results = start_ranks({{0, 2}}, port, 20000);
  close(listener);
  EXPECT_EQ(results[0].exit_code, 4) << results[0].output;
  // Most of it is loading the plugin (LibTorch's c10d), 0.7 s here and 1.5-2.1 s under sanitizers.
  EXPECT_LT(init_ms(results[0]), 5000) << "not at the 20 s timeout: " << results[0].output;
  EXPECT_NE(results[0].output.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << results[0].output;
  EXPECT_NE(results[0].output.find("Address already in use"), std::string::npos) << results[0].output;
}

// A listening socket on 127.0.0.1:`port` that is not a store. With `close_at_once` a thread accepts
// every connection and closes it at once; otherwise nothing ever accepts (the kernel completes the
// connections into the backlog, so a client's connect succeeds and its first request is never read).
class NotAStore {
 public:
  NotAStore(int port, bool close_at_once) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int on = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    listening_ = bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 && listen(fd_, 64) == 0;
    if (close_at_once) {
      closer_ = std::thread([this] {
        while (!stop_) {
          pollfd ready{fd_, POLLIN, 0};
          if (poll(&ready, 1, 50) > 0) {
            const int connection = accept(fd_, nullptr, nullptr);
            if (connection >= 0) close(connection);
          }
        }
      });
    }
  }
  ~NotAStore() {
    stop_ = true;
    if (closer_.joinable()) closer_.join();
    close(fd_);
  }
  bool listening() const { return listening_; }

 private:
  int fd_ = -1;
  bool listening_ = false;
  std::atomic<bool> stop_{false};
  std::thread closer_;
};

// 2. MASTER_PORT held by a program that is not a store: a rank that connects there fails within the
//    timeout, with a message saying so (no hang while the program runs, no crash when it closes).
TEST(Rendezvous, PortHeldByAProgramThatIsNotAStoreFailsWithinTheTimeout) {
  for (const bool close_at_once : {false, true}) {
    SCOPED_TRACE(close_at_once ? "accepts and closes" : "never answers");
    const int port = backplane::test::free_port();
    NotAStore listener(port, close_at_once);
    ASSERT_TRUE(listener.listening());
    auto results = start_ranks({{1, 2}}, port, 3000);
    EXPECT_EQ(results[0].signal, 0) << results[0].output;
    EXPECT_EQ(results[0].exit_code, 4) << results[0].output;
    EXPECT_LT(init_ms(results[0]), 3000 + kInitBeyondTimeoutMs) << results[0].output;
    EXPECT_NE(results[0].output.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << results[0].output;
    EXPECT_NE(results[0].output.find("not a store"), std::string::npos) << results[0].output;
    std::printf("%s: %s", close_at_once ? "accepts and closes" : "never answers", results[0].output.c_str());
  }
}

// 1. Rank 0 stopped right after it opened the store: a rank joining then fails at the timeout with a
//    TIMEOUT naming the store, instead of waiting for rank 0 to come back.
TEST(Rendezvous, StoppedStoreHostFailsAJoiningRankAtTheTimeout) {
  const int port = backplane::test::free_port();
  auto env = backplane::test::rank_env(0, 2, port);
  env["BPL_BACKEND"] = "gloo";
  env["BPL_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
  backplane::test::Process host = backplane::test::start_process({self_path(), "--worker=join_and_leave"}, env);
  // Stopped as soon as its store listens.
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  bool listening = false;
  while (!listening && Clock::now() < give_up) {
    const int probe = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    listening = connect(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    close(probe);
    if (!listening) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(host.pid, SIGSTOP);
  ASSERT_TRUE(listening) << "rank 0 never opened its store";
  auto results = start_ranks({{1, 2}}, port, kTimeoutMs);
  kill(host.pid, SIGKILL);
  backplane::test::finish_process(host, std::chrono::seconds(10));
  EXPECT_EQ(results[0].exit_code, 4) << results[0].output;
  EXPECT_NE(results[0].output.find("BPL_ERR_TIMEOUT"), std::string::npos) << results[0].output;
  EXPECT_GE(init_ms(results[0]), kTimeoutMs / 2) << results[0].output;
  EXPECT_LT(init_ms(results[0]), kTimeoutMs + kInitBeyondTimeoutMs) << results[0].output;
  EXPECT_NE(results[0].output.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << results[0].output;
  EXPECT_NE(results[0].output.find("did not answer"), std::string::npos) << results[0].output;
  std::printf("%s", results[0].output.c_str());
}

// 10. A MASTER_ADDR that does not resolve is reported as such, naming it, within the timeout. The rank
//     runs in a network namespace of its own with only a loopback that is down: the lookup fails
//     without sending anything anywhere.
TEST(Rendezvous, UnresolvableMasterAddrIsReportedAsSuch) {
  if (backplane::test::run_process({"unshare", "--net", "true"}, {}).exit_code != 0) {
    GTEST_SKIP() << "cannot make a network namespace here (unshare --net needs root or CAP_SYS_ADMIN)";
  }
  for (const int rank : {0, 1}) {
    auto env = backplane::test::rank_env(rank, 2, backplane::test::free_port());
    env["BPL_BACKEND"] = "gloo";
    env["BPL_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
    env["MASTER_ADDR"] = "no-such-host.invalid";
    ProcessResult r = backplane::test::run_process({"unshare", "--net", self_path(), "--worker=join_and_leave"}, env,
                                                   std::chrono::seconds(30));
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_LE(init_ms(r), kTimeoutMs + kInitBeyondTimeoutMs) << r.output;
    EXPECT_NE(r.output.find("MASTER_ADDR 'no-such-host.invalid' does not resolve"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("MASTER_PORT"), std::string::npos) << "a hint about the port misleads: " << r.output;
    std::printf("rank %d: %s", rank, r.output.c_str());
  }
}

// 11. A GLOO_SOCKET_IFNAME that names no interface is refused, naming it and the interfaces there are.
//     (In a network namespace of its own: nothing is sent anywhere.)
TEST(Rendezvous, AnUnknownSocketInterfaceIsRefusedNamingIt) {
  if (backplane::test::run_process({"unshare", "--net", "true"}, {}).exit_code != 0) {
    GTEST_SKIP() << "cannot make a network namespace here (unshare --net needs root or CAP_SYS_ADMIN)";
  }
  auto env = backplane::test::rank_env(1, 2, backplane::test::free_port());
  env["BPL_BACKEND"] = "gloo";
  env["MASTER_ADDR"] = "198.18.0.1";  // the range set aside for tests; unreachable from the namespace
  env["GLOO_SOCKET_IFNAME"] = "no-such-interface";
  ProcessResult r = backplane::test::run_process({"unshare", "--net", self_path(), "--worker=join_and_leave"}, env,
                                                 std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("BPL_ERR_INVALID_ARGUMENT"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GLOO_SOCKET_IFNAME='no-such-interface' names no interface of this host (it has: lo)"),
            std::string::npos)
      << r.output;
}

TEST(Rendezvous, MissingRankFailsEveryOtherAtTheTimeoutNamingIt) {
  auto results = start_ranks({{0, 3}, {2, 3}}, backplane::test::free_port(), 2000);
  for (const ProcessResult& r : results) {
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_NE(r.output.find("BPL_ERR_TIMEOUT"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("2/3 joined, missing ranks [1]"), std::string::npos) << r.output;
    EXPECT_GE(init_ms(r), 1900) << r.output;
    EXPECT_LT(init_ms(r), 6000) << r.output;
  }
}

TEST(Rendezvous, DuplicateRankFailsEveryRankFast) {
  auto results = start_ranks({{0, 3}, {1, 3}, {1, 3}}, backplane::test::free_port(), 20000);
  for (const ProcessResult& r : results) {
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_NE(r.output.find("BPL_ERR_MISMATCH"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("another process already joined as rank 1"), std::string::npos) << r.output;
    EXPECT_LT(init_ms(r), 5000) << "not at the 20 s timeout: " << r.output;
  }
}

TEST(Rendezvous, RanksDisagreeingOnTheWorldSizeFailFast) {
  auto results = start_ranks({{0, 2}, {1, 3}}, backplane::test::free_port(), 20000);
  for (const ProcessResult& r : results) {
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_NE(r.output.find("BPL_ERR_MISMATCH"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("WORLD_SIZE=3 but an earlier rank with WORLD_SIZE=2"), std::string::npos) << r.output;
    EXPECT_LT(init_ms(r), 5000) << r.output;
  }
}

TEST(Rendezvous, BadWorldSizesAreRefusedBeforeAnyConnection) {
  const std::vector<std::pair<std::pair<int, int>, std::string>> cases = {
      {{3, 3}, "rank 3 (from torchrun) is not below the world size 3"},
      {{0, 0}, "WORLD_SIZE='0' is not valid: expected an integer in [1, "},
      {{-1, 2}, "RANK='-1' is not valid: expected an integer in [0, "}};
  for (const auto& [launch, names] : cases) {
    auto results = start_ranks({launch}, backplane::test::free_port());
    EXPECT_EQ(results[0].exit_code, 4) << results[0].output;
    EXPECT_NE(results[0].output.find("BPL_ERR_INVALID_ARGUMENT"), std::string::npos) << results[0].output;
    EXPECT_NE(results[0].output.find(names), std::string::npos) << results[0].output;
    EXPECT_LT(init_ms(results[0]), 2000) << results[0].output;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return main_with_scenarios(argc, argv, {{"kill_mid_allreduce", kill_mid_allreduce},
                                          {"kill_mid_broadcast", kill_mid_broadcast},
                                          {"kill_mid_alltoallv", kill_mid_alltoallv},
                                          {"stop_mid_allreduce", stop_mid_allreduce},
                                          {"per_call_timeouts", per_call_timeouts},
                                          {"abort_from_another_thread", abort_from_another_thread},
                                          {"abort_notifies_peers", abort_notifies_peers},
                                          {"abort_blocking_call", abort_blocking_call},
                                          {"huge_values", huge_values},
                                          {"stop_before_finalize", stop_before_finalize},
                                          {"exit_cleanly_mid_allreduce", exit_cleanly_mid_allreduce},
                                          {"mismatched_collectives", mismatched_collectives},
                                          {"kill_mid_exchange", kill_mid_exchange},
                                          {"join_and_leave", join_and_leave},
                                          {"reinit_cycles", reinit_cycles},
                                          {"reinit_after_failure", reinit_after_failure},
                                          {"idle_after_rank0_exits", idle_after_rank0_exits},
                                          {"stop_before_init", stop_before_init}});
}
