// Faults in real processes, for every backend that runs here (gloo: ranks started as a launcher
// would; mpi: under a real mpirun): a rank killed, stopped or leaving in the middle of a collective,
// timeouts per call and per communicator, abort from another thread, mismatched collectives under
// BPL_DEBUG=detail, and a rendezvous that cannot complete. The promise checked everywhere: every
// surviving rank gets a clear error within its timeout, and nothing hangs.
//
// The binary doubles as the rank program (--worker=SCENARIO). Ranks report one line per event:
//   rank R: EVENT STATUS after MS ms: MESSAGE
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "backplane/backplane.h"
#include "support/process.h"

namespace {

using backplane::test::ProcessResult;
using Clock = std::chrono::steady_clock;

std::string self_path;

/* ---------------------------------------------------------------------------------------------- */
/* The rank program.                                                                               */

struct Rank {
  bpl_runtime* runtime = nullptr;
  bpl_comm* world = nullptr;
  int rank = 0;
  int size = 1;
  std::string backend;
  int64_t timeout_ms = 0;
};

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

// `status` came from a call started at `start`: the time is taken here, after the call returned (an
// argument list has no order of evaluation).
void report(const Rank& r, const char* event, bpl_status status, Clock::time_point start, const std::string& extra = "") {
  const long long ms = static_cast<long long>(ms_since(start));
  std::printf("rank %d: %s %s after %lld ms: %s%s\n", r.rank, event, bpl_status_name(status), ms,
              status == BPL_OK ? "" : bpl_last_error(), extra.c_str());
  std::fflush(stdout);
}

Rank join() {
  Rank r;
  const auto start = Clock::now();
  bpl_status status = bpl_init(nullptr, &r.runtime);
  if (status != BPL_OK) {
    std::printf("rank %s: init %s after %lld ms: %s\n", std::getenv("RANK") ? std::getenv("RANK") : "?",
                bpl_status_name(status), static_cast<long long>(ms_since(start)), bpl_last_error());
    std::fflush(stdout);
    std::exit(4);
  }
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_runtime_describe(r.runtime, &info);
  bpl_comm_world(r.runtime, &r.world);
  r.rank = info.rank;
  r.size = info.world_size;
  r.backend = info.backend;
  r.timeout_ms = info.timeout_ms;
  return r;
}

// SIGKILLs this process `delay` from now, whatever it is doing then.
void sigkill_self_in(std::chrono::milliseconds delay) {
  std::thread([delay] {
    std::this_thread::sleep_for(delay);
    raise(SIGKILL);
  }).detach();
}

// Stops this process (SIGSTOP) and has a helper process kill it `kill_after_ms` later, so that the job
// always ends. Only async-signal-safe calls in the child: the parent has threads.
void stop_self_until_killed(int64_t kill_after_ms) {
  const pid_t me = getpid();
  if (fork() == 0) {
    struct timespec pause = {static_cast<time_t>(kill_after_ms / 1000), static_cast<long>(kill_after_ms % 1000) * 1000000};
    nanosleep(&pause, nullptr);
    kill(me, SIGKILL);
    _exit(0);
  }
  raise(SIGSTOP);
}

// Survivors, after the failure: a new operation on the failed communicator must fail at once.
void retry_fails_at_once(const Rank& r) {
  const auto start = Clock::now();
  report(r, "retry", bpl_barrier(r.world, nullptr), start);
}

void finalize(Rank& r) {
  const auto start = Clock::now();
  report(r, "finalize", bpl_finalize(r.runtime), start);
}

// Test 1: 64 MiB allreduces; rank 1 SIGKILLs itself 30 ms after starting the second.
int kill_mid_allreduce() {
  Rank r = join();
  std::vector<float> data(16u << 20, 1.0f);
  for (int iteration = 0; iteration < 20; ++iteration) {
    if (r.rank == 1 && iteration == 1) {
      sigkill_self_in(std::chrono::milliseconds(30));
    }
    const auto start = Clock::now();
    bpl_status status = bpl_allreduce(r.world, data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    if (status != BPL_OK) {
      report(r, "failed", status, start);
      retry_fails_at_once(r);
      finalize(r);
      return 3;
    }
  }
  std::printf("rank %d: every allreduce succeeded\n", r.rank);
  bpl_finalize(r.runtime);
  return 0;
}

// Tests 2 and 4: 1 MiB allreduces; rank 1 is stopped (SIGSTOP) at the second. Survivors time out, the
// failed world refuses the next operation at once, a communicator split off before (without rank 1)
// keeps working, and on gloo the survivors then start a new job of their own. Rank 0 starts that
// allreduce BPL_TEST_RANK0_LATE_MS late (default 0).
int stop_mid_allreduce() {
  Rank r = join();
  bpl_comm* survivors = nullptr;
  bpl_comm_split(r.world, r.rank == 1 ? BPL_COLOR_UNDEFINED : 0, r.rank, &survivors);
  std::vector<float> data(256u << 10, 1.0f);
  for (int iteration = 0; iteration < 20; ++iteration) {
    if (r.rank == 1 && iteration == 1) stop_self_until_killed(r.timeout_ms + 3000);
    if (r.rank == 0 && iteration == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(env_int("BPL_TEST_RANK0_LATE_MS", 0)));
    }
    const auto start = Clock::now();
    bpl_status status = bpl_allreduce(r.world, data.data(), data.data(), data.size(), BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    if (status == BPL_OK) continue;
    report(r, "failed", status, start);
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
      options.rank = r.rank == 0 ? 0 : r.rank - 1;
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
  float value = 1.0f;
  const auto start = Clock::now();
  report(r, "failed", bpl_allreduce(r.world, &value, &value, 1, BPL_DTYPE_F32, BPL_OP_SUM, nullptr), start);
  finalize(r);
  return 3;
}

// Test 6: rank 1 exits with status 0, without finalizing, while the others are in an allreduce.
int exit_cleanly_mid_allreduce() {
  Rank r = join();
  if (r.rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::printf("rank 1: exiting with status 0\n");
    std::fflush(stdout);
    std::_Exit(0);
  }
  std::vector<float> data(256u << 10, 1.0f);
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
// allreduce), "count" (rank 1 one element more), "skip" (rank 1 skips an allreduce and calls the next
// barrier). Under BPL_DEBUG=detail every rank reports BPL_ERR_MISMATCH.
int mismatched_collectives() {
  Rank r = join();
  const std::string which = std::getenv("BPL_TEST_CASE") ? std::getenv("BPL_TEST_CASE") : "";
  std::vector<float> data(1000, 1.0f);
  const auto start = Clock::now();
  bpl_status status = bpl_barrier(r.world, nullptr);
  if (status == BPL_OK) {
    if (which == "op") {
      status = r.rank == 1 ? bpl_broadcast(r.world, data.data(), 16, BPL_DTYPE_F32, 0, nullptr)
                           : bpl_allreduce(r.world, data.data(), data.data(), 16, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    } else if (which == "count") {
      const int64_t count = r.rank == 1 ? 1000 : 999;
      status = bpl_allreduce(r.world, data.data(), data.data(), count, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
    } else if (which == "skip") {
      if (r.rank != 1) status = bpl_allreduce(r.world, data.data(), data.data(), 16, BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
      if (status == BPL_OK) status = bpl_barrier(r.world, nullptr);
    }
  }
  report(r, "mismatch", status, start);
  if (status != BPL_OK) retry_fails_at_once(r);
  finalize(r);
  return status == BPL_OK ? 0 : 3;
}

// Test 8: joins and leaves; the rendezvous tests start it with conflicting launch variables.
int join_and_leave() {
  Rank r = join();
  std::printf("rank %d: joined a world of %d\n", r.rank, r.size);
  bpl_finalize(r.runtime);
  return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* Launching jobs and reading their reports.                                                      */

constexpr int kTimeoutMs = 3000;  // T

struct Event {
  std::string status;
  int64_t ms = -1;
  std::string message;
};

struct Job {
  std::string output;                           // every rank's (gloo) or mpirun's (mpi) output
  std::vector<ProcessResult> processes;         // one per rank (gloo) or mpirun alone (mpi)
  std::map<std::pair<int, std::string>, Event> events;  // (rank, event) → what it reported

  const Event* event(int rank, const std::string& name) const {
    auto it = events.find({rank, name});
    return it == events.end() ? nullptr : &it->second;
  }
};

// Processes whose command line holds `token` (a job's unique argument): none may outlive its job.
// The shared-memory segments in /dev/shm that the Gloo plugin of process `pid` named (it puts its rank
// 0's pid in the name).
std::vector<std::string> segments_of(pid_t pid) {
  std::vector<std::string> found;
  const std::string prefix = "backplane-" + std::to_string(pid) + "-";
  DIR* shm = opendir("/dev/shm");
  if (shm == nullptr) return found;
  while (dirent* entry = readdir(shm)) {
    if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) found.push_back(entry->d_name);
  }
  closedir(shm);
  return found;
}

std::vector<pid_t> processes_with(const std::string& token) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    std::ifstream file("/proc/" + std::string(entry->d_name) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if (cmdline.find(token) != std::string::npos) found.push_back(pid);
  }
  closedir(proc);
  return found;
}

// Runs `scenario` on `ranks` ranks of `backend`: gloo as separate processes with torchrun's variables
// (rank r gets extra_per_rank(r) on top), mpi under mpirun. Checks that no process of the job remains.
// "gloo_machines" is gloo with the ranks as on machines of two ranks each (BPL_GLOO_HOST_ID), so that
// 3 ranks take the hierarchical path: ranks 0 and 1 share a segment, rank 2 is alone.
Job run_job(const std::string& backend, int ranks, const std::string& scenario,
            std::map<std::string, std::string> env, std::chrono::seconds limit = std::chrono::seconds(60)) {
  static int jobs = 0;
  const std::string token = "--job=" + std::to_string(getpid()) + "-" + std::to_string(++jobs);
  const std::vector<std::string> argv = {self_path, "--worker=" + scenario, token};
  const bool as_machines = backend == "gloo_machines";
  env["BPL_BACKEND"] = as_machines ? "gloo" : backend;
  if (env.count("BPL_TIMEOUT_MS") == 0) env["BPL_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
  Job job;
  if (backend == "mpi") {
#ifdef BPL_MPIEXEC
    job.processes.push_back(backplane::test::run_process(backplane::test::mpirun(ranks, argv),
                                                         backplane::test::mpi_env(env), limit));
    job.output = job.processes.back().output;
#endif
  } else {
    const int port = backplane::test::free_port();
    env["BPL_TEST_SECOND_PORT"] = std::to_string(backplane::test::free_port());
    std::vector<backplane::test::Process> started;
    for (int r = 0; r < ranks; ++r) {
      auto rank_env = backplane::test::rank_env(r, ranks, port);
      if (as_machines) rank_env["BPL_GLOO_HOST_ID"] = "machine-" + std::to_string(r / 2);
      rank_env.insert(env.begin(), env.end());
      started.push_back(backplane::test::start_process(argv, rank_env));
    }
    for (auto& process : started) {
      job.processes.push_back(backplane::test::finish_process(process, limit));
      job.output += job.processes.back().output;
    }
    // Each communicator's segment is unlinked once mapped: none outlives the job, however it ended.
    for (auto& process : started) {
      for (const std::string& segment : segments_of(process.pid)) ADD_FAILURE() << "left in /dev/shm: " << segment;
    }
  }
  const std::regex line(R"(rank (\d+): (\w+) (BPL_\w+) after (-?\d+) ms: ([^\n]*))");
  for (std::sregex_iterator it(job.output.begin(), job.output.end(), line), end; it != end; ++it) {
    job.events[{std::stoi((*it)[1]), (*it)[2]}] = Event{(*it)[3], std::stoll((*it)[4]), (*it)[5]};
  }
  // Stopped ranks are killed by their helper a few seconds after the job's survivors end.
  for (int waited = 0; waited < 150 && !processes_with(token).empty(); ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(processes_with(token).empty()) << "processes of the job outlived it";
  for (pid_t pid : processes_with(token)) kill(pid, SIGKILL);
  return job;
}

#define EXPECT_EVENT(job, rank, name, status_name)                                                   \
  do {                                                                                               \
    const Event* e_ = (job).event(rank, name);                                                       \
    ASSERT_NE(e_, nullptr) << "rank " << (rank) << " reported no '" << (name) << "':\n" << (job).output; \
    EXPECT_EQ(e_->status, status_name) << "rank " << (rank) << " " << (name) << ":\n" << (job).output; \
  } while (0)

class Fault : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
#ifndef BPL_MPIEXEC
    if (GetParam() == "mpi") GTEST_SKIP() << "the MPI backend is not built (no Open MPI found at configure time)";
#endif
  }
  const std::string& backend() const { return GetParam(); }
  bool is_mpi() const { return GetParam() == "mpi"; }
};

// 1. A rank SIGKILLed in a 64 MiB allreduce: every survivor fails with REMOTE naming rank 1, within 2T.
//    Open MPI without fault tolerance tears the job down instead: mpirun exits non-zero naming the rank.
TEST_P(Fault, KilledRankIsARemoteErrorNamingItOnEverySurvivor) {
  Job job = run_job(backend(), 3, "kill_mid_allreduce", {});
  if (is_mpi()) {
    const ProcessResult& mpirun = job.processes.front();
    EXPECT_FALSE(mpirun.timed_out) << job.output;
    EXPECT_NE(mpirun.exit_code, 0) << job.output;
    EXPECT_NE(job.output.find("process rank 1"), std::string::npos) << job.output;
    EXPECT_NE(job.output.find("signal 9"), std::string::npos) << job.output;
    EXPECT_EQ(job.output.find("every allreduce succeeded"), std::string::npos) << job.output;
    std::printf("mpi: mpirun ended the job %.1f s after it started\n", mpirun.seconds);
    return;
  }
  EXPECT_EQ(job.processes[1].signal, SIGKILL) << job.output;
  int first_failed_op = 0;
  for (int rank : {0, 2}) {
    EXPECT_FALSE(job.processes[rank].timed_out) << job.output;
    EXPECT_EVENT(job, rank, "failed", "BPL_ERR_REMOTE");
    const Event& failed = *job.event(rank, "failed");
    EXPECT_LT(failed.ms, 2 * kTimeoutMs) << failed.message;
    // Named by the connection's address or, when Gloo names an unknown one, as an ended process.
    EXPECT_NE(failed.message.find("rank 1 of this communicator"), std::string::npos) << failed.message;
    // The allreduce rank 1 died in: #2 or, where an allreduce of 64 MiB takes less than 30 ms (shared
    // memory), a later one. Every survivor fails in the same one, except that on machines of their own
    // rank 2 may have seen its part through (its machine's result was complete before rank 1 died)
    // and fails in the next.
    std::smatch op;
    ASSERT_TRUE(std::regex_search(failed.message, op, std::regex("bpl_allreduce #(\\d+) on world \\(rank " +
                                                                     std::to_string(rank) + " of 3\\)")))
        << failed.message;
    const int failed_op = std::stoi(op[1]);
    EXPECT_GE(failed_op, 2) << failed.message;
    if (first_failed_op == 0) first_failed_op = failed_op;
    const bool may_be_next = backend() == "gloo_machines" && rank == 2;
    EXPECT_TRUE(failed_op == first_failed_op || (may_be_next && failed_op == first_failed_op + 1)) << job.output;
    std::printf("gloo: rank %d failed %lld ms after the allreduce started: %s\n", rank,
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

// 2 and 4. A rank SIGSTOPped: survivors fail with TIMEOUT after at least T/2 and at most T + 1 s; the
// world then refuses operations at once, a split without the stopped rank keeps working, and (gloo)
// the survivors can start a new job of their own.
void expect_stopped_rank_is_a_timeout_on_every_survivor(const std::string& backend, const Job& job) {
  const bool is_mpi = backend == "mpi";
  for (int rank : {0, 2}) {
    EXPECT_EVENT(job, rank, "failed", "BPL_ERR_TIMEOUT");
    const Event& failed = *job.event(rank, "failed");
    EXPECT_GE(failed.ms, kTimeoutMs / 2) << failed.message;
    EXPECT_LE(failed.ms, kTimeoutMs + 1000) << failed.message;
    std::printf("%s: rank %d timed out %lld ms after the allreduce started: %s\n", backend.c_str(), rank,
                static_cast<long long>(failed.ms), failed.message.c_str());
    if (!is_mpi) {
      EXPECT_NE(failed.message.find("rank 1 of this communicator, process "), std::string::npos) << failed.message;
      EXPECT_NE(failed.message.find(" on this machine, is stopped"), std::string::npos) << failed.message;
    }
    EXPECT_EVENT(job, rank, "retry", "BPL_ERR_TIMEOUT");
    EXPECT_LT(job.event(rank, "retry")->ms, 50);
    EXPECT_EVENT(job, rank, "survivors", "BPL_OK");
    EXPECT_NE(job.event(rank, "survivors")->message.find("sum=2"), std::string::npos) << job.output;
    EXPECT_EVENT(job, rank, "finalize", "BPL_OK");
    if (!is_mpi) {
      EXPECT_EVENT(job, rank, "new_job", "BPL_OK");
      EXPECT_NE(job.event(rank, "new_job")->message.find("sum=2"), std::string::npos) << job.output;
    }
  }
}

TEST_P(Fault, StoppedRankIsATimeoutOnEverySurvivor) {
  expect_stopped_rank_is_a_timeout_on_every_survivor(backend(), run_job(backend(), 3, "stop_mid_allreduce", {}));
}

// On machines of two ranks, rank 2 (alone on its machine) sees only that the other machine's leader,
// rank 0, does not come, while rank 0 sees rank 1 stopped. With rank 0 late, rank 2's wait ends first,
// and it still names rank 1: a timeout a rank cannot explain waits a moment for the explanation of a
// rank on another machine.
TEST(FaultGloo, StoppedRankIsNamedOnAnotherMachineThoughItsLeaderIsLate) {
  expect_stopped_rank_is_a_timeout_on_every_survivor(
      "gloo_machines", run_job("gloo_machines", 3, "stop_mid_allreduce", {{"BPL_TEST_RANK0_LATE_MS", "300"}}));
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
  Job job = run_job(backend(), 3, "exit_cleanly_mid_allreduce", {});
  EXPECT_EQ(job.output.find("every allreduce succeeded"), std::string::npos) << job.output;
  if (is_mpi()) {
    // Open MPI ends the job when a rank exits without MPI_Finalize.
    EXPECT_NE(job.processes.front().exit_code, 0) << job.output;
    return;
  }
  for (int rank : {0, 2}) {
    const Event* failed = job.event(rank, "failed");
    ASSERT_NE(failed, nullptr) << job.output;
    EXPECT_TRUE(failed->status == "BPL_ERR_REMOTE" || failed->status == "BPL_ERR_TIMEOUT") << failed->message;
    EXPECT_LE(failed->ms, kTimeoutMs + 1000) << failed->message;
    EXPECT_EQ(job.processes[rank].exit_code, 3) << job.output;
  }
}

// 8. A rank SIGKILLed during a ring of sends and recvs (on one machine, through shared memory): both
//    its neighbours fail with REMOTE naming it, well within the timeout.
TEST_P(Fault, KilledRankInSendsAndRecvsIsARemoteErrorOnItsPeers) {
  if (backend() != "gloo") GTEST_SKIP() << "the shared-memory mailboxes are gloo's path within one machine";
  Job job = run_job(backend(), 3, "kill_mid_exchange", {});
  EXPECT_EQ(job.processes[1].signal, SIGKILL) << job.output;
  EXPECT_EQ(job.output.find("every exchange succeeded"), std::string::npos) << job.output;
  for (int rank : {0, 2}) {
    EXPECT_FALSE(job.processes[rank].timed_out) << job.output;
    EXPECT_EVENT(job, rank, "failed", "BPL_ERR_REMOTE");
    const Event& failed = *job.event(rank, "failed");
    EXPECT_LT(failed.ms, kTimeoutMs) << failed.message;
    EXPECT_NE(failed.message.find("rank 1 of this communicator"), std::string::npos) << failed.message;
    EXPECT_EQ(job.processes[rank].exit_code, 3) << job.output;
    std::printf("gloo: rank %d failed %lld ms into its exchange: %s\n", rank, static_cast<long long>(failed.ms),
                failed.message.c_str());
  }
}

// 7. BPL_DEBUG=detail: mismatched collectives are MISMATCH on every rank, naming the differing field.
TEST_P(Fault, DetailModeReportsMismatchedCollectivesOnEveryRank) {
  const std::map<std::string, std::string> differs = {{"op", "differ in: op"}, {"count", "differ in: count"},
                                                      {"skip", "differ in: op"}};
  for (const auto& [which, field] : differs) {
    SCOPED_TRACE(which);
    Job job = run_job(backend(), 3, "mismatched_collectives", {{"BPL_DEBUG", "detail"}, {"BPL_TEST_CASE", which}});
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EVENT(job, rank, "mismatch", "BPL_ERR_MISMATCH");
      const std::string& message = job.event(rank, "mismatch")->message;
      EXPECT_NE(message.find(field), std::string::npos) << message;
      EXPECT_NE(message.find("rank 1 differs from the others"), std::string::npos) << message;
      EXPECT_EVENT(job, rank, "retry", "BPL_ERR_MISMATCH");
    }
    std::printf("%s %s: %s\n", backend().c_str(), which.c_str(), job.event(0, "mismatch")->message.c_str());
  }
}

// 7. Without detail, mismatched counts are the library's to catch, never a write out of bounds (the
//    sanitizer build runs this too): Gloo's transport refuses a message longer than the buffer posted
//    for it (its check aborts the receiving process), Open MPI ends the job with MPI_ERR_TRUNCATE. The
//    job never ends with every rank reporting success.
TEST_P(Fault, MismatchedCountsWithoutDetailNeverCorruptMemory) {
  Job job = run_job(backend(), 2, "mismatched_collectives", {{"BPL_TEST_CASE", "count"}});
  EXPECT_EQ(job.output.find("AddressSanitizer"), std::string::npos) << job.output;
  bool all_succeeded = true;
  for (const ProcessResult& process : job.processes) {
    EXPECT_FALSE(process.timed_out) << job.output;
    all_succeeded = all_succeeded && process.exit_code == 0;
  }
  EXPECT_FALSE(all_succeeded) << job.output;
  for (int rank = 0; rank < 2; ++rank) {
    const Event* e = job.event(rank, "mismatch");
    std::printf("%s: rank %d: %s\n", backend().c_str(), rank,
                e == nullptr ? "ended by the library" : (e->status + " " + e->message).c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Fault, ::testing::Values("gloo", "gloo_machines", "mpi"),
                         [](const auto& info) { return info.param; });

TEST(FaultGloo, AbortClosesTheConnectionsSoPeersFailAtOnce) {
  Job job = run_job("gloo", 2, "abort_notifies_peers", {});
  EXPECT_EVENT(job, 0, "abort", "BPL_OK");
  EXPECT_EVENT(job, 1, "failed", "BPL_ERR_REMOTE");
  EXPECT_LT(job.event(1, "failed")->ms, 1000) << job.output;
  EXPECT_NE(job.event(1, "failed")->message.find("rank 0 of this communicator"), std::string::npos) << job.output;
}

TEST(FaultGloo, BplRunNamesTheKilledRankAndStopsTheOthers) {
  ProcessResult r = backplane::test::run_process(
      {std::string(BPL_BIN_DIR) + "/bpl-run", "--nproc-per-node", "3", self_path, "--worker=kill_mid_allreduce"},
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
    started.push_back(backplane::test::start_process({self_path, "--worker=join_and_leave"}, env));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // in order: the first is the earlier rank
  }
  std::vector<ProcessResult> results;
  for (auto& process : started) results.push_back(backplane::test::finish_process(process, std::chrono::seconds(30)));
  return results;
}

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
  char resolved[4096] = {};
  self_path = realpath("/proc/self/exe", resolved) ? resolved : argv[0];
  if (argc > 1 && std::strncmp(argv[1], "--worker=", 9) == 0) {
    const std::string scenario = argv[1] + 9;
    if (scenario == "kill_mid_allreduce") return kill_mid_allreduce();
    if (scenario == "stop_mid_allreduce") return stop_mid_allreduce();
    if (scenario == "per_call_timeouts") return per_call_timeouts();
    if (scenario == "abort_from_another_thread") return abort_from_another_thread();
    if (scenario == "abort_notifies_peers") return abort_notifies_peers();
    if (scenario == "exit_cleanly_mid_allreduce") return exit_cleanly_mid_allreduce();
    if (scenario == "mismatched_collectives") return mismatched_collectives();
    if (scenario == "kill_mid_exchange") return kill_mid_exchange();
    if (scenario == "join_and_leave") return join_and_leave();
    std::fprintf(stderr, "unknown worker scenario %s\n", scenario.c_str());
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
