#!/usr/bin/env bash
# Installs the host packages the kernel-peer stage needs (idempotent, quiet when present):
# qemu to boot the guest, mmdebstrap to build its rootfs, the headers of the GUEST kernel
# (siw.ko is built out of tree against them), and the host-side peers (tgtd, libiscsi tools,
# qemu-img with its libiscsi block driver).
# The guest kernel version is whatever bookworm's linux-image-amd64 points at; it is printed on
# stdout (last line) so the driver does not have to ask apt twice.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cache=${KP_CACHE:?KP_CACHE must name the cache directory}
mkdir -p "$cache"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -c "install ok installed" >/dev/null; }

# One apt-get update per cache lifetime is enough to resolve the guest kernel's ABI name.
if [[ ! -f "$cache/apt-updated" ]] || ! apt-cache show linux-image-amd64 >/dev/null 2>&1; then
  apt-get update -qq
  touch "$cache/apt-updated"
fi
kv=$(apt-cache depends linux-image-amd64 2>/dev/null |
  awk '/Depends: linux-image-[0-9]/{sub("linux-image-","",$2); print $2; exit}')
[[ -n "$kv" ]] || { echo "cannot resolve the kernel behind linux-image-amd64" >&2; exit 1; }

packages=(
  qemu-system-x86 qemu-utils qemu-block-extra mmdebstrap cpio kmod xz-utils binutils make
  "linux-headers-$kv"
  tgt libiscsi-bin tcpdump tshark iproute2 python3
)
missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "kernel-peer: installing ${missing[*]}" >&2
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "$kv"
