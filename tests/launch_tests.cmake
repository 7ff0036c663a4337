# Launching as users launch (included by tests/CMakeLists.txt where the gloo backend is built).
# bpl-run as torchrun: scripts, modules and programs, its log files, whole prefixed lines, its answers.
add_test(NAME bpl_run_as_torchrun COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/system/bpl_run_test.py
         ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
set_tests_properties(bpl_run_as_torchrun PROPERTIES TIMEOUT 300 PROCESSORS 2)
# bpl-run beside a real torchrun, flag by flag: the ranks' variables, their lines, restarts, @record.
add_test(NAME bpl_run_torchrun_parity COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/system/torchrun_parity_test.py
         ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
set_tests_properties(bpl_run_torchrun_parity PROPERTIES TIMEOUT 600 PROCESSORS 2)
# srun and sbatch on a real single-node Slurm: torch and the C ABI, gloo and mpi (skipped without root).
if(TARGET backplane_torch AND TARGET backplane-mpi)
  add_test(NAME slurm_srun_sbatch COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/system/slurm_test.py
           ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} ${PROJECT_SOURCE_DIR}/docs/running.md)
  set_tests_properties(slurm_srun_sbatch PROPERTIES TIMEOUT 600 PROCESSORS 2 SKIP_RETURN_CODE 77
    ENVIRONMENT "PYTHONPATH=${BPL_TORCH_MODULE_DIR};PYTHONWARNINGS=ignore")
endif()
# One port per job: bpl-store serves backplane's store and the program's torch store at MASTER_PORT.
if(TARGET backplane_torch)
  add_test(NAME bpl_run_one_port COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/system/one_port_test.py
           ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} $<TARGET_FILE:late_rank>)
  set_tests_properties(bpl_run_one_port PROPERTIES TIMEOUT 300 PROCESSORS 2
    ENVIRONMENT "PYTHONPATH=${BPL_TORCH_MODULE_DIR};PYTHONWARNINGS=ignore")
endif()
# Only the job's processes use its store: the secret bpl-run hands them, the address it listens at.
if(TARGET bpl-store)
  add_test(NAME store_admission COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/system/store_admission_test.py
           ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} $<TARGET_FILE:late_rank>)
  set_tests_properties(store_admission PROPERTIES TIMEOUT 180 PROCESSORS 2)
endif()
# A waiting job says what it waits for at info level: a rendezvous missing a rank, a store that never
# comes, a collective stalled past a quarter of its timeout; nothing at the default level.
add_executable(late_rank ${CMAKE_CURRENT_LIST_DIR}/system/late_rank.c)
target_link_libraries(late_rank PRIVATE backplane)
add_test(NAME wait_reports COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/system/wait_reports_test.py
         ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} $<TARGET_FILE:late_rank>)
set_tests_properties(wait_reports PROPERTIES TIMEOUT 180 PROCESSORS 2)
# bpl-run's agents meeting across nodes (--rdzv-backend c10d): places, --nnodes MIN:MAX, restarts on
# every node, a node lost whole; two agents of this machine at a loopback endpoint. Its ranks are
# Python (ctypes), which cannot load a sanitized library (tools/test-sanitized leaves it out).
add_test(NAME bpl_run_c10d_rendezvous COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/system/c10d_rendezvous_test.py
         ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} $<TARGET_FILE:late_rank>)
set_tests_properties(bpl_run_c10d_rendezvous PROPERTIES TIMEOUT 300 PROCESSORS 2 ENVIRONMENT "${BPL_PYTHON_TEST_ENV}")
