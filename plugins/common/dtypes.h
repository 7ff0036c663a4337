// Element-type arithmetic shared by the CPU plugins: the reduction functions of every dtype × op, the
// accumulation type that keeps f16/bf16 (and integer averages) exact, and conversions between them.
// The loops live in one translation unit (reductions.cpp), built so that the compiler vectorises them
// whatever the build type: one copy of each, shared by every plugin that links bpl_reductions.
//
// Rule (backplane.h): f16/bf16 accumulate in f32 and round once at the end; integer AVG is the exact
// sum divided by the group size, so i8/u8/i32 accumulate in i64 for it; integer SUM/PROD wrap.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backplane/backplane.h"
#include "half.h"
#include "plugin_support.h"

namespace backplane::plugin {

// Out[i] = a[i] op b[i] for n elements; out may alias a or b.
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// How a reduction writes its output. kStreamed, for an output larger than the last-level cache that is
// not read again soon: whole lines with non-temporal stores, which do not read each line first (a third
// less memory traffic) nor evict the data that is read again; the stores are complete (fenced) when the
// function returns (what it saves: bench/results/xeon/README.md#2026-11-26-raw-speed-4). Without SSE2, as kCached.
enum class Stores { kCached, kStreamed };

// The dtype a reduction of `dtype` with `op` is carried out in.
inline bpl_dtype accumulation_dtype(bpl_dtype dtype, bpl_reduce_op op) {
  switch (dtype) {
    case BPL_DTYPE_F16:
    case BPL_DTYPE_BF16:
      return BPL_DTYPE_F32;
    case BPL_DTYPE_I8:
    case BPL_DTYPE_U8:
    case BPL_DTYPE_I32:
      return op == BPL_OP_AVG ? BPL_DTYPE_I64 : dtype;
    default:
      return dtype;
  }
}

// Calls fn(T{}) with T the C++ type of `dtype`.
template <typename Fn>
decltype(auto) visit_dtype(bpl_dtype dtype, Fn&& fn) {
  switch (dtype) {
    case BPL_DTYPE_F32: return fn(float{});
    case BPL_DTYPE_F64: return fn(double{});
    case BPL_DTYPE_F16: return fn(Half{});
    case BPL_DTYPE_BF16: return fn(BFloat16{});
    case BPL_DTYPE_I8: return fn(int8_t{});
    case BPL_DTYPE_U8: return fn(uint8_t{});
    case BPL_DTYPE_I32: return fn(int32_t{});
    default: return fn(int64_t{});
  }
}

// The reduction for an accumulation dtype (never f16/bf16: those accumulate in f32; nullptr for them).
ReduceFn reduce_function(bpl_dtype accumulation, bpl_reduce_op op, Stores stores = Stores::kCached);

// dst[i] = (To) src[i], rounding to nearest even where the target is narrower.
void convert(const void* src, bpl_dtype from, void* dst, bpl_dtype to, size_t n);

// buf[i] /= divisor (integer types: truncation toward zero).
void divide(void* buf, bpl_dtype dtype, size_t n, int64_t divisor);

// The last step of a reduction carried out in `accumulation` over `group_size` ranks: divide for AVG,
// then narrow into the caller's `out` of `dtype` (nothing to copy when `work` already is `out`).
void finish_reduction(void* work, bpl_dtype accumulation, void* out, bpl_dtype dtype, size_t n, bpl_reduce_op op,
                      int group_size);

}  // namespace backplane::plugin
