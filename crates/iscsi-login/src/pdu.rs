//! Login Request/Response PDUs as the state machines read and write them: the PDU codec's
//! header (`iscsi_wire`, the one definition of their fields) with the data segment that
//! carries the text keys; and the login status codes.

use std::fmt;

use bytes::Bytes;
pub use iscsi_wire::Stage;
use iscsi_wire::{Bhs, Pdu};

/// A Login Request: the codec's header and its data segment.
///
/// A request whose CSG is the reserved code 2, or whose NSG is 2 with T=1,
/// cannot be represented: the codec refuses it, and the runtime answers
/// [`LoginStatus::INITIATOR_ERROR`] (see [`LoginResponse::failure`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginRequest {
    pub header: iscsi_wire::LoginRequest,
    pub data: Vec<u8>,
}

impl LoginRequest {
    /// A received request, for the target's state machine.
    pub fn from_pdu(header: &iscsi_wire::LoginRequest, data: &[u8]) -> LoginRequest {
        LoginRequest {
            header: header.clone(),
            data: data.to_vec(),
        }
    }

    /// The initiator's request as a PDU to send.
    pub fn into_pdu(self) -> Pdu {
        Pdu::new(Bhs::LoginRequest(self.header), Bytes::from(self.data))
    }
}

/// A Login Response: the codec's header and its data segment. The state
/// machine leaves StatSN, ExpCmdSN and MaxCmdSN zero: they are the runtime's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginResponse {
    pub header: iscsi_wire::LoginResponse,
    pub data: Vec<u8>,
}

impl LoginResponse {
    /// A received response, for the initiator's state machine.
    pub fn from_pdu(header: &iscsi_wire::LoginResponse, data: &[u8]) -> LoginResponse {
        LoginResponse {
            header: header.clone(),
            data: data.to_vec(),
        }
    }

    /// The target's response as a PDU, with the sequence numbers only the runtime knows.
    pub fn into_pdu(mut self, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) -> Pdu {
        self.header.stat_sn = stat_sn;
        self.header.exp_cmd_sn = exp_cmd_sn;
        self.header.max_cmd_sn = max_cmd_sn;
        Pdu::new(Bhs::LoginResponse(self.header), Bytes::from(self.data))
    }

    /// A failure response to `req` with the given status and no data:
    /// what a runtime sends before closing the connection (for instance
    /// 0x0206 too many connections or 0x020a unknown TSIH, which only the
    /// runtime can detect).
    pub fn failure(req: &LoginRequest, status: LoginStatus) -> LoginResponse {
        LoginResponse {
            header: iscsi_wire::LoginResponse {
                transit: false,
                cont: false,
                csg: req.header.csg,
                nsg: Stage::Security,
                version_max: SUPPORTED_VERSION,
                version_active: SUPPORTED_VERSION,
                isid: req.header.isid,
                tsih: req.header.tsih,
                itt: req.header.itt,
                stat_sn: 0,
                exp_cmd_sn: 0,
                max_cmd_sn: 0,
                status_class: status.class,
                status_detail: status.detail,
            },
            data: Vec::new(),
        }
    }

    pub fn status(&self) -> LoginStatus {
        LoginStatus::new(self.header.status_class, self.header.status_detail)
    }
}

/// The only iSCSI version there is (RFC 7143: 0x00).
pub const SUPPORTED_VERSION: u8 = 0x00;

/// Login status class and detail (RFC 7143 §11.13.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoginStatus {
    pub class: u8,
    pub detail: u8,
}

impl LoginStatus {
    pub const fn new(class: u8, detail: u8) -> Self {
        LoginStatus { class, detail }
    }
    pub const SUCCESS: LoginStatus = LoginStatus::new(0, 0);
    pub const TARGET_MOVED_TEMPORARILY: LoginStatus = LoginStatus::new(1, 1);
    pub const TARGET_MOVED_PERMANENTLY: LoginStatus = LoginStatus::new(1, 2);
    pub const INITIATOR_ERROR: LoginStatus = LoginStatus::new(2, 0);
    pub const AUTHENTICATION_FAILURE: LoginStatus = LoginStatus::new(2, 1);
    pub const AUTHORIZATION_FAILURE: LoginStatus = LoginStatus::new(2, 2);
    pub const NOT_FOUND: LoginStatus = LoginStatus::new(2, 3);
    pub const TARGET_REMOVED: LoginStatus = LoginStatus::new(2, 4);
    pub const UNSUPPORTED_VERSION: LoginStatus = LoginStatus::new(2, 5);
    pub const TOO_MANY_CONNECTIONS: LoginStatus = LoginStatus::new(2, 6);
    pub const MISSING_PARAMETER: LoginStatus = LoginStatus::new(2, 7);
    pub const CANT_INCLUDE_IN_SESSION: LoginStatus = LoginStatus::new(2, 8);
    pub const SESSION_TYPE_NOT_SUPPORTED: LoginStatus = LoginStatus::new(2, 9);
    pub const SESSION_DOES_NOT_EXIST: LoginStatus = LoginStatus::new(2, 0x0a);
    pub const INVALID_DURING_LOGIN: LoginStatus = LoginStatus::new(2, 0x0b);
    pub const TARGET_ERROR: LoginStatus = LoginStatus::new(3, 0);
    pub const SERVICE_UNAVAILABLE: LoginStatus = LoginStatus::new(3, 1);
    pub const OUT_OF_RESOURCES: LoginStatus = LoginStatus::new(3, 2);

    /// Class and detail as one number, e.g. 0x0201.
    pub fn code(self) -> u16 {
        (u16::from(self.class) << 8) | u16::from(self.detail)
    }

    pub fn is_success(self) -> bool {
        self.class == 0
    }

    /// The RFC name of the status.
    pub fn meaning(self) -> &'static str {
        match (self.class, self.detail) {
            (0, _) => "success",
            (1, 1) => "target moved temporarily",
            (1, 2) => "target moved permanently",
            (1, _) => "target redirected",
            (2, 0) => "initiator error",
            (2, 1) => "authentication failure",
            (2, 2) => "authorization failure",
            (2, 3) => "target not found",
            (2, 4) => "target removed",
            (2, 5) => "unsupported version",
            (2, 6) => "too many connections",
            (2, 7) => "missing parameter",
            (2, 8) => "can't include in session",
            (2, 9) => "session type not supported",
            (2, 0x0a) => "session does not exist",
            (2, 0x0b) => "invalid request during login",
            (2, _) => "initiator error (unknown detail)",
            (3, 0) => "target error",
            (3, 1) => "service unavailable",
            (3, 2) => "out of resources",
            (3, _) => "target error (unknown detail)",
            _ => "unknown status class",
        }
    }

    /// A short hint on what to check for this status.
    pub fn hint(self) -> &'static str {
        match (self.class, self.detail) {
            (1, _) => "follow the TargetAddress the target returned",
            (2, 1) => "check the CHAP user/secret (and the mutual CHAP settings)",
            (2, 2) => "the target's ACL does not allow this initiator name",
            (2, 3) => "check the target name (run discovery to list targets)",
            (2, 4) => "the target no longer exists",
            (2, 5) => "the target does not speak iSCSI version 0",
            (2, 6) => "the session has reached MaxConnections",
            (2, 7) => "the first request lacked InitiatorName or TargetName",
            (2, 9) => "the target does not offer this session type",
            (2, 0x0a) => "the TSIH names no session on the target; log in with TSIH 0",
            (2, _) => "the target refused the request as malformed",
            (3, _) => "the target could not serve the login; retry later",
            _ => "",
        }
    }
}

impl fmt::Display for LoginStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (status 0x{:04x})", self.meaning(), self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_codes() {
        assert_eq!(Stage::from_code(0), Some(Stage::Security));
        assert_eq!(Stage::from_code(1), Some(Stage::Operational));
        assert_eq!(Stage::from_code(2), None);
        assert_eq!(Stage::from_code(3), Some(Stage::FullFeature));
        assert_eq!(Stage::FullFeature.code(), 3);
    }

    #[test]
    fn a_request_survives_both_mappings() {
        let req = LoginRequest {
            header: iscsi_wire::LoginRequest {
                transit: true,
                cont: false,
                csg: Stage::Security,
                nsg: Stage::Operational,
                version_max: 0,
                version_min: 0,
                isid: [0x80, 0, 1, 2, 3, 4],
                tsih: 7,
                itt: 0x1000,
                cid: 1,
                cmd_sn: 5,
                exp_stat_sn: 9,
            },
            data: b"InitiatorName=iqn.x\0".to_vec(),
        };
        let pdu = req.clone().into_pdu();
        let Bhs::LoginRequest(bhs) = &pdu.bhs else {
            panic!("not a login request")
        };
        assert_eq!(LoginRequest::from_pdu(bhs, &pdu.data), req);
    }

    #[test]
    fn a_response_survives_both_mappings() {
        let rsp = LoginResponse {
            header: iscsi_wire::LoginResponse {
                transit: true,
                cont: false,
                csg: Stage::Operational,
                nsg: Stage::FullFeature,
                version_max: 0,
                version_active: 0,
                isid: [0x80, 0, 1, 2, 3, 4],
                tsih: 3,
                itt: 0x1000,
                stat_sn: 1,
                exp_cmd_sn: 2,
                max_cmd_sn: 3,
                status_class: 0,
                status_detail: 0,
            },
            data: b"MaxBurstLength=262144\0".to_vec(),
        };
        let pdu = rsp.clone().into_pdu(1, 2, 3);
        let Bhs::LoginResponse(bhs) = &pdu.bhs else {
            panic!("not a login response")
        };
        assert_eq!((bhs.stat_sn, bhs.exp_cmd_sn, bhs.max_cmd_sn), (1, 2, 3));
        assert_eq!(LoginResponse::from_pdu(bhs, &pdu.data), rsp);
    }

    #[test]
    fn status_text() {
        assert_eq!(LoginStatus::AUTHENTICATION_FAILURE.code(), 0x0201);
        assert_eq!(
            LoginStatus::AUTHENTICATION_FAILURE.to_string(),
            "authentication failure (status 0x0201)"
        );
        assert_eq!(
            LoginStatus::new(2, 0x0a).meaning(),
            "session does not exist"
        );
        assert!(LoginStatus::SUCCESS.is_success());
    }
}
