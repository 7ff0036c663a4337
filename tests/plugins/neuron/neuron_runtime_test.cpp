// The Neuron plugin's logic up to the runtime boundary: finding and loading libnrt, status mapping,
// core selection, the device address space, and the device, collective and program interfaces through
// the core against a TEST DOUBLE of libnrt (tests/plugins/neuron/nrt_test_double.c) and a stand-in neuronx-cc.
// No Neuron hardware is involved; nothing here shows the backend working on a device.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "device_memory.h"
#include "plugin_support.h"
#include "programs.h"
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
  EXPECT_NE(message.find("(version 2.99.0.0 (backplane test double)) lacks nrta_cc_prepare"), std::string::npos)
      << message;
}

TEST(NeuronRuntime, AnAbsentRuntimeSaysHowToRunOnCpu) {
  auto [status, message] = error_of([] { load_runtime({"/nonexistent/libnrt.so.1"}); });
  EXPECT_EQ(status, BPL_ERR_UNAVAILABLE);
  EXPECT_NE(message.find("Neuron runtime (libnrt.so.1) not found (tried: /nonexistent/libnrt.so.1"), std::string::npos)
      << message;
  EXPECT_NE(message.find("set NXD_CPU_MODE=1 to run on CPU with Gloo"), std::string::npos) << message;
}

TEST(NeuronRuntime, RootCommIdComesFromTheLauncherUnlessSet) {
  EXPECT_EQ(root_comm_id(nullptr, "10.0.0.1", 29500, 8), "10.0.0.1:29501") << "the port after torchrun's store";
  EXPECT_EQ(root_comm_id("10.0.0.9:62182", "10.0.0.1", 29500, 8), "10.0.0.9:62182");
  EXPECT_EQ(root_comm_id(nullptr, "", -1, 1), "") << "one rank needs no bootstrap";
  auto [status, message] = error_of([] { root_comm_id("10.0.0.9", "", -1, 2); });
  EXPECT_EQ(status, BPL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("NEURON_RT_ROOT_COMM_ID='10.0.0.9' is not valid: expected host:port"), std::string::npos);
  EXPECT_EQ(error_of([] { root_comm_id(nullptr, "", -1, 2); }).first, BPL_ERR_UNAVAILABLE);
  EXPECT_EQ(error_of([] { root_comm_id("h:99999", "", -1, 2); }).first, BPL_ERR_INVALID_ARGUMENT);
}

TEST(NeuronRuntime, DtypesMapToTheRuntimesCodes) {
  EXPECT_EQ(nrt_dtype(BPL_DTYPE_BF16), kNrtDtypeBfloat16);
  EXPECT_EQ(nrt_dtype(BPL_DTYPE_F64), kNrtDtypeInvalid) << "the runtime has no f64";
  for (bpl_dtype dtype : {BPL_DTYPE_F32, BPL_DTYPE_F16, BPL_DTYPE_BF16, BPL_DTYPE_I8, BPL_DTYPE_U8, BPL_DTYPE_I32,
                          BPL_DTYPE_I64}) {
    EXPECT_EQ(bpl_dtype_of(nrt_dtype(dtype)), dtype);
  }
  EXPECT_EQ(bpl_dtype_of(kNrtDtypeUint32), 0);
}

nrt_tensor_t* fake_tensor(uintptr_t n) { return reinterpret_cast<nrt_tensor_t*>(n); }

TEST(DeviceAddressSpace, PointersInsideABlockNameItsTensorAndOffset) {
  DeviceAddressSpace space(1 << 20);
  char* a = static_cast<char*>(space.insert(fake_tensor(1), 100));
  char* b = static_cast<char*>(space.insert(fake_tensor(2), 64));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(b - a, 128) << "blocks are 64-byte aligned";
  auto at = space.find(a + 99);
  ASSERT_TRUE(at);
  EXPECT_EQ(at->tensor, fake_tensor(1));
  EXPECT_EQ(at->offset, 99u);
  EXPECT_EQ(at->available, 1u);
  EXPECT_EQ(space.find(a + 100)->tensor, nullptr) << "the padding after a block is no allocation";
  int on_the_stack = 0;
  EXPECT_FALSE(space.find(&on_the_stack)) << "host memory";
  EXPECT_EQ(space.locate(b, 64, "buf").tensor, fake_tensor(2));
  auto [status, message] = error_of([&] { space.locate(b + 1, 64, "buf"); });
  EXPECT_EQ(status, BPL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("64 bytes run past the end of its allocation (63 bytes left there)"), std::string::npos);
  EXPECT_NE(error_of([&] { space.locate(&on_the_stack, 4, "src"); }).second.find("is host memory"), std::string::npos);
  EXPECT_NE(error_of([&] { space.erase(a + 1); }).second.find("was not returned by bpl_malloc"), std::string::npos);
}

TEST(DeviceAddressSpace, FreedRangesMergeAndAreReused) {
  DeviceAddressSpace space(4096);
  void* a = space.insert(fake_tensor(1), 1024);
  void* b = space.insert(fake_tensor(2), 1024);
  void* c = space.insert(fake_tensor(3), 2048);
  EXPECT_EQ(error_of([&] { space.insert(fake_tensor(4), 1); }).first, BPL_ERR_OUT_OF_MEMORY) << "full";
  EXPECT_EQ(space.erase(b), fake_tensor(2));
  EXPECT_EQ(space.erase(a), fake_tensor(1));
  EXPECT_EQ(space.insert(fake_tensor(5), 2048), a) << "a and b merged into one range";
  EXPECT_EQ(space.tensors().size(), 2u);
  EXPECT_EQ(space.erase(c), fake_tensor(3));
}

TEST(NeffPorts, TensorsAreCheckedAgainstWhatTheNeffDeclares) {
  NeffPort port{"x", 24, BPL_DTYPE_F32, {2, 3}};
  float data[6] = {};
  bpl_tensor tensor = BPL_TENSOR_INIT;
  tensor.data = data;
  tensor.ndim = 2;
  tensor.shape[0] = 2;
  tensor.shape[1] = 3;
  EXPECT_EQ(error_of([&] { check_port(port, tensor, "input 0"); }).first, BPL_OK);
  tensor.dtype = BPL_DTYPE_BF16;
  EXPECT_NE(error_of([&] { check_port(port, tensor, "input 0"); }).second.find("input 0 ('x'): dtype bf16, but the NEFF declares f32"),
            std::string::npos);
  tensor.dtype = BPL_DTYPE_F32;
  tensor.shape[1] = 2;
  EXPECT_NE(error_of([&] { check_port(port, tensor, "input 0"); }).second.find("shape [2, 2], but the NEFF declares [2, 3]"),
            std::string::npos);
  port.dtype = 0;  // a runtime dtype bpl cannot name: the size decides
  port.shape.clear();
  EXPECT_NE(error_of([&] { check_port(port, tensor, "output 1"); }).second.find("16 bytes, but the NEFF declares 24"),
            std::string::npos);
}

// Through the core, as a user meets it.
TEST(NeuronPlugin, AnAbsentRuntimeFailsExplicitSelectionWithTheReason) {
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = "neuron";
  bpl_runtime* runtime = nullptr;
  setenv("NEURON_RT_LIB", "/nonexistent", 1);
  EXPECT_EQ(bpl_init(&options, &runtime), BPL_ERR_UNAVAILABLE);
  EXPECT_NE(std::string(bpl_last_error()).find("neuron: Neuron runtime (libnrt.so.1) not found"), std::string::npos)
      << bpl_last_error();
  EXPECT_NE(std::string(bpl_last_error()).find("set NXD_CPU_MODE=1 to run on CPU with Gloo"), std::string::npos);
  EXPECT_EQ(runtime, nullptr);
  unsetenv("NEURON_RT_LIB");
}

#define EXPECT_OK(call) EXPECT_EQ((call), BPL_OK) << bpl_last_error()
#define EXPECT_ERROR(call, status, text)                                                  \
  do {                                                                                    \
    EXPECT_EQ((call), (status)) << bpl_last_error();                                      \
    EXPECT_NE(std::string(bpl_last_error()).find(text), std::string::npos) << bpl_last_error(); \
  } while (0)

// One rank on the test double of libnrt, with the stand-in compiler on PATH and a private cache.
class OnTestDouble : public ::testing::Test {
 protected:
  void SetUp() override {
    char folder[] = "/tmp/bpl-neuron-test-XXXXXX";
    ASSERT_NE(mkdtemp(folder), nullptr);
    scratch_ = folder;
    setenv("NEURON_RT_LIB", kComplete.c_str(), 1);
    setenv("BPL_CACHE_DIR", (scratch_ + "/cache").c_str(), 1);
    setenv("BPL_STAND_IN_COMPILER_LOG", (scratch_ + "/compiles.log").c_str(), 1);
    setenv("PATH", (std::string(BPL_STAND_IN_COMPILER_DIR) + ":" + getenv("PATH")).c_str(), 1);
    unsetenv("NEURON_RT_VISIBLE_CORES");
    bpl_init_options options = BPL_INIT_OPTIONS_INIT;
    options.backend = "neuron";
    ASSERT_EQ(bpl_init(&options, &runtime_), BPL_OK) << bpl_last_error();
    ASSERT_EQ(bpl_comm_world(runtime_, &world_), BPL_OK);
  }
  void TearDown() override {
    if (runtime_ != nullptr) {
      EXPECT_OK(bpl_finalize(runtime_));
    }
    std::system(("rm -rf " + scratch_).c_str());
  }
  int compiles() const {
    std::ifstream log(scratch_ + "/compiles.log");
    int lines = 0;
    for (std::string line; std::getline(log, line);) ++lines;
    return lines;
  }
  bpl_program* compile(const std::string& source, const char* format, const char* flags = nullptr) {
    bpl_program_options options = BPL_PROGRAM_OPTIONS_INIT;
    options.format = format;
    options.flags = flags;
    bpl_program* program = nullptr;
    last_status_ = bpl_program_compile(runtime_, source.data(), source.size(), &options, &program);
    return program;
  }
  std::string scratch_;
  bpl_runtime* runtime_ = nullptr;
  bpl_comm* world_ = nullptr;
  bpl_status last_status_ = BPL_OK;
};

TEST_F(OnTestDouble, DescribesTheRuntimeAndWhatItLacks) {
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  EXPECT_OK(bpl_runtime_describe(runtime_, &info));
  EXPECT_STREQ(info.backend, "neuron");
  EXPECT_NE(std::string(info.details).find("runtime=2.99.0.0 (backplane test double) at " + kComplete), std::string::npos)
      << info.details;
  EXPECT_NE(std::string(info.details).find("core=0; device_memory=1073741824 bytes"), std::string::npos)
      << info.details;
  EXPECT_EQ(getenv("NEURON_RT_VISIBLE_CORES"), std::string("0")) << "the process is pinned to its core";
  EXPECT_TRUE(info.collectives & BPL_BIT(BPL_COLL_ALLREDUCE));
  EXPECT_TRUE(info.collectives & BPL_BIT(BPL_COLL_REDUCE_SCATTER));
  EXPECT_TRUE(info.collectives & BPL_BIT(BPL_COLL_COMM_SPLIT));
  for (bpl_collective lacking : {BPL_COLL_ALLTOALL, BPL_COLL_SEND, BPL_COLL_RECV}) {
    EXPECT_FALSE(info.collectives & BPL_BIT(lacking)) << bpl_collective_name(lacking);
  }
  EXPECT_FALSE(info.reduce_ops & BPL_BIT(BPL_OP_PROD));
  EXPECT_FALSE(info.reduce_ops & BPL_BIT(BPL_OP_AVG));
  EXPECT_FALSE(info.dtypes & BPL_BIT(BPL_DTYPE_F64));
  EXPECT_EQ(info.kernels, 0u);
  EXPECT_STREQ(info.program_formats, "neff hlo");
  int32_t value = 0;
  EXPECT_ERROR(bpl_send(world_, &value, 1, BPL_DTYPE_I32, 0, 0, nullptr), BPL_ERR_UNSUPPORTED, "send");
  EXPECT_ERROR(bpl_allreduce(world_, &value, &value, 1, BPL_DTYPE_I32, BPL_OP_PROD, nullptr), BPL_ERR_UNSUPPORTED, "prod");
}

TEST_F(OnTestDouble, DeviceMemoryRoundTripsAndIsCounted) {
  bpl_device_properties before = BPL_DEVICE_PROPERTIES_INIT, after = BPL_DEVICE_PROPERTIES_INIT;
  EXPECT_OK(bpl_device_get_properties(runtime_, 0, &before));
  EXPECT_STREQ(before.name, "NeuronCore 0");
  EXPECT_EQ(before.kind, BPL_DEVICE_ACCELERATOR);
  EXPECT_EQ(before.total_memory, 1u << 30) << "the double's limit, from nrt_get_vnc_memory_stats";
  char* a = nullptr;
  char* b = nullptr;
  EXPECT_OK(bpl_malloc(runtime_, 0, 1000, reinterpret_cast<void**>(&a)));
  EXPECT_OK(bpl_malloc(runtime_, 0, 1000, reinterpret_cast<void**>(&b)));
  EXPECT_OK(bpl_device_get_properties(runtime_, 0, &after));
  EXPECT_EQ(before.free_memory - after.free_memory, 2000u);
  std::vector<uint8_t> in(1000), out(600, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7);
  EXPECT_OK(bpl_memcpy(runtime_, a, in.data(), in.size(), BPL_MEMCPY_HOST_TO_DEVICE));
  EXPECT_OK(bpl_memcpy(runtime_, b + 100, a + 300, 600, BPL_MEMCPY_DEVICE_TO_DEVICE)) << "offsets inside blocks";
  EXPECT_OK(bpl_memcpy(runtime_, out.data(), b + 100, out.size(), BPL_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(out, std::vector<uint8_t>(in.begin() + 300, in.begin() + 900));
  EXPECT_OK(bpl_synchronize(runtime_, 0));

  EXPECT_ERROR(bpl_memcpy(runtime_, in.data(), out.data(), 10, BPL_MEMCPY_HOST_TO_DEVICE), BPL_ERR_INVALID_ARGUMENT,
               "is host memory, expected a device pointer from bpl_malloc");
  EXPECT_ERROR(bpl_memcpy(runtime_, a, b, 10, BPL_MEMCPY_HOST_TO_HOST), BPL_ERR_INVALID_ARGUMENT,
               "is device memory, but kind = BPL_MEMCPY_HOST_TO_HOST");
  EXPECT_ERROR(bpl_memcpy(runtime_, out.data(), a + 900, 200, BPL_MEMCPY_DEVICE_TO_HOST), BPL_ERR_INVALID_ARGUMENT,
               "200 bytes run past the end of its allocation");
  EXPECT_ERROR(bpl_free(runtime_, a + 8), BPL_ERR_INVALID_ARGUMENT, "was not returned by bpl_malloc");
  EXPECT_OK(bpl_free(runtime_, a));
  EXPECT_ERROR(bpl_free(runtime_, a), BPL_ERR_INVALID_ARGUMENT, "or was freed already");
  EXPECT_OK(bpl_free(runtime_, b));
  void* huge = nullptr;
  EXPECT_ERROR(bpl_malloc(runtime_, 0, size_t{2} << 30, &huge), BPL_ERR_OUT_OF_MEMORY, "failed: NRT_RESOURCE");
}

TEST_F(OnTestDouble, CollectivesOnOneRankTakeDeviceAndHostBuffers) {
  float host[4] = {1, 2, 3, 4}, back[8] = {};
  float* device = nullptr;
  EXPECT_OK(bpl_malloc(runtime_, 0, sizeof(back), reinterpret_cast<void**>(&device)));
  EXPECT_OK(bpl_memcpy(runtime_, device, host, sizeof(host), BPL_MEMCPY_HOST_TO_DEVICE));
  EXPECT_OK(bpl_allreduce(world_, device, device, 4, BPL_DTYPE_F32, BPL_OP_MAX, nullptr)) << "in place on device";
  EXPECT_OK(bpl_allgather(world_, device, device + 4, 4, BPL_DTYPE_F32, nullptr)) << "device to device";
  EXPECT_OK(bpl_memcpy(runtime_, back, device, sizeof(back), BPL_MEMCPY_DEVICE_TO_HOST));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(back[i], host[i % 4]);
  bpl_request* request = nullptr;
  float sum[4] = {};
  EXPECT_OK(bpl_allreduce(world_, host, sum, 4, BPL_DTYPE_F32, BPL_OP_SUM, &request)) << "host buffers, staged";
  EXPECT_OK(bpl_request_wait(request, BPL_TIMEOUT_DEFAULT));
  EXPECT_OK(bpl_request_free(request));
  EXPECT_EQ(sum[3], 4.0f);
  EXPECT_OK(bpl_broadcast(world_, device, 2, BPL_DTYPE_F32, 0, nullptr));
  EXPECT_OK(bpl_barrier(world_, nullptr));
  EXPECT_OK(bpl_free(runtime_, device));
}

constexpr const char* kAddNeff =
    "bpl-test-neff\nop add\nin a 10 2 3\nin b 10 2 3\nout sum 10 2 3\n";  // 10 = the runtime's f32 code

bpl_tensor matrix(float* data, bpl_dtype dtype = BPL_DTYPE_F32) {
  bpl_tensor tensor = BPL_TENSOR_INIT;
  tensor.data = data;
  tensor.dtype = dtype;
  tensor.ndim = 2;
  tensor.shape[0] = 2;
  tensor.shape[1] = 3;
  return tensor;
}

TEST_F(OnTestDouble, NeffProgramsRunWithNamedTensorsFromHostOrDevice) {
  bpl_program* program = compile(kAddNeff, "neff");
  ASSERT_NE(program, nullptr) << bpl_last_error();
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {10, 20, 30, 40, 50, 60}, sum[6] = {};
  bpl_tensor inputs[2] = {matrix(a), matrix(b)};
  bpl_tensor output = matrix(sum);
  EXPECT_OK(bpl_program_run(program, inputs, 2, &output, 1));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(sum[i], a[i] + b[i]);

  float* device = nullptr;  // b and the sum on the device
  EXPECT_OK(bpl_malloc(runtime_, 0, 2 * sizeof(b), reinterpret_cast<void**>(&device)));
  EXPECT_OK(bpl_memcpy(runtime_, device, b, sizeof(b), BPL_MEMCPY_HOST_TO_DEVICE));
  inputs[1] = matrix(device);
  output = matrix(device + 6);
  EXPECT_OK(bpl_program_run(program, inputs, 2, &output, 1));
  float back[6] = {};
  EXPECT_OK(bpl_memcpy(runtime_, back, device + 6, sizeof(back), BPL_MEMCPY_DEVICE_TO_HOST));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back[i], a[i] + b[i]);
  EXPECT_OK(bpl_free(runtime_, device));

  inputs[1] = matrix(b, BPL_DTYPE_BF16);
  EXPECT_ERROR(bpl_program_run(program, inputs, 2, &output, 1), BPL_ERR_INVALID_ARGUMENT,
               "input 1 ('b'): dtype bf16, but the NEFF declares f32");
  EXPECT_ERROR(bpl_program_run(program, inputs, 1, &output, 1), BPL_ERR_INVALID_ARGUMENT,
               "1 input(s) and 1 output(s) given, but the NEFF takes 2 and returns 1");
  EXPECT_OK(bpl_program_destroy(program));

  std::string nan_neff = kAddNeff;
  nan_neff.replace(nan_neff.find("op add"), 6, "op nan");
  program = compile(nan_neff, "neff");
  ASSERT_NE(program, nullptr) << bpl_last_error();
  inputs[1] = matrix(b);
  output = matrix(sum);
  EXPECT_ERROR(bpl_program_run(program, inputs, 2, &output, 1), BPL_ERR_INTERNAL,
               "nrt_execute failed: NRT_EXEC_COMPLETED_WITH_NUM_ERR");
  EXPECT_OK(bpl_program_destroy(program));

  EXPECT_EQ(compile("not a neff", "neff"), nullptr);
  EXPECT_EQ(last_status_, BPL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(bpl_last_error()).find("nrt_load of a 10-byte NEFF on NeuronCore 0 failed: NRT_INVALID"),
            std::string::npos)
      << bpl_last_error();
}

TEST_F(OnTestDouble, HloIsCompiledByNeuronxCcOnceThroughTheCache) {
  const std::string hlo = std::string("HloModule add\n") + kAddNeff;
  bpl_program* program = compile(hlo, "hlo", "--optlevel=1");
  ASSERT_NE(program, nullptr) << bpl_last_error();
  EXPECT_OK(bpl_program_destroy(program));
  program = compile(hlo, "hlo", "--optlevel=1");
  ASSERT_NE(program, nullptr) << bpl_last_error();
  EXPECT_EQ(compiles(), 1) << "the second compile is a cache hit";
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 1, 1, 1, 1, 1}, sum[6] = {};
  bpl_tensor inputs[2] = {matrix(a), matrix(b)};
  bpl_tensor output = matrix(sum);
  EXPECT_OK(bpl_program_run(program, inputs, 2, &output, 1));
  EXPECT_EQ(sum[5], 7.0f);
  EXPECT_OK(bpl_program_destroy(program));
  std::ifstream log(scratch_ + "/compiles.log");
  std::string line;
  std::getline(log, line);
  EXPECT_NE(line.find("--framework XLA"), std::string::npos) << line;
  EXPECT_NE(line.find("model.hlo_module.pb --output"), std::string::npos) << line;
  EXPECT_NE(line.find("--optlevel=1"), std::string::npos) << "flags reach the compiler: " << line;
  struct stat entry {};
  EXPECT_EQ(stat((scratch_ + "/cache/neuronxcc-2.99.0.0+test").c_str(), &entry), 0)
      << "entries are kept per compiler version, as the reference lays the cache out";

  EXPECT_EQ(compile("HloModule broken\nfail-to-compile\n", "hlo"), nullptr);
  EXPECT_EQ(last_status_, BPL_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(bpl_last_error()).find("neuronx-cc failed (exit status 1): ERROR 70001"), std::string::npos)
      << bpl_last_error();
  EXPECT_EQ(compile("HloModule broken\nfail-to-compile\n", "hlo"), nullptr);
  EXPECT_EQ(compiles(), 2) << "a failed compilation is recorded, not retried";
}

// 11. NEURON_CC_FLAGS' --log_level reaches the compiler, and being no part of the key (it changes what
//     the compiler prints, not what it builds), another level is still a cache hit.
TEST_F(OnTestDouble, LogLevelReachesTheCompilerWithoutChangingTheKey) {
  const std::string hlo = std::string("HloModule add\n") + kAddNeff;
  setenv("NEURON_CC_FLAGS", "--log_level=INFO", 1);
  bpl_program* program = compile(hlo, "hlo", "--optlevel=1");
  ASSERT_NE(program, nullptr) << bpl_last_error();
  EXPECT_OK(bpl_program_destroy(program));
  setenv("NEURON_CC_FLAGS", "--log_level=ERROR", 1);
  program = compile(hlo, "hlo", "--optlevel=1");
  unsetenv("NEURON_CC_FLAGS");
  ASSERT_NE(program, nullptr) << bpl_last_error();
  EXPECT_OK(bpl_program_destroy(program));
  EXPECT_EQ(compiles(), 1) << "another log level compiled again";
  std::ifstream log(scratch_ + "/compiles.log");
  std::string line;
  std::getline(log, line);
  EXPECT_NE(line.find("--optlevel=1 --log_level=INFO"), std::string::npos) << line;
}

TEST(NeuronCompiler, AMissingCompilerSaysWhatToInstall) {
  const std::string path = getenv("PATH");
  setenv("PATH", "/nonexistent", 1);
  auto [status, message] = error_of([] { compile_hlo("x", 1, "", std::chrono::seconds(10)); });
  setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(status, BPL_ERR_UNAVAILABLE);
  EXPECT_NE(message.find("neuronx-cc not found on PATH"), std::string::npos) << message;
}

}  // namespace
}  // namespace backplane::neuron_plugin
