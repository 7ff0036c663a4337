// Test data for every dtype: element access through double, deterministic inputs whose reductions
// are exact, and comparison with tolerances that fit each dtype.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backplane/backplane.h"

namespace backplane::test {

constexpr bpl_dtype kAllDtypes[] = {BPL_DTYPE_F32, BPL_DTYPE_F64, BPL_DTYPE_F16, BPL_DTYPE_BF16,
                                    BPL_DTYPE_I8,  BPL_DTYPE_U8,  BPL_DTYPE_I32, BPL_DTYPE_I64};
constexpr bpl_reduce_op kAllOps[] = {BPL_OP_SUM, BPL_OP_PROD, BPL_OP_MIN,  BPL_OP_MAX,
                                     BPL_OP_AVG, BPL_OP_BAND, BPL_OP_BOR, BPL_OP_BXOR};

inline bool is_integer(bpl_dtype d) { return d >= BPL_DTYPE_I8; }
inline bool is_bitwise(bpl_reduce_op op) { return op == BPL_OP_BAND || op == BPL_OP_BOR || op == BPL_OP_BXOR; }
// The reductions backplane.h defines for `dtype` (the bitwise ones for integers only).
inline bool defined_for(bpl_reduce_op op, bpl_dtype dtype) { return !is_bitwise(op) || is_integer(dtype); }

inline void store(bpl_dtype dtype, void* buffer, size_t i, double v) {
  switch (dtype) {
    case BPL_DTYPE_F32: static_cast<float*>(buffer)[i] = static_cast<float>(v); break;
    case BPL_DTYPE_F64: static_cast<double*>(buffer)[i] = v; break;
    case BPL_DTYPE_F16: static_cast<c10::Half*>(buffer)[i] = c10::Half(static_cast<float>(v)); break;
    case BPL_DTYPE_BF16: static_cast<c10::BFloat16*>(buffer)[i] = c10::BFloat16(static_cast<float>(v)); break;
    case BPL_DTYPE_I8: static_cast<int8_t*>(buffer)[i] = static_cast<int8_t>(v); break;
    case BPL_DTYPE_U8: static_cast<uint8_t*>(buffer)[i] = static_cast<uint8_t>(v); break;
    case BPL_DTYPE_I32: static_cast<int32_t*>(buffer)[i] = static_cast<int32_t>(v); break;
    case BPL_DTYPE_I64: static_cast<int64_t*>(buffer)[i] = static_cast<int64_t>(v); break;
  }
}

inline double load(bpl_dtype dtype, const void* buffer, size_t i) {
  switch (dtype) {
    case BPL_DTYPE_F32: return static_cast<const float*>(buffer)[i];
    case BPL_DTYPE_F64: return static_cast<const double*>(buffer)[i];
    case BPL_DTYPE_F16: return static_cast<float>(static_cast<const c10::Half*>(buffer)[i]);
    case BPL_DTYPE_BF16: return static_cast<float>(static_cast<const c10::BFloat16*>(buffer)[i]);
    case BPL_DTYPE_I8: return static_cast<const int8_t*>(buffer)[i];
    case BPL_DTYPE_U8: return static_cast<const uint8_t*>(buffer)[i];
    case BPL_DTYPE_I32: return static_cast<const int32_t*>(buffer)[i];
    case BPL_DTYPE_I64: return static_cast<double>(static_cast<const int64_t*>(buffer)[i]);
  }
  return NAN;
}

// Element i of rank r's input: small integers, so that sums and products over a few ranks are exact
// in every dtype (products use {-2..2}, or {0,1,2} unsigned, to stay small).
inline double input_value(bpl_dtype dtype, bpl_reduce_op op, int rank, size_t i) {
  const long mix = static_cast<long>(rank) * 7 + static_cast<long>(i % 1009) * 3;
  if (op == BPL_OP_PROD) return dtype == BPL_DTYPE_U8 ? mix % 3 : mix % 5 - 2;
  return dtype == BPL_DTYPE_U8 ? mix % 9 : mix % 9 - 4;
}

// The reduction of element i over `ranks` ranks, as backplane.h defines it, rounded to the dtype.
inline double reduced_value(bpl_dtype dtype, bpl_reduce_op op, int ranks, size_t i) {
  double acc = input_value(dtype, op, 0, i);
  for (int r = 1; r < ranks; ++r) {
    double v = input_value(dtype, op, r, i);
    switch (op) {
      case BPL_OP_SUM: case BPL_OP_AVG: acc += v; break;
      case BPL_OP_PROD: acc *= v; break;
      case BPL_OP_MIN: acc = std::min(acc, v); break;
      case BPL_OP_MAX: acc = std::max(acc, v); break;
      // Small integers (input_value), exact in a double; two's complement bits, as the dtype's.
      case BPL_OP_BAND: acc = static_cast<double>(static_cast<int64_t>(acc) & static_cast<int64_t>(v)); break;
      case BPL_OP_BOR: acc = static_cast<double>(static_cast<int64_t>(acc) | static_cast<int64_t>(v)); break;
      case BPL_OP_BXOR: acc = static_cast<double>(static_cast<int64_t>(acc) ^ static_cast<int64_t>(v)); break;
    }
  }
  if (op == BPL_OP_AVG) acc = is_integer(dtype) ? std::trunc(acc / ranks) : acc / ranks;
  return acc;
}

inline double tolerance(bpl_dtype dtype, double expected) {
  const double scale = std::max(1.0, std::fabs(expected));
  switch (dtype) {
    case BPL_DTYPE_F32: return 1e-6 * scale;
    case BPL_DTYPE_F64: return 1e-12 * scale;
    case BPL_DTYPE_F16: return 1e-3 * scale;
    case BPL_DTYPE_BF16: return 8e-3 * scale;
    default: return 0;
  }
}

// A buffer of `count` elements of `dtype`, filled with a canary byte pattern.
struct Buffer {
  Buffer(bpl_dtype dtype, size_t count) : dtype(dtype), count(count), bytes(count * bpl_dtype_size(dtype) + 1, 0x5a) {}
  void* data() { return bytes.data(); }
  void set(size_t i, double v) { store(dtype, bytes.data(), i, v); }
  double get(size_t i) const { return load(dtype, bytes.data(), i); }
  // The byte past the last element still holds the canary: nothing wrote beyond the buffer.
  bool canary_intact() const { return bytes.back() == 0x5a; }
  bpl_dtype dtype;
  size_t count;
  std::vector<unsigned char> bytes;
};

// Compares buffer elements [first, first+n) with expected(i - first); reports the first mismatches.
template <typename Expected>
::testing::AssertionResult elements_match(const Buffer& buffer, size_t first, size_t n, Expected&& expected) {
  size_t mismatches = 0;
  std::string report;
  for (size_t i = 0; i < n; ++i) {
    double want = expected(i);
    double got = buffer.get(first + i);
    if (std::fabs(got - want) > tolerance(buffer.dtype, want) || std::isnan(got)) {
      if (++mismatches <= 3) {
        report += " [" + std::to_string(i) + "] got " + std::to_string(got) + " expected " + std::to_string(want) + ";";
      }
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << n << " " << bpl_dtype_name(buffer.dtype)
                                       << " elements differ:" << report;
}

}  // namespace backplane::test
