// The checks and conversions of torch's arguments that every operation of BackendBackplane shares:
// errors are RuntimeErrors naming the operation and the value, and what was expected.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "tensor_bridge.h"

namespace backplane::torch_backend {

[[noreturn]] inline void fail(const std::string& message) { throw std::runtime_error("backplane: " + message); }

inline void check(bpl_status status, const char* what) {
  if (status != BPL_OK) fail(std::string(what) + " failed (" + bpl_status_name(status) + "): " + bpl_last_error());
}

// The dtype of a tensor backplane moves (tensor_bridge.h); else the refusal, naming the operation.
inline bpl_dtype dtype_of(const at::Tensor& tensor, const char* op) {
  if (const std::optional<std::string> why = why_unmovable(tensor)) fail(std::string(op) + ": the tensor " + *why);
  return *bpl_dtype_of(tensor.scalar_type());
}

// torch's reduce op as backplane's; PREMUL_SUM is a sum of inputs scaled first (*factor).
inline bpl_reduce_op reduce_op_of(const c10d::ReduceOp& op, const char* name, std::optional<double>* factor) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return BPL_OP_SUM;
    case c10d::ReduceOp::AVG: return BPL_OP_AVG;
    case c10d::ReduceOp::PRODUCT: return BPL_OP_PROD;
    case c10d::ReduceOp::MIN: return BPL_OP_MIN;
    case c10d::ReduceOp::MAX: return BPL_OP_MAX;
    case c10d::ReduceOp::BAND: return BPL_OP_BAND;  // integer tensors: backplane refuses others, naming the dtype
    case c10d::ReduceOp::BOR: return BPL_OP_BOR;
    case c10d::ReduceOp::BXOR: return BPL_OP_BXOR;
    case c10d::ReduceOp::PREMUL_SUM: {
      // The name every supported torch has (later ones call it PreMulSumSupplement, and keep this alias).
      auto* supplement = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (supplement == nullptr) fail(std::string(name) + ": PREMUL_SUM without its factor");
      // A factor given as a tensor has one element (torch checks it).
      *factor = supplement->tensor_factor.defined() ? supplement->tensor_factor.item<double>() : supplement->double_factor;
      return BPL_OP_SUM;
    }
    default:
      fail(std::string(name) + ": reduce op " + std::to_string(static_cast<int>(op.op_)) +
           " is not one backplane has: it reduces with SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM, BAND, BOR and BXOR");
  }
}

// Where torch's backends phrase a mistake ("requires non-empty tensor list"), the message carries
// their phrase beside backplane's detail, for whoever looks for it.

inline void require_some(const std::vector<at::Tensor>& tensors, const char* op) {
  if (tensors.empty()) fail(std::string(op) + " requires non-empty tensor list (got no tensor)");
}

// One tensor per call, as torch's CPU backends take for every operation but a few of Gloo's.
inline const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* op) {
  if (tensors.size() != 1) {
    fail(std::string(op) + " requires a single-element tensor list (got " + std::to_string(tensors.size()) + ")");
  }
  return tensors[0];
}

// The tensor of a call of several whose contents go out (BroadcastOptions::rootTensor).
inline int64_t checked_root_tensor(const std::vector<at::Tensor>& tensors, int64_t root_tensor, const char* op) {
  require_some(tensors, op);
  if (root_tensor < 0 || root_tensor >= static_cast<int64_t>(tensors.size())) {
    fail(std::string(op) + ": invalid root tensor: " + std::to_string(root_tensor) + " (the call has " +
         std::to_string(tensors.size()) + " tensors)");
  }
  return root_tensor;
}

// `role` is what the rank is to the operation: "root", "destination", "source".
inline int64_t checked_rank(int64_t rank, int size, const char* op, const char* role = "root") {
  if (rank < 0 || rank >= size) {
    fail(std::string(op) + ": invalid " + role + " rank: " + std::to_string(rank) + " (a rank of this group is 0.." +
         std::to_string(size - 1) + ")");
  }
  return rank;
}

// `b`, the tensor at `index` of its list (`what` names it), has `a`'s dtype and number of elements.
inline void require_same(const at::Tensor& a, const at::Tensor& b, const char* op, const std::string& what, size_t index) {
  if (a.scalar_type() != b.scalar_type() || a.numel() != b.numel()) {
    const char* differs = a.scalar_type() != b.scalar_type() ? "type" : "size";
    fail(std::string(op) + ": invalid tensor " + differs + " at index " + std::to_string(index) + ": " + what + " is " +
         std::string(c10::toString(b.scalar_type())) + "[" + std::to_string(b.numel()) + "] where " +
         std::string(c10::toString(a.scalar_type())) + "[" + std::to_string(a.numel()) + "] is expected");
  }
}

}  // namespace backplane::torch_backend
