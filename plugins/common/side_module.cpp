#include "side_module.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include "elf_dynamic.h"
#include "torch_library.h"

namespace backplane::plugin {
namespace {

// The folder of the shared object this code is linked into: the plugin's.
std::string plugin_folder() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&plugin_folder), &info) == 0 || info.dli_fname == nullptr) return ".";
  const std::string file = info.dli_fname;
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? "." : file.substr(0, slash);
}

}  // namespace

void* SideModule::symbol(const char* name) {
  if (handle == nullptr) return nullptr;
  void* found = ::dlsym(handle, name);
  if (found == nullptr) failure = path + " does not export " + name;
  return found;
}

std::string side_module_path(const char* file) { return plugin_folder() + "/" + file; }

namespace {

bool installed(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string torch_not_found(const TorchLibrary& torch) {
  return "it links LibTorch, which was found neither by " + torch.looked +
         ": import torch first, activate the Python environment that holds torch, or set BPL_TORCH_DIR to a "
         "torch installation";
}

}  // namespace

SideModuleState side_module_state(const char* file, const std::string& what) {
  const std::string path = side_module_path(file);
  if (!installed(path)) return {false, what + " " + path + " is not installed"};
  if (elf_dynamic(path).needed.empty()) return {false, what + " " + path + " could not be loaded: it is no shared object"};
  const TorchLibrary torch = find_torch_library(path);
  if (!torch.found()) return {false, what + " " + path + " could not be loaded: " + torch_not_found(torch)};
  return {true, ""};
}

SideModule load_side_module(const char* file, const std::string& what) {
  return load_side_module_at(side_module_path(file), what);
}

SideModule load_side_module_at(const std::string& path, const std::string& what) {
  SideModule module;
  module.path = path;
  if (!installed(module.path)) {
    module.failure = what + " " + module.path + " is not installed";
    return module;
  }
  const TorchLibrary torch = find_torch_library(module.path);
  std::string why = preload_torch_library(torch);
  if (why.empty()) {
    module.handle = ::dlopen(module.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (module.handle == nullptr) {
      const char* error = ::dlerror();
      why = error != nullptr ? error : "unknown error";
      const bool torch_missing = why.find("libtorch") != std::string::npos || why.find("libc10") != std::string::npos;
      if (torch_missing && !torch.found()) why += "; " + torch_not_found(torch);
    }
  }
  if (!why.empty()) module.failure = what + " " + module.path + " could not be loaded: " + why;
  return module;
}

}  // namespace backplane::plugin
