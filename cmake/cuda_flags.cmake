# Turns FLASHCUTE_CUDA_ARCHS into -gencode flags (CMake's CUDA_ARCHITECTURES cannot express the
# compute_90a/sm_90a pair on every CMake we support) and sets the flags every kernel source shares.
set(FLASHCUTE_GENCODE_FLAGS "")
set(FLASHCUTE_HAS_SM90A OFF)
set(FLASHCUTE_HAS_SM80 OFF)
foreach(arch IN LISTS FLASHCUTE_CUDA_ARCHS)
  if(NOT arch MATCHES "^[0-9][0-9][0-9]?[af]?$")
    message(FATAL_ERROR "FLASHCUTE_CUDA_ARCHS: '${arch}' is no CUDA architecture "
                        "(write 80;86;90a and so on)")
  endif()
  list(APPEND FLASHCUTE_GENCODE_FLAGS "-gencode=arch=compute_${arch},code=sm_${arch}")
  if(arch STREQUAL "90a")
    set(FLASHCUTE_HAS_SM90A ON)
  endif()
  if(arch STREQUAL "80")
    set(FLASHCUTE_HAS_SM80 ON)
  endif()
endforeach()
if(FLASHCUTE_HAS_SM80)
  list(APPEND FLASHCUTE_GENCODE_FLAGS "-gencode=arch=compute_80,code=compute_80")
endif()
set(CMAKE_CUDA_ARCHITECTURES OFF)

# The one list of CUDA flags; each family adds only its targets (the Hopper family builds for
# sm_90a alone: wgmma and setmaxnreg exist nowhere else).
set(FLASHCUTE_CUDA_FLAGS
    --expt-relaxed-constexpr
    --use_fast_math
    -DNDEBUG
    -Xptxas=-warn-spills)
