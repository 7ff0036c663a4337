// Elastic data parallelism: training that loses a rank and goes on, without reading a checkpoint
// (torchft's semantics over ULFM's revoke and shrink; docs/faults.md).
//
// Each step of an ElasticTrainer runs the caller's forward and backward on this replica's share of the
// step's global batch, reduces the gradients, and commits: a one-element allreduce over the world that
// completes on a rank only once every rank has its reduced gradients. When a step fails because a rank
// was killed, stopped or cut off, the survivors revoke every group, shrink the world to themselves, and
// redo the step from what they hold in memory, the batch shared among fewer replicas. A survivor whose
// commit failed after another's completed applies the step it holds, so that all go on from the same
// state and only the step in flight is ever lost. Under tensor parallelism a replica that lost a rank
// leaves as a whole: its other ranks return false from step() and should end. With `replace`, the
// survivors then wait for as many newcomers as ranks left (bpl-run --replace starts them, BPL_JOIN=1),
// admit them, and hand them the model and the optimizer's state: the job goes on at its old size.
//
// A newcomer runs the same program: its init_process_group waits to be admitted, its
// initialize_parallel_model receives the parameters, and its ElasticTrainer the optimizer's state and
// the step to go on from. It must make no other collective call before then.
//
// What is not supported, each an error at construction: pipeline parallelism, ZeRO-1 (a rank's shard of
// the optimizer state dies with it).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <string>

#include "backplane/parallel/trainer.h"

namespace backplane::parallel {

// What one replica trains on in a step: rows [begin, end) of the step's global batch, split by
// data-parallel rank, and the factor to scale its mean loss by, so that the data-parallel average of
// the gradients is the gradient of the whole batch's mean loss however many replicas share the batch:
// data_parallel_size * (end - begin) / global_batch_size.
struct BatchShare {
  int64_t step = 0;
  int64_t begin = 0;
  int64_t end = 0;
  double loss_scale = 1;
};

struct ElasticOptions {
  // Rows in each step's global batch, the same on every rank; >= the data-parallel size.
  int64_t global_batch_size = 0;
  // After a failure, grow back to the size the job started at with newcomers before going on.
  bool replace = false;
  // What the trainer went through (a rank failed, the world shrank, a newcomer joined, a step redone),
  // one line each; default: stderr, prefixed with rank_prefix().
  std::function<void(const std::string&)> report;
};

class ElasticTrainer {
 public:
  // `module` and `optimizer` are what a survivor hands a newcomer; `optimizer` wraps the module's
  // parameters. Collective over the world; in a newcomer, receives the state from the survivors.
  ElasticTrainer(torch::nn::Module& module, ParallelOptimizer& optimizer, ElasticOptions options);

  // One training step: zero the gradients, forward_backward(share) (the caller's forward and backward
  // on its share, with loss * share.loss_scale), reduce, commit, update. A failure of another rank is
  // survived as above and the step redone; forward_backward may then run more than once, and should
  // depend on share.step, not on how often it was called. Returns true once the step is done, false
  // when this rank has left the job (its replica lost a rank). Errors other than a rank's failure are
  // thrown, as is the shrink's error on a rank the others went on without (counted out, or cut off from
  // the job's store): it must not train on.
  [[nodiscard]] bool step(const std::function<void(const BatchShare&)>& forward_backward);

  // Steps done (a newcomer: those the survivors had done when it joined, and its own since).
  int64_t steps_done() const { return steps_done_; }
  // Failures survived, and steps done again because of them.
  int failures() const { return failures_; }
  int steps_redone() const { return steps_redone_; }

 private:
  bool attempt(const std::function<void(const BatchShare&)>& forward_backward);
  bool recover();
  GroupPtr without_broken_replicas(const ProcessGroup::Shrunk& shrunk, int old_rank);
  bool grow_back();
  void roll_forward();
  void hand_over();
  BatchShare share() const;
  void say(const std::string& line) const;

  torch::nn::Module& module_;
  ParallelOptimizer& optimizer_;
  ElasticOptions options_;
  int full_size_;  // the world's size when the job started: what `replace` grows back to
  int64_t steps_done_ = 0;
  bool holds_reduced_step_ = false;  // this step's gradients are reduced everywhere: it may be applied
  bool left_ = false;
  int failures_ = 0;
  int steps_redone_ = 0;
};

}  // namespace backplane::parallel
