// Sharded checkpoints: who writes what, completion markers, retention, async saves, and loading the
// newest intact one (the files themselves: checkpoint_files.cpp; a LoRA adapter's config:
// checkpoint_lora.cpp).
#include "backplane/parallel/checkpoint.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>

#include "backplane/parallel/distributed.h"
#include "backplane/parallel/lora.h"
#include "checkpoint_files.h"
#include "checkpoint_manifest.h"

namespace backplane::parallel {
namespace fs = std::filesystem;
using namespace checkpoint_files;

namespace {

// A tag folder's first file: the folder is a checkpoint's (complete once it has kDone too).
constexpr const char* kMarker = "checkpoint";

fs::file_time_type modified(const fs::path& file) {
  std::error_code error;
  fs::file_time_type time = fs::last_write_time(file, error);
  return error ? fs::file_time_type::min() : time;
}

// Tag folders (those with the marker), oldest first by the marker's time.
std::vector<fs::path> checkpoint_folders(const fs::path& root) {
  std::vector<fs::path> folders;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    if (entry.is_directory() && fs::exists(entry.path() / kMarker)) folders.push_back(entry.path());
  }
  std::sort(folders.begin(), folders.end(), [](const fs::path& a, const fs::path& b) {
    return std::make_pair(modified(a / kMarker), a.filename()) < std::make_pair(modified(b / kMarker), b.filename());
  });
  return folders;
}

void barrier(const char* what) {
  try {
    get_world_group()->barrier();
  } catch (const Error& e) {
    throw Error(e.status(), std::string("checkpoint: waiting for every rank ") + what + ": " + e.what());
  }
}

// Removes a tag so that it never looks complete on the way: `done` first, then the rest.
void remove_tag(const fs::path& folder) {
  std::error_code error;
  fs::remove(folder / kDone, error);
  fs::remove_all(folder, error);
}

// After `tag` became complete (rank 0): drops folders of interrupted removals (incomplete and older than
// the newest complete tag) and complete tags beyond the newest num_kept.
void apply_retention(const fs::path& root, int num_kept) {
  std::vector<fs::path> folders = checkpoint_folders(root);
  std::vector<std::string> complete = list_completed_checkpoint_tags(root.string());
  if (complete.empty()) return;
  const fs::path newest = root / complete.back();
  const auto newest_time = modified(newest / kMarker);
  for (const fs::path& folder : folders) {
    if (!fs::exists(folder / kDone) && modified(folder / kMarker) < newest_time) {
      remove_tag(folder);
    } else {
      remove_stale_temporaries(folder);
    }
  }
  if (num_kept > 0) {
    for (size_t i = 0; i + static_cast<size_t>(num_kept) < complete.size(); ++i) remove_tag(root / complete[i]);
  }
}

struct PendingSave {
  fs::path root;
  fs::path folder;
  int num_kept = -1;
  std::future<void> writes;
};

struct AsyncState {
  std::mutex mutex;
  std::optional<PendingSave> pending;
};

AsyncState& async_state() {
  static AsyncState* instance = new AsyncState;
  return *instance;
}

// At exit, an asynchronous save still writing is waited for (its tag stays incomplete without
// finalize_checkpoint, which needs the other ranks, but its files are not cut short).
void wait_for_writes_at_exit() {
  std::lock_guard<std::mutex> lock(async_state().mutex);
  if (async_state().pending && async_state().pending->writes.valid()) async_state().pending->writes.wait();
}

// Every rank's writes are on disk: rank 0 marks the tag complete and applies retention; every rank
// returns once that is done, so a checkpoint is complete everywhere when its save returns.
void complete_save(const fs::path& root, const fs::path& folder, int num_kept) {
  barrier("to finish writing");
  if (get_rank() == 0) {
    write_bytes_atomically(folder / kDone, manifest_text(folder, get_tensor_model_parallel_size(),
                                                         get_pipeline_model_parallel_size(), {kMarker, kDone}));
    apply_retention(root, num_kept);
  }
  barrier("for the checkpoint to be marked complete");
}

void write_all(const std::vector<std::pair<fs::path, std::string>>& files) {
  for (const auto& [file, bytes] : files) write_file_atomically(file, bytes);
}

}  // namespace

std::vector<std::string> list_completed_checkpoint_tags(const std::string& path) {
  std::vector<fs::path> complete;
  for (const fs::path& folder : checkpoint_folders(path)) {
    if (fs::exists(folder / kDone)) complete.push_back(folder);
  }
  std::stable_sort(complete.begin(), complete.end(), [](const fs::path& a, const fs::path& b) {
    return modified(a / kDone) < modified(b / kDone);
  });
  std::vector<std::string> tags;
  for (const fs::path& folder : complete) tags.push_back(folder.filename().string());
  return tags;
}

bool has_checkpoint(const std::string& path) { return !list_completed_checkpoint_tags(path).empty(); }

void finalize_checkpoint() {
  std::optional<PendingSave> pending;
  {
    std::lock_guard<std::mutex> lock(async_state().mutex);
    pending.swap(async_state().pending);
  }
  if (!pending) return;
  try {
    pending->writes.get();
  } catch (const std::exception& e) {
    throw Error(BPL_ERR_IO, std::string("asynchronous checkpoint save to ") + pending->folder.string() + " failed: " + e.what());
  }
  complete_save(pending->root, pending->folder, pending->num_kept);
}

namespace {

torch::serialize::OutputArchive model_archive(torch::nn::Module& model) {
  torch::serialize::OutputArchive archive;
  archive.write("__tensor_parallel_size", c10::IValue(static_cast<int64_t>(get_tensor_model_parallel_size())));
  write_layout(archive, model);
  return archive;
}

// The model's files of this rank: without adapters, every parameter and buffer in model/; with, as the
// adapters' LoraConfig says: the adapter alone in lora_adapter/, the base model in model/ besides, or
// only the base model with the adapters merged in.
void add_model_files(torch::nn::Module& model, const fs::path& folder, const std::string& shard,
                     std::vector<std::pair<fs::path, std::string>>& files) {
  const auto adapters = lora_adapters(model);
  const std::optional<LoraConfig> lora =
      adapters.empty() ? std::nullopt : std::optional<LoraConfig>(adapters.front().second->config());
  if (!lora || lora->save_lora_base) {
    torch::serialize::OutputArchive archive = model_archive(model);
    if (lora && lora->merge_lora) {
      for (const auto& [name, value] : merged_lora_state(model)) archive.write(name, value);
    } else {
      for (const auto& item : model.named_parameters()) {
        if (!is_lora_name(item.key())) archive.write(item.key(), item.value().detach());
      }
    }
    for (const auto& item : model.named_buffers()) {
      if (!is_lora_name(item.key())) archive.write(item.key(), item.value(), /*is_buffer=*/true);
    }
    files.emplace_back(folder / kModelDir / shard, serialize(archive));
  }
  if (lora && !lora->merge_lora) {
    torch::serialize::OutputArchive archive = model_archive(model);
    write_lora_config(archive, *lora);
    const auto params = model.named_parameters();
    for (const std::string& name : lora_adapter_state_names(model)) archive.write(name, params[name].detach());
    files.emplace_back(folder / kLoraDir / shard, serialize(archive));
    if (!lora->save_lora_config_adapter && get_rank() == 0) {
      files.emplace_back(folder / kLoraDir / "adapter_config.json", lora->to_json());
    }
  }
}

}  // namespace

void save_checkpoint(const std::string& path, const std::string& tag, torch::nn::Module* model,
                     ParallelOptimizer* optimizer, Stateful* scheduler, const UserContent& user_content,
                     int num_kept_ckpts, bool async_save) {
  if (tag.empty() || tag.find('/') != std::string::npos || tag == "." || tag == "..") {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "checkpoint tag '" + tag + "' is not valid: expected a folder name");
  }
  finalize_checkpoint();
  const fs::path root(path);
  const fs::path folder = root / tag;
  const int rank = get_rank();
  const int tp = get_tensor_model_parallel_rank(), pp = get_pipeline_model_parallel_rank();
  const int dp = get_data_parallel_rank();

  // Begin: the tag must not look complete while it is rewritten.
  if (rank == 0) {
    fs::create_directories(folder);
    std::error_code error;
    fs::remove(folder / kDone, error);
    write_bytes_atomically(folder / kMarker, "1");
  }
  barrier("to begin the checkpoint");
  fs::create_directories(folder / kModelDir);
  fs::create_directories(folder / "optim");
  if (model != nullptr && !lora_adapters(*model).empty()) fs::create_directories(folder / kLoraDir);
  remove_stale_temporaries(folder);

  // Serialise now (the files hold this step's values even when written later).
  std::vector<std::pair<fs::path, std::string>> files;
  if (model != nullptr && dp == 0) add_model_files(*model, folder, shard_name(0, tp, pp), files);
  if (optimizer != nullptr && (optimizer->zero_one() || dp == 0)) {
    torch::serialize::OutputArchive archive;
    archive.write("__tensor_parallel_size", c10::IValue(static_cast<int64_t>(get_tensor_model_parallel_size())));
    archive.write("__data_parallel_size", c10::IValue(static_cast<int64_t>(get_data_parallel_size())));
    archive.write("__zero_one", c10::IValue(optimizer->zero_one()));
    if (model != nullptr) write_optimizer_layout(archive, *model, *optimizer);
    optimizer->save(archive);
    files.emplace_back(folder / "optim" / shard_name(optimizer->zero_one() ? dp : 0, tp, pp), serialize(archive));
  }
  if (rank == 0) {
    if (scheduler != nullptr) {
      torch::serialize::OutputArchive archive;
      scheduler->save(archive);
      files.emplace_back(folder / "scheduler.pt", serialize(archive));
    }
    torch::serialize::OutputArchive archive;
    for (const auto& [key, value] : user_content) archive.write(key, value);
    files.emplace_back(folder / "user_content.pt", serialize(archive));
  }

  if (!async_save) {
    write_all(files);
    complete_save(root, folder, num_kept_ckpts);
    return;
  }
  static const bool registered = std::atexit(wait_for_writes_at_exit) == 0;
  (void)registered;
  std::lock_guard<std::mutex> lock(async_state().mutex);
  async_state().pending = PendingSave{root, folder, num_kept_ckpts,
                                      std::async(std::launch::async, [files = std::move(files)] { write_all(files); })};
}

namespace {

// The model's files this rank reads from `folder`: model/; for a model with adapters, those of
// model/ and lora_adapter/ that exist (an adapter saved alone has no model/, a merged one no
// lora_adapter/), model/ if neither does (to be named as missing).
std::vector<fs::path> model_files(const fs::path& folder, torch::nn::Module& model, const std::string& shard) {
  const fs::path base = folder / kModelDir / shard, adapter = folder / kLoraDir / shard;
  if (lora_adapters(model).empty()) return {base};
  std::vector<fs::path> files;
  for (const fs::path& file : {base, adapter}) {
    if (fs::exists(file) || fs::exists(file.parent_path() / shard_name(0, 0, 0))) files.push_back(file);
  }
  if (files.empty()) files.push_back(base);
  return files;
}

// Every model file of the folder of `file`: what a job of another layout reads.
std::vector<fs::path> every_shard_beside(const fs::path& file) {
  const auto [tp, pp] = saved_layout(file.parent_path());
  std::vector<fs::path> files;
  for (int p = 0; p < pp; ++p) {
    for (int t = 0; t < tp; ++t) files.push_back(file.parent_path() / shard_name(0, t, p));
  }
  return files;
}

// The files this rank reads to load a checkpoint in `folder`: the model's and optimizer's shards of
// its place in the job, the scheduler's state, and the user content.
std::vector<fs::path> files_to_read(const fs::path& folder, torch::nn::Module* model,
                                    const ParallelOptimizer* optimizer, const Stateful* scheduler) {
  const int tp = get_tensor_model_parallel_rank(), pp = get_pipeline_model_parallel_rank();
  std::vector<fs::path> files;
  if (model != nullptr) {
    for (const fs::path& file : model_files(folder, *model, shard_name(0, tp, pp))) {
      const auto [saved_tp, saved_pp] = saved_layout(file.parent_path());
      if (saved_tp == get_tensor_model_parallel_size() && saved_pp == get_pipeline_model_parallel_size()) {
        files.push_back(file);
      } else {
        for (const fs::path& shard : every_shard_beside(file)) files.push_back(shard);
      }
    }
  }
  if (optimizer != nullptr) {
    const fs::path file = folder / "optim" / shard_name(optimizer->zero_one() ? get_data_parallel_rank() : 0, tp, pp);
    const auto [saved_tp, saved_pp] = saved_layout(file.parent_path());
    if (!optimizer->zero_one() && (saved_tp != get_tensor_model_parallel_size() || saved_pp != get_pipeline_model_parallel_size())) {
      for (const fs::path& shard : every_shard_beside(file)) files.push_back(shard);
    } else {
      files.push_back(file);
    }
  }
  if (scheduler != nullptr) files.push_back(folder / "scheduler.pt");
  if (fs::exists(folder / "user_content.pt")) files.push_back(folder / "user_content.pt");
  return files;
}

void warn_on_this_rank(const std::string& message) {
  std::fprintf(stderr, "[backplane:parallel] WARN: rank %d: %s\n", get_rank(), message.c_str());
  std::fflush(stderr);
}

// The newest complete tag whose files every rank can read intact (collective). A tag that fails is
// said so on every rank, with this rank's own finding; none at all is NOT_FOUND.
std::string newest_loadable_tag(const std::string& path, torch::nn::Module* model,
                                const ParallelOptimizer* optimizer, const Stateful* scheduler) {
  const std::vector<std::string> complete = list_completed_checkpoint_tags(path);
  if (complete.empty()) throw Error(BPL_ERR_NOT_FOUND, "no complete checkpoint under " + path);
  std::string newest_problem;
  for (auto tag = complete.rbegin(); tag != complete.rend(); ++tag) {
    const fs::path folder = fs::path(path) / *tag;
    std::string problem = missing_file(folder, folder / kDone);
    for (const fs::path& file : files_to_read(folder, model, optimizer, scheduler)) {
      if (!problem.empty()) break;
      problem = integrity_problem(file);
    }
    at::Tensor loadable = at::full({1}, problem.empty() ? 1 : 0, at::kInt);
    get_world_group()->all_reduce(loadable, ReduceOp::Min);
    if (loadable.item<int>() == 1) {
      if (tag != complete.rbegin()) {
        warn_on_this_rank("loading checkpoint " + path + "/" + *tag + ", the newest whose files every rank can read");
      }
      return *tag;
    }
    if (newest_problem.empty()) newest_problem = problem.empty() ? "another rank's" : problem;
    warn_on_this_rank("checkpoint " + path + "/" + *tag + " cannot be loaded by every rank (here: " +
                      (problem.empty() ? "this rank's files are intact" : problem) + ")" +
                      (std::next(tag) != complete.rend() ? "; trying an older one" : ""));
  }
  throw Error(BPL_ERR_NOT_FOUND, "no complete checkpoint under " + path + " can be loaded by every rank (the newest, " +
                                     complete.back() + ": " + newest_problem + ")");
}

}  // namespace

UserContent load_checkpoint(const std::string& path, const std::string& tag, torch::nn::Module* model,
                            ParallelOptimizer* optimizer, Stateful* scheduler, bool strict) {
  finalize_checkpoint();
  const fs::path root(path);
  const std::string chosen = tag.empty() ? newest_loadable_tag(path, model, optimizer, scheduler) : tag;
  const fs::path folder = root / chosen;
  if (!fs::exists(folder / kDone)) {
    throw Error(BPL_ERR_NOT_FOUND, "checkpoint " + folder.string() + " is not complete (no done marker) or does not exist");
  }
  const std::string missing = missing_file(folder, folder / kDone);
  if (!missing.empty()) throw Error(BPL_ERR_NOT_FOUND, missing);
  const int tp = get_tensor_model_parallel_rank(), pp = get_pipeline_model_parallel_rank();
  const int tp_size = get_tensor_model_parallel_size();
  auto check_tensor_parallel_size = [&](torch::serialize::InputArchive& archive, const fs::path& file) {
    c10::IValue saved;
    if (archive.try_read("__tensor_parallel_size", saved) && saved.toInt() != tp_size) {
      throw Error(BPL_ERR_MISMATCH, "checkpoint file " + file.string() + " was saved with tensor_parallel_size " +
                                        std::to_string(saved.toInt()) + "; this job has " + std::to_string(tp_size));
    }
  };

  if (model != nullptr) {
    const std::vector<std::string> adapter_state = lora_adapter_state_names(*model);
    for (const fs::path& file : model_files(folder, *model, shard_name(0, tp, pp))) {
      const bool adapter_file = file.parent_path().filename() == kLoraDir;
      const auto [saved_tp, saved_pp] = saved_layout(file.parent_path());
      if (saved_tp != tp_size || saved_pp != get_pipeline_model_parallel_size()) {
        // Saved at another layout: every parameter put back together and split again.
        load_across_layouts(file.parent_path(), *model, strict, [&](const std::string& name) {
          if (adapter_state.empty()) return true;
          return adapter_file ? std::count(adapter_state.begin(), adapter_state.end(), name) > 0 : !is_lora_name(name);
        });
        continue;
      }
      torch::serialize::InputArchive archive = read_archive(file);
      check_tensor_parallel_size(archive, file);
      // With adapters, a model's file holds the base model (the adapters' trained biases too, when saved
      // with it) and an adapter's file the adapters and their trained biases (loaded after it).
      at::NoGradGuard no_grad;
      auto load_into = [&](const std::string& name, at::Tensor& target, bool is_buffer) {
        if (adapter_file ? !std::count(adapter_state.begin(), adapter_state.end(), name) : is_lora_name(name)) return;
        at::Tensor saved;
        if (!archive.try_read(name, saved, is_buffer)) {
          if (strict) throw Error(BPL_ERR_MISMATCH, "checkpoint file " + file.string() + " has no '" + name + "'");
          return;
        }
        if (!saved.sizes().equals(target.sizes())) {
          throw Error(BPL_ERR_MISMATCH, "checkpoint file " + file.string() + ": '" + name + "' has shape " +
                                            c10::str(saved.sizes()) + ", the model " + c10::str(target.sizes()));
        }
        target.copy_(saved);
      };
      for (auto& item : model->named_parameters()) load_into(item.key(), item.value(), false);
      for (auto& item : model->named_buffers()) load_into(item.key(), item.value(), true);
    }
  }
  const auto [saved_tp, saved_pp] = saved_layout(folder / "optim");
  if (optimizer != nullptr && !optimizer->zero_one() &&
      (saved_tp != tp_size || saved_pp != get_pipeline_model_parallel_size())) {
    if (model == nullptr) {
      throw Error(BPL_ERR_INVALID_ARGUMENT, "checkpoint " + folder.string() + " was saved at another layout: its "
                                            "optimizer state loads with the model (whose names match the state to it)");
    }
    load_optimizer_across_layouts(folder / "optim", *model, *optimizer);
  } else if (optimizer != nullptr) {
    const fs::path own = folder / "optim" / shard_name(optimizer->zero_one() ? get_data_parallel_rank() : 0, tp, pp);
    // A ZeRO-1 rank whose shard is missing reads what data-parallel rank 0 saved, to say what the
    // checkpoint holds instead (a non-ZeRO-1 state, or ZeRO-1 over fewer ranks).
    const fs::path first = folder / "optim" / shard_name(0, tp, pp);
    const fs::path file = !fs::exists(own) && optimizer->zero_one() && fs::exists(first) ? first : own;
    torch::serialize::InputArchive archive = read_archive(file);
    c10::IValue zero_one, dp_size;
    archive.read("__zero_one", zero_one);
    archive.read("__data_parallel_size", dp_size);
    if (zero_one.toBool() != optimizer->zero_one() || (optimizer->zero_one() && dp_size.toInt() != get_data_parallel_size())) {
      throw Error(BPL_ERR_MISMATCH, "checkpoint file " + file.string() + " holds a " +
                                        (zero_one.toBool() ? "ZeRO-1 optimizer over " + std::to_string(dp_size.toInt()) +
                                                                 " data-parallel ranks"
                                                           : std::string("non-ZeRO-1 optimizer")) +
                                        "; this optimizer is " +
                                        (optimizer->zero_one() ? "ZeRO-1 over " + std::to_string(get_data_parallel_size()) +
                                                                     " data-parallel ranks"
                                                               : std::string("not ZeRO-1")));
    }
    check_tensor_parallel_size(archive, file);  // a ZeRO-1 state at another layout
    if (file != own) throw Error(BPL_ERR_NOT_FOUND, "checkpoint file " + own.string() + " does not exist");
    try {
      optimizer->load(archive);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      std::string what = e.what();
      throw Error(BPL_ERR_MISMATCH, "checkpoint file " + file.string() + " does not fit this optimizer: " +
                                        what.substr(0, what.find('\n')));
    }
  }
  if (scheduler != nullptr) {
    torch::serialize::InputArchive archive = read_archive(folder / "scheduler.pt");
    scheduler->load(archive);
  }
  UserContent content;
  if (fs::exists(folder / "user_content.pt")) {
    torch::serialize::InputArchive archive = read_archive(folder / "user_content.pt");
    for (const std::string& key : archive.keys()) {
      c10::IValue value;
      archive.read(key, value);
      content[key] = value;
    }
  }
  return content;
}

}  // namespace backplane::parallel
