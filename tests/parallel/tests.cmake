# The LibTorch frontend: one process, then real ranks under bpl-run (CPU mode) and mpirun.
if(TARGET backplane-parallel)
  bpl_add_test(parallel_unit_test parallel/parallel_unit_test.cpp parallel/checkpoint_files_test.cpp)
  target_link_libraries(parallel_unit_test PRIVATE backplane-parallel GTest::gtest_main)
  target_include_directories(parallel_unit_test PRIVATE ${PROJECT_SOURCE_DIR}/parallel/src)
  add_dependencies(parallel_unit_test backplane-gloo)
  gtest_discover_tests(parallel_unit_test PROPERTIES TIMEOUT 120 ENVIRONMENT "BPL_BACKEND=gloo")

  bpl_add_test(bpl-parallel-test parallel/parallel_ranks_test.cpp parallel/training_ranks_test.cpp
    parallel/pipeline_ranks_test.cpp parallel/lora_ranks_test.cpp parallel/model_init_ranks_test.cpp
    parallel/checkpoint_layouts_ranks_test.cpp parallel/recovery_ranks_test.cpp)
  target_link_libraries(bpl-parallel-test PRIVATE backplane-parallel)
  set_target_properties(bpl-parallel-test PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
  add_dependencies(bpl-parallel-test backplane-gloo)
  foreach(ranks 2 4)
    add_test(NAME parallel_gloo_${ranks}ranks
      COMMAND ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node ${ranks} $<TARGET_FILE:bpl-parallel-test>)
    set_tests_properties(parallel_gloo_${ranks}ranks PROPERTIES
      TIMEOUT 600 ENVIRONMENT "NXD_CPU_MODE=1;BPL_TIMEOUT_MS=60000" PROCESSORS 2)
    if(TARGET backplane-mpi)
      add_dependencies(bpl-parallel-test backplane-mpi)
      add_test(NAME parallel_mpi_${ranks}ranks
        COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${ranks} $<TARGET_FILE:bpl-parallel-test>)
      set_tests_properties(parallel_mpi_${ranks}ranks PROPERTIES TIMEOUT 600 PROCESSORS 2
        ENVIRONMENT "${BPL_MPI_TEST_ENV}")
    endif()
  endforeach()
endif()
