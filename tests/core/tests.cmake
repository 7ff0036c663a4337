# The core: the ABI (its layout, the 1.0 snapshot, old plugins and embedders, the exported symbols),
# the loader against broken plugins, the environment, bad arguments on every public function, and the
# house rules the build checks.

# Deliberately broken plugins for the loader tests.
foreach(variant wrong-abi no-entry open-fails bad-size missing-function unresolved-symbol open-throws)
  string(TOUPPER "TEST_PLUGIN_${variant}" define)
  string(REPLACE "-" "_" define "${define}")
  if(variant STREQUAL "open-throws")
    add_library(bpl-test-${variant} MODULE core/broken_plugins/throwing_plugin.cpp)
  else()
    add_library(bpl-test-${variant} MODULE core/broken_plugins/test_plugin.c)
  endif()
  target_include_directories(bpl-test-${variant} PRIVATE ${PROJECT_SOURCE_DIR}/core/include)
  target_compile_definitions(bpl-test-${variant} PRIVATE ${define})
  set_target_properties(bpl-test-${variant} PROPERTIES PREFIX "lib" C_VISIBILITY_PRESET hidden
    LIBRARY_OUTPUT_DIRECTORY ${BPL_TEST_PLUGIN_DIR})
endforeach()

# The public headers compile as strict C99, warning-free.
add_library(bpl_header_c_check OBJECT core/header_check.c)
target_include_directories(bpl_header_c_check PRIVATE ${PROJECT_SOURCE_DIR}/core/include)
target_compile_options(bpl_header_c_check PRIVATE -std=c99 -pedantic -Werror)

set(test_plugins bpl-test-wrong-abi bpl-test-no-entry bpl-test-open-fails bpl-test-bad-size bpl-test-missing-function
                 bpl-test-unresolved-symbol bpl-test-open-throws)

bpl_add_test(abi_layout_test core/abi_layout_test.cpp)
target_link_libraries(abi_layout_test PRIVATE backplane GTest::gtest_main)
gtest_discover_tests(abi_layout_test)

# ABI stability: the 1.0 headers are committed under abi/1.0 and never change. The layout table is
# compiled against them and against the current headers; a plugin and an embedder built against them
# run with the current core.
foreach(version 1_0 current)
  add_library(bpl_layout_${version} OBJECT core/abi/layout_table.c)
  target_compile_definitions(bpl_layout_${version} PRIVATE LAYOUT_TABLE=bpl_layout_${version})
  target_include_directories(bpl_layout_${version} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/core/abi)
endforeach()
target_include_directories(bpl_layout_1_0 PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/core/abi/1.0)
target_include_directories(bpl_layout_current PRIVATE ${PROJECT_SOURCE_DIR}/core/include)
add_library(bpl-test-abi-1.0-plugin MODULE core/abi/old_plugin.c)
target_include_directories(bpl-test-abi-1.0-plugin PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/core/abi/1.0)
set_target_properties(bpl-test-abi-1.0-plugin PROPERTIES PREFIX "lib" C_VISIBILITY_PRESET hidden
  LIBRARY_OUTPUT_DIRECTORY ${BPL_TEST_PLUGIN_DIR})
bpl_add_test(abi_snapshot_test core/abi/abi_snapshot_test.cpp $<TARGET_OBJECTS:bpl_layout_1_0>
             $<TARGET_OBJECTS:bpl_layout_current>)
target_include_directories(abi_snapshot_test PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/core/abi)
target_link_libraries(abi_snapshot_test PRIVATE backplane GTest::gtest_main)
target_compile_definitions(abi_snapshot_test PRIVATE BPL_PROJECT_VERSION_MAJOR=${PROJECT_VERSION_MAJOR}
  BPL_PROJECT_VERSION_MINOR=${PROJECT_VERSION_MINOR} BPL_OLD_PLUGIN="$<TARGET_FILE:bpl-test-abi-1.0-plugin>")
add_dependencies(abi_snapshot_test bpl-test-abi-1.0-plugin)
gtest_discover_tests(abi_snapshot_test)
add_executable(embed_abi_1_0 ${PROJECT_SOURCE_DIR}/examples/embed.c)
target_include_directories(embed_abi_1_0 PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/core/abi/1.0)
target_link_libraries(embed_abi_1_0 PRIVATE $<TARGET_FILE:backplane>)
add_dependencies(embed_abi_1_0 backplane)

bpl_add_test(cache_test core/cache_test.cpp)
target_link_libraries(cache_test PRIVATE backplane_internal GTest::gtest_main)
add_dependencies(cache_test bpl-cache)
gtest_discover_tests(cache_test PROPERTIES TIMEOUT 60)

bpl_add_test(fingerprint_test core/fingerprint_test.cpp)
target_link_libraries(fingerprint_test PRIVATE bpl_diagnosis GTest::gtest_main)
gtest_discover_tests(fingerprint_test)

# core/src is libbackplane's own: no plugin, frontend, binding or tool includes from it.
add_test(NAME core_src_is_private
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -P ${PROJECT_SOURCE_DIR}/cmake/CheckPrivateIncludes.cmake)
# No source file over 500 lines (public headers aside).
add_test(NAME source_files_are_short
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -P ${PROJECT_SOURCE_DIR}/cmake/CheckFileLengths.cmake)

if(TARGET backplane-gloo)
  bpl_add_test(elf_dynamic_test core/elf_dynamic_test.cpp)
  target_link_libraries(elf_dynamic_test PRIVATE backplane_internal GTest::gtest_main)
  target_compile_definitions(elf_dynamic_test PRIVATE BPL_PLUGINS="${CMAKE_BINARY_DIR}/lib/${BPL_PLUGIN_SUBDIR}")
  add_dependencies(elf_dynamic_test backplane-gloo backplane-neuron)
  if(TARGET bpl-cpu-kernels)
    add_dependencies(elf_dynamic_test bpl-cpu-kernels)
  endif()
  gtest_discover_tests(elf_dynamic_test)
endif()

bpl_add_test(environment_test core/environment_test.cpp)
target_link_libraries(environment_test PRIVATE backplane_internal GTest::gtest_main)
gtest_discover_tests(environment_test)

if(TARGET backplane-gloo)
  bpl_add_test(api_test core/api_test.cpp)
  target_link_libraries(api_test PRIVATE backplane GTest::gtest_main)
  add_dependencies(api_test backplane-gloo ${test_plugins})
  if(TARGET backplane-neuron)
    add_dependencies(api_test backplane-neuron)
    target_compile_definitions(api_test PRIVATE BPL_HAVE_NEURON_PLUGIN)
  endif()
  gtest_discover_tests(api_test)

  # Bad arguments on every public function, for every backend that loads here.
  bpl_add_test(bad_arguments_test core/bad_arguments_test.cpp)
  target_link_libraries(bad_arguments_test PRIVATE backplane)
  add_dependencies(bad_arguments_test backplane-gloo)
  if(TARGET backplane-mpi)
    add_dependencies(bad_arguments_test backplane-mpi)
    target_compile_definitions(bad_arguments_test PRIVATE BPL_HAVE_MPI_PLUGIN)
  endif()
  if(BPL_SANITIZE AND TARGET backplane-mpi)
    gtest_discover_tests(bad_arguments_test TEST_FILTER "*/gloo:*/neuron")
    add_test(NAME bad_arguments_test_mpi COMMAND bad_arguments_test --gtest_filter=*/mpi)
    set_tests_properties(bad_arguments_test_mpi PROPERTIES TIMEOUT 120 ENVIRONMENT "${BPL_MPI_TEST_ENV}")
  else()
    gtest_discover_tests(bad_arguments_test)
  endif()

  # An embedder built against the 1.0 headers, on the current library and plugins.
  add_test(NAME abi_old_embedder
    COMMAND ${BPL_EXPECT_OUTPUT} 0 "rank 0: .*  ok\n.*rank 1: .*  ok|rank 1: .*  ok\n.*rank 0: .*  ok" --
            ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 2 $<TARGET_FILE:embed_abi_1_0>)
  set_tests_properties(abi_old_embedder PROPERTIES TIMEOUT 120 PROCESSORS 2 ENVIRONMENT "NXD_CPU_MODE=1")
  add_dependencies(embed_abi_1_0 backplane-gloo)

  # What libbackplane and each plugin export: backplane.h's functions, an entry symbol, nothing else.
  add_test(NAME exported_symbols COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/core/exported_symbols_test.sh
           ${CMAKE_BINARY_DIR}/lib ${PROJECT_SOURCE_DIR}/core/include/backplane/backplane.h)
endif()

# A negative NXD_CPU_MODE is refused naming it, in a real process (it once selected neuron silently).
add_test(NAME nxd_cpu_mode_negative_is_refused
  COMMAND ${BPL_EXPECT_OUTPUT} 1 "NXD_CPU_MODE='-3' is negative" -- $<TARGET_FILE:bpl-info>)
set_tests_properties(nxd_cpu_mode_negative_is_refused PROPERTIES ENVIRONMENT "NXD_CPU_MODE=-3" TIMEOUT 60)
