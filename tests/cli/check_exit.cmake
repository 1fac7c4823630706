# Runs one command and checks its exit status and output: what PASS_REGULAR_EXPRESSION cannot do
# (it ignores the exit status), e.g. that bad input exits with 2 and prints nothing on stdout.
#
#   cmake -DCOMMAND=<program>@<arg>@<arg>... -DEXPECT_RC=<n>
#         [-DINPUT=<file>]            stdin of the command
#         [-DSTDOUT_FILE=<file>]      stdout must equal this file's content
#         [-DSTDOUT_REGEX=<regex>]    stdout must match
#         [-DSTDOUT_EMPTY=1]          stdout must be empty
#         [-DSTDERR_REGEX=<regex>]    stderr must match
#         [-DOUTPUT_REGEX=<regex>]    stdout followed by stderr must match
#         -P check_exit.cmake
# '@' separates the arguments because add_test would split a ';' list into separate arguments.
cmake_minimum_required(VERSION 3.25)

if(NOT DEFINED COMMAND OR NOT DEFINED EXPECT_RC)
  message(FATAL_ERROR "check_exit.cmake: COMMAND and EXPECT_RC are required")
endif()
string(REPLACE "@" ";" argv "${COMMAND}")
set(input_args)
if(DEFINED INPUT)
  set(input_args INPUT_FILE "${INPUT}")
endif()
execute_process(COMMAND ${argv} ${input_args}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)

set(failures)
if(NOT rc STREQUAL EXPECT_RC)
  list(APPEND failures "exit status ${rc}, expected ${EXPECT_RC}")
endif()
if(DEFINED STDOUT_FILE)
  file(READ "${STDOUT_FILE}" want)
  if(NOT out STREQUAL want)
    list(APPEND failures "stdout differs from ${STDOUT_FILE}")
  endif()
endif()
if(DEFINED STDOUT_REGEX AND NOT out MATCHES "${STDOUT_REGEX}")
  list(APPEND failures "stdout does not match '${STDOUT_REGEX}'")
endif()
if(STDOUT_EMPTY AND NOT out STREQUAL "")
  list(APPEND failures "stdout is not empty")
endif()
if(DEFINED STDERR_REGEX AND NOT err MATCHES "${STDERR_REGEX}")
  list(APPEND failures "stderr does not match '${STDERR_REGEX}'")
endif()
if(DEFINED OUTPUT_REGEX AND NOT "${out}${err}" MATCHES "${OUTPUT_REGEX}")
  list(APPEND failures "output does not match '${OUTPUT_REGEX}'")
endif()

if(failures)
  string(REPLACE ";" "\n  " failures "${failures}")
  string(REPLACE "@" " " shown "${COMMAND}")
  message(FATAL_ERROR "${shown}\n  ${failures}\n--- stdout ---\n${out}--- stderr ---\n${err}")
endif()
message(STATUS "ok: exit ${rc}\n${out}${err}")
