# shellcheck shell=bash
# Builds (or finds in the cache) the test guest: a stock Debian bookworm kernel, siw.ko built out of
# tree (Debian does not ship it), and a minimal rootfs packed with the needed modules as one
# uncompressed cpio initramfs booted with rdinit=/init.
#
# Cache layout, all under $KP_CACHE:
#   debs/                       the kernel .deb (reused while the kernel version stays the same)
#   guest-<kv>-<hash>/          vmlinuz, initrd.cpio, build.log; <hash> covers guest/init,
#                               guest/packages, guest/modules and this file, so editing any of
#                               them rebuilds the guest. Scenario scripts travel over 9p at run
#                               time and never force a rebuild.
# Sourced by run.sh; expects log() and KP_DIR, KP_CACHE.

guest_key() {
  local kv=$1
  local h
  h=$(cat "$KP_DIR/guest/init" "$KP_DIR/guest/packages" "$KP_DIR/guest/modules" \
    "$KP_DIR/lib/build.sh" | sha256sum | cut -c1-12)
  echo "guest-$kv-$h"
}

# list FILE: the words of a list file, comments dropped.
list_words() { sed -e 's/#.*//' "$1" | tr -s ' \n' '\n' | sed '/^$/d'; }

# fetch_kernel KV DIR: the kernel image + modules tree of linux-image-KV, extracted into DIR/kernel.
fetch_kernel() {
  local kv=$1 dir=$2 ver
  ver=$(apt-cache show "linux-image-$kv" | awk '/^Version:/{print $2; exit}')
  mkdir -p "$KP_CACHE/debs"
  local deb="$KP_CACHE/debs/linux-image-${kv}_${ver}_amd64.deb"
  if [[ ! -f $deb ]]; then
    log "downloading linux-image-$kv $ver"
    rm -f "$KP_CACHE"/debs/linux-image-*.deb
    (cd "$KP_CACHE/debs" && apt-get download -qq "linux-image-$kv=$ver") 2>&1 | grep -v unsandboxed || true
  fi
  [[ -f $deb ]] || { log "download of linux-image-$kv failed"; return 1; }
  dpkg-deb -x "$deb" "$dir/kernel"
  echo "$ver" >"$dir/kernel-version"
}

# build_siw KV DIR: siw.ko from linux-source-6.1 of the same Debian version, built against the
# installed linux-headers-KV with CONFIG_RDMA_SIW=m, into DIR/siw.ko.
build_siw() {
  local kv=$1 dir=$2 ver
  ver=$(cat "$dir/kernel-version")
  log "building siw.ko from linux-source ($ver)"
  mkdir -p "$dir/src"
  (cd "$dir/src" && apt-get download -qq "linux-source-6.1=$ver") 2>&1 | grep -v unsandboxed || true
  local deb
  deb=$(find "$dir/src" -maxdepth 1 -name 'linux-source-6.1_*_all.deb' | head -1)
  [[ -n $deb ]] || { log "download of linux-source-6.1=$ver failed"; return 1; }
  mkdir -p "$dir/src/siw"
  dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/src/linux-source-6.1.tar.xz | xz -dc -T2 |
    tar -x -C "$dir/src/siw" --strip-components=5 'linux-source-6.1/drivers/infiniband/sw/siw/'
  rm -f "$deb"
  make -s -C "/lib/modules/$kv/build" M="$dir/src/siw" CONFIG_RDMA_SIW=m modules 2>&1 |
    grep -v 'Skipping BTF' || true
  [[ -f $dir/src/siw/siw.ko ]] || { log "siw.ko build failed"; return 1; }
  strip --strip-debug "$dir/src/siw/siw.ko"
  cp "$dir/src/siw/siw.ko" "$dir/siw.ko"
  rm -rf "$dir/src"
}

# build_rootfs DIR: minimal bookworm rootfs with guest/packages into DIR/rootfs.
build_rootfs() {
  local dir=$1 pkgs
  pkgs=$(list_words "$KP_DIR/guest/packages" | paste -sd, -)
  log "mmdebstrap bookworm rootfs ($pkgs)"
  mmdebstrap --mode=root --variant=minbase --include="$pkgs" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$dir/rootfs" http://deb.debian.org/debian >"$dir/mmdebstrap.log" 2>&1
}

# pack_initrd KV DIR: DIR/rootfs + the listed modules (and their dependencies) + guest/init
# -> DIR/initrd.cpio.
pack_initrd() {
  local kv=$1 dir=$2 root=$2/rootfs mods
  log "packing initramfs"
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/*
  mkdir -p "$dir/kernel/lib/modules/$kv/updates" "$root/lib/modules/$kv"
  cp "$dir/siw.ko" "$dir/kernel/lib/modules/$kv/updates/siw.ko"
  depmod -b "$dir/kernel" "$kv"
  for f in modules.order modules.builtin modules.builtin.modinfo; do
    cp "$dir/kernel/lib/modules/$kv/$f" "$root/lib/modules/$kv/"
  done
  mods=$(list_words "$KP_DIR/guest/modules")
  local m p rel
  for m in $mods; do
    modprobe -d "$dir/kernel" -S "$kv" --show-depends "$m" ||
      { log "module $m not found in the guest kernel"; return 1; }
  done | awk '$1=="insmod"{print $2}' | sort -u | while read -r p; do
    rel=${p#"$dir/kernel/"}
    mkdir -p "$root/$(dirname "$rel")"
    cp "$p" "$root/$rel"
  done
  depmod -b "$root" "$kv"
  install -m 0755 "$KP_DIR/guest/init" "$root/init"
  echo "InitiatorName=iqn.2004-10.org.debian:kernel-peer" >"$root/etc/iscsi/initiatorname.iscsi"
  (cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$dir/initrd.cpio"
  cp "$dir/kernel/boot/vmlinuz-$kv" "$dir/vmlinuz"
}

# build_guest KV: sets GUEST to the cache directory holding vmlinuz + initrd.cpio, building it
# when absent. Kernel download + siw build run alongside mmdebstrap (mostly network and dpkg).
build_guest() {
  local kv=$1 key
  key=$(guest_key "$kv")
  GUEST=$KP_CACHE/$key
  if [[ -f $GUEST/complete ]]; then
    log "guest cached: $key"
    return 0
  fi
  local t0=$SECONDS
  log "building guest $key (cold cache)"
  rm -rf "$GUEST"
  mkdir -p "$GUEST/work"
  local w=$GUEST/work
  build_rootfs "$w" &
  local rootfs_pid=$!
  local ok=1
  { fetch_kernel "$kv" "$w" && build_siw "$kv" "$w"; } || ok=0
  wait "$rootfs_pid" || { log "mmdebstrap failed, see $w/mmdebstrap.log"; tail -20 "$w/mmdebstrap.log" >&2; ok=0; }
  ((ok)) || return 1
  pack_initrd "$kv" "$w" || return 1
  mv "$w/initrd.cpio" "$w/vmlinuz" "$w/mmdebstrap.log" "$GUEST/"
  rm -rf "$w"
  touch "$GUEST/complete"
  # Keep only the current guest: an old one is ~250 MB of nothing useful.
  local old
  for old in "$KP_CACHE"/guest-*; do
    [[ $old == "$GUEST" ]] || rm -rf "$old"
  done
  log "guest built in $((SECONDS - t0)) s: $(du -sh "$GUEST/initrd.cpio" | cut -f1) initramfs"
}
