# GPU benchmarks (Google Benchmark). bench_write_gpu: fused vs unfused layer writes in one CUDA graph
# of 60 layers, with an empty-kernel launch and a device-to-device copy measured in the same run.
# bench_read_gpu: canonical and fast sparse decode and indexer + top-k, against the same copy and a
# read-once kernel. Static C++ runtimes and an $ORIGIN rpath, so that gpu/run_on_device.sh can run the
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
endif()
