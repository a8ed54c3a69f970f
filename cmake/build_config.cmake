# Reads build_config.json (sources, flags, CUDA arch default) for both
# CMakeLists.txt files, as make_inplace/_sources.py does for setup.py, the
# JIT loader and the MindSpore bridge's _build.py. Needs CMake 3.19 (string(JSON)).
get_filename_component(MAKE_INPLACE_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(MAKE_INPLACE_CONFIG_FILE "${MAKE_INPLACE_ROOT}/build_config.json")
file(READ "${MAKE_INPLACE_CONFIG_FILE}" MAKE_INPLACE_CONFIG)
# An edit to the config re-runs the configure step.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${MAKE_INPLACE_CONFIG_FILE}")

# make_inplace_config_list(<out> <key> [<key>...]): the JSON array at that path as a CMake list.
function(make_inplace_config_list out)
  string(JSON _n LENGTH "${MAKE_INPLACE_CONFIG}" ${ARGN})
  set(_items "")
  if(_n GREATER 0)
    math(EXPR _last "${_n} - 1")
    foreach(_i RANGE ${_last})
      string(JSON _item GET "${MAKE_INPLACE_CONFIG}" ${ARGN} ${_i})
      list(APPEND _items "${_item}")
    endforeach()
  endif()
  set(${out} "${_items}" PARENT_SCOPE)
endfunction()

# make_inplace_config_sources(<out> <target> <kind>): the source globs of
# <target> (torch_library, mindspore_bridge), kind cpu_sources or cuda_sources,
# expanded like _sources.py does (sorted per glob, duplicates dropped).
function(make_inplace_config_sources out target kind)
  make_inplace_config_list(_globs ${target} ${kind})
  set(_files "")
  foreach(_glob IN LISTS _globs)
    file(GLOB _found CONFIGURE_DEPENDS "${MAKE_INPLACE_ROOT}/${_glob}")
    list(SORT _found)
    list(APPEND _files ${_found})
  endforeach()
  list(REMOVE_DUPLICATES _files)
  set(${out} "${_files}" PARENT_SCOPE)
endfunction()

# make_inplace_config_dirs(<out> <target>): the include folders of <target>, absolute.
function(make_inplace_config_dirs out target)
  make_inplace_config_list(_dirs ${target} include_dirs)
  list(TRANSFORM _dirs PREPEND "${MAKE_INPLACE_ROOT}/")
  set(${out} "${_dirs}" PARENT_SCOPE)
endfunction()

string(JSON MAKE_INPLACE_DEFAULT_CUDA_ARCH_LIST GET "${MAKE_INPLACE_CONFIG}" cuda_arch_list)
make_inplace_config_list(MAKE_INPLACE_CXX_FLAGS cxx_flags)
make_inplace_config_list(MAKE_INPLACE_NVCC_FLAGS nvcc_flags)
# OpenMP on Linux only, as in _sources.py (the CPU kernels' row loops).
set(MAKE_INPLACE_OPENMP_FLAGS "")
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  make_inplace_config_list(MAKE_INPLACE_OPENMP_FLAGS openmp_flags)
endif()

# make_inplace_torch_cxx_standard(<out> <torch include dir>): the CXX_STANDARD an
# installed torch's TorchConfig.cmake asks of its users (17 for 2.11, 20 for 2.13),
# for builds that take torch's headers without find_package(Torch).
function(make_inplace_torch_cxx_standard out include_dir)
  set(_config "${include_dir}/../share/cmake/Torch/TorchConfig.cmake")
  set(_std "")
  if(EXISTS "${_config}")
    file(STRINGS "${_config}" _line REGEX "CXX_STANDARD[ \t]+[0-9]+")
    string(REGEX MATCH "[0-9]+" _std "${_line}")
  endif()
  set(${out} "${_std}" PARENT_SCOPE)
endfunction()

# make_inplace_use_standard(<target> <standard>): compile <target>'s C++ and CUDA
# at that standard. CMake 3.25 knows no CUDA20 for nvcc, so where it lacks the
# option nvcc gets the -std flag directly. No CXX_STANDARD_REQUIRED: CUDA sources
# inherit it, and CMake would then refuse the CUDA20 it does not know.
function(make_inplace_use_standard target std)
  set_target_properties(${target} PROPERTIES CXX_STANDARD ${std} CXX_EXTENSIONS OFF)
  if(NOT CMAKE_CUDA_COMPILER_LOADED)
    return()
  endif()
  if(DEFINED CMAKE_CUDA${std}_STANDARD_COMPILE_OPTION)
    set_target_properties(${target} PROPERTIES CUDA_STANDARD ${std} CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF)
  else()
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:-std=c++${std}>")
  endif()
endfunction()
