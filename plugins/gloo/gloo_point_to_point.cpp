// The gloo communicator's sends and receives: posted at once on its path (Gloo's pairs, or shared
// memory's mailboxes), waited for within the communicator's timeout, and a failure named by peer and tag.
#include "gloo_comm.h"

#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gloo_comm_internal.h"
#include "plugin_support.h"
#include "stall.h"

namespace backplane::gloo_plugin {

void GlooComm::point_to_point(void* buf, size_t bytes, int peer, int tag, bool is_send, bpl_plugin_request** req) {
  if (req == nullptr) return path_->post_transfer(buf, bytes, peer, tag, is_send)();
  *req = reinterpret_cast<bpl_plugin_request*>(path_->post_request(buf, bytes, peer, tag, is_send, nullptr).release());
}

// Over Gloo's pairs the slot carries the tag and 24 bits of a hash of the size: a send and a recv of
// different sizes never match (they stall, time out, and are told why) instead of the larger
// overflowing the smaller, which Gloo's transport answers with abort().
std::function<void()> GlooComm::post_pair_transfer(void* buf, size_t bytes, int peer, int tag, bool is_send,
                                                   uint8_t slot_prefix) {
  const uint64_t slot = slot_of(slot_prefix, tag, bytes);
  std::shared_ptr<::gloo::transport::UnboundBuffer> buffer = context_->createUnboundBuffer(buf, bytes);
  try {
    if (is_send) {
      buffer->send(peer, slot);
    } else {
      buffer->recv(peer, slot);
    }
  } catch (const ::gloo::Exception& e) {  // the pair had already failed
    if (slot_prefix != kPointToPointSlotPrefix) throw;  // a collective's: explained as a collective's
    throw point_to_point_failure(e, is_send, peer, tag, bytes);
  }
  return [this, buffer, is_send, peer, tag, bytes, slot_prefix, timeout = timeout()] {
    try {
      // Completed, or thrown: Gloo's failure, or TransferReleased when the connections were shut down.
      if (is_send) {
        buffer->waitSend(timeout);
      } else {
        buffer->waitRecv(timeout);
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      if (slot_prefix != kPointToPointSlotPrefix) throw;
      throw point_to_point_failure(e, is_send, peer, tag, bytes);
    }
  };
}

uint64_t GlooComm::slot_of(uint8_t slot_prefix, int tag, size_t bytes) {
  uint64_t size_hash = bytes * 0x9E3779B97F4A7C15ull;
  size_hash ^= size_hash >> 29;
  return (static_cast<uint64_t>(slot_prefix) << 56) | (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 24) |
         (size_hash & 0xffffff);
}

std::function<void()> GlooComm::post_pair_recv_from_any(void* buf, size_t bytes, int tag, int32_t* source) {
  std::vector<int> others;
  for (int r = 0; r < size(); ++r) {
    if (r != rank()) others.push_back(r);
  }
  std::shared_ptr<::gloo::transport::UnboundBuffer> buffer = context_->createUnboundBuffer(buf, bytes);
  const auto explained = [this, tag](const std::exception& e) {
    if (aborted_.load()) return failure(e);
    std::string message = e.what();
    const bpl_status status = status_of(e);
    const std::string peers_note = failed_peers_note(message, status);
    message += peers_note;
    if (status == BPL_ERR_TIMEOUT) {
      message += " (no rank sent with tag " + std::to_string(tag) + " within " + std::to_string(timeout().count()) + " ms)";
    }
    return recorded_failure(status, message, record_defer(status, peers_note));
  };
  try {
    buffer->recv(others, slot_of(kPointToPointSlotPrefix, tag, bytes));
  } catch (const ::gloo::Exception& e) {  // a pair had already failed
    throw explained(e);
  }
  return [buffer, source, explained, timeout = timeout()] {
    try {
      int sender = -1;
      buffer->waitRecv(&sender, timeout);
      *source = sender;
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw explained(e);
    }
  };
}

// Sender and receiver each leave what they posted in the store, under the pair of ranks and the tag;
// each then compares with the other's.
Error GlooComm::point_to_point_failure(const std::exception& e, bool is_send, int peer, int tag, size_t bytes) {
  if (aborted_.load()) return failure(e);
  const bpl_status status = status_of(e);
  if (status == BPL_ERR_TIMEOUT) {
    const int sender = is_send ? rank() : peer, receiver = is_send ? peer : rank();
    const std::string key = uid_ + "/p2p/" + std::to_string(sender) + "-" + std::to_string(receiver) + "/" +
                            std::to_string(tag) + "/";
    shared_->board->publish(key + (is_send ? "send" : "recv"), std::to_string(bytes));
    const std::optional<std::string> theirs =
        shared_->board->gather({key + (is_send ? "recv" : "send")}, explanation_window(timeout())).front();
    if (theirs && *theirs != std::to_string(bytes)) {
      const std::string sent = is_send ? std::to_string(bytes) : *theirs;
      const std::string received = is_send ? *theirs : std::to_string(bytes);
      return recorded_failure(BPL_ERR_MISMATCH, "rank " + std::to_string(sender) + " sends " + sent + " bytes to rank " +
                                                    std::to_string(receiver) + " with tag " + std::to_string(tag) +
                                                    ", which receives " + received + " bytes with that tag");
    }
  }
  std::string message = e.what();
  // Gloo fails a transfer only by its own pair's failure; a released one says nothing about its peer.
  const bool released = dynamic_cast<const TransferReleased*>(&e) != nullptr;
  const std::string peers_note = failed_peers_note(message, status, released ? -1 : peer);
  message += peers_note;
  if (status == BPL_ERR_TIMEOUT) {
    message += std::string(" (rank ") + std::to_string(peer) + " posted no matching " + (is_send ? "recv" : "send") +
               " with tag " + std::to_string(tag) + " within " + std::to_string(timeout().count()) + " ms)";
  }
  return recorded_failure(status, message, record_defer(status, peers_note));
}

void GlooComm::send(const void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req) {
  point_to_point(const_cast<void*>(buf), count * plugin::dtype_size(dtype), peer, tag, true, req);
}

void GlooComm::recv(void* buf, size_t count, bpl_dtype dtype, int peer, int tag, bpl_plugin_request** req) {
  point_to_point(buf, count * plugin::dtype_size(dtype), peer, tag, false, req);
}

void GlooComm::recv_any(void* buf, size_t count, bpl_dtype dtype, int tag, int32_t* source, bpl_plugin_request** req) {
  const size_t bytes = count * plugin::dtype_size(dtype);
  if (req == nullptr) return path_->post_recv_from_any(buf, bytes, tag, source)();
  *req = reinterpret_cast<bpl_plugin_request*>(path_->post_request(buf, bytes, /*peer=*/-1, tag, false, source).release());
}

}  // namespace backplane::gloo_plugin
