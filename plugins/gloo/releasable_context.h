// A Gloo context whose sends and receives, those of Gloo's own algorithms included, can all be
// released at once when its communicator fails.
//
// A failed TCP pair wakes the waits it knows of, but not a send it has begun writing (its failure
// passes over the unbound buffers in its write queue): a rank inside an allreduce whose peer failed
// mid-send then waits out its whole timeout. The plugin could release its own transfers by their
// buffers, but Gloo's algorithms make theirs inside. So ReleasableContext stands between Gloo's
// context and its transport, through transport::Context, the interface Gloo's transports implement
// (every call is passed on to the TCP transport): each buffer is made here, and release() ends every
// wait on one, now or later, with TransferReleased.
#pragma once

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>

#include <memory>

namespace backplane::gloo_plugin {

// What a send, recv or wait on a released context throws: an I/O error, as a failed pair's is.
struct TransferReleased : ::gloo::IoException {
  explicit TransferReleased(bool is_send)
      : ::gloo::IoException(std::string(is_send ? "send" : "recv") + " released: the communicator's connections ended") {}
};

class ReleasableContext : public ::gloo::rendezvous::Context {
 public:
  ReleasableContext(int rank, int size);
  ~ReleasableContext() override;

  // Gloo's connectFullMesh, then every buffer of the context is made through this one.
  void connect_full_mesh(::gloo::rendezvous::Store& store, std::shared_ptr<::gloo::transport::Device>& device);
  // From any thread: every wait on the context's buffers in progress throws TransferReleased, and so
  // does every send, recv or wait after it, and the connections are closed. For good: the
  // communicator has failed.
  void release();

 private:
  class Transport;
  std::shared_ptr<Transport> transport_;
};

}  // namespace backplane::gloo_plugin
