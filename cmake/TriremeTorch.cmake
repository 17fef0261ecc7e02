# Defines the imported target trireme::torch: libtorch's CPU libraries and headers as the
# pinned PyTorch wheel ships them (scripts/install-deps puts it in .deps/venv).
#
# We do not use the wheel's share/cmake/Torch: the PyPI wheel is a CUDA build, and its
# config runs the CUDA setup and links every consumer against libtorch_cuda, libc10_cuda
# and the system toolkit's libnvrtc, even for CPU-only code. The CPU part is two libraries
# (libtorch_cpu, libc10); the CUDA part is only linked by the optional NCCL plugin.
#
# Input: TRIREME_TORCH_DIR (the wheel's torch/ folder). If unset, asks TRIREME_PYTHON
# (default: the project's .deps/venv python, then python3) where torch lives.
if(TARGET trireme::torch)
  return()
endif()

if(NOT TRIREME_TORCH_DIR)
  if(NOT TRIREME_PYTHON)
    foreach(candidate "${CMAKE_CURRENT_LIST_DIR}/../.deps/venv/bin/python" "python3")
      find_program(_trireme_py NAMES "${candidate}" NO_CACHE)
      if(_trireme_py)
        set(TRIREME_PYTHON "${_trireme_py}")
        break()
      endif()
    endforeach()
  endif()
  execute_process(
    COMMAND "${TRIREME_PYTHON}" -c "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE _trireme_torch_dir OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _trireme_rc ERROR_QUIET)
  if(NOT _trireme_rc EQUAL 0 OR NOT _trireme_torch_dir)
    message(FATAL_ERROR "libtorch not found: run scripts/install-deps (or set TRIREME_TORCH_DIR to a torch/ folder)")
  endif()
  set(TRIREME_TORCH_DIR "${_trireme_torch_dir}" CACHE PATH "torch/ folder of the PyTorch wheel")
endif()

foreach(lib torch_cpu c10)
  if(NOT EXISTS "${TRIREME_TORCH_DIR}/lib/lib${lib}.so")
    message(FATAL_ERROR "${TRIREME_TORCH_DIR}/lib/lib${lib}.so missing: reinstall with scripts/install-deps")
  endif()
endforeach()

# The version built and tested against is the one scripts/install-deps pins; another 2.x
# may build (the GPU machines' own torch, say) but is untested: said, not refused.
if(EXISTS "${TRIREME_TORCH_DIR}/version.py")
  file(STRINGS "${TRIREME_TORCH_DIR}/version.py" _trireme_torch_version REGEX "^__version__")
  string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" _trireme_torch_version "${_trireme_torch_version}")
  if(NOT _trireme_torch_version STREQUAL "2.7.1")
    message(WARNING "libtorch ${_trireme_torch_version} at ${TRIREME_TORCH_DIR}: Trireme is tested with 2.7.1 "
                    "(scripts/install-deps); other versions are untested (2.11 is known to crash, "
                    "docs/design-notes.md). To change it, delete build/ after installing the other one.")
  endif()
endif()

add_library(trireme::torch INTERFACE IMPORTED)
set_target_properties(trireme::torch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES
    "${TRIREME_TORCH_DIR}/include;${TRIREME_TORCH_DIR}/include/torch/csrc/api/include"
  INTERFACE_LINK_LIBRARIES
    "${TRIREME_TORCH_DIR}/lib/libtorch_cpu.so;${TRIREME_TORCH_DIR}/lib/libc10.so;Threads::Threads"
  # The 2.7 wheels are built with the C++11 std::string ABI, as Debian's libraries are.
  INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1")
find_package(Threads REQUIRED)
set(TRIREME_TORCH_LIBDIR "${TRIREME_TORCH_DIR}/lib")
