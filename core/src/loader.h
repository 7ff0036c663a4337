// Loading a plugin with Boost.DLL and checking what it hands back (docs/abi.md, "Plugins").
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

  // The plugin's table as this ABI declares it: copied at load into a zero-filled table, so that an
  // entry a plugin of an older ABI 1.x lacks (its table ends before it) reads NULL, as one it left NULL.
  const bpl_plugin_api& api() const { return table_; }
  const std::string& path() const { return path_; }

  Plugin(boost::dll::shared_library library, const bpl_plugin_api& table, std::string path);

 private:
  boost::dll::shared_library library_;
  bpl_plugin_api table_;
  std::string path_;
};

// The host API given to every plugin.
const bpl_host_api* host_api();

}  // namespace backplane
