# Kernel instantiation, the same for every family: one translation unit per (dtype, head_dim),
# which keeps the build parallel, and the family's registration function, both written into the
# build tree from the selection (each unit is two lines, so none is kept in the repository).
#   flashcute_instantiate(<family> <header> "<dtypes>" "<head dims>" <out var> [TABLE <type>]
#                         [REGISTRY <registry header>])
# <header> defines FLASHCUTE_<FAMILY>_INSTANTIATE(Element, dtype, head_dim), which defines
# flashcute::<family>::register_<dtype>_hd<head_dim>(<type>&) (<type>: KernelTable unless given,
# declared in kernels/kernel_registry.hpp unless another registry header is given);
# the generated registration file defines flashcute::register_<family>_kernels. <out var> receives
# every generated source.
function(flashcute_write_if_changed path content)
  if(EXISTS ${path})
    file(READ ${path} old)
  else()
    set(old "")
  endif()
  if(NOT old STREQUAL content)
    file(WRITE ${path} "${content}")
  endif()
endfunction()

function(flashcute_instantiate family header dtypes head_dims out_var)
  cmake_parse_arguments(ARG "" "TABLE;REGISTRY" "" ${ARGN})
  set(table_type KernelTable)
  if(ARG_TABLE)
    set(table_type ${ARG_TABLE})
  endif()
  set(registry kernels/kernel_registry.hpp)
  if(ARG_REGISTRY)
    set(registry ${ARG_REGISTRY})
  endif()
  string(TOUPPER ${family} upper)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/${family}_instantiations)
  set(sources "")
  set(declarations "")
  set(calls "")
  foreach(dtype IN LISTS dtypes)
    if(dtype STREQUAL "fp16")
      set(element cutlass::half_t)
    elseif(dtype STREQUAL "bf16")
      set(element cutlass::bfloat16_t)
    else()
      message(FATAL_ERROR "FLASHCUTE_${upper}_DTYPES: unknown dtype ${dtype}")
    endif()
    foreach(hd IN LISTS head_dims)
      set(source ${dir}/${family}_${dtype}_hd${hd}.cu)
      flashcute_write_if_changed(${source}
        "#include \"${header}\"\nFLASHCUTE_${upper}_INSTANTIATE(${element}, ${dtype}, ${hd})\n")
      list(APPEND sources ${source})
      string(APPEND declarations "void register_${dtype}_hd${hd}(${table_type}& table);\n")
      string(APPEND calls "  ${family}::register_${dtype}_hd${hd}(table);\n")
    endforeach()
  endforeach()
  set(registration ${dir}/register_${family}.cpp)
  flashcute_write_if_changed(${registration}
    "#include \"${registry}\"\n\nnamespace flashcute {\nnamespace ${family} {\n${declarations}}  // namespace ${family}\n\nvoid register_${family}_kernels(${table_type}& table) {\n${calls}}\n\n}  // namespace flashcute\n")
  list(APPEND sources ${registration})
  set(${out_var} ${sources} PARENT_SCOPE)
endfunction()
