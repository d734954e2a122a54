# Cross-compiles Sparrow for 64-bit Arm Linux with Debian's cross compiler and arm64 multiarch packages
# (dpkg --add-architecture arm64; libhwy-dev:arm64, libgtest-dev:arm64, libgmock-dev:arm64), so that the NEON
# kernels can be tested under qemu-aarch64 on an x86 machine (scripts/test-arm).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Programs run on the host; libraries and packages come from the arm64 multiarch folders and the
# architecture-independent header-only packages.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
