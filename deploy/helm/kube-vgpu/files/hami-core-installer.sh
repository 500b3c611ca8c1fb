#!/bin/sh
# Installs HAMi-core into the host directory GPU containers mount (the device plugin mounts
# <dir>/libvgpu.so and <dir>/ld.so.preload into every GPU container at the same paths).
#
#   hami-core-installer.sh DIR [SEEN]
#
# DIR:  the host directory (<hookPath>/vgpu), reachable here at that path.
# SEEN: the path containers see DIR at (default DIR): what ld.so.preload names.
# HAMI_CORE_SOURCE: HAMi's image layout (default /k8s-vgpu): bin/vgpu-init.sh and lib/nvidia/.
#
# Steps: HAMi's own vgpu-init.sh; the newest versioned build (lib/nvidia/libvgpu.so.<version>) as
# libvgpu.so; ld.so.preload naming SEEN/libvgpu.so when it is not a file yet. A file is replaced by
# a rename, never rewritten in place (running containers keep the inode they mounted). An empty
# directory where a file belongs (a container runtime creates a missing mount source as a
# directory) is removed first. Ends with both as regular files, or fails naming the one that is not.
set -eu
dir=${1:?usage: hami-core-installer.sh DIR [SEEN]}
dir=${dir%/}
seen=${2:-$dir}
seen=${seen%/}
src=${HAMI_CORE_SOURCE:-/k8s-vgpu}

repair() {  # an empty directory a runtime made of a missing mount source: remove it
  if [ -d "$1" ] && [ ! -L "$1" ]; then
    rmdir "$1" || { echo "hami-core-installer: $1 is a non-empty directory; remove it by hand" >&2; exit 1; }
    echo "hami-core-installer: removed the directory a container runtime made at $1"
  fi
}

mkdir -p "$dir"
repair "$dir/libvgpu.so"
repair "$dir/ld.so.preload"
"$src/bin/vgpu-init.sh" "$dir/"
latest=$(ls "$src"/lib/nvidia/libvgpu.so.* 2>/dev/null | sort -V | tail -n 1)
if [ -n "$latest" ]; then
  cp -f "$latest" "$dir/.libvgpu.so.new"
  mv -f "$dir/.libvgpu.so.new" "$dir/libvgpu.so"
fi
if [ ! -f "$dir/ld.so.preload" ] || [ -L "$dir/ld.so.preload" ]; then
  rm -f "$dir/ld.so.preload"
  echo "$seen/libvgpu.so" > "$dir/.ld.so.preload.new"
  mv -f "$dir/.ld.so.preload.new" "$dir/ld.so.preload"
fi
for file in "$dir/libvgpu.so" "$dir/ld.so.preload"; do
  if [ ! -f "$file" ] || [ -L "$file" ]; then
    echo "hami-core-installer: $file is not a regular file after installing" >&2
    exit 1
  fi
done
ls -l "$dir"
