// What a plugin keeps in modules of its own, loaded only when a program needs them (the CPU kernels,
// the torch store client): finding and loading such a module, which lies beside the plugin, and the
// LibTorch it links (torch_library.h).
#pragma once

#include <string>

namespace backplane::plugin {

// A module loaded for the rest of the process (never unloaded: what it links, LibTorch, does not
// survive being unloaded), or why it could not be.
struct SideModule {
  void* handle = nullptr;
  std::string path;     // where it was looked for
  std::string failure;  // empty when loaded
  // The exported `symbol`, or nullptr with `failure` set.
  void* symbol(const char* name);
};

// <the folder of the plugin that links this code>/<file>.
std::string side_module_path(const char* file);

// Whether the module's file is there and the LibTorch it links can be found (without loading either),
// or why not.
struct SideModuleState {
  bool loadable = false;
  std::string why_not;
};
SideModuleState side_module_state(const char* file, const std::string& what);

// Loads <the plugin's folder>/<file>, after the LibTorch it links. `what` names the module in a failure:
// "<what> <path> is not installed" or "<what> <path> could not be loaded: <the loader's reason>", which
// says where LibTorch was looked for when it was not found.
SideModule load_side_module(const char* file, const std::string& what);
// The same for a module at `path` (a program that is no plugin: bpl-store, told where by its launcher).
SideModule load_side_module_at(const std::string& path, const std::string& what);

}  // namespace backplane::plugin
