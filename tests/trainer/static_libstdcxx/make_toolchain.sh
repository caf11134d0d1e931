#!/usr/bin/env bash
# make_toolchain.sh DIR [CXX]: makes DIR a stand-in for a compiler whose libstdc++ is static only,
# as a GPU image's CXX=/opt/gcc/bin/g++ is (../shared/notes/gpu-image.md): a relocated copy of the
# system GCC (CXX, default g++; GCC finds its libraries, headers and cc1plus relative to its own
# binary) whose library folder holds everything of the real one but libstdc++.so. Then, as there,
#   DIR/bin/c++ -print-file-name=libstdc++.so     prints libstdc++.so (not found),
#   DIR/bin/c++ -print-file-name=libstdc++.a      finds the archive, and
#   DIR/bin/c++ -print-file-name=libstdc++.so.6   finds the system's /lib/<triplet>/libstdc++.so.6,
# and -lstdc++ links the archive. Prints DIR/bin/c++ (also DIR/bin/g++; DIR/bin/cc and gcc for C).
# Safe to run again.
set -euo pipefail
dir=$1 cxx=${2:-g++}
real_cxx=$(readlink -f "$(command -v "$cxx")")
real_cc=$(readlink -f "$(command -v "${cxx/g++/gcc}")")
libdir=$(dirname "$("$real_cxx" -print-libgcc-file-name)")   # /usr/lib/gcc/<triplet>/<version>
version=$(basename "$libdir") triplet=$(basename "$(dirname "$libdir")")
prefix=$(cd "$libdir/../../../.." && pwd)                    # /usr
libexec=$(dirname "$("$real_cxx" -print-prog-name=cc1plus)")
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib/gcc/$triplet/$version" "$dir/libexec/gcc/$triplet" "$dir/include/$triplet"
# Copies that keep their size, time and the names CMake finds first (c++, cc): ccache
# (compiler_check=mtime, and the compiler's base name) takes them for the real ones, so this
# compiler's build reuses the main build's objects.
cp -p "$real_cxx" "$dir/bin/c++"
cp -p "$real_cc" "$dir/bin/cc"
ln -s c++ "$dir/bin/g++"
ln -s cc "$dir/bin/gcc"
for f in "$libdir"/* "$libdir"/.[!.]*; do
  [ -e "$f" ] || continue
  [ "$(basename "$f")" = libstdc++.so ] || ln -s "$f" "$dir/lib/gcc/$triplet/$version/"
done
ln -s "$libexec" "$dir/libexec/gcc/$triplet/$version"
ln -s "$prefix/include/c++" "$dir/include/c++"
ln -s "$prefix/include/$triplet/c++" "$dir/include/$triplet/c++"
[ "$("$dir/bin/c++" -print-file-name=libstdc++.so)" = libstdc++.so ] ||
  { echo "make_toolchain: $dir/bin/c++ still finds a shared libstdc++.so" >&2; exit 1; }
[ -f "$("$dir/bin/c++" -print-file-name=libstdc++.a)" ] ||
  { echo "make_toolchain: $dir/bin/c++ finds no libstdc++.a" >&2; exit 1; }
echo "$dir/bin/c++"
