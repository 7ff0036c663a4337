// Sharded checkpoints: who writes what, crash-safe files, completion markers, retention, async saves.
#include "backplane/parallel/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <sstream>

#include "backplane/parallel/distributed.h"

namespace backplane::parallel {
namespace fs = std::filesystem;

namespace {

constexpr const char* kDone = "done";
constexpr const char* kMarker = "checkpoint";

std::string two_digits(int value) {
  char text[16];
  std::snprintf(text, sizeof(text), "%02d", value);
  return text;
}

std::string shard_name(int dp, int tp, int pp) {
  return "dp_rank_" + two_digits(dp) + "_tp_rank_" + two_digits(tp) + "_pp_rank_" + two_digits(pp) + ".pt";
}

// Writes `bytes` to `file` so that `file` is either absent, its old version, or complete: a temporary
// name, fsync, rename.
void write_file_atomically(const fs::path& file, const std::string& bytes) {
  const fs::path temporary = file.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw Error(BPL_ERR_IO, "writing " + temporary.string() + " failed");
  }
  const int fd = ::open(temporary.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    throw Error(BPL_ERR_IO, "syncing " + temporary.string() + " failed");
  }
  ::close(fd);
  fs::rename(temporary, file);
}

std::string serialize(torch::serialize::OutputArchive& archive) {
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

torch::serialize::InputArchive read_archive(const fs::path& file) {
  if (!fs::exists(file)) throw Error(BPL_ERR_NOT_FOUND, "checkpoint file " + file.string() + " does not exist");
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(file.string());
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw Error(BPL_ERR_IO, "checkpoint file " + file.string() + " is corrupt or truncated: " +
                                what.substr(0, what.find('\n')));
  }
  return archive;
}

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
    if (!fs::exists(folder / kDone) && modified(folder / kMarker) < newest_time) remove_tag(folder);
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
    write_file_atomically(folder / kDone, "1");
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
    write_file_atomically(folder / kMarker, "1");
  }
  barrier("to begin the checkpoint");
  fs::create_directories(folder / "model");
  fs::create_directories(folder / "optim");

  // Serialise now (the files hold this step's values even when written later).
  std::vector<std::pair<fs::path, std::string>> files;
  if (model != nullptr && dp == 0) {
    torch::serialize::OutputArchive archive;
    archive.write("__tensor_parallel_size", c10::IValue(static_cast<int64_t>(get_tensor_model_parallel_size())));
    for (const auto& item : model->named_parameters()) archive.write(item.key(), item.value().detach());
    for (const auto& item : model->named_buffers()) archive.write(item.key(), item.value(), /*is_buffer=*/true);
    files.emplace_back(folder / "model" / shard_name(0, tp, pp), serialize(archive));
  }
  if (optimizer != nullptr && (optimizer->zero_one() || dp == 0)) {
    torch::serialize::OutputArchive archive;
    archive.write("__tensor_parallel_size", c10::IValue(static_cast<int64_t>(get_tensor_model_parallel_size())));
    archive.write("__data_parallel_size", c10::IValue(static_cast<int64_t>(get_data_parallel_size())));
    archive.write("__zero_one", c10::IValue(optimizer->zero_one()));
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

UserContent load_checkpoint(const std::string& path, const std::string& tag, torch::nn::Module* model,
                            ParallelOptimizer* optimizer, Stateful* scheduler, bool strict) {
  finalize_checkpoint();
  const fs::path root(path);
  std::string chosen = tag;
  if (chosen.empty()) {
    std::vector<std::string> complete = list_completed_checkpoint_tags(path);
    if (complete.empty()) throw Error(BPL_ERR_NOT_FOUND, "no complete checkpoint under " + path);
    chosen = complete.back();
  }
  const fs::path folder = root / chosen;
  if (!fs::exists(folder / kDone)) {
    throw Error(BPL_ERR_NOT_FOUND, "checkpoint " + folder.string() + " is not complete (no done marker) or does not exist");
  }
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
    const fs::path file = folder / "model" / shard_name(0, tp, pp);
    torch::serialize::InputArchive archive = read_archive(file);
    check_tensor_parallel_size(archive, file);
    at::NoGradGuard no_grad;
    auto load_into = [&](const std::string& name, at::Tensor& target, bool is_buffer) {
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
  if (optimizer != nullptr) {
    const fs::path file = folder / "optim" / shard_name(optimizer->zero_one() ? get_data_parallel_rank() : 0, tp, pp);
    torch::serialize::InputArchive archive = read_archive(file);
    check_tensor_parallel_size(archive, file);
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
