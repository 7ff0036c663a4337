// The Python module backplane_torch: importing it registers torch.distributed's backend "backplane"
// (and, under mpirun, gives torch's env:// the launch variables torchrun would).
//
//   import backplane_torch
//   torch.distributed.init_process_group("backplane")   # plugin chosen by BPL_BACKEND, NXD_CPU_MODE, auto
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

// Under mpirun, torch's env:// rendezvous finds none of the variables it reads: they are taken from
// Open MPI's, as torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), with the
// store at 127.0.0.1 when every rank runs on this machine (else MASTER_ADDR must be given: mpirun -x)
// and on a port of the job's own (20000-32767, below Linux's ephemeral ports, from Open MPI's job id).
// What the launch environment already has is kept.
void launch_variables_from_mpirun() {
  py::object environ = py::module_::import("os").attr("environ");
  auto has = [&](const char* name) { return environ.attr("__contains__")(name).cast<bool>(); };
  auto get = [&](const char* name) { return environ.attr("__getitem__")(name).cast<std::string>(); };
  if (!has("OMPI_COMM_WORLD_RANK") || has("RANK")) return;
  auto set_default = [&](const char* name, const std::string& value) { environ.attr("setdefault")(name, value); };
  set_default("RANK", get("OMPI_COMM_WORLD_RANK"));
  set_default("WORLD_SIZE", get("OMPI_COMM_WORLD_SIZE"));
  if (has("OMPI_COMM_WORLD_LOCAL_RANK")) set_default("LOCAL_RANK", get("OMPI_COMM_WORLD_LOCAL_RANK"));
  if (has("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    set_default("LOCAL_WORLD_SIZE", get("OMPI_COMM_WORLD_LOCAL_SIZE"));
    if (get("OMPI_COMM_WORLD_LOCAL_SIZE") == get("OMPI_COMM_WORLD_SIZE")) set_default("MASTER_ADDR", "127.0.0.1");
  }
  if (has("OMPI_MCA_ess_base_jobid")) {
    const unsigned long job = std::stoul(get("OMPI_MCA_ess_base_jobid"));
    set_default("MASTER_PORT", std::to_string(20000 + job % 12768));
  }
}

}  // namespace

PYBIND11_MODULE(backplane_torch, m) {
  m.doc() = "torch.distributed backend 'backplane' (import registers it)";
  // The base class's Python type must be known before ours derives from it.
  py::module_ distributed = py::module_::import("torch.distributed");
  launch_variables_from_mpirun();
  py::class_<BackendBackplane, c10d::Backend, c10::intrusive_ptr<BackendBackplane>>(m, "BackendBackplane")
      .def("describe", &BackendBackplane::describe,
           "What backplane chose for this process: the backend, why, and its details.");
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
  py::object backend = distributed.attr("Backend");
  if (!py::hasattr(backend, "BACKPLANE")) {
    backend.attr("register_backend")("backplane", m.attr("create_backend"), py::arg("devices") = std::vector<std::string>{"cpu"});
  }
}
