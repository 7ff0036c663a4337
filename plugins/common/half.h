// The 16-bit floating-point elements (IEEE binary16 "f16" and bfloat16 "bf16") as the CPU plugins see
// them: bits that collectives move and that reductions widen to f32 and narrow back. The conversions
// are written out here rather than taken from a library: the only one at hand, c10's, would make every
// plugin link LibTorch's c10 for four small functions. They give c10's results bit for bit (round to
// nearest even; any NaN to the quiet NaN of its type), which tests/plugins/common/reductions_test.cpp
// checks against c10 on every 16-bit value and on f32 values of every kind. Branch-free selects, so
// that the loops around them vectorise.
#pragma once

#include <cstdint>
#include <cstring>

namespace backplane::plugin {

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <typename T>
constexpr bool is_half_type = false;
template <>
constexpr bool is_half_type<Half> = true;
template <>
constexpr bool is_half_type<BFloat16> = true;

inline uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float float_of(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline float to_float(BFloat16 value) { return float_of(static_cast<uint32_t>(value.bits) << 16); }

inline BFloat16 to_bfloat16(float value) {
  const uint32_t bits = bits_of(value);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return BFloat16{static_cast<uint16_t>(nan ? 0x7FC0u : rounded)};  // selected in 32 bits: vectorises
}

// Exact: every f16 value is an f32 value. Normal numbers move their exponent from bias 15 to bias 127;
// subnormals (exponent field 0) are the mantissa times 2^-24, which an f32 multiplication makes exact;
// infinities stay infinite, and NaNs keep their payload, quietened (as a hardware conversion does).
inline float to_float(Half value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000u) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1Fu;
  const uint32_t mantissa = value.bits & 0x3FFu;
  const uint32_t normal = ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  const uint32_t special = 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
  const uint32_t subnormal = bits_of(static_cast<float>(mantissa) * 0x1p-24f);
  const uint32_t magnitude = exponent == 0x1Fu ? special : exponent == 0 ? subnormal : normal;
  return float_of(sign | magnitude);
}

// Round to nearest even. Above the largest finite f16 (65504) after rounding: infinity. Below the
// smallest normal f16 (2^-14): the f32 addition of 0.5, whose unit in the last place is f16's smallest
// subnormal (2^-24), rounds the value to that grid, and the sum's low mantissa bits are the f16 bits.
// Normal numbers: the mantissa rounded at bit 13 (ties to even), the exponent rebiased.
inline Half to_half(float value) {
  const uint32_t bits = bits_of(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  const uint32_t nan = 0x7E00u;
  const uint32_t infinity = 0x7C00u;
  const uint32_t subnormal = bits_of(float_of(magnitude) + 0.5f) - bits_of(0.5f);
  const uint32_t normal = (magnitude - ((127u - 15u) << 23) + 0xFFFu + ((magnitude >> 13) & 1u)) >> 13;
  const uint32_t result = magnitude > 0x7F800000u   ? nan
                          : magnitude >= 0x477FF000u ? infinity
                          : magnitude < 0x38800000u  ? subnormal
                                                     : normal;
  return Half{static_cast<uint16_t>(sign | result)};
}

}  // namespace backplane::plugin
