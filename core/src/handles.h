// The handles of the C API (bpl_runtime, bpl_comm, bpl_program, bpl_request): what each holds, and
// the checks that a pointer a caller passed is a live one of its kind.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <sys/types.h>

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
  pid_t process = 0;  // the process that made it (bpl_init): a child forked since is none of its ranks
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
  // Calls on this runtime's handles in progress on any thread (backplane::RuntimeCall): bpl_finalize
  // ends them and waits for them before it frees what they use.
  std::atomic<int32_t> calls_in_progress{0};
  std::atomic<bool> finalizing{false};
  std::mutex calls_mutex;
  std::condition_variable calls_ended;

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

// This process's id, kept current across fork (pthread_atfork, registered on the first call).
pid_t this_process_id();
// A process forked after bpl_init is no rank of its parent's job (it shares the parent's sockets, shared
// memory and MPI, and would be taken for it): every handle it inherited is refused. Throws
// INVALID_ARGUMENT naming `param` when `runtime` is another process's.
void refuse_in_forked_child(const bpl_runtime* runtime, const char* param);

inline bpl_runtime* check_runtime(const bpl_runtime* runtime, const char* param = "runtime") {
  REQUIRE(runtime != nullptr, std::string(param) + " is NULL");
  REQUIRE(runtime->magic == kRuntimeMagic, std::string(param) + " is not a live bpl_runtime (finalized or foreign pointer)");
  refuse_in_forked_child(runtime, param);
  return const_cast<bpl_runtime*>(runtime);
}

inline bpl_comm* check_comm(const bpl_comm* comm) {
  REQUIRE(comm != nullptr, "comm is NULL");
  REQUIRE(comm->magic == kCommMagic, "comm is not a live bpl_comm (destroyed or foreign pointer)");
  refuse_in_forked_child(comm->runtime, "comm");
  return const_cast<bpl_comm*>(comm);
}

inline bpl_request* check_request(bpl_request* req) {
  REQUIRE(req != nullptr, "req is NULL");
  REQUIRE(req->magic == kRequestMagic, "req is not a live bpl_request (freed or foreign pointer)");
  refuse_in_forked_child(req->comm->runtime, "req");
  return req;
}

inline bpl_program* check_program(bpl_program* program) {
  REQUIRE(program != nullptr, "program is NULL");
  REQUIRE(program->magic == kProgramMagic, "program is not a live bpl_program (destroyed or foreign pointer)");
  refuse_in_forked_child(program->runtime, "program");
  return program;
}

// A call in progress on `runtime`'s handles, from its start to its return: counted, so that bpl_finalize
// on another thread ends it (it aborts the communicators) and waits for it before freeing what it uses.
// Refused, ABORTED, once bpl_finalize has begun, but for what only ends something (kEnds:
// bpl_request_free, which bpl_finalize waits a moment for, after the calls it ended).
class RuntimeCall {
 public:
  enum Kind { kStarts, kEnds };
  explicit RuntimeCall(bpl_runtime* runtime, Kind kind = kStarts) : runtime_(runtime) {
    runtime_->calls_in_progress.fetch_add(1);  // sequentially consistent, against finalize's flag
    if (kind == kStarts && runtime_->finalizing.load()) {
      leave();
      throw Error(BPL_ERR_ABORTED, "not started: bpl_finalize has begun on another thread of this rank");
    }
  }
  ~RuntimeCall() { leave(); }
  RuntimeCall(const RuntimeCall&) = delete;
  RuntimeCall& operator=(const RuntimeCall&) = delete;

 private:
  void leave() {
    if (runtime_->calls_in_progress.fetch_sub(1) == 1 && runtime_->finalizing.load()) {
      std::lock_guard<std::mutex> lock(runtime_->calls_mutex);
      runtime_->calls_ended.notify_all();
    }
  }
  bpl_runtime* runtime_;
};

// What the runtime's backend provides: UNSUPPORTED naming the backend and the missing function,
// dtype, reduce op or kernel; INVALID_ARGUMENT for values outside the ABI's ranges.

// The plugin table's entry of each operation kind, from its row of BPL_OPERATION_KINDS.
template <int Kind>
struct OperationEntry;
#define BPL_OPERATION_ENTRY_OF_(X, code, name, minor, form) \
  template <>                                               \
  struct OperationEntry<code> {                             \
    static constexpr auto field = &bpl_plugin_api::name;    \
  };
BPL_OPERATION_KINDS(BPL_OPERATION_ENTRY_OF_, )
#undef BPL_OPERATION_ENTRY_OF_

// Whether the runtime's backend provides the operation `Kind`: its table entry and its capability.
template <int Kind>
bool provides(const bpl_runtime* runtime) {
  return runtime->api().*OperationEntry<Kind>::field != nullptr && (runtime->caps.collectives & BPL_BIT(Kind)) != 0;
}

// The plugin's entry of the operation `Kind`; UNSUPPORTED, naming the backend and `Kind`, unless provided.
template <int Kind>
auto require_collective(const bpl_comm* comm) {
  if (!provides<Kind>(comm->runtime)) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + comm->runtime->backend() + "' does not provide " +
                                         bpl_collective_name(Kind));
  }
  return comm->runtime->api().*OperationEntry<Kind>::field;
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

inline void check_op(const bpl_comm* comm, bpl_reduce_op op, bpl_dtype dtype) {
  REQUIRE(std::strcmp(bpl_reduce_op_name(op), "unknown") != 0,
          "op = " + std::to_string(op) + " is not a bpl_reduce_op (expected BPL_OP_SUM .. BPL_OP_BXOR)");
  const bool bitwise = op == BPL_OP_BAND || op == BPL_OP_BOR || op == BPL_OP_BXOR;
  const bool integer = dtype == BPL_DTYPE_I8 || dtype == BPL_DTYPE_U8 || dtype == BPL_DTYPE_I32 || dtype == BPL_DTYPE_I64;
  REQUIRE(!bitwise || integer, std::string("op ") + bpl_reduce_op_name(op) + " takes an integer dtype (i8, u8, i32, i64), not " +
                                   bpl_dtype_name(dtype));
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
  Fn fn = rt->api().*field;
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
