// Sharded checkpoints in neuronx-distributed's layout (nxd-behaviour.md §7a):
//
//   <path>/<tag>/checkpoint                                  marks the folder as a checkpoint (rank 0, first)
//   <path>/<tag>/model/dp_rank_00_tp_rank_TT_pp_rank_PP.pt   one per TP/PP rank, by data-parallel rank 0
//   <path>/<tag>/lora_adapter/dp_rank_00_tp_rank_TT_pp_rank_PP.pt   a LoRA model's adapter (lora.h), as
//                                                            its LoraConfig says (and adapter_config.json)
//   <path>/<tag>/optim/dp_rank_DD_tp_rank_TT_pp_rank_PP.pt   ZeRO-1: every rank; else data-parallel rank 0 (DD = 00)
//   <path>/<tag>/scheduler.pt, user_content.pt               rank 0
//   <path>/<tag>/done                                        rank 0, last, after every rank finished writing
//
// Only a tag with `done` is complete; the newest complete tag (by the time `done` was written) whose
// files every rank can read intact is what loads by default. Files are LibTorch archives
// (torch::serialize), written under a temporary name ("<file>.tmp.<host>.<pid>") and renamed, so a
// crash at any point leaves the previous complete tag loadable; the temporaries a killed writer left
// are removed by the next save. Each file is followed by "<file>.crc32" (its size and CRC-32), checked
// whenever the file is read.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <map>
#include <string>
#include <vector>

#include "backplane/parallel/lora.h"
#include "backplane/parallel/trainer.h"

namespace backplane::parallel {

// State to checkpoint besides the model and optimizer, such as a learning-rate schedule.
class Stateful {
 public:
  virtual ~Stateful() = default;
  virtual void save(torch::serialize::OutputArchive& archive) const = 0;
  virtual void load(torch::serialize::InputArchive& archive) = 0;
};

// Anything LibTorch can serialise: numbers, strings, tensors, lists, dicts.
using UserContent = std::map<std::string, c10::IValue>;

// Saves a checkpoint; collective over the world (every rank calls it with the same arguments). Null
// pointers are skipped. num_kept_ckpts > 0 keeps that many complete tags, removing older ones (their
// `done` first). async_save: the files are serialised now and written by a background thread; the tag
// becomes complete at the next save_checkpoint, load_checkpoint or finalize_checkpoint.
void save_checkpoint(const std::string& path, const std::string& tag, torch::nn::Module* model,
                     ParallelOptimizer* optimizer, Stateful* scheduler, const UserContent& user_content = {},
                     int num_kept_ckpts = -1, bool async_save = false);

// Loads `tag` into what is given and returns the user content. With an empty tag (collective then:
// every rank calls it) the newest complete tag whose files every rank can read intact: a newer one
// that fails its checksums is named, with the file, on every rank that finds it so, and passed over.
// Errors name the file: a missing or incomplete tag, or no loadable one (BPL_ERR_NOT_FOUND), a file
// that does not match its checksum, or is corrupt or truncated (BPL_ERR_IO), a checkpoint of another
// shape (BPL_ERR_MISMATCH), and with strict, a parameter the checkpoint lacks (BPL_ERR_MISMATCH). A model
// saved at another tensor- or pipeline-parallel size loads all the same: each parameter is put back
// together from the saved partitions and split as this job holds it (the optimizer's state cannot move
// between layouts yet: BPL_ERR_MISMATCH).
UserContent load_checkpoint(const std::string& path, const std::string& tag, torch::nn::Module* model,
                            ParallelOptimizer* optimizer, Stateful* scheduler, bool strict = true);

// Finishes an asynchronous save: waits for its writes, then (collectively) marks it complete and applies
// num_kept_ckpts. A no-op when none is pending. Call it before exiting after an async save.
void finalize_checkpoint();

// Writes the model of checkpoint `path`/`tag` (empty: the newest complete tag) unsharded into `file`:
// every parameter whole (tensor-parallel partitions put back together, padding dropped) and every
// pipeline stage's, by name, nested by module as torch::save writes a module, so that torch::load(module,
// file) reads it into a module of the same names (the model at tensor-parallel size 1, say). A LoRA
// checkpoint's adapter goes in too. One process, no process group: it reads every rank's files.
void export_unsharded_checkpoint(const std::string& path, const std::string& tag, const std::string& file);

// Loads an unsharded file (export_unsharded_checkpoint's, or torch::save of a module of the same names)
// into `model` as this job's layout holds it: each rank takes its partition of each parameter. Error
// (BPL_ERR_MISMATCH) naming a parameter the file lacks (with strict) or whose shape does not fit.
void load_unsharded_checkpoint(const std::string& file, torch::nn::Module& model, bool strict = true);

// `config` with the LoRA fields that shape an adapter (rank, alpha, dropout, bias, target_modules,
// use_rslora, init_lora_weights) as saved with the adapter in `path`/`tag` (empty: the newest complete
// tag), read from this rank's adapter file. Error (BPL_ERR_NOT_FOUND) naming the file if there is none.
LoraConfig saved_lora_config(const std::string& path, const std::string& tag, LoraConfig config);

// Complete tags under `path`, oldest first.
std::vector<std::string> list_completed_checkpoint_tags(const std::string& path);
bool has_checkpoint(const std::string& path);

}  // namespace backplane::parallel
