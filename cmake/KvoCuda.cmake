# CUDA detection. nvcc exists on the CI machine even though no GPU does, so the CUDA code always
# compiles there; GPU tests skip at run time when no device answers.
include(CheckLanguage)
set(KVO_HAVE_CUDA OFF)
if(NOT KVO_ENABLE_CUDA STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # 90 = Hopper (H100/H200), the device this project is measured on. Never "native": it fails
    # on a machine without a GPU. Other targets: -DCMAKE_CUDA_ARCHITECTURES="80;90".
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(KVO_HAVE_CUDA ON)
  elseif(KVO_ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KVO_ENABLE_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "kvoracle: CUDA subjects ${KVO_HAVE_CUDA}")

# CMake 3.25 knows no cuda_std_20, so C++20 is passed to nvcc directly. --fmad=false: SPEC principle 2
# (no contraction the spec does not name) for every kernel that claims bit-exactness. -lineinfo: source
# lines for the profiler (ncu), no change to the code.
function(kvo_cuda_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --fmad=false -lineinfo -Xcompiler=-Wall,-Wextra,-Wno-restrict --expt-relaxed-constexpr>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${KVO_WERROR}>>:-Werror=all-warnings>)
endfunction()
