// The parameter attribute registry.
#include "backplane/parallel/parameters.h"

#include <mutex>
#include <string>
#include <unordered_map>

#include "backplane/parallel/error.h"
#include "backplane/parallel/parallel_state.h"

namespace backplane::parallel {
namespace {

struct Entry {
  explicit Entry(const at::Tensor& t) : tensor(t.getIntrusivePtr()) {}
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;  // to tell a live entry from a reused address
  std::optional<TensorParallelAttributes> tensor_parallel;
  bool sequence_parallel = false;
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, Entry> entries;

  // The live entry of `t`, or nullptr. Drops a stale entry left by a freed tensor at the same address.
  Entry* find(const at::Tensor& t) {
    auto it = entries.find(t.unsafeGetTensorImpl());
    if (it == entries.end()) return nullptr;
    if (it->second.tensor.lock().get() != t.unsafeGetTensorImpl()) {
      entries.erase(it);
      return nullptr;
    }
    return &it->second;
  }
  Entry& find_or_add(const at::Tensor& t) {
    if (Entry* entry = find(t)) return *entry;
    return entries.emplace(t.unsafeGetTensorImpl(), Entry(t)).first->second;
  }
};

Registry& registry() {
  static Registry* instance = new Registry;  // never destroyed: parameters may outlive static destruction
  return *instance;
}

}  // namespace

void set_tensor_model_parallel_attributes(const at::Tensor& parameter, TensorParallelAttributes attributes) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  Entry& entry = registry().find_or_add(parameter);
  if (entry.tensor_parallel) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "the parameter already has tensor-parallel attributes (partition_dim " +
                                              std::to_string(entry.tensor_parallel->partition_dim) + ")");
  }
  entry.tensor_parallel = attributes;
}

std::optional<TensorParallelAttributes> tensor_model_parallel_attributes(const at::Tensor& parameter) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  Entry* entry = registry().find(parameter);
  return entry != nullptr ? entry->tensor_parallel : std::nullopt;
}

bool param_is_not_tensor_parallel_duplicate(const at::Tensor& parameter) {
  return tensor_model_parallel_attributes(parameter).has_value() || get_tensor_model_parallel_rank() == 0;
}

void set_sequence_parallel_enabled(const at::Tensor& parameter) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().find_or_add(parameter).sequence_parallel = true;
}

bool is_sequence_parallel_enabled(const at::Tensor& parameter) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  Entry* entry = registry().find(parameter);
  return entry != nullptr && entry->sequence_parallel;
}

}  // namespace backplane::parallel
