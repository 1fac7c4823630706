# cmake -DCOMMAND="prog;args" -DEXPECT_STATUS=N -DEXPECT_REGEX=re -P run_expect.cmake
# Runs COMMAND; fails unless it exits with EXPECT_STATUS and its stdout+stderr match EXPECT_REGEX.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT "${status}" STREQUAL "${EXPECT_STATUS}")
  message(FATAL_ERROR "exit status ${status}, expected ${EXPECT_STATUS}\n--- output ---\n${all}")
endif()
if(NOT "${EXPECT_REGEX}" STREQUAL "" AND NOT all MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "output does not match '${EXPECT_REGEX}'\n--- output ---\n${all}")
endif()
message(STATUS "exit ${status} as expected\n${all}")
