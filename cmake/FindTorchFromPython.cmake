# Locates LibTorch inside the pinned `torch` wheel that scripts/setup installs.
#
# Order: an explicit Torch_DIR wins; then the interpreter named by
# BATCHTUNE_PYTHON; then the virtual environment scripts/setup creates; then
# python3 on PATH.
#
# The chosen LibTorch's folder (the wheel's `torch/`, or the prefix above an
# explicit Torch_DIR) goes FIRST on CMAKE_PREFIX_PATH. TorchConfig.cmake looks
# for its libraries with `find_library(... PATHS <its lib>)`, and PATHS come
# after the system folders: on a machine with Debian's libtorch-dev, the
# wheel's config would otherwise link /usr/lib/.../libtorch.so (1.13) and mix
# two libc10.so. A prefix on CMAKE_PREFIX_PATH is searched before the system.
file(READ "${CMAKE_CURRENT_LIST_DIR}/../TORCH_VERSION" BATCHTUNE_TORCH_VERSION)
string(STRIP "${BATCHTUNE_TORCH_VERSION}" BATCHTUNE_TORCH_VERSION)

if(NOT DEFINED BATCHTUNE_PYTHON)
  if(DEFINED ENV{BATCHTUNE_PYTHON})
    set(BATCHTUNE_PYTHON "$ENV{BATCHTUNE_PYTHON}")
  else()
    if(DEFINED ENV{XDG_DATA_HOME})
      set(_data_home "$ENV{XDG_DATA_HOME}")
    else()
      set(_data_home "$ENV{HOME}/.local/share")
    endif()
    set(_venv_python "${_data_home}/batchtune/venv-torch-${BATCHTUNE_TORCH_VERSION}/bin/python")
    if(EXISTS "${_venv_python}")
      set(BATCHTUNE_PYTHON "${_venv_python}")
    else()
      find_program(BATCHTUNE_PYTHON NAMES python3 python)
    endif()
  endif()
endif()

if(Torch_DIR)
  # <prefix>/share/cmake/Torch: the prefix holds lib/ and include/.
  get_filename_component(_torch_root "${Torch_DIR}/../../.." ABSOLUTE)
  list(PREPEND CMAKE_PREFIX_PATH "${_torch_root}")
  message(STATUS "batchtune: LibTorch from Torch_DIR (${_torch_root} first on CMAKE_PREFIX_PATH)")
elseif(BATCHTUNE_PYTHON)
  execute_process(
    COMMAND "${BATCHTUNE_PYTHON}" -c "import torch, sys; sys.stdout.write(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _torch_prefix
    RESULT_VARIABLE _torch_rc
    ERROR_QUIET)
  if(_torch_rc EQUAL 0 AND _torch_prefix)
    # torch.utils.cmake_prefix_path is <torch>/share/cmake.
    get_filename_component(_torch_root "${_torch_prefix}/../.." ABSOLUTE)
    list(PREPEND CMAKE_PREFIX_PATH "${_torch_root}" "${_torch_prefix}")
    message(STATUS "batchtune: LibTorch from ${BATCHTUNE_PYTHON} (${_torch_root} first on CMAKE_PREFIX_PATH)")
  endif()
endif()

# After find_package(Torch): says which LibTorch was found, and stops when its
# libraries do not come from the folder its config file is in (two LibTorch
# builds in one link abort at start).
function(batchtune_report_torch)
  get_filename_component(_config_root "${TORCH_INSTALL_PREFIX}" REALPATH)
  set(_libs "${TORCH_LIBRARY}")
  if(TARGET c10)
    get_target_property(_c10 c10 IMPORTED_LOCATION_RELEASE)
    if(NOT _c10)
      get_target_property(_c10 c10 IMPORTED_LOCATION)
    endif()
    if(_c10)
      list(APPEND _libs "${_c10}")
    endif()
  endif()
  set(_found "")
  foreach(_lib IN LISTS _libs)
    if(_lib)
      get_filename_component(_path "${_lib}" REALPATH)
      list(APPEND _found "${_path}")
      string(FIND "${_path}" "${_config_root}/" _at)
      if(NOT _at EQUAL 0)
        message(FATAL_ERROR
          "batchtune: LibTorch's config in ${_config_root} found ${_path}, "
          "a library of another LibTorch; put ${_config_root} first on CMAKE_PREFIX_PATH "
          "(or pass -DTorch_DIR=${_config_root}/share/cmake/Torch)")
      endif()
    endif()
  endforeach()
  string(REPLACE ";" ", " _found "${_found}")
  message(STATUS "batchtune: found LibTorch ${Torch_VERSION} in ${_config_root} (${_found})")
endfunction()
