#!/usr/bin/env bash
# Makes once, then reuses, a Debian 13 ("trixie") root that stands in for a Linux GPU host whose
# PyTorch is a CUDA build: Debian's CUDA LibTorch 2.6 (libtorch-cuda-dev, python3-torch-cuda from
# contrib), NCCL (libnccl-dev) and the CUDA toolkit (nvidia-cuda-toolkit: the nvcc and headers
# LibTorch's CMake config asks FindCUDAToolkit for) from non-free -- but no GPU, no gloo headers
# and no OpenSSL headers, like a pip wheel's host. One root serves every Debian 13 check: the
# trainer-only build with its CUDA and NCCL code paths and the trainer tests on the CPU
# (trixie_trainer_check.sh), bench/gpu/run.sh's no-GPU run, the fresh-host test of `sftctl
# bootstrap` (sshd) and the macOS check's LibTorch 2.x headers. (Debian's libtorch-dev, the CPU
# build, conflicts with libtorch-cuda-dev: a root has one or the other; the CUDA one builds and runs
# everything the CPU one did, on the CPU.)
#
# cuDNN: Debian's `nvidia-cudnn` is a downloader that fetches NVIDIA's archive while installing (it
# fails offline). An empty package of that name and version (dpkg-deb) satisfies apt, and a stub
# libcudnn.so.9 -- one function per cudnn* symbol LibTorch's libraries import, in the symbol
# version node they ask for, each returning CUDNN_STATUS_NOT_INITIALIZED -- satisfies the linker and
# the loader. Nothing calls it without a GPU.
#
# Usage: tests/portability/trixie_root.sh [ROOT]
#   ROOT defaults to $SFTCTL_TRIXIE_ROOT, else /var/cache/sftctl/trixie-root. The root is ready
#   when ROOT/.sftctl-ready holds this script's package list; a half-made root (killed run) is
#   thrown away and made again. Needs root (or sudo), debootstrap, and the Debian registry this
#   machine's apt already uses (its address is read from apt's sources, not written here).
#   About 2.7 GB of packages and 8 GB on disk; 5 minutes on a fast mirror; seconds afterwards.
set -euo pipefail
NAME=trixie_root
# shellcheck source=tests/portability/debian_root_lib.sh
. "$(dirname "$0")/debian_root_lib.sh"

ROOT=${1:-${SFTCTL_TRIXIE_ROOT:-/var/cache/sftctl/trixie-root}}

# What a CUDA GPU host's build of the trainer has: a compiler, CMake, CUDA LibTorch 2.6, NCCL, the
# CUDA toolkit, the trainer's header-only and C dependencies, GoogleTest, Python torch for the HF
# parity reference (and bench/gpu/run.sh); sshd (every rented host has one: the fresh-host test
# logs in through it), ccache (the trainer check fills a cache the fresh host's build of the same
# source then hits) and rsync. Deliberately absent: libgloo-dev (a pip wheel ships no gloo
# headers) and libssl-dev.
PKGS=(ca-certificates g++ cmake ninja-build pkg-config make libtorch-cuda-dev libnccl-dev
  nvidia-cuda-toolkit libopenblas0-openmp nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev
  libpcre2-dev libutf8proc-dev libgtest-dev libgmock-dev python3 python3-torch-cuda python3-numpy
  openssh-server ccache)
want="cuda cudnn-stub-v2 ${PKGS[*]}"

# The empty stand-in for NVIDIA's downloader package, with the version apt would install.
install_cudnn_placeholder() {
  local version
  version=$($SUDO chroot "$tmp" apt-cache show --no-all-versions nvidia-cudnn 2>/dev/null |
    sed -n 's/^Version: //p' | head -n 1)
  [ -n "$version" ] || root_fail "the registry has no nvidia-cudnn (is contrib enabled?)"
  $SUDO mkdir -p "$tmp/tmp/nvidia-cudnn/DEBIAN"
  printf '%s\n' "Package: nvidia-cudnn" "Version: $version" "Architecture: amd64" \
    "Maintainer: sftctl CI <ci@localhost>" \
    "Description: empty stand-in for NVIDIA's cuDNN downloader (sftctl's CUDA stand-in root)" |
    $SUDO tee "$tmp/tmp/nvidia-cudnn/DEBIAN/control" >/dev/null
  { $SUDO chroot "$tmp" dpkg-deb --build /tmp/nvidia-cudnn /tmp/nvidia-cudnn.deb &&
    $SUDO chroot "$tmp" dpkg -i /tmp/nvidia-cudnn.deb && $SUDO chroot "$tmp" apt-mark hold nvidia-cudnn; } \
    >>"$ROOT.log" 2>&1 || root_fail "installing the nvidia-cudnn placeholder failed" --log
  $SUDO rm -rf "$tmp/tmp/nvidia-cudnn" "$tmp/tmp/nvidia-cudnn.deb"
}

# The stub libcudnn.so.9: every cudnn* function any library in the root imports from it, in the
# version node "libcudnn.so.9" that they name.
build_cudnn_stub() {
  $SUDO chroot "$tmp" bash -c '
    set -euo pipefail
    cd /tmp
    libs=$(find /usr/lib/x86_64-linux-gnu /usr/lib/python3/dist-packages/torch -name "*.so*" -type f 2>/dev/null |
      while read -r f; do if readelf -d "$f" 2>/dev/null | grep "NEEDED.*\[libcudnn\.so\.9\]" >/dev/null; then echo "$f"; fi; done)
    [ -n "$libs" ] || { echo "no library needs libcudnn.so.9" >&2; exit 1; }
    syms=$(for f in $libs; do readelf --dyn-syms -W "$f" | awk "\$7 == \"UND\" && \$8 ~ /^cudnn/ {print \$8}"; done |
      sed "s/@.*//" | sort -u)
    [ -n "$syms" ] || { echo "no cudnn* symbol imported" >&2; exit 1; }
    { echo "/* tests/portability/trixie_root.sh: libcudnn.so.9 for a root without a GPU. */"
      for s in $syms; do echo "int $s(void) { return 1; /* CUDNN_STATUS_NOT_INITIALIZED */ }"; done; } >cudnn_stub.c
    echo "libcudnn.so.9 { global: *; };" >cudnn_stub.map
    gcc -shared -fPIC -O0 -Wl,-soname,libcudnn.so.9 -Wl,--version-script=cudnn_stub.map \
      -o /usr/lib/x86_64-linux-gnu/libcudnn.so.9 cudnn_stub.c
    ln -sf libcudnn.so.9 /usr/lib/x86_64-linux-gnu/libcudnn.so
    ldconfig
    echo "stub libcudnn.so.9: $(echo "$syms" | wc -l) functions for $(echo "$libs" | wc -l) libraries"
    rm -f cudnn_stub.c cudnn_stub.map' >>"$ROOT.log" 2>&1 || root_fail "building the stub libcudnn.so.9 failed" --log
  tail -n 1 "$ROOT.log" | sed 's/^/trixie_root: /' >&2
}

root_begin
root_debootstrap trixie
# contrib (libtorch-cuda-dev, python3-torch-cuda, nvidia-cudnn) and non-free (NCCL, the toolkit).
echo "deb $mirror trixie main contrib non-free" | $SUDO tee "$tmp/etc/apt/sources.list" >/dev/null
$SUDO rm -f "$tmp/etc/apt/sources.list.d/"*.sources
$SUDO chroot "$tmp" apt-get update -qq >>"$ROOT.log" 2>&1 || root_fail "apt-get update failed; see $ROOT.log" --log
install_cudnn_placeholder
echo "trixie_root: installing ${#PKGS[@]} packages (CUDA LibTorch 2.6, NCCL, CUDA toolkit: ~2.7 GB)" >&2
root_install
build_cudnn_stub
# Every library LibTorch and Python torch load must resolve (the stub among them): import torch.
$SUDO chroot "$tmp" python3 -c 'import torch; assert torch.version.cuda; assert not torch.cuda.is_available()' \
  >>"$ROOT.log" 2>&1 || root_fail "python3 -c 'import torch' fails in the root" --log
root_finish

# The root must look like a pip wheel's host, or the checks prove nothing.
for h in gloo/algorithm.h openssl/evp.h; do
  [ ! -e "$tmp/usr/include/$h" ] || root_fail "the root has /usr/include/$h; it no longer stands in for a pip wheel"
done
[ -x "$tmp/usr/bin/nvcc" ] || root_fail "the root has no nvcc (nvidia-cuda-toolkit)"
grep -qs 'USE_C10D_GLOO' -r "$tmp"/usr/lib/*/cmake/Caffe2 "$tmp"/usr/lib/*/cmake/Torch ||
  echo "trixie_root: note: LibTorch's CMake config no longer exports USE_C10D_GLOO" >&2

root_commit
