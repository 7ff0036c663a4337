// Going on after a failure, with ULFM's semantics: revoke, agree and shrink a gloo communicator, and
// grow it again with newcomers (NCCL's ncclCommGrow), which join through the job's lobby (below).
//
// The job's store is the one arbiter. A revoke is recorded there before the connections are failed, so
// that every member whose operation then fails reads who revoked it. An agreement is a round of keys:
// each member leaves its flags, then waits until every other member has left its own or is known to
// have failed (its process ended: seen here for one on this machine, else said by backplane's own store,
// which sees the process's connection end), or until the communicator's timeout (a stopped or
// unreachable member); it then proposes what it saw, and the first proposal recorded is the outcome
// every member returns, whatever each saw itself. A member that cannot reach the store cannot take part
// in any outcome: it fails, saying it is cut off, so that of a partitioned job only the side that
// reaches the store goes on.
#include <algorithm>
#include <sstream>
#include <thread>

#include "gloo_comm.h"
#include "local_process.h"
#include "rendezvous.h"
#include "plugin_support.h"

namespace backplane::gloo_plugin {

namespace {

// How long one look at the store waits for the outcome before looking again at who answered: the
// wait is the store server's, so a member that waits uses no core.
constexpr std::chrono::milliseconds kLookAgain{20};

// A member still connecting a shrunk communicator is waited for this many timeouts: Gloo's connecting
// of a mesh whose member died midway ends only after several of its timeouts (its pairs wait for that
// member one after another), and a member counted out while it still connects would leave a live rank
// out of the job.
constexpr int kConnectingTimeouts = 6;

// How many timeouts a recovery may go on without a word in the lobby (a shrink's connect between its
// two agreements): a newcomer waits that long after the last word before it gives up.
constexpr int kRecoveryQuietTimeouts = kConnectingTimeouts + 2;

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
  ended_own_connections_ = true;
  if (revoked_.exchange(true)) return;
  const std::string reason =
      "the communicator was revoked (bpl_comm_revoke) by rank " + std::to_string(rank()) + " of this communicator";
  if (size() > 1) {
    // In the store before anything is failed: a member whose operation fails then reads who revoked it.
    // The first revoke stands: the members it reached revoke too (as a survivor does), and must not be
    // named in its place.
    shared_->board->record_first(uid_ + "/revoked", std::to_string(rank()), std::chrono::milliseconds(0));
    shared_->board->record_first(uid_ + "/first_failure",
                                 std::to_string(BPL_ERR_REVOKED) + "|" + std::to_string(rank()) + "|" + reason,
                                 std::chrono::milliseconds(0));
  }
  path_->fail(BPL_ERR_REVOKED, "shared memory: " + reason);
  shut_down_connections();
}

int GlooComm::revoked_by() const {
  if (size() == 1) return -1;
  const std::optional<std::string> by = shared_->board->gather({uid_ + "/revoked"}, std::chrono::milliseconds(0)).front();
  return by ? std::atoi(by->c_str()) : -1;
}

bool GlooComm::has_ended(int member) const {
  const pid_t pid = peers_.local_pid(member);
  if (pid != 0) return plugin::process_state(pid) == plugin::ProcessState::kEnded;
  const std::string& process = peers_.process(member);
  return shared_->liveness != nullptr && !process.empty() && shared_->kv->check(shared_->prefix + "/" + gone_key(process));
}

GlooComm::Agreement GlooComm::run_agreement(int32_t flags, std::chrono::milliseconds patience,
                                            const std::vector<int32_t>& counted_out) {
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
    const auto deadline = plugin::deadline_after(patience);
    while (!store.check(outcome_key)) {
      bool everyone_known = true;
      for (int r = 0; r < size(); ++r) {
        if (heard[static_cast<size_t>(r)] || std::binary_search(counted_out.begin(), counted_out.end(), r)) continue;
        const std::string key = round + "flags/" + std::to_string(r);
        if (store.check(key)) {
          heard[static_cast<size_t>(r)] = static_cast<int32_t>(std::stol(text_of(store.get(key, timeout()))));
          continue;
        }
        if (!has_ended(r)) everyone_known = false;
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
                                    " as failed (it did not take part within " + std::to_string(patience.count()) +
                                    " ms), so it is no longer one of them");
  }
  return {agreed, std::move(failed)};
}

void GlooComm::agree(int32_t* flags, int32_t* failed, int32_t* num_failed) {
  Agreement agreed = run_agreement(*flags, timeout());
  *flags = agreed.flags;
  std::copy(agreed.failed.begin(), agreed.failed.end(), failed);
  *num_failed = static_cast<int32_t>(agreed.failed.size());
}

// Two agreements per attempt: who is alive, then, once the survivors have connected among themselves,
// whether every one of them could. A member may fail while they connect, and some may have connected
// (it failed after their part) while others could not: only when all of them say they connected, and
// no member failed meanwhile, do they keep the new communicator; otherwise all of them drop it and try
// again without the members found failed. So every survivor leaves with the same communicator, never
// some with one and some with another (two groups training apart).
std::unique_ptr<GlooComm> GlooComm::shrink(int32_t* failed, int32_t* num_failed) {
  for (int attempt = 0; attempt < size(); ++attempt) {
    const uint32_t number = agreements_;  // names the new communicator alike on every survivor
    say_recovering();
    const Agreement alive = run_agreement(~0, timeout());
    say_counted_out(alive.failed);
    std::vector<int> survivors;
    for (int r = 0; r < size(); ++r) {
      if (!std::binary_search(alive.failed.begin(), alive.failed.end(), r)) survivors.push_back(r);
    }
    const int new_rank = static_cast<int>(std::find(survivors.begin(), survivors.end(), rank()) - survivors.begin());
    std::unique_ptr<GlooComm> shrunk;
    std::string why_not;
    try {
      shrunk = std::make_unique<GlooComm>(shared_, uid_ + "/shrink/" + std::to_string(number), new_rank,
                                          static_cast<int>(survivors.size()), timeout());
    } catch (const std::exception& e) {
      why_not = e.what();
    }
    const Agreement connected = run_agreement(shrunk ? 1 : 0, kConnectingTimeouts * timeout(), alive.failed);
    if (connected.flags == 1 && connected.failed == alive.failed) {
      std::copy(alive.failed.begin(), alive.failed.end(), failed);
      *num_failed = static_cast<int32_t>(alive.failed.size());
      return shrunk;
    }
    plugin::log(BPL_LOG_INFO, "gloo",
                "shrink: a survivor failed while the " + std::to_string(survivors.size()) +
                    " survivors connected; trying again" + (why_not.empty() ? "" : " (here: " + why_not + ")"));
  }
  throw Error(BPL_ERR_REMOTE, "shrink: members kept failing while the survivors connected, " + std::to_string(size()) +
                                  " times");
}

void GlooComm::say_counted_out(const std::vector<int32_t>& members) {
  if (!shared_->kv) return;
  try {
    for (int32_t r : members) {
      const std::string& process = peers_.process(r);
      if (!process.empty()) shared_->kv->set(counted_out_key(process), bytes_of("1"));
    }
  } catch (const std::exception& e) {  // the agreement that follows finds the store gone, and says so
    plugin::log(BPL_LOG_WARN, "gloo", std::string("shrink: cannot say in the store who was counted out: ") + e.what());
  }
}

// The lobby, every key under the job's prefix: a newcomer takes ticket t (lobby/arrived counts them)
// and says so (lobby/<t>/process); a grow takes the next `joiners` tickets not yet admitted (from
// lobby/next, read by the first member to claim the grow), waits for each to be taken, and tells each
// newcomer its place (lobby/<t>/admitted: "uid|rank|size"), the same words from every member, once
// they have agreed that every member is still here. Only a grow that admitted them all moves lobby/next
// on: after one that timed out or lost a member, the next admits the same newcomers. One grow at a time
// in a job.
namespace {

std::string lobby(const Shared& job, const std::string& key) { return job.prefix + "/lobby/" + key; }

}  // namespace

// Each step of a recovery (a shrink's attempt, a grow) counts in the lobby, so that a newcomer waiting
// there knows the members are still on their way to admit it.
void GlooComm::say_recovering() {
  if (!shared_->kv) return;
  try {
    shared_->kv->add(lobby(*shared_, "recovering"), 1);
  } catch (const std::exception& e) {  // the agreement that follows finds the store gone, and says so
    plugin::log(BPL_LOG_WARN, "gloo", std::string("cannot say in the lobby that a recovery goes on: ") + e.what());
  }
}

std::unique_ptr<GlooComm> GlooComm::grow(int32_t joiners) {
  if (!shared_->kv) throw Error(BPL_ERR_UNSUPPORTED, "grow: a world of one, started without a job's store, has no lobby");
  KvStore& store = *shared_->kv;
  const uint32_t number = grows_++;
  const std::string grow_key = shared_->prefix + "/" + uid_ + "/grow/" + std::to_string(number);
  const std::string uid = uid_ + "/grow/" + std::to_string(number);
  const int new_size = size() + joiners;
  int64_t first_ticket = 0;
  say_recovering();
  try {
    const bool claimer = store.add(grow_key + "/claimed", 1) == 1;
    if (claimer) {
      const std::string next = lobby(*shared_, "next");
      first_ticket = store.check(next) ? std::stoll(text_of(store.get(next, timeout()))) : 1;
      store.set(grow_key + "/first_ticket", bytes_of(std::to_string(first_ticket)));
    } else {
      first_ticket = std::stoll(text_of(store.get(grow_key + "/first_ticket", timeout())));
    }
    const auto deadline = plugin::deadline_after(timeout());
    int came = 0;
    for (; came < joiners; ++came) {
      const std::string ticket = std::to_string(first_ticket + came);
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (!store.wait_for(lobby(*shared_, ticket + "/process"), std::max(left, std::chrono::milliseconds(1)))) break;
    }
    // The members agree that every newcomer came and every member is still here before the newcomers
    // learn their places, so that all end the same way: one member's wait could end just as the last
    // newcomer came, and one that failed meanwhile would hold everyone in the new communicator's connect
    // until the timeout. Not admitted, the newcomers wait on for the next grow, which takes the same tickets.
    const Agreement outcome = run_agreement(came == joiners ? 1 : 0, timeout());
    if (!outcome.failed.empty()) {
      std::string ranks;
      for (int32_t r : outcome.failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      throw Error(BPL_ERR_REMOTE, "grow: rank(s) " + ranks + " of this communicator failed while it waited for the " +
                                      "newcomers, who were not admitted (revoke, shrink and grow again)");
    }
    if (outcome.flags == 0) {
      throw Error(BPL_ERR_TIMEOUT, "grow: " + std::to_string(came) + " of the " + std::to_string(joiners) +
                                       " newcomers came within " + std::to_string(timeout().count()) +
                                       " ms here, fewer than all on some member (a newcomer is a process started "
                                       "with BPL_JOIN=1 that calls bpl_comm_join, as bpl-run --replace starts one)");
    }
    for (int i = 0; i < joiners; ++i) {
      store.set(lobby(*shared_, std::to_string(first_ticket + i) + "/admitted"),
                bytes_of(uid + "|" + std::to_string(size() + i) + "|" + std::to_string(new_size)));
    }
    if (claimer) store.set(lobby(*shared_, "next"), bytes_of(std::to_string(first_ticket + joiners)));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(BPL_ERR_REMOTE, "grow: the job's store cannot be reached: " + std::string(e.what()));
  }
  return std::make_unique<GlooComm>(shared_, uid, rank(), new_size, timeout());
}

std::unique_ptr<GlooComm> GlooComm::join(std::shared_ptr<Shared> job, std::chrono::milliseconds timeout) {
  KvStore& store = *job->kv;
  std::string place;
  try {
    const std::string ticket = std::to_string(store.add(lobby(*job, "arrived"), 1));
    store.set(lobby(*job, ticket + "/process"), bytes_of(this_process_key()));
    // The members may be a long way from their grow (a second failure while they shrink): this waits
    // as long as they go on recovering, and gives up only after a quiet as long as a recovery's longest.
    const std::string admitted = lobby(*job, ticket + "/admitted"), recovering = lobby(*job, "recovering");
    const auto quiet = kRecoveryQuietTimeouts * timeout;
    auto give_up = plugin::deadline_after(quiet);
    int64_t steps_seen = store.add(recovering, 0);
    while (!store.wait_for(admitted, kLookAgain * 10)) {
      const int64_t steps = store.add(recovering, 0);
      if (steps != steps_seen) {
        steps_seen = steps;
        give_up = plugin::deadline_after(quiet);
      } else if (std::chrono::steady_clock::now() >= give_up) {
        throw Error(BPL_ERR_TIMEOUT, "join: no member of the job admitted this process (bpl_comm_grow) within " +
                                         std::to_string(quiet.count()) + " ms of the members' last step of recovery (" +
                                         std::to_string(kRecoveryQuietTimeouts) + " x the timeout, " +
                                         std::to_string(timeout.count()) + " ms); it came as newcomer " + ticket);
      }
    }
    place = text_of(store.get(admitted, timeout));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(BPL_ERR_REMOTE, "join: the job's store cannot be reached: " + std::string(e.what()));
  }
  const size_t bar1 = place.find('|'), bar2 = place.rfind('|');
  return std::make_unique<GlooComm>(std::move(job), place.substr(0, bar1), std::stoi(place.substr(bar1 + 1, bar2 - bar1 - 1)),
                                    std::stoi(place.substr(bar2 + 1)), timeout);
}

}  // namespace backplane::gloo_plugin
