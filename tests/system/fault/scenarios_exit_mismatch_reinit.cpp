// Rank programs: a rank that exits mid-collective, ring exchanges, mismatched collectives,
// re-initialisation, idle survivors, and the rendezvous' join.
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

// the faulty rank exits with status 0 while the others are in an allreduce: without
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

// rounds of a ring exchange of 4 MiB messages (recv from the left, send to the right, both
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

// ranks call mismatched collectives (BPL_TEST_CASE): "op" (rank 1 broadcasts, the others
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
                     which != "reduce_op" && which != "reduce_root" && which != "recv_any" && which != "uneven_sends";
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
    } else if (which == "uneven_sends") {  // no mismatch: rank 0 sends to each peer, then all allreduce
      for (int peer = 1; peer < r.size && status == BPL_OK && r.rank == 0; ++peer) {
        status = bpl_send(r.world, send.data(), n, BPL_DTYPE_F32, peer, 7, nullptr);
      }
      if (r.rank != 0) status = bpl_recv(r.world, recv.data(), n, BPL_DTYPE_F32, 0, 7, nullptr);
      if (status == BPL_OK) status = bpl_allreduce(r.world, send.data(), recv.data(), n, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
      if (status == BPL_OK && recv[0] != static_cast<float>(r.size)) status = BPL_ERR_INTERNAL;
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
  if (r.backend.rfind("mpi", 0) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(r.timeout_ms + 1000));
  finalize(r);
  return status == BPL_OK ? 0 : 3;
}

// bpl_init and bpl_finalize back to back, BPL_TEST_CYCLES times, each world's allreduce checked:
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

// rank 0's allreduce times out (rank 1 sleeps through it, until mpirun ends the job),
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

// rank 0 leaves the job without a word (it exits after a barrier); the others stay idle for
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
  // Rank 2 calls a second after rank 1: rank 1 has failed and ended by then, which must not make it a
  // cause (it followed rank 0's end).
  std::this_thread::sleep_for(std::chrono::milliseconds(finalizes ? r.timeout_ms + 1000 : 300));
  if (finalizes && r.rank == 2) std::this_thread::sleep_for(std::chrono::seconds(1));
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

// rank 1 stops before bpl_init (its helper kills it after T + 6 s); the others init.
int stop_before_init() {
  if (env_int("OMPI_COMM_WORLD_RANK", -1) == 1) stop_self_until_killed(kTimeoutMs + 6000);
  Rank r = join();
  finalize(r);
  return 0;
}

// joins and leaves; the rendezvous tests start it with conflicting launch variables.
int join_and_leave() {
  Rank r = join();
  std::printf("rank %d: joined a world of %d\n", r.rank, r.size);
  bpl_finalize(r.runtime);
  return 0;
}

}  // namespace backplane::test::faults
