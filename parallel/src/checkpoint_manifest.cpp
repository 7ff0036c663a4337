#include "checkpoint_manifest.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace backplane::parallel::checkpoint_files {
namespace fs = std::filesystem;

namespace {

constexpr const char* kHeader = "backplane checkpoint 1";

}  // namespace

std::string manifest_text(const fs::path& folder, int tensor_parallel_size, int pipeline_parallel_size,
                          const std::vector<std::string>& markers) {
  std::vector<std::string> files;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(folder)) {
    if (!entry.is_regular_file()) continue;
    const std::string relative = entry.path().lexically_relative(folder).generic_string();
    if (std::find(markers.begin(), markers.end(), relative) == markers.end()) files.push_back(relative);
  }
  std::sort(files.begin(), files.end());
  std::ostringstream text;
  text << kHeader << "\ntensor_parallel_size " << tensor_parallel_size << "\npipeline_parallel_size "
       << pipeline_parallel_size << "\n";
  for (const std::string& file : files) text << "file " << file << "\n";
  return text.str();
}

std::optional<Manifest> read_manifest(const fs::path& marker) {
  std::ifstream in(marker);
  std::string line;
  if (!std::getline(in, line) || line != kHeader) return std::nullopt;
  Manifest manifest;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key == "tensor_parallel_size") words >> manifest.tensor_parallel_size;
    if (key == "pipeline_parallel_size") words >> manifest.pipeline_parallel_size;
    if (key == "file") manifest.files.push_back(line.substr(5));
  }
  return manifest;
}

std::string missing_file(const fs::path& folder, const fs::path& marker) {
  const std::optional<Manifest> manifest = read_manifest(marker);
  if (!manifest) return "";
  for (const std::string& file : manifest->files) {
    if (!fs::exists(folder / file)) {
      return "checkpoint " + folder.string() + " is missing " + (folder / file).string() + " (one of the " +
             std::to_string(manifest->files.size()) + " files it was saved with, at tensor_parallel_size " +
             std::to_string(manifest->tensor_parallel_size) + " and pipeline_parallel_size " +
             std::to_string(manifest->pipeline_parallel_size) + ")";
    }
  }
  return "";
}

}  // namespace backplane::parallel::checkpoint_files
