// elastic_sgd: data-parallel training that survives the loss of ranks, on backplane's C API alone.
//
//   bpl-run --nproc-per-node 3 --keep-going build/bin/elastic_sgd --steps 40 --fail-rank 1 --fail-at 10
//   bpl-run --nproc-per-node 3 --replace build/bin/elastic_sgd --replace --fail-rank 1 --fail-at 10
//
// Each step trains a linear model on one global batch (the same samples however many ranks share it):
// every rank takes its share, the gradients are summed with bpl_allreduce, every rank applies the same
// update. When a step fails (a rank was killed or stopped), the survivors revoke the communicator, shrink
// it to themselves (bpl_comm_shrink), and redo that step from what they hold in memory, sharing the
// batch among fewer ranks: no checkpoint is read, and only the step in flight is done again. With
// --replace they then grow back (bpl_comm_grow) with the newcomers bpl-run --replace starts in the
// failed ranks' place, which join (bpl_comm_join) and take the state from rank 0. A rank
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
#include <cstdlib>
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

// What a rank holds: the parameters, those before the last step, and how many steps are in them.
struct Training {
  std::vector<double> w = std::vector<double>(kDim, 0.0);
  std::vector<double> before_last_step = w;
  int64_t done = 0;
};

// The job as this rank sees it: its communicator, its place there, its name in what it prints.
struct Job {
  bpl_runtime* runtime = nullptr;
  bpl_comm* comm = nullptr;
  int32_t rank = 0, size = 1;
  std::string name;  // "rank R" (its rank in the world), or "newcomer" for a replacement

  // Goes on with `next`, destroying the communicator it replaces (the world ends with bpl_finalize).
  void use(bpl_comm* next) {
    leave();
    comm = next;
    bpl_comm_rank(comm, &rank);
    bpl_comm_size(comm, &size);
  }
  void leave() {
    bpl_comm* world = nullptr;
    bpl_comm_world(runtime, &world);
    if (comm != world) bpl_comm_destroy(comm);
    comm = world;
  }
};

// After a failed step: revoke (which releases the members still waiting in it), shrink to the
// survivors, and agree on the step to redo, the lowest not done everywhere. With `replace`, then grow
// back with as many newcomers as ranks failed, and hand them the state. False: this rank is out.
bool recover(Job& job, Training& t, bool replace, bool fail_now, Clock::time_point failed_at) {
  bpl_comm_revoke(job.comm);
  if (fail_now) {  // --fail-also: this rank dies while the survivors shrink
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      raise(SIGKILL);
    }).detach();
  }
  bpl_comm* survivors = nullptr;
  std::vector<int32_t> failed(static_cast<size_t>(job.size));
  int32_t num_failed = 0;
  const bpl_status shrunk = bpl_comm_shrink(job.comm, failed.data(), &num_failed, &survivors);
  if (shrunk != BPL_OK) {
    // The others counted this rank out (it came too late), or it cannot reach the job's store (it is
    // cut off from the job): it stops, and the others go on.
    std::printf("%s: left the job: %s: %s\n", job.name.c_str(), bpl_status_name(shrunk), bpl_last_error());
    return false;
  }
  std::string names;
  for (int32_t i = 0; i < num_failed; ++i) names += (i ? ", " : "") + std::to_string(failed[static_cast<size_t>(i)]);
  const int32_t old_rank = job.rank;
  job.use(survivors);
  std::printf("%s: shrunk %lld ms after the failure: ranks [%s] of the communicator failed; rank %d of %d was rank "
              "%d\n", job.name.c_str(), ms_since(failed_at), names.c_str(), job.rank, job.size, old_rank);
  int64_t lowest = t.done;
  if (bpl_allreduce(job.comm, &lowest, &lowest, 1, BPL_DTYPE_I64, BPL_OP_MIN, nullptr) != BPL_OK) return true;
  if (lowest < t.done) {
    t.w = t.before_last_step;
    t.done = lowest;
    std::printf("%s: took back step %lld, which the others redo\n", job.name.c_str(), static_cast<long long>(t.done));
  }
  if (!replace) return true;
  bpl_comm* grown = nullptr;
  const bpl_status status = bpl_comm_grow(job.comm, num_failed, &grown);
  if (status != BPL_OK) {
    std::printf("%s: grow: %s: %s (going on at %d ranks)\n", job.name.c_str(), bpl_status_name(status),
                bpl_last_error(), job.size);
    return true;
  }
  job.use(grown);
  // The newcomers get the state from rank 0; every rank then holds the same. Should that fail, the next
  // step fails at once on this communicator, and the recovery runs again.
  if (bpl_broadcast(job.comm, &t.done, 1, BPL_DTYPE_I64, 0, nullptr) != BPL_OK ||
      bpl_broadcast(job.comm, t.w.data(), kDim, BPL_DTYPE_F64, 0, nullptr) != BPL_OK) {
    std::printf("%s: handing the state over: %s\n", job.name.c_str(), bpl_last_error());
    return true;
  }
  std::printf("%s: grown %lld ms after the failure: %d rank(s) again\n", job.name.c_str(), ms_since(failed_at), job.size);
  return true;
}

// A replacement (started with BPL_JOIN=1): waits to be admitted, then takes the state from rank 0.
bool join_running_job(Job& job, Training& t) {
  const auto start = Clock::now();
  bpl_comm* joined = nullptr;
  if (bpl_comm_join(job.runtime, &joined) != BPL_OK) {
    std::printf("%s: join: %s\n", job.name.c_str(), bpl_last_error());
    return false;
  }
  job.use(joined);
  if (bpl_broadcast(job.comm, &t.done, 1, BPL_DTYPE_I64, 0, nullptr) != BPL_OK ||
      bpl_broadcast(job.comm, t.w.data(), kDim, BPL_DTYPE_F64, 0, nullptr) != BPL_OK) {
    std::printf("%s: receiving the state: %s\n", job.name.c_str(), bpl_last_error());
    return false;
  }
  t.before_last_step = t.w;
  std::printf("%s: joined as rank %d of %d at step %lld, %lld ms after it started\n", job.name.c_str(), job.rank,
              job.size, static_cast<long long>(t.done), ms_since(start));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 40, fail_rank = -1, fail_at = 10, fail_also = -1, pause_ms = 0;
  bool replace = false;
  std::string fail_how = "kill";
  CLI::App app{"Data-parallel training that survives the loss of ranks (revoke, shrink, redo the step)", "elastic_sgd"};
  app.add_option("--steps", steps, "steps to train")->check(CLI::PositiveNumber);
  app.add_option("--fail-rank", fail_rank, "the rank that fails (default: none)");
  app.add_option("--fail-at", fail_at, "the step it fails in")->check(CLI::NonNegativeNumber);
  app.add_option("--fail-how", fail_how, "kill or stop")->check(CLI::IsMember({"kill", "stop"}));
  app.add_option("--fail-also", fail_also, "a rank killed a moment after it starts to shrink (a second failure)");
  app.add_option("--pause-ms", pause_ms, "a pause after each step, to watch the job or fail a rank by hand")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--replace", replace, "after a failure, grow back with newcomers (as bpl-run --replace starts them)");
  CLI11_PARSE(app, argc, argv);

  Job job;
  if (bpl_init(nullptr, &job.runtime) != BPL_OK) {
    std::fprintf(stderr, "bpl_init: %s\n", bpl_last_error());
    return 1;
  }
  bpl_comm_world(job.runtime, &job.comm);
  bpl_comm_rank(job.comm, &job.rank);
  bpl_comm_size(job.comm, &job.size);
  const char* join = std::getenv("BPL_JOIN");  // started to replace a rank that failed
  const bool newcomer = join != nullptr && std::string(join) == "1";
  const int32_t world_rank = newcomer ? -1 : job.rank;
  job.name = newcomer ? "newcomer" : "rank " + std::to_string(world_rank);

  Training t;
  if (newcomer && !join_running_job(job, t)) {
    bpl_finalize(job.runtime);
    return 3;
  }
  int failures = 0;  // each redoes the step in flight
  Clock::time_point failed_at;
  bool recovering = false;
  while (t.done < steps) {
    if (world_rank == fail_rank && t.done == fail_at) {
      std::printf("%s: failing in step %lld (%s) at %.3f ms of the monotonic clock\n", job.name.c_str(),
                  static_cast<long long>(t.done), fail_how.c_str(), monotonic_ms());
      std::fflush(stdout);
      int64_t timeout_ms = 0;
      bpl_comm_get_timeout(job.comm, &timeout_ms);
      fail_here(fail_how, timeout_ms);
    }
    std::vector<double> summed = gradient_sum(t.w, static_cast<int>(t.done), job.rank, job.size);
    const bpl_status status =
        bpl_allreduce(job.comm, summed.data(), summed.data(), kDim, BPL_DTYPE_F64, BPL_OP_SUM, nullptr);
    if (status == BPL_OK) {
      t.before_last_step = t.w;
      apply_update(t.w, summed);
      ++t.done;
      if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      if (recovering) {
        std::printf("%s: resumed: step %lld done %lld ms after the failure, at %.3f ms of the monotonic clock\n",
                    job.name.c_str(), static_cast<long long>(t.done - 1), ms_since(failed_at), monotonic_ms());
        recovering = false;
      }
      continue;
    }
    // A step failed: every survivor goes through the same recovery, in the same order.
    if (!recovering) failed_at = Clock::now();
    recovering = true;
    ++failures;
    std::printf("%s: failed in step %lld: %s: %s\n", job.name.c_str(), static_cast<long long>(t.done),
                bpl_status_name(status), bpl_last_error());
    if (!recover(job, t, replace, world_rank == fail_also, failed_at)) {
      std::fflush(stdout);
      bpl_finalize(job.runtime);
      return 3;
    }
  }
  std::printf("%s: done: %lld steps, %d failure(s) survived, %d step(s) redone, %d rank(s) left; w =", job.name.c_str(),
              static_cast<long long>(t.done), failures, failures, job.size);
  for (double v : t.w) std::printf(" %.17g", v);
  std::printf("\n");
  std::fflush(stdout);
  job.leave();
  return bpl_finalize(job.runtime) == BPL_OK ? 0 : 1;
}
