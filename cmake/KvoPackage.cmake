# kvoracle as a package. Every library has one public name, kvoracle::<name>, spelled the same
# inside this build (an ALIAS, for add_subdirectory and FetchContent users) and from an installed
# tree (find_package(kvoracle CONFIG), an exported target with EXPORT_NAME <name>).
#
# With KVO_INSTALL (default: kvoracle is the top-level project), `cmake --install` writes a
# relocatable tree, every path relative to the prefix:
#   include/kvo/<module>/...            the public headers, as in the source tree
#   lib/libkvo_<name>.a                 the static libraries
#   lib/cmake/kvoracle/                 kvoracleConfig.cmake, kvoracleConfigVersion.cmake
#                                       (SameMajorVersion), kvoracleTargets.cmake and, with
#                                       GoogleTest, kvoracleTestingTargets.cmake
#   bin/kvoracle                        the command line, when built (failure reports name it)
# (lib/ is CMAKE_INSTALL_LIBDIR.)

# kvoracle::<name> -> the target behind it. gpu exists in every build (without CUDA it only says
# that no device answers); gpu_testing (the CUDA planted bugs that kvoracle::oracle's mutants
# link) only with CUDA; testing (the GoogleTest helper) only where GoogleTest is found.
set(KVO_PACKAGE_NAMES spec reference truth subjects gpu oracle)
if(TARGET kvo_gpu_testing)
  list(APPEND KVO_PACKAGE_NAMES gpu_testing)
endif()
set(KVO_PACKAGE_TARGETS)
foreach(name IN LISTS KVO_PACKAGE_NAMES)
  add_library(kvoracle::${name} ALIAS kvo_${name})
  set_target_properties(kvo_${name} PROPERTIES EXPORT_NAME ${name})
  list(APPEND KVO_PACKAGE_TARGETS kvo_${name})
endforeach()
if(TARGET kvo_oracle_testing)
  add_library(kvoracle::testing ALIAS kvo_oracle_testing)
  set_target_properties(kvo_oracle_testing PROPERTIES EXPORT_NAME testing)
endif()

if(NOT KVO_INSTALL)
  return()
endif()

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(KVO_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvoracle)

install(TARGETS ${KVO_PACKAGE_TARGETS} EXPORT kvoracleTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(KVO_PACKAGE_HEADER_DIRS spec reference truth subjects gpu oracle)
if(TARGET kvo_gpu_testing)
  list(APPEND KVO_PACKAGE_HEADER_DIRS gpu/testing)
endif()
foreach(dir IN LISTS KVO_PACKAGE_HEADER_DIRS)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
          FILES_MATCHING PATTERN "*.hpp")
endforeach()
install(EXPORT kvoracleTargets NAMESPACE kvoracle:: DESTINATION ${KVO_PACKAGE_DIR})
# A separate export set, so that only a consumer who has GoogleTest loads it (kvoracleConfig.cmake).
if(TARGET kvo_oracle_testing)
  install(TARGETS kvo_oracle_testing EXPORT kvoracleTestingTargets)
  install(EXPORT kvoracleTestingTargets NAMESPACE kvoracle:: DESTINATION ${KVO_PACKAGE_DIR})
endif()

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kvoracleConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kvoracleConfig.cmake
                              INSTALL_DESTINATION ${KVO_PACKAGE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvoracleConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvoracleConfig.cmake
              ${PROJECT_BINARY_DIR}/kvoracleConfigVersion.cmake
        DESTINATION ${KVO_PACKAGE_DIR})
if(TARGET kvoracle)
  install(TARGETS kvoracle RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
