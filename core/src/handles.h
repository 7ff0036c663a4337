// The handles of the C API (bpl_runtime, bpl_comm, bpl_program, bpl_request): what each holds, and
// the checks that a pointer a caller passed is a live one of its kind.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "backplane/backplane.h"
#include "backplane/plugin.h"
#include "comm_state.h"
#include "environment.h"
#include "loader.h"
#include "trace.h"
#include "validation.h"

// Handles carry a magic number so that a stale or foreign pointer is reported instead of followed
// (best effort: a freed handle is cleared, which catches most use-after-destroy).
constexpr uint64_t kRuntimeMagic = 0x62706c2d72756e74ull;  // "bpl-runt"
constexpr uint64_t kCommMagic = 0x62706c2d636f6d6dull;     // "bpl-comm"
constexpr uint64_t kRequestMagic = 0x62706c2d72657175ull;  // "bpl-requ"

struct bpl_runtime {
  uint64_t magic = kRuntimeMagic;
  std::shared_ptr<backplane::Plugin> plugin;
  bpl_plugin_runtime* impl = nullptr;
  backplane::LaunchInfo launch;
  bpl_launch_info launch_c{};
  std::unique_ptr<bpl_store> store;  // the caller's store (bpl_init_options.store), or null
  std::string selection_reason;
  bpl_plugin_caps caps{};
  bool debug_detail = false;         // BPL_DEBUG=detail: fingerprints checked before each collective
  std::unique_ptr<backplane::Trace> trace;  // BPL_TRACE=DIR, or null
  bpl_comm* world = nullptr;
  std::mutex mutex;                  // guards split_comms and programs
  std::set<bpl_comm*> split_comms;   // destroyed at finalize if the caller forgot
  std::set<bpl_program*> programs;   // likewise

  const bpl_plugin_api& api() const { return plugin->api(); }
  const char* backend() const { return plugin->api().name; }
};

struct bpl_comm {
  explicit bpl_comm(int64_t timeout_ms) : state(timeout_ms) {}
  uint64_t magic = kCommMagic;
  bpl_runtime* runtime = nullptr;
  bpl_plugin_comm* impl = nullptr;
  int32_t rank = 0;
  int32_t size = 1;
  bool is_world = false;
  std::string name;                       // "world", "world/split0/color1": alike on every member
  std::string label;                      // name and this rank's place, for messages
  backplane::CommState state;             // timeout, operation numbers, failure
  std::atomic<uint32_t> splits{0};        // splits made of it so far: names its children
  std::atomic<uint32_t> shrinks{0};       // shrinks made of it so far: names their communicators
  std::atomic<uint32_t> grows{0};         // likewise, grows
  std::unique_ptr<bpl_store> store;       // the store it was made through (bpl_comm_create_from_store)
  std::atomic<int64_t> live_requests{0};  // a communicator outlives its requests
};

constexpr uint64_t kProgramMagic = 0x62706c2d70726f67ull;  // "bpl-prog"

struct bpl_program {
  uint64_t magic = kProgramMagic;
  bpl_runtime* runtime = nullptr;
  bpl_plugin_program* impl = nullptr;
};

struct bpl_request {
  uint64_t magic = kRequestMagic;
  bpl_comm* comm = nullptr;
  bpl_plugin_request* impl = nullptr;
  const char* function = "";  // the call that started it, and its number on the communicator
  uint64_t sequence = 0;
  bool traced = false;        // under BPL_TRACE, until its end is recorded
  uint64_t trace_ticket = 0;
};


namespace backplane {

inline bpl_runtime* check_runtime(const bpl_runtime* runtime, const char* param = "runtime") {
  REQUIRE(runtime != nullptr, std::string(param) + " is NULL");
  REQUIRE(runtime->magic == kRuntimeMagic, std::string(param) + " is not a live bpl_runtime (finalized or foreign pointer)");
  return const_cast<bpl_runtime*>(runtime);
}

inline bpl_comm* check_comm(const bpl_comm* comm) {
  REQUIRE(comm != nullptr, "comm is NULL");
  REQUIRE(comm->magic == kCommMagic, "comm is not a live bpl_comm (destroyed or foreign pointer)");
  return const_cast<bpl_comm*>(comm);
}

inline bpl_request* check_request(bpl_request* req) {
  REQUIRE(req != nullptr, "req is NULL");
  REQUIRE(req->magic == kRequestMagic, "req is not a live bpl_request (freed or foreign pointer)");
  return req;
}

inline bpl_program* check_program(bpl_program* program) {
  REQUIRE(program != nullptr, "program is NULL");
  REQUIRE(program->magic == kProgramMagic, "program is not a live bpl_program (destroyed or foreign pointer)");
  return program;
}

// What the runtime's backend provides: UNSUPPORTED naming the backend and the missing function,
// dtype, reduce op or kernel; INVALID_ARGUMENT for values outside the ABI's ranges.
// Fails with UNSUPPORTED unless the plugin provides `op` (the function exists and the capability is set).
template <typename Fn>
Fn require_collective(const bpl_comm* comm, Fn fn, bpl_collective op) {
  if (fn == nullptr || (comm->runtime->caps.collectives & BPL_BIT(op)) == 0) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + comm->runtime->backend() + "' does not provide " +
                                         bpl_collective_name(op));
  }
  return fn;
}

inline size_t check_dtype(const bpl_comm* comm, bpl_dtype dtype) {
  size_t size = bpl_dtype_size(dtype);
  REQUIRE(size != 0, "dtype = " + std::to_string(dtype) + " is not a bpl_dtype (expected BPL_DTYPE_F32 .. BPL_DTYPE_I64)");
  if ((comm->runtime->caps.dtypes & BPL_BIT(dtype)) == 0) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + comm->runtime->backend() + "' does not support dtype " +
                                         bpl_dtype_name(dtype));
  }
  return size;
}

inline void check_op(const bpl_comm* comm, bpl_reduce_op op) {
  REQUIRE(std::strcmp(bpl_reduce_op_name(op), "unknown") != 0,
          "op = " + std::to_string(op) + " is not a bpl_reduce_op (expected BPL_OP_SUM .. BPL_OP_AVG)");
  if ((comm->runtime->caps.reduce_ops & BPL_BIT(op)) == 0) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + comm->runtime->backend() +
                                         "' does not support reduce op " + bpl_reduce_op_name(op));
  }
}

inline void check_rank(const bpl_comm* comm, int32_t rank, const char* param) {
  REQUIRE(rank >= 0 && rank < comm->size, std::string(param) + " = " + std::to_string(rank) +
                                              ": expected a rank of the communicator, 0.." +
                                              std::to_string(comm->size - 1));
}

inline int32_t device_count_of(const bpl_runtime* runtime) {
  int32_t count = 0;
  if (runtime->api().device_count != nullptr) runtime->api().device_count(runtime->impl, &count);
  return count;
}

inline void check_device(const bpl_runtime* runtime, int32_t device) {
  const int32_t count = device_count_of(runtime);
  REQUIRE(device >= 0 && device < count, "device = " + std::to_string(device) + ": expected 0.." +
                                             std::to_string(count - 1) + " (" + runtime->backend() + " has " +
                                             std::to_string(count) + " device(s))");
}

template <typename Fn>
Fn require_device_fn(const bpl_runtime* runtime, Fn fn, const char* what) {
  if (fn == nullptr) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + runtime->backend() + "' does not provide " + what);
  }
  return fn;
}

// What the plugin's details say of its kernels and programs (the entry "kernels=…", where a CPU plugin
// names the module they live in), as " (kernels=…)" for a message; "" when they say nothing.
inline std::string kernels_note(const bpl_runtime* rt) {
  const std::string details = rt->caps.details != nullptr ? rt->caps.details : "";
  size_t start = details.rfind("kernels=", 0) == 0 ? 0 : details.find("; kernels=");
  if (start == std::string::npos) return "";
  if (start != 0) start += 2;
  return " (" + details.substr(start, details.find("; ", start) - start) + ")";
}

// Fails with UNSUPPORTED unless the plugin provides `kernel`.
template <typename Fn>
Fn require_kernel(const bpl_runtime* rt, Fn bpl_plugin_api::*field, bpl_kernel kernel, const char* what) {
  Fn fn = rt->plugin->optional(field);
  if (fn == nullptr || (rt->caps.kernels & BPL_BIT(kernel)) == 0) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + rt->backend() + "' does not provide the " + what +
                                         " kernel" + kernels_note(rt));
  }
  return fn;
}

// A bpl_comm around the plugin's communicator `impl` (its rank and size asked of the plugin).
bpl_comm* wrap_comm(bpl_runtime* runtime, bpl_plugin_comm* impl, bool is_world, std::string name, int64_t timeout_ms);
// Destroys the plugin's communicator and the handle.
void destroy_comm(bpl_comm* comm);

}  // namespace backplane
