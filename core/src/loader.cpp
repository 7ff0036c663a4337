#include "loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "elf_dynamic.h"
#include "environment.h"
#include "error.h"
#include "log.h"
#include "operation_identity.h"

namespace backplane {
namespace {

// The table must reach at least to the last function of ABI 1.0; a larger one is a newer minor.
constexpr size_t kMinPluginApiSize = offsetof(bpl_plugin_api, request_free) + sizeof(void*);
// Anything bigger is a plugin writing garbage, not a future minor version.
constexpr size_t kMaxPluginApiSize = 64 * 1024;

void host_log(int32_t level, const char* source, const char* message) {
  log(level, source, message != nullptr ? message : "");
}

const char* host_get_env(const char* name) {
  static const EnvLookup env = process_environment();
  if (name == nullptr) return nullptr;
  // process_environment filters secure variables; the pointer must outlive the call, so return the
  // process's own storage for the value it accepted.
  return env(name) ? std::getenv(name) : nullptr;
}

void host_set_error(const char* message) { set_last_error(message != nullptr ? message : ""); }

std::string version_text(int32_t major, int32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace

const bpl_host_api* host_api() {
  static const bpl_host_api host = {sizeof(bpl_host_api), BPL_ABI_MAJOR, BPL_ABI_MINOR, log_level(), 0,
                                    &host_log, &host_get_env, &host_set_error, &current_operation};
  return &host;
}

namespace {

// Whether the plugin at `path` links a Gloo (libgloo) while the program already carries another in its
// global scope: PyPI's LibTorch exports the Gloo it bundles, so in a program linked with LibTorch (the
// C++ frontend's) the gloo plugin's calls into its own Gloo would bind to LibTorch's copy, another
// version (a crash at the first connection). Such a plugin is opened with RTLD_DEEPBIND: it binds first
// to what it links itself. No other plugin is: a deep-bound library that reads `environ` itself (Open
// MPI's) would see another copy of it than the program's. Python keeps LibTorch out of the global scope;
// AddressSanitizer refuses RTLD_DEEPBIND (tools/test-sanitized leaves out the tests that would need it).
bool needs_its_own_gloo(const std::string& path) {
#if defined(__SANITIZE_ADDRESS__)
  (void)path;
  return false;
#else
  if (dlsym(RTLD_DEFAULT, "_ZN4gloo10allgathervERNS_17AllgathervOptionsE") == nullptr) return false;  // gloo::allgatherv
  for (const std::string& library : elf_dynamic(path).needed) {
    if (library.rfind("libgloo", 0) == 0) return true;
  }
  return false;
#endif
}

}  // namespace

std::shared_ptr<Plugin> Plugin::load(const std::string& path) {
  boost::dll::shared_library library;
  try {
    auto mode = boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local;
    if (needs_its_own_gloo(path)) mode |= boost::dll::load_mode::rtld_deepbind;
    library.load(path, mode);
  } catch (const std::exception& e) {
    // Boost.DLL's message carries dlerror()'s text: the missing library or unresolved symbol.
    throw Error(BPL_ERR_IO, "cannot load plugin '" + path + "': " + e.what());
  }
  if (!library.has(BPL_PLUGIN_ENTRY_SYMBOL)) {
    throw Error(BPL_ERR_NOT_FOUND, "'" + path + "' is not a backplane plugin: it does not export " +
                                       BPL_PLUGIN_ENTRY_SYMBOL);
  }
  auto open = library.get<bpl_status(const bpl_host_api*, const bpl_plugin_api**)>(BPL_PLUGIN_ENTRY_SYMBOL);

  const bpl_plugin_api* api = nullptr;
  clear_last_error();
  bpl_status status = BPL_ERR_INTERNAL;
  try {
    status = open(host_api(), &api);
  } catch (...) {
    // A plugin must not throw across the boundary; refuse it rather than trust its state.
    throw Error(BPL_ERR_INTERNAL, "plugin '" + path + "' threw an exception from " + BPL_PLUGIN_ENTRY_SYMBOL);
  }
  if (status != BPL_OK) {
    std::string reason = last_error().empty() ? std::string(bpl_status_name(status)) : last_error();
    throw Error(status, "plugin '" + path + "' failed to open: " + reason);
  }
  if (api == nullptr) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "plugin '" + path + "' returned BPL_OK but no function table");
  }
  if (api->abi_major != BPL_ABI_MAJOR) {
    throw Error(BPL_ERR_ABI_MISMATCH, "plugin '" + path + "' implements ABI " +
                                          version_text(api->abi_major, api->abi_minor) + " but this libbackplane is ABI " +
                                          version_text(BPL_ABI_MAJOR, BPL_ABI_MINOR) +
                                          "; rebuild the plugin against backplane " + std::to_string(BPL_ABI_MAJOR) + ".x");
  }
  if (api->struct_size < kMinPluginApiSize || api->struct_size > kMaxPluginApiSize) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "plugin '" + path + "' reports a function table of struct_size " +
                                              std::to_string(api->struct_size) + " (expected " +
                                              std::to_string(kMinPluginApiSize) + ".." +
                                              std::to_string(kMaxPluginApiSize) + ")");
  }
  const char* missing = api->name == nullptr             ? "name"
                        : api->version == nullptr        ? "version"
                        : api->runtime_create == nullptr ? "runtime_create"
                        : api->runtime_destroy == nullptr ? "runtime_destroy"
                        : api->comm_world == nullptr     ? "comm_world"
                        : api->comm_destroy == nullptr   ? "comm_destroy"
                        : api->comm_rank_size == nullptr ? "comm_rank_size"
                        : api->request_test == nullptr   ? "request_test"
                        : api->request_wait == nullptr   ? "request_wait"
                        : api->request_free == nullptr   ? "request_free"
                                                         : nullptr;
  if (missing != nullptr) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, "plugin '" + path + "' leaves the required field '" + missing + "' NULL");
  }
  // An accepted plugin stays mapped for the life of the process: the runtimes plugins link (LibTorch,
  // MPI) register exit handlers and thread-local destructors and do not survive being unloaded, and
  // leak checkers can only name frames of code still mapped at exit. Refused plugins are unloaded.
  // Boost.DLL has no RTLD_NODELETE mode; glibc pins an already-loaded object with RTLD_NOLOAD.
  dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD | RTLD_NODELETE);
  return std::make_shared<Plugin>(std::move(library), *api, path);
}

Plugin::Plugin(boost::dll::shared_library library, const bpl_plugin_api& table, std::string path)
    : library_(std::move(library)), table_{}, path_(std::move(path)) {
  // Whole entries only: one the plugin's struct_size cuts short stays NULL.
  const size_t copied = std::min(table.struct_size, sizeof(table_)) / alignof(bpl_plugin_api) * alignof(bpl_plugin_api);
  std::memcpy(static_cast<void*>(&table_), &table, copied);
}

}  // namespace backplane
