# The Python the build is for: the torch parts build against its torch, the Python modules install where
# it searches, and the tests run it (never whatever python3 comes first on PATH). The first of:
#   BPL_PYTHON              given on the command line (-DBPL_PYTHON=...)
#   Python3_EXECUTABLE      given on the command line, or by pip's build (scikit-build-core passes it)
#   VIRTUAL_ENV             the active virtual environment's python
#   CONDA_PREFIX            the active conda environment's python
#   .venv                   the project's own environment (tools/install-deps)
#   python3                 the first on PATH
# A choice of the last four is kept in the cache, as FindPython keeps its own: a later configure says it
# again and keeps it, unless the interpreter is gone. Used by backplane's build and by its package config
# (also in a consumer's build, by backplaneConfig.cmake). Sets BPL_PYTHON and BPL_PYTHON_VERSION (X.Y).

set(BPL_PYTHON "" CACHE FILEPATH "The Python the build is for (default: cmake/BplPython.cmake's choice)")

function(bpl_choose_python)
  if(BPL_PYTHON)
    set(python "${BPL_PYTHON}")
    set(why "BPL_PYTHON")
  elseif(Python3_EXECUTABLE)
    set(python "${Python3_EXECUTABLE}")
    set(why "Python3_EXECUTABLE")
  elseif(BPL_PYTHON_CHOSEN AND EXISTS "${BPL_PYTHON_CHOSEN}")
    set(python "${BPL_PYTHON_CHOSEN}")
    set(why "${BPL_PYTHON_CHOSEN_WHY}, chosen at the first configure")
  elseif(DEFINED ENV{VIRTUAL_ENV} AND EXISTS "$ENV{VIRTUAL_ENV}/bin/python")
    set(python "$ENV{VIRTUAL_ENV}/bin/python")
    set(why "the active virtual environment, VIRTUAL_ENV")
  elseif(DEFINED ENV{CONDA_PREFIX} AND EXISTS "$ENV{CONDA_PREFIX}/bin/python")
    set(python "$ENV{CONDA_PREFIX}/bin/python")
    set(why "the active conda environment, CONDA_PREFIX")
  elseif(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(why "the project's environment, made by tools/install-deps")
  else()
    find_program(python NAMES python3 NO_CACHE)
    set(why "the first python3 on PATH")
    if(NOT python)
      message(FATAL_ERROR "No Python found: set BPL_PYTHON or Python3_EXECUTABLE, activate a virtual environment, "
                          "or run tools/install-deps")
    endif()
  endif()
  if(NOT why MATCHES "^(BPL_PYTHON|Python3_EXECUTABLE)$|first configure")
    set(BPL_PYTHON_CHOSEN "${python}" CACHE INTERNAL "")
    set(BPL_PYTHON_CHOSEN_WHY "${why}" CACHE INTERNAL "")
  endif()
  execute_process(COMMAND "${python}" -c "import sys; print('%d.%d' % sys.version_info[:2])"
                  OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE failed ERROR_QUIET)
  if(NOT version OR failed)
    message(FATAL_ERROR "The Python ${python} (${why}) does not run")
  endif()
  message(STATUS "Python: ${python} (${version}; ${why})")
  set(BPL_PYTHON "${python}" PARENT_SCOPE)
  set(BPL_PYTHON_VERSION ${version} PARENT_SCOPE)
endfunction()

if(NOT BPL_PYTHON_VERSION)
  bpl_choose_python()
endif()
