# The plugins' parts on their own: the operation queue, reductions, MPI's schedules, backplane's TCP
# store and its worlds, Gloo's shared-memory group; the Neuron plugin against a test double of libnrt.

# The operation queue of the plugins whose library calls block (gloo's).
bpl_add_test(op_queue_test plugins/common/op_queue_test.cpp)
target_include_directories(op_queue_test PRIVATE ${PROJECT_SOURCE_DIR}/plugins/common ${PROJECT_SOURCE_DIR}/core/include)
target_link_libraries(op_queue_test PRIVATE GTest::gtest_main)
gtest_discover_tests(op_queue_test)

if(TARGET bpl_reductions)
  bpl_add_test(reductions_test plugins/common/reductions_test.cpp)
  target_link_libraries(reductions_test PRIVATE bpl_reductions GTest::gtest_main c10)  # c10's conversions as the reference
  gtest_discover_tests(reductions_test)
endif()

if(TARGET backplane-mpi)
  # The MPI plugin's schedules on their own (no MPI: they are plain rounds of transfers).
  bpl_add_test(mpi_schedules_test plugins/mpi/schedules_test.cpp ${PROJECT_SOURCE_DIR}/plugins/mpi/schedules.cpp)
  target_include_directories(mpi_schedules_test PRIVATE ${PROJECT_SOURCE_DIR}/plugins/mpi ${PROJECT_SOURCE_DIR}/plugins/common
                                                      ${PROJECT_SOURCE_DIR}/core/include)
  target_link_libraries(mpi_schedules_test PRIVATE GTest::gtest_main)
  gtest_discover_tests(mpi_schedules_test)
endif()

if(TARGET bpl_gloo_store)
  # backplane's own TCP store on loopback: a server and its clients in one process.
  bpl_add_test(tcp_store_test plugins/gloo/tcp_store_test.cpp plugins/gloo/tcp_store_limits_test.cpp
               plugins/gloo/tcp_store_admission_test.cpp)
  target_link_libraries(tcp_store_test PRIVATE bpl_gloo_store GTest::gtest_main)
  gtest_discover_tests(tcp_store_test PROPERTIES TIMEOUT 60)
  # Worlds in a store that outlives them: numbered, forgotten, a duplicate rank refused.
  bpl_add_test(arrival_test plugins/gloo/arrival_test.cpp)
  target_link_libraries(arrival_test PRIVATE bpl_gloo_store GTest::gtest_main)
  gtest_discover_tests(arrival_test PROPERTIES TIMEOUT 60)
endif()

if(TARGET bpl_gloo_shm)
  bpl_add_test(gloo_shm_test plugins/gloo/shm_group_collectives_test.cpp plugins/gloo/shm_group_failures_test.cpp
                            plugins/gloo/shm_group_point_to_point_test.cpp)
  target_link_libraries(gloo_shm_test PRIVATE bpl_gloo_shm GTest::gtest_main)
  gtest_discover_tests(gloo_shm_test PROPERTIES TIMEOUT 120)
endif()

# The Neuron backend without Neuron hardware: its logic against a test double of libnrt.
if(TARGET backplane-neuron)
  # A test double of libnrt.so.1 (see nrt_test_double.c), complete and missing one function.
  set(BPL_NRT_TEST_DOUBLE_DIR ${CMAKE_BINARY_DIR}/lib/nrt-test-double)
  foreach(variant complete incomplete)
    add_library(nrt-test-double-${variant} SHARED plugins/neuron/nrt_test_double.c
      plugins/neuron/nrt_test_double_collectives.c plugins/neuron/nrt_test_double_hub.c)
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
