# Decides whether kernels/cuda is built. KVD_WITH_CUDA=AUTO builds it when a
# CUDA compiler is found (on PATH, CUDACXX, or /usr/local/cuda/bin/nvcc),
# OFF never, ON fails the configure without one. Sets KVD_CUDA_ENABLED.
#
# Pitfalls handled here: CMAKE_CUDA_ARCHITECTURES must be set before
# enable_language; CUDA 13 dropped everything below sm_75; the runtime is
# linked statically so libkvdepot.so loads on machines without a driver.
set(KVD_CUDA_ENABLED OFF)
if(NOT KVD_WITH_CUDA MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "KVD_WITH_CUDA must be AUTO, ON or OFF")
endif()
if(NOT KVD_WITH_CUDA STREQUAL "OFF")
    if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
       AND EXISTS /usr/local/cuda/bin/nvcc)
        set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
        enable_language(CUDA)
        find_package(CUDAToolkit REQUIRED)
        set(CMAKE_CUDA_STANDARD 17)
        set(CMAKE_CUDA_VISIBILITY_PRESET hidden)
        set(KVD_CUDA_ENABLED ON)
    elseif(KVD_WITH_CUDA STREQUAL "ON")
        message(FATAL_ERROR "KVD_WITH_CUDA=ON but no CUDA compiler was found")
    else()
        message(STATUS "kvdepot: no CUDA compiler, building without kernels/cuda")
    endif()
endif()
