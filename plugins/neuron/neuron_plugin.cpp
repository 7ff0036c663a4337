// libbackplane-neuron.so: the Neuron backend on the Neuron Runtime's public C API, loaded at run time.
//
// This build finds and loads the runtime (libnrt.so.1) and resolves every function the backend uses;
// the device, collective and kernel interfaces over it are not implemented yet, so opening reports
// BPL_ERR_UNAVAILABLE with the reason: without the runtime, that it is missing and how to run on CPU;
// with it, which runtime was found. Explicit selection (BPL_BACKEND=neuron, NXD_CPU_MODE=0) therefore
// fails with that message, and auto selection moves on to mpi or gloo, recording it.
#include "backplane/plugin.h"
#include "plugin_support.h"
#include "runtime.h"

namespace {

bpl_status classify(const std::exception&) { return BPL_ERR_INTERNAL; }

}  // namespace

extern "C" bpl_status bpl_plugin_open_v1(const bpl_host_api* host, const bpl_plugin_api** out) {
  using namespace backplane;
  if (host == nullptr || out == nullptr ||
      host->struct_size < offsetof(bpl_host_api, set_error) + sizeof(host->set_error)) {
    return BPL_ERR_INVALID_ARGUMENT;
  }
  plugin::host() = host;
  plugin::name() = "neuron";
  *out = nullptr;
  return plugin::guarded("neuron", classify, [&]() -> bpl_status {
    // Loaded for the process's life: the runtime cannot be unloaded safely once initialised.
    static const neuron_plugin::LoadedRuntime runtime =
        neuron_plugin::load_runtime(neuron_plugin::runtime_candidates(host->get_env("NEURON_RT_LIB")));
    throw plugin::Error(BPL_ERR_UNAVAILABLE, "found the Neuron runtime " + runtime.version + " at " + runtime.path +
                                                 ", but this build of backplane does not implement the Neuron "
                                                 "backend's device, collective and kernel interfaces yet");
  });
}
