// The bridge from LibTorch tensors to backplane's C ABI, the one that the torch.distributed backend
// (torch_backend/) and the training frontend (backplane-parallel) both cross: which tensors backplane
// moves and as what dtype, the buffer the backend is handed, and its result written back. Each side
// raises a refusal as its own error (torch's RuntimeError, backplane::parallel::Error). Header only.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

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

// Said of a tensor whose dtype backplane does not move.
inline std::string unmoved_dtype(c10::ScalarType type) {
  return "has dtype " + std::string(c10::toString(type)) + ", which backplane does not move (it moves " +
         kTorchDtypesMoved + ")";
}

// What keeps `tensor` from being handed to backplane, said of the tensor ("is on cuda:0, and backplane
// moves CPU tensors"), or none when it can be.
inline std::optional<std::string> why_unmovable(const at::Tensor& tensor) {
  if (!tensor.defined()) return std::string("is undefined");
  if (!tensor.device().is_cpu()) return "is on " + tensor.device().str() + ", and backplane moves CPU tensors";
  if (!bpl_dtype_of(tensor.scalar_type())) return unmoved_dtype(tensor.scalar_type());
  return std::nullopt;
}

// The buffer the backend reads and writes for a movable `tensor`: the tensor itself when contiguous
// (no copy), else a contiguous copy.
inline at::Tensor backend_buffer(const at::Tensor& tensor) { return tensor.contiguous(); }

// The backend's result in `buffer` written into `target`, unless they are one tensor.
inline void write_back(const at::Tensor& target, const at::Tensor& buffer) {
  if (!target.is_same(buffer)) const_cast<at::Tensor&>(target).copy_(buffer.view_as(target));
}

}  // namespace backplane
