// The done marker of a complete checkpoint, which rank 0 writes once every rank's files are on disk:
// the layout it was saved at and every file it holds. Loading takes the layout from it, never from the
// files present, and names a listed file that is gone. A marker of an older checkpoint ("1") holds
// neither: its layout is then read from its files, as before.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace backplane::parallel::checkpoint_files {

struct Manifest {
  int tensor_parallel_size = 0;
  int pipeline_parallel_size = 0;
  std::vector<std::string> files;  // relative to the checkpoint's folder
};

// The marker's text for `folder` now: its files (every regular file below it but the markers).
std::string manifest_text(const std::filesystem::path& folder, int tensor_parallel_size, int pipeline_parallel_size,
                          const std::vector<std::string>& markers);

// The manifest in `marker` (a checkpoint's done file); nothing for an older marker or none.
std::optional<Manifest> read_manifest(const std::filesystem::path& marker);

// What is wrong with the checkpoint in `folder` whose manifest is `marker`: "" when every file it lists
// is there (or it lists none), else a sentence naming the first missing file.
std::string missing_file(const std::filesystem::path& folder, const std::filesystem::path& marker);

}  // namespace backplane::parallel::checkpoint_files
