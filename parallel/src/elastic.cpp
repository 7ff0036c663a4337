// ElasticTrainer: a step, its commit, and the recovery after a rank fails.
#include "backplane/parallel/elastic.h"

#include <ATen/ATen.h>
#include <torch/serialize/archive.h>

#include <cstdio>
#include <set>
#include <sstream>

#include "backplane/parallel/distributed.h"
#include "world_renewal.h"

namespace backplane::parallel {
namespace {

// The statuses by which a step learns that another rank failed (or was found failed by another).
bool is_a_rank_failure(bpl_status status) {
  return status == BPL_ERR_REMOTE || status == BPL_ERR_TIMEOUT || status == BPL_ERR_REVOKED ||
         status == BPL_ERR_ABORTED;
}

std::string list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return "[" + text + "]";
}

// The world, then the model-parallel groups: every group a member may be blocked in.
std::vector<GroupPtr> every_group() {
  std::vector<GroupPtr> groups{get_world_group()};
  if (model_parallel_is_initialized()) {
    groups.push_back(get_tensor_model_parallel_group());
    groups.push_back(get_data_parallel_group());
    groups.push_back(get_pipeline_model_parallel_group());
  }
  return groups;
}

std::string optimizer_state(const ParallelOptimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

void load_optimizer_state(ParallelOptimizer& optimizer, const std::string& state) {
  std::istringstream bytes(state);
  torch::serialize::InputArchive archive;
  archive.load_from(bytes);
  optimizer.load(archive);
}

// What the members tell a newcomer besides the model and the optimizer: the step to go on from, and
// the options it must share with them.
at::Tensor job_facts(int64_t steps_done, const ElasticOptions& options) {
  return at::tensor({steps_done, options.global_batch_size, static_cast<int64_t>(options.replace)}, at::kLong);
}

}  // namespace

ElasticTrainer::ElasticTrainer(torch::nn::Module& module, ParallelOptimizer& optimizer, ElasticOptions options)
    : module_(module), optimizer_(optimizer), options_(std::move(options)), full_size_(get_world_size()) {
  if (optimizer_.zero_one()) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "ElasticTrainer: zero_one_enabled is not supported: a rank's shard of the "
                                          "optimizer state would be lost with it");
  }
  if (get_pipeline_model_parallel_size() != 1) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "ElasticTrainer: pipeline_parallel_size " +
                                              std::to_string(get_pipeline_model_parallel_size()) +
                                              " is not supported: expected 1");
  }
  if (options_.global_batch_size < get_data_parallel_size()) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "ElasticTrainer: global_batch_size " +
                                              std::to_string(options_.global_batch_size) +
                                              " must be >= the data-parallel size " +
                                              std::to_string(get_data_parallel_size()));
  }
  if (joined_running_job()) {
    // The members' hand_over(), after initialize_parallel_model's broadcast of the parameters.
    load_optimizer_state(optimizer_, get_data_parallel_group()->broadcast_bytes("", 0));
    at::Tensor facts = job_facts(0, options_);
    get_world_group()->broadcast(facts, 0);
    steps_done_ = facts[0].item<int64_t>();
    if (facts[1].item<int64_t>() != options_.global_batch_size || facts[2].item<int64_t>() != options_.replace) {
      throw Error(BPL_ERR_MISMATCH, "ElasticTrainer: this newcomer has global_batch_size " +
                                        std::to_string(options_.global_batch_size) + " and replace " +
                                        std::to_string(options_.replace) + ", the job " +
                                        std::to_string(facts[1].item<int64_t>()) + " and " +
                                        std::to_string(facts[2].item<int64_t>()));
    }
    say("joined the job at step " + std::to_string(steps_done_) + " as rank " + std::to_string(get_rank()) + " of " +
        std::to_string(get_world_size()));
    return;
  }
  // Every rank learns whether any two disagree: the smallest and the largest of each option.
  at::Tensor range = at::tensor({options_.global_batch_size, -options_.global_batch_size,
                                 static_cast<int64_t>(options_.replace), -static_cast<int64_t>(options_.replace)},
                                at::kLong);
  get_world_group()->all_reduce(range, ReduceOp::Min);
  const auto value = [&](int i) { return range[i].item<int64_t>(); };
  if (value(0) != -value(1) || value(2) != -value(3)) {
    throw Error(BPL_ERR_MISMATCH, "ElasticTrainer: the ranks disagree: global_batch_size from " +
                                      std::to_string(value(0)) + " to " + std::to_string(-value(1)) +
                                      ", replace from " + std::to_string(value(2)) + " to " +
                                      std::to_string(-value(3)) + " (rank " + std::to_string(get_rank()) + ": " +
                                      std::to_string(options_.global_batch_size) + " and " +
                                      std::to_string(options_.replace) + ")");
  }
}

BatchShare ElasticTrainer::share() const {
  const int64_t replicas = get_data_parallel_size(), replica = get_data_parallel_rank();
  const int64_t rows = options_.global_batch_size;
  BatchShare share;
  share.step = steps_done_;
  share.begin = rows * replica / replicas;
  share.end = rows * (replica + 1) / replicas;
  share.loss_scale = static_cast<double>(replicas * (share.end - share.begin)) / static_cast<double>(rows);
  return share;
}

void ElasticTrainer::say(const std::string& line) const {
  if (options_.report) {
    options_.report(line);
  } else {
    std::fprintf(stderr, "%s\n", rmsg(line).c_str());
  }
}

bool ElasticTrainer::step(const std::function<void(const BatchShare&)>& forward_backward) {
  if (left_) throw Error(BPL_ERR_INVALID_ARGUMENT, "ElasticTrainer::step: this rank has left the job");
  const int64_t this_step = steps_done_;
  while (!attempt(forward_backward)) {
    if (!recover()) return false;
    if (steps_done_ > this_step) return true;  // it completed elsewhere, and here by recover()
    ++steps_redone_;
  }
  return true;
}

bool ElasticTrainer::attempt(const std::function<void(const BatchShare&)>& forward_backward) {
  holds_reduced_step_ = false;
  optimizer_.zero_grad();
  try {
    forward_backward(share());
    optimizer_.reduce_gradients();
    holds_reduced_step_ = true;
    // The commit: it completes on a rank only once every rank has come to it with reduced gradients.
    at::Tensor committed = at::ones({1}, at::kInt);
    get_world_group()->all_reduce(committed, ReduceOp::Min);
  } catch (const Error& e) {
    if (!is_a_rank_failure(e.status())) throw;
    say("step " + std::to_string(steps_done_) + " failed: " + e.what());
    return false;
  }
  optimizer_.apply_gradients();
  holds_reduced_step_ = false;
  ++steps_done_;
  return true;
}

bool ElasticTrainer::recover() {
  for (;;) {
    ++failures_;
    for (const GroupPtr& group : every_group()) {
      try {
        group->revoke();  // releases the members still waiting in it
      } catch (const Error&) {
      }
    }
    const std::shared_ptr<ProcessGroup> world = get_world_group();
    const int old_size = world->size();
    // An error here (the others counted this rank out, or it cannot reach the job's store) ends it.
    ProcessGroup::Shrunk shrunk = world->shrink();
    try {
      say("ranks " + list(shrunk.failed) + " of " + std::to_string(old_size) + " failed; " +
          std::to_string(shrunk.group->size()) + " survive");
      GroupPtr survivors = without_broken_replicas(shrunk, world->rank());
      if (!survivors) {
        left_ = true;
        say("leaves the job: its tensor-parallel replica lost a rank");
        return false;
      }
      detail::renew_world(*survivors);
      // Every survivor takes part in the agreement whether its roll_forward ended well or not: one that
      // went straight back to shrinking would meet the others' next agreement (the grow's) instead.
      bool rolled = true;
      try {
        roll_forward();
      } catch (const Error& e) {
        if (!is_a_rank_failure(e.status())) throw;
        rolled = false;
      }
      if (world->agree(rolled ? 1 : 0).flags == 0) {
        throw Error(BPL_ERR_REMOTE, "agreeing on the steps done failed on a survivor");
      }
      const bool grown = options_.replace && grow_back();
      detail::rebuild_model_parallel();
      if (grown) hand_over();
      say("going on at " + std::to_string(world->size()) + " rank(s), " + std::to_string(get_data_parallel_size()) +
          " replica(s), from step " + std::to_string(steps_done_) + (grown ? ", newcomers admitted" : ""));
      return true;
    } catch (const Error& e) {
      if (!is_a_rank_failure(e.status())) throw;
      say("another failure while going on: " + std::string(e.what()));
    }
  }
}

// Under tensor parallelism the replicas (tp consecutive ranks) that lost a rank leave whole: the group of
// the others, or null on a rank that leaves.
GroupPtr ElasticTrainer::without_broken_replicas(const ProcessGroup::Shrunk& shrunk, int old_rank) {
  const int tp = get_tensor_model_parallel_size();
  std::set<int> broken;
  for (int rank : shrunk.failed) broken.insert(rank / tp);
  if (tp == 1 || broken.empty()) return shrunk.group;
  const bool intact = broken.count(old_rank / tp) == 0;
  GroupPtr replicas;
  bool split = true;
  try {
    replicas = shrunk.group->split(intact ? 0 : BPL_COLOR_UNDEFINED, shrunk.group->rank());
  } catch (const Error& e) {
    if (!is_a_rank_failure(e.status())) throw;
    split = false;
  }
  // A split can end well on some members and not on others: they all shrink the world again unless it
  // ended well on every one, so that none goes on with a communicator the others lack.
  if (shrunk.group->agree(split ? 1 : 0).flags == 0) {
    throw Error(BPL_ERR_REMOTE, "leaving the replicas that lost a rank failed on a survivor");
  }
  return intact ? replicas : nullptr;
}

// Newcomers in the places of the ranks the job lost, however many failures it took: true once every
// survivor admitted them into the world.
bool ElasticTrainer::grow_back() {
  const GroupPtr world = get_world_group();
  const int missing = full_size_ - world->size();
  if (missing <= 0) return false;
  GroupPtr larger;
  try {
    larger = world->grow(missing);
  } catch (const Error& e) {
    say("no newcomers: " + std::string(e.what()));
  }
  // The grow agrees before it admits anyone, but a member lost while the grown communicator connects
  // can still leave it made on some survivors only: they keep it only if every one has it.
  if (world->agree(larger ? 1 : 0).flags == 0) {
    if (larger) say("not every survivor admitted the newcomers: going on without them");
    return false;
  }
  detail::renew_world(*larger);
  return true;
}

// The survivors agree on the steps done: one whose commit failed after another's completed applies the
// step it holds (every rank came to that commit with reduced gradients).
void ElasticTrainer::roll_forward() {
  at::Tensor most = at::full({1}, steps_done_, at::kLong);
  get_world_group()->all_reduce(most, ReduceOp::Max);
  const int64_t done_somewhere = most.item<int64_t>();
  if (done_somewhere == steps_done_) {
    holds_reduced_step_ = false;
    return;
  }
  if (done_somewhere != steps_done_ + 1 || !holds_reduced_step_) {
    throw Error(BPL_ERR_INTERNAL, "ElasticTrainer: step " + std::to_string(done_somewhere - 1) +
                                      " completed on another rank, but this rank (at step " +
                                      std::to_string(steps_done_) + ") does not hold its gradients");
  }
  optimizer_.apply_gradients();
  holds_reduced_step_ = false;
  ++steps_done_;
  say("applied step " + std::to_string(steps_done_ - 1) + ", which completed on another rank");
}

// To the newcomers, in the order their initialisation receives it (see the constructor).
void ElasticTrainer::hand_over() {
  broadcast_from_data_parallel_source(module_);
  GroupPtr dp = get_data_parallel_group();
  dp->broadcast_bytes(dp->rank() == 0 ? optimizer_state(optimizer_) : std::string(), 0);
  at::Tensor facts = job_facts(steps_done_, options_);
  get_world_group()->broadcast(facts, 0);
}

}  // namespace backplane::parallel
