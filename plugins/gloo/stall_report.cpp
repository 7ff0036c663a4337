#include "stall_report.h"

#include <algorithm>

#include "plugin_support.h"

namespace backplane::gloo_plugin {
std::unique_ptr<StallReport> StallReport::make_if_wanted(std::shared_ptr<FailureBoard> board, std::string prefix,
                                                         int rank, int size) {
  if (plugin::host() == nullptr || plugin::host()->log_level < BPL_LOG_INFO || size < 2) return nullptr;
  return std::make_unique<StallReport>(std::move(board), std::move(prefix), rank, size);
}

std::chrono::milliseconds StallReport::interval(std::chrono::milliseconds timeout) {
  // A quarter of a quarter: a report comes at most this late, and names as not arrived a rank that
  // came at most about twice this long before it.
  return std::clamp(timeout / 16, std::chrono::milliseconds(100), plugin::kWaitReportInterval);
}

StallReport::Running StallReport::begin(StallReport* report, const Fingerprint& call) {
  if (report != nullptr) {
    std::lock_guard<std::mutex> lock(report->mutex_);
    report->running_ = call;
    report->since_ = std::chrono::steady_clock::now();
  }
  return Running(report);
}

void StallReport::end() {
  std::lock_guard<std::mutex> lock(mutex_);
  running_.reset();
}

void StallReport::check(std::chrono::milliseconds timeout) {
  Fingerprint call;
  std::chrono::milliseconds waited;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!running_) return;
    call = *running_;
    waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since_);
  }
  if (waited < interval(timeout)) return;
  if (announced_ != call.sequence) {
    board_->publish(key(rank_), encode_text(call));
    announced_ = call.sequence;
    quarters_reported_ = 0;
  }
  const auto quarter = std::max(timeout / 4, std::chrono::milliseconds(1));
  const int64_t quarters = waited / quarter;
  if (quarters <= quarters_reported_) return;
  quarters_reported_ = quarters;
  plugin::log(BPL_LOG_INFO, "gloo", describe_waiting(call, waited, timeout));
}

std::string StallReport::describe_waiting(const Fingerprint& call, std::chrono::milliseconds waited,
                                          std::chrono::milliseconds timeout) const {
  std::vector<std::string> keys;
  std::vector<int> others;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    keys.push_back(key(r));
    others.push_back(r);
  }
  const std::vector<std::optional<std::string>> said = board_->gather(keys, std::chrono::milliseconds(0));
  std::vector<int> absent, in_it, past;
  std::string elsewhere;  // ranks in a collective of the same number that is another call
  for (size_t i = 0; i < others.size(); ++i) {
    const std::optional<Fingerprint> theirs = said[i] ? decode_text(*said[i]) : std::nullopt;
    if (!theirs || theirs->sequence < call.sequence) {
      absent.push_back(others[i]);
    } else if (theirs->sequence > call.sequence) {
      past.push_back(others[i]);
    } else if (call_hash(*theirs) == call_hash(call)) {
      in_it.push_back(others[i]);
    } else {
      elsewhere += "; rank " + std::to_string(others[i]) + " waits in " + describe(*theirs) + " instead";
    }
  }
  std::string line = "TCP: still waiting after " + std::to_string(waited.count() / 1000) + " s of the " +
                     std::to_string(timeout.count()) + " ms timeout in " + describe(call) + ": ";
  line += absent.empty() ? "every rank has arrived" : "ranks " + plugin::list_text(absent) + " have not arrived";
  if (!in_it.empty()) line += "; ranks " + plugin::list_text(in_it) + " wait in it too";
  if (!past.empty()) line += "; ranks " + plugin::list_text(past) + " have gone past it";
  return line + elsewhere;
}

}  // namespace backplane::gloo_plugin
