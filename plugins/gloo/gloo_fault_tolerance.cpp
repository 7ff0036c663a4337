// Going on after a failure, with ULFM's semantics: revoke, agree and shrink a gloo communicator.
//
// The job's store is the one arbiter. A revoke is recorded there before the connections are failed, so
// that every member whose operation then fails reads who revoked it. An agreement is a round of keys:
// each member leaves its flags, then waits until every other member has left its own or is known to
// have failed (its process on this machine ended), or until the communicator's timeout (a stopped or
// unreachable member); it then proposes what it saw, and the first proposal recorded is the outcome
// every member returns, whatever each saw itself. A member that cannot reach the store cannot take part
// in any outcome: it fails, saying it is cut off, so that of a partitioned job only the side that
// reaches the store goes on.
#include <algorithm>
#include <sstream>
#include <thread>

#include "gloo_comm.h"
#include "local_process.h"
#include "plugin_support.h"

namespace backplane::gloo_plugin {

namespace {

// How long one look at the store waits for the outcome before looking again at who answered: the
// wait is the store server's, so a member that waits uses no core.
constexpr std::chrono::milliseconds kLookAgain{20};

// "flags|r1,r2,…": an outcome as it is recorded.
std::string text_of_outcome(int32_t flags, const std::vector<int32_t>& failed) {
  std::string text = std::to_string(flags) + "|";
  for (size_t i = 0; i < failed.size(); ++i) text += (i == 0 ? "" : ",") + std::to_string(failed[i]);
  return text;
}

std::pair<int32_t, std::vector<int32_t>> outcome_of_text(const std::string& text) {
  const size_t bar = text.find('|');
  std::vector<int32_t> failed;
  std::istringstream ranks(bar == std::string::npos ? "" : text.substr(bar + 1));
  for (std::string rank; std::getline(ranks, rank, ',');) failed.push_back(std::stoi(rank));
  return {static_cast<int32_t>(std::stol(text.substr(0, bar))), failed};
}

}  // namespace

void GlooComm::revoke() {
  failed_ = true;
  if (revoked_.exchange(true)) return;
  const std::string reason =
      "the communicator was revoked (bpl_comm_revoke) by rank " + std::to_string(rank()) + " of this communicator";
  if (size() > 1) {
    // In the store before anything is failed: a member whose operation fails then reads who revoked it.
    shared_->board->publish(uid_ + "/revoked", std::to_string(rank()));
    shared_->board->record_first(uid_ + "/first_failure",
                                 std::to_string(BPL_ERR_REVOKED) + "|" + std::to_string(rank()) + "|" + reason,
                                 std::chrono::milliseconds(0));
  }
  if (shm_) shm_->fail(BPL_ERR_REVOKED, "shared memory: " + reason);
  if (machine_shm_) machine_shm_->fail(BPL_ERR_REVOKED, "shared memory: " + reason);
  shut_down_connections();
}

int GlooComm::revoked_by() const {
  if (size() == 1) return -1;
  const std::optional<std::string> by = shared_->board->gather({uid_ + "/revoked"}, std::chrono::milliseconds(0)).front();
  return by ? std::atoi(by->c_str()) : -1;
}

GlooComm::Agreement GlooComm::run_agreement(int32_t flags) {
  const uint32_t number = agreements_++;
  if (size() == 1) return {flags, {}};
  KvStore& store = *shared_->kv;
  const std::string round = shared_->prefix + "/" + uid_ + "/agreement/" + std::to_string(number) + "/";
  const std::string outcome_key = round + "outcome";
  const std::string what = "agreement #" + std::to_string(number) + " of the communicator's members";
  std::string outcome;
  try {
    store.set(round + "flags/" + std::to_string(rank()), bytes_of(std::to_string(flags)));
    std::vector<std::optional<int32_t>> heard(static_cast<size_t>(size()));
    heard[static_cast<size_t>(rank())] = flags;
    const auto deadline = plugin::deadline_after(timeout());
    while (!store.check(outcome_key)) {
      bool everyone_known = true;
      for (int r = 0; r < size(); ++r) {
        if (heard[static_cast<size_t>(r)]) continue;
        const std::string key = round + "flags/" + std::to_string(r);
        if (store.check(key)) {
          heard[static_cast<size_t>(r)] = static_cast<int32_t>(std::stol(text_of(store.get(key, timeout()))));
          continue;
        }
        const pid_t pid = local_pid_of_peer_.empty() ? 0 : local_pid_of_peer_[static_cast<size_t>(r)];
        if (pid == 0 || plugin::process_state(pid) != plugin::ProcessState::kEnded) everyone_known = false;
      }
      if (everyone_known || std::chrono::steady_clock::now() >= deadline) {
        int32_t agreed = ~0;
        std::vector<int32_t> failed;
        for (int r = 0; r < size(); ++r) {
          if (heard[static_cast<size_t>(r)]) {
            agreed &= *heard[static_cast<size_t>(r)];
          } else {
            failed.push_back(r);
          }
        }
        set_first(store, outcome_key, bytes_of(text_of_outcome(agreed, failed)), timeout());
        break;
      }
      store.wait_for(outcome_key, kLookAgain);
    }
    outcome = text_of(store.get(outcome_key, timeout()));
  } catch (const std::exception& e) {
    throw Error(BPL_ERR_REMOTE, what + ": rank " + std::to_string(rank()) +
                                    " cannot reach the job's store, so it is cut off from the job and stops here (only "
                                    "the members that reach the store go on): " + e.what());
  }
  auto [agreed, failed] = outcome_of_text(outcome);
  if (std::binary_search(failed.begin(), failed.end(), rank())) {
    throw Error(BPL_ERR_REMOTE, what + ": the other members counted rank " + std::to_string(rank()) +
                                    " as failed (it did not take part within their timeout of " +
                                    std::to_string(timeout().count()) + " ms), so it is no longer one of them");
  }
  return {agreed, std::move(failed)};
}

void GlooComm::agree(int32_t* flags, int32_t* failed, int32_t* num_failed) {
  Agreement agreed = run_agreement(*flags);
  *flags = agreed.flags;
  std::copy(agreed.failed.begin(), agreed.failed.end(), failed);
  *num_failed = static_cast<int32_t>(agreed.failed.size());
}

std::unique_ptr<GlooComm> GlooComm::shrink(int32_t* failed, int32_t* num_failed) {
  const uint32_t number = agreements_;  // the agreement's, which names the new communicator alike everywhere
  Agreement agreed = run_agreement(~0);
  std::vector<int> survivors;
  for (int r = 0; r < size(); ++r) {
    if (!std::binary_search(agreed.failed.begin(), agreed.failed.end(), r)) survivors.push_back(r);
  }
  const int new_rank = static_cast<int>(std::find(survivors.begin(), survivors.end(), rank()) - survivors.begin());
  std::unique_ptr<GlooComm> shrunk;
  try {
    shrunk = std::make_unique<GlooComm>(shared_, uid_ + "/shrink/" + std::to_string(number), new_rank,
                                        static_cast<int>(survivors.size()), timeout());
  } catch (const Error& e) {
    throw Error(e.status(), "connecting the " + std::to_string(survivors.size()) +
                                " survivors after they agreed (a survivor failed meanwhile: shrink again): " + e.what());
  } catch (const std::exception& e) {
    throw Error(classify_exception(e), "connecting the " + std::to_string(survivors.size()) +
                                           " survivors after they agreed (a survivor failed meanwhile: shrink again): " +
                                           e.what());
  }
  std::copy(agreed.failed.begin(), agreed.failed.end(), failed);
  *num_failed = static_cast<int32_t>(agreed.failed.size());
  return shrunk;
}

}  // namespace backplane::gloo_plugin
