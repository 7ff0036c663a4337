// torch's scalar types as backplane's dtypes: the one table that the torch.distributed backend and the
// training frontend (backplane-parallel) both use. Header only.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "backplane/backplane.h"

namespace backplane {

// The dtypes backplane moves, in torch's words, for messages that list them.
inline constexpr const char* kTorchDtypesMoved = "float32, float64, float16, bfloat16, int8, uint8, int32, int64";

// `type` as a bpl_dtype; none for a type backplane does not move.
inline std::optional<bpl_dtype> bpl_dtype_of(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat: return BPL_DTYPE_F32;
    case c10::kDouble: return BPL_DTYPE_F64;
    case c10::kHalf: return BPL_DTYPE_F16;
    case c10::kBFloat16: return BPL_DTYPE_BF16;
    case c10::kChar: return BPL_DTYPE_I8;
    case c10::kByte: return BPL_DTYPE_U8;
    case c10::kInt: return BPL_DTYPE_I32;
    case c10::kLong: return BPL_DTYPE_I64;
    default: return std::nullopt;
  }
}

}  // namespace backplane
