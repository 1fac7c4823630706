# kvo_add_test(name SOURCES ... LIBS ... LABELS ...): one GoogleTest binary, discovered at test time
# (PRE_TEST, so no binary runs during the build). Property tests get a fixed rapidcheck seed in CI;
# KVO_RC_PARAMS overrides it (e.g. -DKVO_RC_PARAMS="seed=7 max_success=2000").
set(KVO_RC_PARAMS "seed=20261129 max_success=200 verbose_progress=0" CACHE STRING "RC_PARAMS for ctest")
function(kvo_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  kvo_project_target(${name})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} rapidcheck_gtest rapidcheck GTest::gtest
                                        GTest::gtest_main)
  if(NOT ARG_LABELS)
    set(ARG_LABELS cpu)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  # gtest_discover_tests flattens PROPERTIES into property/value pairs, so a list value (two
  # labels) would shift every pair after it: the labels are set by a script that ctest includes
  # after the discovery, over the list of tests it found.
  # A GPU binary's tests are named gpu.<Suite>.<Test>: some of its sources are also built into a
  # CPU binary (tests/oracle/test_reference_tier*.cpp), and two tests of one name would share
  # their labels (the CPU copies then labelled gpu too, and left out by `ctest -LE gpu`).
  set(prefix "")
  if("gpu" IN_LIST ARG_LABELS)
    set(prefix "gpu.")
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    TEST_PREFIX "${prefix}"
    TEST_LIST ${name}_TESTS
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "RC_PARAMS=${KVO_RC_PARAMS}")
  set(labels_script ${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake)
  file(WRITE ${labels_script} "foreach(test IN LISTS ${name}_TESTS)
  set_tests_properties(\"\${test}\" PROPERTIES LABELS \"${ARG_LABELS}\")
endforeach()
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_script})
endfunction()

# kvo_cli_test(name status regex args...): runs `kvoracle args...` as a user would (test cli.<name>)
# and checks its exit status and that stdout then stderr match `regex`, through
# tests/cli/check_exit.cmake, the one script every CLI test uses.
function(kvo_cli_test name status regex)
  list(JOIN ARGN "@" joined)
  add_test(NAME cli.${name}
    COMMAND ${CMAKE_COMMAND} "-DCOMMAND=$<TARGET_FILE:kvoracle>@${joined}" -DEXPECT_RC=${status}
            "-DOUTPUT_REGEX=${regex}" -P ${PROJECT_SOURCE_DIR}/tests/cli/check_exit.cmake)
  set_tests_properties(cli.${name} PROPERTIES LABELS cpu TIMEOUT 300)
endfunction()
