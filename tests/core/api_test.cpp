// The C API in one process: loading and refusing plugins, selection through the real environment,
// older callers' smaller structs, and argument validation. Uses the gloo plugin with a world of one
// (no network) and the broken test plugins.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backplane/backplane.h"

namespace {

std::string test_plugin(const char* variant) {
  return std::string(BPL_TEST_PLUGIN_DIR) + "/libbpl-test-" + variant + ".so";
}

// Sets environment variables for one test and restores them afterwards.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
      if (value) setenv(name, value, 1); else unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (auto& [name, value] : saved_) {
      if (value) setenv(name.c_str(), value->c_str(), 1); else unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// A clean launch environment: one process, backend chosen only by what the test sets.
ScopedEnv clean_env() {
  return ScopedEnv({{"BPL_BACKEND", nullptr}, {"NXD_CPU_MODE", nullptr}, {"RANK", nullptr}, {"WORLD_SIZE", nullptr},
                    {"OMPI_COMM_WORLD_SIZE", nullptr}, {"SLURM_PROCID", nullptr}, {"SLURM_NTASKS", nullptr}});
}

bpl_status init_with(const std::string& backend, bpl_runtime** out) {
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = backend.c_str();
  return bpl_init(&options, out);
}

::testing::AssertionResult error_mentions(std::initializer_list<const char*> fragments) {
  std::string message = bpl_last_error();
  for (const char* fragment : fragments) {
    if (message.find(fragment) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << fragment << "' not in: " << message;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(Loader, RefusesPluginOfAnotherAbiMajor) {
  auto env = clean_env();
  bpl_runtime* runtime = nullptr;
  std::string path = test_plugin("wrong-abi");
  EXPECT_EQ(init_with(path, &runtime), BPL_ERR_ABI_MISMATCH);
  EXPECT_EQ(runtime, nullptr);
  EXPECT_TRUE(error_mentions({path.c_str(), "ABI 2.3", "this libbackplane is ABI 1."}));
}

TEST(Loader, RefusesFileWithoutEntrySymbol) {
  auto env = clean_env();
  bpl_runtime* runtime = nullptr;
  std::string path = test_plugin("no-entry");
  EXPECT_EQ(init_with(path, &runtime), BPL_ERR_NOT_FOUND);
  EXPECT_TRUE(error_mentions({path.c_str(), "bpl_plugin_open_v1"}));
}

TEST(Loader, ReportsThePluginsOwnOpenFailure) {
  auto env = clean_env();
  bpl_runtime* runtime = nullptr;
  EXPECT_EQ(init_with(test_plugin("open-fails"), &runtime), BPL_ERR_UNAVAILABLE);
  EXPECT_TRUE(error_mentions({"libfake.so.1 is not installed"}));
}

TEST(Loader, RefusesBogusTables) {
  auto env = clean_env();
  bpl_runtime* runtime = nullptr;
  EXPECT_EQ(init_with(test_plugin("bad-size"), &runtime), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions({"struct_size 8"}));
  EXPECT_EQ(init_with(test_plugin("missing-function"), &runtime), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions({"'comm_world' NULL"}));
  // The core stays usable after refusing plugins.
  ASSERT_EQ(init_with("gloo", &runtime), BPL_OK) << bpl_last_error();
  EXPECT_EQ(bpl_finalize(runtime), BPL_OK);
}

TEST(Loader, RefusesUnresolvedSymbolsAtLoadAndThrowingOpen) {
  auto env = clean_env();
  bpl_runtime* runtime = nullptr;
  // RTLD_NOW: the missing symbol is found when the plugin is loaded, in the loader's own words.
  const std::string unresolved = test_plugin("unresolved-symbol");
  EXPECT_EQ(init_with(unresolved, &runtime), BPL_ERR_IO);
  EXPECT_TRUE(error_mentions({unresolved.c_str(), "undefined symbol: bpl_test_symbol_no_library_defines"}));
  const std::string throwing = test_plugin("open-throws");
  EXPECT_EQ(init_with(throwing, &runtime), BPL_ERR_INTERNAL);
  EXPECT_TRUE(error_mentions({throwing.c_str(), "threw an exception from bpl_plugin_open_v1"}));
  // Refused plugins are unloaded, and the core stays usable.
  for (const std::string& path : {unresolved, throwing}) {
    EXPECT_EQ(dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr) << path << " is still loaded";
  }
  ASSERT_EQ(init_with("gloo", &runtime), BPL_OK) << bpl_last_error();
  EXPECT_EQ(bpl_finalize(runtime), BPL_OK);
}

TEST(Loader, MissingFileAndUnknownName) {
  auto env = clean_env();
  bpl_runtime* runtime = nullptr;
  EXPECT_EQ(init_with("/nonexistent/libbackplane-x.so", &runtime), BPL_ERR_NOT_FOUND);
  EXPECT_TRUE(error_mentions({"/nonexistent/libbackplane-x.so", "does not exist"}));
  EXPECT_EQ(init_with("nosuch", &runtime), BPL_ERR_NOT_FOUND);
  EXPECT_TRUE(error_mentions({"unknown backend 'nosuch'", "libbackplane-nosuch.so", "known backends: gloo, mpi, neuron"}));
}

TEST(Loader, ProbeReadsIdentity) {
  bpl_plugin_info info = BPL_PLUGIN_INFO_INIT;
  ASSERT_EQ(bpl_plugin_probe("gloo", &info), BPL_OK) << bpl_last_error();
  EXPECT_STREQ(info.name, "gloo");
  EXPECT_EQ(info.abi_major, BPL_ABI_MAJOR);
  EXPECT_NE(std::strstr(info.path, "libbackplane-gloo.so"), nullptr);
  EXPECT_EQ(bpl_plugin_probe(test_plugin("wrong-abi").c_str(), &info), BPL_ERR_ABI_MISMATCH);
}

TEST(Selection, EnvironmentPrecedenceThroughTheApi) {
  auto env = clean_env();
  bpl_selection selection = BPL_SELECTION_INIT;
  ASSERT_EQ(bpl_select_backend(nullptr, &selection), BPL_OK) << bpl_last_error();
  EXPECT_STREQ(selection.backend, "gloo");
  EXPECT_NE(std::strstr(selection.reason, "auto"), nullptr);

  {
    ScopedEnv cpu({{"NXD_CPU_MODE", "1"}});
    ASSERT_EQ(bpl_select_backend(nullptr, &selection), BPL_OK);
    EXPECT_STREQ(selection.reason, "NXD_CPU_MODE=1");
    EXPECT_NE(std::strstr(selection.plugin_path, "libbackplane-gloo.so"), nullptr);
  }
  {
    ScopedEnv neuron({{"NXD_CPU_MODE", "0"}, {"NEURON_RT_LIB", "/nonexistent"}});
#ifndef BPL_HAVE_NEURON_PLUGIN
    EXPECT_EQ(bpl_select_backend(nullptr, &selection), BPL_ERR_NOT_FOUND);
    EXPECT_STREQ(selection.backend, "neuron");
    EXPECT_STREQ(selection.plugin_path, "") << "this build has no neuron plugin (BPL_WITH_NEURON=OFF)";
#else
    EXPECT_EQ(bpl_select_backend(nullptr, &selection), BPL_OK);
    EXPECT_STREQ(selection.backend, "neuron");
    EXPECT_NE(std::strstr(selection.plugin_path, "libbackplane-neuron.so"), nullptr);
    // Selected explicitly, a backend that cannot run fails loudly with its reason.
    bpl_runtime* runtime = nullptr;
    EXPECT_EQ(bpl_init(nullptr, &runtime), BPL_ERR_UNAVAILABLE);
    EXPECT_NE(std::strstr(bpl_last_error(), "set NXD_CPU_MODE=1 to run on CPU with Gloo"), nullptr) << bpl_last_error();
#endif
  }
  {
    ScopedEnv both({{"NXD_CPU_MODE", "1"}, {"BPL_BACKEND", "nosuch"}});
    EXPECT_EQ(bpl_select_backend(nullptr, &selection), BPL_ERR_NOT_FOUND);
    EXPECT_STREQ(selection.reason, "BPL_BACKEND=nosuch");
    // The explicit option beats BPL_BACKEND.
    bpl_init_options options = BPL_INIT_OPTIONS_INIT;
    options.backend = "gloo";
    EXPECT_EQ(bpl_select_backend(&options, &selection), BPL_OK);
    EXPECT_STREQ(selection.backend, "gloo");
  }
  {
    ScopedEnv bad({{"NXD_CPU_MODE", "on"}});
    bpl_runtime* runtime = nullptr;
    EXPECT_EQ(bpl_init(nullptr, &runtime), BPL_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(error_mentions({"NXD_CPU_MODE='on'"}));
  }
}

TEST(OlderCaller, SmallerStructsGetDefaultsAndPartialOutput) {
  auto env = clean_env();
  // An "older" options struct that ends after `backend`: the garbage after it must not be read.
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.struct_size = offsetof(bpl_init_options, rank);
  options.backend = "gloo";
  options.rank = 5;
  options.world_size = 99;
  options.timeout_ms = 1;
  bpl_runtime* runtime = nullptr;
  ASSERT_EQ(bpl_init(&options, &runtime), BPL_OK) << bpl_last_error();

  // An "older" info struct that ends before the integers: they stay untouched.
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  info.struct_size = offsetof(bpl_runtime_info, plugin_abi_major);
  info.rank = -42;
  info.world_size = -42;
  ASSERT_EQ(bpl_runtime_describe(runtime, &info), BPL_OK) << bpl_last_error();
  EXPECT_STREQ(info.backend, "gloo");
  EXPECT_EQ(info.struct_size, offsetof(bpl_runtime_info, plugin_abi_major));
  EXPECT_EQ(info.rank, -42);
  EXPECT_EQ(info.world_size, -42);

  bpl_runtime_info full = BPL_RUNTIME_INFO_INIT;
  ASSERT_EQ(bpl_runtime_describe(runtime, &full), BPL_OK);
  EXPECT_EQ(full.rank, 0);
  EXPECT_EQ(full.world_size, 1);
  EXPECT_EQ(full.timeout_ms, 300000) << "timeout_ms beyond the caller's struct_size was read";
  EXPECT_EQ(bpl_finalize(runtime), BPL_OK);
}

TEST(OlderCaller, StructSizeTooSmallOrHugeIsRefused) {
  auto env = clean_env();
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  bpl_runtime* runtime = nullptr;
  options.struct_size = 0;
  EXPECT_EQ(bpl_init(&options, &runtime), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(error_mentions({"options->struct_size = 0"}));
  options.struct_size = 1;
  EXPECT_EQ(bpl_init(&options, &runtime), BPL_ERR_INVALID_ARGUMENT);
  options.struct_size = size_t(1) << 40;
  EXPECT_EQ(bpl_init(&options, &runtime), BPL_ERR_INVALID_ARGUMENT);
}

class SingleRank : public ::testing::Test {
 protected:
  void SetUp() override {
    auto env = clean_env();
    ASSERT_EQ(init_with("gloo", &runtime_), BPL_OK) << bpl_last_error();
    ASSERT_EQ(bpl_comm_world(runtime_, &world_), BPL_OK);
  }
  void TearDown() override { EXPECT_EQ(bpl_finalize(runtime_), BPL_OK) << bpl_last_error(); }
  bpl_runtime* runtime_ = nullptr;
  bpl_comm* world_ = nullptr;
};

TEST_F(SingleRank, DescribeReportsCapabilities) {
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  ASSERT_EQ(bpl_runtime_describe(runtime_, &info), BPL_OK);
  EXPECT_STREQ(info.backend, "gloo");
  EXPECT_STREQ(info.launcher, "none");
  EXPECT_NE(std::strstr(info.details, "gloo="), nullptr);
  EXPECT_EQ(info.device_count, 1);
  EXPECT_TRUE(info.collectives & BPL_BIT(BPL_COLL_REDUCE_SCATTER));
  EXPECT_TRUE(info.dtypes & BPL_BIT(BPL_DTYPE_BF16));
  EXPECT_TRUE(info.reduce_ops & BPL_BIT(BPL_OP_AVG));
}

// Bad arguments of every function, on every backend: bad_arguments_test.cpp.

TEST_F(SingleRank, WorldOfOneReducesLocally) {
  uint16_t bf16_three = 0x4040;  // bf16 3.0
  uint16_t out = 0;
  EXPECT_EQ(bpl_allreduce(world_, &bf16_three, &out, 1, BPL_DTYPE_BF16, BPL_OP_AVG, nullptr), BPL_OK);
  EXPECT_EQ(out, bf16_three);
  int8_t values[3] = {-7, 5, 100};
  int8_t reduced[3] = {};
  EXPECT_EQ(bpl_reduce_scatter(world_, values, reduced, 3, BPL_DTYPE_I8, BPL_OP_MAX, nullptr), BPL_OK);
  EXPECT_EQ(reduced[0], -7);
  EXPECT_EQ(reduced[2], 100);
}

}  // namespace

// ABI 1.7: an embedder's callback receives backplane's log lines, the core's (the start-up line, with
// what an operator needs first) and a plugin's, instead of stderr, until it is removed. Runs in a
// process of its own (gtest_discover_tests), so that BPL_LOG_LEVEL is read here first.
TEST(Log, ACallbackReceivesTheCoresAndThePluginsLinesInsteadOfStderr) {
  ScopedEnv env = clean_env();
  ScopedEnv info({{"BPL_LOG_LEVEL", "info"}});
  struct Line {
    int32_t level;
    std::string source, text;
  };
  std::vector<Line> lines;
  auto keep = [](int32_t level, const char* source, const char* message, void* user) {
    static_cast<std::vector<Line>*>(user)->push_back({level, source, message});
  };
  ASSERT_EQ(bpl_set_log_callback(keep, &lines), BPL_OK);
  ::testing::internal::CaptureStderr();
  bpl_runtime* runtime = nullptr;
  ASSERT_EQ(init_with("gloo", &runtime), BPL_OK) << bpl_last_error();
  ASSERT_EQ(bpl_finalize(runtime), BPL_OK);
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(printed.find("[backplane"), std::string::npos) << "a line reached stderr: " << printed;

  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  const std::string abi = "(ABI " + std::to_string(BPL_ABI_MAJOR) + "." + std::to_string(BPL_ABI_MINOR) + ")";
  const Line* start_up = nullptr;
  const Line* from_plugin = nullptr;
  for (const Line& line : lines) {
    if (line.source == "core" && line.text.rfind("backplane ", 0) == 0) start_up = &line;
    if (line.source == "gloo") from_plugin = &line;
  }
  ASSERT_NE(start_up, nullptr) << "no start-up line among " << lines.size() << " line(s)";
  EXPECT_EQ(start_up->level, BPL_LOG_INFO);
  for (const std::string& part : {abi, std::string("host ") + host, "pid " + std::to_string(getpid()),
                                  std::string("rank 0 of 1 (local 0 of 1)"), std::string("backend gloo "),
                                  std::string("transport=")}) {
    EXPECT_NE(start_up->text.find(part), std::string::npos) << "'" << part << "' not in: " << start_up->text;
  }
  ASSERT_NE(from_plugin, nullptr) << "no line of the gloo plugin reached the callback";

  ASSERT_EQ(bpl_set_log_callback(nullptr, nullptr), BPL_OK);  // stderr again
  const size_t received = lines.size();
  ::testing::internal::CaptureStderr();
  ASSERT_EQ(init_with("gloo", &runtime), BPL_OK) << bpl_last_error();
  ASSERT_EQ(bpl_finalize(runtime), BPL_OK);
  const std::string after = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(lines.size(), received);
  EXPECT_NE(after.find("[backplane:core] INFO: backplane "), std::string::npos) << after;
}
