#include "peer_reachability.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace backplane::gloo_plugin {

namespace {

// Probes start after this much silence and repeat at this interval while unanswered (TCP's options
// count in whole seconds).
constexpr int kProbeAfterSeconds = 1;
// Unanswered probes before the kernel ends the connection itself (ETIMEDOUT, which the connection
// watch then sees): the most Linux allows, so that a partition is reported by the operation's own
// timeout, which names the peer, long before.
constexpr int kProbesBeforeGivingUp = 127;
// An answering peer's kernel acknowledges within a round trip, and an idle connection is probed every
// kProbeAfterSeconds: longer without an acknowledgement, while something waits for one, is no answer.
constexpr std::chrono::milliseconds kNoAnswerAfter(1000);

}  // namespace

void probe_while_idle(int fd) {
  const int on = 1;
  const int seconds = kProbeAfterSeconds;
  const int probes = kProbesBeforeGivingUp;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &seconds, sizeof(seconds));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &seconds, sizeof(seconds));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

std::optional<std::chrono::milliseconds> unanswered_for(int fd) {
  tcp_info info{};
  socklen_t length = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return std::nullopt;
  // Retransmissions of unacknowledged data, or keepalive (and zero-window) probes sent since the last
  // acknowledgement: both are reset by any acknowledgement from the peer.
  const bool waiting_for_answer = info.tcpi_retransmits > 0 || info.tcpi_probes > 0;
  const std::chrono::milliseconds silent(info.tcpi_last_ack_recv);
  if (!waiting_for_answer || silent < kNoAnswerAfter) return std::nullopt;
  return silent;
}

}  // namespace backplane::gloo_plugin
