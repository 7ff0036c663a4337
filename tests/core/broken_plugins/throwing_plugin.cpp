// A deliberately broken plugin for the loader's negative tests: its entry symbol lets a C++ exception
// escape, which the plugin ABI forbids. The core must refuse it, unload it and stay usable.
#include <backplane/plugin.h>

#include <stdexcept>

extern "C" __attribute__((visibility("default"))) bpl_status bpl_plugin_open_v1(const bpl_host_api*,
                                                                                 const bpl_plugin_api**) {
  throw std::runtime_error("test: an exception escaping bpl_plugin_open_v1");
}
