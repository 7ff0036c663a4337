# The backplane package on real ranks over this build's library: bpl-run (gloo) and mpirun (mpi).
if(TARGET backplane-gloo)
  add_test(NAME python_gloo_2ranks
    COMMAND ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 2 ${BPL_PYTHON}
            ${CMAKE_CURRENT_SOURCE_DIR}/python/test_backplane.py)
  set_tests_properties(python_gloo_2ranks PROPERTIES TIMEOUT 120 PROCESSORS 2
    ENVIRONMENT "${BPL_PYTHON_TEST_ENV};BPL_BACKEND=gloo;BPL_TIMEOUT_MS=60000")
  if(TARGET backplane-mpi)
    add_test(NAME python_mpi_2ranks
      COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} 2 ${BPL_PYTHON}
              ${CMAKE_CURRENT_SOURCE_DIR}/python/test_backplane.py)
    set_tests_properties(python_mpi_2ranks PROPERTIES TIMEOUT 120 PROCESSORS 2
      ENVIRONMENT "${BPL_PYTHON_TEST_ENV};BPL_BACKEND=mpi;${BPL_MPI_TEST_ENV}")
  endif()

endif()
