// The frontend's distributed environment: one backplane runtime per process and its world group, the
// counterpart of torch.distributed's init_process_group. The backend comes from the environment as for
// any backplane program (BPL_BACKEND > NXD_CPU_MODE > auto), so one binary runs in CPU mode under
// `NXD_CPU_MODE=1 bpl-run …` and on the accelerator otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backplane/backplane.h"
#include "backplane/parallel/process_group.h"

namespace backplane::parallel {

struct InitOptions {
  std::string backend;      // "" : from the environment
  int rank = -1;            // -1 : from the launcher's environment
  int world_size = -1;      // -1 : from the launcher's environment
  int64_t timeout_ms = -1;  // -1 : BPL_TIMEOUT_MS, else backplane's default
};

// Starts the backend and joins the job. Error if already initialised, or with bpl_init's status and
// message (unknown backend, rendezvous timeout, …). A process started to replace a failed one
// (BPL_JOIN=1: bpl-run --replace starts it so) waits here until the job's members admit it (an
// ElasticTrainer's recovery, or ProcessGroup::grow on the world); its world is then theirs.
void init_process_group(const InitOptions& options = {});
bool is_initialized();
// Destroys the model-parallel state, then leaves the job. Groups still held elsewhere become closed:
// using one throws. A no-op when not initialised.
void destroy_process_group();

// Error unless initialised.
std::shared_ptr<ProcessGroup> get_world_group();
// Whether this process was admitted into a running job by init_process_group (BPL_JOIN=1).
bool joined_running_job();
int get_rank();
int get_world_size();
// The loaded backend's name ("gloo", "mpi", "neuron").
std::string get_backend();
// The runtime, for calls to backplane.h (kernels, programs, device queries). Owned by the frontend.
bpl_runtime* get_runtime();
}  // namespace backplane::parallel
