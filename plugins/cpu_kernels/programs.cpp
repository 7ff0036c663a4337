#include <torch/script.h>
#include <torch/csrc/api/include/torch/version.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "aten_types.h"
#include "cpu_kernels.h"
#include "kernels_module.h"
#include "plugin_support.h"

// A loaded TorchScript module and the method bpl_program_run calls.
struct bpl_plugin_program {
  torch::jit::Module module;
  std::string entry;
};

#define BPL_STRINGIFY_(x) #x
#define BPL_STRINGIFY(x) BPL_STRINGIFY_(x)

namespace backplane::cpu_kernels {
namespace {

using plugin::Error;

// The compiler's identity in the cache key: a LibTorch upgrade recompiles.
constexpr const char* kCompiler = "torchscript-" BPL_STRINGIFY(TORCH_VERSION_MAJOR) "." BPL_STRINGIFY(
    TORCH_VERSION_MINOR) "." BPL_STRINGIFY(TORCH_VERSION_PATCH);

// TorchScript's own errors (a syntax error, a type error at run time) are the program's failure.
bpl_status classify(const std::exception&) { return BPL_ERR_INVALID_ARGUMENT; }

template <typename Body>
bpl_status guarded(Body&& body) noexcept {
  return plugin::guarded(plugin::name(), classify, std::forward<Body>(body));
}

void require_torchscript(const char* format) {
  if (std::strcmp(format, "torchscript") != 0) {
    throw Error(BPL_ERR_UNSUPPORTED, std::string("program format '") + format + "' is not supported (formats: " +
                                         kernels_module::kProgramFormats + ")");
  }
}

at::Tensor wrap(const bpl_tensor& t) {
  return at::from_blob(t.data, at::IntArrayRef(t.shape, static_cast<size_t>(t.ndim)),
                       at::TensorOptions().dtype(scalar_type(t.dtype)));
}

std::string shape_text(at::IntArrayRef shape) {
  std::ostringstream text;
  text << shape;
  return text.str();
}

}  // namespace

bpl_status program_compiler(bpl_plugin_runtime*, const char* format, const char** compiler) {
  return guarded([&] {
    require_torchscript(format);
    *compiler = kCompiler;
    return BPL_OK;
  });
}

bpl_status program_compile(bpl_plugin_runtime*, const char* format, const void* source, size_t source_size,
                           const char*, void** artifact, size_t* artifact_size) {
  return guarded([&] {
    require_torchscript(format);
    // The source defines the methods of a module ("def forward(self, x): ..."); its serialized form
    // is the artifact, so a cache hit loads without compiling.
    torch::jit::Module module("backplane_program");
    module.define(std::string(static_cast<const char*>(source), source_size));
    std::ostringstream stream;
    module.save(stream);
    const std::string bytes = stream.str();
    void* buffer = std::malloc(bytes.size());
    if (buffer == nullptr) throw std::bad_alloc();
    std::memcpy(buffer, bytes.data(), bytes.size());
    *artifact = buffer;
    *artifact_size = bytes.size();
    return BPL_OK;
  });
}

void artifact_free(void* artifact) { std::free(artifact); }

bpl_status program_load(bpl_plugin_runtime*, const char* format, const void* artifact, size_t artifact_size,
                        const bpl_program_options* options, bpl_plugin_program** out) {
  return guarded([&] {
    require_torchscript(format);
    std::istringstream stream(std::string(static_cast<const char*>(artifact), artifact_size));
    auto program = std::make_unique<bpl_plugin_program>();
    program->module = torch::jit::load(stream);
    program->entry = options->entry != nullptr ? options->entry : "forward";
    if (!program->module.find_method(program->entry)) {
      std::string methods;
      for (const auto& method : program->module.get_methods()) methods += (methods.empty() ? "" : ", ") + method.name();
      throw Error(BPL_ERR_INVALID_ARGUMENT, "entry '" + program->entry + "' is not a method of the program (methods: " +
                                                (methods.empty() ? "none" : methods) + ")");
    }
    *out = program.release();
    return BPL_OK;
  });
}

bpl_status program_run(bpl_plugin_program* program, const bpl_tensor* inputs, int32_t num_inputs, bpl_tensor* outputs,
                       int32_t num_outputs) {
  return guarded([&] {
    std::vector<c10::IValue> arguments;
    for (int32_t i = 0; i < num_inputs; ++i) arguments.emplace_back(wrap(inputs[i]));
    c10::IValue result = program->module.get_method(program->entry)(std::move(arguments));

    std::vector<at::Tensor> results;
    if (result.isTensor()) {
      results.push_back(result.toTensor());
    } else if (result.isTuple()) {
      for (const c10::IValue& element : result.toTupleRef().elements()) {
        if (!element.isTensor()) throw Error(BPL_ERR_INVALID_ARGUMENT, "the program returned a tuple with a non-tensor");
        results.push_back(element.toTensor());
      }
    } else if (!result.isNone()) {
      throw Error(BPL_ERR_INVALID_ARGUMENT, "the program returned " + result.tagKind() + ", not tensors");
    }
    if (static_cast<int32_t>(results.size()) != num_outputs) {
      throw Error(BPL_ERR_INVALID_ARGUMENT, "the program returned " + std::to_string(results.size()) +
                                                " tensor(s) but num_outputs = " + std::to_string(num_outputs));
    }
    for (int32_t i = 0; i < num_outputs; ++i) {
      at::Tensor target = wrap(outputs[i]);
      if (results[i].scalar_type() != target.scalar_type() || results[i].sizes() != target.sizes()) {
        throw Error(BPL_ERR_INVALID_ARGUMENT,
                    "outputs[" + std::to_string(i) + "] is " + std::string(c10::toString(target.scalar_type())) +
                        shape_text(target.sizes()) + " but the program returned " +
                        c10::toString(results[i].scalar_type()) + shape_text(results[i].sizes()));
      }
      if (results[i].data_ptr() != target.data_ptr()) target.copy_(results[i]);
    }
    return BPL_OK;
  });
}

bpl_status program_destroy(bpl_plugin_program* program) {
  return guarded([&] {
    delete program;
    return BPL_OK;
  });
}

}  // namespace backplane::cpu_kernels
