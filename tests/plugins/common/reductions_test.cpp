// The element loops of the CPU plugins (plugins/common/dtypes.h, reductions.cpp), on their own: the
// vectorised folds against an element-by-element reference, the streamed folds against the cached
// ones, and the f16 and bf16 conversions (the plugins' own, half.h) against c10's.
#include <gtest/gtest.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dtypes.h"

namespace {

using backplane::plugin::reduce_function;
using backplane::plugin::ReduceFn;
using backplane::plugin::Stores;

// What every fold must give, one element at a time: integer sums and products wrap; MIN and MAX take
// the first operand unless the second compares below (above) it, NaNs and signed zeros included.
template <typename T>
T reference(bpl_reduce_op op, T x, T y) {
  if (op == BPL_OP_MIN) return y < x ? y : x;
  if (op == BPL_OP_MAX) return x < y ? y : x;
  if constexpr (std::is_integral_v<T>) {
    if (op == BPL_OP_BAND) return static_cast<T>(x & y);
    if (op == BPL_OP_BOR) return static_cast<T>(x | y);
    if (op == BPL_OP_BXOR) return static_cast<T>(x ^ y);
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(op == BPL_OP_SUM ? static_cast<U>(static_cast<U>(x) + static_cast<U>(y))
                                           : static_cast<U>(static_cast<U>(x) * static_cast<U>(y)));
  } else {
    return op == BPL_OP_SUM ? x + y : x * y;
  }
}

// Operands of `n` elements of T: random bits, with the floating-point values that tell a vectorised
// MIN/MAX apart from the scalar one (NaNs, signed zeros, infinities) spread among them.
template <typename T>
std::vector<T> operand(size_t n, unsigned seed) {
  std::mt19937_64 random(seed);
  std::vector<T> values(n);
  for (T& v : values) {
    const uint64_t bits = random();
    std::memcpy(&v, &bits, sizeof(T));
  }
  if constexpr (std::is_floating_point_v<T>) {
    const T special[] = {std::numeric_limits<T>::quiet_NaN(), T(0), -T(0), std::numeric_limits<T>::infinity(),
                         -std::numeric_limits<T>::infinity(), T(1), T(-1)};
    for (size_t i = 0; i < n; i += 3) values[i] = special[(i / 3 + seed) % 7];
  }
  return values;
}

// Bit for bit (NaNs included); an empty vector's data() may be null, which memcmp must not see.
template <typename T>
bool same_bits(const T* x, const T* y, size_t n) {
  return n == 0 || std::memcmp(x, y, n * sizeof(T)) == 0;
}

template <typename T>
void expect_folds_match_the_reference(bpl_dtype dtype) {
  constexpr size_t kMax = 300;  // several vector lengths of every type, and a tail
  const std::vector<T> a = operand<T>(kMax + 8, 1), b = operand<T>(kMax + 8, 2);
  for (bpl_reduce_op op : {BPL_OP_SUM, BPL_OP_PROD, BPL_OP_MIN, BPL_OP_MAX, BPL_OP_BAND, BPL_OP_BOR, BPL_OP_BXOR}) {
    if (!std::is_integral_v<T> && (op == BPL_OP_BAND || op == BPL_OP_BOR || op == BPL_OP_BXOR)) {
      EXPECT_EQ(reduce_function(dtype, op), nullptr) << "a bitwise fold of floating-point dtype " << dtype;
      continue;
    }
    const ReduceFn fold = reduce_function(dtype, op);
    ASSERT_NE(fold, nullptr);
    for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17},
                     size_t{33}, size_t{64}, size_t{65}, size_t{129}, kMax}) {
      for (size_t offset : {size_t{0}, size_t{1}, size_t{3}}) {  // starts off a vector's alignment
        const T* x = a.data() + offset;
        const T* y = b.data() + 2 * offset % 5;
        std::vector<T> expected(n), got(n + 2), left(x, x + n), right(y, y + n);
        for (size_t i = 0; i < n; ++i) expected[i] = reference(op, x[i], y[i]);
        fold(got.data() + 1, x, y, n);
        fold(left.data(), left.data(), y, n);     // in place, the output the first operand
        fold(right.data(), x, right.data(), n);   // in place, the output the second operand
        const std::string what = "dtype " + std::to_string(dtype) + ", op " + std::to_string(op) + ", " +
                                 std::to_string(n) + " elements from offset " + std::to_string(offset);
        ASSERT_TRUE(same_bits(got.data() + 1, expected.data(), n)) << what;
        ASSERT_TRUE(same_bits(left.data(), expected.data(), n)) << what << ", out = a";
        ASSERT_TRUE(same_bits(right.data(), expected.data(), n)) << what << ", out = b";
      }
    }
  }
}

// The folds give, bit for bit, what the element-by-element loop gives, whatever the compiler made of
// them: every accumulation dtype and op, lengths around every vector width, unaligned starts, and in
// place on either operand (the plugins fold into their first operand, and gloo may hand either).
TEST(Reductions, FoldsMatchTheElementByElementResultInPlaceAndNot) {
  expect_folds_match_the_reference<float>(BPL_DTYPE_F32);
  expect_folds_match_the_reference<double>(BPL_DTYPE_F64);
  expect_folds_match_the_reference<int8_t>(BPL_DTYPE_I8);
  expect_folds_match_the_reference<uint8_t>(BPL_DTYPE_U8);
  expect_folds_match_the_reference<int32_t>(BPL_DTYPE_I32);
  expect_folds_match_the_reference<int64_t>(BPL_DTYPE_I64);
}

// f16 and bf16 accumulate in f32: there is no fold of their own.
TEST(Reductions, HalfTypesHaveNoFoldOfTheirOwn) {
  EXPECT_EQ(reduce_function(BPL_DTYPE_F16, BPL_OP_SUM), nullptr);
  EXPECT_EQ(reduce_function(BPL_DTYPE_BF16, BPL_OP_MAX), nullptr);
}

// Every 16-bit value of `dtype` widened to f32, and the f32 values with `bits` (then random ones, up to
// `count`) narrowed to it, give what c10's type C gives, bit for bit.
template <typename C>
void expect_conversions_match_c10(bpl_dtype dtype, std::vector<uint32_t> bits, size_t count) {
  std::vector<uint16_t> every(65536);
  for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<uint16_t>(i);
  std::vector<float> widened(every.size());
  backplane::plugin::convert(every.data(), dtype, widened.data(), BPL_DTYPE_F32, every.size());
  for (size_t i = 0; i < every.size(); ++i) {
    const float expected = static_cast<float>(C(every[i], C::from_bits()));
    ASSERT_EQ(std::memcmp(&widened[i], &expected, 4), 0) << "dtype " << dtype << " 0x" << std::hex << every[i];
  }
  std::mt19937 random(static_cast<unsigned>(dtype));
  while (bits.size() < count) bits.push_back(random());
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * 4);
  std::vector<uint16_t> narrowed(values.size());
  backplane::plugin::convert(values.data(), BPL_DTYPE_F32, narrowed.data(), dtype, values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(narrowed[i], C(values[i]).x) << "dtype " << dtype << ", f32 bits 0x" << std::hex << bits[i];
  }
}

// The plugins' own bf16 <-> f32 loops (half.h), which the widened reductions run, give c10's results
// bit for bit: every bf16 value, and f32 values of every kind (ties, NaNs, infinities, subnormals).
TEST(Reductions, Bf16ConversionMatchesC10BitForBit) {
  expect_conversions_match_c10<c10::BFloat16>(
      BPL_DTYPE_BF16, {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x3F808000,
                       0x3F818000, 0x3F80FFFF, 0x00000001, 0x007FFFFF, 0x7F7FFFFF, 0x7F7F8000},
      200000);
}

// The plugins' own f16 <-> f32 conversions (half.h: no c10 in the plugins) give c10's results bit for
// bit: every f16 value widened (subnormals, infinities, NaNs with their payload), and f32 values of
// every kind narrowed (ties at every exponent, the overflow threshold, subnormal results, NaNs).
TEST(Reductions, F16ConversionMatchesC10BitForBit) {
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF,
                                0x477FEFFF, 0x477FF000, 0x477FE000, 0x38800000, 0x387FFFFF, 0x33000000, 0x33000001,
                                0x32FFFFFF, 0x00000001, 0x3F801000, 0x3F803000, 0x3F800FFF};
  // Every finite f16 value as f32, and the f32 values beside it and halfway to the next: the ties of
  // every exponent.
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const float wide = static_cast<float>(c10::Half(static_cast<uint16_t>(h), c10::Half::from_bits()));
    uint32_t f;
    std::memcpy(&f, &wide, 4);
    bits.insert(bits.end(), {f, f + 1, f - 1, f + 0x1000, f | 0x80000000u});
  }
  expect_conversions_match_c10<c10::Half>(BPL_DTYPE_F16, std::move(bits), 600000);
}

// The reductions with streaming stores (dtypes.h's Stores::kStreamed) give the cached ones' results bit
// for bit, for every accumulation dtype and op, wherever in a line the output starts, for lengths around
// whole lines, and in place.
TEST(Reductions, StreamedFoldsMatchTheCachedOnesAtEveryAlignmentAndInPlace) {
  std::mt19937 random(11);
  std::vector<unsigned char> a(4096), b(4096);
  for (auto& byte : a) byte = static_cast<unsigned char>(random());
  for (auto& byte : b) byte = static_cast<unsigned char>(random());
  for (bpl_dtype dtype : {BPL_DTYPE_F32, BPL_DTYPE_F64, BPL_DTYPE_I8, BPL_DTYPE_U8, BPL_DTYPE_I32, BPL_DTYPE_I64}) {
    const size_t element = backplane::plugin::dtype_size(dtype);
    for (bpl_reduce_op op : {BPL_OP_SUM, BPL_OP_PROD, BPL_OP_MIN, BPL_OP_MAX}) {
      const auto cached = reduce_function(dtype, op), streamed = reduce_function(dtype, op, Stores::kStreamed);
      ASSERT_NE(streamed, nullptr);
      const unsigned char* x = a.data() + element;  // operands not at a line's start either
      const unsigned char* y = b.data() + 3 * element;
      for (size_t offset = 0; offset < 64; offset += element) {
        for (size_t n : {size_t{0}, size_t{1}, 64 / element - 1, 64 / element, 64 / element + 1, 1000 / element}) {
          alignas(64) unsigned char expected[2048], got[2048], in_place[2048];
          cached(expected + offset, x, y, n);
          streamed(got + offset, x, y, n);
          std::memcpy(in_place + offset, x, n * element);
          streamed(in_place + offset, in_place + offset, y, n);
          const std::string what = "dtype " + std::to_string(dtype) + ", op " + std::to_string(op) + ", offset " +
                                   std::to_string(offset) + ", " + std::to_string(n) + " elements";
          ASSERT_EQ(std::memcmp(got + offset, expected + offset, n * element), 0) << what;
          ASSERT_EQ(std::memcmp(in_place + offset, expected + offset, n * element), 0) << what << ", in place";
        }
      }
    }
  }
}

}  // namespace
