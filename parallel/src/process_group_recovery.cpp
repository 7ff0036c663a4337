// ProcessGroup's part in going on after a failure: revoke, agree, shrink and grow (bpl_comm_revoke,
// _agree, _shrink, _grow), and the renewal by which a group object that layers and optimizers hold
// goes on over a new communicator.
#include <algorithm>
#include <numeric>
#include <utility>

#include "backplane/parallel/process_group.h"
#include "runtime_link.h"

namespace backplane::parallel {

void ProcessGroup::revoke() const { check(bpl_comm_revoke(comm()), "revoke"); }

ProcessGroup::Agreement ProcessGroup::agree(int32_t flags) const {
  std::vector<int32_t> failed(ranks_.size());
  int32_t num_failed = 0;
  check(bpl_comm_agree(comm(), &flags, failed.data(), &num_failed), "agree");
  return {flags, std::vector<int>(failed.begin(), failed.begin() + num_failed)};
}

ProcessGroup::Shrunk ProcessGroup::shrink() const {
  std::vector<int32_t> failed(ranks_.size());
  int32_t num_failed = 0;
  bpl_comm* survivors = nullptr;
  check(bpl_comm_shrink(comm(), failed.data(), &num_failed, &survivors), "shrink");
  failed.resize(static_cast<size_t>(num_failed));
  std::vector<int> members;  // the survivors' global ranks, in their old order
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!std::binary_search(failed.begin(), failed.end(), static_cast<int32_t>(r))) members.push_back(ranks_[r]);
  }
  return {std::make_shared<ProcessGroup>(runtime_, survivors, true, std::move(members)),
          std::vector<int>(failed.begin(), failed.end())};
}

std::shared_ptr<ProcessGroup> ProcessGroup::grow(int joiners) const {
  bpl_comm* grown = nullptr;
  check(bpl_comm_grow(comm(), joiners, &grown), "grow");
  std::vector<int> members = ranks_;
  const int next = *std::max_element(ranks_.begin(), ranks_.end()) + 1;
  for (int j = 0; j < joiners; ++j) members.push_back(next + j);
  return std::make_shared<ProcessGroup>(runtime_, grown, true, std::move(members));
}

namespace detail {

// `group` takes `fresh`'s communicator and members, and `fresh` the old ones, which it releases when it
// goes. With `renumber`, the members' global ranks become 0 … size-1 (a new world).
void renew_group(ProcessGroup& group, ProcessGroup& fresh, bool renumber) {
  std::swap(group.comm_, fresh.comm_);
  std::swap(group.owns_comm_, fresh.owns_comm_);
  std::swap(group.ranks_, fresh.ranks_);
  std::swap(group.rank_, fresh.rank_);
  if (renumber) std::iota(group.ranks_.begin(), group.ranks_.end(), 0);
}

}  // namespace detail
}  // namespace backplane::parallel
