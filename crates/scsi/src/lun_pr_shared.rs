//! The LUN's side of shared persistent reservations ([`crate::pr_shared`]): taking a record
//! read from the shared blob as the LUN's state (raising the unit attentions it logged for
//! this gateway's nexuses), the refresh before a command's reservation check, and
//! PERSISTENT RESERVE IN/OUT against the record.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use crate::command::{Command, NexusId};
use crate::lun::{DeviceView, Lun};
use crate::outcome::Fail;
use crate::pr::{Notice, PrState};
use crate::pr_shared::{Record, Seen, SharedPr, MAX_TRIES, NEVER};
use crate::sense::{asc, key, Sense};
use crate::status;

/// A LUN's persistent reservations when they live in a shared record.
impl Lun {
    /// Takes `rec` (at `version`) as the cached state and raises the unit attentions it
    /// logged since `seen` for this gateway's nexuses.
    fn adopt(&self, rec: &Record, version: u64, seen: &mut Seen, dev: &dyn DeviceView) {
        if seen.version == NEVER {
            // The first read of a record not read at start: what it logged is the past.
            seen.seq = rec.seq;
        }
        let fresh: Vec<&Notice> = rec
            .log
            .iter()
            .filter(|(seq, _)| *seq > seen.seq)
            .map(|(_, n)| n)
            .collect();
        if rec
            .log
            .front()
            .is_some_and(|(first, _)| *first > seen.seq + 1)
        {
            tracing::warn!(
                lun = self.id,
                "persistent reservations: unit attentions logged by other gateways were dropped before this one saw them"
            );
        }
        let mut st = self.state();
        if !fresh.is_empty() {
            let rtp = dev.relative_port();
            let nexuses = dev.known_nexus_ports();
            for n in fresh {
                let targets: Vec<NexusId> = nexuses
                    .iter()
                    .filter(|(_, p)| n.reaches(p, rtp))
                    .map(|(id, _)| *id)
                    .collect();
                self.raise_ua(&mut st, &targets, None, n.code);
            }
        }
        st.pr = PrState {
            ptpl_capable: true,
            ..rec.pr.clone()
        };
        self.refresh(&st);
        drop(st);
        *seen = Seen {
            version,
            seq: rec.seq.max(seen.seq),
        };
        if let Some(sh) = &self.shared_pr {
            sh.mark_refreshed();
        }
    }

    /// Reads the shared record again when [`SharedPr::due`] (one reader at a time; the
    /// others wait for it). A record that cannot be read leaves the cached copy in force,
    /// and is tried again after [`REFRESH`].
    pub(crate) async fn refresh_shared(&self, dev: &dyn DeviceView) {
        let Some(sh) = &self.shared_pr else { return };
        let mut seen = sh.seen.lock().await;
        if !sh.due() {
            return;
        }
        let read = sh.read().await;
        let failing = read.is_err();
        match read {
            Ok((version, rec)) if version != seen.version => {
                self.adopt(&rec, version, &mut seen, dev)
            }
            Ok(_) => sh.mark_refreshed(),
            Err(e) => {
                sh.mark_refreshed();
                if !sh.failing.load(Ordering::Relaxed) {
                    tracing::warn!(
                        lun = self.id,
                        "{e}; the reservations last read stay in force"
                    );
                }
            }
        }
        if sh.failing.swap(failing, Ordering::Relaxed) && !failing {
            tracing::info!(
                lun = self.id,
                "persistent reservations: the record reads again"
            );
        }
    }

    /// PERSISTENT RESERVE IN from the record as it is now.
    pub(crate) async fn pr_in_shared(
        &self,
        sh: &SharedPr,
        dev: &dyn DeviceView,
        cdb: &[u8],
    ) -> Result<Vec<u8>, Fail> {
        let mut seen = sh.seen.lock().await;
        let (version, rec) = sh.read().await.map_err(|e| self.store_failed(e))?;
        self.adopt(&rec, version, &mut seen, dev);
        PrState {
            ptpl_capable: true,
            ..rec.pr
        }
        .pr_in(cdb)
    }

    /// PERSISTENT RESERVE OUT: read, apply, compare-and-write, again on a lost race.
    pub(crate) async fn pr_out_shared(
        &self,
        sh: &SharedPr,
        dev: &dyn DeviceView,
        cmd: &Command,
        port: &Arc<str>,
        rtp: u16,
        tid: &Bytes,
    ) -> Result<(), Fail> {
        let mut seen = sh.seen.lock().await;
        for _ in 0..MAX_TRIES {
            let (version, mut rec) = sh.read().await.map_err(|e| self.store_failed(e))?;
            self.adopt(&rec, version, &mut seen, dev);
            let before = rec.pr.clone();
            rec.pr.ptpl_capable = true;
            let notices = rec.pr.pr_out(&cmd.cdb, &cmd.data_out, port, rtp, tid)?;
            rec.pr.ptpl_capable = false;
            if rec.pr == before {
                return Ok(());
            }
            rec.log_notices(notices);
            match sh.write(version, &rec).await {
                Ok(Some(next)) => {
                    // This gateway's nexuses hear of the change now.
                    self.adopt(&rec, next, &mut seen, dev);
                    return Ok(());
                }
                Ok(None) => continue,
                Err(e) => return Err(self.store_failed(e)),
            }
        }
        tracing::warn!(
            lun = self.id,
            "persistent reservations: {MAX_TRIES} writes lost to other gateways in a row"
        );
        Err(Fail::Status(status::BUSY))
    }

    /// The answer when the shared record cannot be read or written.
    fn store_failed(&self, e: String) -> Fail {
        tracing::warn!(lun = self.id, "{e}");
        Fail::Check(Sense::new(
            key::HARDWARE_ERROR,
            asc::INTERNAL_TARGET_FAILURE,
        ))
    }
}
