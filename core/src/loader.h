// Loading a plugin with Boost.DLL and checking what it hands back (DESIGN.md ABI rules 1 and 2).
#pragma once

#include <boost/dll/shared_library.hpp>
#include <memory>
#include <string>

#include "backplane/plugin.h"

namespace backplane {

// A loaded, validated plugin. The library stays loaded while any owner holds it.
class Plugin {
 public:
  // Loads `path` with RTLD_NOW | RTLD_LOCAL, calls its entry symbol and validates the table.
  // Throws Error: IO (the loader's own text, e.g. an unresolved symbol), NOT_FOUND (no entry symbol),
  // ABI_MISMATCH (other major; names both versions and the path), INVALID_ARGUMENT (bogus table),
  // or the status the plugin's open returned, with its message.
  static std::shared_ptr<Plugin> load(const std::string& path);

  const bpl_plugin_api& api() const { return *api_; }

  // A function of the table, or nullptr when it is NULL or the plugin was built against an older
  // ABI 1.x whose table ends before it.
  template <typename Fn>
  Fn optional(Fn bpl_plugin_api::*field) const {
    const size_t end = static_cast<size_t>(reinterpret_cast<const char*>(&(api_->*field)) -
                                           reinterpret_cast<const char*>(api_)) + sizeof(Fn);
    return end <= api_->struct_size ? api_->*field : nullptr;
  }
  const std::string& path() const { return path_; }

  Plugin(boost::dll::shared_library library, const bpl_plugin_api* api, std::string path)
      : library_(std::move(library)), api_(api), path_(std::move(path)) {}

 private:
  boost::dll::shared_library library_;
  const bpl_plugin_api* api_;
  std::string path_;
};

// The host API given to every plugin.
const bpl_host_api* host_api();

}  // namespace backplane
