# CMake toolchain for cross-compiling C/C++ users of libflashrt (examples/cpp_controller) for
# Jetson on a Debian/Ubuntu x86_64 host with gcc-aarch64-linux-gnu / g++-aarch64-linux-gnu.
#   cmake -S examples/cpp_controller -B build -DCMAKE_TOOLCHAIN_FILE=jetson/aarch64-toolchain.cmake \
#         -DCMAKE_PREFIX_PATH=<unpacked flashrt tarball>
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Libraries and packages come from the target side (the prefix path: the flashrt package), never
# from the x86_64 host; programs (cmake helpers) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# Under qemu-aarch64-static, try_run and tests can execute target binaries.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static -L /)
