// backplane_torch._C: the C++ side of the package backplane_torch (torch_backend/python/backplane_torch),
// which checks the torch version and registers torch.distributed's backend "backplane" with create_backend.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.h"

namespace py = pybind11;
using backplane::torch_backend::BackendBackplane;

namespace {

// The backend "backplane" behind a group's CPU tensors (torch 2's ProcessGroup dispatches to it).
c10::intrusive_ptr<BackendBackplane> backend_of(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  c10::intrusive_ptr<c10d::Backend> backend = group->getBackend(c10::DeviceType::CPU);
  auto* ours = dynamic_cast<BackendBackplane*>(backend.get());
  if (ours == nullptr) {
    throw std::invalid_argument("the group's CPU backend is " + backend->getBackendName() + ", not backplane");
  }
  return c10::intrusive_ptr<BackendBackplane>::reclaim_copy(ours);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch.distributed backend 'backplane': the C++ side (the package backplane_torch registers it)";
  // The base class's Python type must be known before ours derives from it.
  py::module_::import("torch.distributed");
  py::class_<BackendBackplane, c10d::Backend, c10::intrusive_ptr<BackendBackplane>>(m, "BackendBackplane")
      .def("describe", &BackendBackplane::describe,
           "What backplane chose for this process: the backend, why, and its details.")
      // As torch's ProcessGroupGloo has it: the timeout of the group's operations from now on.
      .def("_set_default_timeout", &BackendBackplane::setTimeout, py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>());
  m.def(
      "describe", [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) { return backend_of(group)->describe(); },
      py::arg("group"), "What backplane chose for the group's process: the backend, why, and its details.");
  // For bpl-bench-torch: `iterations` blocking allreduces (sum) of `tensor` in place, timed in C++ so
  // that Python's own cost is not measured; seconds per allreduce. Through the process group (post a
  // Work and wait), and through the C ABI on the same communicator.
  m.def(
      "_time_process_group_allreduce",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor tensor, int iterations) {
        const c10::intrusive_ptr<BackendBackplane> backend = backend_of(group);
        std::vector<at::Tensor> tensors{tensor};
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i) backend->allreduce(tensors, c10d::AllreduceOptions())->wait();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_time_c_abi_allreduce",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor tensor, int iterations) {
        bpl_comm* comm = backend_of(group)->comm();
        if (tensor.scalar_type() != at::kFloat || !tensor.is_contiguous()) throw std::invalid_argument("a contiguous float32 tensor");
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i) {
          const bpl_status status = bpl_allreduce(comm, tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                                  BPL_DTYPE_F32, BPL_OP_SUM, nullptr);
          if (status != BPL_OK) throw std::runtime_error(bpl_last_error());
        }
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout) {
        return BackendBackplane::create(store, rank, size, timeout);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
      "torch's creator of the backend: the first group starts backplane through `store`, later ones join theirs.");
  // Before the interpreter finalizes: the works whose futures were asked for end, and their callbacks
  // (Python objects) are released while Python can still take them.
  m.def("_wait_for_completions", &BackendBackplane::wait_for_completions, py::call_guard<py::gil_scoped_release>());
  py::module_::import("atexit").attr("register")(m.attr("_wait_for_completions"));
}
