# Real processes: threads as ranks, the launcher, embedders and training runs, faults and survival,
# jobs across test hosts, lean plugins, programs that own MPI, a runtime's life against threads and fork,
# launching as users launch, the installed tree, and the benchmark tools end to end.
if(TARGET backplane-gloo)
  bpl_add_test(threads_test system/threads_test.cpp)
  target_link_libraries(threads_test PRIVATE backplane GTest::gtest_main)
  add_dependencies(threads_test backplane-gloo)
  gtest_discover_tests(threads_test PROPERTIES TIMEOUT 120)

  # Launcher, embedder and training runs (the examples on the frontend among them).
  if(TARGET backplane-parallel)
    bpl_add_test(process_test system/process_test.cpp system/training_runs_test.cpp)
    target_link_libraries(process_test PRIVATE backplane)
    add_dependencies(process_test backplane-gloo embed bpl-info tp_mlp dp_train gpt_train ${test_plugins})
    if(TARGET backplane-mpi)
      add_dependencies(process_test backplane-mpi)
    endif()
    # Its MPI tests set Open MPI's environment themselves (mpi_env), sanitizer runs included.
    if(BPL_SANITIZE)
      target_compile_definitions(process_test PRIVATE BPL_SANITIZER_BUILD)
    endif()
    gtest_discover_tests(process_test PROPERTIES TIMEOUT 180)
  endif()

  # Faults in real processes (a rank killed, stopped or leaving mid-collective, timeouts, abort,
  # BPL_DEBUG=detail, rendezvous conflicts) on gloo and, under mpirun, mpi. These suites, and the three
  # below, mostly wait out timeouts (a few % of a core): one processor each, so two run side by side,
  # never beside a test that takes both (PROCESSORS 2: builds, benchmarks, compute-heavy jobs).
  bpl_add_test(fault_test system/fault/main.cpp system/fault/scenarios_kill_stop_abort.cpp
                          system/fault/scenarios_exit_mismatch_reinit.cpp system/fault/killed_rank_test.cpp
                          system/fault/stopped_rank_test.cpp system/fault/abort_test.cpp system/fault/mismatch_test.cpp
                          system/fault/reinit_and_limits_test.cpp system/fault/rendezvous_test.cpp)
  target_link_libraries(fault_test PRIVATE backplane)
  add_dependencies(fault_test backplane-gloo)
  if(TARGET backplane-mpi)
    add_dependencies(fault_test backplane-mpi)
  endif()
  if(BPL_SANITIZE)
    target_compile_definitions(fault_test PRIVATE BPL_SANITIZER_BUILD)
  endif()
  gtest_discover_tests(fault_test PROPERTIES TIMEOUT 180)
  # The right rank named where the faults above leave room for a wrong one (mpi).
  bpl_add_test(culprits_test system/culprits_test.cpp)
  target_link_libraries(culprits_test PRIVATE backplane)
  if(TARGET backplane-mpi)
    add_dependencies(culprits_test backplane-mpi)
  endif()
  gtest_discover_tests(culprits_test PROPERTIES TIMEOUT 120)

  # Going on after a failure (revoke, agree, shrink; examples/elastic_sgd training through the loss of
  # ranks), in real processes with the job's store in bpl-store.
  bpl_add_test(survive_test system/survive_test.cpp)
  target_link_libraries(survive_test PRIVATE backplane)
  add_dependencies(survive_test backplane-gloo bpl-store elastic_sgd)
  if(TARGET backplane-mpi)
    add_dependencies(survive_test backplane-mpi)
  endif()
  gtest_discover_tests(survive_test PROPERTIES TIMEOUT 180)

  # The LibTorch frontend's elastic training (examples/elastic_train) through the loss of ranks.
  if(TARGET elastic_train)
    bpl_add_test(elastic_training_test system/elastic_training_test.cpp)
    target_link_libraries(elastic_training_test PRIVATE backplane)
    target_compile_definitions(elastic_training_test PRIVATE BPL_TEST_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
    add_dependencies(elastic_training_test backplane-gloo bpl-store elastic_train)
    gtest_discover_tests(elastic_training_test PROPERTIES TIMEOUT 300)
  endif()

  # Across test hosts (tests/support/hosts.py: network namespaces that are machines of their own, on
  # 198.18.0.0/24): multi-node bpl-run over real interfaces. Skipped, saying why, without root.
  set(host_scenarios gloo_two_hosts gloo_two_hosts_two_ranks gloo_three_hosts gloo_socket_ifname
      torchrun_variables_two_hosts fault_host_never_joins fault_master_unreachable elastic_link_down)
  if(TARGET backplane-parallel)
    list(APPEND host_scenarios examples_two_hosts)  # tp_mlp and dp_train
  endif()
  if(TARGET backplane-mpi)
    list(APPEND host_scenarios mpi_two_hosts)
    if(TARGET bpl-bench-collectives)
      list(APPEND host_scenarios bench_two_hosts)  # bpl-bench-compare --hostfile, gloo and mpi
    endif()
  endif()
  if(NOT BPL_SANITIZE)
    # Their ranks are Python loading the library.
    list(APPEND host_scenarios fault_host_killed fault_host_stopped fault_link_down fault_link_down_master
                               fault_link_down_two_ranks fault_link_returns)
    if(TARGET backplane-mpi)
      list(APPEND host_scenarios fault_mpi_host_killed fault_mpi_link_down)
    endif()
  endif()
  foreach(scenario ${host_scenarios})
    set(host_script hosts_test.py)
    if(scenario MATCHES "^(fault|elastic)_")
      set(host_script hosts_faults_test.py)  # a host that fails
    endif()
    add_test(NAME hosts_${scenario}
      COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/${host_script} ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} ${scenario})
    set_tests_properties(hosts_${scenario} PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 PROCESSORS 2
      ENVIRONMENT "${BPL_MPI_TEST_ENV}")
  endforeach()
  # BPL_TRACE: 3 ranks with a late one, merged and summed up by tools/bpl-trace; and a failure's trace
  # left by ranks that never finalize.
  add_test(NAME trace_3ranks COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/trace_test.py
           ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
  set_tests_properties(trace_3ranks PROPERTIES TIMEOUT 180 PROCESSORS 2 ENVIRONMENT "${BPL_PYTHON_TEST_ENV}")

  # A program on the C ABI under a real torchrun whose agent hosts the store: the torch store module.
  if(TARGET backplane_torch)
    add_test(NAME torchrun_agent_store
      COMMAND ${BPL_EXPECT_OUTPUT} 0 "passed: through the torchrun agent's store" --
              ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/torchrun_agent_store.py ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
    set_tests_properties(torchrun_agent_store PROPERTIES TIMEOUT 240 PROCESSORS 2)
  endif()
endif()

# A program that only communicates maps no LibTorch; its first kernel loads the kernels module
# (system/lean_plugins.c): gloo alone, under bpl-run, and mpi under mpirun. Without the module (or with
# a broken one), init works and a kernel is UNSUPPORTED naming it.
if(TARGET backplane-gloo AND TARGET bpl-cpu-kernels)
  add_executable(lean_plugins system/lean_plugins.c)
  target_link_libraries(lean_plugins PRIVATE backplane)
  add_dependencies(lean_plugins backplane-gloo)
  add_test(NAME lean_gloo_alone COMMAND ${BPL_EXPECT_OUTPUT} 0 "rank 0: lean OK" -- $<TARGET_FILE:lean_plugins>)
  add_test(NAME lean_gloo_2ranks COMMAND ${BPL_EXPECT_OUTPUT} 0 "rank 0: lean OK.*rank 1: lean OK|rank 1: lean OK.*rank 0: lean OK" --
           ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}/bpl-run --nproc-per-node 2 $<TARGET_FILE:lean_plugins>)
  set_tests_properties(lean_gloo_alone lean_gloo_2ranks PROPERTIES TIMEOUT 120 ENVIRONMENT "BPL_BACKEND=gloo")
  add_test(NAME kernels_module_missing_or_broken
    COMMAND ${BPL_EXPECT_OUTPUT} 0 "module absent OK.*module broken OK" --
            sh ${CMAKE_CURRENT_SOURCE_DIR}/system/kernels_module_test.sh $<TARGET_FILE:backplane-gloo> $<TARGET_FILE:lean_plugins>)
  set_tests_properties(kernels_module_missing_or_broken PROPERTIES TIMEOUT 120)
  if(TARGET backplane-mpi)
    add_dependencies(lean_plugins backplane-mpi)
    add_test(NAME lean_mpi_2ranks
      COMMAND ${BPL_EXPECT_OUTPUT} 0 "rank 0: lean OK.*rank 1: lean OK|rank 1: lean OK.*rank 0: lean OK" --
              ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:lean_plugins>)
    set_tests_properties(lean_mpi_2ranks PROPERTIES TIMEOUT 120 ENVIRONMENT "${BPL_MPI_TEST_ENV};BPL_BACKEND=mpi")
    # Open MPI's shared-memory eager limit, taken as its default (4096 less 128 bytes of margin) unless
    # it is set, and then read through MPI_T (2 ranks: one rank alone opens no shared-memory transport).
    add_test(NAME mpi_eager_limit_default
      COMMAND ${BPL_EXPECT_OUTPUT} 0 "eager messages up to 3968 bytes" --
              ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:bpl-info> --init)
    add_test(NAME mpi_eager_limit_set_by_mca
      COMMAND ${BPL_EXPECT_OUTPUT} 0 "eager messages up to 8064 bytes" --
              ${MPIEXEC_EXECUTABLE} --oversubscribe --mca btl_vader_eager_limit 8192 ${MPIEXEC_NUMPROC_FLAG} 2
              $<TARGET_FILE:bpl-info> --init)
    set_tests_properties(mpi_eager_limit_default mpi_eager_limit_set_by_mca PROPERTIES TIMEOUT 120
      ENVIRONMENT "${BPL_MPI_TEST_ENV};BPL_BACKEND=mpi")
    # A bpl_init that fails after MPI_Init (torchrun's variables disagree with mpirun's job) is the
    # program's error: MPI_Finalize at exit then ends at once, within the timeout, not in its guard.
    add_test(NAME mpi_init_failure_finalizes_at_exit
      COMMAND ${BPL_EXPECT_OUTPUT} 1 "MPI says rank 0 of 1 but the launch environment \\(torchrun\\) says rank 1 of 2" --
              ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 1 -x RANK=1 -x WORLD_SIZE=2 $<TARGET_FILE:bpl-info> --init)
    set_tests_properties(mpi_init_failure_finalizes_at_exit PROPERTIES TIMEOUT 120
      ENVIRONMENT "${BPL_MPI_TEST_ENV};BPL_BACKEND=mpi")
    # BPL_BACKEND=mpi under each other MPI's launcher loads the plugin built for its ABI, on that MPI;
    # a plugin of another ABI is refused before MPI_Init, naming both (MPICH's MPI_Init under Open MPI's
    # mpirun would abort the process).
    set(library_mpich "MPICH Version: 5")
    set(library_impi "Intel\\(R\\) MPI Library 2021")
    set(library_openmpi5 "Open MPI v5")
    foreach(mpi ${BPL_OTHER_MPIS})
      set(plugin mpi-${mpi})
      if(mpi STREQUAL "impi")
        set(plugin mpi-mpich)
      endif()
      add_test(NAME mpi_${mpi}_picks_its_plugin
        COMMAND ${BPL_EXPECT_OUTPUT} 0 "plugin +[^ ]*/libbackplane-${plugin}.so.*library=${library_${mpi}}" --
                ${BPL_MPI_LAUNCH_${mpi}} 2 $<TARGET_FILE:bpl-info> --init)
      set_tests_properties(mpi_${mpi}_picks_its_plugin PROPERTIES TIMEOUT 120 ENVIRONMENT "${BPL_MPI_ENV_${mpi}}")
    endforeach()
    if("mpich" IN_LIST BPL_OTHER_MPIS)
      add_test(NAME mpi_plugin_for_open_mpi_refuses_mpichs_launcher
        COMMAND ${BPL_EXPECT_OUTPUT} 1 "libbackplane-mpi.so\\) is built for Open MPI, but MPICH's or Intel MPI's mpiexec \\(MPI_LOCALNRANKS is set\\) started this process" --
                ${BPL_MPI_LAUNCH_mpich} 2 $<TARGET_FILE:bpl-info> --init)
      add_test(NAME mpi_plugin_for_mpich_refuses_open_mpis_launcher
        COMMAND ${BPL_EXPECT_OUTPUT} 1 "libbackplane-mpi-mpich.so\\) is built for MPICH's ABI \\(MPICH, Intel MPI\\), but Open MPI's mpirun" --
                ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:bpl-info> --init)
      set_tests_properties(mpi_plugin_for_open_mpi_refuses_mpichs_launcher PROPERTIES TIMEOUT 120
        ENVIRONMENT "${BPL_MPI_ENV_mpich};BPL_BACKEND=$<TARGET_FILE:backplane-mpi>")
      set_tests_properties(mpi_plugin_for_mpich_refuses_open_mpis_launcher PROPERTIES TIMEOUT 120
        ENVIRONMENT "${BPL_MPI_TEST_ENV};BPL_BACKEND=$<TARGET_FILE:backplane-mpi-mpich>")
    endif()
  endif()
endif()

if(TARGET backplane-mpi)
  add_executable(mpi_program_owns_mpi system/mpi_program_owns_mpi.c)
  target_link_libraries(mpi_program_owns_mpi PRIVATE backplane MPI::MPI_C)
  add_dependencies(mpi_program_owns_mpi backplane-mpi)
  add_test(NAME mpi_program_owns_mpi
    COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:mpi_program_owns_mpi>)
  set_tests_properties(mpi_program_owns_mpi PROPERTIES TIMEOUT 120 PROCESSORS 2 ENVIRONMENT "${BPL_MPI_TEST_ENV}")
  # Backplane's world as a communicator the program made (ABI 1.4): each half of MPI_COMM_WORLD.
  add_executable(mpi_native_comm system/mpi_native_comm.c)
  target_link_libraries(mpi_native_comm PRIVATE backplane MPI::MPI_C)
  add_dependencies(mpi_native_comm backplane-mpi backplane-gloo)
  add_test(NAME mpi_native_comm
    COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:mpi_native_comm>)
  set_tests_properties(mpi_native_comm PROPERTIES TIMEOUT 120 PROCESSORS 2 ENVIRONMENT "${BPL_MPI_TEST_ENV}")
endif()

if(TARGET backplane-gloo)
  # A runtime's life against threads and fork: bpl_finalize while another thread is in a collective,
  # and a child forked after bpl_init, on gloo over shared memory and TCP and, where built, mpi under
  # mpirun; bpl_init again after bpl_finalize under bpl-run, torchrun and no launcher.
  add_executable(lifecycle_races ${CMAKE_CURRENT_SOURCE_DIR}/system/lifecycle_races.c)
  target_link_libraries(lifecycle_races PRIVATE backplane Threads::Threads)
  set(lifecycle_mpirun "")
  if(TARGET backplane-mpi)
    set(lifecycle_mpirun ${MPIEXEC_EXECUTABLE})
  endif()
  add_test(NAME lifecycle COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/lifecycle_test.py
           ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} $<TARGET_FILE:lifecycle_races> ${lifecycle_mpirun})
  set_tests_properties(lifecycle PROPERTIES TIMEOUT 400 PROCESSORS 2)

  # Launching as users launch.
  add_test(NAME bpl_run_as_torchrun COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/bpl_run_test.py
           ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
  set_tests_properties(bpl_run_as_torchrun PROPERTIES TIMEOUT 300 PROCESSORS 2)
  # bpl-run beside a real torchrun, flag by flag: the ranks' variables, their lines, restarts, @record.
  add_test(NAME bpl_run_torchrun_parity COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/torchrun_parity_test.py
           ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
  set_tests_properties(bpl_run_torchrun_parity PROPERTIES TIMEOUT 600 PROCESSORS 2)
  # srun and sbatch on a real single-node Slurm: torch and the C ABI, gloo and mpi (skipped without root).
  if(TARGET backplane_torch AND TARGET backplane-mpi)
    add_test(NAME slurm_srun_sbatch COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/slurm_test.py
             ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} ${PROJECT_SOURCE_DIR}/docs/running.md)
    set_tests_properties(slurm_srun_sbatch PROPERTIES TIMEOUT 600 PROCESSORS 2 SKIP_RETURN_CODE 77
      ENVIRONMENT "PYTHONPATH=${BPL_TORCH_MODULE_DIR};PYTHONWARNINGS=ignore")
  endif()
  # One port per job: bpl-store serves backplane's store and the program's torch store at MASTER_PORT.
  if(TARGET backplane_torch)
    add_test(NAME bpl_run_one_port COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/one_port_test.py
             ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} $<TARGET_FILE:late_rank>)
    set_tests_properties(bpl_run_one_port PROPERTIES TIMEOUT 300 PROCESSORS 2
      ENVIRONMENT "PYTHONPATH=${BPL_TORCH_MODULE_DIR};PYTHONWARNINGS=ignore")
  endif()
  # Only the job's processes use its store: the secret bpl-run hands them, the address it listens at.
  if(TARGET bpl-store)
    add_test(NAME store_admission COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/store_admission_test.py
             ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} $<TARGET_FILE:late_rank>)
    set_tests_properties(store_admission PROPERTIES TIMEOUT 180 PROCESSORS 2)
  endif()
  # A waiting job says what it waits for at info level: a rendezvous missing a rank, a store that never
  # comes, a collective stalled past a quarter of its timeout; nothing at the default level.
  add_executable(late_rank ${CMAKE_CURRENT_SOURCE_DIR}/system/late_rank.c)
  target_link_libraries(late_rank PRIVATE backplane)
  add_test(NAME wait_reports COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/wait_reports_test.py
           ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} $<TARGET_FILE:late_rank>)
  set_tests_properties(wait_reports PROPERTIES TIMEOUT 180 PROCESSORS 2)
  # bpl-run's agents meeting across nodes (--rdzv-backend c10d): places, --nnodes MIN:MAX, restarts on
  # every node, a node lost whole; two agents of this machine at a loopback endpoint. Its ranks are
  # Python (ctypes), which cannot load a sanitized library (tools/test-sanitized leaves it out).
  add_test(NAME bpl_run_c10d_rendezvous COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/c10d_rendezvous_test.py
           ${CMAKE_RUNTIME_OUTPUT_DIRECTORY} $<TARGET_FILE:late_rank>)
  set_tests_properties(bpl_run_c10d_rendezvous PROPERTIES TIMEOUT 300 PROCESSORS 2 ENVIRONMENT "${BPL_PYTHON_TEST_ENV}")

  # The installed tree: cmake --install to a prefix (and moved, with the build hidden), pip install of
  # the checkout with the oldest supported torch, which Python the build takes, and install-deps beside
  # a .venv of the user's.
  add_test(NAME install_tree COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/system/install_test.sh ${CMAKE_BINARY_DIR} ${PROJECT_SOURCE_DIR}
                                     ${BPL_PYTHON})
  set_tests_properties(install_tree PROPERTIES TIMEOUT 120 PROCESSORS 2)

  # The installed tree moved, the build and its environment hidden: every tool's --version and a job each.
  if(TARGET backplane_torch AND TARGET backplane-parallel AND TARGET bpl-bench-collectives)
    add_test(NAME install_moved COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/system/moved_install_test.sh ${CMAKE_BINARY_DIR}
                                        ${PROJECT_SOURCE_DIR} ${BPL_PYTHON})
    set_tests_properties(install_moved PROPERTIES TIMEOUT 600 PROCESSORS 2 SKIP_RETURN_CODE 77)
  endif()
  # Which Python the build takes, and a build without torch; install-deps and a .venv of the user's.
  add_test(NAME configure_python COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/system/configure_test.sh ${PROJECT_SOURCE_DIR}
                                         ${BPL_PYTHON})
  set_tests_properties(configure_python PROPERTIES TIMEOUT 300)
  add_test(NAME install_deps_leaves_a_venv COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/system/install_deps_test.sh
                                                  ${PROJECT_SOURCE_DIR})
  set_tests_properties(install_deps_leaves_a_venv PROPERTIES TIMEOUT 120)
  # pip install of the checkout into a fresh environment with the oldest supported torch.
  if(TARGET backplane_torch)
    add_test(NAME pip_install COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/system/pip_install_test.sh ${PROJECT_SOURCE_DIR}
                                      ${BPL_PYTHON} ${BPL_TORCH_OLDEST})
    set_tests_properties(pip_install PROPERTIES TIMEOUT 1800 PROCESSORS 2)
  endif()
endif()

if(TARGET bpl-bench-collectives)
  # The comparison tool end to end on a tiny sweep (what it writes, not how fast: speed is bench/'s).
  add_test(NAME bench_compare COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/bench_compare_test.py ${CMAKE_RUNTIME_OUTPUT_DIRECTORY}
           ${BPL_PEERS_DIR})
  set_tests_properties(bench_compare PROPERTIES TIMEOUT 300 PROCESSORS 2)
  if(TARGET backplane_torch)
    add_test(NAME bench_torch COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/system/bench_torch_test.py
             ${CMAKE_RUNTIME_OUTPUT_DIRECTORY})
    set_tests_properties(bench_torch PROPERTIES TIMEOUT 300 PROCESSORS 2)
  endif()
endif()
