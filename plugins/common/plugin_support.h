// What every plugin needs at its C boundary: an exception carrying a bpl_status, and a guard that
// turns any exception into a status plus a message through the host's set_error (plugin.h contract).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "backplane/plugin.h"

namespace backplane::plugin {

// Counts or displacements of a variable-size collective (allgatherv, alltoallv), one per rank: a
// communicator's own copy, which it keeps while the operation runs. Held inline up to 8 ranks: a small
// call copies four of them, which on the heap cost a measurable part of its time beside MPI's.
using Counts = boost::container::small_vector<size_t, 8>;

// `elements` (counts or displacements) in bytes of elements of `element` bytes (in place when moved in).
inline Counts in_bytes(Counts elements, size_t element) {
  for (size_t& e : elements) e *= element;
  return elements;
}

// The caller's counts or displacements of a variable-size collective, one per rank, in elements (the
// core checked them): valid only during the call. A communicator that finishes the call before it
// returns reads them in place; one that keeps them takes a copy.
class CountsView {
 public:
  CountsView(const int64_t* elements, size_t ranks) : elements_(elements), ranks_(ranks) {}
  size_t size() const { return ranks_; }
  size_t operator[](size_t rank) const { return static_cast<size_t>(elements_[rank]); }
  size_t sum() const {
    size_t total = 0;
    for (size_t r = 0; r < ranks_; ++r) total += (*this)[r];
    return total;
  }
  size_t max() const {
    size_t largest = 0;
    for (size_t r = 0; r < ranks_; ++r) largest = std::max(largest, (*this)[r]);
    return largest;
  }
  // A copy, in units of `unit` bytes per element (1: in elements; an element's size: in bytes).
  Counts copy(size_t unit = 1) const {
    Counts values(ranks_);
    for (size_t r = 0; r < ranks_; ++r) values[r] = (*this)[r] * unit;
    return values;
  }

 private:
  const int64_t* elements_;
  size_t ranks_;
};

class Error : public std::runtime_error {
 public:
  Error(bpl_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  bpl_status status() const { return status_; }

 private:
  bpl_status status_;
};

// `timeout` from `now` (the clock's, unless given), or the latest time the clock can hold when that is further away (a caller's
// INT64_MAX milliseconds must not wrap into the past). Every deadline of a plugin is computed here.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout,
                                                            std::chrono::steady_clock::time_point now) {
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::time_point::max() - now);
  return timeout >= room ? std::chrono::steady_clock::time_point::max() : now + timeout;
}
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return deadline_after(timeout, std::chrono::steady_clock::now());
}

// The caller's own communicator for the world (ABI 1.4), or NULL, also from a core older than 1.4.
inline const void* native_comm_of(const bpl_launch_info& launch) {
  const bool has_field = launch.struct_size >= offsetof(bpl_launch_info, native_comm) + sizeof(launch.native_comm);
  return has_field ? launch.native_comm : nullptr;
}

// What a plugin that makes its world only by joining the job does with a native communicator.
inline void refuse_native_comm(const bpl_launch_info& launch, const char* plugin) {
  if (native_comm_of(launch) == nullptr) return;
  throw Error(BPL_ERR_INVALID_ARGUMENT, std::string("options->native_comm is given, but the ") + plugin +
                                            " backend takes no native communicator (it is the mpi backend's "
                                            "MPI_Comm): leave it NULL and launch the ranks as a job");
}

// Set by the plugin's bpl_plugin_open_v1; valid while the plugin is loaded.
inline const bpl_host_api*& host() {
  static const bpl_host_api* api = nullptr;
  return api;
}

// The operation the core is starting on this thread (bpl_host_api::current_operation), or NULL.
inline const bpl_operation_identity* current_operation() {
  return host() != nullptr && host()->current_operation != nullptr ? host()->current_operation() : nullptr;
}

// A variable of the process's environment as the host reads it (plugin.h): NULL when unset or empty,
// and for file-naming variables in a setuid program. Plugins read no variable any other way.
inline const char* env(const char* variable) { return host() != nullptr ? host()->get_env(variable) : nullptr; }

// A switch of the environment: "1" on, "0" off, unset (or empty) `unset`; anything else is an error
// naming the variable and the value.
inline bool env_switch(const char* variable, bool unset) {
  const char* value = env(variable);
  if (value == nullptr) return unset;
  if (std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(variable) + "='" + value + "' is not valid: expected 0 or 1");
}

// The plugin's backend name ("gloo", "mpi"), set by its bpl_plugin_open_v1; prefixes its messages.
inline const char*& name() {
  static const char* backend = "plugin";
  return backend;
}

// "[1, 2, 3]": numbers (ranks, a shape) in a message.
template <typename Number>
std::string list_text(const std::vector<Number>& numbers) {
  std::string text = "[";
  for (size_t i = 0; i < numbers.size(); ++i) text += (i ? ", " : "") + std::to_string(numbers[i]);
  return text + "]";
}

// Bytes per element (plugins do not link libbackplane, so this mirrors bpl_dtype_size).
inline size_t dtype_size(bpl_dtype dtype) {
  switch (dtype) {
    case BPL_DTYPE_F64: case BPL_DTYPE_I64: return 8;
    case BPL_DTYPE_F32: case BPL_DTYPE_I32: return 4;
    case BPL_DTYPE_F16: case BPL_DTYPE_BF16: return 2;
    default: return 1;
  }
}

inline void log(int32_t level, const char* source, const std::string& message) {
  if (host() != nullptr && level <= host()->log_level) host()->log(level, source, message.c_str());
}

// A long wait says what it still waits for: due() is true once every `interval` of waiting, where info
// lines are on (BPL_LOG_LEVEL=info), and the waiter then logs at info level what it lacks.
class WaitReport {
 public:
  explicit WaitReport(std::chrono::milliseconds interval)
      : interval_(interval), started_(std::chrono::steady_clock::now()), next_(deadline_after(interval, started_)) {}
  bool due() {
    if (host() == nullptr || host()->log_level < BPL_LOG_INFO) return false;
    const auto now = std::chrono::steady_clock::now();
    if (now < next_) return false;
    next_ = deadline_after(interval_, now);
    return true;
  }
  // "12 s", for the message.
  std::string waited() const {
    const auto s = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_);
    return std::to_string(s.count()) + " s";
  }

 private:
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point started_, next_;
};
// How often a rendezvous or a store's first connection says what it waits for.
constexpr std::chrono::milliseconds kWaitReportInterval{5000};

// Maps an exception the plugin's dependencies threw to a status; plugins pass their own classifier.
using ExceptionClassifier = bpl_status (*)(const std::exception& e);

// Runs `body` (returning bpl_status); an exception becomes a status, and "<backend>: <message>" is
// handed to the host as the thread's last error.
template <typename Body>
bpl_status guarded(const char* backend, ExceptionClassifier classify, Body&& body) noexcept {
  std::string message;
  bpl_status status = BPL_ERR_INTERNAL;
  try {
    return body();
  } catch (const Error& e) {
    status = e.status();
    message = e.what();
  } catch (const std::bad_alloc&) {
    status = BPL_ERR_OUT_OF_MEMORY;
    message = "out of memory";
  } catch (const std::exception& e) {
    status = classify(e);
    message = e.what();
  } catch (...) {
    message = "unknown exception";
  }
  if (host() != nullptr) host()->set_error((std::string(backend) + ": " + message).c_str());
  return status;
}

}  // namespace backplane::plugin
