# libtrireme_nccl.so: the NCCL backend and page-locking of snapshot memory (the CUDA
# runtime's host registration), built when the CUDA toolkit (headers, nccl.h) and
# the wheel's CUDA libraries (libtorch_cuda, libc10_cuda) are present. Nothing here runs
# on a machine without a GPU; it is compiled so the CUDA path keeps building.
if(NOT TRIREME_WITH_NCCL)
  return()
endif()
find_package(CUDAToolkit QUIET)
find_path(TRIREME_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(NOT CUDAToolkit_FOUND OR NOT TRIREME_NCCL_INCLUDE
   OR NOT EXISTS "${TRIREME_TORCH_LIBDIR}/libtorch_cuda.so")
  message(STATUS "trireme: NCCL plugin not built (needs CUDA toolkit, nccl.h, libtorch_cuda)")
  return()
endif()
add_library(trireme_nccl SHARED trireme/dist/nccl/backend.cpp trireme/dist/nccl/host_memory.cpp)
target_compile_definitions(trireme_nccl PRIVATE USE_C10D_NCCL USE_CUDA)
target_include_directories(trireme_nccl PRIVATE ${CUDAToolkit_INCLUDE_DIRS} ${TRIREME_NCCL_INCLUDE})
# Link without resolving CUDA's own libraries here: at run time they come from the
# wheel's nvidia-* packages (or the system), next to libtorch_cuda.
target_link_libraries(trireme_nccl PRIVATE trireme
  "${TRIREME_TORCH_LIBDIR}/libtorch_cuda.so" "${TRIREME_TORCH_LIBDIR}/libc10_cuda.so")
target_link_options(trireme_nccl PRIVATE -Wl,--allow-shlib-undefined)
set_target_properties(trireme_nccl PROPERTIES
  BUILD_RPATH "$<TARGET_FILE_DIR:trireme>;${TRIREME_TORCH_LIBDIR}"
  INSTALL_RPATH "$ORIGIN;${TRIREME_TORCH_LIBDIR}")
install(TARGETS trireme_nccl LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
message(STATUS "trireme: NCCL plugin enabled (CUDA ${CUDAToolkit_VERSION})")
