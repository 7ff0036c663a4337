// Fault tests on real processes: a test binary doubles as the rank program (--worker=SCENARIO), the
// test side starts a job of it (gloo: one process per rank with a launcher's variables; mpi: under a
// real mpirun), and reads what each rank reports, one line per event:
//   rank R: EVENT STATUS after MS ms: MESSAGE
// Nothing here hangs: every job runs under a hard limit, and no process of a job may outlive it.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "backplane/backplane.h"
#include "support/process.h"

namespace backplane::test::faults {

using Clock = std::chrono::steady_clock;

constexpr int kTimeoutMs = 3000;  // T, every job's BPL_TIMEOUT_MS unless the test sets another

// This test binary, which every job runs as its ranks.
inline std::string& self_path() {
  static std::string path;
  return path;
}

/* ---------------------------------------------------------------------------------------------- */
/* The rank side.                                                                                 */

// The folder where a job's ranks mark that they started and that they leave (leave_together), named by
// the job's unique argument; the test side removes it after the job.
inline std::string job_marks(const std::string& token) { return "/tmp/bpl-fault-marks-" + token; }
inline std::string& own_job_token() {
  static std::string token;
  return token;
}

// A rank of an MPI job that leaves without MPI_Finalize (as a failed communicator's ranks do) ends the
// job: Intel MPI's mpiexec then kills every other rank at once, and a survivor slower to report than
// another to leave would say nothing. So a rank of an MPI job whose scenario returned waits, at most
// 10 s, until every rank that started has left too, is stopped, or has ended. Ranks that leave on
// purpose mid-scenario (_Exit) do not wait.
inline void leave_together() {
  const std::string marks = job_marks(own_job_token());
  std::ofstream(marks + "/" + std::to_string(getpid()) + ".left") << "\n";
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    bool waiting = false;
    if (DIR* folder = opendir(marks.c_str())) {
      while (const dirent* entry = readdir(folder)) {
        const std::string name = entry->d_name;
        const size_t dot = name.find(".started");
        if (dot == std::string::npos || std::ifstream(marks + "/" + name.substr(0, dot) + ".left")) continue;
        std::ifstream stat("/proc/" + name.substr(0, dot) + "/stat");
        std::string line;
        std::getline(stat, line);
        const size_t state = line.rfind(')');  // the state follows the command's name in parentheses
        const char c = state == std::string::npos || state + 2 >= line.size() ? 'X' : line[state + 2];
        waiting = waiting || (c != 'T' && c != 't' && c != 'Z' && c != 'X');
      }
      closedir(folder);
    }
    if (!waiting || Clock::now() > give_up) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

struct Rank {
  bpl_runtime* runtime = nullptr;
  bpl_comm* world = nullptr;
  int rank = 0;
  int size = 1;
  std::string backend;
  int64_t timeout_ms = 0;
};

inline int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// CPU time this process has used so far (every thread), in milliseconds.
inline int64_t cpu_ms() {
  timespec used{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &used);
  return static_cast<int64_t>(used.tv_sec) * 1000 + used.tv_nsec / 1000000;
}

inline int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

inline std::string env_text(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// `status` came from a call started at `start`: the time is taken here, after the call returned (an
// argument list has no order of evaluation).
inline void report(const Rank& r, const char* event, bpl_status status, Clock::time_point start,
                   const std::string& extra = "") {
  const long long ms = static_cast<long long>(ms_since(start));
  std::printf("rank %d: %s %s after %lld ms: %s%s\n", r.rank, event, bpl_status_name(status), ms,
              status == BPL_OK ? "" : bpl_last_error(), extra.c_str());
  std::fflush(stdout);
}

// bpl_init from the environment; a failure is reported as event "init" and ends the process (4).
inline Rank join() {
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
inline void sigkill_self_in(std::chrono::milliseconds delay) {
  std::thread([delay] {
    std::this_thread::sleep_for(delay);
    raise(SIGKILL);
  }).detach();
}

// Stops this process (SIGSTOP) and has a helper process send it `then` (SIGKILL: the job always ends;
// SIGCONT: it goes on) `after_ms` later. Only async-signal-safe calls in the child: the parent has threads.
inline void stop_self_then(int64_t after_ms, int then) {
  const pid_t me = getpid();
  if (fork() == 0) {
    struct timespec pause = {static_cast<time_t>(after_ms / 1000), static_cast<long>(after_ms % 1000) * 1000000};
    nanosleep(&pause, nullptr);
    kill(me, then);
    _exit(0);
  }
  raise(SIGSTOP);
}

inline void stop_self_until_killed(int64_t kill_after_ms) { stop_self_then(kill_after_ms, SIGKILL); }

// Survivors, after the failure: a new operation on the failed communicator must fail at once.
inline void retry_fails_at_once(const Rank& r) {
  const auto start = Clock::now();
  report(r, "retry", bpl_barrier(r.world, nullptr), start);
}

inline void finalize(Rank& r) {
  const auto start = Clock::now();
  report(r, "finalize", bpl_finalize(r.runtime), start);
}

/* ---------------------------------------------------------------------------------------------- */
/* The test side.                                                                                 */

struct Event {
  std::string status;
  int64_t ms = -1;
  std::string message;
};

struct Job {
  std::string output;                                   // every rank's (gloo) or the launcher's (mpi) output
  std::vector<ProcessResult> processes;                 // one per rank (gloo) or the launcher alone (mpi)
  std::map<std::pair<int, std::string>, Event> events;  // (rank, event) → what it reported

  const Event* event(int rank, const std::string& name) const {
    auto it = events.find({rank, name});
    return it == events.end() ? nullptr : &it->second;
  }
};

// The shared-memory segments in /dev/shm that the Gloo plugin of process `pid` named (it puts its
// rank 0's pid in the name).
inline std::vector<std::string> segments_of(pid_t pid) {
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

// Processes whose /proc/<pid>/<file> ("cmdline", "environ": NUL-separated) holds `text`.
inline std::vector<pid_t> processes_whose(const char* file, const std::string& text) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    std::string content;
    try {
      std::ifstream in("/proc/" + std::string(entry->d_name) + "/" + file);
      content.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } catch (const std::ios_base::failure&) {
      continue;  // it ended while being read: /proc answers ESRCH, which the stream throws
    }
    if (content.find(text) != std::string::npos) found.push_back(pid);
  }
  closedir(proc);
  return found;
}

// Processes whose command line holds `token` (a job's unique argument): none may outlive its job.
inline std::vector<pid_t> processes_with(const std::string& token) { return processes_whose("cmdline", token); }

// Each job's processes carry BPL_TEST_JOB=<its token> in their environment (the launcher's, the
// store's, the ranks' and what they fork), by which none may outlive the job.
inline std::string unique_token() {
  static int jobs = 0;
  return std::to_string(getpid()) + "-" + std::to_string(++jobs);
}

inline std::vector<pid_t> processes_of_job(const std::string& token) {
  // A whole entry of the environment, between the NULs that end its neighbours (never the first entry:
  // these processes inherit the test's whole environment and get it added).
  return processes_whose("environ", std::string("\0BPL_TEST_JOB=", 14) + token + std::string(1, '\0'));
}

inline void expect_nothing_left(const std::string& token) {
  for (int waited = 0; waited < 150 && !processes_of_job(token).empty(); ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(processes_of_job(token).empty()) << "processes of the job outlived it";
  for (pid_t pid : processes_of_job(token)) kill(pid, SIGKILL);
}

inline void parse_events(Job& job) {
  const std::regex line(R"(rank (\d+): (\w+) (BPL_\w+) after (-?\d+) ms: ([^\n]*))");
  for (std::sregex_iterator it(job.output.begin(), job.output.end(), line), end; it != end; ++it) {
    job.events[{std::stoi((*it)[1]), (*it)[2]}] = Event{(*it)[3], std::stoll((*it)[4]), (*it)[5]};
  }
}

// A job of another MPI the mpi plugin is built for, started by that MPI's own launcher: "mpi_mpich",
// "mpi_impi" (Intel MPI, on the plugin built for MPICH's ABI), "mpi_openmpi5"; as tests/CMakeLists.txt
// starts them (BPL_MPI_LAUNCH_<mpi>, BPL_MPI_ENV_<mpi>), which writes this table. nullptr where that MPI
// is not installed or its plugin not built here (kNoOtherMpi).
struct OtherMpi {
  std::string backend;
  std::vector<std::string> launch;  // followed by the rank count and the program
  std::map<std::string, std::string> env;
};
inline const OtherMpi* other_mpi(const std::string& backend) {
  static const std::vector<OtherMpi> built = {
#include "support/other_mpis.inc"
  };
  for (const OtherMpi& mpi : built) {
    if (mpi.backend == backend) return &mpi;
  }
  return nullptr;
}
constexpr const char* kNoOtherMpi =
    "this MPI is not installed, or its plugin not built (tools/install-deps installs MPICH, Intel MPI and Open MPI "
    "5 into .peers; the build then makes their plugins)";

// Runs `scenario` on `ranks` ranks of `backend`: gloo as separate processes with torchrun's variables,
// mpi under mpirun, mpi_<other MPI> under that MPI's launcher (process.h: other_mpi). "gloo_tcp" is gloo with shared memory turned off (Gloo over TCP); "gloo_machines"
// is gloo with the ranks as on machines of two ranks each (BPL_GLOO_HOST_ID), so that 3 ranks take the
// hierarchical path: ranks 0 and 1 share a segment, rank 2 is alone. Checks that no process of the job
// remains and that no segment is left in /dev/shm.
inline Job run_job(const std::string& backend, int ranks, const std::string& scenario,
                   std::map<std::string, std::string> env, std::chrono::seconds limit = std::chrono::seconds(60)) {
  static int jobs = 0;
  const std::string token = "--job=" + std::to_string(getpid()) + "-" + std::to_string(++jobs);
  const std::vector<std::string> argv = {self_path(), "--worker=" + scenario, token};
  const std::string marks = job_marks(token.substr(token.find('=') + 1));
  const bool as_machines = backend == "gloo_machines";
  const bool mpi = backend.rfind("mpi", 0) == 0;
  env["BPL_BACKEND"] = mpi ? "mpi" : "gloo";
  if (backend == "gloo_tcp") env["BPL_GLOO_SHM"] = "0";
  if (env.count("BPL_TIMEOUT_MS") == 0) env["BPL_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
  Job job;
  if (backend == "mpi") {
    job.processes.push_back(run_process(mpirun(ranks, argv), mpi_env(env), limit));
    job.output = job.processes.back().output;
  } else if (mpi) {  // another MPI, under its own launcher
    const OtherMpi* other = other_mpi(backend);
    if (other == nullptr) {
      ADD_FAILURE() << backend << ": " << kNoOtherMpi;
      return {};
    }
    std::vector<std::string> command = other->launch;
    command.push_back(std::to_string(ranks));
    command.insert(command.end(), argv.begin(), argv.end());
    env.insert(other->env.begin(), other->env.end());  // the job's own settings (its timeout) stay
    job.processes.push_back(run_process(command, mpi_env(env), limit));
    job.output = job.processes.back().output;
  } else {
    const int port = free_port();
    env["BPL_TEST_SECOND_PORT"] = std::to_string(free_port());
    std::vector<Process> started;
    for (int r = 0; r < ranks; ++r) {
      auto launch = rank_env(r, ranks, port);
      if (as_machines) launch["BPL_GLOO_HOST_ID"] = "machine-" + std::to_string(r / 2);
      launch.insert(env.begin(), env.end());
      started.push_back(start_process(argv, launch));
    }
    for (auto& process : started) {
      job.processes.push_back(finish_process(process, limit));
      job.output += job.processes.back().output;
    }
    // Each communicator's segment is unlinked once mapped: none outlives the job, however it ended.
    for (auto& process : started) {
      for (const std::string& segment : segments_of(process.pid)) ADD_FAILURE() << "left in /dev/shm: " << segment;
    }
  }
  parse_events(job);
  // Stopped ranks are killed by their helper a few seconds after the job's survivors end.
  for (int waited = 0; waited < 150 && !processes_with(token).empty(); ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(processes_with(token).empty()) << "processes of the job outlived it";
  for (pid_t pid : processes_with(token)) kill(pid, SIGKILL);
  std::error_code ignored;
  std::filesystem::remove_all(marks, ignored);
  return job;
}

#define EXPECT_EVENT(job, rank, name, status_name)                                                        \
  do {                                                                                                    \
    const ::backplane::test::faults::Event* e_ = (job).event(rank, name);                                 \
    ASSERT_NE(e_, nullptr) << "rank " << (rank) << " reported no '" << (name) << "':\n" << (job).output; \
    EXPECT_EQ(e_->status, status_name) << "rank " << (rank) << " " << (name) << ":\n" << (job).output;    \
  } while (0)

// The whole main() of a fault test binary: a worker runs its scenario, otherwise the tests run.
inline int main_with_scenarios(int argc, char** argv, const std::map<std::string, std::function<int()>>& scenarios) {
  char resolved[4096] = {};
  self_path() = realpath("/proc/self/exe", resolved) ? resolved : argv[0];
  if (argc > 1 && std::strncmp(argv[1], "--worker=", 9) == 0) {
    const auto scenario = scenarios.find(argv[1] + 9);
    const bool mpi = env_text("BPL_BACKEND") == "mpi";
    if (scenario != scenarios.end() && argc > 2 && std::strncmp(argv[2], "--job=", 6) == 0 && mpi) {
      own_job_token() = argv[2] + 6;
      mkdir(job_marks(own_job_token()).c_str(), 0700);  // the first rank's; EEXIST for the others
      std::ofstream(job_marks(own_job_token()) + "/" + std::to_string(getpid()) + ".started") << "\n";
      const int code = scenario->second();
      leave_together();
      return code;
    }
    if (scenario != scenarios.end()) return scenario->second();
    std::fprintf(stderr, "unknown worker scenario %s\n", argv[1] + 9);
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace backplane::test::faults
