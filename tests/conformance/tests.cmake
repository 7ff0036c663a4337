# The conformance suite: every collective and kernel on every backend that runs here, as real ranks
# under bpl-run (shared memory, staged, TCP, machines of two ranks) and mpirun; and which path a world
# takes, as bpl-info reports it.
if(TARGET backplane-gloo)
  bpl_add_test(kernel_test conformance/kernel_test.cpp)
  target_link_libraries(kernel_test PRIVATE backplane c10)
  add_dependencies(kernel_test backplane-gloo)
  if(TARGET backplane-mpi)
    add_dependencies(kernel_test backplane-mpi)
  endif()
  if(BPL_SANITIZE AND TARGET backplane-mpi)
    gtest_discover_tests(kernel_test PROPERTIES TIMEOUT 120 ENVIRONMENT "BPL_TEST_BACKENDS=gloo")
    add_test(NAME kernel_test_mpi COMMAND kernel_test --gtest_filter=*/mpi)
    set_tests_properties(kernel_test_mpi PROPERTIES TIMEOUT 300 ENVIRONMENT "${BPL_MPI_TEST_ENV}")
  else()
    gtest_discover_tests(kernel_test PROPERTIES TIMEOUT 120)
  endif()

  # The conformance suite: one binary for every backend, run as real ranks under a launcher.
  bpl_add_test(bpl-conformance conformance/main.cpp conformance/collectives_test.cpp conformance/async_and_in_place_test.cpp
                               conformance/point_to_point_and_split_test.cpp)
  target_link_libraries(bpl-conformance PRIVATE backplane c10)
  set_target_properties(bpl-conformance PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
  # The ranks as on machines of two ranks each (BPL_GLOO_HOST_ID): shared memory within each machine,
  # Gloo over TCP between them; with 3 ranks one machine has a rank alone.
  foreach(ranks 3 4)
    add_test(NAME conformance_gloo_machines_${ranks}ranks
      COMMAND ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node ${ranks}
              ${CMAKE_CURRENT_SOURCE_DIR}/support/as-machines 2 $<TARGET_FILE:bpl-conformance> --backend=gloo)
    set_tests_properties(conformance_gloo_machines_${ranks}ranks PROPERTIES
      TIMEOUT 600 ENVIRONMENT "BPL_TIMEOUT_MS=60000" PROCESSORS 2)
  endforeach()
  foreach(ranks 2 3)
    add_test(NAME conformance_gloo_${ranks}ranks
      COMMAND ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node ${ranks}
              $<TARGET_FILE:bpl-conformance> --backend=gloo)
    set_tests_properties(conformance_gloo_${ranks}ranks PROPERTIES
      TIMEOUT 600 ENVIRONMENT "BPL_TIMEOUT_MS=60000" PROCESSORS ${ranks})
    # Which path the world takes, as bpl-info reports it: shared memory by default, TCP when turned off.
    if(ranks EQUAL 2)
      add_test(NAME gloo_path_shared_memory
        COMMAND ${BPL_EXPECT_OUTPUT} 0 "collectives of world: shared memory \\(all 2 ranks on this machine; large messages in a single copy\\)" --
                ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 2 $<TARGET_FILE:bpl-info> --init)
      set_tests_properties(gloo_path_shared_memory PROPERTIES ENVIRONMENT "BPL_BACKEND=gloo" TIMEOUT 120)
      add_test(NAME gloo_path_tcp_when_turned_off
        COMMAND ${BPL_EXPECT_OUTPUT} 0 "collectives of world: gloo over tcp \\(shared memory not used: rank 0: BPL_GLOO_SHM=0\\)" --
                ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 2 $<TARGET_FILE:bpl-info> --init)
      set_tests_properties(gloo_path_tcp_when_turned_off PROPERTIES ENVIRONMENT "BPL_BACKEND=gloo;BPL_GLOO_SHM=0" TIMEOUT 120)
      add_test(NAME gloo_path_hierarchical
        COMMAND ${BPL_EXPECT_OUTPUT} 0 "collectives of world: shared memory within each of 2 machines, gloo over tcp between them \\(2 of 4 ranks on this one; large messages in a single copy\\)" --
                ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 4
                ${CMAKE_CURRENT_SOURCE_DIR}/support/as-machines 2 $<TARGET_FILE:bpl-info> --init)
      set_tests_properties(gloo_path_hierarchical PROPERTIES ENVIRONMENT "BPL_BACKEND=gloo" TIMEOUT 120 PROCESSORS 2)
      add_test(NAME gloo_path_single_copy_turned_off
        COMMAND ${BPL_EXPECT_OUTPUT} 0 "shared memory \\(all 2 ranks on this machine; no single copy: turned off on rank 0\\)" --
                ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 2 $<TARGET_FILE:bpl-info> --init)
      set_tests_properties(gloo_path_single_copy_turned_off PROPERTIES ENVIRONMENT "BPL_BACKEND=gloo;BPL_GLOO_SINGLE_COPY=0" TIMEOUT 120)
      add_test(NAME gloo_path_bad_switch_is_refused
        COMMAND ${BPL_EXPECT_OUTPUT} nonzero "BPL_GLOO_SHM='yes' is not valid: expected 0 or 1" --
                ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 2 $<TARGET_FILE:bpl-info> --init)
      set_tests_properties(gloo_path_bad_switch_is_refused PROPERTIES ENVIRONMENT "BPL_BACKEND=gloo;BPL_GLOO_SHM=yes" TIMEOUT 120)
      add_test(NAME gloo_path_bad_single_copy_switch_is_refused
        COMMAND ${BPL_EXPECT_OUTPUT} nonzero "BPL_GLOO_SINGLE_COPY='2' is not valid: expected 0 or 1" --
                ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 2 $<TARGET_FILE:bpl-info> --init)
      set_tests_properties(gloo_path_bad_single_copy_switch_is_refused PROPERTIES ENVIRONMENT "BPL_BACKEND=gloo;BPL_GLOO_SINGLE_COPY=2" TIMEOUT 120)
    endif()
    # Shared memory with every byte staged through the segment (no single copy), as where the kernel
    # does not let ranks read each other's memory.
    add_test(NAME conformance_gloo_staged_${ranks}ranks
      COMMAND ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node ${ranks}
              $<TARGET_FILE:bpl-conformance> --backend=gloo)
    set_tests_properties(conformance_gloo_staged_${ranks}ranks PROPERTIES
      TIMEOUT 600 ENVIRONMENT "BPL_TIMEOUT_MS=60000;BPL_GLOO_SINGLE_COPY=0" PROCESSORS ${ranks})
    # The same ranks on one machine, with the shared-memory path turned off: Gloo over TCP.
    add_test(NAME conformance_gloo_tcp_${ranks}ranks
      COMMAND ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node ${ranks}
              $<TARGET_FILE:bpl-conformance> --backend=gloo)
    set_tests_properties(conformance_gloo_tcp_${ranks}ranks PROPERTIES
      TIMEOUT 600 ENVIRONMENT "BPL_TIMEOUT_MS=60000;BPL_GLOO_SHM=0" PROCESSORS ${ranks})
    if(TARGET backplane-mpi)
      # The same binary, unchanged, under mpirun. Open MPI refuses root unless told; CI runs as root.
      add_test(NAME conformance_mpi_${ranks}ranks
        COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${ranks}
                $<TARGET_FILE:bpl-conformance> --backend=mpi)
      set_tests_properties(conformance_mpi_${ranks}ranks PROPERTIES TIMEOUT 600 PROCESSORS ${ranks}
        ENVIRONMENT "${BPL_MPI_TEST_ENV}")
    endif()
    # And under each other MPI's own launcher, where the core picks the plugin built for its ABI.
    foreach(mpi ${BPL_OTHER_MPIS})
      add_test(NAME conformance_mpi_${mpi}_${ranks}ranks
        COMMAND ${BPL_MPI_LAUNCH_${mpi}} ${ranks} $<TARGET_FILE:bpl-conformance> --backend=mpi)
      set_tests_properties(conformance_mpi_${mpi}_${ranks}ranks PROPERTIES TIMEOUT 600 PROCESSORS ${ranks}
        ENVIRONMENT "${BPL_MPI_ENV_${mpi}}")
    endforeach()
  endforeach()
endif()
