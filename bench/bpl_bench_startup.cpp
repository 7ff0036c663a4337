// bpl-bench-startup: what it costs to start a job that only communicates. Each repetition starts the
// embedder's program (bench/startup_probe.c: init, one allreduce of 1024 floats, finalize) as a job of
// 2 ranks on this machine, and reads what its ranks report:
//
//   gloo                 backplane's gloo backend under bpl-run
//   gloo_no_launcher     the same ranks started directly with torchrun's variables, no launcher
//   mpi                  backplane's mpi backend under mpirun
//   raw_mpi              the same program written on Open MPI directly, under mpirun
//
// The time of a repetition is from just before the job's first process is started to the last rank's
// return from init (the launcher's start, loading, MPI_Init or the rendezvous); the counters are the
// first collective's time (the slowest rank's), the peak resident set and the shared objects mapped
// (the largest of any rank), and whether any rank mapped LibTorch. Repetitions of the backends are
// interleaved at random (Google Benchmark's --benchmark_enable_random_interleaving, on unless given), so
// that a slow spell of the machine does not fall on one backend; the median, min and max of each are
// reported beside the mean.
#include <benchmark/benchmark.h>

#include "bench_jobs.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace backplane::bench;

constexpr int kRanks = 2;

long long now_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<long long>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

struct Reading {
  double init_s = 0, first_collective_ms = 0, peak_rss_mb = 0, shared_objects = 0;
  bool libtorch = false;
};

// The slowest rank's times, the largest rank's memory and objects.
Reading read_ranks(const std::string& output, long long started_ns) {
  static const std::regex line(
      "startup rank=(\\d+) init_ns=(\\d+) first_ns=(\\d+) peak_rss_kb=(\\d+) shared_objects=(\\d+) libtorch=(\\d)");
  Reading r;
  int ranks = 0;
  for (std::sregex_iterator m(output.begin(), output.end(), line), end; m != end; ++m, ++ranks) {
    const long long init_ns = std::stoll((*m)[2]), first_ns = std::stoll((*m)[3]);
    r.init_s = std::max(r.init_s, (init_ns - started_ns) / 1e9);
    r.first_collective_ms = std::max(r.first_collective_ms, (first_ns - init_ns) / 1e6);
    r.peak_rss_mb = std::max(r.peak_rss_mb, std::stoll((*m)[4]) / 1024.0);
    r.shared_objects = std::max(r.shared_objects, std::stod((*m)[5]));
    r.libtorch = r.libtorch || (*m)[6] == "1";
  }
  if (ranks != kRanks) throw std::runtime_error("expected a line from each of 2 ranks, got:\n" + output);
  return r;
}

std::vector<std::string> mpirun(const std::string& program) {
  std::vector<std::string> argv{"mpirun", "-np", std::to_string(kRanks)};
  if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
  argv.push_back(program);
  return argv;
}

Reading run_once(const std::string& backend) {
  const std::string probe = bin_dir() + "/bpl-startup-probe";
  const long long started_ns = now_ns();
  if (backend == "gloo") {
    return read_ranks(finish(start({bpl_run(), "--nproc-per-node", std::to_string(kRanks), probe},
                                   {{"BPL_BACKEND", "gloo"}})),
                      started_ns);
  }
  if (backend == "mpi") return read_ranks(finish(start(mpirun(probe), {{"BPL_BACKEND", "mpi"}})), started_ns);
  if (backend == "raw_mpi") return read_ranks(finish(start(mpirun(probe + "-raw-mpi"), {})), started_ns);
  // gloo_no_launcher: the ranks as a scheduler would start them, with torchrun's variables.
  const std::string port = std::to_string(free_port());
  std::vector<Started> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.push_back(start({probe}, {{"BPL_BACKEND", "gloo"},
                                    {"RANK", std::to_string(rank)},
                                    {"WORLD_SIZE", std::to_string(kRanks)},
                                    {"LOCAL_RANK", std::to_string(rank)},
                                    {"LOCAL_WORLD_SIZE", std::to_string(kRanks)},
                                    {"MASTER_ADDR", "127.0.0.1"},
                                    {"MASTER_PORT", port}}));
  }
  std::string output;
  for (const Started& rank : ranks) output += finish(rank);
  return read_ranks(output, started_ns);
}

void BM_Startup(benchmark::State& state, const std::string& backend) {
  for (auto _ : state) {
    try {
      const Reading r = run_once(backend);
      state.SetIterationTime(r.init_s);
      state.counters["first_collective_ms"] = r.first_collective_ms;
      state.counters["peak_rss_MB"] = r.peak_rss_mb;
      state.counters["shared_objects"] = r.shared_objects;
      state.counters["libtorch_mapped"] = r.libtorch ? 1 : 0;
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> backends{"gloo", "gloo_no_launcher"};
  if (::access((bin_dir() + "/bpl-startup-probe-raw-mpi").c_str(), X_OK) == 0) {
    backends.insert(backends.end(), {"mpi", "raw_mpi"});
  }
  for (const std::string& backend : backends) {
    one_job_per_repetition(benchmark::RegisterBenchmark(("startup/" + backend).c_str(), BM_Startup, backend));
  }
  // Defaults of this benchmark, unless given: 10 repetitions, interleaved at random.
  return run_with_defaults(argc, argv, {"--benchmark_repetitions=10", "--benchmark_enable_random_interleaving=true"});
}
