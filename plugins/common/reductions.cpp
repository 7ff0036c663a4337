// The loops of dtypes.h. This translation unit alone is built with -O3 in every optimised build
// (plugins/common/CMakeLists.txt): at the default build type's -O2, GCC vectorises none of them (its
// cheap cost model refuses a loop of unknown length), and the MPI plugin's allreduce, folding element
// by element, fell behind Open MPI's own from 16 KiB (bench/results/xeon/README.md#2026-11-26-mpi-folds).
#include "dtypes.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace backplane::plugin {

namespace {

// Integer sums and products wrap: compute in the unsigned type, where overflow is defined.
template <typename T, bool = std::is_integral_v<T>>
struct WrappingType { using type = T; };
template <typename T>
struct WrappingType<T, true> { using type = std::make_unsigned_t<T>; };
template <typename T>
using Wrapping = typename WrappingType<T>::type;

template <typename T, typename Op>
void apply(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op::template call<T>(x[i], y[i]);
}

#if defined(__SSE2__)
// As apply, with streaming stores for the whole 64-byte lines of `out` (the partial lines at its ends
// through the cache). An `out` not aligned to its element, which only a caller's misaligned buffer
// gives, has no line its elements fill whole: all of it through the cache (a streaming store to an
// address not 16-byte aligned would fault).
template <typename T, typename Op>
void apply_streamed(void* out, const void* a, const void* b, size_t n) {
  constexpr size_t kLineBytes = 64;
  constexpr size_t kPerLine = kLineBytes / sizeof(T);
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  const size_t misalignment = reinterpret_cast<std::uintptr_t>(o) % kLineBytes;
  if (misalignment % sizeof(T) != 0) return apply<T, Op>(out, a, b, n);
  const size_t head = std::min(n, (kLineBytes - misalignment) % kLineBytes / sizeof(T));
  apply<T, Op>(o, x, y, head);
  size_t i = head;
  for (; i + kPerLine <= n; i += kPerLine) {
    alignas(kLineBytes) T line[kPerLine];  // computed in registers, streamed out whole
    for (size_t k = 0; k < kPerLine; ++k) line[k] = Op::template call<T>(x[i + k], y[i + k]);
    for (size_t k = 0; k < kLineBytes / 16; ++k) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(o + i) + k, _mm_load_si128(reinterpret_cast<const __m128i*>(line) + k));
    }
  }
  apply<T, Op>(o + i, x + i, y + i, n - i);
  _mm_sfence();  // streamed stores are weakly ordered: all of them land before the caller publishes
}
#endif

struct Sum {
  template <typename T> static T call(T x, T y) {
    using W = Wrapping<T>;
    return static_cast<T>(static_cast<W>(x) + static_cast<W>(y));
  }
};
struct Prod {
  template <typename T> static T call(T x, T y) {
    using W = Wrapping<T>;
    return static_cast<T>(static_cast<W>(x) * static_cast<W>(y));
  }
};
struct Min {
  template <typename T> static T call(T x, T y) { return y < x ? y : x; }
};
struct Max {
  template <typename T> static T call(T x, T y) { return x < y ? y : x; }
};
struct BitAnd {
  template <typename T> static T call(T x, T y) { return static_cast<T>(x & y); }
};
struct BitOr {
  template <typename T> static T call(T x, T y) { return static_cast<T>(x | y); }
};
struct BitXor {
  template <typename T> static T call(T x, T y) { return static_cast<T>(x ^ y); }
};

template <typename T, typename Op>
ReduceFn with_stores(Stores stores) {
#if defined(__SSE2__)
  if (stores == Stores::kStreamed) return &apply_streamed<T, Op>;
#endif
  (void)stores;
  return &apply<T, Op>;
}

template <typename T>
ReduceFn for_op(bpl_reduce_op op, Stores stores) {
  switch (op) {
    case BPL_OP_SUM:
    case BPL_OP_AVG:  // the division happens once, after the sum
      return with_stores<T, Sum>(stores);
    case BPL_OP_PROD: return with_stores<T, Prod>(stores);
    case BPL_OP_MIN: return with_stores<T, Min>(stores);
    case BPL_OP_MAX: return with_stores<T, Max>(stores);
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case BPL_OP_BAND: return with_stores<T, BitAnd>(stores);
      case BPL_OP_BOR: return with_stores<T, BitOr>(stores);
      case BPL_OP_BXOR: return with_stores<T, BitXor>(stores);
      default: break;
    }
  }
  return nullptr;
}

// The 16-bit types to and from f32 in loops the compiler vectorises (half.h: branch-free, and several
// times faster than c10's element by element, with the same results).
template <typename H>
void widen_half(const H* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

template <typename H>
void narrow_to_half(const float* src, H* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<H, Half>) {
      dst[i] = to_half(src[i]);
    } else {
      dst[i] = to_bfloat16(src[i]);
    }
  }
}

// One element of any dtype as another; the 16-bit types by way of f32.
template <typename To, typename From>
To convert_one(From value) {
  if constexpr (is_half_type<From>) {
    return convert_one<To>(to_float(value));
  } else if constexpr (std::is_same_v<To, Half>) {
    return to_half(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return to_bfloat16(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

}  // namespace

ReduceFn reduce_function(bpl_dtype accumulation, bpl_reduce_op op, Stores stores) {
  return visit_dtype(accumulation, [op, stores](auto zero) -> ReduceFn {
    using T = decltype(zero);
    if constexpr (is_half_type<T>) {
      return nullptr;
    } else {
      return for_op<T>(op, stores);
    }
  });
}

void convert(const void* src, bpl_dtype from, void* dst, bpl_dtype to, size_t n) {
  if (to == BPL_DTYPE_F32 && from == BPL_DTYPE_BF16) {
    return widen_half(static_cast<const BFloat16*>(src), static_cast<float*>(dst), n);
  }
  if (to == BPL_DTYPE_F32 && from == BPL_DTYPE_F16) {
    return widen_half(static_cast<const Half*>(src), static_cast<float*>(dst), n);
  }
  if (from == BPL_DTYPE_F32 && to == BPL_DTYPE_BF16) {
    return narrow_to_half(static_cast<const float*>(src), static_cast<BFloat16*>(dst), n);
  }
  if (from == BPL_DTYPE_F32 && to == BPL_DTYPE_F16) {
    return narrow_to_half(static_cast<const float*>(src), static_cast<Half*>(dst), n);
  }
  visit_dtype(from, [&](auto from_zero) {
    using From = decltype(from_zero);
    visit_dtype(to, [&](auto to_zero) {
      using To = decltype(to_zero);
      const From* s = static_cast<const From*>(src);
      To* d = static_cast<To*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = convert_one<To>(s[i]);
    });
  });
}

void divide(void* buf, bpl_dtype dtype, size_t n, int64_t divisor) {
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* b = static_cast<T*>(buf);
    if constexpr (std::is_floating_point_v<T>) {
      for (size_t i = 0; i < n; ++i) b[i] = b[i] / static_cast<T>(divisor);
    } else if constexpr (std::is_integral_v<T>) {
      for (size_t i = 0; i < n; ++i) b[i] = static_cast<T>(b[i] / static_cast<T>(divisor));
    }
  });
}

void finish_reduction(void* work, bpl_dtype accumulation, void* out, bpl_dtype dtype, size_t n, bpl_reduce_op op,
                      int group_size) {
  if (n == 0) return;  // buffers of empty operations may be NULL
  if (op == BPL_OP_AVG) divide(work, accumulation, n, group_size);
  if (accumulation != dtype) {
    convert(work, accumulation, out, dtype, n);
  } else if (work != out) {
    std::memcpy(out, work, n * dtype_size(dtype));
  }
}

}  // namespace backplane::plugin
