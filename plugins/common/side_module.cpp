#include "side_module.h"

#include <dlfcn.h>
#include <sys/stat.h>

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

bool side_module_installed(const char* file) {
  struct stat st {};
  return ::stat(side_module_path(file).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

SideModule load_side_module(const char* file, const std::string& what) {
  SideModule module;
  module.path = side_module_path(file);
  if (!side_module_installed(file)) {
    module.failure = what + " " + module.path + " is not installed";
    return module;
  }
  module.handle = ::dlopen(module.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (module.handle == nullptr) {
    const char* why = ::dlerror();
    module.failure = what + " " + module.path + " could not be loaded: " + (why != nullptr ? why : "unknown error");
  }
  return module;
}

}  // namespace backplane::plugin
