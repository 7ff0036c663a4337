// The persistent compile cache: settings from NEURON_CC_FLAGS and BPL_CACHE_*, hits that do not
// compile, LRU eviction with TTL protection, recorded failures, corrupt entries, --no_cache, several
// processes compiling one program at once, and the bpl-cache tool.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "compile_cache.h"
#include "error.h"
#include "support/process.h"

namespace backplane {
namespace {

namespace fs = std::filesystem;

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

TEST(CacheConfig, NeuronCcFlagsAsTheReferenceDescribes) {
  CacheConfig defaults = cache_config("neuron", env_of({}), "");
  EXPECT_EQ(defaults.root, "/var/tmp/neuron-compile-cache");
  EXPECT_EQ(defaults.size_limit, 100ull * 1000 * 1000 * 1000);
  EXPECT_EQ(defaults.ttl_days, 30);
  EXPECT_FALSE(defaults.disabled);
  EXPECT_FALSE(defaults.retry_failed);

  CacheConfig flags = cache_config(
      "neuron",
      env_of({{"NEURON_CC_FLAGS", "--model-type=transformer --cache_dir=/data/c --cache_size=16777216 --cache_ttl 60 "
                                  "--retry_failed_compilation --log_level=INFO -O1"}}),
      "");
  EXPECT_EQ(flags.root, "/data/c/neuron-compile-cache");
  EXPECT_EQ(flags.size_limit, 16777216u);
  EXPECT_EQ(flags.ttl_days, 60);
  EXPECT_TRUE(flags.retry_failed);
  EXPECT_EQ(flags.log_level, "INFO");
  EXPECT_EQ(flags.compiler_flags, "--model-type=transformer -O1") << "cache options are not compiler flags";

  EXPECT_TRUE(cache_config("gloo", env_of({{"NEURON_CC_FLAGS", "--no_cache"}}), "").disabled);
  EXPECT_EQ(cache_config("gloo", env_of({}), "").root, "/var/tmp/gloo-compile-cache");
}

TEST(CacheConfig, BplVariablesAndProgramFlagsTakePrecedence) {
  auto env = env_of({{"NEURON_CC_FLAGS", "--cache_dir=/a --cache_size=10"}, {"BPL_CACHE_DIR", "/b"},
                     {"BPL_CACHE_SIZE", "20"}, {"BPL_CACHE_TTL_DAYS", "2"}, {"BPL_CACHE_DISABLE", "1"}});
  CacheConfig config = cache_config("gloo", env, "--cache_ttl=9");
  EXPECT_EQ(config.root, "/b");
  EXPECT_EQ(config.size_limit, 20u);
  EXPECT_EQ(config.ttl_days, 2);
  EXPECT_TRUE(config.disabled);
  EXPECT_EQ(cache_config("gloo", env_of({{"NEURON_CC_FLAGS", "--cache_ttl=3"}}), "--cache_ttl=9").ttl_days, 9);
}

TEST(CacheConfig, BadValuesAreNamed) {
  auto expect_invalid = [](std::map<std::string, std::string> vars, const std::string& flags, const char* fragment) {
    try {
      cache_config("gloo", env_of(vars), flags);
      ADD_FAILURE() << "expected an error mentioning " << fragment;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), BPL_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_invalid({{"NEURON_CC_FLAGS", "--cache_size=lots"}}, "", "NEURON_CC_FLAGS: --cache_size=lots");
  expect_invalid({}, "--cache_ttl=-1", "program flags: --cache_ttl=-1");
  expect_invalid({{"NEURON_CC_FLAGS", "--cache_dir"}}, "", "--cache_dir needs a value");
  expect_invalid({{"BPL_CACHE_SIZE", "1e9"}}, "", "BPL_CACHE_SIZE='1e9'");
}

class Cache : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/bpl-cache-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    root_ = dir;
    config_.root = root_ + "/gloo-compile-cache";
  }
  void TearDown() override { fs::remove_all(root_); }

  CompileCache cache() { return CompileCache(config_, std::chrono::seconds(10)); }

  // Compiles `source` to "artifact:<source>" through the cache, counting real compilations.
  std::vector<char> build(CompileCache& cache, const std::string& source, int* compiled = nullptr) {
    CompileCache::Key key{"test-1.0", "", source.data(), source.size()};
    return cache.get_or_compile(key, [&] {
      if (compiled) ++*compiled;
      std::string artifact = "artifact:" + source;
      return std::vector<char>(artifact.begin(), artifact.end());
    });
  }
  std::string entry(CompileCache& cache, const std::string& source) {
    return cache.entry_path({"test-1.0", "", source.data(), source.size()});
  }
  // Moves an entry's last use `days` into the past.
  void age(const std::string& entry_path, int days) {
    fs::last_write_time(fs::path(entry_path) / "model.hits",
                        fs::file_time_type::clock::now() - std::chrono::hours(24) * days);
  }

  std::string root_;
  CacheConfig config_;
};

TEST_F(Cache, HitDoesNotCompile) {
  CompileCache c = cache();
  int compiled = 0;
  const uint64_t before = CompileCache::compile_count();
  EXPECT_EQ(std::string(build(c, "program A", &compiled).data(), 17), "artifact:program ");
  EXPECT_EQ(compiled, 1);
  std::vector<char> again = build(c, "program A", &compiled);
  EXPECT_EQ(compiled, 1) << "a hit compiled";
  EXPECT_EQ(CompileCache::compile_count(), before + 1);
  EXPECT_EQ(std::string(again.begin(), again.end()), "artifact:program A");
  std::vector<CompileCache::Entry> entries = c.list();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].hits, 1u);
  EXPECT_EQ(entries[0].compiles, 1u);
  EXPECT_EQ(entries[0].size, again.size());
  EXPECT_EQ(entries[0].compiler, "test-1.0");
  // Other flags, another compiler version, another program: other entries.
  CompileCache::Key flagged{"test-1.0", "-O3", "program A", 9};
  c.get_or_compile(flagged, [&] { ++compiled; return std::vector<char>{'x'}; });
  CompileCache::Key upgraded{"test-2.0", "", "program A", 9};
  c.get_or_compile(upgraded, [&] { ++compiled; return std::vector<char>{'y'}; });
  EXPECT_EQ(compiled, 3);
  EXPECT_EQ(c.list().size(), 3u);
}

TEST_F(Cache, EvictsLeastRecentlyUsedAboveTheLimitButNeverWithinTheTtl) {
  config_.size_limit = 1u << 20;
  config_.ttl_days = 30;
  CompileCache c = cache();
  for (const char* source : {"old", "older", "oldest", "fresh"}) build(c, source);
  age(entry(c, "old"), 40);
  age(entry(c, "older"), 50);
  age(entry(c, "oldest"), 60);
  EXPECT_EQ(c.prune(), 0u) << "nothing is evicted below the size limit";

  // Artifacts are "artifact:" + source: 12 + 14 + 15 + 14 = 55 bytes; a limit of 30 must evict the two
  // least recently used (oldest, then older), leaving 26.
  config_.size_limit = 30;
  CompileCache limited = cache();
  EXPECT_GT(limited.prune(), 0u);
  EXPECT_FALSE(fs::exists(entry(limited, "oldest"))) << "least recently used goes first";
  EXPECT_FALSE(fs::exists(entry(limited, "older")));
  EXPECT_TRUE(fs::exists(entry(limited, "old")));
  EXPECT_TRUE(fs::exists(entry(limited, "fresh")));

  // Above the limit, but everything used within the TTL: kept.
  config_.size_limit = 1;
  CompileCache tiny = cache();
  age(entry(tiny, "old"), 1);
  tiny.prune();
  EXPECT_TRUE(fs::exists(entry(tiny, "old"))) << "an entry used within the TTL was evicted";
  EXPECT_TRUE(fs::exists(entry(tiny, "fresh")));
}

TEST_F(Cache, FailedCompilationIsRecordedAndRetriedOnlyWhenAsked) {
  CompileCache c = cache();
  int attempts = 0;
  CompileCache::Key key{"test-1.0", "", "broken", 6};
  auto failing = [&]() -> std::vector<char> {
    ++attempts;
    throw Error(BPL_ERR_INVALID_ARGUMENT, "syntax error at line 1");
  };
  EXPECT_THROW(c.get_or_compile(key, failing), Error);
  EXPECT_EQ(attempts, 1);
  try {
    c.get_or_compile(key, failing);
    ADD_FAILURE() << "a recorded failure was not replayed";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), BPL_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("cached failed compilation"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("syntax error at line 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--retry_failed_compilation"), std::string::npos) << e.what();
  }
  EXPECT_EQ(attempts, 1) << "replaying a failure must not compile";

  config_.retry_failed = true;
  CompileCache retrying = cache();
  std::vector<char> fixed = retrying.get_or_compile(key, [&] { ++attempts; return std::vector<char>{'o', 'k'}; });
  EXPECT_EQ(attempts, 2);
  EXPECT_EQ(std::string(fixed.begin(), fixed.end()), "ok");
  EXPECT_FALSE(fs::exists(fs::path(entry(retrying, "broken")) / "model.failed"));
  int compiled = 0;
  CompileCache plain = cache();
  plain.get_or_compile(key, [&] { ++compiled; return std::vector<char>{}; });
  EXPECT_EQ(compiled, 0) << "the retried success is a normal hit now";
}

TEST_F(Cache, CorruptOrTruncatedEntryIsRecompiledNotTrusted) {
  CompileCache c = cache();
  int compiled = 0;
  build(c, "program B", &compiled);
  const fs::path artifact = fs::path(entry(c, "program B")) / "model.bin";
  {
    std::fstream file(artifact, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(3);
    file.put('#');  // same size, other bytes
  }
  std::vector<char> rebuilt = build(c, "program B", &compiled);
  EXPECT_EQ(compiled, 2);
  EXPECT_EQ(std::string(rebuilt.begin(), rebuilt.end()), "artifact:program B");
  fs::resize_file(artifact, 4);  // truncated
  rebuilt = build(c, "program B", &compiled);
  EXPECT_EQ(compiled, 3);
  EXPECT_EQ(std::string(rebuilt.begin(), rebuilt.end()), "artifact:program B");
  build(c, "program B", &compiled);
  EXPECT_EQ(compiled, 3) << "the rebuilt entry is trusted again";
}

// 10. A marker that does not parse is said to be garbled, and the entry is rebuilt (not taken for a
//     hash collision, and left broken for good).
TEST_F(Cache, AGarbledMarkerIsRepaired) {
  CompileCache c = cache();
  int compiled = 0;
  build(c, "program D", &compiled);
  const fs::path done = fs::path(entry(c, "program D")) / "model.done";
  std::ofstream(done) << "\x01\x02 not a marker";
  testing::internal::CaptureStderr();
  std::vector<char> rebuilt = build(c, "program D", &compiled);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(compiled, 2);
  EXPECT_EQ(std::string(rebuilt.begin(), rebuilt.end()), "artifact:program D");
  EXPECT_NE(said.find("entry marker " + done.string() + " is garbled; recompiling the entry"), std::string::npos) << said;
  EXPECT_EQ(said.find("collision"), std::string::npos) << said;
  build(c, "program D", &compiled);
  EXPECT_EQ(compiled, 2) << "the rebuilt entry is a hit again";
}

// 10. An entry this process may not read (another user's, readable by its owner only) is compiled
//     without the cache, saying so: not reported as a lock another process held for the timeout.
TEST_F(Cache, AnEntryThisUserMayNotReadIsSaidSo) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to make an entry of another user";
  CompileCache c = cache();
  build(c, "private program");
  const fs::path dir = entry(c, "private program");
  for (fs::path folder = dir; folder.string().size() >= root_.size(); folder = folder.parent_path()) {
    fs::permissions(folder, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
  }
  for (const auto& file : fs::directory_iterator(dir)) fs::permissions(file.path(), fs::perms::owner_read | fs::perms::owner_write);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  if (child == 0) {  // as nobody
    dup2(pipe_fds[1], 2);
    close(pipe_fds[0]);
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(3);
    CompileCache as_nobody = cache();
    int compiled = 0;
    std::vector<char> got = build(as_nobody, "private program", &compiled);
    _exit(compiled == 1 && std::string(got.begin(), got.end()) == "artifact:private program" ? 0 : 1);
  }
  close(pipe_fds[1]);
  std::string said;
  char buffer[512];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) said.append(buffer, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << said;
  EXPECT_NE(said.find("cannot read " + (dir / "model.done").string() + ": Permission denied; compiling without the cache"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("held"), std::string::npos) << said;
}

TEST_F(Cache, NoCacheWritesNothing) {
  config_.disabled = true;
  CompileCache c = cache();
  int compiled = 0;
  build(c, "program C", &compiled);
  build(c, "program C", &compiled);
  EXPECT_EQ(compiled, 2);
  EXPECT_FALSE(fs::exists(config_.root));
}

TEST_F(Cache, FourProcessesCompilingOneProgramLeaveOneValidEntry) {
  std::vector<pid_t> children;
  for (int i = 0; i < 4; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      CompileCache c = cache();
      int compiled = 0;
      std::string source = "shared program";
      CompileCache::Key key{"test-1.0", "", source.data(), source.size()};
      std::vector<char> got = c.get_or_compile(key, [&] {
        ++compiled;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a slow compiler
        std::string artifact(100000, 'z');
        return std::vector<char>(artifact.begin(), artifact.end());
      });
      _exit(got.size() == 100000 && got[99999] == 'z' ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a process got a wrong artifact";
  }
  CompileCache c = cache();
  std::vector<CompileCache::Entry> entries = c.list();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].compiles, 1u) << "more than one process compiled";
  EXPECT_EQ(entries[0].hits, 3u);
  EXPECT_EQ(entries[0].size, 100000u);
  size_t leftovers = 0;
  for (const auto& file : fs::directory_iterator(entries[0].path)) {
    leftovers += file.path().string().find(".tmp.") != std::string::npos;
  }
  EXPECT_EQ(leftovers, 0u) << "temporary files were left behind";
}

TEST_F(Cache, BplCacheToolListsPrunesAndClears) {
  config_.size_limit = 1u << 20;
  CompileCache c = cache();
  build(c, "tool one");
  build(c, "tool two");
  age(entry(c, "tool one"), 100);
  const std::string tool = std::string(BPL_BIN_DIR) + "/bpl-cache";
  const std::map<std::string, std::string> env = {{"BPL_CACHE_DIR", config_.root}};

  auto listed = test::run_process({tool, "--backend", "gloo", "list"}, env);
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_NE(listed.output.find("test-1.0"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("2 entries"), std::string::npos) << listed.output;

  auto pruned = test::run_process({tool, "--backend", "gloo", "prune"},
                                  {{"BPL_CACHE_DIR", config_.root}, {"BPL_CACHE_SIZE", "20"}});
  ASSERT_EQ(pruned.exit_code, 0) << pruned.output;
  EXPECT_FALSE(fs::exists(entry(c, "tool one"))) << pruned.output;
  EXPECT_TRUE(fs::exists(entry(c, "tool two"))) << pruned.output;

  auto cleared = test::run_process({tool, "--backend", "gloo", "clear"}, env);
  ASSERT_EQ(cleared.exit_code, 0) << cleared.output;
  EXPECT_FALSE(fs::exists(config_.root));

  auto bad = test::run_process({tool, "explode"}, env);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("explode"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("list,total,prune,clear"), std::string::npos) << bad.output;
  auto unknown_flag = test::run_process({tool, "--frobnicate", "list"}, env);
  EXPECT_EQ(unknown_flag.exit_code, 2) << unknown_flag.output;
  EXPECT_NE(unknown_flag.output.find("--frobnicate"), std::string::npos) << unknown_flag.output;
  auto help = test::run_process({tool, "--help"}, env);
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("--backend"), std::string::npos) << help.output;
}

}  // namespace
}  // namespace backplane
