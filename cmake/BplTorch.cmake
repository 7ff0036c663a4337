# LibTorch from the project's Python environment (.venv, made by tools/install-deps): the C++ parts
# build against the very torch that torch.distributed programs import, so the project has one torch.
# Sets BPL_PYTHON (the project's interpreter, which the tests run too) and Torch_FOUND, and defines the
# imported targets c10, torch_cpu, torch (what a CPU program links: torch_cpu and c10) and torch_python.
#
# torch's own CMake package is not used: PyPI's wheel is the CUDA build, whose package looks for a CUDA
# toolkit and would link its libraries (and, with Debian's LibTorch installed, finds that one first).
# Nothing here runs on a GPU: torch_cpu and c10 are all the CPU needs.

# Also installed beside backplane's package config, which sets BPL_PYTHON to the build's before including
# it: a program built against the installed frontend links the same torch.
if(NOT BPL_PYTHON)
  set(BPL_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python")
endif()
set(Torch_FOUND FALSE)
if(NOT EXISTS "${BPL_PYTHON}")
  message(STATUS "No Python environment at ${BPL_PYTHON} (run tools/install-deps)")
  return()
endif()
execute_process(
  COMMAND "${BPL_PYTHON}" -c "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch.compiled_with_cxx11_abi()))"
  OUTPUT_VARIABLE bpl_torch_facts OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE bpl_no_torch ERROR_QUIET)
if(bpl_no_torch)
  message(STATUS "${BPL_PYTHON} cannot import torch (run tools/install-deps)")
  return()
endif()
string(REPLACE "\n" ";" bpl_torch_facts "${bpl_torch_facts}")
list(GET bpl_torch_facts 0 BPL_TORCH_DIR)
list(GET bpl_torch_facts 1 BPL_TORCH_VERSION)
list(GET bpl_torch_facts 2 bpl_torch_cxx11_abi)

function(bpl_torch_library target file)
  add_library(${target} SHARED IMPORTED GLOBAL)
  set_target_properties(${target} PROPERTIES
    IMPORTED_LOCATION "${BPL_TORCH_DIR}/lib/${file}"
    INTERFACE_INCLUDE_DIRECTORIES "${BPL_TORCH_DIR}/include;${BPL_TORCH_DIR}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${bpl_torch_cxx11_abi}"
    # torch 2.10 and later's headers are C++20: the translation units that include them are compiled
    # as C++20; the rest of the project (the C ABI, the core, the plugins) stays C++17.
    INTERFACE_COMPILE_FEATURES cxx_std_20)
endfunction()
bpl_torch_library(c10 libc10.so)
bpl_torch_library(torch_cpu libtorch_cpu.so)
set_property(TARGET torch_cpu PROPERTY INTERFACE_LINK_LIBRARIES c10)
bpl_torch_library(torch_python libtorch_python.so)
add_library(torch INTERFACE IMPORTED GLOBAL)
set_property(TARGET torch PROPERTY INTERFACE_LINK_LIBRARIES torch_cpu c10)
set(Torch_FOUND TRUE)
message(STATUS "LibTorch ${BPL_TORCH_VERSION} from ${BPL_TORCH_DIR} (${BPL_PYTHON})")
