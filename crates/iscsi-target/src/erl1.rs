//! ErrorRecoveryLevel 1 on the target, the iSCSI layer's part: answering SNACKs. A Status
//! SNACK resends retained status with its StatSN; a Data/R2T SNACK has the datamover resend
//! a read's Data-In or a write's outstanding R2Ts; after a DataACK the Data-In before it are
//! not sent again; an R-Data SNACK (after the initiator changed its
//! MaxRecvDataSegmentLength) has them resent cut anew, then the status with its tag. A
//! SNACK for what was never sent or is already acknowledged gets a Reject (Protocol
//! Error), and any SNACK in a session at level 0 a Reject (SNACK Reject). Which
//! runs a SNACK covers is decided by `iscsi_session::erl1`; discarding PDUs with digest
//! errors and recovery R2Ts for lost write data are the datamover's (decided by
//! `iscsi_session::write`).

use crate::session::{Conn, Session};
use datamover::{DmError, RecoveryCounters};
use iscsi_session::erl1::{snack_run, snack_type};
use iscsi_wire::{reject, SnackRequest};

impl Session {
    /// Answers a SNACK Request received on `conn` (`raw`: its header, for a Reject).
    pub(crate) async fn snack(&self, conn: &Conn, s: &SnackRequest, raw: [u8; 48]) {
        if self.params.error_recovery_level == 0 {
            let why = "SNACK needs ErrorRecoveryLevel > 0";
            return conn.reject(reject::SNACK_REJECT, raw, why).await;
        }
        match s.snack_type {
            snack_type::STATUS => self.status_snack(conn, s, raw).await,
            snack_type::DATA_R2T => {
                RecoveryCounters::bump(&conn.recovery.data_snacks);
                match conn.dm.resend_data(s.itt, s.beg_run, s.run_length).await {
                    Ok(()) => tracing::info!(
                        peer = %conn.peer,
                        "Data/R2T SNACK for ITT 0x{:08x}: resent from {} ({} asked, 0: all)",
                        s.itt, s.beg_run, s.run_length
                    ),
                    Err(DmError::NotRetained(why)) => {
                        let why = format!("Data/R2T SNACK refused: {why}");
                        conn.reject_run(reject::PROTOCOL_ERROR, raw, s.beg_run, &why)
                            .await
                    }
                    Err(_) => {} // the connection is going
                }
            }
            // The answer to an A bit: Data-In before BegRun need not be kept any more.
            snack_type::DATA_ACK => {
                RecoveryCounters::bump(&conn.recovery.data_acks);
                conn.dm.data_acked(s.ttt, s.beg_run);
            }
            snack_type::R_DATA => self.r_data_snack(conn, s, raw).await,
            other => {
                let why = format!("unknown SNACK type {other}");
                conn.reject(reject::SNACK_REJECT, raw, &why).await
            }
        }
    }

    /// An R-Data SNACK (the initiator's MaxRecvDataSegmentLength changed): the read's
    /// unacknowledged Data-In again, cut anew, then its status with the SNACK's tag (its
    /// TTT field). BegRun and RunLength must be 0: it always asks for all of them.
    async fn r_data_snack(&self, conn: &Conn, s: &SnackRequest, raw: [u8; 48]) {
        RecoveryCounters::bump(&conn.recovery.data_snacks);
        if s.beg_run != 0 || s.run_length != 0 {
            let why = format!(
                "R-Data SNACK with BegRun {} and RunLength {} (both must be 0)",
                s.beg_run, s.run_length
            );
            return conn.reject(reject::PROTOCOL_ERROR, raw, &why).await;
        }
        match conn.dm.resegment_data(s.itt, s.ttt).await {
            Ok(()) => tracing::info!(
                peer = %conn.peer,
                "R-Data SNACK for ITT 0x{:08x}: its Data-In resent for a {}-byte \
                 MaxRecvDataSegmentLength, then its status with SNACK Tag 0x{:08x}",
                s.itt, conn.max_send(), s.ttt
            ),
            Err(DmError::NotRetained(why)) => {
                let why = format!("R-Data SNACK refused: {why}");
                conn.reject(reject::PROTOCOL_ERROR, raw, &why).await
            }
            Err(_) => {} // the connection is going
        }
    }

    /// Resends the retained status the SNACK asks for, each with its own StatSN.
    async fn status_snack(&self, conn: &Conn, s: &SnackRequest, raw: [u8; 48]) {
        RecoveryCounters::bump(&conn.recovery.status_snacks);
        let pdus = {
            let status = conn.status.lock().expect("status");
            snack_run(
                s.beg_run,
                s.run_length,
                status.first_retained(),
                status.next(),
            )
            .map_err(|e| e.to_string())
            .and_then(|run| {
                run.map(|sn| {
                    status
                        .retained(sn)
                        .cloned()
                        .ok_or_else(|| format!("StatSN {sn} is no longer retained"))
                })
                .collect::<Result<Vec<_>, _>>()
            })
        };
        match pdus {
            Ok(pdus) => {
                tracing::info!(
                    peer = %conn.peer,
                    "Status SNACK: {} status PDU(s) resent from StatSN {}",
                    pdus.len(),
                    s.beg_run
                );
                for pdu in pdus {
                    if conn.dm.resend_status(pdu).await.is_err() {
                        return;
                    }
                }
            }
            Err(why) => {
                let why = format!("Status SNACK refused: {why}");
                conn.reject(reject::PROTOCOL_ERROR, raw, &why).await
            }
        }
    }
}
