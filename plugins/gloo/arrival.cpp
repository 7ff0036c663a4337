#include "arrival.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "plugin_support.h"

namespace backplane::gloo_plugin {
namespace {

using plugin::Error;

std::string world_prefix(const std::string& base, int64_t number) { return base + "/world" + std::to_string(number); }

// "rank R (host pid P)": this process, in messages.
std::string this_rank(int32_t rank) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return "rank " + std::to_string(rank) + " (" + host + " pid " + std::to_string(::getpid()) + ")";
}

// Throws the arrival's outcome `first`, recorded under `outcome_key` as "<status>|<reason>".
[[noreturn]] void throw_outcome(const std::string& first, const std::string& outcome_key) {
  const size_t bar = first.find('|');
  const int recorded = bar == std::string::npos ? 0 : std::atoi(first.c_str());
  if (recorded <= BPL_OK || recorded > BPL_ERR_REVOKED || bar + 1 >= first.size()) {
    // No rank writes that: another process reached the job's store.
    throw Error(BPL_ERR_INTERNAL, "the job's store holds '" + first.substr(0, 200) + "' under " + outcome_key +
                                      ", which is no rank's record of a failed rendezvous: a process that is not a "
                                      "rank of this job wrote it (its store is open to any process that reaches it)");
  }
  throw Error(static_cast<bpl_status>(recorded), first.substr(bar + 1));
}

// Records "<status>|<reason>" as the arrival's outcome unless a rank did first, and throws the outcome
// that stands, so that every rank reports the same one.
[[noreturn]] void fail_everyone(KvStore& store, const std::string& outcome_key, bpl_status status,
                                const std::string& reason, std::chrono::milliseconds timeout) {
  throw_outcome(text_of(set_first(store, outcome_key, bytes_of(std::to_string(status) + "|" + reason), timeout)),
                outcome_key);
}

std::string outcome_key(const World& world) { return world.prefix + "/arrival/failed"; }
std::string holder_key(const World& world, int32_t rank) { return world.prefix + "/holder/" + std::to_string(rank); }

}  // namespace

World enter_world(KvStore& store, const std::string& base, int32_t rank, const std::string& process,
                  std::chrono::milliseconds timeout) {
  World world{base, store.add(base + "/entered/rank" + std::to_string(rank), 1), ""};
  world.prefix = world_prefix(base, world.number);
  store.set(holder_key(world, rank), bytes_of(process));
  if (world.number == 1) return world;
  const World before{base, world.number - 1, world_prefix(base, world.number - 1)};
  const std::string holder = text_of(store.get(holder_key(before, rank), timeout));
  if (holder != process && !store.check(before.prefix + "/" + gone_key(holder))) {
    fail_everyone(store, outcome_key(before), BPL_ERR_MISMATCH,
                  this_rank(rank) + " joined, but another process already joined as rank " + std::to_string(rank) +
                      " (" + holder + "): each rank must be started once (check RANK / the launcher)",
                  timeout);
  }
  return world;
}

void arrive(KvStore& store, const World& world, int32_t rank, int32_t size, std::chrono::milliseconds timeout) {
  const std::string prefix = world.prefix + "/arrival/";
  const std::string outcome = outcome_key(world);
  const std::string me = this_rank(rank);
  const std::string size_text = std::to_string(size);
  const std::string agreed = text_of(set_first(store, prefix + "world_size", bytes_of(size_text), timeout));
  if (agreed != size_text) {
    fail_everyone(store, outcome, BPL_ERR_MISMATCH,
                  me + " was started with WORLD_SIZE=" + size_text + " but an earlier rank with WORLD_SIZE=" + agreed +
                      ": every rank must be given the same world size",
                  timeout);
  }
  store.set(prefix + "rank/" + std::to_string(rank), bytes_of("1"));
  // The last to arrive says so; the others wait for that word, looking for a failure between waits.
  const std::string all_joined = prefix + "all_joined";
  if (store.add(prefix + "joined", 1) == size) store.set(all_joined, bytes_of("1"));
  // "<joined>/<world> joined, missing ranks [...]"; `first` becomes the lowest rank that joined.
  auto arrivals = [&](int32_t& first) {
    std::vector<int32_t> missing;
    int32_t joined = 0;
    first = -1;
    for (int32_t r = 0; r < size; ++r) {
      if (!store.check(prefix + "rank/" + std::to_string(r))) {
        missing.push_back(r);
      } else if (joined++ == 0) {
        first = r;
      }
    }
    return std::to_string(joined) + "/" + size_text + " joined, missing ranks " + plugin::list_text(missing);
  };
  const auto deadline = plugin::deadline_after(timeout);
  plugin::WaitReport report(plugin::kWaitReportInterval);
  for (;;) {
    if (store.check(outcome)) throw_outcome(text_of(store.get(outcome, timeout)), outcome);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (store.wait_for(all_joined, std::min(left, std::chrono::milliseconds(50)))) {
      if (rank == 0) {
        store.set(world.base + "/current", bytes_of(std::to_string(world.number)));
        if (world.number > 1) store.erase_prefix(world_prefix(world.base, world.number - 1) + "/");
      }
      return;
    }
    int32_t first = -1;
    if (report.due()) {  // one line a report, from the lowest rank that joined
      const std::string state = arrivals(first);
      if (first == rank) {
        plugin::log(BPL_LOG_INFO, "gloo", "rendezvous: " + state + " after " + report.waited() + " of " +
                                              std::to_string(timeout.count()) + " ms (BPL_TIMEOUT_MS)");
      }
    }
  }
  int32_t first = -1;
  fail_everyone(store, outcome, BPL_ERR_TIMEOUT,
                "timed out after " + std::to_string(timeout.count()) + " ms (BPL_TIMEOUT_MS): " + arrivals(first), timeout);
}

World current_world(KvStore& store, const std::string& base, std::chrono::milliseconds timeout) {
  const std::string current = base + "/current";
  // Before the job's first world is made, it is the one to join.
  World world{base, store.check(current) ? std::atoll(text_of(store.get(current, timeout)).c_str()) : 1, ""};
  world.prefix = world_prefix(base, world.number);
  return world;
}

}  // namespace backplane::gloo_plugin
