//! `ironsan target` as a service: its Prometheus endpoint (`--metrics`, config `metrics`),
//! systemd's readiness protocol (`Type=notify`: READY=1 once every portal listens,
//! STOPPING=1 when it shuts down; nothing is sent without `NOTIFY_SOCKET`), and log lines
//! fit for the journal (no colour codes off a terminal, no timestamp of our own where the
//! journal stamps each line).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;

/// Starts the scrape endpoint on `addr` for `target`'s counters, on the current runtime;
/// returns the address bound (port 0 gets a free one).
pub async fn start_metrics(
    addr: SocketAddr,
    target: Arc<iscsi_target::Target>,
) -> anyhow::Result<SocketAddr> {
    let registry = metrics::registry(metrics::TargetCollector::new(target));
    let (bound, server) = metrics::serve(addr, registry)
        .await
        .with_context(|| format!("--metrics {addr}: cannot listen"))?;
    tokio::spawn(server);
    Ok(bound)
}

/// Tells systemd the target serves: every portal is bound and listening (connections wait
/// in the backlog until accepted).
pub fn notify_ready() {
    notify(&[sd_notify::NotifyState::Ready]);
}

/// Tells systemd the target is shutting down.
pub fn notify_stopping() {
    notify(&[sd_notify::NotifyState::Stopping]);
}

fn notify(states: &[sd_notify::NotifyState]) {
    // Without NOTIFY_SOCKET this sends nothing; a failure only costs systemd's patience.
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify systemd ({states:?}): {e}");
    }
}

/// Whether stderr is the journal's stream: `JOURNAL_STREAM` (set by systemd) names its
/// device and inode. The journal stamps each line itself.
pub fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// How log lines look on stderr: (ANSI colours, our own timestamps).
pub fn log_style() -> (bool, bool) {
    let journal = stderr_is_journal();
    (std::io::stderr().is_terminal() && !journal, !journal)
}
