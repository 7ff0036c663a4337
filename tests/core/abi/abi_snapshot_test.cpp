// ABI 1.x stays compatible with the committed 1.0 snapshot (tests/core/abi/1.0):
//  - every struct field of 1.0 keeps its offset, every constant its value; structs only grow;
//  - a plugin built against the 1.0 headers runs under the current core (old plugin x new core);
//  - (in ctest, abi_old_embedder: examples/embed.c built against 1.0 runs on the current library).
// A change that breaks any of these is a new ABI major, and fails here first.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "backplane/backplane.h"
#include "layout_table.h"

namespace {

std::map<std::string, long long> table(const bpl_layout_entry* entries) {
  std::map<std::string, long long> values;
  for (const bpl_layout_entry* e = entries; e->name != nullptr; ++e) values[e->name] = e->value;
  return values;
}

TEST(AbiSnapshot, EveryLayoutAndConstantOf10IsUnchanged) {
  const auto old_layout = table(bpl_layout_1_0);
  const auto current = table(bpl_layout_current);
  ASSERT_GT(old_layout.size(), 200u);
  for (const auto& [name, value] : old_layout) {
    const long long now = current.at(name);
    if (name.rfind("sizeof(", 0) == 0) {
      EXPECT_GE(now, value) << name << " shrank: structs may only grow at the end";
      if (now != value) std::printf("%s: %lld in 1.0, %lld now (appended fields)\n", name.c_str(), value, now);
    } else {
      EXPECT_EQ(now, value) << name << " moved or changed value since ABI 1.0";
    }
  }
}

TEST(AbiSnapshot, LibraryVersionFollowsTheAbi) {
  int32_t major = 0, minor = 0;
  bpl_abi_version(&major, &minor);
  EXPECT_EQ(major, BPL_ABI_MAJOR);
  EXPECT_EQ(minor, BPL_ABI_MINOR);
  EXPECT_EQ(BPL_PROJECT_VERSION_MAJOR, BPL_ABI_MAJOR) << "the package version's major is the ABI major";
  EXPECT_EQ(BPL_PROJECT_VERSION_MINOR, BPL_ABI_MINOR) << "the package version's minor is the ABI minor";
}

TEST(AbiSnapshot, PluginBuiltAgainst10RunsUnderTheCurrentCore) {
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = BPL_OLD_PLUGIN;
  options.rank = 0;
  options.world_size = 1;
  bpl_runtime* runtime = nullptr;
  ASSERT_EQ(bpl_init(&options, &runtime), BPL_OK) << bpl_last_error();
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  ASSERT_EQ(bpl_runtime_describe(runtime, &info), BPL_OK);
  EXPECT_STREQ(info.backend, "abi-1.0");
  EXPECT_EQ(info.plugin_abi_major, 1);
  EXPECT_EQ(info.plugin_abi_minor, 0);
  bpl_comm* world = nullptr;
  ASSERT_EQ(bpl_comm_world(runtime, &world), BPL_OK);
  float in[3] = {1, 2, 3}, out[3] = {};
  ASSERT_EQ(bpl_allreduce(world, in, out, 3, BPL_DTYPE_F32, BPL_OP_SUM, nullptr), BPL_OK) << bpl_last_error();
  EXPECT_EQ(out[2], 3.0f);
  // What 1.1 added: a function the old table lacks is UNSUPPORTED, naming the plugin's ABI ...
  EXPECT_EQ(bpl_comm_set_timeout(world, 1000), BPL_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(bpl_last_error()).find("plugin ABI 1.0"), std::string::npos) << bpl_last_error();
  // ... and what the core does alone works with any plugin.
  int64_t timeout = 0;
  EXPECT_EQ(bpl_comm_get_timeout(world, &timeout), BPL_OK);
  EXPECT_EQ(timeout, info.timeout_ms);
  // What 1.2 added: a communicator from a store is UNSUPPORTED by the old table, naming its ABI.
  bpl_store store = BPL_STORE_INIT;
  store.set = [](void*, const char*, const void*, size_t) -> bpl_status { return BPL_ERR_IO; };
  store.get = [](void*, const char*, int64_t, void*, size_t, size_t*) -> bpl_status { return BPL_ERR_IO; };
  store.add = [](void*, const char*, int64_t, int64_t*) -> bpl_status { return BPL_ERR_IO; };
  store.check = [](void*, const char*, int32_t*) -> bpl_status { return BPL_ERR_IO; };
  bpl_comm* from_store = nullptr;
  EXPECT_EQ(bpl_comm_create_from_store(runtime, &store, 0, 1, &from_store), BPL_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(bpl_last_error()).find("plugin ABI 1.0"), std::string::npos) << bpl_last_error();
  EXPECT_EQ(bpl_comm_abort(world), BPL_OK) << bpl_last_error();
  EXPECT_EQ(bpl_barrier(world, nullptr), BPL_ERR_ABORTED);
  EXPECT_EQ(bpl_finalize(runtime), BPL_OK) << bpl_last_error();

  // An old plugin cannot meet through a caller's store: refused at bpl_init, not silently ignored.
  options.store = &store;
  EXPECT_EQ(bpl_init(&options, &runtime), BPL_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(bpl_last_error()).find("older than 1.2"), std::string::npos) << bpl_last_error();
}

}  // namespace
