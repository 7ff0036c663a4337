# Where things install, under the prefix, and how installed files find each other: run paths relative to
# each file ($ORIGIN), so that the installed tree moves as a whole and names nothing of the build's.

# The Python modules: inside a wheel, its platlib (scikit-build-core's SKBUILD_PLATLIB_DIR); else where
# BPL_PYTHON searches a prefix: lib/pythonX.Y/site-packages for a virtual environment, conda or a Python
# built from source, Debian's dist-packages for Debian's own python3 (lib/python3/dist-packages under
# /usr). A prefix that Python does not search needs PYTHONPATH (docs/embedding.md).
function(bpl_python_install_dir out)
  if(SKBUILD_PLATLIB_DIR)
    set(${out} "${SKBUILD_PLATLIB_DIR}" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND "${BPL_PYTHON}" -c
    "import sys; print(int(sys.prefix == sys.base_prefix and any(p.endswith('dist-packages') for p in sys.path)))"
    OUTPUT_VARIABLE debian OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(debian AND CMAKE_INSTALL_PREFIX STREQUAL "/usr")
    set(${out} lib/python3/dist-packages PARENT_SCOPE)
  elseif(debian)
    set(${out} lib/python${BPL_PYTHON_VERSION}/dist-packages PARENT_SCOPE)
  else()
    set(${out} lib/python${BPL_PYTHON_VERSION}/site-packages PARENT_SCOPE)
  endif()
endfunction()
set(BPL_INSTALL_PYTHONDIR "" CACHE STRING "Where the Python modules install, under the prefix (default: where BPL_PYTHON searches it)")
if(NOT BPL_INSTALL_PYTHONDIR)
  bpl_python_install_dir(BPL_INSTALL_PYTHONDIR)
endif()

# $ORIGIN/<the way from `from` to `to`>, both folders under the prefix (or absolute, as in a wheel).
function(bpl_origin_path out from to)
  foreach(folder from to)
    if(NOT IS_ABSOLUTE "${${folder}}")
      set(${folder} "${CMAKE_INSTALL_PREFIX}/${${folder}}")
    endif()
  endforeach()
  file(RELATIVE_PATH way "${from}" "${to}")
  set(${out} "$ORIGIN/${way}" PARENT_SCOPE)
endfunction()

# The build tree mirrors the installed one: lib/ with libbackplane.so, lib/backplane/plugins/ with the
# plugins, bin/ with the tools, so the lookup "beside libbackplane.so" works in both.
set(BPL_PLUGIN_SUBDIR "backplane/plugins")
set(BPL_INSTALL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/backplane)
set(BPL_INSTALL_PLUGIN_DIR ${CMAKE_INSTALL_LIBDIR}/${BPL_PLUGIN_SUBDIR})
bpl_origin_path(CMAKE_INSTALL_RPATH ${CMAKE_INSTALL_BINDIR} ${CMAKE_INSTALL_LIBDIR})

# What links LibTorch finds it in the Python environment that the tree is installed into (a wheel's
# site-packages, or the environment itself as the prefix): <python modules>/torch/lib. Elsewhere, a
# program finds it through its own run path (find_package(backplane COMPONENTS parallel) gives it the
# torch it builds against), and the modules that the plugins load through the torch of the environment
# that runs them (plugins/common/torch_library.cpp).
# bpl_links_torch(<target>... [FROM <folder>]): FROM is where they install, lib/ (or bin/) by default.
function(bpl_links_torch)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "FROM" "")
  if(NOT arg_FROM)
    set(arg_FROM ${CMAKE_INSTALL_LIBDIR})
  endif()
  bpl_origin_path(torch_lib ${arg_FROM} ${BPL_INSTALL_PYTHONDIR}/torch/lib)
  set_property(TARGET ${arg_UNPARSED_ARGUMENTS} APPEND PROPERTY INSTALL_RPATH "${torch_lib}")
endfunction()

# Programs that other programs run (the launcher's store, benchmarks, their workloads) go where a
# package keeps such programs, libexec/backplane/, as Debian's packages do; from there every run path
# (each written for bin/ or lib/) is one folder further up.
function(bpl_install_libexec)
  foreach(target ${ARGN})
    get_target_property(rpath ${target} INSTALL_RPATH)
    list(TRANSFORM rpath REPLACE "^\\$ORIGIN/\\.\\./" "$ORIGIN/../../")
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "${rpath}")
  endforeach()
  install(TARGETS ${ARGN} RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/backplane)
endfunction()
