# Every code block of the README and of docs/ runs as written (run_doc_blocks.py), and every link of
# theirs leads somewhere; the README's test command is .ci/run's. The pages describe the whole build, so
# they run where it has everything.
if(TARGET backplane_torch AND TARGET backplane-mpi AND TARGET backplane-parallel AND TARGET bpl-bench-collectives)
  file(GLOB bpl_doc_pages ${PROJECT_SOURCE_DIR}/docs/*.md)
  foreach(page ${PROJECT_SOURCE_DIR}/README.md ${bpl_doc_pages})
    get_filename_component(page_name ${page} NAME_WE)
    set(ci_check)
    if(page_name STREQUAL "README")
      set(ci_check --ci-script ${PROJECT_SOURCE_DIR}/.ci/run)
    endif()
    add_test(NAME docs_${page_name}
      COMMAND ${BPL_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/docs/run_doc_blocks.py ${page} ${PROJECT_SOURCE_DIR}
              ${CMAKE_BINARY_DIR} ${ci_check})
    set_tests_properties(docs_${page_name} PROPERTIES TIMEOUT 1200 PROCESSORS 2
      ENVIRONMENT "BPL_PYTHON=${BPL_PYTHON};${BPL_MPI_TEST_ENV}")
  endforeach()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs)
endif()
