//! ErrorRecoveryLevel 1 on the target, the iSCSI layer's part: answering SNACKs as the
//! session core decides (`session::core::snack`). A Status SNACK resends retained status
//! with its StatSN; a Data/R2T SNACK has the datamover resend a read's Data-In or a write's
//! outstanding R2Ts; after a DataACK the Data-In before it are not sent again; an R-Data
//! SNACK (after the initiator changed its MaxRecvDataSegmentLength) has them resent cut
//! anew, then the status with its tag. A SNACK for what was never sent or is already
//! acknowledged gets a Reject (Protocol Error), and any SNACK in a session at level 0 a
//! Reject (SNACK Reject). Which runs a SNACK covers is decided by `iscsi_session::erl1`;
//! discarding PDUs with digest errors and recovery R2Ts for lost write data are the
//! datamover's (decided by `iscsi_session::write`).

use crate::session::core::{self, SnackPlan};
use crate::session::{Conn, Session};
use datamover::{DmError, RecoveryCounters};
use iscsi_session::erl1::snack_type;
use iscsi_wire::SnackRequest;

impl Session {
    /// Answers a SNACK Request received on `conn` (`raw`: its header, for a Reject).
    pub(crate) async fn snack(&self, conn: &Conn, s: &SnackRequest, raw: [u8; 48]) {
        let plan = core::snack(s, self.params.error_recovery_level);
        if self.params.error_recovery_level > 0 {
            let counter = match s.snack_type {
                snack_type::STATUS => Some(&conn.recovery.status_snacks),
                snack_type::DATA_R2T | snack_type::R_DATA => Some(&conn.recovery.data_snacks),
                snack_type::DATA_ACK => Some(&conn.recovery.data_acks),
                _ => None,
            };
            if let Some(counter) = counter {
                RecoveryCounters::bump(counter);
            }
        }
        let refused = match plan {
            SnackPlan::Reject { .. } => Some(plan),
            SnackPlan::Status => self.status_snack(conn, s).await,
            SnackPlan::DataR2t {
                itt,
                beg_run,
                run_length,
            } => match conn.dm.resend_data(itt, beg_run, run_length).await {
                Ok(()) => {
                    tracing::info!(
                        peer = %conn.peer,
                        "Data/R2T SNACK for ITT 0x{itt:08x}: resent from {beg_run} ({run_length} asked, 0: all)",
                    );
                    None
                }
                Err(DmError::NotRetained(why)) => Some(core::data_snack_refused(s, &why)),
                Err(_) => None, // the connection is going
            },
            SnackPlan::DataAck { ttt, beg_run } => {
                conn.dm.data_acked(ttt, beg_run);
                None
            }
            SnackPlan::RData { itt, tag } => match conn.dm.resegment_data(itt, tag).await {
                Ok(()) => {
                    tracing::info!(
                        peer = %conn.peer,
                        "R-Data SNACK for ITT 0x{itt:08x}: its Data-In resent for a {}-byte \
                         MaxRecvDataSegmentLength, then its status with SNACK Tag 0x{tag:08x}",
                        conn.max_send()
                    );
                    None
                }
                Err(DmError::NotRetained(why)) => {
                    Some(core::snack_refused(format!("R-Data SNACK refused: {why}")))
                }
                Err(_) => None, // the connection is going
            },
        };
        if let Some(SnackPlan::Reject {
            reason,
            data_sn,
            why,
        }) = refused
        {
            conn.reject_run(reason, raw, data_sn, &why).await
        }
    }

    /// Resends the retained status the SNACK asks for, each with its own StatSN; the Reject
    /// when it cannot.
    async fn status_snack(&self, conn: &Conn, s: &SnackRequest) -> Option<SnackPlan> {
        let pdus = {
            let status = conn.status.lock().expect("status");
            core::status_run(s, status.first_retained(), status.next(), |sn| {
                status.retained(sn).cloned()
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
                        break;
                    }
                }
                None
            }
            Err(why) => Some(core::snack_refused(why)),
        }
    }
}
