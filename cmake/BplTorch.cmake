# LibTorch from the torch of the build's Python (BPL_PYTHON, cmake/BplPython.cmake): the C++ parts build
# against the very torch that torch.distributed programs import, so a program has one torch. Sets
# Torch_FOUND, BPL_TORCH_VERSION and BPL_TORCH_DIR (the torch package's folder), or BPL_TORCH_MISSING (why
# not), and defines the imported targets c10, torch_cpu, torch (what a CPU program links: torch_cpu and
# c10) and torch_python. Installed beside backplane's package config, which includes it for the component
# "parallel" in a consumer's build, with the consumer's Python.
#
# torch's own CMake package is not used: PyPI's wheel is the CUDA build, whose package looks for a CUDA
# toolkit and would link its libraries (and, with Debian's LibTorch installed, finds that one first).
# Nothing here runs on a GPU: torch_cpu and c10 are all the CPU needs.

include(${CMAKE_CURRENT_LIST_DIR}/BplPython.cmake)
set(Torch_FOUND FALSE)
set(BPL_TORCH_MISSING "")

# pip's isolated build runs the target environment's python with that environment hidden: `-I` (which
# ignores PYTHONPATH, where pip puts the build's own packages) shows it again, so `pip install .` builds
# against the torch of the environment it installs into, as --no-build-isolation does.
set(bpl_torch_query "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__.split('+')[0]); print(int(torch.compiled_with_cxx11_abi()))")
execute_process(COMMAND "${BPL_PYTHON}" -c "${bpl_torch_query}"
  OUTPUT_VARIABLE bpl_torch_facts OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE bpl_no_torch ERROR_QUIET)
if(bpl_no_torch AND SKBUILD)
  execute_process(COMMAND "${BPL_PYTHON}" -I -c "${bpl_torch_query}"
    OUTPUT_VARIABLE bpl_torch_facts OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE bpl_no_torch ERROR_QUIET)
endif()
if(bpl_no_torch)
  set(BPL_TORCH_MISSING "${BPL_PYTHON} cannot import torch")
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
# A program that links LibTorch names it itself, even where the linker drops unused libraries
# (--as-needed, Debian's default): its run path then finds LibTorch for the libraries it loads too,
# whose own run paths cannot name the torch of every environment (docs/install.md).
set_property(TARGET torch PROPERTY INTERFACE_LINK_OPTIONS "LINKER:--no-as-needed")
set(Torch_FOUND TRUE)
message(STATUS "LibTorch ${BPL_TORCH_VERSION} from ${BPL_TORCH_DIR}")
