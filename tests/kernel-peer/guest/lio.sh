# Guest side shared by the lio-iser* scenarios: the kernel's LIO target with ib_isert over siw.

# lio_iser_target IQN IP: a 64 MiB fileio LUN of random data (/tmp/lio.img, its hash in SHA)
# served by LIO as IQN on an iSER-only portal IP:3260. LIO cannot listen for TCP and iSER on one
# address:port over iWARP (siw listens with a real kernel TCP socket), so its TCP network portal
# is parked in a throw-away network namespace (the kvm-interop recipe).
lio_iser_target() {
  for m in siw rdma_ucm ib_uverbs ib_isert configfs target_core_mod target_core_file iscsi_target_mod; do
    check "modprobe $m" modprobe $m
  done
  rdma link show siw0/1 >/dev/null 2>&1 || check "siw0 on eth0" rdma link add siw0 type siw netdev eth0
  # targetcli-fb asks D-Bus for tcmu-runner (one daemon for every scenario of the boot).
  [ -e /run/dbus/pid ] || { mkdir -p /run/dbus && dbus-daemon --system --fork; }
  step "backing file with random data"
  dd if=/dev/urandom of=/tmp/lio.img bs=1M count=64 2>/dev/null
  SHA=$(sha256sum /tmp/lio.img | cut -d' ' -f1)
  echo "  sha256 $SHA"
  step "LIO: fileio LUN, demo-mode ACLs, iSER-only portal $2:3260"
  targetcli set global auto_save_on_exit=false auto_add_default_portal=false >/dev/null
  targetcli /backstores/fileio create name=kp0 file_or_dev=/tmp/lio.img size=64M write_back=false &&
    targetcli /iscsi create "$1" &&
    targetcli "/iscsi/$1/tpg1/luns" create /backstores/fileio/kp0 &&
    targetcli "/iscsi/$1/tpg1" set attribute authentication=0 demo_mode_write_protect=0 \
      generate_node_acls=1 cache_dynamic_acls=1 >/dev/null
  check "LIO configured" test $? -eq 0
  tpg=/sys/kernel/config/target/iscsi/$1/tpgt_1
  ip netns add jail
  ip netns exec jail sysctl -q -w net.ipv4.ip_nonlocal_bind=1
  check "TCP network portal parked in a network namespace" nsenter --net=/run/netns/jail mkdir "$tpg/np/$2:3260"
  check "iSER enabled on $2:3260" sh -c "echo 1 >$tpg/np/$2:3260/iser"
}

# lio_backing_has LABEL OFFSET_MIB LEN_MIB SHA: that region of LIO's backing file hashes to SHA.
lio_backing_has() {
  got=$(dd if=/tmp/lio.img bs=1M skip="$2" count="$3" 2>/dev/null | sha256sum | cut -d' ' -f1)
  check "$1: backing file [$2 MiB, +$3 MiB) holds the initiator's bytes" test "$got" = "$4"
}

# lio_isert_clean: LIO's kernel log shows no isert error ("non-page aligned", "unexpected
# solicited", failed completions).
lio_isert_clean() {
  dmesg | grep -i -E 'isert|iser|siw' | tail -8 | sed 's/^/  dmesg| /'
  check "no isert error in the kernel log" sh -c \
    "! dmesg | grep -v 'Modules linked in:' | grep -i -E 'isert.*(err|fail|non-page|unexpected|bogus)|non-page aligned|unexpected solicited'"
}

# lio_auth MODE: the TPG's demo-mode authentication, written straight to configfs (targetcli
# costs seconds of Python start-up per call under TCG). MODE: none | chap | mutual-chap.
lio_auth() {
  tpg=/sys/kernel/config/target/iscsi/$IQN/tpgt_1
  case $1 in
    none)
      echo 0 >"$tpg/attrib/authentication"
      for f in userid password userid_mutual password_mutual; do printf NULL >"$tpg/auth/$f"; done
      ;;
    chap | mutual-chap)
      # printf, not echo: LIO keeps a trailing newline as part of the value.
      printf %s "$KP_CHAP_USER" >"$tpg/auth/userid"
      printf %s "$KP_CHAP_SECRET" >"$tpg/auth/password"
      if [ "$1" = mutual-chap ]; then
        printf %s "$KP_CHAP_TUSER" >"$tpg/auth/userid_mutual"
        printf %s "$KP_CHAP_TSECRET" >"$tpg/auth/password_mutual"
      fi
      echo 1 >"$tpg/attrib/authentication"
      ;;
  esac
}

lio_clear() {
  targetcli clearconfig confirm=True >/dev/null 2>&1
  ip netns del jail 2>/dev/null
}
