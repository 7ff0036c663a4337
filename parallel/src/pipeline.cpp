// Pipeline parallelism: stages, the 1F1B schedule and the transfers between neighbouring stages.
#include "backplane/parallel/pipeline.h"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>

#include <algorithm>

namespace backplane::parallel {
namespace {

Error invalid(const std::string& message) { return Error(BPL_ERR_INVALID_ARGUMENT, "pipeline: " + message); }

/* ---- transfers between neighbouring stages ---- */

// A tensor goes as a header (its dtype, whether the sender's copy requires a gradient, its shape), then
// its data, both on the same tag: the receiver learns the shape of each microbatch's activation, which
// a stage cannot know in advance (a model may change it, and the last microbatch may be another size).
constexpr int kActivationTag = 1;
constexpr int kGradientTag = 2;
constexpr int64_t kMaxDims = 8;
constexpr int64_t kHeaderWords = 3 + kMaxDims;

void send_tensor(const ProcessGroup& group, const at::Tensor& tensor, int peer, int tag, std::vector<Work>& sends) {
  if (tensor.dim() > kMaxDims) {
    throw invalid("an activation of " + std::to_string(tensor.dim()) + " dimensions cannot go between stages (at most " +
                  std::to_string(kMaxDims) + ")");
  }
  at::Tensor header = at::zeros({kHeaderWords}, at::kLong);
  auto words = header.accessor<int64_t, 1>();
  words[0] = static_cast<int64_t>(tensor.scalar_type());
  words[1] = tensor.requires_grad() ? 1 : 0;
  words[2] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) words[3 + d] = tensor.size(d);
  sends.push_back(group.send_async(header, peer, tag));
  sends.push_back(group.send_async(tensor.detach().contiguous(), peer, tag));
}

// The tensor and whether the sender's copy requires a gradient.
std::pair<at::Tensor, bool> recv_tensor(const ProcessGroup& group, int peer, int tag) {
  at::Tensor header = at::empty({kHeaderWords}, at::kLong);
  group.recv(header, peer, tag);
  auto words = header.accessor<int64_t, 1>();
  const bool known_dtype = words[0] >= 0 && words[0] < static_cast<int64_t>(at::ScalarType::NumOptions);
  if (!known_dtype || words[2] < 0 || words[2] > kMaxDims) {
    throw Error(BPL_ERR_MISMATCH, "pipeline: stage " + std::to_string(peer) + " sent a header that is not one (dtype " +
                                      std::to_string(words[0]) + ", " + std::to_string(words[2]) +
                                      " dims): do both stages run the same schedule?");
  }
  std::vector<int64_t> shape(words.data() + 3, words.data() + 3 + words[2]);
  at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(static_cast<at::ScalarType>(words[0])));
  group.recv(tensor, peer, tag);
  return {tensor, words[1] != 0};
}

}  // namespace

std::vector<std::pair<size_t, size_t>> pipeline_stage_bounds(const std::vector<std::string>& layer_names,
                                                             const std::vector<std::string>& cuts, int stages) {
  if (stages < 1) throw invalid("pipeline_parallel_size " + std::to_string(stages) + " must be >= 1");
  const size_t layers = layer_names.size();
  std::vector<size_t> ends;  // one past each stage's last layer
  if (cuts.empty()) {
    if (layers < static_cast<size_t>(stages)) {
      throw invalid("a model of " + std::to_string(layers) + " layers cannot make " + std::to_string(stages) +
                    " stages");
    }
    size_t end = 0;
    for (size_t s = 0; s < static_cast<size_t>(stages); ++s) {
      end += layers / static_cast<size_t>(stages) + (s < layers % static_cast<size_t>(stages) ? 1 : 0);
      ends.push_back(end);
    }
  } else {
    if (cuts.size() != static_cast<size_t>(stages - 1)) {
      throw invalid("pipeline_cuts has " + std::to_string(cuts.size()) + " names (" + c10::Join(", ", cuts) +
                    ") for pipeline_parallel_size " + std::to_string(stages) + ": expected " +
                    std::to_string(stages - 1) + ", one after each stage but the last");
    }
    for (const std::string& cut : cuts) {
      const auto found = std::find(layer_names.begin(), layer_names.end(), cut);
      if (found == layer_names.end()) {
        throw invalid("pipeline_cuts names '" + cut + "', which is not a layer of the model (its layers: " +
                      c10::Join(", ", layer_names) + ")");
      }
      const size_t end = static_cast<size_t>(found - layer_names.begin()) + 1;
      if (!ends.empty() && end <= ends.back()) {
        throw invalid("pipeline_cuts '" + cut + "' does not come after '" + layer_names[ends.back() - 1] +
                      "' in the model: cuts must follow the model's order");
      }
      ends.push_back(end);
    }
    if (ends.back() == layers) {
      throw invalid("pipeline_cuts '" + cuts.back() + "' is the model's last layer: the last stage would have none");
    }
    ends.push_back(layers);
  }
  std::vector<std::pair<size_t, size_t>> bounds;
  size_t first = 0;
  for (size_t end : ends) {
    bounds.emplace_back(first, end);
    first = end;
  }
  return bounds;
}

torch::nn::Sequential select_pipeline_stage(const torch::nn::Sequential& model, const std::vector<std::string>& cuts,
                                            int stage, int stages) {
  std::vector<std::string> names;
  for (const auto& child : model->named_children()) names.push_back(child.key());
  if (names.size() != model->size()) throw invalid("the Sequential's layers and children differ");
  const auto [first, end] = pipeline_stage_bounds(names, cuts, stages).at(static_cast<size_t>(stage));
  torch::nn::Sequential selected;
  auto layer = model->begin() + static_cast<std::ptrdiff_t>(first);
  for (size_t i = first; i < end; ++i, ++layer) selected->push_back(names[i], *layer);
  return selected;
}

std::vector<PipelineStep> one_f_one_b_schedule(int stage, int stages, int microbatches) {
  std::vector<PipelineStep> steps;
  const int warmup = std::min(stages - stage - 1, microbatches);
  int forwards = 0, backwards = 0;
  while (forwards < warmup) steps.push_back({PipelineStep::kForward, forwards++});
  while (forwards < microbatches) {
    steps.push_back({PipelineStep::kForward, forwards++});
    steps.push_back({PipelineStep::kBackward, backwards++});
  }
  while (backwards < microbatches) steps.push_back({PipelineStep::kBackward, backwards++});
  return steps;
}

/* ---- PipelineEngine ---- */

PipelineEngine::PipelineEngine(torch::nn::Sequential stage, PipelineConfig config, GroupPtr group)
    : stage_(std::move(stage)), config_(std::move(config)), group_(std::move(group)) {
  if (!group_) throw invalid("no pipeline-parallel group");
  if (!config_.loss_fn) throw invalid("pipeline_config.loss_fn is not set");
  if (config_.num_microbatches < 1) {
    throw invalid("num_microbatches " + std::to_string(config_.num_microbatches) + " must be >= 1");
  }
  stage_index_ = group_->rank();
  stages_ = group_->size();
}

at::Tensor PipelineEngine::run_train(const at::Tensor& inputs, const at::Tensor& labels) {
  const int m = config_.num_microbatches;
  // Every stage checks both, so that a bad batch is an error on every rank rather than a wait.
  for (const auto& [what, tensor] : {std::pair{"inputs", &inputs}, std::pair{"labels", &labels}}) {
    if (!tensor->defined() || tensor->dim() == 0 || tensor->size(0) % m != 0 || tensor->size(0) == 0) {
      throw invalid("num_microbatches " + std::to_string(m) + " does not divide the batch: " + what + " have " +
                    (tensor->defined() && tensor->dim() > 0 ? std::to_string(tensor->size(0)) + " rows (dim 0)"
                                                            : std::string("no rows")));
    }
  }
  if (inputs.size(0) != labels.size(0)) {
    throw invalid("inputs have " + std::to_string(inputs.size(0)) + " rows and labels " +
                  std::to_string(labels.size(0)) + ": one label row per input row");
  }
  const std::vector<at::Tensor> input_parts = inputs.split(inputs.size(0) / m);
  const std::vector<at::Tensor> label_parts = labels.split(labels.size(0) / m);
  received_.assign(static_cast<size_t>(m), at::Tensor());
  produced_.assign(static_cast<size_t>(m), at::Tensor());
  loss_sum_ = at::zeros({}, at::kFloat);
  try {
    for (const PipelineStep& step : one_f_one_b_schedule(stage_index_, stages_, m)) {
      if (step.kind == PipelineStep::kForward) {
        forward(step.microbatch, input_parts, label_parts);
      } else {
        backward(step.microbatch);
      }
    }
    for (Work& send : sends_) send.wait();
  } catch (...) {
    sends_.clear();  // each Work waits for its send as it goes, bounded by the timeout
    throw;
  }
  sends_.clear();
  at::Tensor loss = loss_sum_.reshape({1}).clone();
  group_->broadcast(loss, stages_ - 1);
  return loss.reshape({});
}

void PipelineEngine::forward(int microbatch, const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& labels) {
  const auto i = static_cast<size_t>(microbatch);
  at::Tensor input = inputs[i];
  if (stage_index_ > 0) {
    auto [activation, wants_gradient] = recv_tensor(*group_, stage_index_ - 1, kActivationTag);
    if (wants_gradient && at::isFloatingType(activation.scalar_type())) activation.requires_grad_(true);
    received_[i] = activation;
    input = activation;
  }
  at::Tensor output = stage_->forward(input);
  if (stage_index_ == stages_ - 1) {
    at::Tensor loss = config_.loss_fn(output, labels[i]);
    if (loss.numel() != 1) {
      throw invalid("loss_fn returned a tensor of shape " + c10::str(loss.sizes()) + ": expected a scalar");
    }
    loss_sum_ += loss.detach().to(at::kFloat).reshape({}) / config_.num_microbatches;
    produced_[i] = loss / config_.num_microbatches;
  } else {
    send_tensor(*group_, output, stage_index_ + 1, kActivationTag, sends_);
    produced_[i] = output;
  }
}

void PipelineEngine::backward(int microbatch) {
  const auto i = static_cast<size_t>(microbatch);
  at::Tensor produced = std::move(produced_[i]);
  if (stage_index_ == stages_ - 1) {
    if (produced.requires_grad()) produced.reshape({}).backward();
  } else if (produced.requires_grad()) {
    at::Tensor gradient = recv_tensor(*group_, stage_index_ + 1, kGradientTag).first;
    produced.backward(gradient);
  }
  at::Tensor received = std::move(received_[i]);
  if (stage_index_ > 0 && received.defined() && received.requires_grad()) {
    at::Tensor gradient = received.grad().defined() ? received.grad() : at::zeros_like(received);
    send_tensor(*group_, gradient, stage_index_ - 1, kGradientTag, sends_);
  }
}

}  // namespace backplane::parallel
