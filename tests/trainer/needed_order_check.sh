#!/usr/bin/env bash
# needed_order_check.sh BINARY...: each BINARY (an executable that links LibTorch) names libstdc++
# among its libraries (NEEDED) ahead of every LibTorch library and of the wheel stand-in, so the
# dynamic linker binds its std::filesystem calls to the system libstdc++ (trainer/libstdcxx_first.cmake).
set -euo pipefail
status=0
for bin in "$@"; do
  needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  [ -n "$needed" ] || { echo "FAIL: readelf listed no NEEDED entry in $bin"; status=1; continue; }
  first_std=$(echo "$needed" | grep -n '^libstdc++' | head -n 1 | cut -d: -f1 || true)
  first_torch=$(echo "$needed" | grep -nE '^lib(torch|c10|sftctl_wheel_stdfs_standin)' | head -n 1 | cut -d: -f1 || true)
  echo "$(basename "$bin"): NEEDED $(echo "$needed" | tr '\n' ' ')"
  if [ -z "$first_std" ]; then
    echo "FAIL: $bin does not name libstdc++ itself"; status=1
  elif [ -n "$first_torch" ] && [ "$first_std" -gt "$first_torch" ]; then
    echo "FAIL: $bin names LibTorch (entry $first_torch) before libstdc++ (entry $first_std):" \
         "a wheel's std::filesystem copies would shadow the system's"
    status=1
  fi
done
exit $status
