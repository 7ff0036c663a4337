// bpl-bench-recovery: how fast a data-parallel training goes on after it loses a rank. Each repetition
// runs a training as a job under bpl-run --keep-going; one rank fails in step 5 and the survivors
// revoke, shrink and redo that step. Its time is from the failure (the failing rank's last word, on the
// machine's monotonic clock) to the last survivor's next completed step. The training is
//
//   sgd/…     examples/elastic_sgd: a linear model on backplane's C API (bpl_comm_shrink, _grow)
//   torch/…   examples/elastic_train: an MLP with Adam through the LibTorch frontend's ElasticTrainer
//             (measured where the frontend is built)
//
// and the failure
//
//   …/kill/<ranks>ranks/<path>    the rank is SIGKILLed: its peers see its connections end at once
//   …/stop/<ranks>ranks/<path>    the rank is SIGSTOPped: found at the communicator's timeout, then counted
//                                 out by the survivors' agreement at the next (BPL_TIMEOUT_MS=1000 here)
//   …/replace/<ranks>ranks/<path> killed, and bpl-run --replace starts a newcomer in its place: the
//                                 survivors shrink, then grow back and hand it the state; the time is to
//                                 the first step done at full size again (a process started, its
//                                 initialisation, join)
//
// <path> is shm (every rank on this machine: shared memory) or tcp (BPL_GLOO_SHM=0: Gloo's TCP pairs).
// Counters: steps_redone (the target is 1: only the step in flight), ranks_left. Repetitions of the
// cases are interleaved at random, and the median, min and max are reported beside the mean.
#include <benchmark/benchmark.h>

#include <signal.h>

#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

#include "bench_jobs.h"

namespace {

using namespace backplane::bench;

constexpr int kFailAt = 5;
constexpr int kStoppedTimeoutMs = 1000;

struct Recovery {
  double seconds = 0;
  double steps_redone = 0;
  double ranks_left = 0;
};

Recovery run_once(const std::string& program, const std::string& how, int ranks, const std::string& path) {
  std::map<std::string, std::string> env{{"BPL_BACKEND", "gloo"}};
  if (path == "tcp") env["BPL_GLOO_SHM"] = "0";
  if (how == "stop") env["BPL_TIMEOUT_MS"] = std::to_string(kStoppedTimeoutMs);
  const bool replace = how == "replace";
  std::vector<std::string> argv{bpl_run(), "--nproc-per-node", std::to_string(ranks), replace ? "--replace" : "--keep-going",
                                bin_dir() + "/" + program, "--steps", "12", "--fail-rank", std::to_string(ranks - 1),
                                "--fail-at", std::to_string(kFailAt), "--fail-how", replace ? "kill" : how};
  if (replace) argv.push_back("--replace");
  const std::string output = finish(start(argv, env));
  static const std::regex failing(R"(failing in step \d+ \([^)]*\) at ([\d.]+) ms of the monotonic clock)");
  static const std::regex resumed(R"(resumed: step \d+ done (?:\d+ ms after the failure, )?at ([\d.]+) ms)");
  static const std::regex done(R"(done: \d+ steps, \d+ failure\(s\) survived, (\d+) step\(s\) redone, (\d+) rank)");
  std::smatch m;
  if (!std::regex_search(output, m, failing)) throw std::runtime_error("no rank failed:\n" + output);
  const double failed_ms = std::stod(m[1]);
  double last_resumed_ms = 0;
  int survivors = 0;
  Recovery r;
  for (std::sregex_iterator it(output.begin(), output.end(), resumed), end; it != end; ++it, ++survivors) {
    last_resumed_ms = std::max(last_resumed_ms, std::stod((*it)[1]));
  }
  for (std::sregex_iterator it(output.begin(), output.end(), done), end; it != end; ++it) {
    r.steps_redone = std::max(r.steps_redone, std::stod((*it)[1]));
    r.ranks_left = std::stod((*it)[2]);
  }
  if (survivors != ranks - 1) throw std::runtime_error("not every survivor went on:\n" + output);
  if (replace && r.ranks_left != ranks) throw std::runtime_error("the job did not end at full size:\n" + output);
  r.seconds = (last_resumed_ms - failed_ms) / 1e3;
  return r;
}

void BM_Recovery(benchmark::State& state, const std::string& program, const std::string& how, int ranks,
                 const std::string& path) {
  for (auto _ : state) {
    try {
      const Recovery r = run_once(program, how, ranks, path);
      state.SetIterationTime(r.seconds);
      state.counters["steps_redone"] = r.steps_redone;
      state.counters["ranks_left"] = r.ranks_left;
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  std::vector<std::pair<std::string, std::string>> trainings{{"sgd", "elastic_sgd"}};
  if (::access((bin_dir() + "/elastic_train").c_str(), X_OK) == 0) trainings.emplace_back("torch", "elastic_train");
  for (const auto& [name, program] : trainings) {
    for (const std::string how : {"kill", "stop", "replace"}) {
      for (int ranks : {2, 3, 4}) {
        for (const std::string path : {"shm", "tcp"}) {
          one_job_per_repetition(benchmark::RegisterBenchmark(
              (name + "/" + how + "/" + std::to_string(ranks) + "ranks/" + path).c_str(), BM_Recovery, program, how,
              ranks, path));
        }
      }
    }
  }
  return run_with_defaults(argc, argv, {"--benchmark_repetitions=5", "--benchmark_enable_random_interleaving=true"});
}
