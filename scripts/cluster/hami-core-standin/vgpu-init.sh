#!/bin/sh
# STAND-IN for HAMi's /k8s-vgpu/bin/vgpu-init.sh (fake-GPU clusters only, scripts/cluster): copy
# the HAMi-core files of this image into the host directory given as $1.
set -e
dest=${1:?usage: vgpu-init.sh <host HAMi-core dir>/}
mkdir -p "$dest"
for f in /k8s-vgpu/lib/nvidia/*; do
  cp -f "$f" "$dest"
done
