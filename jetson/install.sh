#!/usr/bin/env bash
# Installs this FlashRT tarball on a Jetson board (run it from the unpacked directory):
#   sudo ./install.sh [--prefix /opt/flashrt]
# Copies bin/ include/ lib/ share/ under the prefix, registers the library with ldconfig, links the
# pkg-config file, installs the systemd unit (not enabled) and a sample /etc/flashrt/flashrt_ros2.toml
# (kept when one exists). The unit expects the default prefix.
set -euo pipefail
prefix=/opt/flashrt
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
here="$(cd "$(dirname "$0")" && pwd)"
[ "$(uname -m)" = aarch64 ] || { echo "install.sh: this package is for aarch64 (Jetson), not $(uname -m)" >&2; exit 1; }
mkdir -p "$prefix"
cp -a "$here/bin" "$here/lib" "$here/share" "$prefix/"
[ -d "$here/include" ] && cp -a "$here/include" "$prefix/"
cp "$here/MANIFEST.json" "$prefix/"
if [ -e "$prefix/lib/libflashrt.so" ]; then
  echo "$prefix/lib" > /etc/ld.so.conf.d/flashrt.conf
  ldconfig
  mkdir -p /usr/local/lib/pkgconfig
  ln -sf "$prefix/lib/pkgconfig/flashrt.pc" /usr/local/lib/pkgconfig/flashrt.pc
fi
if [ -e "$prefix/bin/flashrt-ros2" ]; then
  install -m 644 "$here/lib/systemd/system/flashrt-ros2.service" /etc/systemd/system/
  mkdir -p /etc/flashrt
  [ -e /etc/flashrt/flashrt_ros2.toml ] || install -m 644 "$here/share/flashrt/ros2/flashrt_ros2.toml" /etc/flashrt/
  systemctl daemon-reload 2> /dev/null || true
fi
echo "installed $(sed -n 's/.*"version": "\(.*\)".*/flashrt \1/p' "$prefix/MANIFEST.json") for $(sed -n 's/.*"board": "\(.*\)".*/\1/p' "$prefix/MANIFEST.json") under $prefix"
echo "next: $prefix/bin/flashrt bench --checkpoint <dir>   (see share/flashrt/README or jetson/README.md)"
