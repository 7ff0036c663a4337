# torch.distributed on backplane (torch_backend/): ranks that meet through a caller's store, every op
# against torch's own Gloo in the same job, subgroups, futures, DDP and bad input, under bpl-run, a real
# torchrun and mpirun; killed and stopped ranks named on every survivor; PyTorch's own suite and the
# PyTorch 2 stack.
if(TARGET backplane-gloo)
  # The torch.distributed backend's parts: ranks that meet through a caller's store (ABI 1.2).
  if(TARGET bpl_c10d_store)
    bpl_add_test(store_test torch_backend/store_test.cpp)
    target_link_libraries(store_test PRIVATE backplane bpl_c10d_store)
    add_dependencies(store_test backplane-gloo)
    if(TARGET backplane-mpi)
      add_dependencies(store_test backplane-mpi)
    endif()
    if(BPL_SANITIZE)
      target_compile_definitions(store_test PRIVATE BPL_SANITIZER_BUILD)
    endif()
    gtest_discover_tests(store_test PROPERTIES TIMEOUT 180)
  endif()

  if(TARGET backplane_torch)
    set(BPL_TORCH_TEST ${CMAKE_CURRENT_SOURCE_DIR}/torch_backend/test_process_group.py)
    set(BPL_TORCH_TEST_ENV "PYTHONPATH=${BPL_TORCH_MODULE_DIR}" "PYTHONWARNINGS=ignore")
    set(BPL_TORCH_OK "rank 0: OK")
    add_test(NAME torch_backend_gloo_2ranks
      COMMAND ${BPL_EXPECT_OUTPUT} 0 ${BPL_TORCH_OK} -- ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 2
              ${BPL_PYTHON} ${BPL_TORCH_TEST})
    add_test(NAME torch_backend_gloo_tcp_3ranks
      COMMAND ${BPL_EXPECT_OUTPUT} 0 ${BPL_TORCH_OK} -- ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 3
              ${BPL_PYTHON} ${BPL_TORCH_TEST})
    add_test(NAME torch_backend_torchrun_2ranks
      COMMAND ${BPL_EXPECT_OUTPUT} 0 ${BPL_TORCH_OK} -- ${BPL_PYTHON} -m torch.distributed.run
              --standalone --nproc_per_node 2 ${BPL_TORCH_TEST})
    set_tests_properties(torch_backend_gloo_2ranks torch_backend_torchrun_2ranks PROPERTIES TIMEOUT 240 PROCESSORS 2
      ENVIRONMENT "${BPL_TORCH_TEST_ENV}")
    set_tests_properties(torch_backend_gloo_tcp_3ranks PROPERTIES TIMEOUT 240 PROCESSORS 2
      ENVIRONMENT "${BPL_TORCH_TEST_ENV};BPL_GLOO_SHM=0")
    # A rank that outlives rank 0, host of the ranks' store under bpl-run, ends without a word.
    foreach(ranks 2 3)
      foreach(end exit destroy)
        add_test(NAME torch_backend_quiet_${end}_${ranks}ranks
          COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch_backend/test_quiet_exit.py
                  ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run ${ranks} ${end})
        set_tests_properties(torch_backend_quiet_${end}_${ranks}ranks PROPERTIES TIMEOUT 120 PROCESSORS 2
          ENVIRONMENT "${BPL_TORCH_TEST_ENV}")
      endforeach()
    endforeach()
    # What torch's Gloo takes beyond one tensor per call, against torch's Gloo in the same job, 2 and 3 ranks.
    foreach(ranks 2 3)
      add_test(NAME torch_backend_gloo_parity_${ranks}ranks
        COMMAND ${BPL_EXPECT_OUTPUT} 0 "rank 0: OK" -- ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node ${ranks}
                ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch_backend/test_gloo_parity.py)
      set_tests_properties(torch_backend_gloo_parity_${ranks}ranks PROPERTIES TIMEOUT 240 PROCESSORS 2
        ENVIRONMENT "${BPL_TORCH_TEST_ENV}")
    endforeach()
    # torch.profiler's events of the group's operations, and BPL_TRACE's timeline of the same, 2 and 3 ranks.
    foreach(ranks 2 3)
      add_test(NAME torch_backend_profiler_events_${ranks}ranks
        COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch_backend/test_profiler_events.py
                ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} ${ranks})
      set_tests_properties(torch_backend_profiler_events_${ranks}ranks PROPERTIES TIMEOUT 300 PROCESSORS 2
        ENVIRONMENT "${BPL_TORCH_TEST_ENV}")
    endforeach()
    # PyTorch's own distributed suite: CI's selection (every operation, groups, DDP, error handling) on
    # backplane at 2 and 3 ranks; the whole suite against gloo is torch_suite.py without --ci.
    foreach(ranks 2 3)
      add_test(NAME torch_suite_ci_${ranks}ranks
        COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch_backend/torch_suite.py --ci --world ${ranks})
      set_tests_properties(torch_suite_ci_${ranks}ranks PROPERTIES TIMEOUT 900 PROCESSORS 2 ENVIRONMENT "${BPL_TORCH_TEST_ENV}")
    endforeach()
    # The PyTorch 2 stack (DDP comm hooks, FSDP2, DTensor TP x DP, DCP across layouts, functional
    # collectives eager and compiled), 4 ranks under torchrun, on backplane against gloo.
    add_test(NAME torch2_stack_4ranks
      COMMAND ${BPL_EXPECT_OUTPUT} 0 "passed: DDP with comm hooks" --
              ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch_backend/torch2_stack_test.py)
    set_tests_properties(torch2_stack_4ranks PROPERTIES TIMEOUT 600 PROCESSORS 2 ENVIRONMENT "${BPL_TORCH_TEST_ENV}")
    # The reference's CPU-mode example in Python, under a real torchrun, against the unsharded MLP.
    add_test(NAME example_python_cpu_mode_mlp
      COMMAND ${BPL_EXPECT_OUTPUT} 0 "rank 0: unsharded output sum .*: match" -- ${BPL_PYTHON}
              -m torch.distributed.run --standalone --nproc_per_node 2
              ${PROJECT_SOURCE_DIR}/examples/python/cpu_mode_mlp.py --check)
    set_tests_properties(example_python_cpu_mode_mlp PROPERTIES TIMEOUT 120 PROCESSORS 2
      ENVIRONMENT "${BPL_TORCH_TEST_ENV};NXD_CPU_MODE=1")
    foreach(fault killed stopped)
      string(REGEX REPLACE "p?ed$" "" signal ${fault})  # killed -> kill, stopped -> stop
      add_test(NAME torch_backend_${fault}_rank
        COMMAND ${BPL_EXPECT_OUTPUT} 0 "every survivor named the killed rank in time" --
                ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch_backend/test_killed_rank.py 3 ${signal})
      set_tests_properties(torch_backend_${fault}_rank PROPERTIES TIMEOUT 120 PROCESSORS 2 ENVIRONMENT "${BPL_TORCH_TEST_ENV}")
      # The victim is rank 0, host of the ranks' TCPStore; over TCP the survivors need the store to name it.
      add_test(NAME torch_backend_${fault}_store_host
        COMMAND ${BPL_EXPECT_OUTPUT} 0 "every survivor named the killed rank in time" --
                ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch_backend/test_killed_rank.py 3 ${signal} store-host)
      set_tests_properties(torch_backend_${fault}_store_host PROPERTIES TIMEOUT 120 PROCESSORS 2
        ENVIRONMENT "${BPL_TORCH_TEST_ENV};BPL_GLOO_SHM=0")
      # The survivors go on without the victim: torch.distributed.shrink_group (bpl_comm_shrink).
      add_test(NAME torch_backend_${fault}_rank_shrink_group
        COMMAND ${BPL_EXPECT_OUTPUT} 0 "every survivor named the killed rank in time and went on" --
                ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch_backend/test_killed_rank.py 3 ${signal} shrink)
      set_tests_properties(torch_backend_${fault}_rank_shrink_group PROPERTIES TIMEOUT 120 PROCESSORS 2
        ENVIRONMENT "${BPL_TORCH_TEST_ENV}")
    endforeach()
    if(TARGET backplane-mpi)
      # mpirun gives no MASTER_PORT: the ranks meet through torch's FileStore, in a file made anew here.
      set(init_file ${CMAKE_CURRENT_BINARY_DIR}/torch_backend_mpi.init)
      add_test(NAME torch_backend_mpi_3ranks
        COMMAND ${BPL_EXPECT_OUTPUT} 0 ${BPL_TORCH_OK} -- sh -c "rm -f ${init_file} && exec ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} 3 ${BPL_PYTHON} ${BPL_TORCH_TEST}")
      set_tests_properties(torch_backend_mpi_3ranks PROPERTIES TIMEOUT 240 PROCESSORS 2
        ENVIRONMENT "${BPL_TORCH_TEST_ENV};${BPL_MPI_TEST_ENV};BPL_BACKEND=mpi;TEST_INIT_FILE=${init_file}")
      # The README's command as it stands: env://, with nothing mapped by hand (backplane_torch takes
      # the launch variables from Open MPI's).
      add_test(NAME torch_backend_mpi_env_2ranks
        COMMAND ${BPL_EXPECT_OUTPUT} 0 ${BPL_TORCH_OK} -- ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} 2
                ${BPL_PYTHON} ${BPL_TORCH_TEST})
      set_tests_properties(torch_backend_mpi_env_2ranks PROPERTIES TIMEOUT 240 PROCESSORS 2
        ENVIRONMENT "${BPL_TORCH_TEST_ENV};${BPL_MPI_TEST_ENV};BPL_BACKEND=mpi")
    endif()
  endif()
endif()
