# CMake toolchain file: cross-compile for aarch64 Linux (Debian's g++-aarch64-linux-gnu) against an
# arm64 Debian root filesystem that provides the target's Python headers and libraries.
#
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=tools/aarch64-toolchain.cmake \
#         -DQLINEAR_AARCH64_ROOTFS=/path/to/arm64-rootfs ...
#
# The root filesystem may also be given by the environment variable QLINEAR_AARCH64_ROOTFS.
# tools/test-aarch64.sh makes the root filesystem and passes the Python-related variables.

set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT QLINEAR_AARCH64_ROOTFS AND DEFINED ENV{QLINEAR_AARCH64_ROOTFS})
  set(QLINEAR_AARCH64_ROOTFS "$ENV{QLINEAR_AARCH64_ROOTFS}")
endif()
if(NOT QLINEAR_AARCH64_ROOTFS)
  message(FATAL_ERROR "aarch64-toolchain.cmake: set QLINEAR_AARCH64_ROOTFS to an arm64 root filesystem")
endif()
# try_compile projects (check_cxx_source_compiles, FindThreads) re-read this file: pass the variable on.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES QLINEAR_AARCH64_ROOTFS)

set(_qlinear_cross_prefix "aarch64-linux-gnu-" CACHE STRING "Cross compiler prefix")
set(CMAKE_C_COMPILER "${_qlinear_cross_prefix}gcc")
set(CMAKE_CXX_COMPILER "${_qlinear_cross_prefix}g++")

# Libraries and headers from the root filesystem, programs (and CMake packages such as the host's
# pybind11, given by pybind11_DIR) from the host.
set(CMAKE_FIND_ROOT_PATH "${QLINEAR_AARCH64_ROOTFS}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# The cross compiler keeps its own sysroot (/usr/aarch64-linux-gnu) for the C library; the root
# filesystem's headers come last, so that Python.h and the multiarch pyconfig.h
# (usr/include/aarch64-linux-gnu/python3.X/pyconfig.h) are found.
set(CMAKE_C_FLAGS_INIT "-idirafter ${QLINEAR_AARCH64_ROOTFS}/usr/include")
set(CMAKE_CXX_FLAGS_INIT "-idirafter ${QLINEAR_AARCH64_ROOTFS}/usr/include")
