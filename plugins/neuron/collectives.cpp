#include "collectives.h"

#include <algorithm>
#include <thread>

#include "plugin_support.h"
#include "runtime.h"

namespace backplane::neuron_plugin {

using plugin::Error;

namespace {

NrtReduceOp runtime_op(bpl_reduce_op op) {
  switch (op) {
    case BPL_OP_SUM: return kNrtOpAdd;
    case BPL_OP_MIN: return kNrtOpMin;
    case BPL_OP_MAX: return kNrtOpMax;
    default:
      throw Error(BPL_ERR_UNSUPPORTED, "the Neuron runtime's collectives have no reduce op " + std::to_string(op) +
                                           " (sum, min and max only)");
  }
}

NrtDtype runtime_dtype(bpl_dtype dtype) {
  const NrtDtype code = nrt_dtype(dtype);
  if (code == kNrtDtypeInvalid) {
    throw Error(BPL_ERR_UNSUPPORTED, "the Neuron runtime's collectives have no dtype " + std::to_string(dtype));
  }
  return code;
}

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

bpl_plugin_request* wrap(Request* request) { return reinterpret_cast<bpl_plugin_request*>(request); }

}  // namespace

/* ---- requests ---- */

Request::Request(NeuronComm& comm, const char* op) : PolledRequest(op, comm.timeout(), 0), comm_(comm) {}

std::chrono::milliseconds Request::timeout() const { return comm_.timeout(); }

void Request::expire() {
  // The tensors stay: the runtime may still use them.
  expired(BPL_ERR_TIMEOUT, std::string(op()) + " did not complete within " + std::to_string(comm_.timeout().count()) +
                               " ms, the communicator's timeout (NeuronCore " + std::to_string(comm_.core().core) + ")");
}

void Request::end(bpl_status status, const std::string& message) {
  finish(status, message);
  tensors_.clear();
  deliver_ = nullptr;
}

void Request::poll() {
  bool completed = false;
  const int status = comm_.core().api.nrta_is_completed(sequence_, &completed);
  if (status != kNrtSuccess) {
    return end(to_bpl_status(status), std::string(op()) + ": nrta_is_completed failed: " + nrt_status_name(status));
  }
  if (!completed) return;
  // The runtime records a failed request in the error tracker, by sequence number.
  const NrtaError* errors = nullptr;
  size_t count = 0;
  int failure = kNrtSuccess;
  if (comm_.core().api.nrta_error_tracker_get_list(comm_.errors(), &errors, &count) == kNrtSuccess) {
    for (size_t i = 0; i < count; ++i) {
      if (errors[i].seq_id == sequence_) failure = static_cast<int>(errors[i].error_code);
    }
  }
  if (failure != kNrtSuccess) {
    return end(to_bpl_status(failure), std::string(op()) + " failed in the Neuron runtime: " + nrt_status_name(failure));
  }
  try {
    if (deliver_) deliver_();
    end(BPL_OK, "");
  } catch (const Error& e) {
    end(e.status(), std::string(op()) + ": " + e.what());
  }
}

bpl_status Request::free(std::unique_ptr<Request> request) {
  return PolledRequest::free(std::move(request), [](std::unique_ptr<Request> kept) { kept->comm().abandon(std::move(kept)); });
}

/* ---- communicators ---- */

NeuronComm::NeuronComm(NeuronCore& core, nrta_error_tracker_t* errors, std::vector<uint32_t> group, int rank,
                       int world_rank, int world_size, std::chrono::milliseconds timeout)
    : core_(core), errors_(errors), group_(std::move(group)), timeout_ms_(timeout.count()) {
  cc_.replica_group = group_.data();
  cc_.rank = static_cast<uint32_t>(rank);
  cc_.rank_n = static_cast<uint32_t>(group_.size());
  cc_.ctx_device_id = static_cast<uint32_t>(world_rank);
  cc_.ctx_device_count = static_cast<uint32_t>(world_size);
  cc_.vnc = static_cast<uint32_t>(core.vnc);
}

NeuronComm::~NeuronComm() = default;

void NeuronComm::abandon(std::unique_ptr<Request> request) {
  std::lock_guard<std::mutex> lock(abandoned_mutex_);
  abandoned_.push_back(std::move(request));
}

void NeuronComm::run(const char* name, NrtCollective collective, const void* in, size_t in_bytes, size_t out_bytes,
                     Delivery delivery, bpl_dtype dtype, bpl_reduce_op op, bpl_plugin_request** req) {
  auto request = std::make_unique<Request>(*this, name);
  if (in_bytes > 0) {
    const NrtDtype code = runtime_dtype(dtype);
    const NrtReduceOp reduction = collective == kNrtCcAllgather ? kNrtOpAdd : runtime_op(op);
    request->tensors_.push_back(tensor_for_input(core_, in, in_bytes, "send buffer"));
    nrt_tensor_t* input = request->tensors_.back().get();
    // The output is the caller's device memory itself when it is exactly that and not also the input;
    // otherwise a device tensor the result is copied out of once the collective has run.
    const bool direct = delivery.ptr != nullptr && delivery.offset == 0 && delivery.bytes == out_bytes &&
                        core_.memory.find(delivery.ptr) && !overlap(delivery.ptr, delivery.bytes, in, in_bytes);
    if (direct) {
      request->tensors_.push_back(tensor_for_input(core_, delivery.ptr, delivery.bytes, "recv buffer"));
    } else {
      request->tensors_.push_back(allocate_device_tensor(core_, out_bytes, "staged result"));
      nrt_tensor_t* output = request->tensors_.back().get();
      if (delivery.ptr != nullptr) {
        request->deliver_ = [this, output, delivery] {
          copy_out(core_, output, delivery.offset, delivery.ptr, delivery.bytes, "recv buffer");
        };
      }
    }
    nrt_tensor_t* output = request->tensors_.back().get();
    NrtTensorList inputs{&input, 1}, outputs{&output, 1};
    nrt_cc_context_t* context = nullptr;
    check_nrt(core_.api.nrta_cc_prepare(&cc_, &inputs, &outputs, code, reduction, collective, &context),
              std::string("nrta_cc_prepare for ") + name);
    check_nrt(core_.api.nrta_cc_schedule(&context, 0, errors_, &request->sequence_),
              std::string("nrta_cc_schedule for ") + name);
    request->scheduled_ = true;
  } else {
    request->end(BPL_OK, "");  // no elements: nothing to run
  }
  if (req != nullptr) {
    request->start_clock();
    *req = wrap(request.release());
    return;
  }
  try {
    request->wait(timeout() + std::chrono::milliseconds(1));  // its own deadline comes first
  } catch (const Error&) {
    if (request->owned_by_backend()) abandon(std::move(request));
    throw;
  }
}

void NeuronComm::allreduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op,
                           bpl_plugin_request** req) {
  const size_t bytes = count * plugin::dtype_size(dtype);
  run("allreduce", kNrtCcAllreduce, send, bytes, bytes, Delivery{recv, bytes, 0}, dtype, op, req);
}

void NeuronComm::reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_reduce_op op, int root,
                        bpl_plugin_request** req) {
  const size_t bytes = count * plugin::dtype_size(dtype);
  run("reduce", kNrtCcAllreduce, send, bytes, bytes, Delivery{rank() == root ? recv : nullptr, bytes, 0}, dtype, op,
      req);
}

void NeuronComm::broadcast(void* buf, size_t count, bpl_dtype dtype, int root, bpl_plugin_request** req) {
  // The runtime has no broadcast: every rank gathers every block and keeps the root's, bit for bit.
  const size_t bytes = count * plugin::dtype_size(dtype);
  run("broadcast", kNrtCcAllgather, buf, bytes, bytes * size(),
      Delivery{buf, bytes, bytes * static_cast<size_t>(root)}, dtype, 0, req);
}

void NeuronComm::allgather(const void* send, void* recv, size_t count, bpl_dtype dtype, bpl_plugin_request** req) {
  const size_t bytes = count * plugin::dtype_size(dtype);
  run("allgather", kNrtCcAllgather, send, bytes, bytes * size(), Delivery{recv, bytes * size(), 0}, dtype, 0, req);
}

void NeuronComm::reduce_scatter(const void* send, void* recv, size_t recvcount, bpl_dtype dtype, bpl_reduce_op op,
                                bpl_plugin_request** req) {
  const size_t bytes = recvcount * plugin::dtype_size(dtype);
  run("reduce_scatter", kNrtCcReduceScatter, send, bytes * size(), bytes, Delivery{recv, bytes, 0}, dtype, op, req);
}

void NeuronComm::barrier(bpl_plugin_request** req) {
  // A one-element allreduce, as the runtime's own nrt_barrier does (the element is staged at once).
  const int32_t token = 0;
  run("barrier", kNrtCcAllreduce, &token, sizeof(int32_t), sizeof(int32_t),
      Delivery{nullptr, 0, 0}, BPL_DTYPE_I32, BPL_OP_SUM, req);
}

std::unique_ptr<NeuronComm> NeuronComm::split(int color, int key) {
  // Every member learns every (color, key) through the runtime's allgather.
  const int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(size()));
  allgather(mine, all.data(), 2, BPL_DTYPE_I32, nullptr);
  if (color < 0) return nullptr;
  std::vector<int> members;
  for (int r = 0; r < size(); ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  std::vector<uint32_t> group;
  int my_index = 0;
  for (int member : members) {
    if (member == rank()) my_index = static_cast<int>(group.size());
    group.push_back(group_[static_cast<size_t>(member)]);
  }
  return std::make_unique<NeuronComm>(core_, errors_, std::move(group), my_index, static_cast<int>(cc_.ctx_device_id),
                                      static_cast<int>(cc_.ctx_device_count), timeout());
}

}  // namespace backplane::neuron_plugin
