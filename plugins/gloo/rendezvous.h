// How the ranks of a Gloo runtime find each other: a key-value store (kv_store.h) and a Gloo TCP
// device. The store is the caller's when bpl_init is given one; else backplane's own TCP store at
// MASTER_ADDR:MASTER_PORT, served by rank 0 (tcp_store.h); under a torchrun whose agent hosts the store
// there, the agent's torch TCPStore, through the torch store module (torch_store_module.h).
#pragma once

#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arrival.h"
#include "backplane/plugin.h"
#include "kv_store.h"

namespace backplane::gloo_plugin {

// Where the ranks of a job leave word about a failure, so that each can name its cause: on a store
// connection of its own whose every call gives up within a short bound, since the store's host may be
// the rank that failed. Nothing here throws: an unreachable store reads as "nothing recorded".
class FailureBoard {
 public:
  virtual ~FailureBoard() = default;
  // Records the first value set for `key` and returns it: `value` if this caller was first, else the
  // earlier one. With `defer` above zero it first waits that long for another caller's value, for a
  // caller that knows less than its peers may. Returns `value`, and logs a warning, when the store cannot be reached.
  virtual std::string record_first(const std::string& key, const std::string& value, std::chrono::milliseconds defer) = 0;
  // Leaves `value` under `key` for the others.
  virtual void publish(const std::string& key, const std::string& value) = 0;
  // The values under `keys` once all of them are there, or what is there after `within`: an absent
  // (or unreachable) one is nullopt.
  virtual std::vector<std::optional<std::string>> gather(const std::vector<std::string>& keys,
                                                         std::chrono::milliseconds within) = 0;
};

class TcpStoreServer;

// BPL_GLOO_HOST_ID: ranks of one machine with different values are treated as on different machines
// (as NCCL_HOSTID does), to run the hierarchical path on one machine. It can only split a machine.
std::string machine_partition();

// A process of the job, named alike by every rank: its process space (machine_partition included)
// and pid. arrival.h's gone_key is where the job's store says it ended (Rendezvous::liveness).
std::string process_key(const std::string& process_space, const std::string& pid);
std::string this_process_key();

struct Rendezvous {
  std::shared_ptr<TcpStoreServer> server;              // the store this process serves (rank 0), or null
  std::shared_ptr<::gloo::rendezvous::Store> store;    // every key under this job's prefix
  std::shared_ptr<::gloo::transport::Device> device;   // TCP device on the interface peers can reach
  std::string description;                             // "store=host:port (server|client); transport=tcp iface"
  std::shared_ptr<FailureBoard> board;                 // on the same store, under the same prefix
  int store_host_rank = -1;  // the rank whose process hosts the store (it ends with it); -1: no rank's
  std::shared_ptr<KvStore> kv;  // the store itself (null for a world of one), every key under `prefix`
  std::string prefix;
  // backplane's own store only: a connection that does nothing but end with this process, when the
  // store sets gone_key(this_process_key()) under `prefix`, so that the others know at once.
  std::shared_ptr<KvStore> liveness;
};

// Joins through the launch's store (bpl_init_options.store) when it has one, else at
// MASTER_ADDR:MASTER_PORT (rank 0 hosts the store unless a torchrun agent does); a world of one uses an
// in-process store. Throws on an unreachable store or port in use, naming host:port.
Rendezvous rendezvous(const bpl_launch_info& launch);

// BPL_JOIN=1: this process was started to join a running job (bpl_comm_join); its own world is itself.
bool joining();

// A joining process's way into the job: the job's store (bpl-store, at MASTER_ADDR and BPL_STORE_PORT)
// and a device its members can reach, without any rendezvous.
Rendezvous rendezvous_to_join(const bpl_launch_info& launch);

// The members of a new communicator (bpl_comm_create_from_store) meeting through the caller's `store`
// on the runtime's `device`. Throws plugin::Error: TIMEOUT naming the members missing, MISMATCH.
Rendezvous rendezvous_through(const bpl_store& store, int32_t rank, int32_t size, std::chrono::milliseconds timeout,
                              std::shared_ptr<::gloo::transport::Device> device);

}  // namespace backplane::gloo_plugin
