#include "stall.h"

#include <utility>

namespace backplane {

StallExplanation explain_stall(const Fingerprint& mine, int rank, std::chrono::milliseconds window,
                               const StallExchange& exchange) {
  std::vector<std::optional<Fingerprint>> said = exchange(mine, window);
  if (rank >= 0 && static_cast<size_t>(rank) < said.size()) said[static_cast<size_t>(rank)] = mine;
  StallExplanation explanation;
  std::vector<std::pair<int, Fingerprint>> by_rank;
  std::string silent;
  int silent_ranks = 0;
  for (size_t r = 0; r < said.size(); ++r) {
    explanation.answered.push_back(said[r].has_value());
    if (said[r]) {
      by_rank.emplace_back(static_cast<int>(r), *said[r]);
    } else {
      silent += (silent.empty() ? "" : ",") + std::to_string(r);
      ++silent_ranks;
    }
  }
  explanation.everyone_answered = silent_ranks == 0;
  if (!silent.empty()) explanation.silent = (silent_ranks == 1 ? "rank " : "ranks ") + silent;
  const std::string report = compare(by_rank, static_cast<int>(said.size()));
  if (!report.empty()) {
    explanation.mismatch = report +
                           (silent.empty() ? "" : "; no word from " + explanation.silent + ", which left the operation or never came") +
                           " (found when the operation stalled)";
  }
  return explanation;
}

}  // namespace backplane
