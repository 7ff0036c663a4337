// bpl_dtype to ATen's scalar type, for the two translation units that talk to LibTorch.
#pragma once

#include <c10/core/ScalarType.h>

#include "backplane/backplane.h"

namespace backplane::cpu_kernels {

inline at::ScalarType scalar_type(bpl_dtype dtype) {
  switch (dtype) {
    case BPL_DTYPE_F32: return at::kFloat;
    case BPL_DTYPE_F64: return at::kDouble;
    case BPL_DTYPE_F16: return at::kHalf;
    case BPL_DTYPE_BF16: return at::kBFloat16;
    case BPL_DTYPE_I8: return at::kChar;
    case BPL_DTYPE_U8: return at::kByte;
    case BPL_DTYPE_I32: return at::kInt;
    default: return at::kLong;
  }
}

}  // namespace backplane::cpu_kernels
