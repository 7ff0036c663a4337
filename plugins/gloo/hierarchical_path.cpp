// Ranks on several machines, some sharing one: allreduce, reduce and barrier in two levels, each
// machine's segment and the leaders' Gloo mesh (one rank per machine, its lowest); the other
// collectives over the whole TCP mesh (TcpPath). A failure on either level reaches every rank
// (across_machines).
#include <gloo/allreduce.h>
#include <gloo/barrier.h>

#include <algorithm>

#include "collective_paths.h"
#include "gloo_comm.h"

namespace backplane::gloo_plugin {

const char* HierarchicalPath::name_of(bpl_collective op, uint64_t bytes) const {
  if (op == BPL_COLL_ALLREDUCE || op == BPL_COLL_REDUCE || op == BPL_COLL_BARRIER) return "hierarchical";
  return TcpPath::name_of(op, bytes);
}

void HierarchicalPath::add_connection_ends(std::map<std::string, int>& peer_of_end) const {
  if (!leaders_) return;
  for (int m = 0; m < leaders_->size; ++m) {
    if (m == leaders_->rank || !leaders_->getPair(m)) continue;
    peer_of_end[leaders_->getPair(m)->address().str()] = comm_.peers_.first_rank_on(m);
  }
}

void HierarchicalPath::across_machines(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    const auto* own = dynamic_cast<const Error*>(&e);
    // A failure another rank of this machine put in the machine's segment is that rank's to record in
    // the store: repeating it would only wait on a store that may be unreachable (a partition).
    const bool told_by_this_machine = own != nullptr && machine_segment_ && machine_segment_->failed_by_another_rank();
    if (told_by_this_machine) comm_.failed_ = true;
    Error error = told_by_this_machine ? *own
                  : own != nullptr     ? comm_.recorded_failure(own->status(), own->what())
                                       : comm_.failure(e);
    if (machine_segment_) machine_segment_->fail(error.status(), error.what());
    comm_.shut_down_connections();
    throw error;
  }
}

void HierarchicalPath::allreduce_work(void* work, size_t count, bpl_dtype acc, bpl_reduce_op op) {
  const plugin::ReduceFn reduce = plugin::reduce_function(acc, op);
  across_machines([&] {
    if (machine_segment_) machine_segment_->allreduce(work, work, count, acc, op, comm_.timeout());
    if (leaders_) {
      ::gloo::AllreduceOptions options(leaders_);
      with_element_type(acc, [&](auto zero) { options.setOutput(static_cast<decltype(zero)*>(work), count); });
      options.setReduceFunction(reduce);
      options.setTag(comm_.tag());
      options.setTimeout(comm_.timeout());
      ::gloo::allreduce(options);
    }
    // Sent by the leader, whose wait above is bounded by the timeout: hence twice that here.
    if (machine_segment_) {
      machine_segment_->broadcast(work, count * plugin::dtype_size(acc), 0, 2 * comm_.timeout());
    }
  });
}

void HierarchicalPath::barrier() {
  across_machines([&] {
    if (machine_segment_) machine_segment_->barrier(comm_.timeout());
    if (leaders_) {
      ::gloo::BarrierOptions options(leaders_);
      options.setTag(comm_.tag());
      options.setTimeout(comm_.timeout());
      ::gloo::barrier(options);
    }
    // Released by the leader, whose wait above is bounded by the timeout: hence twice that here.
    if (machine_segment_) machine_segment_->barrier(2 * comm_.timeout());
  });
}

}  // namespace backplane::gloo_plugin
