# A runtime's life against threads and fork (included by tests/CMakeLists.txt where the gloo backend is
# built): bpl_finalize while another thread is in a collective, and a child forked after bpl_init, on gloo
# over shared memory and TCP and, where built, mpi under mpirun; bpl_init again after bpl_finalize under
# bpl-run, torchrun and no launcher.
add_executable(lifecycle_races ${CMAKE_CURRENT_LIST_DIR}/system/lifecycle_races.c)
target_link_libraries(lifecycle_races PRIVATE backplane Threads::Threads)
set(lifecycle_mpirun "")
if(TARGET backplane-mpi)
  set(lifecycle_mpirun ${MPIEXEC_EXECUTABLE})
endif()
add_test(NAME lifecycle COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/system/lifecycle_test.py
         ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} $<TARGET_FILE:lifecycle_races> ${lifecycle_mpirun})
set_tests_properties(lifecycle PROPERTIES TIMEOUT 400 PROCESSORS 2)
