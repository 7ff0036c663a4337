// Tells a peer cut off by the network from one that is only slow, through its kernel's replies.
//
// A stalled operation looks the same from Gloo either way: nothing arrives. But a peer's kernel
// acknowledges what this rank sends it, and answers keepalive probes, even while the peer's process
// is stopped, stuck or far behind; only a machine that is down or cut off answers nothing. So the
// connections to other machines probe while idle (a probe after 1 s of silence: a few bytes a second,
// and none while data flows), and a timed-out operation reads each connection's TCP state: data or a
// probe unacknowledged for a while names that peer unreachable.
#pragma once

#include <chrono>
#include <optional>

namespace backplane::gloo_plugin {

// Turns on keepalive probing of the TCP connection `fd` while it is idle (best effort: a socket that
// refuses the options is only not probed).
void probe_while_idle(int fd);

// How long the connection `fd` has waited for an acknowledgement of data or of a probe it sent, when
// that is long enough to mean its peer's machine does not answer; nullopt when it answers (or the
// connection's state cannot be read).
std::optional<std::chrono::milliseconds> unanswered_for(int fd);

}  // namespace backplane::gloo_plugin
