// Ranks on several machines, some sharing one: allreduce, reduce and barrier in two levels, each
// machine's segment and the leaders' Gloo mesh (one rank per machine, its lowest); the other
// collectives over the whole TCP mesh (TcpPath). A failure on either level reaches every rank
// (GlooComm::across_machines).
#include <gloo/allreduce.h>
#include <gloo/barrier.h>

#include "collective_paths.h"
#include "gloo_comm.h"

namespace backplane::gloo_plugin {

void HierarchicalPath::allreduce_work(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op) {
  const plugin::ReduceFn reduce = plugin::reduce_function(acc, op);
  comm_.across_machines([&] {
    if (comm_.machine_shm_) comm_.machine_shm_->allreduce(work, work, count, acc, op, comm_.timeout());
    if (comm_.leaders_) {
      ::gloo::AllreduceOptions options(comm_.leaders_);
      with_element_type(acc, [&](auto zero) { options.setOutput(static_cast<decltype(zero)*>(work), count); });
      options.setReduceFunction(reduce);
      options.setTag(comm_.tag());
      options.setTimeout(comm_.timeout());
      ::gloo::allreduce(options);
    }
    // Sent by the leader, whose wait above is bounded by the timeout: hence twice that here.
    if (comm_.machine_shm_) {
      comm_.machine_shm_->broadcast(work, count * plugin::dtype_size(acc), 0, 2 * comm_.timeout());
    }
  });
}

void HierarchicalPath::barrier() {
  comm_.across_machines([&] {
    if (comm_.machine_shm_) comm_.machine_shm_->barrier(comm_.timeout());
    if (comm_.leaders_) {
      ::gloo::BarrierOptions options(comm_.leaders_);
      options.setTag(comm_.tag());
      options.setTimeout(comm_.timeout());
      ::gloo::barrier(options);
    }
    // Released by the leader, whose wait above is bounded by the timeout: hence twice that here.
    if (comm_.machine_shm_) comm_.machine_shm_->barrier(2 * comm_.timeout());
  });
}

}  // namespace backplane::gloo_plugin
