// Flat buffers for the list forms of the collectives, and the copies between a list and its flat
// buffer.
#pragma once

#include <ATen/ATen.h>

#include <cstring>
#include <mutex>
#include <vector>

namespace backplane::torch_backend {

// Flat buffers for the list forms of the collectives (a list gathered into, a list reduce-scattered,
// ...), reused. A fresh buffer of 32 MiB or more is a fresh mapping (glibc's malloc maps those) whose
// every page faults on first touch: allocated per call, it cost several times the collective itself
// (bench/results/epyc/README.md#2026-11-25-torch-backend). A buffer is free again once no tensor uses its
// storage: the works drop theirs when they end.
class ScratchBuffers {
 public:
  // A contiguous tensor of `numel` elements of `dtype`, its values undefined.
  at::Tensor take(int64_t numel, at::ScalarType dtype) {
    const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
    std::lock_guard<std::mutex> lock(mutex_);
    at::Tensor* chosen = nullptr;       // the smallest free buffer that is large enough
    at::Tensor* smaller_free = nullptr;  // else a free one to replace with a larger one
    for (at::Tensor& buffer : buffers_) {
      if (buffer.storage().use_count() != 1) continue;  // a work still holds it
      if (buffer.nbytes() >= bytes) {
        if (chosen == nullptr || buffer.nbytes() < chosen->nbytes()) chosen = &buffer;
      } else {
        smaller_free = &buffer;
      }
    }
    if (chosen == nullptr) {
      if (smaller_free == nullptr && buffers_.size() >= kKept) {
        return at::empty({numel}, at::TensorOptions().dtype(dtype));  // every kept one in use: not kept
      }
      at::Tensor fresh = at::empty({static_cast<int64_t>(bytes)}, at::kByte);
      if (smaller_free != nullptr) {
        *smaller_free = fresh;
        chosen = smaller_free;
      } else {
        buffers_.push_back(fresh);
        chosen = &buffers_.back();
      }
    }
    return view_of(*chosen, numel, dtype);
  }

 private:
  // `numel` elements of `dtype` at the start of `buffer`'s storage. Made without the dispatcher, whose
  // at::empty and set_ are a measurable share of a small list operation
  // (bench/results/design-choices.md#the-torch-backends-lists).
  static at::Tensor view_of(const at::Tensor& buffer, int64_t numel, at::ScalarType dtype) {
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(buffer.storage()), buffer.key_set(),
                                                     c10::scalarTypeToTypeMeta(dtype));
    impl->set_sizes_contiguous({numel});
    return at::Tensor(std::move(impl));
  }

  static constexpr size_t kKept = 4;  // operations of list form in flight at once, each with its buffer
  std::mutex mutex_;
  std::vector<at::Tensor> buffers_;
};

// The tensors' elements in order in `flat` (as many elements as they have together). Contiguous ones of
// flat's dtype are copied as copy_ would, without its dispatch or a slice of `flat` (the same reason).
inline at::Tensor flat_of(const std::vector<at::Tensor>& tensors, at::Tensor flat) {
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    if (t.is_contiguous() && t.scalar_type() == flat.scalar_type()) {
      if (t.numel() > 0) std::memcpy(static_cast<char*>(flat.data_ptr()) + offset * flat.element_size(), t.data_ptr(), t.nbytes());
    } else {
      flat.slice(0, offset, offset + t.numel()).view_as(t).copy_(t);
    }
    offset += t.numel();
  }
  return flat;
}

// `flat`'s elements into the tensors in order (the same shortcut).
inline void copy_slices(const at::Tensor& flat, const std::vector<at::Tensor>& targets) {
  int64_t offset = 0;
  for (const at::Tensor& t : targets) {
    if (t.is_contiguous() && t.scalar_type() == flat.scalar_type()) {
      if (t.numel() > 0) std::memcpy(t.data_ptr(), static_cast<const char*>(flat.data_ptr()) + offset * flat.element_size(), t.nbytes());
    } else {
      const_cast<at::Tensor&>(t).copy_(flat.slice(0, offset, offset + t.numel()).view_as(t));
    }
    offset += t.numel();
  }
}

inline int64_t total_numel(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const at::Tensor& t : tensors) total += t.numel();
  return total;
}

}  // namespace backplane::torch_backend
