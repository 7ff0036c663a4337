// Going on after a failure, in real processes: revoke, agree and shrink (ABI 1.8), and the example
// elastic_sgd training through the loss of ranks (killed, stopped, a second one while the survivors
// shrink, rank 0 under bpl-run), whose parameters must end as those of an uninterrupted run. The job's
// store runs in a process of its own (bpl-store, as bpl-run hosts it), so that it outlives any rank.
// Every job runs under a hard limit, and no process of it may outlive it.
#include <signal.h>

#include <cmath>
#include <regex>
#include <sstream>

#include "support/fault_job.h"

namespace backplane::test::faults {
namespace {

const std::string& bin_dir() {
  static const std::string dir = BPL_BIN_DIR;
  return dir;
}

/* ---------------------------------------------------------------------------------------------- */
/* The rank side: what revoke and agree do, seen by each member.                                  */

int32_t agree_reporting(Rank& r, bpl_comm* comm, int32_t flags, const char* event) {
  std::vector<int32_t> failed(static_cast<size_t>(r.size), -1);
  int32_t num_failed = -1;
  const auto start = Clock::now();
  const bpl_status status = bpl_comm_agree(comm, &flags, failed.data(), &num_failed);
  std::string outcome = " flags=" + std::to_string(flags) + " failed=[";
  for (int32_t i = 0; i < num_failed; ++i) outcome += (i ? "," : "") + std::to_string(failed[static_cast<size_t>(i)]);
  report(r, event, status, start, outcome + "]");
  return flags;
}

// 3 ranks. Ranks 1 and 2 wait in a recv from rank 0 that never comes; rank 0 revokes the world 300 ms
// in. Each reports its recv ("blocked"), a barrier after it ("after"), then all agree, each passing
// flags of its own (7, 14, 6: the AND is 6). With BPL_TEST_CASE=kill, rank 2 is killed instead of
// agreeing, and ranks 0 and 1 agree without it. With late, rank 2 revokes too once released (as a
// survivor does), and rank 1 comes to its recv only after that.
int revoke_then_agree() {
  Rank r = join();
  const bool kill = env_text("BPL_TEST_CASE") == "kill", late = env_text("BPL_TEST_CASE") == "late";
  if (r.rank == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto start = Clock::now();
    report(r, "revoke", bpl_comm_revoke(r.world), start);
    report(r, "revoke_again", bpl_comm_revoke(r.world), start);
  } else {
    if (late && r.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(900));
    int32_t value = 0;
    const auto start = Clock::now();
    report(r, "blocked", bpl_recv(r.world, &value, 1, BPL_DTYPE_I32, 0, 0, nullptr), start);
    if (late && r.rank == 2) bpl_comm_revoke(r.world);
  }
  const auto start = Clock::now();
  report(r, "after", bpl_barrier(r.world, nullptr), start);
  if (kill && r.rank == 2) raise(SIGKILL);
  const int32_t flags[] = {7, 14, 6};
  agree_reporting(r, r.world, flags[r.rank], "agree");
  finalize(r);
  return 0;
}

// 3 ranks; rank 2 stops itself (SIGSTOP) as the allreduce starts and is resumed (SIGCONT) 3 timeouts
// later. Ranks 0 and 1 fail at the timeout, revoke, shrink without it and allreduce on the new
// communicator. Rank 2, resumed, finds the world revoked and is refused by the shrink: the members went
// on without it, so it must not go on alone.
int stopped_then_resumed() {
  Rank r = join();
  if (r.rank == 2) stop_self_then(3 * r.timeout_ms, SIGCONT);
  int64_t value = 1;
  auto start = Clock::now();
  report(r, "allreduce", bpl_allreduce(r.world, &value, &value, 1, BPL_DTYPE_I64, BPL_OP_SUM, nullptr), start);
  bpl_comm_revoke(r.world);
  bpl_comm* survivors = nullptr;
  std::vector<int32_t> failed(3);
  int32_t num_failed = 0;
  start = Clock::now();
  const bpl_status shrunk = bpl_comm_shrink(r.world, failed.data(), &num_failed, &survivors);
  report(r, "shrink", shrunk, start, " failed=" + std::to_string(num_failed));
  if (shrunk == BPL_OK) {
    value = 1;
    start = Clock::now();
    const bpl_status status = bpl_allreduce(survivors, &value, &value, 1, BPL_DTYPE_I64, BPL_OP_SUM, nullptr);
    report(r, "survivors", status, start, " sum=" + std::to_string(value));
    bpl_comm_destroy(survivors);
  }
  finalize(r);
  return 0;
}

// 2 ranks; the job's store (bpl-store, BPL_TEST_STORE_PID) is killed, then rank 1 is killed: rank 0's
// allreduce fails, and its shrink must fail too, saying it is cut off, rather than go on alone.
int store_lost() {
  Rank r = join();
  int64_t value = 1;
  auto start = Clock::now();
  report(r, "first", bpl_allreduce(r.world, &value, &value, 1, BPL_DTYPE_I64, BPL_OP_SUM, nullptr), start);
  if (r.rank == 1) {
    kill(static_cast<pid_t>(env_int("BPL_TEST_STORE_PID", 0)), SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    raise(SIGKILL);
  }
  start = Clock::now();
  report(r, "second", bpl_allreduce(r.world, &value, &value, 1, BPL_DTYPE_I64, BPL_OP_SUM, nullptr), start);
  bpl_comm_revoke(r.world);
  bpl_comm* survivors = nullptr;
  std::vector<int32_t> failed(2);
  int32_t num_failed = 0;
  start = Clock::now();
  report(r, "shrink", bpl_comm_shrink(r.world, failed.data(), &num_failed, &survivors), start);
  if (survivors != nullptr) bpl_comm_destroy(survivors);
  finalize(r);
  return 0;
}

// Revoke, agree and shrink on a backend that cannot (mpi on Open MPI without ULFM).
int unsupported() {
  Rank r = join();
  int32_t flags = 1;
  bpl_comm* out = nullptr;
  auto start = Clock::now();
  report(r, "revoke", bpl_comm_revoke(r.world), start);
  report(r, "agree", bpl_comm_agree(r.world, &flags, nullptr, nullptr), start);
  report(r, "shrink", bpl_comm_shrink(r.world, nullptr, nullptr, &out), start);
  report(r, "grow", bpl_comm_grow(r.world, 1, &out), start);
  report(r, "join", bpl_comm_join(r.runtime, &out), start);
  report(r, "allreduce", bpl_allreduce(r.world, &flags, &flags, 1, BPL_DTYPE_I32, BPL_OP_SUM, nullptr), start);
  finalize(r);
  return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* The test side.                                                                                 */

// A job whose store is served by bpl-store, as bpl-run serves it, and whose ranks run `argv` with a
// launcher's variables ("gloo_tcp": shared memory off; "gloo_machines": ranks as on machines of two).
struct StoreJob {
  Job job;
  ProcessResult store;
};

StoreJob run_with_own_store(const std::string& variant, int ranks, const std::vector<std::string>& argv,
                            const std::string& token, std::map<std::string, std::string> env,
                            bool kill_store_in_scenario = false) {
  StoreJob result;
  const int port = free_port(), store_port = free_port();
  env["BPL_TEST_JOB"] = token;
  Process store =
      start_process({bin_dir() + "/bpl-store", "--port", std::to_string(store_port)}, {{"BPL_TEST_JOB", token}});
  std::string said;
  EXPECT_TRUE(wait_for_output(store, said, "listening", std::chrono::seconds(10))) << said;
  env["BPL_BACKEND"] = "gloo";
  env["BPL_STORE_PORT"] = std::to_string(store_port);
  if (variant == "gloo_tcp") env["BPL_GLOO_SHM"] = "0";
  if (env.count("BPL_TIMEOUT_MS") == 0) env["BPL_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
  if (kill_store_in_scenario) env["BPL_TEST_STORE_PID"] = std::to_string(store.pid);
  std::vector<Process> started;
  for (int r = 0; r < ranks; ++r) {
    auto launch = rank_env(r, ranks, port);
    if (variant == "gloo_machines") launch["BPL_GLOO_HOST_ID"] = "machine-" + std::to_string(r / 2);
    launch.insert(env.begin(), env.end());
    started.push_back(start_process(argv, launch));
  }
  for (auto& process : started) {
    result.job.processes.push_back(finish_process(process, std::chrono::seconds(90)));
    result.job.output += result.job.processes.back().output;
  }
  if (!kill_store_in_scenario) kill(store.pid, SIGTERM);
  result.store = finish_process(store, std::chrono::seconds(10));
  parse_events(result.job);
  return result;
}

std::vector<std::string> scenario(const std::string& name) { return {self_path(), "--worker=" + name}; }

// What elastic_sgd's ranks said: each rank's lines, and its parameters at the end.
struct Training {
  std::map<int, std::vector<std::string>> lines;
  std::map<int, std::vector<double>> parameters;
};

Training training_of(const std::string& output) {
  Training t;
  const std::regex said(R"(^rank (\d+): (.*)$)");
  for (const std::string& line : rank_output_lines(output)) {
    std::smatch m;
    if (!std::regex_match(line, m, said)) continue;
    const int rank = std::stoi(m[1]);
    t.lines[rank].push_back(m[2]);
    const size_t w = line.find("; w =");
    if (line.find(": done:") != std::string::npos && w != std::string::npos) {
      std::istringstream values(line.substr(w + 5));
      for (double v; values >> v;) t.parameters[rank].push_back(v);
    }
  }
  return t;
}

bool said(const Training& t, int rank, const std::string& text) {
  auto it = t.lines.find(rank);
  if (it == t.lines.end()) return false;
  return std::any_of(it->second.begin(), it->second.end(), [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

// The parameters of the same training, uninterrupted, on one rank.
const std::vector<double>& uninterrupted(int steps) {
  static std::map<int, std::vector<double>> runs;
  if (runs.count(steps) == 0) {
    const ProcessResult one = run_process({bin_dir() + "/elastic_sgd", "--steps", std::to_string(steps)},
                                          {{"BPL_BACKEND", "gloo"}, {"WORLD_SIZE", "1"}, {"RANK", "0"}});
    EXPECT_EQ(one.exit_code, 0) << one.output;
    runs[steps] = training_of(one.output).parameters[0];
  }
  return runs[steps];
}

void expect_trained_as_uninterrupted(const Training& t, const std::vector<int>& survivors, int steps,
                                     const std::string& output) {
  const std::vector<double>& reference = uninterrupted(steps);
  ASSERT_EQ(reference.size(), 8u);
  for (int rank : survivors) {
    ASSERT_EQ(t.parameters.count(rank), 1u) << "rank " << rank << " did not finish:\n" << output;
    const std::vector<double>& w = t.parameters.at(rank);
    ASSERT_EQ(w.size(), reference.size()) << output;
    for (size_t d = 0; d < w.size(); ++d) {
      // Only the order of the sums differs (the batch is split among fewer ranks after the failure).
      EXPECT_NEAR(w[d], reference[d], 1e-12 * (1 + std::fabs(reference[d]))) << "rank " << rank << " w[" << d << "]";
      EXPECT_EQ(w[d], t.parameters.at(survivors.front())[d]) << "survivors disagree on w[" << d << "]";
    }
  }
}

class Survive : public ::testing::TestWithParam<std::string> {};

// A rank SIGKILLed as step 6 starts: the survivors shrink without it, redo only that step, and end
// with the parameters of the uninterrupted run.
TEST_P(Survive, KilledRankTheSurvivorsRedoOnlyTheStepInFlightAndEndAsAnUninterruptedRun) {
  const std::string token = unique_token();
  StoreJob run = run_with_own_store(
      GetParam(), 3, {bin_dir() + "/elastic_sgd", "--steps", "20", "--fail-rank", "1", "--fail-at", "6"}, token, {});
  const Training t = training_of(run.job.output);
  EXPECT_EQ(run.job.processes[1].signal, SIGKILL) << run.job.output;
  for (int rank : {0, 2}) {
    EXPECT_EQ(run.job.processes[static_cast<size_t>(rank)].exit_code, 0) << run.job.output;
    EXPECT_TRUE(said(t, rank, "ranks [1] of the communicator failed")) << run.job.output;
    EXPECT_TRUE(said(t, rank, "1 failure(s) survived, 1 step(s) redone, 2 rank(s) left")) << run.job.output;
  }
  expect_trained_as_uninterrupted(t, {0, 2}, 20, run.job.output);
  expect_nothing_left(token);
}

// A rank SIGSTOPped: found at the timeout, counted out by the agreement at the next, and survived.
TEST_P(Survive, StoppedRankIsCountedOutAtTheTimeoutAndTheSurvivorsEndAsAnUninterruptedRun) {
  const std::string token = unique_token();
  StoreJob run = run_with_own_store(GetParam(), 3,
                                    {bin_dir() + "/elastic_sgd", "--steps", "20", "--fail-rank", "2", "--fail-at", "4",
                                     "--fail-how", "stop"},
                                    token, {{"BPL_TIMEOUT_MS", "1000"}});
  const Training t = training_of(run.job.output);
  for (int rank : {0, 1}) {
    EXPECT_EQ(run.job.processes[static_cast<size_t>(rank)].exit_code, 0) << run.job.output;
    EXPECT_TRUE(said(t, rank, "failed in step 4: BPL_ERR_TIMEOUT")) << run.job.output;
    EXPECT_TRUE(said(t, rank, "ranks [2] of the communicator failed")) << run.job.output;
  }
  expect_trained_as_uninterrupted(t, {0, 1}, 20, run.job.output);
  expect_nothing_left(token);
}

// A second rank killed while the survivors shrink: they agree again without it.
TEST_P(Survive, SecondFailureWhileTheSurvivorsShrinkIsSurvivedToo) {
  const std::string token = unique_token();
  StoreJob run = run_with_own_store(GetParam(), 4,
                                    {bin_dir() + "/elastic_sgd", "--steps", "16", "--fail-rank", "1", "--fail-at", "5",
                                     "--fail-also", "3"},
                                    token, {{"BPL_TIMEOUT_MS", "1000"}});
  const Training t = training_of(run.job.output);
  for (int rank : {0, 2}) {
    EXPECT_EQ(run.job.processes[static_cast<size_t>(rank)].exit_code, 0) << run.job.output;
    EXPECT_TRUE(said(t, rank, "ranks [1, 3] of the communicator failed")) << run.job.output;
  }
  expect_trained_as_uninterrupted(t, {0, 2}, 16, run.job.output);
  expect_nothing_left(token);
}

// Revoke releases the members blocked on the communicator, names who revoked it, and refuses later
// operations; then the members agree on the AND of their flags (a killed one counted as failed).
TEST_P(Survive, RevokeReleasesEveryMemberAndAgreeGivesEveryoneTheSameOutcome) {
  for (const std::string which : {"all", "kill", "late"}) {
    SCOPED_TRACE(which);
    const std::string token = unique_token();
    StoreJob run = run_with_own_store(GetParam(), 3, scenario("revoke_then_agree"), token, {{"BPL_TEST_CASE", which}});
    const Job& job = run.job;
    EXPECT_EVENT(job, 0, "revoke", "BPL_OK");
    EXPECT_EVENT(job, 0, "revoke_again", "BPL_OK");
    EXPECT_EVENT(job, 0, "after", "BPL_ERR_REVOKED");
    for (int rank : {1, 2}) {
      EXPECT_EVENT(job, rank, "blocked", "BPL_ERR_REVOKED");
      const Event& blocked = *job.event(rank, "blocked");
      EXPECT_NE(blocked.message.find("revoked (bpl_comm_revoke) by rank 0"), std::string::npos) << blocked.message;
      EXPECT_LT(blocked.ms, 300 + 1000) << "released within a second of the revoke";
      EXPECT_EVENT(job, rank, "after", "BPL_ERR_REVOKED");
      EXPECT_LT(job.event(rank, "after")->ms, 50);
    }
    const std::vector<int> agreeing = which == "kill" ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2};
    const std::string outcome = which == "kill" ? "flags=6 failed=[2]" : "flags=6 failed=[]";
    for (int rank : agreeing) {
      EXPECT_EVENT(job, rank, "agree", "BPL_OK");
      EXPECT_NE(job.event(rank, "agree")->message.find(outcome), std::string::npos) << job.output;
      EXPECT_LT(job.event(rank, "agree")->ms, kTimeoutMs) << "a killed member is known at once";
    }
    expect_nothing_left(token);
  }
}

// A member stopped past the timeout and then resumed finds the others gone on without it, and is
// refused: it does not train on alone (no split brain).
TEST_P(Survive, MemberCountedOutIsRefusedWhenItComesBack) {
  const std::string token = unique_token();
  StoreJob run = run_with_own_store(GetParam(), 3, scenario("stopped_then_resumed"), token, {{"BPL_TIMEOUT_MS", "1000"}});
  const Job& job = run.job;
  for (int rank : {0, 1}) {
    EXPECT_EVENT(job, rank, "allreduce", "BPL_ERR_TIMEOUT");
    EXPECT_EVENT(job, rank, "shrink", "BPL_OK");
    EXPECT_EVENT(job, rank, "survivors", "BPL_OK");
    EXPECT_NE(job.event(rank, "survivors")->message.find("sum=2"), std::string::npos) << job.output;
  }
  EXPECT_EVENT(job, 2, "shrink", "BPL_ERR_REMOTE");
  EXPECT_NE(job.event(2, "shrink")->message.find("counted rank 2 as failed"), std::string::npos) << job.output;
  EXPECT_EQ(job.event(2, "survivors"), nullptr) << job.output;
  expect_nothing_left(token);
}

// A member that cannot reach the job's store does not go on: its shrink fails, saying it is cut off.
TEST_P(Survive, MemberCutOffFromTheStoreDoesNotGoOn) {
  const std::string token = unique_token();
  StoreJob run = run_with_own_store(GetParam(), 2, scenario("store_lost"), token, {}, true);
  const Job& job = run.job;
  EXPECT_EVENT(job, 0, "first", "BPL_OK");
  EXPECT_EVENT(job, 0, "second", "BPL_ERR_REMOTE");
  EXPECT_EVENT(job, 0, "shrink", "BPL_ERR_REMOTE");
  EXPECT_NE(job.event(0, "shrink")->message.find("cut off from the job"), std::string::npos) << job.output;
  EXPECT_LT(job.event(0, "shrink")->ms, kTimeoutMs + 1000) << job.output;
  expect_nothing_left(token);
}

INSTANTIATE_TEST_SUITE_P(Backends, Survive, ::testing::Values("gloo", "gloo_tcp", "gloo_machines"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// Under bpl-run (which serves the store in bpl-store) with --keep-going: rank 0 killed, the others
// train on and the job succeeds.
TEST(SurviveUnderBplRun, RankZeroKilledTheOthersFinishAndTheJobSucceeds) {
  const std::string token = unique_token();
  const ProcessResult run =
      run_process({bin_dir() + "/bpl-run", "--nproc-per-node", "3", "--keep-going", bin_dir() + "/elastic_sgd", "--steps",
                   "20", "--fail-rank", "0", "--fail-at", "7"},
                  {{"BPL_BACKEND", "gloo"}, {"BPL_TIMEOUT_MS", std::to_string(kTimeoutMs)}, {"BPL_TEST_JOB", token}},
                  std::chrono::seconds(90));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("bpl-run: rank 0 (pid"), std::string::npos) << run.output;
  const Training t = training_of(run.output);
  EXPECT_EQ(t.parameters.count(0), 0u) << run.output;
  expect_trained_as_uninterrupted(t, {1, 2}, 20, run.output);
  expect_nothing_left(token);
}

// Under bpl-run --replace: rank 1 killed; the survivors shrink, grow back with the newcomer bpl-run
// starts in its place, hand it the state, and all three end with the uninterrupted run's parameters.
TEST(SurviveUnderBplRun, ANewcomerReplacesAKilledRankAndTheJobEndsAtFullSize) {
  const std::string token = unique_token();
  const ProcessResult run =
      run_process({bin_dir() + "/bpl-run", "--nproc-per-node", "3", "--replace", bin_dir() + "/elastic_sgd", "--replace",
                   "--steps", "20", "--fail-rank", "1", "--fail-at", "7"},
                  {{"BPL_BACKEND", "gloo"}, {"BPL_TIMEOUT_MS", "20000"}, {"BPL_TEST_JOB", token}}, std::chrono::seconds(90));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("bpl-run: rank 1 (pid"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("starting a newcomer in its place"), std::string::npos) << run.output;
  const Training t = training_of(run.output);
  for (int rank : {0, 2}) {
    EXPECT_TRUE(said(t, rank, "grown")) << run.output;
    EXPECT_TRUE(said(t, rank, "3 rank(s) again")) << run.output;
    EXPECT_TRUE(said(t, rank, "1 failure(s) survived, 1 step(s) redone, 3 rank(s) left")) << run.output;
  }
  // The newcomer joins at the step the survivors redo: the one rank 1 failed in, or the one before where
  // a survivor had not yet seen that step's allreduce end (the others then take the step back).
  std::smatch resumed;
  ASSERT_TRUE(std::regex_search(run.output, resumed, std::regex("rank 0: resumed: step ([67]) done"))) << run.output;
  EXPECT_NE(run.output.find("newcomer: joined as rank 2 of 3 at step " + resumed[1].str()), std::string::npos)
      << run.output;
  const size_t newcomer_done = run.output.find("newcomer: done: 20 steps");
  ASSERT_NE(newcomer_done, std::string::npos) << run.output;
  expect_trained_as_uninterrupted(t, {0, 2}, 20, run.output);
  // The newcomer ends with the same parameters, bit for bit.
  const std::string line = run.output.substr(newcomer_done, run.output.find('\n', newcomer_done) - newcomer_done);
  std::istringstream values(line.substr(line.find("w =") + 3));
  std::vector<double> w;
  for (double v; values >> v;) w.push_back(v);
  EXPECT_EQ(w, t.parameters.at(0)) << run.output;
  expect_nothing_left(token);
}

// Under bpl-run --replace, the job is whole again after a second failure while the survivors shrink
// (the first newcomer waits out that longer recovery), and after a stopped rank, which bpl-run kills
// and replaces once the survivors have counted it out.
TEST(SurviveUnderBplRun, TheSizeIsRestoredAfterASecondFailureAndAfterAStoppedRank) {
  const std::vector<std::vector<std::string>> failures = {{"--nproc-per-node", "4", "--fail-also", "2"},
                                                          {"--nproc-per-node", "3", "--fail-how", "stop"}};
  for (const std::vector<std::string>& failure : failures) {
    const std::string size = failure[1];
    const ProcessResult run = run_process(
        {bin_dir() + "/bpl-run", failure[0], size, "--replace", bin_dir() + "/elastic_sgd", "--replace", "--steps", "20",
         "--fail-rank", "1", "--fail-at", "7", failure[2], failure[3]},
        {{"BPL_BACKEND", "gloo"}, {"BPL_TIMEOUT_MS", "2000"}}, std::chrono::seconds(90));
    EXPECT_EQ(run.exit_code, 0) << run.output;
    if (failure[2] == "--fail-how") {
      EXPECT_NE(run.output.find("is stopped and the other ranks counted it out of the job; killing it"), std::string::npos)
          << run.output;
    }
    const Training t = training_of(run.output);
    EXPECT_TRUE(said(t, 0, size + " rank(s) again")) << run.output;
    const std::vector<std::string> lines = rank_output_lines(run.output);
    const auto newcomers_done = std::count_if(lines.begin(), lines.end(), [](const std::string& line) {
      return line.rfind("newcomer: done: 20 steps", 0) == 0;
    });
    EXPECT_EQ(newcomers_done, failure[2] == "--fail-also" ? 2 : 1) << run.output;
  }
}

// A newcomer that no member admits gives up after a recovery's longest quiet, saying so.
TEST(SurviveUnderBplRun, ANewcomerNobodyAdmitsGivesUpAtItsTimeout) {
  const int port = free_port(), store_port = free_port();
  Process store = start_process({bin_dir() + "/bpl-store", "--port", std::to_string(store_port)}, {});
  std::string said_text;
  ASSERT_TRUE(wait_for_output(store, said_text, "listening", std::chrono::seconds(10))) << said_text;
  const ProcessResult newcomer = run_process(
      {bin_dir() + "/elastic_sgd"}, {{"BPL_BACKEND", "gloo"}, {"BPL_JOIN", "1"}, {"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", std::to_string(port)}, {"BPL_STORE_PORT", std::to_string(store_port)},
                                     {"BPL_TIMEOUT_MS", "700"}});
  kill(store.pid, SIGTERM);
  finish_process(store, std::chrono::seconds(10));
  EXPECT_EQ(newcomer.exit_code, 3) << newcomer.output;
  EXPECT_NE(newcomer.output.find("no member of the job admitted this process (bpl_comm_grow) within 5600 ms of the "
                                 "members' last step of recovery (8 x the timeout, 700 ms)"),
            std::string::npos)
      << newcomer.output;
}

// A newcomer needs a store that outlives the ranks (bpl-store): without BPL_STORE_PORT, where rank 0
// would host the store, it is refused at once saying so, not at its timeout as a store that never came.
TEST(SurviveUnderBplRun, ANewcomerWithoutBplStoreIsRefusedAtOnceSayingWhy) {
  const auto start = std::chrono::steady_clock::now();
  const ProcessResult newcomer = run_process(
      {bin_dir() + "/elastic_sgd"}, {{"BPL_BACKEND", "gloo"}, {"BPL_JOIN", "1"}, {"MASTER_ADDR", "127.0.0.1"},
                                     {"MASTER_PORT", std::to_string(free_port())}, {"BPL_TIMEOUT_MS", "5000"}});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3)) << newcomer.output;
  EXPECT_NE(newcomer.exit_code, 0) << newcomer.output;
  EXPECT_NE(newcomer.output.find("BPL_JOIN=1: a newcomer joins through a store that outlives the job's ranks, "
                                 "bpl-store at MASTER_ADDR and BPL_STORE_PORT (got MASTER_ADDR='127.0.0.1' and no "
                                 "BPL_STORE_PORT); rank 0's store admits no process after the job's first rendezvous"),
            std::string::npos)
      << newcomer.output;
}

// MPI on Open MPI without ULFM: each (grow and join too) is UNSUPPORTED, and the communicator still works.
TEST(SurviveMpi, RevokeAgreeAndShrinkAreUnsupportedAndLeaveTheCommunicatorWorking) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  const Job job = run_job("mpi", 2, "unsupported", {});
  for (int rank : {0, 1}) {
    for (const char* call : {"revoke", "agree", "shrink", "grow", "join"}) {
      EXPECT_EVENT(job, rank, call, "BPL_ERR_UNSUPPORTED");
      EXPECT_NE(job.event(rank, call)->message.find("backend 'mpi'"), std::string::npos) << job.output;
    }
    EXPECT_EVENT(job, rank, "allreduce", "BPL_OK");
  }
}

}  // namespace
}  // namespace backplane::test::faults

int main(int argc, char** argv) {
  using namespace backplane::test::faults;
  return main_with_scenarios(argc, argv, {{"revoke_then_agree", revoke_then_agree},
                                          {"stopped_then_resumed", stopped_then_resumed},
                                          {"store_lost", store_lost},
                                          {"unsupported", unsupported}});
}
