// Checkpoints across parallel layouts: a model saved at one tensor- and pipeline-parallel size loaded at
// another, and unsharded files (one tensor per parameter, whole) written from a checkpoint and read
// into a sharded model.
#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "backplane/parallel/checkpoint.h"
#include "backplane/parallel/parallel_state.h"
#include "backplane/parallel/parameters.h"
#include "checkpoint_files.h"

namespace backplane::parallel {
namespace fs = std::filesystem;
using namespace checkpoint_files;

namespace {

constexpr const char* kPartitionPrefix = "__partition.";
constexpr const char* kModulesKey = "__modules";

// How a saved parameter's partitions make the whole tensor.
struct Partition {
  int64_t dim = 0;
  int64_t stride = 1;
  int64_t unpadded = -1;
  bool reshardable = true;
};

std::optional<Partition> saved_partition(torch::serialize::InputArchive& archive, const std::string& name) {
  c10::IValue meta;
  if (!archive.try_read(kPartitionPrefix + name, meta)) return std::nullopt;
  const std::vector<int64_t> v = meta.toIntVector();
  return Partition{v.at(0), v.at(1), v.at(2), v.at(3) != 0};
}

// The whole tensor from its partitions in rank order: partition r holds blocks r, r + n, r + 2n, … of
// the whole (each 1/stride of a partition), as create_local_weight takes them; then without padding.
at::Tensor unshard(const std::vector<at::Tensor>& parts, const Partition& partition) {
  at::Tensor whole = parts.at(0);
  const auto n = static_cast<int64_t>(parts.size());
  if (n > 1) {
    const int64_t block = parts[0].size(partition.dim) / partition.stride;
    std::vector<at::Tensor> blocks;
    for (int64_t j = 0; j < partition.stride * n; ++j) {
      blocks.push_back(parts[static_cast<size_t>(j % n)].narrow(partition.dim, (j / n) * block, block));
    }
    whole = at::cat(blocks, partition.dim);
  }
  return partition.unpadded >= 0 ? whole.narrow(partition.dim, 0, partition.unpadded) : whole;
}

// `whole` (a parameter, or a tensor of its shape, whole and unpadded) as this rank holds `target`: its
// partition, padded with zeros as its layer pads, or all of it.
at::Tensor this_ranks_part(const std::string& name, const at::Tensor& target, const at::Tensor& whole,
                           const std::string& where) {
  at::Tensor value = whole;
  if (const std::optional<TensorParallelAttributes> a = tensor_model_parallel_attributes(target)) {
    if (!a->reshardable && a->num_partitions > 1) {
      throw Error(BPL_ERR_MISMATCH, where + ": '" + name + "' cannot move between tensor-parallel sizes (its " +
                                        "partitions interleave replicated heads: GQA's QKV weights)");
    }
    const int64_t local = target.size(a->partition_dim), total = local * a->num_partitions;
    const int64_t have = whole.size(a->partition_dim);
    if (have < total) {
      std::vector<int64_t> shape = whole.sizes().vec();
      shape[static_cast<size_t>(a->partition_dim)] = total - have;
      value = at::cat({whole, at::zeros(shape, whole.options())}, a->partition_dim);
    }
    if (value.size(a->partition_dim) == total) {
      value = create_local_weight(value, a->partition_dim, local, a->partition_stride, get_tensor_model_parallel_rank(),
                                  a->num_partitions);
    }
  }
  if (!value.sizes().equals(target.sizes())) {
    throw Error(BPL_ERR_MISMATCH, where + ": '" + name + "' is " + c10::str(whole.sizes()) + " whole, which does not " +
                                      "make this rank's " + c10::str(target.sizes()));
  }
  return value;
}

void assign_whole(const std::string& name, at::Tensor& target, const at::Tensor& whole, const std::string& where) {
  const at::Tensor value = this_ranks_part(name, target, whole, where);
  at::NoGradGuard no_grad;
  target.copy_(value);
}

// The saved model files of a folder, by (pipeline rank, tensor rank), read when first needed.
class SavedShards {
 public:
  explicit SavedShards(fs::path dir) : dir_(std::move(dir)) {
    std::tie(tp_, pp_) = saved_layout(dir_);
    if (tp_ == 0) throw Error(BPL_ERR_NOT_FOUND, "checkpoint file " + file(0, 0).string() + " does not exist");
    for (int pp = 0; pp < pp_; ++pp) {
      for (const std::string& key : archive(pp, 0).keys()) {
        if (key.rfind("__", 0) != 0) stage_of_.emplace(key, pp);
      }
    }
  }
  int tensor_parallel_size() const { return tp_; }
  // The qualified names of the saved model's submodules (every stage's).
  std::vector<std::string> modules() {
    std::vector<std::string> names;
    for (int pp = 0; pp < pp_; ++pp) {
      c10::IValue saved;
      if (!archive(pp, 0).try_read(kModulesKey, saved)) continue;
      for (const auto& name : saved.toListRef()) names.push_back(name.toStringRef());
    }
    return names;
  }
  const std::map<std::string, int>& names() const { return stage_of_; }
  fs::path file(int pp, int tp) const { return dir_ / shard_name(0, tp, pp); }

  // `name` whole, or undefined if no file has it.
  at::Tensor whole(const std::string& name) {
    const auto found = stage_of_.find(name);
    if (found == stage_of_.end()) return at::Tensor();
    const int pp = found->second;
    at::Tensor first;
    archive(pp, 0).read(name, first);
    const std::optional<Partition> partition = saved_partition(archive(pp, 0), name);
    if (!partition) return first;
    std::vector<at::Tensor> parts{first};
    for (int tp = 1; tp < tp_; ++tp) {
      at::Tensor part;
      archive(pp, tp).read(name, part);
      parts.push_back(part);
    }
    if (!partition->reshardable && tp_ != get_tensor_model_parallel_size()) {
      throw Error(BPL_ERR_MISMATCH, "checkpoint file " + file(pp, 0).string() + ": '" + name + "' was saved at " +
                                        "tensor_parallel_size " + std::to_string(tp_) + " and cannot be resharded " +
                                        "(GQA's QKV weights)");
    }
    return unshard(parts, *partition);
  }

 private:
  torch::serialize::InputArchive& archive(int pp, int tp) {
    auto found = archives_.find({pp, tp});
    if (found == archives_.end()) found = archives_.emplace(std::pair{pp, tp}, read_archive(file(pp, tp))).first;
    return found->second;
  }

  fs::path dir_;
  int tp_ = 0, pp_ = 0;
  std::map<std::pair<int, int>, torch::serialize::InputArchive> archives_;
  std::map<std::string, int> stage_of_;
};

// `name` ("a.b.weight") in an archive written as torch::save writes a module: nested archives per
// submodule. Undefined if absent.
at::Tensor read_nested(torch::serialize::InputArchive& root, const std::string& name) {
  std::vector<std::string> parts;
  std::istringstream split(name);
  for (std::string part; std::getline(split, part, '.');) parts.push_back(part);
  std::vector<torch::serialize::InputArchive> levels;
  levels.reserve(parts.size());  // `at` points into it
  torch::serialize::InputArchive* at = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    levels.emplace_back();
    if (!at->try_read(parts[i], levels.back())) return at::Tensor();
    at = &levels.back();
  }
  at::Tensor tensor;
  return at->try_read(parts.back(), tensor) ? tensor : at::Tensor();
}

// A tree of archives, written as torch::save writes a module.
struct ArchiveTree {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, ArchiveTree> children;

  void add(const std::string& name, const at::Tensor& tensor) {
    const size_t dot = name.find('.');
    if (dot == std::string::npos) tensors[name] = tensor;
    else children[name.substr(0, dot)].add(name.substr(dot + 1), tensor);
  }
  // A submodule, with or without tensors: torch::load reads an archive for every one (a Tanh's too).
  void add_module(const std::string& name) {
    const size_t dot = name.find('.');
    ArchiveTree& child = children[name.substr(0, dot)];
    if (dot != std::string::npos) child.add_module(name.substr(dot + 1));
  }
  void write(torch::serialize::OutputArchive& archive) const {
    for (const auto& [name, tensor] : tensors) archive.write(name, tensor);
    for (const auto& [name, child] : children) {
      torch::serialize::OutputArchive sub;
      child.write(sub);
      archive.write(name, sub);
    }
  }
};

// The names of `optimizer`'s parameters in its order, from `model` (empty for one `model` lacks).
std::vector<std::string> parameter_names(torch::nn::Module& model, const ParallelOptimizer& optimizer) {
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : model.named_parameters()) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  std::vector<std::string> ordered;
  for (const at::Tensor& p : optimizer.parameters()) {
    const auto found = names.find(p.unsafeGetTensorImpl());
    ordered.push_back(found == names.end() ? "" : found->second);
  }
  return ordered;
}

// A state object of `optimizer`'s kind, for OptimizerParamState::serialize to fill.
std::unique_ptr<torch::optim::OptimizerParamState> new_param_state(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<torch::optim::Adam*>(&optimizer)) return std::make_unique<torch::optim::AdamParamState>();
  if (dynamic_cast<torch::optim::AdamW*>(&optimizer)) return std::make_unique<torch::optim::AdamWParamState>();
  if (dynamic_cast<torch::optim::SGD*>(&optimizer)) return std::make_unique<torch::optim::SGDParamState>();
  if (dynamic_cast<torch::optim::RMSprop*>(&optimizer)) return std::make_unique<torch::optim::RMSpropParamState>();
  if (dynamic_cast<torch::optim::Adagrad*>(&optimizer)) return std::make_unique<torch::optim::AdagradParamState>();
  throw Error(BPL_ERR_MISMATCH, "this optimizer's state cannot move between layouts (Adam, AdamW, SGD, RMSprop and "
                                "Adagrad can)");
}

// One saved optimizer file: each named parameter's state archive (LibTorch's format: state by a key per
// parameter, the keys in parameter order under param_groups) and partition.
struct SavedOptimizerFile {
  explicit SavedOptimizerFile(const fs::path& file) : archive(read_archive(file)) {
    c10::IValue names;
    if (!archive.try_read("__param_names", names)) {
      throw Error(BPL_ERR_MISMATCH, "checkpoint file " + file.string() + " has no parameter names (saved without the "
                                    "model, or by an older version): its state cannot move between layouts");
    }
    torch::serialize::InputArchive base, groups;
    archive.read("base", base);
    base.read("state", state);
    base.read("param_groups", groups);
    at::Tensor group_count;
    groups.read("param_groups/size", group_count);
    std::vector<std::string> keys;
    for (int64_t g = 0; g < group_count.item<int64_t>(); ++g) {
      torch::serialize::InputArchive group;
      groups.read("param_groups/" + std::to_string(g), group);
      at::Tensor size;
      group.read("params/size", size);
      for (int64_t i = 0; i < size.item<int64_t>(); ++i) {
        c10::IValue key;
        group.read("params/" + std::to_string(i), key);
        keys.push_back(key.toStringRef());
      }
    }
    const auto& list = names.toListRef();
    for (size_t i = 0; i < list.size() && i < keys.size(); ++i) key_of[list[i].toStringRef()] = keys[i];
  }
  // The state archive of `name`, if it has one (a parameter that never had a gradient has none).
  std::optional<torch::serialize::InputArchive> state_of(const std::string& name) {
    const auto found = key_of.find(name);
    torch::serialize::InputArchive sub;
    if (found == key_of.end() || !state.try_read(found->second, sub)) return std::nullopt;
    return sub;
  }

  torch::serialize::InputArchive archive, state;
  std::map<std::string, std::string> key_of;
};

}  // namespace

namespace checkpoint_files {

void write_optimizer_layout(torch::serialize::OutputArchive& archive, torch::nn::Module& model,
                            const ParallelOptimizer& optimizer) {
  if (optimizer.zero_one()) return;
  c10::List<std::string> names;
  for (const std::string& name : parameter_names(model, optimizer)) names.push_back(name);
  archive.write("__param_names", c10::IValue(names));
  write_layout(archive, model);
}

void load_optimizer_across_layouts(const fs::path& dir, torch::nn::Module& model, ParallelOptimizer& optimizer) {
  const std::string where = "checkpoint " + dir.string();
  const auto [saved_tp, saved_pp] = saved_layout(dir);
  if (saved_tp == 0) throw Error(BPL_ERR_NOT_FOUND, "checkpoint file " + (dir / shard_name(0, 0, 0)).string() + " does not exist");
  std::vector<std::vector<SavedOptimizerFile>> files(static_cast<size_t>(saved_pp));  // [pp][tp]
  for (int pp = 0; pp < saved_pp; ++pp) {
    for (int tp = 0; tp < saved_tp; ++tp) files[static_cast<size_t>(pp)].emplace_back(dir / shard_name(0, tp, pp));
  }
  torch::optim::Optimizer& base = optimizer.base();
  const std::vector<std::string> names = parameter_names(model, optimizer);
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    const at::Tensor& parameter = optimizer.parameters()[i];
    if (name.empty()) throw Error(BPL_ERR_INVALID_ARGUMENT, where + ": an optimizer parameter is not the model's");
    std::vector<SavedOptimizerFile>* stage = nullptr;
    for (auto& candidate : files) {
      if (candidate[0].key_of.count(name)) stage = &candidate;
    }
    if (stage == nullptr) throw Error(BPL_ERR_MISMATCH, where + " has no optimizer state for '" + name + "'");
    std::vector<torch::serialize::InputArchive> parts;
    for (SavedOptimizerFile& file : *stage) {
      std::optional<torch::serialize::InputArchive> sub = file.state_of(name);
      if (!sub) break;
      parts.push_back(std::move(*sub));
    }
    if (parts.size() != stage->size()) continue;  // no state yet: none to load
    const std::optional<Partition> partition = saved_partition((*stage)[0].archive, name);
    // Each entry as saved by tensor-parallel rank 0; a tensor shaped like the parameter's partition put
    // back together from every rank's and split again.
    torch::serialize::OutputArchive resharded;
    for (const std::string& key : parts[0].keys()) {
      c10::IValue first;
      parts[0].read(key, first);
      if (first.isTensor() && partition && first.toTensor().dim() == parameter.dim() && first.toTensor().dim() > 0) {
        std::vector<at::Tensor> pieces;
        for (auto& part : parts) {
          at::Tensor piece;
          part.read(key, piece);
          pieces.push_back(piece);
        }
        resharded.write(key, this_ranks_part(name + " (optimizer state " + key + ")", parameter,
                                             unshard(pieces, *partition), where));
      } else {
        resharded.write(key, first);
      }
    }
    std::stringstream bytes;
    resharded.save_to(bytes);
    torch::serialize::InputArchive state_archive;
    state_archive.load_from(bytes);
    std::unique_ptr<torch::optim::OptimizerParamState> state = new_param_state(base);
    state->serialize(state_archive);
    base.state()[parameter.unsafeGetTensorImpl()] = std::move(state);
  }
}

void write_layout(torch::serialize::OutputArchive& archive, torch::nn::Module& model) {
  archive.write("__pipeline_parallel_size", c10::IValue(static_cast<int64_t>(get_pipeline_model_parallel_size())));
  c10::List<std::string> modules;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) modules.push_back(item.key());
  archive.write(kModulesKey, c10::IValue(modules));
  for (const auto& item : model.named_parameters()) {
    if (const std::optional<TensorParallelAttributes> a = tensor_model_parallel_attributes(item.value())) {
      archive.write(kPartitionPrefix + item.key(),
                    c10::IValue(std::vector<int64_t>{a->partition_dim, a->partition_stride, a->unpadded_size,
                                                     a->reshardable ? 1 : 0}));
    }
  }
}

void load_across_layouts(const fs::path& dir, torch::nn::Module& model, bool strict,
                         const std::function<bool(const std::string&)>& wanted) {
  SavedShards saved(dir);
  auto load = [&](const std::string& name, at::Tensor& target) {
    if (!wanted(name)) return;
    const at::Tensor whole = saved.whole(name);
    if (!whole.defined()) {
      if (strict) {
        throw Error(BPL_ERR_MISMATCH, "checkpoint " + dir.string() + " has no '" + name + "' in any of its files");
      }
      return;
    }
    assign_whole(name, target, whole, "checkpoint " + dir.string());
  };
  for (auto& item : model.named_parameters()) load(item.key(), item.value());
  for (auto& item : model.named_buffers()) load(item.key(), item.value());
}

}  // namespace checkpoint_files

void export_unsharded_checkpoint(const std::string& path, const std::string& tag, const std::string& file) {
  std::string chosen = tag;
  if (chosen.empty()) {
    const std::vector<std::string> complete = list_completed_checkpoint_tags(path);
    if (complete.empty()) throw Error(BPL_ERR_NOT_FOUND, "no complete checkpoint under " + path);
    chosen = complete.back();
  }
  const fs::path folder = fs::path(path) / chosen;
  if (!fs::exists(folder / "done")) {
    throw Error(BPL_ERR_NOT_FOUND, "checkpoint " + folder.string() + " is not complete (no done marker) or does not exist");
  }
  ArchiveTree tree;
  bool any = false;
  for (const char* dir : {kModelDir, kLoraDir}) {
    if (!fs::exists(folder / dir / shard_name(0, 0, 0))) continue;
    any = true;
    SavedShards saved(folder / dir);
    for (const std::string& module : saved.modules()) tree.add_module(module);
    for (const auto& entry : saved.names()) tree.add(entry.first, saved.whole(entry.first));
  }
  if (!any) throw Error(BPL_ERR_NOT_FOUND, "checkpoint " + folder.string() + " has no model files");
  torch::serialize::OutputArchive archive;
  tree.write(archive);
  write_file_atomically(file, serialize(archive));
}

void load_unsharded_checkpoint(const std::string& file, torch::nn::Module& model, bool strict) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(file);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw Error(fs::exists(file) ? BPL_ERR_IO : BPL_ERR_NOT_FOUND,
                "unsharded checkpoint " + file + " cannot be read: " + what.substr(0, what.find('\n')));
  }
  auto load = [&](const std::string& name, at::Tensor& target) {
    const at::Tensor whole = read_nested(archive, name);
    if (!whole.defined()) {
      if (strict) throw Error(BPL_ERR_MISMATCH, "unsharded checkpoint " + file + " has no '" + name + "'");
      return;
    }
    assign_whole(name, target, whole, "unsharded checkpoint " + file);
  };
  for (auto& item : model.named_parameters()) load(item.key(), item.value());
  for (auto& item : model.named_buffers()) load(item.key(), item.value());
}

}  // namespace backplane::parallel
