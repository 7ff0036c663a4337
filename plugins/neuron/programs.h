// Programs of the Neuron plugin. "neff": a compiled Neuron executable, loaded on the rank's core and run
// with named input and output tensor sets, its tensors described by the model itself. "hlo": an XLA HLO
// module (serialized HloModuleProto), compiled to a NEFF by running neuronx-cc, through the core's
// persistent compile cache.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "backplane/backplane.h"
#include "neuron_core.h"

namespace backplane::neuron_plugin {

// One input or output of a NEFF, as nrt_get_model_tensor_info reports it.
struct NeffPort {
  std::string name;
  size_t bytes = 0;
  bpl_dtype dtype = 0;  // 0: a runtime dtype bpl has no name for (then only the size is checked)
  std::vector<int64_t> shape;
};

// Checks a caller's tensor against a port: dtype, shape and size, naming both on mismatch. Throws
// plugin::Error(INVALID_ARGUMENT). `role`: "input 0", "output 1".
void check_port(const NeffPort& port, const bpl_tensor& tensor, const std::string& role);

class NeffProgram {
 public:
  NeffProgram(NeuronCore& core, const void* neff, size_t size);
  ~NeffProgram();
  NeffProgram(const NeffProgram&) = delete;
  NeffProgram& operator=(const NeffProgram&) = delete;

  const std::vector<NeffPort>& inputs() const { return inputs_; }
  const std::vector<NeffPort>& outputs() const { return outputs_; }
  // Inputs and outputs in the model's order; device pointers are used in place, host memory is staged.
  void run(const bpl_tensor* inputs, int32_t num_inputs, bpl_tensor* outputs, int32_t num_outputs);

 private:
  NeuronCore& core_;
  nrt_model_t* model_ = nullptr;
  std::vector<NeffPort> inputs_, outputs_;
};

// The compiler of the "hlo" format, found on PATH: "neuronxcc-<version>" (the reference's cache folder
// name), asked once per process. Throws plugin::Error(UNAVAILABLE) when neuronx-cc is not installed.
std::string neuronx_cc_id(std::chrono::milliseconds timeout);

// Runs `neuronx-cc compile --framework XLA <module> --output <neff> <flags…>` in a fresh temporary
// folder and returns the NEFF. Throws plugin::Error with the compiler's exit status and the end of its
// output when it fails, or TIMEOUT (the compiler is killed) after `timeout`.
std::vector<char> compile_hlo(const void* module, size_t size, const std::string& flags,
                              std::chrono::milliseconds timeout);

}  // namespace backplane::neuron_plugin
