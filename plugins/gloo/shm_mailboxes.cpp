// ShmGroup's point to point: sends announced in mailboxes, matched and read by the receiver.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "fingerprint.h"
#include "local_process.h"
#include "plugin_support.h"
#include "shm_internal.h"

namespace backplane::gloo_plugin {

namespace {

// The groups of this process with recvs posted (ShmGroup::drive_posted_receives). Never destroyed: a
// group may end after static destructors ran.
struct ReceivingGroups {
  std::mutex mutex;
  std::vector<ShmGroup*> groups;  // their count in ShmGroup::groups_receiving_
};
ReceivingGroups& receiving_groups() {
  static auto* groups = new ReceivingGroups;
  return *groups;
}

}  // namespace

/* ---- point to point ---- */

void ShmGroup::drive_listed_receives() {
  ReceivingGroups& receiving = receiving_groups();
  std::unique_lock<std::mutex> listed(receiving.mutex, std::try_to_lock);
  if (!listed.owns_lock()) return;  // another thread's pass is reading for them
  auto& groups = receiving.groups;
  for (auto it = groups.begin(); it != groups.end();) {
    ShmGroup& group = **it;
    std::unique_lock<std::mutex> lock(group.p2p_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
      ++it;
      continue;
    }
    try {
      group.match_arrivals_from(kAnyRank);
    } catch (const std::exception&) {
      // A failed read failed that group: its own waits throw the failure.
    }
    const bool pending = !group.pending_from_any_.empty() ||
                         std::any_of(group.pending_recvs_.begin(), group.pending_recvs_.end(),
                                     [](const auto& recvs) { return !recvs.empty(); });
    if (pending) {
      ++it;
      continue;
    }
    group.receiving_listed_ = false;
    it = groups.erase(it);
    groups_receiving_.store(groups.size(), std::memory_order_relaxed);
  }
}

void ShmGroup::list_as_receiving() {
  if (receiving_listed_) return;
  ReceivingGroups& receiving = receiving_groups();
  std::lock_guard<std::mutex> listed(receiving.mutex);
  receiving.groups.push_back(this);
  groups_receiving_.store(receiving.groups.size(), std::memory_order_relaxed);
  receiving_listed_ = true;
}

void ShmGroup::withdraw_from_receiving() {
  ReceivingGroups& receiving = receiving_groups();
  std::lock_guard<std::mutex> listed(receiving.mutex);  // after any pass that reads for this group
  auto& groups = receiving.groups;
  groups.erase(std::remove(groups.begin(), groups.end(), this), groups.end());
  groups_receiving_.store(groups.size(), std::memory_order_relaxed);
}

ShmGroup::SendTicket ShmGroup::post_send(const void* buf, size_t bytes, int peer, int tag,
                                         std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
  uint64_t sequence;
  {
    std::lock_guard<std::mutex> lock(p2p_mutex_);  // sequence numbers in call order
    sequence = sends_announced_[static_cast<size_t>(peer)]++;
  }
  Mailbox& box = mailbox(rank_, peer);
  Announcement& slot = box.slots[sequence % kMailboxSlots];
  // The slot's last send, kMailboxSlots ago, must have been read. (The receiver takes announcements in
  // sequence order, so it waits for an earlier send of this rank still waiting for its slot.)
  const bool first_use = sequence < kMailboxSlots;
  const auto last_use = static_cast<uint32_t>(sequence - kMailboxSlots + 1);
  wait_until(peer, box.done, [&] {
               return first_use ? slot.posted.load(std::memory_order_acquire) == 0
                                : slot.done.load(std::memory_order_acquire) == last_use;
             },
             deadline, [&] {
               return "send to rank " + std::to_string(rank_name(peer)) + " (tag " + std::to_string(tag) + "): the " +
                      std::to_string(kMailboxSlots) + " sends to it before this one were not received in time";
             });
  std::lock_guard<std::mutex> lock(p2p_mutex_);  // against wait_sent reading the last send's outcome
  if (!first_use && slot.status != BPL_OK) refused_sends_[{peer, sequence - kMailboxSlots}] = slot.received_bytes;
  slot.tag = tag;
  slot.status = BPL_OK;
  slot.bytes = bytes;
  const bool inline_send = bytes <= kInlineSendBytes;
  uint32_t free = 0;  // the staging area's, when it holds no send
  const bool staged = !inline_send && bytes <= staged_send_bytes(size_) &&
                      box.staged_by.compare_exchange_strong(free, static_cast<uint32_t>(sequence + 1),
                                                            std::memory_order_acquire);
  if (inline_send && bytes > 0) std::memcpy(slot.data, buf, bytes);
  if (staged) copy_to_peers(staging(rank_, peer), buf, bytes);
  slot.staged = staged ? 1 : 0;
  slot.address = inline_send || staged ? 0 : reinterpret_cast<uint64_t>(buf);
  slot.posted.store(static_cast<uint32_t>(sequence + 1), std::memory_order_release);
  box.posted.fetch_add(1, std::memory_order_seq_cst);
  // The peer's own mailbox, which no send uses, counts the sends to it from every rank: what a recv
  // from any rank sleeps on.
  Mailbox& any_sender = mailbox(peer, peer);
  any_sender.posted.fetch_add(1, std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) {
    futex_wake_all(&box.posted);
    futex_wake_all(&any_sender.posted);
  }
  return {peer, tag, bytes, sequence};
}

void ShmGroup::wait_sent(const SendTicket& ticket, std::chrono::milliseconds timeout) {
  if (ticket.bytes <= kInlineSendBytes) return;  // copied into the announcement: the buffer is free
  Mailbox& box = mailbox(rank_, ticket.peer);
  Announcement& slot = box.slots[ticket.sequence % kMailboxSlots];
  const int tag = ticket.tag;
  const uint64_t bytes = ticket.bytes;
  const auto sent = static_cast<uint32_t>(ticket.sequence + 1);
  // Done once the slot's count of reads reaches this send's (a later send may have taken it since).
  wait_until(ticket.peer, box.done, [&] { return static_cast<int32_t>(slot.done.load(std::memory_order_acquire) - sent) >= 0; },
             Deadline(timeout), [&] {
               return "send to rank " + std::to_string(rank_name(ticket.peer)) + " (tag " + std::to_string(tag) +
                      ") was not received in time";
             });
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  uint64_t received = bytes;
  if (slot.posted.load(std::memory_order_relaxed) == sent) {
    if (slot.status != BPL_OK) received = slot.received_bytes;
  } else if (auto refused = refused_sends_.find({ticket.peer, ticket.sequence}); refused != refused_sends_.end()) {
    received = refused->second;
    refused_sends_.erase(refused);
  }
  if (received != bytes) {
    throw plugin::Error(BPL_ERR_MISMATCH, "send of " + std::to_string(bytes) + " bytes to rank " +
                                              std::to_string(rank_name(ticket.peer)) + " (tag " + std::to_string(tag) +
                                              ") met a recv of " + std::to_string(received) + " bytes");
  }
}

std::shared_ptr<ShmGroup::PendingRecv> ShmGroup::post_recv(void* buf, size_t bytes, int peer, int tag) {
  if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
  auto recv = std::make_shared<PendingRecv>();
  recv->buf = buf;
  recv->bytes = bytes;
  recv->peer = peer;
  recv->tag = tag;
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  recv->order = recvs_posted_++;
  pending_of(peer).push_back(recv);
  match_arrivals_from(peer);  // a send already announced completes it at once
  if (!recv->done) list_as_receiving();
  return recv;
}

void ShmGroup::withdraw(const std::shared_ptr<PendingRecv>& recv) {
  std::lock_guard<std::mutex> lock(p2p_mutex_);
  auto& pending = pending_of(recv->peer);
  pending.erase(std::remove(pending.begin(), pending.end(), recv), pending.end());
}

std::deque<std::shared_ptr<ShmGroup::PendingRecv>>& ShmGroup::pending_of(int peer) {
  return peer == kAnyRank ? pending_from_any_ : pending_recvs_[static_cast<size_t>(peer)];
}

void ShmGroup::match_arrivals_from(int peer) {
  if (peer != kAnyRank) return match_arrivals(peer);
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) match_arrivals(p);
  }
}

int ShmGroup::wait_received(const std::shared_ptr<PendingRecv>& recv, std::chrono::milliseconds timeout) {
  const int peer = recv->peer;
  const bool from_any = peer == kAnyRank;
  try {
    wait_until(peer, mailbox(from_any ? rank_ : peer, rank_).posted, [&] {
                 std::lock_guard<std::mutex> lock(p2p_mutex_);
                 match_arrivals_from(peer);
                 return recv->done;
               },
               Deadline(timeout), [&] {
                 return "recv from " + (from_any ? std::string("any rank") : "rank " + std::to_string(rank_name(peer))) +
                        " (tag " + std::to_string(recv->tag) + "): no matching send in time";
               });
  } catch (...) {
    withdraw(recv);  // never matched: its buffer is the caller's again
    throw;
  }
  if (recv->status != BPL_OK) throw plugin::Error(recv->status, recv->error);
  return recv->source;
}

bool ShmGroup::received(const std::shared_ptr<PendingRecv>& recv, int* source) {
  {
    std::lock_guard<std::mutex> lock(p2p_mutex_);
    match_arrivals_from(recv->peer);
    if (!recv->done) {
      if (header_->failed_by.load(std::memory_order_acquire) == 0) return false;
    } else if (recv->status == BPL_OK) {
      *source = recv->source;
      return true;
    }
  }
  if (!recv->done) {
    withdraw(recv);
    throw_failure_record();
  }
  throw plugin::Error(recv->status, recv->error);
}

bool ShmGroup::sent(const SendTicket& ticket) {
  if (ticket.bytes > kInlineSendBytes) {
    const Announcement& slot = mailbox(rank_, ticket.peer).slots[ticket.sequence % kMailboxSlots];
    const auto sent = static_cast<uint32_t>(ticket.sequence + 1);
    if (static_cast<int32_t>(slot.done.load(std::memory_order_acquire) - sent) < 0) {
      if (header_->failed_by.load(std::memory_order_acquire) != 0) throw_failure_record();
      return false;
    }
  }
  wait_sent(ticket, std::chrono::milliseconds(0));  // received: says whether the sizes matched
  return true;
}

std::string ShmGroup::give_up(int peer, const std::shared_ptr<PendingRecv>& recv, const std::string& what) {
  if (recv) withdraw(recv);
  std::string reason = "shared memory: " + what;
  const pid_t pid = peer_pid(peer);  // 0 for kAnyRank
  if (pid != 0 && plugin::process_state(pid) == plugin::ProcessState::kStopped) {
    reason += " (" + plugin::local_peer_description(rank_name(peer), pid, plugin::ProcessState::kStopped) + ")";
  }
  fail(BPL_ERR_TIMEOUT, reason, peer);
  return reason;
}

void ShmGroup::match_arrivals(int peer) {
  if (header_->failed_by.load(std::memory_order_acquire) != 0) return;
  Mailbox& box = mailbox(peer, rank_);
  auto& arrived = arrived_[static_cast<size_t>(peer)];
  uint32_t& taken = arrivals_taken_[static_cast<size_t>(peer)];
  for (;;) {
    Announcement& slot = box.slots[taken % kMailboxSlots];
    if (slot.posted.load(std::memory_order_acquire) != taken + 1) break;
    arrived.push_back({taken, slot.tag, slot.bytes, slot.address, slot.staged != 0});
    ++taken;
  }
  // The recvs this peer's sends may complete, from it or from any rank, take them in the order they
  // were posted: each the oldest arrival of its tag.
  auto& from_peer = pending_recvs_[static_cast<size_t>(peer)];
  auto& from_any = pending_from_any_;
  auto next_from_peer = from_peer.begin(), next_from_any = from_any.begin();
  while (next_from_peer != from_peer.end() || next_from_any != from_any.end()) {
    const bool any_first = next_from_peer == from_peer.end() ||
                           (next_from_any != from_any.end() && (*next_from_any)->order < (*next_from_peer)->order);
    auto& pending = any_first ? from_any : from_peer;
    auto& recv = any_first ? next_from_any : next_from_peer;
    const auto match = std::find_if(arrived.begin(), arrived.end(), [&](const Arrival& a) { return a.tag == (*recv)->tag; });
    if (match == arrived.end()) {
      ++recv;
      continue;
    }
    const Arrival arrival = *match;
    arrived.erase(match);
    const std::shared_ptr<PendingRecv> matched = *recv;
    PendingRecv& mine = *matched;
    mine.source = rank_name(peer);
    recv = pending.erase(recv);  // the other list's position stays valid
    Announcement& slot = box.slots[arrival.sequence % kMailboxSlots];
    if (arrival.bytes != mine.bytes) {
      slot.status = BPL_ERR_MISMATCH;
      slot.received_bytes = mine.bytes;
      mine.status = BPL_ERR_MISMATCH;
      mine.error = "recv of " + std::to_string(mine.bytes) + " bytes from rank " + std::to_string(rank_name(peer)) +
                   " (tag " + std::to_string(mine.tag) + ") met a send of " + std::to_string(arrival.bytes) + " bytes";
    } else if (arrival.staged) {
      copy_bytes(mine.buf, staging(peer, rank_), arrival.bytes);
    } else if (arrival.address == 0) {
      if (arrival.bytes > 0) std::memcpy(mine.buf, slot.data, arrival.bytes);
    } else {
      read_peer(peer, mine.buf, arrival.address, arrival.bytes, /*two_threads=*/true);
    }
    if (arrival.staged) box.staged_by.store(0, std::memory_order_release);  // for the pair's next send
    mine.done = true;
    slot.done.store(arrival.sequence + 1, std::memory_order_release);
    box.done.fetch_add(1, std::memory_order_seq_cst);
    if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&box.done);
  }
}


}  // namespace backplane::gloo_plugin
