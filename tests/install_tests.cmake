# The installed tree (included by tests/CMakeLists.txt): cmake --install to a prefix (and moved, with the
# build hidden), pip install of the checkout with the oldest supported torch, which Python the build
# takes, and install-deps beside a .venv of the user's.
add_test(NAME install_tree COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/system/install_test.sh ${CMAKE_BINARY_DIR} ${PROJECT_SOURCE_DIR}
                                   ${BPL_PYTHON})
set_tests_properties(install_tree PROPERTIES TIMEOUT 120 PROCESSORS 2)

# The installed tree moved, the build and its environment hidden: every tool's --version and a job each.
if(TARGET backplane_torch AND TARGET backplane-parallel AND TARGET bpl-bench-collectives)
  add_test(NAME install_moved COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/system/moved_install_test.sh ${CMAKE_BINARY_DIR}
                                      ${PROJECT_SOURCE_DIR} ${BPL_PYTHON})
  set_tests_properties(install_moved PROPERTIES TIMEOUT 600 PROCESSORS 2 SKIP_RETURN_CODE 77)
endif()
# Which Python the build takes, and a build without torch; install-deps and a .venv of the user's.
add_test(NAME configure_python COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/system/configure_test.sh ${PROJECT_SOURCE_DIR}
                                       ${BPL_PYTHON})
set_tests_properties(configure_python PROPERTIES TIMEOUT 300)
add_test(NAME install_deps_leaves_a_venv COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/system/install_deps_test.sh
                                                ${PROJECT_SOURCE_DIR})
set_tests_properties(install_deps_leaves_a_venv PROPERTIES TIMEOUT 120)
# pip install of the checkout into a fresh environment with the oldest supported torch.
if(TARGET backplane_torch)
  add_test(NAME pip_install COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/system/pip_install_test.sh ${PROJECT_SOURCE_DIR}
                                    ${BPL_PYTHON} ${BPL_TORCH_OLDEST})
  set_tests_properties(pip_install PROPERTIES TIMEOUT 1800 PROCESSORS 2)
endif()
