# Scenario 1 with one-way CHAP: a wrong secret must be refused, the right one logs in and the
# disk gets the full I/O round trip.
KP_DEFAULT_KIND=ironsan
KP_TIMEOUT=240
host_available() { kind_available "$1"; }

guest_main() {
  . /mnt/host/guest/kinit.sh
  kinit_begin chap
  node_set "$PORTAL" "$IQN" node.session.auth.authmethod CHAP
  node_set "$PORTAL" "$IQN" node.session.auth.username "$KP_CHAP_USER"
  node_set "$PORTAL" "$IQN" node.session.auth.password "wrong-$KP_CHAP_SECRET"
  kinit_login_refused "chap, wrong secret"
  node_set "$PORTAL" "$IQN" node.session.auth.password "$KP_CHAP_SECRET"
  kinit_login chap
  kinit_disk_io chap
  kinit_logout
  kinit_end
}
