//! Negotiated parameter sets: session-wide and per-connection, with the
//! RFC 7143 / RFC 7145 defaults.

/// The session type declared by the initiator (`SessionType=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionType {
    #[default]
    Normal,
    Discovery,
}

impl SessionType {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionType::Normal => "Normal",
            SessionType::Discovery => "Discovery",
        }
    }
}

/// The transport a connection runs over. iSER changes which keys apply
/// (no digests, RDMAExtensions, Initiator/TargetRecvDataSegmentLength).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportKind {
    #[default]
    Tcp,
    Iser,
}

/// `TaskReporting` (RFC 7143 §13.23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskReporting {
    #[default]
    Rfc3720,
    ResponseFence,
    FastAbort,
}

impl TaskReporting {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskReporting::Rfc3720 => "RFC3720",
            TaskReporting::ResponseFence => "ResponseFence",
            TaskReporting::FastAbort => "FastAbort",
        }
    }

    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "RFC3720" => Some(TaskReporting::Rfc3720),
            "ResponseFence" => Some(TaskReporting::ResponseFence),
            "FastAbort" => Some(TaskReporting::FastAbort),
            _ => None,
        }
    }
}

/// Session-wide parameters, as negotiated on the leading connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParams {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// `None` for a discovery session.
    pub target_name: Option<String>,
    pub target_alias: Option<String>,
    pub target_portal_group_tag: u16,
    pub max_connections: u16,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub max_outstanding_r2t: u16,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
    pub task_reporting: TaskReporting,
    pub iscsi_protocol_level: u8,
    pub rdma_extensions: bool,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams {
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            initiator_alias: None,
            target_name: None,
            target_alias: None,
            target_portal_group_tag: 0,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            task_reporting: TaskReporting::Rfc3720,
            iscsi_protocol_level: 1,
            rdma_extensions: false,
        }
    }
}

/// Default data segment length limit when a side declared nothing.
pub const DEFAULT_DATA_SEGMENT_LENGTH: u32 = 8192;

/// Per-connection parameters.
///
/// The lengths are seen from the side that owns this value: `recv` is what
/// WE declared (the most the peer may send us), `send` is what the PEER
/// declared (the most we may send). 8192 when nothing was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionParams {
    pub header_digest: bool,
    pub data_digest: bool,
    pub max_recv_data_segment_length: u32,
    pub max_send_data_segment_length: u32,
    /// iSER: `InitiatorRecvDataSegmentLength` (the initiator's receive limit).
    pub initiator_recv_data_segment_length: u32,
    /// iSER: `TargetRecvDataSegmentLength` (the target's receive limit).
    pub target_recv_data_segment_length: u32,
    /// iSER: `MaxOutstandingUnexpectedPDUs` we declared (0 = no limit).
    pub max_outstanding_unexpected_pdus_recv: u32,
    /// iSER: `MaxOutstandingUnexpectedPDUs` the peer declared (0 = no limit).
    pub max_outstanding_unexpected_pdus_send: u32,
}

impl Default for ConnectionParams {
    fn default() -> Self {
        ConnectionParams {
            header_digest: false,
            data_digest: false,
            max_recv_data_segment_length: DEFAULT_DATA_SEGMENT_LENGTH,
            max_send_data_segment_length: DEFAULT_DATA_SEGMENT_LENGTH,
            initiator_recv_data_segment_length: DEFAULT_DATA_SEGMENT_LENGTH,
            target_recv_data_segment_length: DEFAULT_DATA_SEGMENT_LENGTH,
            max_outstanding_unexpected_pdus_recv: 0,
            max_outstanding_unexpected_pdus_send: 0,
        }
    }
}

impl ConnectionParams {
    /// The view of the same connection from the other side (recv/send and
    /// the unexpected-PDU limits swapped).
    pub fn mirrored(&self) -> ConnectionParams {
        ConnectionParams {
            max_recv_data_segment_length: self.max_send_data_segment_length,
            max_send_data_segment_length: self.max_recv_data_segment_length,
            max_outstanding_unexpected_pdus_recv: self.max_outstanding_unexpected_pdus_send,
            max_outstanding_unexpected_pdus_send: self.max_outstanding_unexpected_pdus_recv,
            ..*self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_rfc() {
        let s = SessionParams::default();
        assert_eq!(s.max_connections, 1);
        assert!(s.initial_r2t);
        assert!(s.immediate_data);
        assert_eq!(s.max_burst_length, 262_144);
        assert_eq!(s.first_burst_length, 65_536);
        assert_eq!(s.default_time2wait, 2);
        assert_eq!(s.default_time2retain, 20);
        assert_eq!(s.max_outstanding_r2t, 1);
        assert!(s.data_pdu_in_order && s.data_sequence_in_order);
        assert_eq!(s.error_recovery_level, 0);
        let c = ConnectionParams::default();
        assert!(!c.header_digest && !c.data_digest);
        assert_eq!(c.max_recv_data_segment_length, 8192);
        assert_eq!(c.max_send_data_segment_length, 8192);
    }

    #[test]
    fn mirrored_swaps_directions() {
        let c = ConnectionParams {
            max_recv_data_segment_length: 1000,
            max_send_data_segment_length: 2000,
            max_outstanding_unexpected_pdus_recv: 3,
            max_outstanding_unexpected_pdus_send: 4,
            ..Default::default()
        };
        let m = c.mirrored();
        assert_eq!(m.max_recv_data_segment_length, 2000);
        assert_eq!(m.max_send_data_segment_length, 1000);
        assert_eq!(m.max_outstanding_unexpected_pdus_recv, 4);
        assert_eq!(m.mirrored(), c);
    }

    #[test]
    fn names() {
        assert_eq!(
            TaskReporting::from_name("FastAbort"),
            Some(TaskReporting::FastAbort)
        );
        assert_eq!(TaskReporting::from_name("fastabort"), None);
        assert_eq!(SessionType::Discovery.as_str(), "Discovery");
    }
}
