# The Hopper family (included from src/CMakeLists.txt when 90a is a target). Its sources use
# wgmma and setmaxnreg, which exist only for sm_90a, so they are built in their own object library
# with that single target instead of the library-wide gencode list, then linked into flashcute.
set(FLASHCUTE_SM90_DTYPES "fp16;bf16" CACHE STRING "SM90 family dtypes to instantiate")
set(FLASHCUTE_SM90_HEAD_DIMS "64;96;128;192;256" CACHE STRING "SM90 family head_dim buckets")

set(_sm90_dir ${CMAKE_CURRENT_LIST_DIR})
set(_sm90_sources ${_sm90_dir}/register.cpp)
set(_sm90_list "")
foreach(dtype IN LISTS FLASHCUTE_SM90_DTYPES)
  foreach(hd IN LISTS FLASHCUTE_SM90_HEAD_DIMS)
    set(_src ${_sm90_dir}/instantiations/fwd_${dtype}_hd${hd}.cu)
    if(NOT EXISTS ${_src})
      message(FATAL_ERROR "FLASHCUTE_SM90_*: no instantiation ${_src}")
    endif()
    list(APPEND _sm90_sources ${_src})
    string(APPEND _sm90_list "FLASHCUTE_SM90_INSTANCE(${dtype}, ${hd})\n")
  endforeach()
endforeach()
set(_sm90_gen ${CMAKE_CURRENT_BINARY_DIR}/sm90_generated)
file(CONFIGURE OUTPUT ${_sm90_gen}/sm90_instances.inc CONTENT "${_sm90_list}")

add_library(flashcute_sm90 OBJECT ${_sm90_sources})
target_include_directories(flashcute_sm90 PRIVATE
  ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src ${_sm90_gen})
target_link_libraries(flashcute_sm90 PRIVATE cutlass_headers CUDA::cudart_static)
target_compile_definitions(flashcute_sm90 PRIVATE CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED)
target_compile_options(flashcute_sm90 PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:
  -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr --use_fast_math -DNDEBUG
  -Xptxas=-warn-spills>)
set_target_properties(flashcute_sm90 PROPERTIES
  POSITION_INDEPENDENT_CODE ON
  CUDA_ARCHITECTURES OFF)
target_sources(flashcute PRIVATE $<TARGET_OBJECTS:flashcute_sm90>)
