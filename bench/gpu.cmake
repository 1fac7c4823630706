# GPU benchmarks (Google Benchmark). bench_write_gpu: fused vs unfused layer writes in one CUDA graph
# of 60 layers, with an empty-kernel launch and a device-to-device copy measured in the same run.
# bench_read_gpu: canonical and fast sparse decode and indexer + top-k, against the same copy and a
# read-once kernel; bench_alias_gpu below. Static C++ runtimes and an $ORIGIN rpath, so that gpu/run_on_device.sh can run the
# binaries on the device machine with libbenchmark.so.1 carried next to them.
if(KVO_HAVE_CUDA)
  foreach(bench bench_write_gpu bench_read_gpu)
    add_executable(${bench} ${CMAKE_CURRENT_LIST_DIR}/${bench}.cu)
    kvo_project_target(${bench})
    kvo_cuda_target(${bench})
    target_compile_options(${bench} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wno-restrict>)
    target_link_libraries(${bench} PRIVATE kvo_gpu kvo_spec benchmark::benchmark
                                           CUDA::cudart_static)
    target_link_options(${bench} PRIVATE -static-libstdc++ -static-libgcc)
    set_target_properties(${bench} PROPERTIES BUILD_RPATH "$ORIGIN")
  endforeach()
  # bench_alias_gpu: what judging every byte of a huge subject allocation costs, plain against
  # aliased through the driver's virtual memory calls (issue 15's write-campaign bound).
  add_executable(bench_alias_gpu ${CMAKE_CURRENT_LIST_DIR}/bench_alias_gpu.cu)
  kvo_project_target(bench_alias_gpu)
  kvo_cuda_target(bench_alias_gpu)
  target_link_libraries(bench_alias_gpu PRIVATE benchmark::benchmark CUDA::cudart_static
                                                CUDA::cuda_driver)
  target_link_options(bench_alias_gpu PRIVATE -static-libstdc++ -static-libgcc)
  set_target_properties(bench_alias_gpu PROPERTIES BUILD_RPATH "$ORIGIN")
endif()

# libkvo_bench_write: the fused write and write_bench_setup.hpp behind a C ABI, loaded with ctypes
# by bench_write_peer.py to time kvoracle's kernel next to the Triton peer in one process. Needs
# position-independent static libraries (the Python build's, scripts/build.sh's build/).
if(KVO_HAVE_CUDA AND CMAKE_POSITION_INDEPENDENT_CODE)
  add_library(kvo_bench_write SHARED ${CMAKE_CURRENT_LIST_DIR}/write_launch_abi.cu)
  kvo_project_target(kvo_bench_write)
  kvo_cuda_target(kvo_bench_write)
  target_compile_options(kvo_bench_write PRIVATE
                         $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wno-restrict,-fvisibility=hidden>)
  target_link_libraries(kvo_bench_write PRIVATE kvo_gpu kvo_spec CUDA::cudart_static)
  # kvoracle's and cudart's symbols stay inside: the library is loaded into torch's process.
  target_link_options(kvo_bench_write PRIVATE -Wl,--exclude-libs,ALL)
endif()
