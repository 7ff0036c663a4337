// Real processes: training runs (dp_train resumed, and killed while saving; gpt_train's pipeline
// against the unsharded model), the MPI backend under a real mpirun, and the Neuron test double.
#include "system/process_test_support.h"

namespace {

using namespace backplane::test::processes;

/* ---- training: dp_train resumed, and killed while saving ---- */

// The "step N loss … grad_norm …" lines of a dp_train run.
std::vector<std::string> step_lines(const std::string& output) {
  std::vector<std::string> lines;
  for (const std::string& line : backplane::test::rank_output_lines(output)) {
    if (line.rfind("step ", 0) == 0) lines.push_back(line);
  }
  return lines;
}

std::string fresh_dir(const std::string& name) {
  std::string dir = "/tmp/bpl-process-test-" + name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// A run resumed from a checkpoint prints exactly the losses of the run that never stopped.
void expect_resumed_run_repeats_losses(const std::string& program,
                                       const std::function<std::vector<std::string>(std::vector<std::string>)>& launch,
                                       const std::map<std::string, std::string>& env, const std::vector<std::string>& flags) {
  const std::string dir = fresh_dir(program);
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {kBin + "/" + program};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    ProcessResult r = run_process(launch(argv), env, std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    return r;
  };
  ProcessResult straight = run({"--steps", "30"});
  ProcessResult first = run({"--steps", "20", "--save-every", "10", "--checkpoint-dir", dir});
  ProcessResult resumed = run({"--steps", "30", "--checkpoint-dir", dir, "--resume"});
  EXPECT_NE(resumed.output.find("resumed from step 20"), std::string::npos) << resumed.output;
  std::vector<std::string> expected = step_lines(straight.output);
  ASSERT_EQ(expected.size(), 30u) << straight.output;
  EXPECT_EQ(step_lines(first.output), std::vector<std::string>(expected.begin(), expected.begin() + 20));
  EXPECT_EQ(step_lines(resumed.output), std::vector<std::string>(expected.begin() + 20, expected.end()));
  std::filesystem::remove_all(dir);
}

std::vector<std::string> under_bpl_run(int ranks, std::vector<std::string> program) {
  std::vector<std::string> argv = {bpl_run, "--nproc-per-node", std::to_string(ranks)};
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

TEST(DpTrain, TensorTimesDataParallelWithZero1OnFourRanks) {
  expect_resumed_run_repeats_losses("dp_train", [](std::vector<std::string> p) { return under_bpl_run(4, p); },
                                    {{"NXD_CPU_MODE", "1"}}, {"--tp", "2", "--zero1"});
}

// The GPT example at TP 2 x PP 2 x DP 2 (8 ranks) trains as the unsharded model does, step by step.
TEST(GptTrain, TensorPipelineAndDataParallelLossesMatchTheUnshardedModel) {
  ProcessResult r = run_process(under_bpl_run(8, {kBin + "/gpt_train", "--tp", "2", "--pp", "2", "--steps", "5",
                                                  "--microbatches", "2", "--recompute", "--check"}),
                                {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(180));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.output.find("tp 2 x pp 2 x dp 2, 2 microbatches, blocks recomputed"), std::string::npos) << r.output;
  EXPECT_EQ(step_lines(r.output).size(), 5u) << r.output;
  EXPECT_NE(r.output.find("check: every step's loss matches the unsharded model's"), std::string::npos) << r.output;
}

// Resumed from a checkpoint (each stage's files), the pipeline repeats the losses of the run that never
// stopped.
TEST(GptTrain, AResumedPipelineRepeatsTheLosses) {
  expect_resumed_run_repeats_losses("gpt_train", [](std::vector<std::string> p) { return under_bpl_run(4, p); },
                                    {{"NXD_CPU_MODE", "1"}}, {"--tp", "2", "--pp", "2", "--zero1"});
}

// 6. A checkpoint damaged after it was written (four bytes of its model shard flipped, the size
//    unchanged) is passed over on resume, said so on every rank: the run resumes from the newest
//    intact one, where before it went on from the damaged weights.
TEST(DpTrain, ResumingPassesOverACorruptedNewestCheckpoint) {
  const std::string dir = fresh_dir("corrupted");
  ProcessResult first = run_process(
      under_bpl_run(2, {kBin + "/dp_train", "--steps", "20", "--save-every", "10", "--checkpoint-dir", dir}),
      {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(120));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const std::string shard = dir + "/step_00020/model/dp_rank_00_tp_rank_00_pp_rank_00.pt";
  {
    std::fstream bytes(shard, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(bytes.good()) << shard;
    const auto middle = static_cast<std::streamoff>(std::filesystem::file_size(shard) / 2);
    char four[4];
    bytes.seekg(middle);
    bytes.read(four, 4);
    for (char& c : four) c = static_cast<char>(~c);
    bytes.seekp(middle);
    bytes.write(four, 4);
  }
  ProcessResult resumed = run_process(
      under_bpl_run(2, {kBin + "/dp_train", "--steps", "25", "--checkpoint-dir", dir, "--resume"}),
      {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(120));
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_NE(resumed.output.find("resumed from step 10 "), std::string::npos) << resumed.output;
  for (int rank : {0, 1}) {
    EXPECT_NE(resumed.output.find("rank " + std::to_string(rank) + ": checkpoint " + dir +
                                  "/step_00020 cannot be loaded by every rank (here: checkpoint file " + shard +
                                  " is corrupt"),
              std::string::npos)
        << resumed.output;
  }
  std::filesystem::remove_all(dir);
}

// 6. A checkpoint one of whose files was deleted (a tensor-parallel shard, with its checksum file) is
//    passed over on resume, naming the missing file, on every rank: its layout is the one it recorded,
//    not the one the remaining files suggest (with one TP file left it was read as TP 1 and resharded,
//    and the run went on from other weights).
TEST(DpTrain, ResumingPassesOverACheckpointMissingAFileNamingIt) {
  const std::string dir = fresh_dir("missing");
  const std::vector<std::string> layout = {"--tp", "2"};
  std::vector<std::string> train = {kBin + "/dp_train", "--steps", "20", "--save-every", "10", "--checkpoint-dir", dir};
  train.insert(train.end(), layout.begin(), layout.end());
  ProcessResult first = run_process(under_bpl_run(4, train), {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(180));
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const std::string shard = dir + "/step_00020/model/dp_rank_00_tp_rank_01_pp_rank_00.pt";
  ASSERT_TRUE(std::filesystem::remove(shard)) << shard;
  std::filesystem::remove(shard + ".crc32");
  std::vector<std::string> resume = {kBin + "/dp_train", "--steps", "25", "--checkpoint-dir", dir, "--resume"};
  resume.insert(resume.end(), layout.begin(), layout.end());
  ProcessResult resumed = run_process(under_bpl_run(4, resume), {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(180));
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_NE(resumed.output.find("resumed from step 10 "), std::string::npos) << resumed.output;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(resumed.output.find("rank " + std::to_string(rank) + ": checkpoint " + dir +
                                  "/step_00020 cannot be loaded by every rank (here: checkpoint " + dir +
                                  "/step_00020 is missing " + shard),
              std::string::npos)
        << resumed.output;
  }
  std::filesystem::remove_all(dir);
}

// The pid of the process whose command line contains `marker` and whose environment has RANK=`rank`.
pid_t find_rank(const std::string& marker, int rank) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmdline(entry.path() / "cmdline"), environ(entry.path() / "environ");
    std::string command((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    std::string variables((std::istreambuf_iterator<char>(environ)), std::istreambuf_iterator<char>());
    if (command.find(marker) != std::string::npos && command.find("dp_train") != std::string::npos &&
        command.rfind("python", 0) == std::string::npos &&
        variables.find(std::string("\0RANK=", 6) + std::to_string(rank) + std::string("\0", 1)) != std::string::npos) {
      return static_cast<pid_t>(std::stoi(name));
    }
  }
  return -1;
}

TEST(DpTrain, ARankKilledWhileSavingLeavesTheNewestCompleteCheckpointLoadable) {
  const std::string dir = fresh_dir("killed-save");
  // A checkpoint every step, written in the background: a kill lands in the middle of one.
  backplane::test::Process job = backplane::test::start_process(
      under_bpl_run(2, {kBin + "/dp_train", "--steps", "100000", "--save-every", "1", "--async-save", "--keep", "3",
                        "--checkpoint-dir", dir}),
      {{"NXD_CPU_MODE", "1"}, {"BPL_TIMEOUT_MS", "5000"}});
  std::string output;
  ASSERT_TRUE(backplane::test::wait_for_output(job, output, "step 30 ", std::chrono::seconds(60))) << output;
  const pid_t victim = find_rank(dir, 1);
  ASSERT_GT(victim, 0) << "rank 1 of the job not found";
  kill(victim, SIGKILL);
  ProcessResult killed = backplane::test::finish_process(job, std::chrono::seconds(60));
  killed.output = output + killed.output;
  EXPECT_FALSE(killed.timed_out) << describe(killed);
  EXPECT_NE(killed.exit_code, 0) << describe(killed);
  EXPECT_NE(killed.output.find("rank 1 (pid " + std::to_string(victim) + ") was killed by SIGKILL"), std::string::npos)
      << killed.output;

  // Every tag marked complete has all its files; the newest one resumes.
  int newest = -1;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!std::filesystem::exists(entry.path() / "done")) continue;
    for (const char* file : {"checkpoint", "user_content.pt", "model/dp_rank_00_tp_rank_00_pp_rank_00.pt",
                             "optim/dp_rank_00_tp_rank_00_pp_rank_00.pt"}) {
      EXPECT_TRUE(std::filesystem::exists(entry.path() / file)) << entry.path() << " is marked done without " << file;
    }
    newest = std::max(newest, std::stoi(entry.path().filename().string().substr(5)));
  }
  ASSERT_GE(newest, 1) << "no complete checkpoint survived";
  ProcessResult resumed = run_process(
      under_bpl_run(2, {kBin + "/dp_train", "--steps", std::to_string(newest + 2), "--checkpoint-dir", dir, "--resume"}),
      {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(60));
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_NE(resumed.output.find("resumed from step " + std::to_string(newest)), std::string::npos) << resumed.output;
  std::printf("killed rank 1 after step 30; newest complete checkpoint: step %d\n", newest);
  std::filesystem::remove_all(dir);
}

/* ---- the MPI backend under a real mpirun ---- */

using backplane::test::kNoMpi;
using backplane::test::mpi_backend_built;
using backplane::test::mpi_env;
using backplane::test::mpirun;

// The "rank N: …" lines, sorted: ranks print in order, but mpirun may forward them in any order.
std::vector<std::string> rank_lines(const std::string& output) {
  std::vector<std::string> lines;
  for (const std::string& line : backplane::test::rank_output_lines(output)) {
    if (line.rfind("rank ", 0) == 0) lines.push_back(line);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

TEST(Mpi, EmbedUnderMpirunPrintsWhatItPrintsOnGloo) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  ProcessResult mpi = run_process(mpirun(3, {embed}), mpi_env({{"BPL_BACKEND", "mpi"}}));
  ASSERT_EQ(mpi.exit_code, 0) << describe(mpi);
  EXPECT_NE(mpi.output.find("backend mpi"), std::string::npos) << mpi.output;
  ProcessResult gloo = run_process({bpl_run, "--nproc-per-node", "3", embed}, {{"BPL_BACKEND", "gloo"}});
  ASSERT_EQ(gloo.exit_code, 0) << describe(gloo);
  EXPECT_EQ(rank_lines(mpi.output).size(), 3u) << mpi.output;
  EXPECT_EQ(rank_lines(mpi.output), rank_lines(gloo.output));
}

// The value of the first "Output sum is X" line, or NaN.
double output_sum(const std::string& output) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex("Output sum is ([-0-9.e+]+)"))) return std::nan("");
  return std::stod(match[1]);
}

TEST(TpMlp, CpuModeAndMpiPrintTheSumOfTheUnshardedMlp) {
  const std::string tp_mlp = kBin + "/tp_mlp";
  ProcessResult gloo = run_process({bpl_run, "--nproc-per-node", "2", tp_mlp, "--check"}, {{"NXD_CPU_MODE", "1"}});
  ASSERT_EQ(gloo.exit_code, 0) << describe(gloo);
  ProcessResult mpi = run_process(mpirun(2, {tp_mlp, "--check"}), mpi_env({}));
  ASSERT_EQ(mpi.exit_code, 0) << describe(mpi);
  for (const ProcessResult* r : {&gloo, &mpi}) {
    EXPECT_EQ(count_of(r->output, "Output sum is "), 1u) << "printed on rank 0 only:\n" << r->output;
    EXPECT_NE(r->output.find("(tp 2, max |difference| "), std::string::npos) << r->output;
    EXPECT_NE(r->output.find("): match"), std::string::npos) << r->output;
  }
  EXPECT_NEAR(output_sum(gloo.output), output_sum(mpi.output), 1e-4) << gloo.output << mpi.output;
}

TEST(DpTrain, ResumingFromACheckpointRepeatsTheLossesOnGlooAndMpi) {
  expect_resumed_run_repeats_losses("dp_train", [](std::vector<std::string> p) { return under_bpl_run(2, p); },
                                    {{"NXD_CPU_MODE", "1"}}, {});
  expect_resumed_run_repeats_losses("dp_train", [](std::vector<std::string> p) { return mpirun(2, p); }, mpi_env({}), {});
}

TEST(Mpi, AutoSelectedUnderMpirunAndDescribedByBplInfo) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  ProcessResult r = run_process(mpirun(2, {kBin + "/bpl-info", "--init"}), mpi_env({}));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.output.find("auto: no Neuron device, launched by an MPI launcher"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("backend      mpi"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("library=Open MPI v"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("thread_level=MPI_THREAD_"), std::string::npos) << r.output;
}

TEST(Mpi, RefusesSeveralRanksWithoutAnMpiLauncher) {
  if (!mpi_backend_built()) GTEST_SKIP() << kNoMpi;
  ProcessResult r = run_process({bpl_run, "--nproc-per-node", "2", embed}, {{"BPL_BACKEND", "mpi"}});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.output.find("BPL_ERR_UNAVAILABLE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("run `mpirun -np 2 <program>`"), std::string::npos) << r.output;
}


#ifdef BPL_NRT_TEST_DOUBLE_DIR
// The examples, unchanged, with BPL_BACKEND=neuron over the test double of libnrt: the frontend's host
// tensors go through the plugin's staging and the double's collectives over sockets. This proves the
// plugin's and the frontend's logic on the runtime's API, not the hardware.
const std::map<std::string, std::string> kNeuronDouble = {
    {"BPL_BACKEND", "neuron"}, {"NEURON_RT_LIB", BPL_NRT_TEST_DOUBLE_DIR "/complete"}, {"NRT_TEST_DOUBLE_CORES", "4"}};

TEST(Neuron, TpMlpAndDpTrainOnTheTestDoubleMatchCpuMode) {
  const std::string tp_mlp = kBin + "/tp_mlp";
  ProcessResult neuron = run_process({bpl_run, "--nproc-per-node", "2", tp_mlp, "--check"}, kNeuronDouble);
  ASSERT_EQ(neuron.exit_code, 0) << describe(neuron);
  EXPECT_NE(neuron.output.find("): match"), std::string::npos) << neuron.output;
  ProcessResult gloo = run_process({bpl_run, "--nproc-per-node", "2", tp_mlp, "--check"}, {{"NXD_CPU_MODE", "1"}});
  EXPECT_NEAR(output_sum(neuron.output), output_sum(gloo.output), 1e-4) << neuron.output << gloo.output;

  const std::vector<std::string> train = {kBin + "/dp_train", "--steps", "8", "--tp", "2", "--zero1"};
  ProcessResult trained = run_process(under_bpl_run(4, train), kNeuronDouble, std::chrono::seconds(120));
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  EXPECT_NE(trained.output.find("backend neuron, 4 rank(s)"), std::string::npos) << trained.output;
  ProcessResult reference = run_process(under_bpl_run(4, train), {{"NXD_CPU_MODE", "1"}}, std::chrono::seconds(120));
  // Same losses; the gradient norm crosses ranks in f32 there (the runtime has no f64), in f64 on Gloo.
  const std::vector<std::string> got = step_lines(trained.output), want = step_lines(reference.output);
  ASSERT_EQ(got.size(), 8u) << trained.output;
  ASSERT_EQ(want.size(), 8u) << reference.output;
  for (size_t i = 0; i < got.size(); ++i) {
    const size_t norm = got[i].find(" grad_norm ");
    EXPECT_EQ(got[i].substr(0, norm), want[i].substr(0, want[i].find(" grad_norm ")));
    EXPECT_NEAR(std::stod(got[i].substr(norm + 11)), std::stod(want[i].substr(norm + 11)), 1e-5) << got[i];
  }
}
#endif

}  // namespace
