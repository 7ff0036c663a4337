#include "torch_store_module.h"

#include "side_module.h"

namespace backplane::gloo_plugin {
namespace {

using plugin::Error;

struct TorchStoreModule {
  TorchStoreOpen open = nullptr;
  TorchStoreClose close = nullptr;
  std::string failure;
};

const TorchStoreModule& torch_store_module() {
  static const TorchStoreModule loaded = [] {
    TorchStoreModule m;
    plugin::SideModule module = plugin::load_side_module(kTorchStoreModule, "the torch store module");
    m.open = reinterpret_cast<TorchStoreOpen>(module.symbol(kTorchStoreOpenSymbol));
    m.close = reinterpret_cast<TorchStoreClose>(module.symbol(kTorchStoreCloseSymbol));
    if (m.open == nullptr || m.close == nullptr) m.failure = module.failure;
    return m;
  }();
  return loaded;
}

// The module's callbacks as a KvStore, closed with it.
class TorchKvStore : public CallbackKvStore {
 public:
  TorchKvStore(const bpl_store& store, TorchStoreClose close, const std::string& where)
      : CallbackKvStore(store, "the torch store at " + where), store_(store), close_(close) {}
  ~TorchKvStore() override { close_(&store_); }

 private:
  bpl_store store_;
  TorchStoreClose close_;
};

}  // namespace

std::string torch_store_module_path() { return plugin::side_module_path(kTorchStoreModule); }

std::unique_ptr<KvStore> connect_torch_store(const std::string& address, int port, std::chrono::milliseconds connect_timeout,
                                             std::chrono::milliseconds operation_timeout, const std::string& host_name) {
  const TorchStoreModule& module = torch_store_module();
  if (!module.failure.empty()) {
    throw Error(BPL_ERR_UNSUPPORTED, module.failure + " (a torchrun agent's store is torch's TCPStore, which only "
                                                      "torch's client speaks)");
  }
  bpl_store store = BPL_STORE_INIT;
  char error[1024] = {};
  const bpl_status status = module.open(plugin::host(), address.c_str(), port, connect_timeout.count(),
                                        operation_timeout.count(), host_name.c_str(), &store, error, sizeof(error));
  if (status != BPL_OK) throw Error(status, error);
  return std::make_unique<TorchKvStore>(store, module.close, address + ":" + std::to_string(port));
}

}  // namespace backplane::gloo_plugin
