// bpl-store's torch side. A job has one port: bpl-store serves backplane's store there, and a program's
// torch.distributed store too (bpl-run sets TORCHELASTIC_USE_AGENT_STORE=True, as torchrun does when its
// agent hosts the store). A connection that opens as torch's TCPStore client does is relayed, byte for
// byte, to a TCPStore that this process serves on its loopback through the torch store module
// (plugins/torch_store), started on the first such connection: a job whose ranks have no torch
// client loads no LibTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

class TorchStoreRelay {
 public:
  // `module_path`: libbpl-torch-store.so; "" where this tree has none (torch clients are then refused,
  // saying why, on stderr).
  explicit TorchStoreRelay(std::string module_path);

  // A torch client's socket and the bytes read from it so far: relayed on a thread of its own, which
  // ends with the connection (TcpStoreServer::TorchClients).
  void take(int fd, std::vector<uint8_t> received);

 private:
  struct TorchSide;
  std::shared_ptr<TorchSide> torch_;
};
