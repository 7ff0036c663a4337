// The gloo communicator's collectives, each run on the path chosen when the communicator was made
// (collective_paths.h), and its split.
#include "gloo_comm.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "fingerprint.h"
#include "plugin_support.h"

namespace backplane::gloo_plugin {

// Each collective runs, under the identity the core gave it (submit), on the path chosen when the
// communicator was made.
void GlooComm::run_allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) {
  if (count > 0) path_->allreduce(send, recv, count, dtype, op);
}

void GlooComm::run_broadcast(void* buf, size_t count, bpl_dtype dtype, int root) {
  if (count > 0) path_->broadcast(buf, count * plugin::dtype_size(dtype), root);
}

void GlooComm::run_reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) {
  if (count > 0) path_->reduce(send, recv, count, dtype, op, root);
}

void GlooComm::run_allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  if (count > 0) path_->allgather(send, recv, count * plugin::dtype_size(dtype));
}

void GlooComm::run_reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) {
  if (recvcount > 0) path_->reduce_scatter(send, recv, recvcount, dtype, op);
}

void GlooComm::run_alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) {
  if (count > 0) path_->alltoall(send, recv, count * plugin::dtype_size(dtype));
}

void GlooComm::run_barrier() {
  path_->barrier();
}

std::unique_ptr<GlooComm> GlooComm::run_split(int color, int key) {
  // Every rank learns every (color, key), then each group connects its own mesh under a store prefix
  // that all its members derive alike: parent uid / the split's number (the core's) / color.
  const int n = size();
  std::vector<int64_t> mine = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  run_allgather(mine.data(), all.data(), 2, BPL_DTYPE_I64);
  if (color < 0) return nullptr;

  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  return std::make_unique<GlooComm>(shared_, uid_ + "/" + std::to_string(current_.sequence) + "/" + std::to_string(color),
                                    new_rank, static_cast<int>(members.size()), timeout());
}

const char* GlooComm::path_of(bpl_collective op, uint64_t bytes) const { return path_->name_of(op, bytes); }

void GlooComm::run_gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) {
  path_->gather(send, recv, count * plugin::dtype_size(dtype), root);
}

void GlooComm::run_scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) {
  path_->scatter(send, recv, count * plugin::dtype_size(dtype), root);
}

void GlooComm::run_allgatherv(const void* send, size_t sendcount, void* recv, const plugin::Counts& recvcounts,
                              const plugin::Counts& displs, bpl_dtype dtype) {
  const size_t element = plugin::dtype_size(dtype);
  path_->allgatherv(send, sendcount * element, recv, plugin::in_bytes(recvcounts, element), plugin::in_bytes(displs, element),
                    current_.pairing);
}

void GlooComm::run_alltoallv(const void* send, const plugin::Counts& sendcounts, const plugin::Counts& sdispls, void* recv,
                             const plugin::Counts& recvcounts, const plugin::Counts& rdispls, bpl_dtype dtype) {
  const size_t element = plugin::dtype_size(dtype);
  path_->alltoallv(send, plugin::in_bytes(sendcounts, element), plugin::in_bytes(sdispls, element), recv,
                   plugin::in_bytes(recvcounts, element), plugin::in_bytes(rdispls, element), current_.pairing);
}

}  // namespace backplane::gloo_plugin
