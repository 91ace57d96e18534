# Scenario 1 with mutual CHAP: the initiator must refuse a target that proves the wrong secret,
# then the right pair logs in and the disk gets the full I/O round trip.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=240
host_available() { kind_available "$1"; }

guest_main() {
  . /mnt/host/guest/kinit.sh
  kinit_begin mutual-chap
  node_set "$PORTAL" "$IQN" node.session.auth.authmethod CHAP
  node_set "$PORTAL" "$IQN" node.session.auth.username "$KP_CHAP_USER"
  node_set "$PORTAL" "$IQN" node.session.auth.password "$KP_CHAP_SECRET"
  node_set "$PORTAL" "$IQN" node.session.auth.username_in "$KP_CHAP_TUSER"
  node_set "$PORTAL" "$IQN" node.session.auth.password_in "wrong-$KP_CHAP_TSECRET"
  kinit_login_refused "mutual chap, target proves the wrong secret"
  node_set "$PORTAL" "$IQN" node.session.auth.password_in "$KP_CHAP_TSECRET"
  kinit_login mutual-chap
  kinit_disk_io mutual-chap
  kinit_logout
  kinit_end
}
