# package.example (ctest): what a user does with an installed kvoracle (examples/cpp/README.md).
#   1. cmake --install the build into WORK_DIR/first;
#   2. move the tree to WORK_DIR/prefix (the package must be relocatable) and check that no file of
#      its CMake package names the source or build tree;
#   3. configure examples/cpp against the moved prefix with find_package(kvoracle CONFIG), build it
#      and run its tests (each kernel correct, and with a planted bug that must fail; built with
#      CUDA, the CUDA twins compile too and their tests skip without a GPU).
# Arguments (-D): BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER CXX_FLAGS LINKER_FLAGS
# BUILD_TYPE, and CUDA_ROOT when kvoracle was built with CUDA.
cmake_minimum_required(VERSION 3.25)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package.example: ${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "package.example: ${what}: ok")
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/first)
file(RENAME ${WORK_DIR}/first ${WORK_DIR}/prefix)

file(GLOB_RECURSE package_files ${WORK_DIR}/prefix/*.cmake)
if(NOT package_files)
  message(FATAL_ERROR "package.example: the install wrote no CMake package")
endif()
foreach(f IN LISTS package_files)
  file(READ ${f} text)
  foreach(tree IN ITEMS ${SOURCE_DIR} ${BUILD_DIR} ${WORK_DIR}/first)
    string(FIND "${text}" "${tree}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "package.example: ${f} names ${tree}: the package is not relocatable")
    endif()
  endforeach()
endforeach()

set(configure ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/cpp -B ${WORK_DIR}/example -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
    "-DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}")
if(CUDA_ROOT)
  # The example's CUDA twins compile with the toolkit kvoracle was built with (nvcc need not be on
  # the PATH ctest runs with).
  list(APPEND configure -DCUDAToolkit_ROOT=${CUDA_ROOT} -DCMAKE_CUDA_COMPILER=${CUDA_ROOT}/bin/nvcc)
endif()
run("configure examples/cpp" ${configure})
run("build examples/cpp" ${CMAKE_COMMAND} --build ${WORK_DIR}/example)
run("run examples/cpp's tests" ${CMAKE_COMMAND} -E chdir ${WORK_DIR}/example
    ${CMAKE_CTEST_COMMAND} --output-on-failure)
message(STATUS "${last_output}")
