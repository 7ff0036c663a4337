// Model-parallel state: neuronx-distributed's tensor/pipeline/data-parallel groups over the world.
//
// Layout (nxd-behaviour.md §2): ranks = arange(world).reshape(PP, DP, TP), so tensor-parallel ranks are
// contiguous, data-parallel ranks have stride TP and pipeline ranks stride DP*TP. World 8, TP 2, PP 2:
// TP [[0,1],[2,3],[4,5],[6,7]], DP [[0,2],[1,3],[4,6],[5,7]], PP [[0,4],[1,5],[2,6],[3,7]].
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backplane/parallel/process_group.h"

namespace backplane::parallel {

using Groups = std::vector<std::vector<int>>;

// Every group of every kind, for a world of `world_size` ranks. Pure: computable without processes.
struct GroupLayout {
  int world_size = 1;
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  int data_parallel_size = 1;
  Groups tensor_parallel;
  Groups data_parallel;
  Groups pipeline_parallel;
};

// Sizes above the world size are clamped to it, as neuronx-distributed does. Error (naming the values)
// for sizes < 1, or when tp * pp does not divide the world size ("invalid implied data parallel degree").
GroupLayout compute_group_layout(int world_size, int tensor_parallel_size, int pipeline_parallel_size = 1);

// Builds this rank's TP, DP and PP groups with bpl_comm_split; every rank of the world must call it
// with the same sizes. Initialises the process group from the environment first if needed. Error if
// already initialised (destroy_model_parallel first).
void initialize_model_parallel(int tensor_model_parallel_size = 1, int pipeline_model_parallel_size = 1);
bool model_parallel_is_initialized();
// Releases the groups. Groups still held elsewhere stay usable until destroy_process_group.
void destroy_model_parallel();

// What the parallel layers call: the state if initialised; otherwise, warning once that `who` was
// built without initialize_model_parallel, a world-1 state (starting a one-rank process group if none).
void ensure_model_parallel_initialized(const char* who);

// Getters: Error unless model_parallel_is_initialized().
GroupLayout get_group_layout();
std::shared_ptr<ProcessGroup> get_tensor_model_parallel_group();
std::shared_ptr<ProcessGroup> get_data_parallel_group();
std::shared_ptr<ProcessGroup> get_pipeline_model_parallel_group();
int get_tensor_model_parallel_size();
int get_tensor_model_parallel_rank();
int get_data_parallel_size();
int get_data_parallel_rank();
int get_pipeline_model_parallel_size();
int get_pipeline_model_parallel_rank();
// The global rank of TP rank 0 of this rank's TP group, and of DP rank 0 of its DP group.
int get_tensor_model_parallel_src_rank();
int get_data_parallel_src_rank();
// The global ranks of the next and previous pipeline stages (wrapping around).
int get_pipeline_model_parallel_next_rank();
int get_pipeline_model_parallel_prev_rank();

// "[rank_<g>_pp<p>_tp<t>_dp<d>_cp0]", the prefix of neuronx-distributed's log lines; -1 for what is not
// initialised yet.
std::string rank_prefix();
// rank_prefix() + " " + message.
std::string rmsg(const std::string& message);

}  // namespace backplane::parallel
