// Model-parallel state: the group layout and this rank's TP/DP/PP groups.
#include "backplane/parallel/parallel_state.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>

#include "backplane/parallel/distributed.h"
#include "world_renewal.h"

namespace backplane::parallel {

GroupLayout compute_group_layout(int world_size, int tensor_parallel_size, int pipeline_parallel_size) {
  if (world_size < 1) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "world size " + std::to_string(world_size) + " is not valid: expected >= 1");
  }
  if (tensor_parallel_size < 1 || pipeline_parallel_size < 1) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "tensor_model_parallel_size " + std::to_string(tensor_parallel_size) +
                                              " and pipeline_model_parallel_size " +
                                              std::to_string(pipeline_parallel_size) + " must both be >= 1");
  }
  GroupLayout layout;
  layout.world_size = world_size;
  layout.tensor_parallel_size = std::min(tensor_parallel_size, world_size);
  layout.pipeline_parallel_size = std::min(pipeline_parallel_size, world_size);
  const int tp = layout.tensor_parallel_size;
  const int pp = layout.pipeline_parallel_size;
  if (world_size % (tp * pp) != 0) {
    throw Error(BPL_ERR_INVALID_ARGUMENT,
                "invalid implied data parallel degree: world size " + std::to_string(world_size) +
                    " is not divisible by tensor_model_parallel_size (" + std::to_string(tp) +
                    ") x pipeline_model_parallel_size (" + std::to_string(pp) + ")");
  }
  const int dp = world_size / (tp * pp);
  layout.data_parallel_size = dp;
  // ranks = arange(world).reshape(PP, DP, TP)
  auto rank_at = [&](int p, int d, int t) { return (p * dp + d) * tp + t; };
  for (int p = 0; p < pp; ++p)
    for (int d = 0; d < dp; ++d) {
      std::vector<int>& group = layout.tensor_parallel.emplace_back();
      for (int t = 0; t < tp; ++t) group.push_back(rank_at(p, d, t));
    }
  for (int p = 0; p < pp; ++p)
    for (int t = 0; t < tp; ++t) {
      std::vector<int>& group = layout.data_parallel.emplace_back();
      for (int d = 0; d < dp; ++d) group.push_back(rank_at(p, d, t));
    }
  for (int d = 0; d < dp; ++d)
    for (int t = 0; t < tp; ++t) {
      std::vector<int>& group = layout.pipeline_parallel.emplace_back();
      for (int p = 0; p < pp; ++p) group.push_back(rank_at(p, d, t));
    }
  return layout;
}

namespace {

struct ModelParallel {
  GroupLayout layout;
  std::shared_ptr<ProcessGroup> tensor, data, pipeline;
};

struct State {
  std::mutex mutex;
  std::shared_ptr<const ModelParallel> current;
  std::atomic<bool> fallback_warned{false};
};

State& state() {
  static State* instance = new State;  // never destroyed: usable from other static destructors
  return *instance;
}

std::shared_ptr<const ModelParallel> current() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().current;
}

std::shared_ptr<const ModelParallel> require_initialized() {
  std::shared_ptr<const ModelParallel> mp = current();
  if (!mp) {
    throw Error(BPL_ERR_INVALID_ARGUMENT,
                "model parallel is not initialised: call initialize_model_parallel() first");
  }
  return mp;
}

// This rank's group among `groups`: its index (the split color) and this rank's position (the key).
std::pair<int, int> locate(const Groups& groups, int rank) {
  for (size_t i = 0; i < groups.size(); ++i) {
    auto it = std::find(groups[i].begin(), groups[i].end(), rank);
    if (it != groups[i].end()) return {static_cast<int>(i), static_cast<int>(it - groups[i].begin())};
  }
  throw Error(BPL_ERR_INTERNAL, "rank " + std::to_string(rank) + " is in no group of the layout");
}

std::shared_ptr<ProcessGroup> split_for(const ProcessGroup& world, const Groups& groups) {
  auto [color, key] = locate(groups, world.rank());
  return world.split(color, key);
}

}  // namespace

void initialize_model_parallel(int tensor_model_parallel_size, int pipeline_model_parallel_size) {
  if (!is_initialized()) init_process_group();
  std::shared_ptr<ProcessGroup> world = get_world_group();
  GroupLayout layout = compute_group_layout(world->size(), tensor_model_parallel_size, pipeline_model_parallel_size);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.current) {
    throw Error(BPL_ERR_INVALID_ARGUMENT,
                "initialize_model_parallel: already initialised (call destroy_model_parallel() first)");
  }
  auto mp = std::make_shared<ModelParallel>();
  // Every rank makes all three splits, in this order.
  mp->tensor = split_for(*world, layout.tensor_parallel);
  mp->data = split_for(*world, layout.data_parallel);
  mp->pipeline = split_for(*world, layout.pipeline_parallel);
  mp->layout = std::move(layout);
  s.current = std::move(mp);
}

namespace detail {

void rebuild_model_parallel() {
  std::shared_ptr<const ModelParallel> old = require_initialized();
  std::shared_ptr<ProcessGroup> world = get_world_group();
  GroupLayout layout = compute_group_layout(world->size(), old->layout.tensor_parallel_size,
                                            old->layout.pipeline_parallel_size);
  auto mp = std::make_shared<ModelParallel>(*old);
  mp->layout = std::move(layout);
  // Every rank makes all three splits, in initialize_model_parallel's order: a newcomer initialising
  // its state makes the same calls.
  std::shared_ptr<ProcessGroup> tensor = split_for(*world, mp->layout.tensor_parallel);
  std::shared_ptr<ProcessGroup> data = split_for(*world, mp->layout.data_parallel);
  std::shared_ptr<ProcessGroup> pipeline = split_for(*world, mp->layout.pipeline_parallel);
  renew_group(*mp->tensor, *tensor, false);
  renew_group(*mp->data, *data, false);
  renew_group(*mp->pipeline, *pipeline, false);
  std::lock_guard<std::mutex> lock(state().mutex);
  state().current = std::move(mp);
}

}  // namespace detail

bool model_parallel_is_initialized() { return current() != nullptr; }

void destroy_model_parallel() {
  std::shared_ptr<const ModelParallel> released;
  std::lock_guard<std::mutex> lock(state().mutex);
  released.swap(state().current);
}

void ensure_model_parallel_initialized(const char* who) {
  if (model_parallel_is_initialized()) return;
  if (!state().fallback_warned.exchange(true)) {
    std::fprintf(stderr,
                 "%s warning: %s was built before initialize_model_parallel(); using tensor and pipeline "
                 "parallel size 1%s\n",
                 rank_prefix().c_str(), who, is_initialized() ? "" : " on a one-rank process group");
  }
  if (!is_initialized()) {
    InitOptions one_rank;
    one_rank.rank = 0;
    one_rank.world_size = 1;
    init_process_group(one_rank);
  }
  initialize_model_parallel(1, 1);
}

GroupLayout get_group_layout() { return require_initialized()->layout; }
std::shared_ptr<ProcessGroup> get_tensor_model_parallel_group() { return require_initialized()->tensor; }
std::shared_ptr<ProcessGroup> get_data_parallel_group() { return require_initialized()->data; }
std::shared_ptr<ProcessGroup> get_pipeline_model_parallel_group() { return require_initialized()->pipeline; }
int get_tensor_model_parallel_size() { return require_initialized()->tensor->size(); }
int get_tensor_model_parallel_rank() { return require_initialized()->tensor->rank(); }
int get_data_parallel_size() { return require_initialized()->data->size(); }
int get_data_parallel_rank() { return require_initialized()->data->rank(); }
int get_pipeline_model_parallel_size() { return require_initialized()->pipeline->size(); }
int get_pipeline_model_parallel_rank() { return require_initialized()->pipeline->rank(); }
int get_tensor_model_parallel_src_rank() { return require_initialized()->tensor->ranks().front(); }
int get_data_parallel_src_rank() { return require_initialized()->data->ranks().front(); }

int get_pipeline_model_parallel_next_rank() {
  std::shared_ptr<ProcessGroup> pp = get_pipeline_model_parallel_group();
  return pp->ranks()[static_cast<size_t>((pp->rank() + 1) % pp->size())];
}

int get_pipeline_model_parallel_prev_rank() {
  std::shared_ptr<ProcessGroup> pp = get_pipeline_model_parallel_group();
  return pp->ranks()[static_cast<size_t>((pp->rank() + pp->size() - 1) % pp->size())];
}

std::string rank_prefix() {
  const int global = is_initialized() ? get_rank() : -1;
  std::shared_ptr<const ModelParallel> mp = current();
  const int pp = mp ? mp->pipeline->rank() : -1;
  const int tp = mp ? mp->tensor->rank() : -1;
  const int dp = mp ? mp->data->rank() : -1;
  const int cp = mp ? 0 : -1;  // no context parallelism: one context-parallel rank
  return "[rank_" + std::to_string(global) + "_pp" + std::to_string(pp) + "_tp" + std::to_string(tp) + "_dp" +
         std::to_string(dp) + "_cp" + std::to_string(cp) + "]";
}

std::string rmsg(const std::string& message) { return rank_prefix() + " " + message; }

}  // namespace backplane::parallel
