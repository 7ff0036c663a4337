// The core's checks of a caller's arguments, once for every backend (plugins trust what reaches them,
// plugin.h): each failure is INVALID_ARGUMENT (or UNSUPPORTED) naming the value and what was expected.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "backplane/plugin.h"
#include "error.h"
#include "loader.h"

namespace backplane {

// Larger values are garbage, not a future version of a struct.
constexpr size_t kMaxStructSize = 1 << 20;

inline std::string quoted(const char* text) { return text == nullptr ? "NULL" : "'" + std::string(text) + "'"; }

// Throws INVALID_ARGUMENT with `message`, which is only built when the check fails: these checks run
// on every collective, and formatting numbers into strings would otherwise dominate a small call.
#define REQUIRE(condition, message)                                        \
  do {                                                                     \
    if (!(condition)) throw ::backplane::Error(BPL_ERR_INVALID_ARGUMENT, message); \
  } while (0)

inline void check_struct_size(size_t struct_size, const char* param) {
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

// A caller's store (ABI 1.2), copied so that the caller's struct need not outlive the call; its
// context and callbacks must. Every callback but last_error is required.
inline std::unique_ptr<bpl_store> read_store(const bpl_store* store, const char* param) {
  const bpl_store defaults = BPL_STORE_INIT;
  auto copy = std::make_unique<bpl_store>(read_input(store, defaults, param));
  const std::string name(param);
  REQUIRE(copy->set != nullptr, name + "->set is NULL: a store needs set, get, add and check");
  REQUIRE(copy->get != nullptr, name + "->get is NULL: a store needs set, get, add and check");
  REQUIRE(copy->add != nullptr, name + "->add is NULL: a store needs set, get, add and check");
  REQUIRE(copy->check != nullptr, name + "->check is NULL: a store needs set, get, add and check");
  return copy;
}

inline void copy_text(char* dst, size_t capacity, const std::string& text) {
  size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
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

inline uint64_t address_space_of(const void* buffer) {
  return reinterpret_cast<uintptr_t>(buffer) < kAddressSpaceBytes ? kAddressSpaceBytes : uint64_t{1} << 56;
}

// Bytes of `count` elements times `blocks`, rejecting negative counts and sizes no process can address
// (a buffer that large cannot exist: the backend would read or write memory it does not own).
inline size_t check_count(int64_t count, size_t element_size, int64_t blocks, const char* param) {
  REQUIRE(count >= 0, std::string(param) + " = " + std::to_string(count) + ": expected >= 0");
  const auto limit = static_cast<int64_t>(kAddressSpaceBytes / element_size / static_cast<uint64_t>(blocks));
  REQUIRE(count <= limit, std::string(param) + " = " + std::to_string(count) + ": " +
                              (blocks == 1 ? "" : std::to_string(blocks) + " blocks of ") + "that many elements of " +
                              std::to_string(element_size) + (element_size == 1 ? " byte" : " bytes") + " exceed the address space (expected " + param +
                              " <= " + std::to_string(limit) + ")");
  return static_cast<size_t>(count) * element_size * static_cast<size_t>(blocks);
}

inline void check_buffer(const void* buffer, size_t bytes, const char* param) {
  REQUIRE(buffer != nullptr || bytes == 0, std::string(param) + " is NULL but holds " + std::to_string(bytes) + " bytes");
  REQUIRE(bytes <= address_space_of(buffer) - std::min<uint64_t>(reinterpret_cast<uintptr_t>(buffer), address_space_of(buffer)),
          std::string(param) + " + " + std::to_string(bytes) + " bytes runs past the end of the address space");
}

inline bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  auto x = reinterpret_cast<uintptr_t>(a);
  auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

// A variable layout of `buffer` (allgatherv, alltoallv): `ranks` counts and displacements, in elements,
// each >= 0 and inside the address space; blocks of two ranks that overlap are refused, naming both.
// Returns the layout's extent in bytes (the end of its last block), which `buffer` must hold.
inline size_t check_layout(const int64_t* counts, const int64_t* displs, int32_t ranks, size_t element,
                           const void* buffer, const char* counts_name, const char* displs_name, const char* buffer_name) {
  REQUIRE(counts != nullptr, std::string(counts_name) + " is NULL: expected " + std::to_string(ranks) + " counts, one per rank");
  REQUIRE(displs != nullptr,
          std::string(displs_name) + " is NULL: expected " + std::to_string(ranks) + " displacements, one per rank");
  // Messages are built only for a value that fails: this runs on every call of a v-form.
  auto at = [](const char* name, int32_t r) { return std::string(name) + "[" + std::to_string(r) + "]"; };
  const auto limit = static_cast<int64_t>(kAddressSpaceBytes / element);
  size_t extent = 0;
  bool in_order = true;  // the blocks lie in rank order (the usual layout): no sort needed to find overlaps
  int32_t last = -1;     // the previous rank with a block
  for (int32_t r = 0; r < ranks; ++r) {
    if (counts[r] < 0 || counts[r] > limit) check_count(counts[r], element, 1, at(counts_name, r).c_str());
    REQUIRE(displs[r] >= 0, at(displs_name, r) + " = " + std::to_string(displs[r]) + ": expected >= 0");
    REQUIRE(displs[r] <= limit - counts[r], at(displs_name, r) + " = " + std::to_string(displs[r]) + " with " +
                                                at(counts_name, r) + " = " + std::to_string(counts[r]) +
                                                " runs past the address space");
    if (counts[r] == 0) continue;
    extent = std::max(extent, static_cast<size_t>(displs[r] + counts[r]) * element);
    if (last >= 0 && displs[r] < displs[last]) in_order = false;
    last = r;
  }
  auto check_apart = [&](int32_t a, int32_t b) {  // a's block lies before b's
    REQUIRE(displs[a] + counts[a] <= displs[b],
            std::string("the blocks of ranks ") + std::to_string(a) + " and " + std::to_string(b) + " overlap in " +
                buffer_name + " (" + at(displs_name, a) + " = " + std::to_string(displs[a]) + ", " +
                at(counts_name, a) + " = " + std::to_string(counts[a]) + ", " + at(displs_name, b) + " = " +
                std::to_string(displs[b]) + ")");
  };
  if (in_order) {
    for (int32_t r = 0, previous = -1; r < ranks; ++r) {
      if (counts[r] == 0) continue;
      if (previous >= 0) check_apart(previous, r);
      previous = r;
    }
  } else {
    std::vector<int32_t> placed;  // ranks with a block, ordered by displacement
    for (int32_t r = 0; r < ranks; ++r) {
      if (counts[r] != 0) placed.push_back(r);
    }
    std::sort(placed.begin(), placed.end(), [&](int32_t a, int32_t b) { return displs[a] < displs[b]; });
    for (size_t i = 1; i < placed.size(); ++i) check_apart(placed[i - 1], placed[i]);
  }
  check_buffer(buffer, extent, buffer_name);
  return extent;
}

inline size_t check_known_dtype(bpl_dtype dtype, const char* field) {
  const size_t size = bpl_dtype_size(dtype);
  REQUIRE(size != 0, std::string(field) + " = " + std::to_string(dtype) +
                         " is not a bpl_dtype (expected BPL_DTYPE_F32 .. BPL_DTYPE_I64)");
  return size;
}

inline bool is_floating(bpl_dtype dtype) { return dtype >= BPL_DTYPE_F32 && dtype <= BPL_DTYPE_BF16; }

// A rows×cols row-major matrix with leading dimension `ld`: checks the sizes and returns its bytes.
inline size_t check_matrix(const void* data, int64_t rows, int64_t cols, int64_t ld, size_t element, const char* name,
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

inline bool lists(const std::string& formats, const std::string& format) {
  std::istringstream words(formats);
  for (std::string word; words >> word;) {
    if (word == format) return true;
  }
  return false;
}

inline void check_tensors(const bpl_tensor* tensors, int32_t count, const char* name) {
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

}  // namespace backplane
