// A LoRA adapter's configuration in its checkpoint files: written beside the adapter's weights, read
// back to rebuild the adapters it was saved with.
#include <torch/serialize/archive.h>

#include <filesystem>
#include <string>

#include "backplane/parallel/checkpoint.h"
#include "backplane/parallel/distributed.h"
#include "checkpoint_files.h"

namespace backplane::parallel {
namespace fs = std::filesystem;
using namespace checkpoint_files;

void checkpoint_files::write_lora_config(torch::serialize::OutputArchive& archive, const LoraConfig& config) {
  archive.write("__lora_rank", c10::IValue(static_cast<int64_t>(config.lora_rank)));
  archive.write("__lora_alpha", c10::IValue(config.lora_alpha));
  archive.write("__lora_dropout", c10::IValue(config.lora_dropout));
  archive.write("__lora_bias", c10::IValue(config.bias));
  archive.write("__lora_target_modules", c10::IValue(c10::List<std::string>(config.target_modules)));
  archive.write("__lora_use_rslora", c10::IValue(config.use_rslora));
  archive.write("__lora_init_lora_weights", c10::IValue(config.init_lora_weights));
}

LoraConfig saved_lora_config(const std::string& path, const std::string& tag, LoraConfig config) {
  const std::vector<std::string> complete = list_completed_checkpoint_tags(path);
  if (tag.empty() && complete.empty()) throw Error(BPL_ERR_NOT_FOUND, "no complete checkpoint under " + path);
  const fs::path file = fs::path(path) / (tag.empty() ? complete.back() : tag) / kLoraDir /
                        shard_name(0, get_tensor_model_parallel_rank(), get_pipeline_model_parallel_rank());
  if (!fs::exists(file)) throw Error(BPL_ERR_NOT_FOUND, "no LoRA adapter in the checkpoint: " + file.string() + " does not exist");
  torch::serialize::InputArchive archive = read_archive(file);
  c10::IValue value;
  archive.read("__lora_rank", value);
  config.lora_rank = static_cast<int>(value.toInt());
  archive.read("__lora_alpha", value);
  config.lora_alpha = value.toDouble();
  archive.read("__lora_dropout", value);
  config.lora_dropout = value.toDouble();
  archive.read("__lora_bias", value);
  config.bias = value.toStringRef();
  archive.read("__lora_target_modules", value);
  config.target_modules.clear();
  for (const auto& name : value.toListRef()) config.target_modules.push_back(name.toStringRef());
  archive.read("__lora_use_rslora", value);
  config.use_rslora = value.toBool();
  archive.read("__lora_init_lora_weights", value);
  config.init_lora_weights = value.toStringRef();
  return config;
}

}  // namespace backplane::parallel
