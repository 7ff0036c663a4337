#include "programs.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <thread>

#include "plugin_support.h"
#include "runtime.h"

extern char** environ;

namespace backplane::neuron_plugin {

using plugin::Error;

namespace {

std::string dtype_text(bpl_dtype dtype) {
  const std::string name = bpl_dtype_name(dtype);  // the ABI's names (core/diagnosis/names.cpp)
  return name == "unknown" ? "dtype " + std::to_string(dtype) : name;
}

// The ports of a loaded model, inputs and outputs apart, in the model's order.
void read_ports(const NrtApi& api, nrt_model_t* model, std::vector<NeffPort>& inputs, std::vector<NeffPort>& outputs) {
  NrtTensorInfoArray* info = nullptr;
  check_nrt(api.nrt_get_model_tensor_info(model, &info), "nrt_get_model_tensor_info");
  for (uint64_t i = 0; i < info->tensor_count; ++i) {
    const NrtTensorInfo& tensor = info->tensor_array[i];
    NeffPort port;
    port.name.assign(tensor.name, strnlen(tensor.name, kNrtTensorNameMax));
    port.bytes = tensor.size;
    port.dtype = bpl_dtype_of(tensor.dtype);
    for (uint32_t d = 0; d < tensor.ndim; ++d) port.shape.push_back(tensor.shape[d]);
    (tensor.usage == kNrtUsageInput ? inputs : outputs).push_back(std::move(port));
  }
  api.nrt_free_model_tensor_info(info);
}

// A runtime tensor set, destroyed with its owner.
struct TensorSet {
  explicit TensorSet(const NrtApi& runtime_api) : api(runtime_api) {
    check_nrt(api.nrt_allocate_tensor_set(&set), "nrt_allocate_tensor_set");
  }
  ~TensorSet() { api.nrt_destroy_tensor_set(&set); }
  void add(const std::string& name, nrt_tensor_t* tensor) {
    check_nrt(api.nrt_add_tensor_to_tensor_set(set, name.c_str(), tensor), "nrt_add_tensor_to_tensor_set('" + name + "')");
  }
  const NrtApi& api;
  nrt_tensor_set_t* set = nullptr;
};

/* ---- the compiler subprocess ---- */

struct Finished {
  int exit_status;  // exit code, or 128 + signal
  std::string output;
};

std::string tail(const std::string& text, size_t lines) {
  size_t at = text.size();
  while (at > 0 && lines > 0) {
    at = text.rfind('\n', at - 1);
    if (at == std::string::npos) return text;
    --lines;
  }
  return text.substr(at + 1);
}

// Runs argv[0] (found on PATH) with stdout and stderr into `log`, waiting at most `timeout`.
Finished run_process(const std::vector<std::string>& args, const std::string& log, std::chrono::milliseconds timeout) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned == ENOENT) {
    throw Error(BPL_ERR_UNAVAILABLE, args[0] + " not found on PATH: install the Neuron compiler (the neuronx-cc "
                                               "package) to compile format 'hlo', or pass a compiled NEFF (format 'neff')");
  }
  if (spawned != 0) throw Error(BPL_ERR_IO, "cannot start " + args[0] + ": " + std::strerror(spawned));
  const auto deadline = plugin::deadline_after(timeout);
  int status = 0;
  while (true) {
    const pid_t ended = ::waitpid(pid, &status, WNOHANG);
    if (ended == pid) break;
    if (ended < 0 && errno != EINTR) throw Error(BPL_ERR_INTERNAL, "waitpid for " + args[0] + ": " + std::strerror(errno));
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      throw Error(BPL_ERR_TIMEOUT, args[0] + " did not finish within " + std::to_string(timeout.count()) +
                                       " ms and was killed (log: " + log + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ifstream in(log, std::ios::binary);
  std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

// A private temporary folder, removed with its files.
struct TemporaryFolder {
  TemporaryFolder() {
    const char* base = plugin::env("TMPDIR");
    std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/bpl-neuronx-cc-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw Error(BPL_ERR_IO, "cannot create a folder like " + pattern + ": " + std::strerror(errno));
    }
    path = pattern;
  }
  ~TemporaryFolder() {
    for (const char* name : {"model.hlo_module.pb", "model.neff", "model.log", "version.log"}) {
      ::unlink((path + "/" + name).c_str());
    }
    ::rmdir(path.c_str());
  }
  std::string path;
};

constexpr const char* kCompiler = "neuronx-cc";

}  // namespace

/* ---- NEFF programs ---- */

void check_port(const NeffPort& port, const bpl_tensor& tensor, const std::string& role) {
  const std::string which = role + " ('" + port.name + "')";
  if (port.dtype != 0 && tensor.dtype != port.dtype) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, which + ": dtype " + dtype_text(tensor.dtype) + ", but the NEFF declares " +
                                              dtype_text(port.dtype));
  }
  const std::vector<int64_t> shape(tensor.shape, tensor.shape + tensor.ndim);
  if (!port.shape.empty() && shape != port.shape) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, which + ": shape " + plugin::list_text(shape) + ", but the NEFF declares " +
                                              plugin::list_text(port.shape));
  }
  size_t bytes = plugin::dtype_size(tensor.dtype);
  for (int64_t extent : shape) bytes *= static_cast<size_t>(extent);
  if (bytes != port.bytes) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, which + ": " + std::to_string(bytes) + " bytes, but the NEFF declares " +
                                              std::to_string(port.bytes));
  }
  if (tensor.data == nullptr && bytes > 0) throw Error(BPL_ERR_INVALID_ARGUMENT, which + ": data is NULL");
}

NeffProgram::NeffProgram(NeuronCore& core, const void* neff, size_t size) : core_(core) {
  check_nrt(core.api.nrt_load(neff, size, core.vnc, -1, &model_),
            "nrt_load of a " + std::to_string(size) + "-byte NEFF on NeuronCore " + std::to_string(core.core));
  try {
    read_ports(core.api, model_, inputs_, outputs_);
  } catch (...) {
    core.api.nrt_unload(model_);
    throw;
  }
}

NeffProgram::~NeffProgram() { core_.api.nrt_unload(model_); }

void NeffProgram::run(const bpl_tensor* inputs, int32_t num_inputs, bpl_tensor* outputs, int32_t num_outputs) {
  if (num_inputs != static_cast<int32_t>(inputs_.size()) || num_outputs != static_cast<int32_t>(outputs_.size())) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::to_string(num_inputs) + " input(s) and " + std::to_string(num_outputs) +
                                              " output(s) given, but the NEFF takes " + std::to_string(inputs_.size()) +
                                              " and returns " + std::to_string(outputs_.size()));
  }
  std::vector<OwnedTensor> tensors;  // slices and staging, alive until the execution is over
  TensorSet in(core_.api), out(core_.api);
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const std::string role = "input " + std::to_string(i);
    check_port(inputs_[i], inputs[i], role);
    tensors.push_back(tensor_for_input(core_, inputs[i].data, inputs_[i].bytes, role.c_str()));
    in.add(inputs_[i].name, tensors.back().get());
  }
  // Device outputs are written in place; host outputs come back from staging once the model has run.
  std::vector<nrt_tensor_t*> staged(outputs_.size(), nullptr);
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const std::string role = "output " + std::to_string(i);
    check_port(outputs_[i], outputs[i], role);
    if (core_.memory.find(outputs[i].data)) {
      tensors.push_back(tensor_for_input(core_, outputs[i].data, outputs_[i].bytes, role.c_str()));
    } else {
      tensors.push_back(allocate_device_tensor(core_, outputs_[i].bytes, role.c_str()));
      staged[i] = tensors.back().get();
    }
    out.add(outputs_[i].name, tensors.back().get());
  }
  check_nrt(core_.api.nrt_execute(model_, in.set, out.set), "nrt_execute");
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (staged[i] != nullptr) {
      const std::string role = "output " + std::to_string(i);
      copy_out(core_, staged[i], 0, outputs[i].data, outputs_[i].bytes, role.c_str());
    }
  }
}

/* ---- HLO through neuronx-cc ---- */

std::string neuronx_cc_id(std::chrono::milliseconds timeout) {
  static std::mutex mutex;
  static std::string id;  // the compiler on PATH does not change under a running process
  std::lock_guard<std::mutex> lock(mutex);
  if (!id.empty()) return id;
  TemporaryFolder folder;
  const Finished version = run_process({kCompiler, "--version"}, folder.path + "/version.log", timeout);
  // "NeuronX Compiler version 2.15.128.0+56dc5a86": the last word that starts with a digit.
  std::istringstream words(version.output);
  std::string word, found;
  while (words >> word) {
    if (std::isdigit(static_cast<unsigned char>(word[0])) && word.find('.') != std::string::npos) found = word;
  }
  if (version.exit_status != 0 || found.empty()) {
    throw Error(BPL_ERR_UNAVAILABLE, std::string(kCompiler) + " --version exited with " +
                                         std::to_string(version.exit_status) + " and printed no version: " +
                                         tail(version.output, 5));
  }
  id = "neuronxcc-" + found;
  return id;
}

std::vector<char> compile_hlo(const void* module, size_t size, const std::string& flags,
                              std::chrono::milliseconds timeout) {
  TemporaryFolder folder;
  const std::string input = folder.path + "/model.hlo_module.pb", output = folder.path + "/model.neff";
  {
    std::ofstream file(input, std::ios::binary);
    file.write(static_cast<const char*>(module), static_cast<std::streamsize>(size));
    file.flush();
    if (!file) throw Error(BPL_ERR_IO, "cannot write " + input + ": " + std::strerror(errno));
  }
  std::vector<std::string> args = {kCompiler, "compile", "--framework", "XLA", input, "--output", output};
  std::istringstream words(flags);
  for (std::string flag; words >> flag;) args.push_back(flag);
  const Finished compiled = run_process(args, folder.path + "/model.log", timeout);
  if (compiled.exit_status != 0) {
    throw Error(BPL_ERR_INVALID_ARGUMENT, std::string(kCompiler) + " failed (exit status " +
                                              std::to_string(compiled.exit_status) + "): " + tail(compiled.output, 20));
  }
  std::ifstream neff(output, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(neff)), std::istreambuf_iterator<char>());
  if (bytes.empty()) {
    throw Error(BPL_ERR_INTERNAL, std::string(kCompiler) + " exited 0 but wrote no NEFF at " + output + ": " +
                                      tail(compiled.output, 5));
  }
  return bytes;
}

}  // namespace backplane::neuron_plugin
