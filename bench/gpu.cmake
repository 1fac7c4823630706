# GPU benchmarks (Google Benchmark): fused vs unfused layer writes in one CUDA graph of 60 layers,
# with an empty-kernel launch and a device-to-device copy measured in the same run. Static C++
# runtimes and an $ORIGIN rpath, so that gpu/run_on_device.sh can run the binary on the device
# machine with libbenchmark.so.1 carried next to it.
if(KVO_HAVE_CUDA)
  add_executable(bench_write_gpu ${CMAKE_CURRENT_LIST_DIR}/bench_write_gpu.cu)
  kvo_project_target(bench_write_gpu)
  kvo_cuda_target(bench_write_gpu)
  target_compile_options(bench_write_gpu PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wno-restrict>)
  target_link_libraries(bench_write_gpu PRIVATE kvo_gpu kvo_spec benchmark::benchmark
                                                CUDA::cudart_static)
  target_link_options(bench_write_gpu PRIVATE -static-libstdc++ -static-libgcc)
  set_target_properties(bench_write_gpu PROPERTIES BUILD_RPATH "$ORIGIN")
endif()
