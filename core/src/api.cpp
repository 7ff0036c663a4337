// The exported C API: validates every argument, then routes the call to the runtime's plugin.
//
// Plugins may trust what reaches them (plugin.h): all range, dtype, op, NULL and overlap checks live
// here, once, so every backend rejects bad input with the same message.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>

#include "backplane/backplane.h"
#include "backplane/plugin.h"
#include "comm_state.h"
#include "compile_cache.h"
#include "environment.h"
#include "error.h"
#include "fingerprint.h"
#include "loader.h"
#include "log.h"
#include "selection.h"

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
  std::string selection_reason;
  bpl_plugin_caps caps{};
  bool debug_detail = false;         // BPL_DEBUG=detail: fingerprints checked before each collective
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
};

namespace backplane {
namespace {

// Larger values are garbage, not a future version of a struct.
constexpr size_t kMaxStructSize = 1 << 20;

std::string quoted(const char* text) { return text == nullptr ? "NULL" : "'" + std::string(text) + "'"; }

// Throws INVALID_ARGUMENT with `message`, which is only built when the check fails: these checks run
// on every collective, and formatting numbers into strings would otherwise dominate a small call.
#define REQUIRE(condition, message)                                        \
  do {                                                                     \
    if (!(condition)) throw ::backplane::Error(BPL_ERR_INVALID_ARGUMENT, message); \
  } while (0)

void check_struct_size(size_t struct_size, const char* param) {
  REQUIRE(struct_size >= sizeof(size_t) && struct_size <= kMaxStructSize,
          std::string(param) + "->struct_size = " + std::to_string(struct_size) + ": expected sizeof(" + param +
              ") (at least " + std::to_string(sizeof(size_t)) + ")");
}

// An input struct from a caller of any ABI 1.x version: fields past its struct_size keep `defaults`.
template <typename T>
T read_input(const T* in, const T& defaults, const char* param) {
  T value = defaults;
  if (in == nullptr) return value;
  check_struct_size(in->struct_size, param);
  std::memcpy(static_cast<void*>(&value), in, std::min(in->struct_size, sizeof(T)));
  value.struct_size = sizeof(T);
  return value;
}

// An output struct: write only the fields the caller's struct_size holds.
template <typename T>
void write_output(const T& value, T* out, const char* param) {
  REQUIRE(out != nullptr, std::string(param) + " is NULL");
  check_struct_size(out->struct_size, param);
  size_t caller_size = out->struct_size;
  std::memcpy(static_cast<void*>(out), &value, std::min(caller_size, sizeof(T)));
  out->struct_size = caller_size;
}

void copy_text(char* dst, size_t capacity, const std::string& text) {
  size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

bpl_runtime* check_runtime(const bpl_runtime* runtime, const char* param = "runtime") {
  REQUIRE(runtime != nullptr, std::string(param) + " is NULL");
  REQUIRE(runtime->magic == kRuntimeMagic, std::string(param) + " is not a live bpl_runtime (finalized or foreign pointer)");
  return const_cast<bpl_runtime*>(runtime);
}

bpl_comm* check_comm(const bpl_comm* comm) {
  REQUIRE(comm != nullptr, "comm is NULL");
  REQUIRE(comm->magic == kCommMagic, "comm is not a live bpl_comm (destroyed or foreign pointer)");
  return const_cast<bpl_comm*>(comm);
}

bpl_request* check_request(bpl_request* req) {
  REQUIRE(req != nullptr, "req is NULL");
  REQUIRE(req->magic == kRequestMagic, "req is not a live bpl_request (freed or foreign pointer)");
  return req;
}

// Fails with UNSUPPORTED unless the plugin provides `op` (the function exists and the capability is set).
template <typename Fn>
Fn require_collective(const bpl_comm* comm, Fn fn, bpl_collective op) {
  if (fn == nullptr || (comm->runtime->caps.collectives & BPL_BIT(op)) == 0) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + comm->runtime->backend() + "' does not provide " +
                                         bpl_collective_name(op));
  }
  return fn;
}

size_t check_dtype(const bpl_comm* comm, bpl_dtype dtype) {
  size_t size = bpl_dtype_size(dtype);
  REQUIRE(size != 0, "dtype = " + std::to_string(dtype) + " is not a bpl_dtype (expected BPL_DTYPE_F32 .. BPL_DTYPE_I64)");
  if ((comm->runtime->caps.dtypes & BPL_BIT(dtype)) == 0) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + comm->runtime->backend() + "' does not support dtype " +
                                         bpl_dtype_name(dtype));
  }
  return size;
}

void check_op(const bpl_comm* comm, bpl_reduce_op op) {
  REQUIRE(std::strcmp(bpl_reduce_op_name(op), "unknown") != 0,
          "op = " + std::to_string(op) + " is not a bpl_reduce_op (expected BPL_OP_SUM .. BPL_OP_AVG)");
  if ((comm->runtime->caps.reduce_ops & BPL_BIT(op)) == 0) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + comm->runtime->backend() +
                                         "' does not support reduce op " + bpl_reduce_op_name(op));
  }
}

// The bytes a process can address: user space ends below 2^47 on x86-64 (2^48 on AArch64), or 2^56
// where the kernel has handed out an address above that (5-level page tables).
constexpr uint64_t kAddressSpaceBytes = uint64_t{1} << (sizeof(void*) < 8 ? 32 :
#if defined(__aarch64__)
                                                                            48
#else
                                                                            47
#endif
                                                        );

uint64_t address_space_of(const void* buffer) {
  return reinterpret_cast<uintptr_t>(buffer) < kAddressSpaceBytes ? kAddressSpaceBytes : uint64_t{1} << 56;
}

// Bytes of `count` elements times `blocks`, rejecting negative counts and sizes no process can address
// (a buffer that large cannot exist: the backend would read or write memory it does not own).
size_t check_count(int64_t count, size_t element_size, int64_t blocks, const char* param) {
  REQUIRE(count >= 0, std::string(param) + " = " + std::to_string(count) + ": expected >= 0");
  const auto limit = static_cast<int64_t>(kAddressSpaceBytes / element_size / static_cast<uint64_t>(blocks));
  REQUIRE(count <= limit, std::string(param) + " = " + std::to_string(count) + ": " +
                              (blocks == 1 ? "" : std::to_string(blocks) + " blocks of ") + "that many elements of " +
                              std::to_string(element_size) + (element_size == 1 ? " byte" : " bytes") + " exceed the address space (expected " + param +
                              " <= " + std::to_string(limit) + ")");
  return static_cast<size_t>(count) * element_size * static_cast<size_t>(blocks);
}

void check_buffer(const void* buffer, size_t bytes, const char* param) {
  REQUIRE(buffer != nullptr || bytes == 0, std::string(param) + " is NULL but holds " + std::to_string(bytes) + " bytes");
  REQUIRE(bytes <= address_space_of(buffer) - std::min<uint64_t>(reinterpret_cast<uintptr_t>(buffer), address_space_of(buffer)),
          std::string(param) + " + " + std::to_string(bytes) + " bytes runs past the end of the address space");
}

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  auto x = reinterpret_cast<uintptr_t>(a);
  auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

void check_rank(const bpl_comm* comm, int32_t rank, const char* param) {
  REQUIRE(rank >= 0 && rank < comm->size, std::string(param) + " = " + std::to_string(rank) +
                                              ": expected a rank of the communicator, 0.." +
                                              std::to_string(comm->size - 1));
}

// "bpl_allreduce #17 on world (rank 0 of 3)": what every message about an operation starts with.
std::string operation_label(const char* function, const bpl_comm* comm, uint64_t sequence) {
  return std::string(function) + " #" + std::to_string(sequence) + " on " + comm->label;
}

// The plugin's message for a failed call, or one made up when it gave none.
std::string plugin_message(const bpl_comm* comm, bpl_status status) {
  return last_error().empty() ? std::string(comm->runtime->backend()) + ": failed with " + bpl_status_name(status) +
                                    " (the plugin gave no message)"
                              : last_error();
}

// An operation that ended in failure: the message names it; a failure after which the ranks may
// have diverged fails the communicator for good (comm_state.h).
bpl_status operation_failed(const std::string& label, bpl_comm* comm, bpl_status status) {
  std::string message = label + ": " + plugin_message(comm, status);
  if (CommState::poisons(status)) comm->state.fail(status, message);
  set_last_error(std::move(message));
  return status;
}

// After the plugin ran operation `sequence`: report a failure, or wrap the request it started.
bpl_status finish(const char* function, bpl_comm* comm, uint64_t sequence, bpl_status status,
                  bpl_plugin_request* preq, bpl_request** req) {
  if (status != BPL_OK) return operation_failed(operation_label(function, comm, sequence), comm, status);
  if (req != nullptr) {
    if (preq == nullptr) {
      throw Error(BPL_ERR_INTERNAL, std::string("backend '") + comm->runtime->backend() +
                                        "' returned BPL_OK without a request");
    }
    auto* request = new bpl_request;
    request->comm = comm;
    request->impl = preq;
    request->function = function;
    request->sequence = sequence;
    comm->live_requests.fetch_add(1, std::memory_order_relaxed);
    *req = request;
  }
  return BPL_OK;
}

// The end of a request-side call (`function` is bpl_request_test, _wait or _free) on request `r`.
bpl_status finish_request(const char* function, bpl_request* r, bpl_status status) {
  if (status == BPL_OK) return BPL_OK;
  return operation_failed(std::string(function) + ": " + operation_label(r->function, r->comm, r->sequence), r->comm,
                          status);
}

// BPL_DEBUG=detail: every rank of `comm` shows the others what it is about to run; BPL_OK when all
// agree, else MISMATCH with the report (on every rank: each sees every fingerprint), or the status
// of the exchange itself.
bpl_status check_fingerprints(bpl_comm* comm, const Fingerprint& mine) {
  bpl_runtime* rt = comm->runtime;
  if (comm->size == 1) return BPL_OK;
  if (rt->api().allgather == nullptr || (rt->caps.collectives & BPL_BIT(BPL_COLL_ALLGATHER)) == 0 ||
      (rt->caps.dtypes & BPL_BIT(BPL_DTYPE_I64)) == 0) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      log(BPL_LOG_WARN, "core", std::string("BPL_DEBUG=detail: backend '") + rt->backend() +
                                    "' has no allgather of i64 to exchange fingerprints with: collectives are not checked");
    });
    return BPL_OK;
  }
  const FingerprintWords words = encode(mine);
  std::vector<FingerprintWords> all(static_cast<size_t>(comm->size));
  clear_last_error();
  const bpl_status status = rt->api().allgather(comm->impl, words.data(), all.data(), kFingerprintWords, BPL_DTYPE_I64,
                                                nullptr);
  if (status != BPL_OK) {
    set_last_error("in the BPL_DEBUG=detail check before it (ranks that do not reach this collective leave the "
                   "others waiting here): " + plugin_message(comm, status));
    return status;
  }
  std::vector<Fingerprint> fingerprints;
  for (int32_t r = 0; r < comm->size; ++r) {
    const std::optional<Fingerprint> theirs = decode(all[static_cast<size_t>(r)]);
    if (!theirs) {
      set_last_error("rank " + std::to_string(r) +
                     " sent no BPL_DEBUG=detail fingerprint: is BPL_DEBUG=detail set on every rank?");
      return BPL_ERR_INTERNAL;
    }
    fingerprints.push_back(*theirs);
  }
  const std::string report = compare(fingerprints);
  if (report.empty()) return BPL_OK;
  set_last_error("BPL_DEBUG=detail: " + report);
  return BPL_ERR_MISMATCH;
}

// Runs one operation on `comm` after the core's checks of its arguments: refuses it at once if the
// communicator failed or was aborted, numbers it, checks its fingerprint under BPL_DEBUG=detail, then
// calls the plugin (`call(preq)`, preq NULL for a blocking call) and reports the outcome.
template <typename Call>
bpl_status run_operation(const char* function, bpl_comm* comm, Fingerprint fingerprint, bpl_request** req,
                         Call&& call) {
  const uint64_t sequence = comm->state.next_sequence();
  if (comm->state.failed()) {
    const std::string cause = comm->state.cause();
    set_last_error(operation_label(function, comm, sequence) + ": not started: " +
                   (comm->state.status() == BPL_ERR_ABORTED ? cause : "the communicator failed earlier, at " + cause));
    return comm->state.status();
  }
  if (comm->runtime->debug_detail && fingerprint.op >= 0) {
    fingerprint.sequence = static_cast<int64_t>(sequence);
    const bpl_status checked = check_fingerprints(comm, fingerprint);
    if (checked != BPL_OK) {
      std::string message = last_error();
      set_last_error(operation_label(function, comm, sequence) + ": " + message);
      comm->state.fail(checked, last_error());
      return checked;
    }
  }
  bpl_plugin_request* preq = nullptr;  // the message is still clear here (guarded() cleared it): no reset
  const bpl_status status = call(req != nullptr ? &preq : nullptr);
  return finish(function, comm, sequence, status, preq, req);
}

// Send and recv: numbered, refused on a failed communicator, but not fingerprinted (they are not
// collective: the ranks' sequences of them differ).
const Fingerprint kPointToPoint{};

// The fingerprint of a collective (fields it does not have stay -1).
Fingerprint fingerprint_of(bpl_collective op, int64_t dtype = -1, int64_t count = -1, int64_t root = -1,
                           int64_t reduce_op = -1) {
  Fingerprint f;
  f.op = op;
  f.dtype = dtype;
  f.count = count;
  f.root = root;
  f.reduce_op = reduce_op;
  return f;
}

// Plugin call for functions that are not collectives: prefix the plugin's message with the function.
bpl_status forward(const char* function, const bpl_runtime* runtime, bpl_status status) {
  if (status != BPL_OK) {
    std::string message = last_error().empty() ? std::string(runtime->backend()) + ": failed with " +
                                                     bpl_status_name(status)
                                               : last_error();
    set_last_error(std::string(function) + ": " + message);
  }
  return status;
}

int32_t device_count_of(const bpl_runtime* runtime) {
  int32_t count = 0;
  if (runtime->api().device_count != nullptr) runtime->api().device_count(runtime->impl, &count);
  return count;
}

void check_device(const bpl_runtime* runtime, int32_t device) {
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

bpl_comm* wrap_comm(bpl_runtime* runtime, bpl_plugin_comm* impl, bool is_world, std::string name, int64_t timeout_ms) {
  auto comm = std::make_unique<bpl_comm>(timeout_ms);
  comm->runtime = runtime;
  comm->impl = impl;
  comm->is_world = is_world;
  bpl_status status = runtime->api().comm_rank_size(impl, &comm->rank, &comm->size);
  if (status != BPL_OK) throw Error(status, "comm_rank_size failed: " + last_error());
  comm->name = std::move(name);
  comm->label = comm->name + " (rank " + std::to_string(comm->rank) + " of " + std::to_string(comm->size) + ")";
  return comm.release();
}

void destroy_comm(bpl_comm* comm) {
  comm->runtime->api().comm_destroy(comm->impl);
  comm->magic = 0;
  delete comm;
}

// Loads the first candidate that opens. An explicit choice that fails is an error; an automatic one
// moves on and records why in the selection reason.
std::shared_ptr<Plugin> load_selected(const Selection& selection, const std::vector<std::string>& dirs,
                                      std::string* reason) {
  std::string skipped;
  for (const Candidate& candidate : selection.candidates) {
    try {
      std::string path = find_plugin(candidate.backend, dirs);
      std::shared_ptr<Plugin> plugin = Plugin::load(path);
      *reason = candidate.reason + skipped;
      return plugin;
    } catch (const Error& e) {
      if (selection.explicit_choice) {
        throw Error(e.status(), "backend '" + candidate.backend + "' selected by " + candidate.reason +
                                    " cannot be used: " + e.what());
      }
      skipped += "; skipped " + candidate.backend + ": " + e.what();
      log(BPL_LOG_INFO, "core", "auto selection skipped " + candidate.backend + ": " + e.what());
    }
  }
  throw Error(BPL_ERR_NOT_FOUND, "no backend could be loaded" + skipped);
}

const bpl_init_options kDefaultInitOptions = BPL_INIT_OPTIONS_INIT;

// Fails with UNSUPPORTED unless the plugin provides `kernel`.
template <typename Fn>
Fn require_kernel(const bpl_runtime* rt, Fn bpl_plugin_api::*field, bpl_kernel kernel, const char* what) {
  Fn fn = rt->plugin->optional(field);
  if (fn == nullptr || (rt->caps.kernels & BPL_BIT(kernel)) == 0) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + rt->backend() + "' does not provide the " + what + " kernel");
  }
  return fn;
}

size_t check_known_dtype(bpl_dtype dtype, const char* field) {
  const size_t size = bpl_dtype_size(dtype);
  REQUIRE(size != 0, std::string(field) + " = " + std::to_string(dtype) +
                         " is not a bpl_dtype (expected BPL_DTYPE_F32 .. BPL_DTYPE_I64)");
  return size;
}

bool is_floating(bpl_dtype dtype) { return dtype >= BPL_DTYPE_F32 && dtype <= BPL_DTYPE_BF16; }

// A rows×cols row-major matrix with leading dimension `ld`: checks the sizes and returns its bytes.
size_t check_matrix(const void* data, int64_t rows, int64_t cols, int64_t ld, size_t element, const char* name,
                    const char* ld_name) {
  REQUIRE(ld >= std::max<int64_t>(1, cols), std::string(ld_name) + " = " + std::to_string(ld) + ": expected >= " +
                                                std::to_string(std::max<int64_t>(1, cols)) + " (the row length of " +
                                                name + ")");
  if (rows == 0 || cols == 0) return 0;
  REQUIRE(rows <= std::numeric_limits<int64_t>::max() / ld / static_cast<int64_t>(element),
          std::string(name) + " of " + std::to_string(rows) + " rows of " + std::to_string(ld) +
              " elements exceeds the address space");
  const size_t bytes = static_cast<size_t>((rows - 1) * ld + cols) * element;
  REQUIRE(data != nullptr, std::string(name) + " is NULL but holds " + std::to_string(rows) + "x" +
                               std::to_string(cols) + " elements");
  return bytes;
}

bpl_program* check_program(bpl_program* program) {
  REQUIRE(program != nullptr, "program is NULL");
  REQUIRE(program->magic == kProgramMagic, "program is not a live bpl_program (destroyed or foreign pointer)");
  return program;
}

bool lists(const std::string& formats, const std::string& format) {
  std::istringstream words(formats);
  for (std::string word; words >> word;) {
    if (word == format) return true;
  }
  return false;
}

void check_tensors(const bpl_tensor* tensors, int32_t count, const char* name) {
  REQUIRE(count >= 0, std::string("num_") + name + " = " + std::to_string(count) + ": expected >= 0");
  REQUIRE(tensors != nullptr || count == 0, std::string(name) + " is NULL but num_" + name + " = " + std::to_string(count));
  for (int32_t i = 0; i < count; ++i) {
    const bpl_tensor& t = tensors[i];
    const std::string label = std::string(name) + "[" + std::to_string(i) + "]";
    check_struct_size(t.struct_size, label.c_str());
    REQUIRE(t.struct_size >= sizeof(bpl_tensor), label + ".struct_size = " + std::to_string(t.struct_size) +
                                                     ": expected sizeof(bpl_tensor) = " + std::to_string(sizeof(bpl_tensor)));
    const size_t element = check_known_dtype(t.dtype, (label + ".dtype").c_str());
    REQUIRE(t.ndim >= 0 && t.ndim <= BPL_MAX_DIMS,
            label + ".ndim = " + std::to_string(t.ndim) + ": expected 0.." + std::to_string(BPL_MAX_DIMS));
    int64_t elements = 1;
    for (int32_t d = 0; d < t.ndim; ++d) {
      REQUIRE(t.shape[d] >= 0, label + ".shape[" + std::to_string(d) + "] = " + std::to_string(t.shape[d]) + ": expected >= 0");
      REQUIRE(t.shape[d] == 0 || elements <= std::numeric_limits<int64_t>::max() / static_cast<int64_t>(element) / t.shape[d],
              label + " has more elements than the address space holds");
      elements *= t.shape[d];
    }
    check_buffer(t.data, static_cast<size_t>(elements) * element, (label + ".data").c_str());
  }
}

// add, scale and axpby: `name` is the kernel's ("add"), `function` the API's ("bpl_add").
bpl_status elementwise(const char* function, const char* name, bpl_runtime* runtime, const bpl_elementwise_args* args,
                       bpl_kernel kernel) {
  bpl_runtime* rt = check_runtime(runtime);
  REQUIRE(args != nullptr, "args is NULL");
  const bpl_elementwise_args defaults = BPL_ELEMENTWISE_ARGS_INIT;
  const bpl_elementwise_args e = read_input(args, defaults, "args");
  auto fn = require_kernel(rt, &bpl_plugin_api::elementwise, kernel, name);
  check_device(rt, e.device);
  const size_t element = check_known_dtype(e.dtype, "args->dtype");
  if (kernel != BPL_KERNEL_ADD && !is_floating(e.dtype)) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string(name) + " of dtype " + bpl_dtype_name(e.dtype) +
                                         " is not provided (floating dtypes only)");
  }
  const size_t bytes = check_count(e.count, element, 1, "args->count");
  check_buffer(e.x, bytes, "args->x");
  check_buffer(e.out, bytes, "args->out");
  REQUIRE(e.out == e.x || !overlap(e.out, bytes, e.x, bytes), "args->out overlaps args->x without being equal");
  if (kernel != BPL_KERNEL_SCALE) {
    check_buffer(e.y, bytes, "args->y");
    REQUIRE(e.out == e.y || !overlap(e.out, bytes, e.y, bytes), "args->out overlaps args->y without being equal");
  }
  return forward(function, rt, fn(rt->impl, kernel, &e));
}


}  // namespace
}  // namespace backplane

using namespace backplane;

extern "C" {

bpl_status bpl_init(const bpl_init_options* options, bpl_runtime** out) {
  return guarded("bpl_init", [&] {
    REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    bpl_init_options opts = read_input(options, kDefaultInitOptions, "options");
    EnvLookup env = process_environment();
    auto runtime = std::make_unique<bpl_runtime>();
    runtime->launch = resolve_launch(opts, env);
    runtime->debug_detail = debug_detail(env);
    log_level_setting(env);  // a bad BPL_LOG_LEVEL is refused here, naming it
    Selection selection = select_backend(opts.backend, env, probe_machine());
    runtime->plugin = load_selected(selection, plugin_search_dirs(env), &runtime->selection_reason);

    const LaunchInfo& launch = runtime->launch;
    runtime->launch_c = {sizeof(bpl_launch_info), launch.rank, launch.world_size, launch.local_rank,
                         launch.local_world_size, launch.master_addr.c_str(), launch.launcher.c_str(),
                         launch.master_port, 0, launch.timeout_ms};
    const bpl_plugin_api& api = runtime->api();
    clear_last_error();
    bpl_status status = api.runtime_create(&runtime->launch_c, &runtime->impl);
    if (status != BPL_OK) {
      throw Error(status, std::string(api.name) + " (" + runtime->selection_reason + "): " +
                              (last_error().empty() ? bpl_status_name(status) : last_error()));
    }
    try {
      runtime->caps.struct_size = sizeof(bpl_plugin_caps);
      if (api.runtime_describe != nullptr) {
        status = api.runtime_describe(runtime->impl, &runtime->caps);
        if (status != BPL_OK) throw Error(status, "runtime_describe failed: " + last_error());
      }
      bpl_plugin_comm* world = nullptr;
      status = api.comm_world(runtime->impl, &world);
      if (status != BPL_OK) throw Error(status, "comm_world failed: " + last_error());
      runtime->world = wrap_comm(runtime.get(), world, true, "world", launch.timeout_ms);
    } catch (...) {
      api.runtime_destroy(runtime->impl);
      throw;
    }
    log(BPL_LOG_INFO, "core", std::string("rank ") + std::to_string(launch.rank) + "/" +
                                  std::to_string(launch.world_size) + " using backend " + api.name + " from " +
                                  runtime->plugin->path() + " (" + runtime->selection_reason + ")");
    *out = runtime.release();
    return BPL_OK;
  });
}

bpl_status bpl_finalize(bpl_runtime* runtime) {
  return guarded("bpl_finalize", [&] {
    if (runtime == nullptr) return BPL_OK;
    check_runtime(runtime);
    std::set<bpl_comm*> leftover;
    {
      std::lock_guard<std::mutex> lock(runtime->mutex);
      leftover.swap(runtime->split_comms);
    }
    if (!leftover.empty()) {
      log(BPL_LOG_WARN, "core", std::to_string(leftover.size()) + " communicator(s) were not destroyed before bpl_finalize");
    }
    for (bpl_comm* comm : leftover) destroy_comm(comm);
    std::set<bpl_program*> programs;
    {
      std::lock_guard<std::mutex> lock(runtime->mutex);
      programs.swap(runtime->programs);
    }
    for (bpl_program* program : programs) {
      runtime->api().program_destroy(program->impl);
      program->magic = 0;
      delete program;
    }
    runtime->world->magic = 0;
    delete runtime->world;
    bpl_status status = runtime->api().runtime_destroy(runtime->impl);
    std::string message = last_error();
    runtime->magic = 0;
    delete runtime;
    if (status != BPL_OK) throw Error(status, message);
    return BPL_OK;
  });
}

bpl_status bpl_runtime_describe(const bpl_runtime* runtime, bpl_runtime_info* out) {
  return guarded("bpl_runtime_describe", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    bpl_runtime_info info{};
    info.struct_size = sizeof(info);
    info.backend = rt->api().name;
    info.plugin_path = rt->plugin->path().c_str();
    info.plugin_version = rt->api().version;
    info.selection_reason = rt->selection_reason.c_str();
    info.launcher = rt->launch.launcher.c_str();
    info.details = rt->caps.details != nullptr ? rt->caps.details : "";
    info.plugin_abi_major = rt->api().abi_major;
    info.plugin_abi_minor = rt->api().abi_minor;
    info.rank = rt->launch.rank;
    info.world_size = rt->launch.world_size;
    info.local_rank = rt->launch.local_rank;
    info.local_world_size = rt->launch.local_world_size;
    info.device_count = device_count_of(rt);
    info.dtypes = rt->caps.dtypes;
    info.collectives = rt->caps.collectives;
    info.reduce_ops = rt->caps.reduce_ops;
    info.timeout_ms = rt->launch.timeout_ms;
    info.kernels = rt->caps.kernels;
    info.program_formats = rt->caps.program_formats != nullptr ? rt->caps.program_formats : "";
    write_output(info, out, "out");
    return BPL_OK;
  });
}

bpl_status bpl_select_backend(const bpl_init_options* options, bpl_selection* out) {
  return guarded("bpl_select_backend", [&] {
    REQUIRE(out != nullptr, "out is NULL");
    bpl_init_options opts = read_input(options, kDefaultInitOptions, "options");
    EnvLookup env = process_environment();
    Selection selection = select_backend(opts.backend, env, probe_machine());
    std::vector<std::string> dirs = plugin_search_dirs(env);
    bpl_selection result{};
    result.struct_size = sizeof(result);
    std::string skipped;
    for (const Candidate& candidate : selection.candidates) {
      copy_text(result.backend, sizeof(result.backend), candidate.backend);
      copy_text(result.reason, sizeof(result.reason), candidate.reason + skipped);
      try {
        copy_text(result.plugin_path, sizeof(result.plugin_path), find_plugin(candidate.backend, dirs));
        write_output(result, out, "out");
        return BPL_OK;
      } catch (const Error& e) {
        if (selection.explicit_choice || &candidate == &selection.candidates.back()) {
          write_output(result, out, "out");
          throw;
        }
        skipped += "; skipped " + candidate.backend + ": " + e.what();
      }
    }
    throw Error(BPL_ERR_INTERNAL, "no candidate backend");
  });
}

bpl_status bpl_plugin_probe(const char* backend, bpl_plugin_info* out) {
  return guarded("bpl_plugin_probe", [&] {
    REQUIRE(backend != nullptr && *backend != '\0', "backend is " + quoted(backend) + ": expected a name or a path");
    REQUIRE(out != nullptr, "out is NULL");
    std::shared_ptr<Plugin> plugin = Plugin::load(find_plugin(backend, plugin_search_dirs(process_environment())));
    bpl_plugin_info info{};
    info.struct_size = sizeof(info);
    copy_text(info.name, sizeof(info.name), plugin->api().name);
    copy_text(info.version, sizeof(info.version), plugin->api().version);
    copy_text(info.path, sizeof(info.path), plugin->path());
    info.abi_major = plugin->api().abi_major;
    info.abi_minor = plugin->api().abi_minor;
    write_output(info, out, "out");
    return BPL_OK;
  });
}

/* ---- device ---- */

bpl_status bpl_device_count(const bpl_runtime* runtime, int32_t* count) {
  return guarded("bpl_device_count", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    REQUIRE(count != nullptr, "count is NULL");
    auto fn = require_device_fn(rt, rt->api().device_count, "device_count");
    return forward("bpl_device_count", rt, fn(rt->impl, count));
  });
}

bpl_status bpl_device_get_properties(const bpl_runtime* runtime, int32_t device, bpl_device_properties* out) {
  return guarded("bpl_device_get_properties", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    REQUIRE(out != nullptr, "out is NULL");
    check_struct_size(out->struct_size, "out");
    auto fn = require_device_fn(rt, rt->api().device_properties, "device_properties");
    check_device(rt, device);
    bpl_device_properties props{};
    props.struct_size = sizeof(props);
    bpl_status status = forward("bpl_device_get_properties", rt, fn(rt->impl, device, &props));
    if (status == BPL_OK) write_output(props, out, "out");
    return status;
  });
}

bpl_status bpl_malloc(bpl_runtime* runtime, int32_t device, size_t bytes, void** ptr) {
  return guarded("bpl_malloc", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    REQUIRE(ptr != nullptr, "ptr is NULL");
    *ptr = nullptr;
    auto fn = require_device_fn(rt, rt->api().mem_alloc, "malloc");
    check_device(rt, device);
    REQUIRE(bytes <= static_cast<size_t>(std::numeric_limits<int64_t>::max()),
            "bytes = " + std::to_string(bytes) + " exceeds the address space");
    if (bytes == 0) return BPL_OK;
    return forward("bpl_malloc", rt, fn(rt->impl, device, bytes, ptr));
  });
}

bpl_status bpl_free(bpl_runtime* runtime, void* ptr) {
  return guarded("bpl_free", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    if (ptr == nullptr) return BPL_OK;
    auto fn = require_device_fn(rt, rt->api().mem_free, "free");
    return forward("bpl_free", rt, fn(rt->impl, ptr));
  });
}

bpl_status bpl_memcpy(bpl_runtime* runtime, void* dst, const void* src, size_t bytes, bpl_memcpy_kind kind) {
  return guarded("bpl_memcpy", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    REQUIRE(kind >= BPL_MEMCPY_HOST_TO_HOST && kind <= BPL_MEMCPY_DEVICE_TO_DEVICE,
            "kind = " + std::to_string(kind) + ": expected BPL_MEMCPY_HOST_TO_HOST .. BPL_MEMCPY_DEVICE_TO_DEVICE");
    check_buffer(dst, bytes, "dst");
    check_buffer(src, bytes, "src");
    REQUIRE(!overlap(dst, bytes, src, bytes), "dst and src overlap");
    if (bytes == 0) return BPL_OK;
    auto fn = require_device_fn(rt, rt->api().mem_copy, "memcpy");
    return forward("bpl_memcpy", rt, fn(rt->impl, dst, src, bytes, kind));
  });
}

bpl_status bpl_synchronize(bpl_runtime* runtime, int32_t device) {
  return guarded("bpl_synchronize", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    check_device(rt, device);
    if (rt->api().synchronize == nullptr) return BPL_OK;  // nothing queued on a synchronous backend
    return forward("bpl_synchronize", rt, rt->api().synchronize(rt->impl, device));
  });
}

/* ---- communicators ---- */

bpl_status bpl_comm_world(bpl_runtime* runtime, bpl_comm** out) {
  return guarded("bpl_comm_world", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    REQUIRE(out != nullptr, "out is NULL");
    *out = rt->world;
    return BPL_OK;
  });
}

bpl_status bpl_comm_split(bpl_comm* parent, int32_t color, int32_t key, bpl_comm** out) {
  return guarded("bpl_comm_split", [&] {
    bpl_comm* comm = check_comm(parent);
    REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    REQUIRE(color >= BPL_COLOR_UNDEFINED,
            "color = " + std::to_string(color) + ": expected >= 0, or BPL_COLOR_UNDEFINED (-1)");
    bpl_runtime* rt = comm->runtime;
    auto fn = require_collective(comm, rt->api().comm_split, BPL_COLL_COMM_SPLIT);
    bpl_plugin_comm* child = nullptr;
    bpl_status status = run_operation("bpl_comm_split", comm, fingerprint_of(BPL_COLL_COMM_SPLIT), nullptr,
                                      [&](bpl_plugin_request**) { return fn(comm->impl, color, key, &child); });
    // Every rank of the parent splits, in the same order: the split's number names the children alike.
    const uint32_t split_number = comm->splits.fetch_add(1, std::memory_order_relaxed);
    if (status != BPL_OK) return status;
    if (child == nullptr) return BPL_OK;  // BPL_COLOR_UNDEFINED
    bpl_comm* wrapped = nullptr;
    try {
      const int64_t timeout_ms = comm->state.timeout_ms();
      wrapped = wrap_comm(rt, child, false,
                          comm->name + "/split" + std::to_string(split_number) + "/color" + std::to_string(color),
                          timeout_ms);
      if (auto set_timeout = rt->plugin->optional(&bpl_plugin_api::comm_set_timeout)) {
        status = set_timeout(child, timeout_ms);
        if (status != BPL_OK) throw Error(status, "comm_set_timeout on the new communicator failed: " + last_error());
      }
    } catch (...) {
      if (wrapped != nullptr) wrapped->magic = 0;
      delete wrapped;
      rt->api().comm_destroy(child);
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(rt->mutex);
      rt->split_comms.insert(wrapped);
    }
    *out = wrapped;
    return BPL_OK;
  });
}

bpl_status bpl_comm_destroy(bpl_comm* comm) {
  return guarded("bpl_comm_destroy", [&] {
    if (comm == nullptr) return BPL_OK;
    check_comm(comm);
    REQUIRE(!comm->is_world, "comm is the world communicator, which the runtime owns: it ends with bpl_finalize");
    const int64_t pending = comm->live_requests.load();
    REQUIRE(pending == 0, "comm still has " + std::to_string(pending) +
                              " request(s) that were not released: call bpl_request_free on them first");
    {
      std::lock_guard<std::mutex> lock(comm->runtime->mutex);
      comm->runtime->split_comms.erase(comm);
    }
    destroy_comm(comm);
    return BPL_OK;
  });
}

bpl_status bpl_comm_rank(const bpl_comm* comm, int32_t* rank) {
  return guarded("bpl_comm_rank", [&] {
    const bpl_comm* c = check_comm(comm);
    REQUIRE(rank != nullptr, "rank is NULL");
    *rank = c->rank;
    return BPL_OK;
  });
}

bpl_status bpl_comm_size(const bpl_comm* comm, int32_t* size) {
  return guarded("bpl_comm_size", [&] {
    const bpl_comm* c = check_comm(comm);
    REQUIRE(size != nullptr, "size is NULL");
    *size = c->size;
    return BPL_OK;
  });
}

/* ---- collectives ---- */

bpl_status bpl_allreduce(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                         bpl_reduce_op op, bpl_request** req) {
  return guarded("bpl_allreduce", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective(c, c->runtime->api().allreduce, BPL_COLL_ALLREDUCE);
    size_t bytes = check_count(count, check_dtype(c, dtype), 1, "count");
    check_op(c, op);
    check_buffer(send, bytes, "send");
    check_buffer(recv, bytes, "recv");
    REQUIRE(send == recv || !overlap(send, bytes, recv, bytes), "send and recv overlap without being equal (in place)");
    return run_operation("bpl_allreduce", c, fingerprint_of(BPL_COLL_ALLREDUCE, dtype, count, -1, op), req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, count, dtype, op, preq); });
  });
}

bpl_status bpl_broadcast(bpl_comm* comm, void* buf, int64_t count, bpl_dtype dtype, int32_t root, bpl_request** req) {
  return guarded("bpl_broadcast", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective(c, c->runtime->api().broadcast, BPL_COLL_BROADCAST);
    size_t bytes = check_count(count, check_dtype(c, dtype), 1, "count");
    check_buffer(buf, bytes, "buf");
    check_rank(c, root, "root");
    return run_operation("bpl_broadcast", c, fingerprint_of(BPL_COLL_BROADCAST, dtype, count, root), req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, buf, count, dtype, root, preq); });
  });
}

bpl_status bpl_reduce(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype, bpl_reduce_op op,
                      int32_t root, bpl_request** req) {
  return guarded("bpl_reduce", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective(c, c->runtime->api().reduce, BPL_COLL_REDUCE);
    size_t bytes = check_count(count, check_dtype(c, dtype), 1, "count");
    check_op(c, op);
    check_rank(c, root, "root");
    check_buffer(send, bytes, "send");
    if (c->rank == root) {
      check_buffer(recv, bytes, "recv");
      REQUIRE(send == recv || !overlap(send, bytes, recv, bytes), "send and recv overlap without being equal (in place)");
    }
    return run_operation("bpl_reduce", c, fingerprint_of(BPL_COLL_REDUCE, dtype, count, root, op), req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, count, dtype, op, root, preq); });
  });
}

bpl_status bpl_allgather(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                         bpl_request** req) {
  return guarded("bpl_allgather", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective(c, c->runtime->api().allgather, BPL_COLL_ALLGATHER);
    size_t element = check_dtype(c, dtype);
    size_t total = check_count(count, element, c->size, "count");
    size_t block = total / static_cast<size_t>(c->size);
    check_buffer(send, block, "send");
    check_buffer(recv, total, "recv");
    const void* own_block = static_cast<const char*>(recv) + block * static_cast<size_t>(c->rank);
    REQUIRE(send == own_block || !overlap(send, block, recv, total),
            "send overlaps recv but is not recv + rank*count elements (in place)");
    return run_operation("bpl_allgather", c, fingerprint_of(BPL_COLL_ALLGATHER, dtype, count), req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, count, dtype, preq); });
  });
}

bpl_status bpl_reduce_scatter(bpl_comm* comm, const void* send, void* recv, int64_t recvcount, bpl_dtype dtype,
                              bpl_reduce_op op, bpl_request** req) {
  return guarded("bpl_reduce_scatter", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective(c, c->runtime->api().reduce_scatter, BPL_COLL_REDUCE_SCATTER);
    size_t element = check_dtype(c, dtype);
    size_t total = check_count(recvcount, element, c->size, "recvcount");
    size_t block = total / static_cast<size_t>(c->size);
    check_op(c, op);
    check_buffer(send, total, "send");
    check_buffer(recv, block, "recv");
    const void* own_block = static_cast<const char*>(send) + block * static_cast<size_t>(c->rank);
    REQUIRE(recv == own_block || !overlap(send, total, recv, block),
            "recv overlaps send but is not send + rank*recvcount elements (in place)");
    return run_operation("bpl_reduce_scatter", c, fingerprint_of(BPL_COLL_REDUCE_SCATTER, dtype, recvcount, -1, op), req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, recvcount, dtype, op, preq); });
  });
}

bpl_status bpl_alltoall(bpl_comm* comm, const void* send, void* recv, int64_t count, bpl_dtype dtype,
                        bpl_request** req) {
  return guarded("bpl_alltoall", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective(c, c->runtime->api().alltoall, BPL_COLL_ALLTOALL);
    size_t total = check_count(count, check_dtype(c, dtype), c->size, "count");
    check_buffer(send, total, "send");
    check_buffer(recv, total, "recv");
    REQUIRE(send == recv || !overlap(send, total, recv, total), "send and recv overlap without being equal (in place)");
    return run_operation("bpl_alltoall", c, fingerprint_of(BPL_COLL_ALLTOALL, dtype, count), req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, send, recv, count, dtype, preq); });
  });
}

bpl_status bpl_barrier(bpl_comm* comm, bpl_request** req) {
  return guarded("bpl_barrier", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective(c, c->runtime->api().barrier, BPL_COLL_BARRIER);
    return run_operation("bpl_barrier", c, fingerprint_of(BPL_COLL_BARRIER), req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, preq); });
  });
}

namespace {
// Checks shared by send and recv.
void check_point_to_point(const bpl_comm* c, const void* buf, int64_t count, bpl_dtype dtype, int32_t peer,
                          int32_t tag) {
  size_t bytes = check_count(count, check_dtype(c, dtype), 1, "count");
  check_buffer(buf, bytes, "buf");
  check_rank(c, peer, "peer");
  REQUIRE(peer != c->rank, "peer = " + std::to_string(peer) + " is the calling rank itself");
  REQUIRE(tag >= 0, "tag = " + std::to_string(tag) + ": expected >= 0");
}
}  // namespace

bpl_status bpl_send(bpl_comm* comm, const void* buf, int64_t count, bpl_dtype dtype, int32_t peer, int32_t tag,
                    bpl_request** req) {
  return guarded("bpl_send", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective(c, c->runtime->api().send, BPL_COLL_SEND);
    check_point_to_point(c, buf, count, dtype, peer, tag);
    return run_operation("bpl_send", c, kPointToPoint, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, buf, count, dtype, peer, tag, preq); });
  });
}

bpl_status bpl_recv(bpl_comm* comm, void* buf, int64_t count, bpl_dtype dtype, int32_t peer, int32_t tag,
                    bpl_request** req) {
  return guarded("bpl_recv", [&] {
    bpl_comm* c = check_comm(comm);
    auto fn = require_collective(c, c->runtime->api().recv, BPL_COLL_RECV);
    check_point_to_point(c, buf, count, dtype, peer, tag);
    return run_operation("bpl_recv", c, kPointToPoint, req,
                         [&](bpl_plugin_request** preq) { return fn(c->impl, buf, count, dtype, peer, tag, preq); });
  });
}

/* ---- kernels ---- */

bpl_status bpl_gemm(bpl_runtime* runtime, const bpl_gemm_args* args) {
  return guarded("bpl_gemm", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    REQUIRE(args != nullptr, "args is NULL");
    const bpl_gemm_args defaults = BPL_GEMM_ARGS_INIT;
    const bpl_gemm_args g = read_input(args, defaults, "args");
    auto fn = require_kernel(rt, &bpl_plugin_api::gemm, BPL_KERNEL_GEMM, "gemm");
    check_device(rt, g.device);
    const size_t element = check_known_dtype(g.dtype, "args->dtype");
    if (!is_floating(g.dtype)) {
      throw Error(BPL_ERR_UNSUPPORTED, std::string("gemm of dtype ") + bpl_dtype_name(g.dtype) +
                                           " is not provided (f32, f64, f16, bf16)");
    }
    REQUIRE(g.trans_a == 0 || g.trans_a == 1, "args->trans_a = " + std::to_string(g.trans_a) + ": expected 0 or 1");
    REQUIRE(g.trans_b == 0 || g.trans_b == 1, "args->trans_b = " + std::to_string(g.trans_b) + ": expected 0 or 1");
    REQUIRE(g.m >= 0, "args->m = " + std::to_string(g.m) + ": expected >= 0");
    REQUIRE(g.n >= 0, "args->n = " + std::to_string(g.n) + ": expected >= 0");
    REQUIRE(g.k >= 0, "args->k = " + std::to_string(g.k) + ": expected >= 0");
    const size_t a_bytes = g.trans_a ? check_matrix(g.a, g.k, g.m, g.lda, element, "args->a", "args->lda")
                                     : check_matrix(g.a, g.m, g.k, g.lda, element, "args->a", "args->lda");
    const size_t b_bytes = g.trans_b ? check_matrix(g.b, g.n, g.k, g.ldb, element, "args->b", "args->ldb")
                                     : check_matrix(g.b, g.k, g.n, g.ldb, element, "args->b", "args->ldb");
    const size_t c_bytes = check_matrix(g.c, g.m, g.n, g.ldc, element, "args->c", "args->ldc");
    REQUIRE(!overlap(g.c, c_bytes, g.a, a_bytes) && !overlap(g.c, c_bytes, g.b, b_bytes),
            "args->c overlaps args->a or args->b");
    return forward("bpl_gemm", rt, fn(rt->impl, &g));
  });
}

bpl_status bpl_add(bpl_runtime* runtime, const bpl_elementwise_args* args) {
  return guarded("bpl_add", [&] { return elementwise("bpl_add", "add", runtime, args, BPL_KERNEL_ADD); });
}

bpl_status bpl_scale(bpl_runtime* runtime, const bpl_elementwise_args* args) {
  return guarded("bpl_scale", [&] { return elementwise("bpl_scale", "scale", runtime, args, BPL_KERNEL_SCALE); });
}

bpl_status bpl_axpby(bpl_runtime* runtime, const bpl_elementwise_args* args) {
  return guarded("bpl_axpby", [&] { return elementwise("bpl_axpby", "axpby", runtime, args, BPL_KERNEL_AXPBY); });
}

bpl_status bpl_cast(bpl_runtime* runtime, const bpl_cast_args* args) {
  return guarded("bpl_cast", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    REQUIRE(args != nullptr, "args is NULL");
    const bpl_cast_args defaults = BPL_CAST_ARGS_INIT;
    const bpl_cast_args c = read_input(args, defaults, "args");
    auto fn = require_kernel(rt, &bpl_plugin_api::cast, BPL_KERNEL_CAST, "cast");
    check_device(rt, c.device);
    const size_t from = check_known_dtype(c.from, "args->from");
    const size_t to = check_known_dtype(c.to, "args->to");
    if (!is_floating(c.from) || !is_floating(c.to)) {
      throw Error(BPL_ERR_UNSUPPORTED, std::string("cast from ") + bpl_dtype_name(c.from) + " to " +
                                           bpl_dtype_name(c.to) + " is not provided (floating dtypes only)");
    }
    const size_t src_bytes = check_count(c.count, from, 1, "args->count");
    const size_t dst_bytes = check_count(c.count, to, 1, "args->count");
    check_buffer(c.src, src_bytes, "args->src");
    check_buffer(c.dst, dst_bytes, "args->dst");
    REQUIRE(!overlap(c.src, src_bytes, c.dst, dst_bytes), "args->src and args->dst overlap");
    return forward("bpl_cast", rt, fn(rt->impl, &c));
  });
}

/* ---- programs ---- */

bpl_status bpl_program_compile(bpl_runtime* runtime, const void* source, size_t source_size,
                               const bpl_program_options* options, bpl_program** out) {
  return guarded("bpl_program_compile", [&] {
    bpl_runtime* rt = check_runtime(runtime);
    REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    REQUIRE(source != nullptr && source_size > 0, "source is empty (source_size = " + std::to_string(source_size) + ")");
    const bpl_program_options defaults = BPL_PROGRAM_OPTIONS_INIT;
    const bpl_program_options opts = read_input(options, defaults, "options");
    const Plugin& plugin = *rt->plugin;
    auto compiler_of = plugin.optional(&bpl_plugin_api::program_compiler);
    auto compile = plugin.optional(&bpl_plugin_api::program_compile);
    auto artifact_free = plugin.optional(&bpl_plugin_api::artifact_free);
    auto load = plugin.optional(&bpl_plugin_api::program_load);
    const std::string formats = rt->caps.program_formats != nullptr ? rt->caps.program_formats : "";
    if (!compiler_of || !compile || !artifact_free || !load || !plugin.optional(&bpl_plugin_api::program_run) ||
        !plugin.optional(&bpl_plugin_api::program_destroy) || formats.empty()) {
      throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + rt->backend() + "' does not provide programs");
    }
    REQUIRE(opts.format != nullptr && lists(formats, opts.format),
            "options->format = " + quoted(opts.format) + ": backend '" + rt->backend() + "' accepts: " + formats);
    check_device(rt, opts.device);

    const char* compiler = nullptr;
    bpl_status status = compiler_of(rt->impl, opts.format, &compiler);
    if (status != BPL_OK) return forward("bpl_program_compile", rt, status);
    CacheConfig config = cache_config(rt->backend(), process_environment(), opts.flags != nullptr ? opts.flags : "");
    CompileCache cache(config, std::chrono::milliseconds(rt->launch.timeout_ms));
    std::vector<char> artifact = cache.get_or_compile(
        {compiler, config.compiler_flags, source, source_size}, [&]() -> std::vector<char> {
          void* bytes = nullptr;
          size_t size = 0;
          clear_last_error();
          bpl_status compiled = compile(rt->impl, opts.format, source, source_size, config.flags_for_compiler().c_str(),
                                        &bytes, &size);
          if (compiled != BPL_OK) throw Error(compiled, last_error().empty() ? "compilation failed" : last_error());
          std::vector<char> copy(static_cast<char*>(bytes), static_cast<char*>(bytes) + size);
          artifact_free(bytes);
          return copy;
        });

    bpl_plugin_program* impl = nullptr;
    clear_last_error();
    status = load(rt->impl, opts.format, artifact.data(), artifact.size(), &opts, &impl);
    if (status != BPL_OK) return forward("bpl_program_compile", rt, status);
    auto program = std::make_unique<bpl_program>();
    program->runtime = rt;
    program->impl = impl;
    {
      std::lock_guard<std::mutex> lock(rt->mutex);
      rt->programs.insert(program.get());
    }
    *out = program.release();
    return BPL_OK;
  });
}

bpl_status bpl_program_run(bpl_program* program, const bpl_tensor* inputs, int32_t num_inputs, bpl_tensor* outputs,
                           int32_t num_outputs) {
  return guarded("bpl_program_run", [&] {
    bpl_program* p = check_program(program);
    check_tensors(inputs, num_inputs, "inputs");
    check_tensors(outputs, num_outputs, "outputs");
    bpl_runtime* rt = p->runtime;
    return forward("bpl_program_run", rt,
                   rt->plugin->optional(&bpl_plugin_api::program_run)(p->impl, inputs, num_inputs, outputs, num_outputs));
  });
}

bpl_status bpl_program_destroy(bpl_program* program) {
  return guarded("bpl_program_destroy", [&] {
    if (program == nullptr) return BPL_OK;
    bpl_program* p = check_program(program);
    bpl_runtime* rt = p->runtime;
    {
      std::lock_guard<std::mutex> lock(rt->mutex);
      rt->programs.erase(p);
    }
    bpl_status status = rt->plugin->optional(&bpl_plugin_api::program_destroy)(p->impl);
    p->magic = 0;
    delete p;
    return forward("bpl_program_destroy", rt, status);
  });
}

/* ---- requests ---- */

bpl_status bpl_request_test(bpl_request* req, int32_t* done) {
  return guarded("bpl_request_test", [&] {
    bpl_request* r = check_request(req);
    REQUIRE(done != nullptr, "done is NULL");
    return finish_request("bpl_request_test", r, r->comm->runtime->api().request_test(r->impl, done));
  });
}

bpl_status bpl_request_wait(bpl_request* req, int64_t timeout_ms) {
  return guarded("bpl_request_wait", [&] {
    bpl_request* r = check_request(req);
    REQUIRE(timeout_ms >= BPL_TIMEOUT_DEFAULT,
            "timeout_ms = " + std::to_string(timeout_ms) + ": expected >= 0, or BPL_TIMEOUT_DEFAULT (-1)");
    bpl_comm* comm = r->comm;
    const bpl_plugin_api& api = comm->runtime->api();
    const int64_t comm_timeout_ms = comm->state.timeout_ms();
    timeout_ms = timeout_ms == BPL_TIMEOUT_DEFAULT ? comm_timeout_ms : std::min(timeout_ms, kLongestTimeoutMs);
    // A wait as long as the communicator's timeout that still sees the operation in flight has seen it
    // overrun its bound; a shorter wait is only a poll with a deadline.
    const bool overran_if_timed_out = timeout_ms >= comm_timeout_ms;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    // The plugin is waited for in short slices so that bpl_comm_abort, from another thread, releases
    // this wait within one slice whatever the backend.
    constexpr int64_t kAbortCheckMs = 100;
    for (;;) {
      const int64_t left_ms = std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
      clear_last_error();
      bpl_status status = BPL_ERR_TIMEOUT;
      if (left_ms > 0) status = api.request_wait(r->impl, std::min(left_ms, kAbortCheckMs));
      if (status != BPL_ERR_TIMEOUT) return finish_request("bpl_request_wait", r, status);
      int32_t done = 0;
      clear_last_error();
      status = api.request_test(r->impl, &done);
      if (done || status != BPL_OK) return finish_request("bpl_request_wait", r, status);  // ended with TIMEOUT
      const std::string label = "bpl_request_wait: " + operation_label(r->function, comm, r->sequence);
      if (comm->state.aborted()) {
        set_last_error(label + ": released by bpl_comm_abort; the operation may still be in flight "
                               "(bpl_request_free waits for it, bounded by the communicator's timeout)");
        return BPL_ERR_ABORTED;
      }
      if (left_ms == 0) {
        std::string message = label + ": has not ended after " + std::to_string(timeout_ms) + " ms";
        if (overran_if_timed_out) {
          message += ", the communicator's timeout: the communicator is failed";
          comm->state.fail(BPL_ERR_TIMEOUT, message);
        } else {
          message += "; it is still in flight and may be waited for again";
        }
        set_last_error(std::move(message));
        return BPL_ERR_TIMEOUT;
      }
    }
  });
}

bpl_status bpl_request_free(bpl_request* req) {
  return guarded("bpl_request_free", [&] {
    if (req == nullptr) return BPL_OK;
    bpl_request* r = check_request(req);
    clear_last_error();
    bpl_status status = r->comm->runtime->api().request_free(r->impl);
    status = finish_request("bpl_request_free", r, status);
    r->magic = 0;
    r->comm->live_requests.fetch_sub(1, std::memory_order_relaxed);
    delete r;
    return status;
  });
}

/* ---- communicator timeouts and abort (ABI 1.1) ---- */

bpl_status bpl_comm_set_timeout(bpl_comm* comm, int64_t timeout_ms) {
  return guarded("bpl_comm_set_timeout", [&] {
    bpl_comm* c = check_comm(comm);
    REQUIRE(timeout_ms > 0 || timeout_ms == BPL_TIMEOUT_DEFAULT,
            "timeout_ms = " + std::to_string(timeout_ms) + ": expected > 0 (milliseconds) or BPL_TIMEOUT_DEFAULT (-1)");
    bpl_runtime* rt = c->runtime;
    timeout_ms = timeout_ms == BPL_TIMEOUT_DEFAULT ? rt->launch.timeout_ms : std::min(timeout_ms, kLongestTimeoutMs);
    auto fn = rt->plugin->optional(&bpl_plugin_api::comm_set_timeout);
    if (fn == nullptr) {
      throw Error(BPL_ERR_UNSUPPORTED, std::string("backend '") + rt->backend() + "' (plugin ABI " +
                                           std::to_string(rt->api().abi_major) + "." + std::to_string(rt->api().abi_minor) +
                                           ") cannot change a communicator's timeout");
    }
    clear_last_error();
    const bpl_status status = fn(c->impl, timeout_ms);
    if (status == BPL_OK) c->state.set_timeout_ms(timeout_ms);
    return forward("bpl_comm_set_timeout", rt, status);
  });
}

bpl_status bpl_comm_get_timeout(const bpl_comm* comm, int64_t* timeout_ms) {
  return guarded("bpl_comm_get_timeout", [&] {
    const bpl_comm* c = check_comm(comm);
    REQUIRE(timeout_ms != nullptr, "timeout_ms is NULL");
    *timeout_ms = c->state.timeout_ms();
    return BPL_OK;
  });
}

bpl_status bpl_comm_abort(bpl_comm* comm) {
  return guarded("bpl_comm_abort", [&] {
    bpl_comm* c = check_comm(comm);
    if (!c->state.abort()) return BPL_OK;
    bpl_runtime* rt = c->runtime;
    log(BPL_LOG_INFO, "core", "communicator " + c->label + " aborted");
    auto fn = rt->plugin->optional(&bpl_plugin_api::comm_abort);
    if (fn == nullptr) return BPL_OK;  // the core alone refuses new operations and releases waits
    clear_last_error();
    return forward("bpl_comm_abort", rt, fn(c->impl));
  });
}

}  // extern "C"
