// What checkpoint.cpp (saving, loading, retention), checkpoint_lora.cpp and checkpoint_layouts.cpp
// (across layouts, unsharded files) share: the files' names and how they are written and read
// (checkpoint_files.cpp).
#pragma once

#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <filesystem>
#include <functional>
#include <string>
#include <utility>

#include "backplane/parallel/trainer.h"

namespace backplane::parallel::checkpoint_files {

// The model's files; a LoRA adapter's, apart from its base model's.
inline constexpr const char* kModelDir = "model";
inline constexpr const char* kLoraDir = "lora_adapter";
// A tag's completion marker, written last (rank 0), with the manifest.
inline constexpr const char* kDone = "done";

// "dp_rank_DD_tp_rank_TT_pp_rank_PP.pt".
std::string shard_name(int dp, int tp, int pp);
// Writes `bytes` to `file` so that `file` is either absent, its old version, or complete: a temporary
// name ("<file>.tmp.<host>.<pid>"), fsync, rename.
void write_bytes_atomically(const std::filesystem::path& file, const std::string& bytes);
// The file (as write_bytes_atomically), then "<file>.crc32" with its size and CRC-32.
void write_file_atomically(const std::filesystem::path& file, const std::string& bytes);
// Removes the temporaries that writers of this host left in `folder` (and its model/, lora_adapter/ and
// optim/) when they were killed.
void remove_stale_temporaries(const std::filesystem::path& folder);
// Why `file` cannot be trusted ("" when it can): missing, or not what its checksum says (`bytes`: its
// contents, when read already).
std::string integrity_problem(const std::filesystem::path& file, const std::string* bytes = nullptr);
// The tensor- and pipeline-parallel sizes the files of `dir` (a model/, lora_adapter/ or optim/ folder)
// were saved at, from the data-parallel rank 0 files there; (0, 0) without files.
std::pair<int, int> saved_layout(const std::filesystem::path& dir);
std::string serialize(torch::serialize::OutputArchive& archive);
// A checkpoint file, verified against its checksum, as an archive. Error naming the file: missing
// (BPL_ERR_NOT_FOUND), corrupt or truncated (BPL_ERR_IO).
torch::serialize::InputArchive read_archive(const std::filesystem::path& file);

// Writes, for each partitioned parameter of `model`, how its partitions make the whole tensor
// ("__partition.<name>": partition dim, stride, unpadded size or -1, reshardable), the layout
// ("__pipeline_parallel_size") and the submodules' names ("__modules"), so that a job of another layout
// can load the file and an unsharded export has the module tree torch::load reads.
void write_layout(torch::serialize::OutputArchive& archive, torch::nn::Module& model);

// A LoRA adapter's configuration, as "__lora_<field>" entries of its files (checkpoint_lora.cpp; read
// back by saved_lora_config).
void write_lora_config(torch::serialize::OutputArchive& archive, const LoraConfig& config);

// Loads the model files of `dir` (a checkpoint's model/ or lora_adapter/ folder) saved at another
// tensor- or pipeline-parallel size into `model`: every parameter put back together from the saved
// partitions, then split as this job's layout holds it. Only names `wanted` accepts; with `strict`,
// each of them must be in the checkpoint.
void load_across_layouts(const std::filesystem::path& dir, torch::nn::Module& model, bool strict,
                         const std::function<bool(const std::string&)>& wanted);

// For an optimizer without ZeRO-1: the names of its parameters, in its order ("__param_names", matched
// to `model`'s by identity), and their partitions, so that its state can load at another layout.
void write_optimizer_layout(torch::serialize::OutputArchive& archive, torch::nn::Module& model,
                            const ParallelOptimizer& optimizer);

// Loads the state of an optimizer without ZeRO-1 saved at another layout (the files of `dir`, a
// checkpoint's optim/ folder) into `optimizer`, whose parameters are `model`'s: each parameter's state
// tensors put back together and split as its parameter is; its scalars (step counts) as saved. Adam,
// AdamW, SGD, RMSprop and Adagrad; Error (BPL_ERR_MISMATCH) for a ZeRO-1 state or another optimizer.
void load_optimizer_across_layouts(const std::filesystem::path& dir, torch::nn::Module& model,
                                   ParallelOptimizer& optimizer);

}  // namespace backplane::parallel::checkpoint_files
