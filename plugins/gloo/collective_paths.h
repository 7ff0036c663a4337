// How a Gloo communicator's collectives travel, chosen once when the communicator is made
// (GlooComm::set_up_shared_memory) and never re-decided per call:
//
//   ShmPath           every rank on this machine: one shared-memory segment (ShmGroup)
//   HierarchicalPath  ranks on several machines, some sharing one: allreduce, reduce and barrier in two
//                     levels (each machine's segment, then the leaders' Gloo mesh); the others as TCP
//   TcpPath           Gloo's collectives over the communicator's TCP mesh (also a world of one)
//
// A path runs a collective that GlooComm has already numbered (begin) and found non-empty. Reductions
// run in the accumulation dtype (dtypes.h): when it differs from the caller's, the data is widened
// into the communicator's scratch, reduced, divided for AVG, and narrowed once at the end.
#pragma once

#include <cstddef>
#include <utility>

#include "backplane/plugin.h"
#include "dtypes.h"

namespace backplane::gloo_plugin {

// Calls fn(T{}) with T a type of `dtype`'s size, for Gloo options that only need the element size.
template <typename Fn>
void with_element_type(bpl_dtype dtype, Fn&& fn) {
  plugin::visit_dtype(dtype, std::forward<Fn>(fn));
}

class GlooComm;

class CollectivePath {
 public:
  explicit CollectivePath(GlooComm& comm) : comm_(comm) {}
  virtual ~CollectivePath() = default;
  CollectivePath(const CollectivePath&) = delete;
  CollectivePath& operator=(const CollectivePath&) = delete;

  virtual void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) = 0;
  virtual void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void allgather(const void* send, void* recv, size_t block) = 0;
  virtual void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) = 0;
  virtual void alltoall(const void* send, void* recv, size_t block) = 0;
  virtual void barrier() = 0;

 protected:
  // `send` in the accumulation dtype `acc`: widened into scratch slot 0, or copied there (`work` may
  // be given instead, a buffer of the caller's own that is not `send`).
  void* accumulation_copy(const void* send, bpl_dtype dtype, bpl_dtype acc, size_t count, void* work = nullptr);
  // Where a reduce accumulates: `recv` on the root when no widening is needed, else scratch (Gloo's
  // reduce uses its buffer as scratch on every rank, so non-roots never reduce in `recv`).
  void* reduce_work(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_dtype acc, int root);

  GlooComm& comm_;
};

class ShmPath : public CollectivePath {
 public:
  using CollectivePath::CollectivePath;
  void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) override;
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t block) override;
  void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) override;
  void alltoall(const void* send, void* recv, size_t block) override;
  void barrier() override;
};

class TcpPath : public CollectivePath {
 public:
  using CollectivePath::CollectivePath;
  void allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op) override;
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t block) override;
  void reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op) override;
  void alltoall(const void* send, void* recv, size_t block) override;
  void barrier() override;

 protected:
  // The reductions proper, on `work` in the accumulation dtype; the hierarchical path replaces them.
  virtual void allreduce_work(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op);
  virtual void reduce_work_to_root(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op, int root);
};

class HierarchicalPath : public TcpPath {
 public:
  using TcpPath::TcpPath;
  void barrier() override;

 protected:
  // Within each machine through its segment, between machines over the leaders' mesh, then from each
  // leader back to its machine: every rank ends with the leaders' result, bit-identical everywhere.
  void allreduce_work(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op) override;
  void reduce_work_to_root(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op, int) override {
    allreduce_work(work, count, acc, op);
  }
};

}  // namespace backplane::gloo_plugin
