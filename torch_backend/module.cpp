// The Python module backplane_torch: importing it registers torch.distributed's backend "backplane".
//
//   import backplane_torch
//   torch.distributed.init_process_group("backplane")   # plugin chosen by BPL_BACKEND, NXD_CPU_MODE, auto
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <stdexcept>
#include <vector>

#include "process_group.h"

namespace py = pybind11;
using backplane::torch_backend::ProcessGroupBackplane;

PYBIND11_MODULE(backplane_torch, m) {
  m.doc() = "torch.distributed backend 'backplane' (import registers it)";
  // The base class's Python type must be known before ours derives from it.
  py::module_ distributed = py::module_::import("torch.distributed");
  py::class_<ProcessGroupBackplane, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupBackplane>>(m, "ProcessGroupBackplane")
      .def("describe", &ProcessGroupBackplane::describe,
           "What backplane chose for this process: the backend, why, and its details.");
  // For bpl-bench-torch: `iterations` blocking allreduces (sum) of `tensor` in place, timed in C++ so
  // that Python's own cost is not measured; seconds per allreduce. Through the process group (post a
  // Work and wait), and through the C ABI on the same communicator.
  m.def(
      "_time_process_group_allreduce",
      [](const c10::intrusive_ptr<ProcessGroupBackplane>& group, at::Tensor tensor, int iterations) {
        std::vector<at::Tensor> tensors{tensor};
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i) group->allreduce(tensors, c10d::AllreduceOptions())->wait();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_time_c_abi_allreduce",
      [](const c10::intrusive_ptr<ProcessGroupBackplane>& group, at::Tensor tensor, int iterations) {
        if (tensor.scalar_type() != at::kFloat || !tensor.is_contiguous()) throw std::invalid_argument("a contiguous float32 tensor");
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i) {
          const bpl_status status = bpl_allreduce(group->comm(), tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                                  BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
          if (status != BPL_OK) throw std::runtime_error(bpl_last_error());
        }
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout) {
        return ProcessGroupBackplane::create(store, rank, size, timeout);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
      "torch's creator of the backend: the first group starts backplane through `store`, later ones join theirs.");
  // Before the interpreter finalizes: the works whose futures were asked for end, and their callbacks
  // (Python objects) are released while Python can still take them.
  m.def("_wait_for_completions", &ProcessGroupBackplane::wait_for_completions, py::call_guard<py::gil_scoped_release>());
  py::module_::import("atexit").attr("register")(m.attr("_wait_for_completions"));
  py::object backend = distributed.attr("Backend");
  if (!py::hasattr(backend, "BACKPLANE")) backend.attr("register_backend")("backplane", m.attr("create_process_group"));
}
