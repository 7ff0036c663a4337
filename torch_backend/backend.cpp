// BackendBackplane's life: making a group (the runtime with the first), its timeout, errors, abort and
// split, and posting an operation as a Work. The operations are in reductions.cpp, gathers.cpp and
// exchanges.cpp.
#include "backend.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <utility>

#include "communicator.h"
#include "list_buffers.h"
#include "tensor_arguments.h"
#include "work.h"

namespace backplane::torch_backend {

c10::intrusive_ptr<c10d::Backend> BackendBackplane::create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                                     int size, std::chrono::milliseconds timeout) {
  auto callbacks = std::make_unique<StoreCallbacks>(store);
  std::shared_ptr<Runtime> runtime = Runtime::current();
  if (!runtime) {
    bpl_init_options options = BPL_INIT_OPTIONS_INIT;
    options.rank = rank;
    options.world_size = size;
    options.timeout_ms = timeout.count();
    options.store = callbacks->table();
    bpl_runtime* handle = nullptr;
    check(bpl_init(&options, &handle), "bpl_init");
    runtime = std::make_shared<Runtime>(handle, std::move(callbacks));
    Runtime::set_current(runtime);
    bpl_comm* world = nullptr;
    check(bpl_comm_world(handle, &world), "bpl_comm_world");
    return c10::make_intrusive<BackendBackplane>(runtime, world, false, store, nullptr, timeout);
  }
  bpl_comm* comm = nullptr;
  check(bpl_comm_create_from_store(runtime->handle(), callbacks->table(), rank, size, &comm), "bpl_comm_create_from_store");
  const bpl_status status = bpl_comm_set_timeout(comm, timeout.count());
  if (status != BPL_OK) {
    bpl_comm_destroy(comm);
    check(status, "bpl_comm_set_timeout");
  }
  return c10::make_intrusive<BackendBackplane>(runtime, comm, true, store, std::move(callbacks), timeout);
}

namespace {
int rank_of(bpl_comm* comm) {
  int32_t rank = 0;
  bpl_comm_rank(comm, &rank);
  return rank;
}
int size_of(bpl_comm* comm) {
  int32_t size = 1;
  bpl_comm_size(comm, &size);
  return size;
}
}  // namespace

BackendBackplane::BackendBackplane(std::shared_ptr<Runtime> runtime, bpl_comm* comm, bool owns_comm,
                                   c10::intrusive_ptr<c10d::Store> group_store, std::unique_ptr<StoreCallbacks> store,
                                   std::chrono::milliseconds timeout, std::shared_ptr<Communicator> parent)
    : c10d::Backend(rank_of(comm), size_of(comm)),
      communicator_(std::make_shared<Communicator>(std::move(runtime), comm, owns_comm, std::move(store),
                                                   std::move(parent))),
      completions_(std::make_shared<CompletionQueue>()),
      scratch_(std::make_unique<ScratchBuffers>()),
      comm_(comm),
      timeout_(timeout),
      store_(std::move(group_store)) {
  if (!owns_comm) bpl_comm_set_timeout(comm_, timeout.count());
}

BackendBackplane::~BackendBackplane() { completions_->stop(); }

std::string BackendBackplane::describe() const {
  bpl_runtime_info info = BPL_RUNTIME_INFO_INIT;
  check(bpl_runtime_describe(communicator_->runtime(), &info), "bpl_runtime_describe");
  return std::string(info.backend) + " (" + info.selection_reason + "): " + info.details;
}

void BackendBackplane::wait_for_completions() { CompletionQueue::wait_until_idle(); }

void BackendBackplane::setTimeout(std::chrono::milliseconds timeout) {
  check(bpl_comm_set_timeout(comm_, timeout.count()), "bpl_comm_set_timeout");
  timeout_ = timeout;
}

c10d::ErrorType BackendBackplane::getError() {
  switch (communicator_->first_failure()) {
    case BPL_OK: return c10d::ErrorType::SUCCESS;
    case BPL_ERR_TIMEOUT: return c10d::ErrorType::TIMEOUT;
    case BPL_ERR_REMOTE: return c10d::ErrorType::REMOTE_ERROR;
    default: return c10d::ErrorType::COMM_ERROR;
  }
}

void BackendBackplane::abort() {
  check(bpl_comm_abort(comm_), "bpl_comm_abort");
  communicator_->record_failure(BPL_ERR_ABORTED);
}

void BackendBackplane::shutdown() { completions_->stop(); }

c10::intrusive_ptr<c10d::Backend> BackendBackplane::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                          const std::vector<int>& ranks,
                                                          const c10::intrusive_ptr<Options>& opts) {
  // `ranks` are the new group's members by their rank here; they alone meet, through `store`.
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) return nullptr;  // not a member: no backend here
  return create(store, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()),
                opts ? opts->timeout : timeout_);
}

c10::intrusive_ptr<c10d::Backend> BackendBackplane::shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                                           const c10::intrusive_ptr<Options>& opts_override) {
  constexpr int kShrinkAbort = 0x01;  // torch.distributed.SHRINK_ABORT
  if ((shrink_flags & kShrinkAbort) != 0) check(bpl_comm_revoke(comm_), "bpl_comm_revoke");
  std::vector<int32_t> failed(static_cast<size_t>(getSize()));
  int32_t num_failed = 0;
  bpl_comm* survivors = nullptr;
  check(bpl_comm_shrink(comm_, failed.data(), &num_failed, &survivors), "bpl_comm_shrink");
  std::vector<int64_t> asked = ranks_to_exclude;
  std::sort(asked.begin(), asked.end());
  const std::vector<int64_t> agreed(failed.begin(), failed.begin() + num_failed);
  if (agreed != asked) {
    bpl_comm_destroy(survivors);
    auto listed = [](const std::vector<int64_t>& ranks) {
      std::string text;
      for (int64_t r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
      return "[" + text + "]";
    };
    TORCH_CHECK(false, "backplane: shrink_group was asked to exclude ranks ", listed(asked),
                " but the group's members that are alive agree that ranks ", listed(agreed), " failed");
  }
  return c10::make_intrusive<BackendBackplane>(communicator_->shared_runtime(), survivors, true, store_, nullptr,
                                               opts_override ? opts_override->timeout : timeout_, communicator_);
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::post(const Operation& operation,
                                                           const std::function<bpl_status(bpl_request**)>& start,
                                                           std::function<void()> finish, std::vector<at::Tensor> outputs,
                                                           std::vector<at::Tensor> keep) {
  bpl_request* request = nullptr;
  check(start(&request), operation.name);
  ++sequence_;
  return c10::make_intrusive<BackplaneWork>(communicator_, completions_, getRank(), operation, Requests{request},
                                            std::move(finish), std::move(outputs), std::move(keep));
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::post_each(const Operation& operation, int count,
                                                                const std::function<bpl_status(int, bpl_request**)>& start,
                                                                std::function<void()> finish, std::vector<at::Tensor> outputs,
                                                                std::vector<at::Tensor> keep) {
  Requests requests;
  for (int i = 0; i < count; ++i) {
    bpl_request* request = nullptr;
    const bpl_status status = start(i, &request);
    if (status != BPL_OK) {
      const std::string message = bpl_last_error();
      for (bpl_request* posted : requests) bpl_request_free(posted);  // waits, bounded, for what was posted
      fail(std::string(operation.name) + " failed (" + bpl_status_name(status) + "): " + message);
    }
    requests.push_back(request);
  }
  ++sequence_;
  return c10::make_intrusive<BackplaneWork>(communicator_, completions_, getRank(), operation, std::move(requests),
                                            std::move(finish), std::move(outputs), std::move(keep));
}

c10::intrusive_ptr<c10d::Work> BackendBackplane::post_pairs(const Operation& operation,
                                                           const std::vector<at::Tensor>& sources,
                                                           const std::vector<at::Tensor>& results,
                                                           const std::vector<at::Tensor>& outputs,
                                                           const std::function<bpl_status(int, bpl_request**)>& start) {
  std::vector<at::Tensor> keep = sources;
  keep.insert(keep.end(), results.begin(), results.end());
  return post_each(
      operation, static_cast<int>(results.size()), start,
      [results, outputs] {
        for (size_t i = 0; i < outputs.size(); ++i) write_back(outputs[i], results[i]);
      },
      outputs, keep);
}

}  // namespace backplane::torch_backend
