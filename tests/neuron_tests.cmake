# The Neuron backend without Neuron hardware (included by tests/CMakeLists.txt): its logic against a
# test double of libnrt.
if(TARGET backplane-neuron)
  # A test double of libnrt.so.1 (see the file's header), complete and missing one function.
  set(BPL_NRT_TEST_DOUBLE_DIR ${CMAKE_BINARY_DIR}/lib/nrt-test-double)
  foreach(variant complete incomplete)
    add_library(nrt-test-double-${variant} SHARED plugins/neuron/nrt_test_double.c)
    target_link_libraries(nrt-test-double-${variant} PRIVATE Threads::Threads m)
    # No SONAME: loaded by path, it must not answer a later dlopen("libnrt.so.1") in the same process.
    set_target_properties(nrt-test-double-${variant} PROPERTIES OUTPUT_NAME nrt SUFFIX ".so.1" PREFIX "lib" NO_SONAME ON
      C_VISIBILITY_PRESET hidden LIBRARY_OUTPUT_DIRECTORY ${BPL_NRT_TEST_DOUBLE_DIR}/${variant})
  endforeach()
  target_compile_definitions(nrt-test-double-incomplete PRIVATE NRT_TEST_DOUBLE_INCOMPLETE)

  bpl_add_test(neuron_runtime_test plugins/neuron/neuron_runtime_test.cpp)
  target_link_libraries(neuron_runtime_test PRIVATE bpl_neuron_runtime backplane GTest::gtest_main)
  target_compile_definitions(neuron_runtime_test PRIVATE BPL_NRT_TEST_DOUBLE_DIR="${BPL_NRT_TEST_DOUBLE_DIR}"
    BPL_STAND_IN_COMPILER_DIR="${CMAKE_CURRENT_SOURCE_DIR}/plugins/neuron")
  add_dependencies(neuron_runtime_test backplane-neuron nrt-test-double-complete nrt-test-double-incomplete)
  gtest_discover_tests(neuron_runtime_test PROPERTIES TIMEOUT 120)

  foreach(test process_test bad_arguments_test)
    if(TARGET ${test})
      target_compile_definitions(${test} PRIVATE BPL_NRT_TEST_DOUBLE_DIR="${BPL_NRT_TEST_DOUBLE_DIR}")
      add_dependencies(${test} backplane-neuron nrt-test-double-complete)
    endif()
  endforeach()
  if(TARGET bpl-conformance)
    # The conformance suite over the double's collectives: real processes, real sockets, the plugin
    # unchanged. This proves the plugin's logic, not the hardware.
    foreach(ranks 2 3)
      add_test(NAME conformance_neuron_double_${ranks}ranks
        COMMAND ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node ${ranks}
                $<TARGET_FILE:bpl-conformance> --backend=neuron)
      set_tests_properties(conformance_neuron_double_${ranks}ranks PROPERTIES TIMEOUT 300 PROCESSORS 2
        ENVIRONMENT "NEURON_RT_LIB=${BPL_NRT_TEST_DOUBLE_DIR}/complete;NRT_TEST_DOUBLE_CORES=4;BPL_TIMEOUT_MS=60000")
    endforeach()
    add_dependencies(bpl-conformance backplane-neuron nrt-test-double-complete)
  endif()
endif()
