// The operations torch expects of a CPU backend that backplane composes from others: monitored_barrier
// through the group's store, and all_reduce of sparse tensors from allgathers of their entries.
#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend.h"
#include "tensor_arguments.h"

namespace backplane::torch_backend {

namespace {
// An exception's message; a c10::Error's (the store's) without its C++ backtrace.
std::string message_of(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  return error != nullptr ? error->what_without_backtrace() : e.what();
}
}  // namespace

// As torch's Gloo does it, with the group's store for messages: every rank other than 0 reports its
// arrival and waits for rank 0's word that all arrived; rank 0 waits for each rank's report within the
// timeout, and names those that did not come (the first, or with wait_all_ranks every one). The store,
// not the communicator, carries it, so that a rank missing here leaves the group's communicator usable.
void BackendBackplane::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const std::chrono::milliseconds timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const std::string prefix = "backplane/monitored_barrier/" + std::to_string(monitored_barriers_++) + "/";
  const std::string passed = prefix + "passed";
  const int rank = getRank(), size = getSize();
  if (rank != 0) {
    store_->set(prefix + std::to_string(rank), std::vector<uint8_t>{1});
    try {
      store_->wait({passed}, timeout);
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistBackendError, "backplane: Rank " + std::to_string(rank) +
                                      " successfully reached monitoredBarrier, but received errors while waiting for"
                                      " send/recv from rank 0 (" + message_of(e) +
                                      "). Please check rank 0 logs for faulty rank.");
    }
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> missing;
  for (int r = 1; r < size; ++r) {
    const auto left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    if (left <= std::chrono::milliseconds(0) && !wait_all_ranks) {
      C10_THROW_ERROR(DistBackendError, "backplane: Rank 0 timed out in monitoredBarrier after " +
                                      std::to_string(timeout.count()) + " ms, before rank " + std::to_string(r) +
                                      " (of " + std::to_string(size) + ") was waited for");
    }
    const std::string key = prefix + std::to_string(r);
    try {
      if (left > std::chrono::milliseconds(0)) {
        store_->wait({key}, left);
      } else if (!store_->check({key})) {
        missing.push_back(r);
      }
    } catch (const std::exception&) {
      missing.push_back(r);
      if (!wait_all_ranks) break;
    }
  }
  if (!missing.empty()) {
    std::string ranks;
    for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    C10_THROW_ERROR(DistBackendError, "backplane: " + std::string(missing.size() == 1 ? "Rank " : "Ranks ") + ranks +
                                    " failed to pass monitoredBarrier in " + std::to_string(timeout.count()) + " ms");
  }
  store_->set(passed, std::vector<uint8_t>{1});
}

// The tensors summed here, then every rank's coalesced entries gathered (their counts first, then indices
// and values as allgatherv), summed as one sparse tensor (coalesce adds the entries at the same index);
// the result replaces every tensor's contents on every rank, as with torch's Gloo. SUM only, as there.
c10::intrusive_ptr<c10d::Work> BackendBackplane::sparse_allreduce(const std::vector<at::Tensor>& tensors,
                                                                  const c10d::AllreduceOptions& opts) {
  const char* op_name = "allreduce (sparse)";
  if (opts.reduceOp != c10d::ReduceOp::SUM) fail(std::string(op_name) + ": sparse tensors are reduced with SUM only");
  at::Tensor local;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].is_sparse() || tensors[i].layout() != at::kSparse) {
      fail(std::string(op_name) + ": tensor " + std::to_string(i) + " is not a sparse COO tensor: the tensors of a call "
                                  "are all sparse or all dense");
    }
    if (i > 0 && tensors[i].sizes() != tensors[0].sizes()) {
      fail(std::string(op_name) + ": invalid tensor size at index " + std::to_string(i));
    }
    local = i == 0 ? tensors[0] : local + tensors[i];
  }
  const at::Tensor input = local.coalesce();
  const at::Tensor indices = input._indices().t().contiguous();  // nnz rows of sparse_dim indices
  const at::Tensor values = input._values().contiguous();        // nnz rows of the dense part
  const bpl_dtype value_dtype = dtype_of(values, op_name);
  const int size = getSize();
  const int64_t sparse_dim = input.sparse_dim();
  int64_t row = 1;  // elements of a value row
  for (int64_t d = 1; d < values.dim(); ++d) row *= values.size(d);
  int64_t nnz = input._nnz();
  std::vector<int64_t> counts(static_cast<size_t>(size));
  check(bpl_allgather(comm_, &nnz, counts.data(), 1, BPL_DTYPE_I64, nullptr), "bpl_allgather (sparse entry counts)");
  int64_t total = 0;
  std::vector<int64_t> index_counts, index_displs, value_counts, value_displs;
  for (int64_t c : counts) {
    index_counts.push_back(c * sparse_dim);
    index_displs.push_back(total * sparse_dim);
    value_counts.push_back(c * row);
    value_displs.push_back(total * row);
    total += c;
  }
  std::vector<int64_t> value_shape = values.sizes().vec();
  value_shape[0] = total;
  at::Tensor all_indices = at::empty({total, sparse_dim}, indices.options());
  at::Tensor all_values = at::empty(value_shape, values.options());
  const int me = getRank();
  return post_each(
      {c10d::OpType::ALLREDUCE, op_name, tensors}, 2,
      [&](int i, bpl_request** req) {
        return i == 0 ? bpl_allgatherv(comm_, indices.data_ptr(), index_counts[me], all_indices.data_ptr(),
                                       index_counts.data(), index_displs.data(), BPL_DTYPE_I64, req)
                      : bpl_allgatherv(comm_, values.data_ptr(), value_counts[me], all_values.data_ptr(),
                                       value_counts.data(), value_displs.data(), value_dtype, req);
      },
      [tensors, all_indices, all_values] {
        at::Tensor sum = at::sparse_coo_tensor(all_indices.t(), all_values, tensors[0].sizes()).coalesce();
        for (const at::Tensor& t : tensors) const_cast<at::Tensor&>(t).copy_(sum);
      },
      tensors, {indices, values, all_indices, all_values});
}

}  // namespace backplane::torch_backend
