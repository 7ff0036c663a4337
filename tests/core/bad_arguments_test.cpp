// Every public function given bad arguments, on every backend that loads here: NULL handles and
// pointers, negative and overflowing counts, unknown enum values, struct_size 0, 1 and huge, roots and
// peers out of range. Each must be BPL_ERR_INVALID_ARGUMENT with a message naming the parameter and
// its value, before the backend is reached (an operation the backend lacks is UNSUPPORTED instead).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backplane/backplane.h"

namespace {

// One runtime per backend for the whole process, made on first use.
std::map<std::string, bpl_runtime*> runtimes;

bpl_runtime* runtime_for(const std::string& backend) {
  auto it = runtimes.find(backend);
  if (it != runtimes.end()) return it->second;
  for (const char* name : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"}) unsetenv(name);
  if (backend == "mpi") {  // a singleton MPI process; Open MPI refuses root unless told, and CI runs as root
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
#ifdef BPL_NRT_TEST_DOUBLE_DIR
  if (backend == "neuron") {
    setenv("NEURON_RT_LIB", BPL_NRT_TEST_DOUBLE_DIR "/complete", 1);
    setenv("NRT_TEST_DOUBLE_CORES", "1", 1);
  }
#endif
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  options.backend = backend.c_str();
  bpl_runtime* runtime = nullptr;
  if (bpl_init(&options, &runtime) != BPL_OK) {
    ADD_FAILURE() << "bpl_init(" << backend << "): " << bpl_last_error();
    return nullptr;
  }
  return runtimes[backend] = runtime;
}

class FinalizeRuntimes : public ::testing::Environment {
 public:
  void TearDown() override {
    for (auto& [backend, runtime] : runtimes) EXPECT_EQ(bpl_finalize(runtime), BPL_OK) << backend << ": " << bpl_last_error();
  }
};

// What a case needs from the backend: without it the answer is UNSUPPORTED, not INVALID_ARGUMENT.
struct Needs {
  int collective = 0;
  int kernel = 0;
  bool programs = false;
};

struct Case {
  Case(std::string call_, std::function<bpl_status()> run_, std::vector<std::string> fragments_, Needs needs_ = {})
      : call(std::move(call_)), run(std::move(run_)), fragments(std::move(fragments_)), needs(needs_) {}
  std::string call;                       // shown on failure
  std::function<bpl_status()> run;
  std::vector<std::string> fragments;     // the message names the parameter and its value
  Needs needs;
};

class BadArguments : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
#ifndef BPL_HAVE_MPI_PLUGIN
    if (GetParam() == "mpi") GTEST_SKIP() << "the MPI backend is not built (no Open MPI found at configure time)";
#endif
#ifndef BPL_NRT_TEST_DOUBLE_DIR
    if (GetParam() == "neuron") GTEST_SKIP() << "the neuron plugin and its runtime test double are not built";
#endif
    runtime_ = runtime_for(GetParam());
    ASSERT_NE(runtime_, nullptr);
    ASSERT_EQ(bpl_comm_world(runtime_, &world_), BPL_OK);
    info_.struct_size = sizeof(info_);
    ASSERT_EQ(bpl_runtime_describe(runtime_, &info_), BPL_OK);
  }

  bool provides(const Needs& needs) const {
    if (needs.collective != 0 && (info_.collectives & BPL_BIT(needs.collective)) == 0) return false;
    if (needs.kernel != 0 && (info_.kernels & BPL_BIT(needs.kernel)) == 0) return false;
    if (needs.programs && std::string(info_.program_formats).empty()) return false;
    return true;
  }

  void check(const std::vector<Case>& cases) {
    for (const Case& c : cases) {
      const bpl_status status = c.run();
      const std::string message = bpl_last_error();
      if (!provides(c.needs)) {
        EXPECT_EQ(status, BPL_ERR_UNSUPPORTED) << GetParam() << ": " << c.call << ": " << message;
        continue;
      }
      EXPECT_EQ(status, BPL_ERR_INVALID_ARGUMENT) << GetParam() << ": " << c.call << ": " << message;
      for (const std::string& fragment : c.fragments) {
        EXPECT_NE(message.find(fragment), std::string::npos)
            << GetParam() << ": " << c.call << ": '" << fragment << "' not in: " << message;
      }
    }
  }

  bpl_runtime* runtime_ = nullptr;
  bpl_comm* world_ = nullptr;
  bpl_runtime_info info_{};
  float x_[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  float y_[8] = {};
};

constexpr int64_t kHuge = INT64_MAX / 2;
constexpr size_t kHugeStruct = size_t(1) << 40;

TEST_P(BadArguments, RuntimeAndDevice) {
  bpl_runtime* rt = runtime_;
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  bpl_device_properties props{};
  int32_t count = 0;
  void* ptr = nullptr;
  bpl_runtime* out = nullptr;
  bpl_selection selection{};
  bpl_plugin_info plugin{};
  check({
      {"bpl_init(out NULL)", [&] { return bpl_init(nullptr, nullptr); }, {"out is NULL"}},
      {"bpl_init(struct_size 0)", [&] { options.struct_size = 0; return bpl_init(&options, &out); }, {"options->struct_size = 0"}},
      {"bpl_init(struct_size 1)", [&] { options.struct_size = 1; return bpl_init(&options, &out); }, {"options->struct_size = 1"}},
      {"bpl_init(struct_size huge)", [&] { options.struct_size = kHugeStruct; return bpl_init(&options, &out); },
       {"options->struct_size = 1099511627776"}},
      {"bpl_init(rank 5 of 2)", [&] {
         options = BPL_INIT_OPTIONS_INIT;
         options.backend = GetParam().c_str();
         options.rank = 5;
         options.world_size = 2;
         return bpl_init(&options, &out);
       }, {"rank 5", "world size 2"}},
      {"bpl_runtime_describe(runtime NULL)", [&] { return bpl_runtime_describe(nullptr, &info); }, {"runtime is NULL"}},
      {"bpl_runtime_describe(out NULL)", [&] { return bpl_runtime_describe(rt, nullptr); }, {"out is NULL"}},
      {"bpl_runtime_describe(struct_size 1)", [&] { info.struct_size = 1; return bpl_runtime_describe(rt, &info); },
       {"out->struct_size = 1"}},
      {"bpl_runtime_describe(foreign runtime)", [&] { return bpl_runtime_describe(reinterpret_cast<bpl_runtime*>(&info), &info); },
       {"not a live bpl_runtime"}},
      {"bpl_select_backend(out NULL)", [&] { return bpl_select_backend(nullptr, nullptr); }, {"out is NULL"}},
      {"bpl_select_backend(struct_size 0)", [&] { selection.struct_size = 0; return bpl_select_backend(nullptr, &selection); },
       {"out->struct_size = 0"}},
      {"bpl_plugin_probe(backend NULL)", [&] { return bpl_plugin_probe(nullptr, &plugin); }, {"backend is NULL"}},
      {"bpl_plugin_probe(out NULL)", [&] { return bpl_plugin_probe("gloo", nullptr); }, {"out is NULL"}},
      {"bpl_device_count(count NULL)", [&] { return bpl_device_count(rt, nullptr); }, {"count is NULL"}},
      {"bpl_device_count(runtime NULL)", [&] { return bpl_device_count(nullptr, &count); }, {"runtime is NULL"}},
      {"bpl_device_get_properties(device -1)", [&] { props.struct_size = sizeof(props); return bpl_device_get_properties(rt, -1, &props); },
       {"device = -1"}},
      {"bpl_device_get_properties(device 99)", [&] { return bpl_device_get_properties(rt, 99, &props); }, {"device = 99"}},
      {"bpl_device_get_properties(out NULL)", [&] { return bpl_device_get_properties(rt, 0, nullptr); }, {"out is NULL"}},
      {"bpl_device_get_properties(struct_size huge)", [&] { props.struct_size = kHugeStruct; return bpl_device_get_properties(rt, 0, &props); },
       {"out->struct_size"}},
      {"bpl_malloc(ptr NULL)", [&] { return bpl_malloc(rt, 0, 16, nullptr); }, {"ptr is NULL"}},
      {"bpl_malloc(device 7)", [&] { return bpl_malloc(rt, 7, 16, &ptr); }, {"device = 7"}},
      {"bpl_malloc(bytes huge)", [&] { return bpl_malloc(rt, 0, SIZE_MAX, &ptr); }, {"exceeds the address space"}},
      {"bpl_free(runtime NULL)", [&] { return bpl_free(nullptr, x_); }, {"runtime is NULL"}},
      {"bpl_memcpy(kind 0)", [&] { return bpl_memcpy(rt, y_, x_, 4, 0); }, {"kind = 0"}},
      {"bpl_memcpy(dst NULL)", [&] { return bpl_memcpy(rt, nullptr, x_, 4, BPL_MEMCPY_HOST_TO_HOST); }, {"dst is NULL"}},
      {"bpl_memcpy(overlap)", [&] { return bpl_memcpy(rt, x_ + 1, x_, 8, BPL_MEMCPY_HOST_TO_HOST); }, {"overlap"}},
      {"bpl_synchronize(device -3)", [&] { return bpl_synchronize(rt, -3); }, {"device = -3"}},
  });
}

TEST_P(BadArguments, Communicators) {
  bpl_comm* child = nullptr;
  // A store whose every call fails: the arguments are refused before any is made.
  bpl_store store = BPL_STORE_INIT;
  store.set = [](void*, const char*, const void*, size_t) -> bpl_status { return BPL_ERR_IO; };
  store.get = [](void*, const char*, int64_t, void*, size_t, size_t*) -> bpl_status { return BPL_ERR_IO; };
  store.add = [](void*, const char*, int64_t, int64_t*) -> bpl_status { return BPL_ERR_IO; };
  store.check = [](void*, const char*, int32_t*) -> bpl_status { return BPL_ERR_IO; };
  int32_t value = 0;
  int64_t timeout = 0;
  check({
      {"bpl_comm_world(out NULL)", [&] { return bpl_comm_world(runtime_, nullptr); }, {"out is NULL"}},
      {"bpl_comm_world(runtime NULL)", [&] { return bpl_comm_world(nullptr, &child); }, {"runtime is NULL"}},
      {"bpl_comm_split(parent NULL)", [&] { return bpl_comm_split(nullptr, 0, 0, &child); }, {"comm is NULL"}},
      {"bpl_comm_split(out NULL)", [&] { return bpl_comm_split(world_, 0, 0, nullptr); }, {"out is NULL"}},
      {"bpl_comm_split(color -2)", [&] { return bpl_comm_split(world_, -2, 0, &child); }, {"color = -2"}},
      {"bpl_comm_destroy(world)", [&] { return bpl_comm_destroy(world_); }, {"world communicator"}},
      {"bpl_comm_destroy(foreign)", [&] { return bpl_comm_destroy(reinterpret_cast<bpl_comm*>(x_)); }, {"not a live bpl_comm"}},
      {"bpl_comm_rank(rank NULL)", [&] { return bpl_comm_rank(world_, nullptr); }, {"rank is NULL"}},
      {"bpl_comm_size(comm NULL)", [&] { return bpl_comm_size(nullptr, &value); }, {"comm is NULL"}},
      {"bpl_comm_set_timeout(0)", [&] { return bpl_comm_set_timeout(world_, 0); }, {"timeout_ms = 0"}},
      {"bpl_comm_set_timeout(-5)", [&] { return bpl_comm_set_timeout(world_, -5); }, {"timeout_ms = -5"}},
      {"bpl_comm_get_timeout(out NULL)", [&] { return bpl_comm_get_timeout(world_, nullptr); }, {"timeout_ms is NULL"}},
      {"bpl_comm_get_timeout(comm NULL)", [&] { return bpl_comm_get_timeout(nullptr, &timeout); }, {"comm is NULL"}},
      {"bpl_comm_abort(comm NULL)", [&] { return bpl_comm_abort(nullptr); }, {"comm is NULL"}},
      {"bpl_comm_revoke(comm NULL)", [&] { return bpl_comm_revoke(nullptr); }, {"comm is NULL"}},
      {"bpl_comm_agree(comm NULL)", [&] { return bpl_comm_agree(nullptr, &value, nullptr, nullptr); }, {"comm is NULL"}},
      {"bpl_comm_agree(flags NULL)", [&] { return bpl_comm_agree(world_, nullptr, nullptr, nullptr); }, {"flags is NULL"}},
      {"bpl_comm_shrink(comm NULL)", [&] { return bpl_comm_shrink(nullptr, nullptr, nullptr, &child); }, {"comm is NULL"}},
      {"bpl_comm_shrink(out NULL)", [&] { return bpl_comm_shrink(world_, nullptr, nullptr, nullptr); }, {"out is NULL"}},
      {"bpl_comm_grow(joiners 0)", [&] { return bpl_comm_grow(world_, 0, &child); }, {"joiners = 0"}},
      {"bpl_comm_grow(out NULL)", [&] { return bpl_comm_grow(world_, 1, nullptr); }, {"out is NULL"}},
      {"bpl_comm_join(runtime NULL)", [&] { return bpl_comm_join(nullptr, &child); }, {"runtime is NULL"}},
      {"bpl_comm_join(out NULL)", [&] { return bpl_comm_join(runtime_, nullptr); }, {"out is NULL"}},
      {"bpl_comm_create_from_store(runtime NULL)", [&] { return bpl_comm_create_from_store(nullptr, &store, 0, 1, &child); },
       {"runtime is NULL"}},
      {"bpl_comm_create_from_store(out NULL)", [&] { return bpl_comm_create_from_store(runtime_, &store, 0, 1, nullptr); },
       {"out is NULL"}},
      {"bpl_comm_create_from_store(store NULL)", [&] { return bpl_comm_create_from_store(runtime_, nullptr, 0, 1, &child); },
       {"store is NULL"}},
      {"bpl_comm_create_from_store(store->get NULL)", [&] {
         bpl_store no_get = store;
         no_get.get = nullptr;
         return bpl_comm_create_from_store(runtime_, &no_get, 0, 1, &child);
       }, {"store->get is NULL"}},
      {"bpl_comm_create_from_store(store struct_size 0)", [&] {
         bpl_store sizeless = store;
         sizeless.struct_size = 0;
         return bpl_comm_create_from_store(runtime_, &sizeless, 0, 1, &child);
       }, {"store->struct_size = 0"}},
      {"bpl_comm_create_from_store(rank 3 of 2)", [&] { return bpl_comm_create_from_store(runtime_, &store, 3, 2, &child); },
       {"rank = 3", "0..1"}},
      {"bpl_comm_create_from_store(rank -1)", [&] { return bpl_comm_create_from_store(runtime_, &store, -1, 2, &child); },
       {"rank = -1"}},
      {"bpl_comm_create_from_store(size 0)", [&] { return bpl_comm_create_from_store(runtime_, &store, 0, 0, &child); },
       {"size = 0"}},
      {"bpl_init(store without check)", [&] {
         bpl_store no_check = store;
         no_check.check = nullptr;
         bpl_init_options options = BPL_INIT_OPTIONS_INIT;
         options.store = &no_check;
         bpl_runtime* out = nullptr;
         return bpl_init(&options, &out);
       }, {"options->store->check is NULL"}},
  });
}

TEST_P(BadArguments, Collectives) {
  bpl_comm* w = world_;
  float* x = x_;
  float* y = y_;
  const Needs allreduce{BPL_COLL_ALLREDUCE}, broadcast{BPL_COLL_BROADCAST}, reduce{BPL_COLL_REDUCE},
      allgather{BPL_COLL_ALLGATHER}, reduce_scatter{BPL_COLL_REDUCE_SCATTER}, alltoall{BPL_COLL_ALLTOALL},
      send{BPL_COLL_SEND}, recv{BPL_COLL_RECV}, gather{BPL_COLL_GATHER}, scatter{BPL_COLL_SCATTER},
      allgatherv{BPL_COLL_ALLGATHERV}, alltoallv{BPL_COLL_ALLTOALLV};
  // A world of one rank: one count and one displacement per array.
  const int64_t one[1] = {1}, four[1] = {4}, zero[1] = {0}, minus_two[1] = {-2}, minus_three[1] = {-3};
  check({
      {"bpl_allreduce(comm NULL)", [&] { return bpl_allreduce(nullptr, x, y, 4, BPL_DTYPE_F32, BPL_OP_SUM, nullptr); }, {"comm is NULL"}},
      {"bpl_allreduce(count -1)", [&] { return bpl_allreduce(w, x, y, -1, BPL_DTYPE_F32, BPL_OP_SUM, nullptr); }, {"count = -1"}, allreduce},
      {"bpl_allreduce(count huge)", [&] { return bpl_allreduce(w, x, y, kHuge, BPL_DTYPE_F32, BPL_OP_SUM, nullptr); },
       {"count = " + std::to_string(kHuge), "exceed the address space"}, allreduce},
      {"bpl_allreduce(dtype 0)", [&] { return bpl_allreduce(w, x, y, 4, 0, BPL_OP_SUM, nullptr); }, {"dtype = 0"}, allreduce},
      {"bpl_allreduce(dtype 99)", [&] { return bpl_allreduce(w, x, y, 4, 99, BPL_OP_SUM, nullptr); }, {"dtype = 99"}, allreduce},
      {"bpl_allreduce(op 0)", [&] { return bpl_allreduce(w, x, y, 4, BPL_DTYPE_F32, 0, nullptr); }, {"op = 0"}, allreduce},
      {"bpl_allreduce(op 42)", [&] { return bpl_allreduce(w, x, y, 4, BPL_DTYPE_F32, 42, nullptr); }, {"op = 42"}, allreduce},
      {"bpl_allreduce(BXOR of f32)", [&] { return bpl_allreduce(w, x, y, 4, BPL_DTYPE_F32, BPL_OP_BXOR, nullptr); },
       {"op bxor takes an integer dtype", "not f32"}, allreduce},
      {"bpl_reduce_scatter(BAND of f32)", [&] { return bpl_reduce_scatter(w, x, y, 1, BPL_DTYPE_F32, BPL_OP_BAND, nullptr); },
       {"op band takes an integer dtype", "not f32"}, reduce_scatter},
      {"bpl_allreduce(send NULL)", [&] { return bpl_allreduce(w, nullptr, y, 4, BPL_DTYPE_F32, BPL_OP_SUM, nullptr); }, {"send is NULL"}, allreduce},
      {"bpl_allreduce(recv NULL)", [&] { return bpl_allreduce(w, x, nullptr, 4, BPL_DTYPE_F32, BPL_OP_SUM, nullptr); }, {"recv is NULL"}, allreduce},
      {"bpl_broadcast(root 1)", [&] { return bpl_broadcast(w, x, 4, BPL_DTYPE_F32, 1, nullptr); }, {"root = 1"}, broadcast},
      {"bpl_broadcast(root -1)", [&] { return bpl_broadcast(w, x, 4, BPL_DTYPE_F32, -1, nullptr); }, {"root = -1"}, broadcast},
      {"bpl_broadcast(buf NULL)", [&] { return bpl_broadcast(w, nullptr, 4, BPL_DTYPE_F32, 0, nullptr); }, {"buf is NULL"}, broadcast},
      {"bpl_reduce(root 3)", [&] { return bpl_reduce(w, x, y, 4, BPL_DTYPE_F32, BPL_OP_SUM, 3, nullptr); }, {"root = 3"}, reduce},
      {"bpl_reduce(op -1)", [&] { return bpl_reduce(w, x, y, 4, BPL_DTYPE_F32, -1, 0, nullptr); }, {"op = -1"}, reduce},
      {"bpl_allgather(count -7)", [&] { return bpl_allgather(w, x, y, -7, BPL_DTYPE_F32, nullptr); }, {"count = -7"}, allgather},
      {"bpl_allgather(recv NULL)", [&] { return bpl_allgather(w, x, nullptr, 4, BPL_DTYPE_F32, nullptr); }, {"recv is NULL"}, allgather},
      {"bpl_reduce_scatter(recvcount huge)", [&] { return bpl_reduce_scatter(w, x, y, kHuge, BPL_DTYPE_F32, BPL_OP_SUM, nullptr); },
       {"recvcount = "}, reduce_scatter},
      {"bpl_reduce_scatter(dtype -4)", [&] { return bpl_reduce_scatter(w, x, y, 4, -4, BPL_OP_SUM, nullptr); }, {"dtype = -4"}, reduce_scatter},
      {"bpl_alltoall(send NULL)", [&] { return bpl_alltoall(w, nullptr, y, 4, BPL_DTYPE_F32, nullptr); }, {"send is NULL"}, alltoall},
      {"bpl_gather(root 1)", [&] { return bpl_gather(w, x, y, 4, BPL_DTYPE_F32, 1, nullptr); }, {"root = 1"}, gather},
      {"bpl_gather(count -1)", [&] { return bpl_gather(w, x, y, -1, BPL_DTYPE_F32, 0, nullptr); }, {"count = -1"}, gather},
      {"bpl_gather(recv NULL at the root)", [&] { return bpl_gather(w, x, nullptr, 4, BPL_DTYPE_F32, 0, nullptr); },
       {"recv is NULL"}, gather},
      {"bpl_scatter(send NULL at the root)", [&] { return bpl_scatter(w, nullptr, y, 4, BPL_DTYPE_F32, 0, nullptr); },
       {"send is NULL"}, scatter},
      {"bpl_scatter(root -1)", [&] { return bpl_scatter(w, x, y, 4, BPL_DTYPE_F32, -1, nullptr); }, {"root = -1"}, scatter},
      {"bpl_allgatherv(recvcounts NULL)", [&] { return bpl_allgatherv(w, x, 4, y, nullptr, zero, BPL_DTYPE_F32, nullptr); },
       {"recvcounts is NULL"}, allgatherv},
      {"bpl_allgatherv(displs[0] -3)", [&] { return bpl_allgatherv(w, x, 4, y, four, minus_three, BPL_DTYPE_F32, nullptr); },
       {"displs[0] = -3"}, allgatherv},
      {"bpl_allgatherv(recvcounts[0] -2)", [&] { return bpl_allgatherv(w, x, 4, y, minus_two, zero, BPL_DTYPE_F32, nullptr); },
       {"recvcounts[0] = -2"}, allgatherv},
      {"bpl_allgatherv(sendcount 1, recvcounts[0] 4)", [&] { return bpl_allgatherv(w, x, 1, y, four, zero, BPL_DTYPE_F32, nullptr); },
       {"sendcount = 1 but recvcounts[0] = 4"}, allgatherv},
      {"bpl_alltoallv(sdispls NULL)", [&] { return bpl_alltoallv(w, x, one, nullptr, y, one, zero, BPL_DTYPE_F32, nullptr); },
       {"sdispls is NULL"}, alltoallv},
      {"bpl_alltoallv(rdispls[0] -3)", [&] { return bpl_alltoallv(w, x, one, zero, y, one, minus_three, BPL_DTYPE_F32, nullptr); },
       {"rdispls[0] = -3"}, alltoallv},
      {"bpl_alltoallv(sendcounts[0] 1, recvcounts[0] 4)",
       [&] { return bpl_alltoallv(w, x, one, zero, y, four, zero, BPL_DTYPE_F32, nullptr); },
       {"sendcounts[0] = 1 but recvcounts[0] = 4"}, alltoallv},
      {"bpl_alltoallv(send = recv)", [&] { return bpl_alltoallv(w, x, one, zero, x, one, zero, BPL_DTYPE_F32, nullptr); },
       {"send and recv overlap"}, alltoallv},
      {"bpl_barrier(comm NULL)", [&] { return bpl_barrier(nullptr, nullptr); }, {"comm is NULL"}},
      {"bpl_send(peer 0 = self)", [&] { return bpl_send(w, x, 4, BPL_DTYPE_F32, 0, 0, nullptr); }, {"peer = 0 is the calling rank"}, send},
      {"bpl_send(peer 9)", [&] { return bpl_send(w, x, 4, BPL_DTYPE_F32, 9, 0, nullptr); }, {"peer = 9"}, send},
      {"bpl_recv(peer 9, tag -1)", [&] { return bpl_recv(w, y, 4, BPL_DTYPE_F32, 9, -1, nullptr); }, {"peer = 9"}, recv},
      {"bpl_request_test(req NULL)", [&] { int32_t done = 0; return bpl_request_test(nullptr, &done); }, {"req is NULL"}},
      {"bpl_request_wait(req NULL)", [&] { return bpl_request_wait(nullptr, 10); }, {"req is NULL"}},
      {"bpl_request_wait(foreign)", [&] { return bpl_request_wait(reinterpret_cast<bpl_request*>(x_), 10); }, {"not a live bpl_request"}},
  });
  // A live request with bad companions.
  bpl_request* req = nullptr;
  ASSERT_EQ(bpl_barrier(w, &req), BPL_OK) << bpl_last_error();
  check({
      {"bpl_request_wait(timeout -2)", [&] { return bpl_request_wait(req, -2); }, {"timeout_ms = -2"}},
      {"bpl_request_test(done NULL)", [&] { return bpl_request_test(req, nullptr); }, {"done is NULL"}},
  });
  EXPECT_EQ(bpl_request_free(req), BPL_OK) << bpl_last_error();
}

TEST_P(BadArguments, KernelsAndPrograms) {
  bpl_runtime* rt = runtime_;
  bpl_gemm_args gemm = BPL_GEMM_ARGS_INIT;
  bpl_elementwise_args add = BPL_ELEMENTWISE_ARGS_INIT;
  bpl_cast_args cast = BPL_CAST_ARGS_INIT;
  bpl_program_options options = BPL_PROGRAM_OPTIONS_INIT;
  bpl_program* program = nullptr;
  const char source[] = "def forward(x):\n  return x\n";
  const Needs gemm_kernel{0, BPL_KERNEL_GEMM}, add_kernel{0, BPL_KERNEL_ADD}, scale_kernel{0, BPL_KERNEL_SCALE},
      cast_kernel{0, BPL_KERNEL_CAST}, programs{0, 0, true};
  check({
      {"bpl_gemm(args NULL)", [&] { return bpl_gemm(rt, nullptr); }, {"args is NULL"}},
      {"bpl_gemm(struct_size 0)", [&] { gemm.struct_size = 0; return bpl_gemm(rt, &gemm); }, {"args->struct_size = 0"}},
      {"bpl_gemm(struct_size huge)", [&] { gemm.struct_size = kHugeStruct; return bpl_gemm(rt, &gemm); }, {"args->struct_size"}},
      {"bpl_gemm(m -1)", [&] {
         gemm = BPL_GEMM_ARGS_INIT;
         gemm.m = -1;
         return bpl_gemm(rt, &gemm);
       }, {"args->m = -1"}, gemm_kernel},
      {"bpl_gemm(trans_a 2)", [&] {
         gemm = BPL_GEMM_ARGS_INIT;
         gemm.trans_a = 2;
         return bpl_gemm(rt, &gemm);
       }, {"args->trans_a = 2"}, gemm_kernel},
      {"bpl_gemm(lda too small)", [&] {
         gemm = BPL_GEMM_ARGS_INIT;
         gemm.m = gemm.n = gemm.k = 2;
         gemm.a = x_;
         gemm.b = x_ + 4;
         gemm.c = y_;
         gemm.lda = 1;
         gemm.ldb = gemm.ldc = 2;
         return bpl_gemm(rt, &gemm);
       }, {"args->lda = 1"}, gemm_kernel},
      {"bpl_gemm(ldc 0)", [&] { gemm.lda = 2; gemm.ldc = 0; return bpl_gemm(rt, &gemm); }, {"args->ldc = 0"}, gemm_kernel},
      {"bpl_gemm(trans_b 2)", [&] { gemm.ldc = 2; gemm.trans_b = 2; return bpl_gemm(rt, &gemm); }, {"args->trans_b = 2"}, gemm_kernel},
      {"bpl_gemm(dtype 42)", [&] { gemm.trans_b = 0; gemm.dtype = 42; return bpl_gemm(rt, &gemm); }, {"args->dtype = 42"}, gemm_kernel},
      {"bpl_gemm(m and lda huge)", [&] {
         gemm.dtype = BPL_DTYPE_F32;
         gemm.m = gemm.lda = kHuge;
         return bpl_gemm(rt, &gemm);
       }, {"exceeds the address space"}, gemm_kernel},
      {"bpl_gemm(device 3)", [&] {
         gemm.m = 2;
         gemm.lda = 2;
         gemm.device = 3;
         return bpl_gemm(rt, &gemm);
       }, {"device = 3"}, gemm_kernel},
      {"bpl_gemm(c overlaps a)", [&] { gemm.device = 0; gemm.c = x_; return bpl_gemm(rt, &gemm); }, {"overlaps"}, gemm_kernel},
      {"bpl_add(count -2)", [&] {
         add.x = x_;
         add.y = x_;
         add.out = y_;
         add.count = -2;
         return bpl_add(rt, &add);
       }, {"args->count = -2"}, add_kernel},
      {"bpl_add(out NULL)", [&] {
         add.count = 4;
         add.out = nullptr;
         return bpl_add(rt, &add);
       }, {"args->out is NULL"}, add_kernel},
      {"bpl_add(y NULL)", [&] { add.out = y_; add.y = nullptr; return bpl_add(rt, &add); }, {"args->y is NULL"}, add_kernel},
      {"bpl_scale(out overlaps x)", [&] { add.out = x_ + 1; return bpl_scale(rt, &add); }, {"args->out overlaps args->x"}, scale_kernel},
      {"bpl_scale(dtype 50)", [&] {
         add.y = x_;
         add.out = y_;
         add.dtype = 50;
         return bpl_scale(rt, &add);
       }, {"args->dtype = 50"}, scale_kernel},
      {"bpl_axpby(args NULL)", [&] { return bpl_axpby(rt, nullptr); }, {"args is NULL"}},
      {"bpl_cast(struct_size 1)", [&] { cast.struct_size = 1; return bpl_cast(rt, &cast); }, {"args->struct_size = 1"}},
      {"bpl_cast(from 77)", [&] {
         cast = BPL_CAST_ARGS_INIT;
         cast.from = 77;
         return bpl_cast(rt, &cast);
       }, {"args->from = 77"}, cast_kernel},
      {"bpl_cast(to 77)", [&] {
         cast = BPL_CAST_ARGS_INIT;
         cast.count = 4;
         cast.src = x_;
         cast.dst = y_;
         cast.to = 77;
         return bpl_cast(rt, &cast);
       }, {"args->to = 77"}, cast_kernel},
      {"bpl_cast(dst NULL)", [&] { cast.to = BPL_DTYPE_F32; cast.dst = nullptr; return bpl_cast(rt, &cast); }, {"args->dst is NULL"}, cast_kernel},
      {"bpl_program_compile(out NULL)", [&] { return bpl_program_compile(rt, source, sizeof(source), &options, nullptr); }, {"out is NULL"}},
      {"bpl_program_compile(source NULL)", [&] { return bpl_program_compile(rt, nullptr, 0, &options, &program); }, {"source is empty"}},
      {"bpl_program_compile(options struct_size 0)", [&] {
         options.struct_size = 0;
         return bpl_program_compile(rt, source, sizeof(source), &options, &program);
       }, {"options->struct_size = 0"}},
      {"bpl_program_compile(format unknown)", [&] {
         options = BPL_PROGRAM_OPTIONS_INIT;
         options.format = "fortran";
         return bpl_program_compile(rt, source, sizeof(source), &options, &program);
       }, {"options->format = 'fortran'"}, programs},
      {"bpl_program_run(program NULL)", [&] { return bpl_program_run(nullptr, nullptr, 0, nullptr, 0); }, {"program is NULL"}},
      {"bpl_program_run(foreign program)", [&] { return bpl_program_run(reinterpret_cast<bpl_program*>(x_), nullptr, 0, nullptr, 0); },
       {"not a live bpl_program"}},
      {"bpl_program_destroy(foreign program)", [&] { return bpl_program_destroy(reinterpret_cast<bpl_program*>(x_)); },
       {"not a live bpl_program"}},
  });
}

TEST_P(BadArguments, NamesOfUnknownValues) {
  EXPECT_STREQ(bpl_status_name(99), "BPL_ERR_UNKNOWN");
  EXPECT_STREQ(bpl_dtype_name(99), "unknown");
  EXPECT_EQ(bpl_dtype_size(-1), 0u);
  EXPECT_STREQ(bpl_reduce_op_name(0), "unknown");
  EXPECT_STREQ(bpl_collective_name(1000), "unknown");
  int32_t major = -1;
  bpl_abi_version(&major, nullptr);  // either out-parameter may be NULL
  EXPECT_EQ(major, BPL_ABI_MAJOR);
  // NULL where it means "nothing": accepted.
  EXPECT_EQ(bpl_finalize(nullptr), BPL_OK);
  EXPECT_EQ(bpl_comm_destroy(nullptr), BPL_OK);
  EXPECT_EQ(bpl_request_free(nullptr), BPL_OK);
  EXPECT_EQ(bpl_program_destroy(nullptr), BPL_OK);
  // A count of zero needs no buffers.
  EXPECT_EQ(bpl_allreduce(world_, nullptr, nullptr, 0, BPL_DTYPE_F32, BPL_OP_SUM, nullptr), BPL_OK) << bpl_last_error();
  // A success clears the previous message.
  EXPECT_EQ(bpl_allreduce(nullptr, x_, y_, 4, BPL_DTYPE_F32, BPL_OP_SUM, nullptr), BPL_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(bpl_barrier(world_, nullptr), BPL_OK) << bpl_last_error();
  EXPECT_STREQ(bpl_last_error(), "");
  EXPECT_EQ(bpl_free(runtime_, nullptr), BPL_OK);
}

INSTANTIATE_TEST_SUITE_P(Backends, BadArguments, ::testing::Values("gloo", "mpi", "neuron"),
                         [](const auto& info) { return info.param; });

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new FinalizeRuntimes);
  return RUN_ALL_TESTS();
}
