// Why an operation stalled, explained alike by every backend: each rank that timed out shows the
// others what it called (its fingerprint, as the core numbered it), through its plugin's transport, and
// the words that came within a window are compared. Ranks that disagree are a MISMATCH naming them;
// ranks that agree leave the stall to a peer that never came, which the plugin names as it can.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fingerprint.h"

namespace backplane {

// How long a rank whose operation timed out waits for the others' word about it: they time out at
// about the same moment, give or take how late each came to the operation.
inline std::chrono::milliseconds explanation_window(std::chrono::milliseconds timeout) {
  return std::min(timeout / 4, std::chrono::milliseconds(1000));
}

// The plugin's transport: shows `mine` to the other ranks and returns, within `window`, what each rank
// of the communicator said (said[r] empty: no word from rank r; this rank's own entry is ignored).
using StallExchange =
    std::function<std::vector<std::optional<Fingerprint>>(const Fingerprint& mine, std::chrono::milliseconds window)>;

struct StallExplanation {
  // The MISMATCH report when the ranks that spoke disagree ("" when they agree), naming the silent ones.
  std::string mismatch;
  std::vector<bool> answered;  // by rank, this rank's included: whose word came
  std::string silent;          // the ranks whose word did not come ("rank 2", "ranks 1,3"), "" when none
  bool everyone_answered = false;
};

// `mine` is this rank's operation, `rank` its rank; `window` how long to wait for the others' word
// (explanation_window, or 0 to read only what came).
StallExplanation explain_stall(const Fingerprint& mine, int rank, std::chrono::milliseconds window,
                               const StallExchange& exchange);

}  // namespace backplane
