#include "handles.h"

#include "error.h"

namespace backplane {

bpl_comm* wrap_comm(bpl_runtime* runtime, bpl_plugin_comm* impl, bool is_world, std::string name, int64_t timeout_ms) {
  auto comm = std::make_unique<bpl_comm>(timeout_ms);
  comm->runtime = runtime;
  comm->impl = impl;
  comm->is_world = is_world;
  bpl_status status = runtime->api().comm_rank_size(impl, &comm->rank, &comm->size);
  if (status != BPL_OK) throw Error(status, "comm_rank_size failed: " + last_error());
  comm->name = std::move(name);
  comm->label = comm->name + " (rank " + std::to_string(comm->rank) + " of " + std::to_string(comm->size) + ")";
  return comm.release();
}

void destroy_comm(bpl_comm* comm) {
  comm->runtime->api().comm_destroy(comm->impl);
  comm->magic = 0;
  delete comm;
}

}  // namespace backplane
