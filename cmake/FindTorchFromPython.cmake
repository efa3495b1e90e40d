# Locates LibTorch inside the pinned `torch` wheel that scripts/setup installs.
#
# Order: an explicit Torch_DIR or CMAKE_PREFIX_PATH wins (find_package sees it
# first); then the interpreter named by BATCHTUNE_PYTHON; then the virtual
# environment scripts/setup creates; then python3 on PATH.
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

if(NOT Torch_DIR AND BATCHTUNE_PYTHON)
  execute_process(
    COMMAND "${BATCHTUNE_PYTHON}" -c "import torch, sys; sys.stdout.write(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _torch_prefix
    RESULT_VARIABLE _torch_rc
    ERROR_QUIET)
  if(_torch_rc EQUAL 0 AND _torch_prefix)
    list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
    message(STATUS "batchtune: LibTorch from ${BATCHTUNE_PYTHON} (${_torch_prefix})")
  endif()
endif()
