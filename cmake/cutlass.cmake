# Locates the CUTLASS/CuTe headers. A user checkout wins (-DCUTLASS_DIR=<path with include/cute>);
# otherwise the headers are taken from the pinned PyPI wheel nvidia-cutlass, downloaded once into the
# build tree. The wheel is a zip: we only unpack its header folder, nothing is installed system-wide.
set(FLASHCUTE_CUTLASS_WHEEL_VERSION "4.2.0.0" CACHE STRING "Pinned nvidia-cutlass wheel version")
set(CUTLASS_DIR "" CACHE PATH "CUTLASS checkout (must contain include/cute/tensor.hpp)")

if(CUTLASS_DIR)
  set(_cutlass_include "${CUTLASS_DIR}/include")
else()
  set(_cutlass_root "${CMAKE_BINARY_DIR}/_deps/cutlass-${FLASHCUTE_CUTLASS_WHEEL_VERSION}")
  set(_cutlass_include "${_cutlass_root}/include")
  if(NOT EXISTS "${_cutlass_include}/cute/tensor.hpp")
    find_package(Python3 REQUIRED COMPONENTS Interpreter)
    message(STATUS "Fetching nvidia-cutlass==${FLASHCUTE_CUTLASS_WHEEL_VERSION} headers from PyPI")
    # pip's isolated build environment (pip install ./python) points PYTHONPATH at itself, which
    # hides the interpreter's own pip: the download runs without it.
    execute_process(
      COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
              ${Python3_EXECUTABLE} -m pip download --quiet --no-deps --only-binary=:all:
              "nvidia-cutlass==${FLASHCUTE_CUTLASS_WHEEL_VERSION}" -d "${_cutlass_root}/wheel"
      RESULT_VARIABLE _pip_rc)
    if(NOT _pip_rc EQUAL 0)
      message(FATAL_ERROR "Could not download nvidia-cutlass; pass -DCUTLASS_DIR=<checkout> instead")
    endif()
    execute_process(
      COMMAND ${Python3_EXECUTABLE} "${CMAKE_CURRENT_LIST_DIR}/extract_cutlass_headers.py"
              "${_cutlass_root}/wheel" "${_cutlass_include}"
      RESULT_VARIABLE _extract_rc)
    if(NOT _extract_rc EQUAL 0)
      message(FATAL_ERROR "Could not unpack the CUTLASS headers from the wheel")
    endif()
  endif()
endif()

if(NOT EXISTS "${_cutlass_include}/cute/tensor.hpp")
  message(FATAL_ERROR "CuTe headers not found under ${_cutlass_include}")
endif()
add_library(cutlass_headers INTERFACE)
target_include_directories(cutlass_headers SYSTEM INTERFACE "${_cutlass_include}")
message(STATUS "CUTLASS headers: ${_cutlass_include}")
