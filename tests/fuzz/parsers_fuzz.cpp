// libFuzzer target for the parsers of untrusted text: the launch environment (torchrun's, Open MPI's
// and Slurm's variables, BPL_TIMEOUT_MS, BPL_DEBUG, the backend selection) and the compiler flags of
// NEURON_CC_FLAGS and bpl_program_options.flags. The input is "NAME=VALUE" lines; the last line that
// is not an assignment is taken as program flags. A parser may refuse its input only with
// backplane::Error (INVALID_ARGUMENT naming the value); anything else, or a sanitizer report, is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "compile_cache.h"
#include "environment.h"
#include "error.h"
#include "selection.h"

namespace {

template <typename Parse>
void expect_only_errors(Parse&& parse) {
  try {
    parse();
  } catch (const backplane::Error& e) {
    if (e.status() != BPL_ERR_INVALID_ARGUMENT || std::string(e.what()).empty()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> variables;
  std::string program_flags;
  size_t start = 0;
  while (start <= input.size()) {
    size_t end = input.find('\n', start);
    if (end == std::string::npos) end = input.size();
    const std::string line = input.substr(start, end - start);
    const size_t equals = line.find('=');
    if (equals != std::string::npos && equals > 0) {
      variables[line.substr(0, equals)] = line.substr(equals + 1);
    } else {
      program_flags = line;
    }
    start = end + 1;
  }
  const backplane::EnvLookup env = [&](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };

  bpl_init_options options = BPL_INIT_OPTIONS_INIT;
  expect_only_errors([&] {
    const backplane::LaunchInfo launch = backplane::resolve_launch(options, env);
    if (launch.world_size < 1 || launch.rank < 0 || launch.rank >= launch.world_size || launch.timeout_ms <= 0) {
      std::abort();  // resolve_launch promises a consistent launch or an error
    }
  });
  expect_only_errors([&] { backplane::debug_detail(env); });
  expect_only_errors([&] { backplane::select_backend(nullptr, env, backplane::MachineProbe{}); });
  expect_only_errors([&] { backplane::cache_config("neuron", env, program_flags); });
  backplane::parse_integer(program_flags);
  backplane::split_path_list(program_flags);
  return 0;
}
