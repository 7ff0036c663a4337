# Fails when a source outside the core includes one of core/src's headers: they are libbackplane's
# private ones. Everything else reaches the core through core/include (the ABI) and core/diagnosis
# (the diagnosis the plugins share). Run by the test core_src_is_private:
#   cmake -DSOURCE_DIR=<repository root> -P cmake/CheckPrivateIncludes.cmake
cmake_policy(VERSION 3.16)
file(GLOB private_headers RELATIVE "${SOURCE_DIR}/core/src" "${SOURCE_DIR}/core/src/*.h")
set(outside plugins parallel torch_backend python tools examples bench)
set(violations "")
foreach(dir IN LISTS outside)
  file(GLOB_RECURSE sources "${SOURCE_DIR}/${dir}/*.h" "${SOURCE_DIR}/${dir}/*.hpp" "${SOURCE_DIR}/${dir}/*.c"
       "${SOURCE_DIR}/${dir}/*.cc" "${SOURCE_DIR}/${dir}/*.cpp")
  foreach(source IN LISTS sources)
    file(STRINGS "${source}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+\"")
    get_filename_component(source_dir "${source}" DIRECTORY)
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" included "${line}")
      get_filename_component(name "${included}" NAME)
      # core/src is one folder: only a bare name (or a path through core/src) can reach it; a header of
      # the includer's own folder is its own, whatever its name.
      if(included MATCHES "core/src/" OR (included STREQUAL name AND name IN_LIST private_headers
                                          AND NOT EXISTS "${source_dir}/${name}"))
        file(RELATIVE_PATH where "${SOURCE_DIR}" "${source}")
        list(APPEND violations "${where}: #include \"${included}\" (core/src/${name} is private to libbackplane)")
      endif()
    endforeach()
  endforeach()
endforeach()
if(violations)
  list(JOIN violations "\n  " report)
  message(FATAL_ERROR "sources outside the core include its private headers:\n  ${report}")
endif()
list(LENGTH private_headers count)
message(STATUS "no source in ${outside} includes any of core/src's ${count} private headers")
