// The shared-memory path's point to point (single copy on): sends announced in the mailboxes, matched by
// tag in posting order, carried inside the announcement, through the pair's staging area or read from
// the sender's buffer; sizes that differ, and recvs that are never matched. Rank 0 sends, rank 1
// receives.
#include <atomic>

#include "plugins/gloo/shm_group_test_support.h"

namespace {

using namespace backplane::gloo_plugin::shm_test;

TEST(ShmGroupPointToPoint, TagsMatchOutOfOrderAndTheSameTagInPostingOrder) {
  Segment segment(2);
  auto groups = segment.groups(true);
  run_threads(groups, [&](int rank, ShmGroup& group) {
    std::vector<int> one(1000, 1), two(3, 2), three(5, 3), four(5, 4);
    if (rank == 0) {
      // tag 7: one, then three and four under tag 9 (in that order), then two under tag 8.
      auto a = group.post_send(one.data(), one.size() * 4, 1, 7, kTimeout);
      auto b = group.post_send(three.data(), three.size() * 4, 1, 9, kTimeout);
      auto c = group.post_send(four.data(), four.size() * 4, 1, 9, kTimeout);
      auto d = group.post_send(two.data(), two.size() * 4, 1, 8, kTimeout);
      for (const auto& ticket : {d, c, b, a}) group.wait_sent(ticket, kTimeout);
    } else {
      std::vector<int> got_two(3), got_first9(5), got_second9(5), got_one(1000);
      auto r8 = group.post_recv(got_two.data(), 12, 0, 8);
      auto r9a = group.post_recv(got_first9.data(), 20, 0, 9);
      auto r9b = group.post_recv(got_second9.data(), 20, 0, 9);
      group.wait_received(r9b, kTimeout);  // waited in reverse: still the second send of tag 9
      group.wait_received(r9a, kTimeout);
      group.wait_received(r8, kTimeout);
      group.wait_received(group.post_recv(got_one.data(), 4000, 0, 7), kTimeout);
      EXPECT_EQ(got_two, two);
      EXPECT_EQ(got_first9, three);
      EXPECT_EQ(got_second9, four);
      EXPECT_EQ(got_one, one);
    }
  });
}

TEST(ShmGroupPointToPoint, ManyMoreSendsThanMailboxSlotsArriveInOrder) {
  Segment segment(2);
  auto groups = segment.groups(true);
  const int messages = 3 * static_cast<int>(ShmGroup::kMailboxSlots) + 5;
  run_threads(groups, [&](int rank, ShmGroup& group) {
    if (rank == 0) {
      // Posted ahead of the receiver: once the mailbox is full, a send waits for room.
      std::vector<std::vector<int64_t>> payloads(static_cast<size_t>(messages));
      std::vector<ShmGroup::SendTicket> tickets;
      for (int m = 0; m < messages; ++m) {
        // 0 to 1920 bytes: sends inside the announcement and sends read from the sender's buffer, mixed.
        payloads[static_cast<size_t>(m)].assign(static_cast<size_t>(m % 7) * 40, m);
        tickets.push_back(group.post_send(payloads[static_cast<size_t>(m)].data(), payloads[static_cast<size_t>(m)].size() * 8, 1,
                                          0, kTimeout));
      }
      for (const auto& ticket : tickets) group.wait_sent(ticket, kTimeout);
    } else {
      for (int m = 0; m < messages; ++m) {
        std::vector<int64_t> got(static_cast<size_t>(m % 7) * 40, -1);
        group.wait_received(group.post_recv(got.data(), got.size() * 8, 0, 0), kTimeout);
        if (got != std::vector<int64_t>(static_cast<size_t>(m % 7) * 40, m)) {
          ADD_FAILURE() << "message " << m << " wrong";
          return;
        }
      }
    }
  });
}

TEST(ShmGroupPointToPoint, ASmallSendIsDoneBeforeItsRecvIsPosted) {
  Segment segment(2);
  auto groups = segment.groups(true);
  char small[ShmGroup::kInlineSendBytes];
  for (size_t i = 0; i < sizeof(small); ++i) small[i] = static_cast<char>(i + 1);
  const Outcome sent = outcome_of([&] { groups[0]->wait_sent(groups[0]->post_send(small, sizeof(small), 1, 4, kTimeout), kTimeout); });
  EXPECT_EQ(sent.status, BPL_OK) << sent.message;
  EXPECT_LT(sent.seconds, 0.1) << "the bytes travel in the announcement: nothing to wait for";
  std::memset(small, 0, sizeof(small));  // the sender's buffer is its own again
  char got[ShmGroup::kInlineSendBytes] = {};
  groups[1]->wait_received(groups[1]->post_recv(got, sizeof(got), 0, 4), kTimeout);
  for (size_t i = 0; i < sizeof(got); ++i) ASSERT_EQ(got[i], static_cast<char>(i + 1)) << i;
}

TEST(ShmGroupPointToPoint, DifferentSizesAreAMismatchOnBothSides) {
  // Both sizes above the inline limit, so that the sender waits for the recv and learns its size.
  Segment segment(2);
  auto groups = segment.groups(true);
  const size_t sent_bytes = ShmGroup::kInlineSendBytes + 100, recv_bytes = ShmGroup::kInlineSendBytes + 60;
  std::vector<Outcome> outcomes(2);
  run_threads(groups, [&](int rank, ShmGroup& group) {
    std::vector<char> data(rank == 0 ? sent_bytes : recv_bytes);
    outcomes[static_cast<size_t>(rank)] = outcome_of([&] {
      if (rank == 0) {
        group.wait_sent(group.post_send(data.data(), sent_bytes, 1, 3, kTimeout), kTimeout);
      } else {
        group.wait_received(group.post_recv(data.data(), recv_bytes, 0, 3), kTimeout);
      }
    });
  });
  const std::string sent = std::to_string(sent_bytes), received = std::to_string(recv_bytes);
  EXPECT_EQ(outcomes[0].status, BPL_ERR_MISMATCH);
  EXPECT_EQ(outcomes[0].message, "send of " + sent + " bytes to rank 1 (tag 3) met a recv of " + received + " bytes");
  EXPECT_EQ(outcomes[1].status, BPL_ERR_MISMATCH);
  EXPECT_EQ(outcomes[1].message, "recv of " + received + " bytes from rank 0 (tag 3) met a send of " + sent + " bytes");
}

TEST(ShmGroupPointToPoint, AnUnmatchedRecvTimesOutAndLeavesItsBufferAlone) {
  Segment segment(2);
  auto groups = segment.groups(true);
  int buffer = 5;
  const Outcome waited = outcome_of([&] { groups[1]->wait_received(groups[1]->post_recv(&buffer, 4, 0, 1), milliseconds(300)); });
  EXPECT_EQ(waited.status, BPL_ERR_TIMEOUT) << waited.message;
  EXPECT_NE(waited.message.find("recv from rank 0 (tag 1): no matching send in time"), std::string::npos) << waited.message;
  EXPECT_GE(waited.seconds, 0.29);
  // The group has failed: a send that comes now fails at once, and nothing is written to the buffer.
  int late = 9;
  const Outcome sent = outcome_of([&] { groups[0]->post_send(&late, 4, 1, 1, kTimeout); });
  EXPECT_EQ(sent.status, BPL_ERR_TIMEOUT) << sent.message;
  EXPECT_EQ(buffer, 5);
}

// The staging area holds one send at a time: a send that finds it taken is read from the sender's
// buffer instead, and a recv frees it, also one that refused its send's size. Which way a send went
// shows in what its recv gets when the sender overwrites its buffer after posting.
TEST(ShmGroupPointToPoint, OneSendAtATimeIsStagedAndTheRestAreReadFromTheSendersBuffer) {
  Segment segment(2);
  auto groups = segment.groups(true);
  const size_t bytes = ShmGroup::staged_send_bytes(2);
  ASSERT_GT(bytes, ShmGroup::kInlineSendBytes);
  std::atomic<int> sends_posted{0};
  std::vector<Outcome> refused(2);
  run_threads(groups, [&](int rank, ShmGroup& group) {
    if (rank == 0) {
      std::vector<char> first(bytes, 1), second(bytes, 2), third(bytes, 3), fourth(bytes, 4);
      auto a = group.post_send(first.data(), bytes, 1, 5, kTimeout);   // staged
      auto b = group.post_send(second.data(), bytes, 1, 5, kTimeout);  // the area is taken: read directly
      std::fill(first.begin(), first.end(), 0);
      std::fill(second.begin(), second.end(), 0);
      sends_posted = 1;
      group.wait_sent(a, kTimeout);
      group.wait_sent(b, kTimeout);
      refused[0] = outcome_of([&] { group.wait_sent(group.post_send(third.data(), bytes, 1, 6, kTimeout), kTimeout); });
      auto d = group.post_send(fourth.data(), bytes, 1, 7, kTimeout);  // staged again: the refusal freed it
      std::fill(fourth.begin(), fourth.end(), 0);
      sends_posted = 2;
      group.wait_sent(d, kTimeout);
      return;
    }
    std::vector<char> first(bytes, 9), second(bytes, 9), third(bytes + 64, 9), fourth(bytes, 9);
    while (sends_posted.load() < 1) std::this_thread::yield();
    group.wait_received(group.post_recv(first.data(), bytes, 0, 5), kTimeout);
    group.wait_received(group.post_recv(second.data(), bytes, 0, 5), kTimeout);
    EXPECT_EQ(first, std::vector<char>(bytes, 1)) << "the staged send kept the bytes it was posted with";
    EXPECT_EQ(second, std::vector<char>(bytes, 0)) << "the second send was read from its buffer, as it is now";
    refused[1] = outcome_of([&] { group.wait_received(group.post_recv(third.data(), bytes + 64, 0, 6), kTimeout); });
    while (sends_posted.load() < 2) std::this_thread::yield();
    group.wait_received(group.post_recv(fourth.data(), bytes, 0, 7), kTimeout);
    EXPECT_EQ(fourth, std::vector<char>(bytes, 4));
  });
  EXPECT_EQ(refused[0].status, BPL_ERR_MISMATCH) << refused[0].message;
  EXPECT_EQ(refused[1].status, BPL_ERR_MISMATCH) << refused[1].message;
}

}  // namespace
