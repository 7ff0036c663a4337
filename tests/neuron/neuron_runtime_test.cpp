// The Neuron plugin's logic up to the runtime boundary: finding and loading libnrt (against a test
// double of it), status mapping, core selection, and what a user sees when the runtime is absent.
// No Neuron hardware is involved; nothing here shows the backend working on a device.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "backplane/backplane.h"
#include "plugin_support.h"
#include "runtime.h"

namespace backplane::neuron_plugin {
namespace {

const std::string kComplete = BPL_NRT_TEST_DOUBLE_DIR "/complete";
const std::string kIncomplete = BPL_NRT_TEST_DOUBLE_DIR "/incomplete";

template <typename Call>
std::pair<bpl_status, std::string> error_of(Call&& call) {
  try {
    call();
  } catch (const plugin::Error& e) {
    return {e.status(), e.what()};
  }
  return {BPL_OK, ""};
}

TEST(NeuronRuntime, StatusesMapToBplStatusesAndKeepTheRuntimesName) {
  EXPECT_EQ(to_bpl_status(kNrtSuccess), BPL_OK);
  EXPECT_EQ(to_bpl_status(kNrtTimeout), BPL_ERR_TIMEOUT);
  EXPECT_EQ(to_bpl_status(kNrtResource), BPL_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(to_bpl_status(kNrtInvalid), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(to_bpl_status(kNrtExecBadInput), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(to_bpl_status(kNrtUnsupportedNeffVersion), BPL_ERR_UNSUPPORTED);
  EXPECT_EQ(to_bpl_status(kNrtLoadNotEnoughNc), BPL_ERR_UNAVAILABLE);
  EXPECT_EQ(to_bpl_status(kNrtHwError), BPL_ERR_INTERNAL);
  EXPECT_EQ(to_bpl_status(4242), BPL_ERR_INTERNAL);
  EXPECT_EQ(nrt_status_name(kNrtTimeout), "NRT_TIMEOUT");
  EXPECT_EQ(nrt_status_name(kNrtExecCompletedWithNumErr), "NRT_EXEC_COMPLETED_WITH_NUM_ERR");
  EXPECT_EQ(nrt_status_name(4242), "NRT_STATUS 4242");
}

TEST(NeuronRuntime, VisibleCoresAreParsedAndBadValuesNamed) {
  EXPECT_EQ(parse_visible_cores("3"), (std::vector<int>{3}));
  EXPECT_EQ(parse_visible_cores("0-3"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(parse_visible_cores("0,2,5-7"), (std::vector<int>{0, 2, 5, 6, 7}));
  for (const char* bad : {"", "a", "3-1", "1,1", "0-", " 1", "1,,2"}) {
    auto [status, message] = error_of([&] { parse_visible_cores(bad); });
    EXPECT_EQ(status, BPL_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_NE(message.find(std::string("NEURON_RT_VISIBLE_CORES='") + bad + "' is not valid"), std::string::npos)
        << message;
  }
}

TEST(NeuronRuntime, EachLocalRankTakesItsCoreAsTorchNeuronxDoes) {
  EXPECT_EQ(core_for_local_rank("4-7", 2, 32), 6);
  EXPECT_EQ(core_for_local_rank(nullptr, 3, 8), 3);
  EXPECT_EQ(core_for_local_rank("", 0, 1), 0);
  EXPECT_NE(error_of([] { core_for_local_rank("4-7", 4, 32); }).second.find("lists 4"), std::string::npos);
  EXPECT_NE(error_of([] { core_for_local_rank(nullptr, 8, 8); }).second.find("reports 8 NeuronCore(s)"), std::string::npos);
}

TEST(NeuronRuntime, CandidatesFollowNeuronRtLibThenTheInstallThenTheLoader) {
  EXPECT_EQ(runtime_candidates(nullptr),
            (std::vector<std::string>{"/opt/aws/neuron/lib/libnrt.so.1", "libnrt.so.1"}));
  EXPECT_EQ(runtime_candidates(kComplete.c_str()).front(), kComplete + "/libnrt.so.1") << "a folder";
  EXPECT_EQ(runtime_candidates("/x/libnrt.so.2").front(), "/x/libnrt.so.2") << "a file";
}

TEST(NeuronRuntime, LoadsARuntimeAndResolvesEveryFunction) {
  LoadedRuntime runtime = load_runtime({"/nonexistent/libnrt.so.1", kComplete + "/libnrt.so.1"});
  EXPECT_EQ(runtime.path, kComplete + "/libnrt.so.1");
  EXPECT_EQ(runtime.version, "2.99.0.0 (backplane test double)");
  for (const NrtSymbol& symbol : nrt_symbols(runtime.api)) EXPECT_NE(*symbol.slot, nullptr) << symbol.name;
  uint32_t cores = 0;
  EXPECT_EQ(runtime.api.nrt_get_total_vnc_count(&cores), kNrtSuccess);
  EXPECT_EQ(cores, 2u);
}

TEST(NeuronRuntime, AMissingFunctionIsNamedWithTheRuntimeVersion) {
  auto [status, message] = error_of([] { load_runtime({kIncomplete + "/libnrt.so.1"}); });
  EXPECT_EQ(status, BPL_ERR_UNAVAILABLE);
  EXPECT_NE(message.find("(version 2.99.0.0 (backplane test double)) lacks nrt_barrier"), std::string::npos) << message;
}

TEST(NeuronRuntime, AnAbsentRuntimeSaysHowToRunOnCpu) {
  auto [status, message] = error_of([] { load_runtime({"/nonexistent/libnrt.so.1"}); });
  EXPECT_EQ(status, BPL_ERR_UNAVAILABLE);
  EXPECT_NE(message.find("Neuron runtime (libnrt.so.1) not found (tried: /nonexistent/libnrt.so.1"), std::string::npos)
      << message;
  EXPECT_NE(message.find("set NXD_CPU_MODE=1 to run on CPU with Gloo"), std::string::npos) << message;
}

// Through the core, as a user meets it.
TEST(NeuronPlugin, ExplicitSelectionFailsLoudlyWithTheReason) {
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = "neuron";
  bpl_runtime* runtime = nullptr;
  setenv("NEURON_RT_LIB", "/nonexistent", 1);
  EXPECT_EQ(bpl_init(&options, &runtime), BPL_ERR_UNAVAILABLE);
  EXPECT_NE(std::string(bpl_last_error()).find("neuron: Neuron runtime (libnrt.so.1) not found"), std::string::npos)
      << bpl_last_error();
  setenv("NEURON_RT_LIB", kComplete.c_str(), 1);
  EXPECT_EQ(bpl_init(&options, &runtime), BPL_ERR_UNAVAILABLE);
  EXPECT_NE(std::string(bpl_last_error()).find("found the Neuron runtime 2.99.0.0 (backplane test double)"),
            std::string::npos)
      << bpl_last_error();
  unsetenv("NEURON_RT_LIB");
  EXPECT_EQ(runtime, nullptr);
}

}  // namespace
}  // namespace backplane::neuron_plugin
