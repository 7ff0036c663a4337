// elastic_sgd: data-parallel training that survives the loss of ranks, on backplane's C API alone.
//
//   bpl-run --nproc-per-node 3 --keep-going build/bin/elastic_sgd --steps 40 --fail-rank 1 --fail-at 10
//
// Each step trains a linear model on one global batch (the same samples however many ranks share it):
// every rank takes its share, the gradients are summed with bpl_allreduce, every rank applies the same
// update. When a step fails (a rank was killed or stopped), the survivors revoke the communicator, shrink
// it to themselves (bpl_comm_shrink), and redo that step from what they hold in memory, sharing the
// batch among fewer ranks: no checkpoint is read, and only the step in flight is done again. A rank
// whose allreduce had completed before the failure (its part of the result was whole) is a step ahead:
// it takes back that step's update, so that every survivor redoes the same one. The parameters at the
// end are those of an uninterrupted run (up to the order of floating-point sums).
//
// --fail-rank R --fail-at S make rank R fail in step S, to see it happen: --fail-how kill (SIGKILL,
// as the step starts) or stop (SIGSTOP: found at the communicator's timeout, BPL_TIMEOUT_MS);
// --fail-also R2 kills rank R2 while the survivors shrink. Each rank prints what it went through, one
// line per event, and its parameters at the end.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "backplane/backplane.h"

namespace {

constexpr int kDim = 8;           // the model: y = w . x
constexpr int kGlobalBatch = 24;  // samples per step, shared among the ranks
constexpr double kLearningRate = 0.05;

using Clock = std::chrono::steady_clock;

// Sample `i` of step `step`, the same on every rank and in every run.
void sample(int step, int i, double x[kDim], double* y) {
  *y = 0;
  for (int d = 0; d < kDim; ++d) {
    x[d] = static_cast<double>((step * 131 + i * 31 + d * 7) % 17 - 8) / 8.0;
    *y += x[d] * (d + 1) / 4.0;
  }
}

// The sum of the squared-error gradients over this rank's share of the step's batch: samples
// rank, rank + size, rank + 2*size, …
std::vector<double> gradient_sum(const std::vector<double>& w, int step, int rank, int size) {
  std::vector<double> sum(kDim, 0.0);
  for (int i = rank; i < kGlobalBatch; i += size) {
    double x[kDim], y;
    sample(step, i, x, &y);
    double error = -y;
    for (int d = 0; d < kDim; ++d) error += w[d] * x[d];
    for (int d = 0; d < kDim; ++d) sum[d] += error * x[d];
  }
  return sum;
}

void apply_update(std::vector<double>& w, const std::vector<double>& summed) {
  for (int d = 0; d < kDim; ++d) w[d] -= kLearningRate * summed[d] / kGlobalBatch;
}

// Milliseconds of the machine's monotonic clock, which every process reads alike: when a rank failed
// and when the others went on (bpl-bench-recovery times the recovery by them).
double monotonic_ms() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

long long ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// Kills this process, or stops it: a stopped one is killed by a helper process after 4 timeouts, by
// when the survivors have gone on without it.
void fail_here(const std::string& how, int64_t timeout_ms) {
  if (how == "kill") raise(SIGKILL);
  const pid_t me = getpid();
  if (fork() == 0) {  // only async-signal-safe calls in the child: the parent has threads
    const int64_t ms = 4 * timeout_ms;
    struct timespec pause = {static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
    nanosleep(&pause, nullptr);
    kill(me, SIGKILL);
    _exit(0);
  }
  raise(SIGSTOP);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 40, fail_rank = -1, fail_at = 10, fail_also = -1, pause_ms = 0;
  std::string fail_how = "kill";
  CLI::App app{"Data-parallel training that survives the loss of ranks (revoke, shrink, redo the step)", "elastic_sgd"};
  app.add_option("--steps", steps, "steps to train")->check(CLI::PositiveNumber);
  app.add_option("--fail-rank", fail_rank, "the rank that fails (default: none)");
  app.add_option("--fail-at", fail_at, "the step it fails in")->check(CLI::NonNegativeNumber);
  app.add_option("--fail-how", fail_how, "kill or stop")->check(CLI::IsMember({"kill", "stop"}));
  app.add_option("--fail-also", fail_also, "a rank killed a moment after it starts to shrink (a second failure)");
  app.add_option("--pause-ms", pause_ms, "a pause after each step, to watch the job or fail a rank by hand")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  bpl_runtime* runtime = nullptr;
  if (bpl_init(nullptr, &runtime) != BPL_OK) {
    std::fprintf(stderr, "bpl_init: %s\n", bpl_last_error());
    return 1;
  }
  bpl_comm* comm = nullptr;
  bpl_comm_world(runtime, &comm);
  int32_t world_rank = 0, rank = 0, size = 1;
  bpl_comm_rank(comm, &world_rank);
  bpl_comm_size(comm, &size);
  rank = world_rank;

  std::vector<double> w(kDim, 0.0), before_last_step = w;
  int64_t done = 0;  // steps whose update is in w
  int failures = 0, redone = 0;
  Clock::time_point failed_at;
  bool recovering = false;
  while (done < steps) {
    if (world_rank == fail_rank && done == fail_at) {
      std::printf("rank %d: failing in step %lld (%s) at %.3f ms of the monotonic clock\n", world_rank,
                  static_cast<long long>(done), fail_how.c_str(), monotonic_ms());
      std::fflush(stdout);
      int64_t timeout_ms = 0;
      bpl_comm_get_timeout(comm, &timeout_ms);
      fail_here(fail_how, timeout_ms);
    }
    std::vector<double> summed = gradient_sum(w, static_cast<int>(done), rank, size);
    const bpl_status status = bpl_allreduce(comm, summed.data(), summed.data(), kDim, BPL_DTYPE_F64, BPL_OP_SUM, nullptr);
    if (status == BPL_OK) {
      before_last_step = w;
      apply_update(w, summed);
      ++done;
      if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      if (recovering) {
        std::printf("rank %d: resumed: step %lld done %lld ms after the failure, at %.3f ms of the monotonic clock\n",
                    world_rank, static_cast<long long>(done - 1), ms_since(failed_at), monotonic_ms());
        recovering = false;
      }
      continue;
    }
    // A step failed: every survivor goes through the same recovery, in the same order.
    if (!recovering) failed_at = Clock::now();
    recovering = true;
    ++failures;
    std::printf("rank %d: failed in step %lld: %s: %s\n", world_rank, static_cast<long long>(done),
                bpl_status_name(status), bpl_last_error());
    bpl_comm_revoke(comm);  // releases the members still waiting in the step
    bpl_comm* survivors = nullptr;
    std::vector<int32_t> failed(static_cast<size_t>(size));
    int32_t num_failed = 0;
    if (world_rank == fail_also) {
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        raise(SIGKILL);
      }).detach();
    }
    bpl_status shrunk = bpl_comm_shrink(comm, failed.data(), &num_failed, &survivors);
    if (shrunk != BPL_OK) {
      // The others counted this rank out (it came too late), or it cannot reach the job's store (it is
      // cut off from the job): it stops, and the others go on.
      std::printf("rank %d: left the job: %s: %s\n", world_rank, bpl_status_name(shrunk), bpl_last_error());
      std::fflush(stdout);
      bpl_finalize(runtime);
      return 3;
    }
    std::string names;
    for (int32_t i = 0; i < num_failed; ++i) names += (i ? ", " : "") + std::to_string(failed[static_cast<size_t>(i)]);
    int32_t old_rank = rank;
    bpl_comm_rank(survivors, &rank);
    bpl_comm_size(survivors, &size);
    std::printf("rank %d: shrunk %lld ms after the failure: ranks [%s] of the communicator failed; rank %d of "
                "%d was rank %d\n", world_rank, ms_since(failed_at), names.c_str(), rank, size, old_rank);
    bpl_comm* world_comm = nullptr;
    bpl_comm_world(runtime, &world_comm);
    if (comm != world_comm) bpl_comm_destroy(comm);
    comm = survivors;
    // Every survivor redoes the same step: the lowest not yet done anywhere.
    int64_t lowest = done;
    if (bpl_allreduce(comm, &lowest, &lowest, 1, BPL_DTYPE_I64, BPL_OP_MIN, nullptr) != BPL_OK) continue;
    if (lowest < done) {
      w = before_last_step;
      done = lowest;
      std::printf("rank %d: took back step %lld, which the others redo\n", world_rank, static_cast<long long>(done));
    }
    ++redone;
  }
  std::printf("rank %d: done: %lld steps, %d failure(s) survived, %d step(s) redone, %d rank(s) left; w =", world_rank,
              static_cast<long long>(done), failures, redone, size);
  for (double v : w) std::printf(" %.17g", v);
  std::printf("\n");
  std::fflush(stdout);
  bpl_comm* world_comm = nullptr;
  bpl_comm_world(runtime, &world_comm);
  if (comm != world_comm) bpl_comm_destroy(comm);
  return bpl_finalize(runtime) == BPL_OK ? 0 : 1;
}
