//! Login PDUs between their wire form (`iscsi_wire`) and the sans-IO login state machines'
//! form (`iscsi_login`), for both roles and every transport: one mapping, not one per role.

use bytes::Bytes;
use iscsi_login::pdu::{LoginRequest, LoginResponse, Stage as LoginStage};
use iscsi_wire::{Bhs, Pdu, Stage};

/// Login and text PDUs longer than this are refused (the RFC default
/// MaxRecvDataSegmentLength is 8 KiB; continuation carries longer text).
pub const LOGIN_MAX_DATA: u32 = 64 * 1024;

fn stage_in(s: Stage) -> LoginStage {
    match s {
        Stage::Security => LoginStage::Security,
        Stage::Operational => LoginStage::Operational,
        Stage::FullFeature => LoginStage::FullFeature,
    }
}

fn stage_out(s: LoginStage) -> Stage {
    match s {
        LoginStage::Security => Stage::Security,
        LoginStage::Operational => Stage::Operational,
        LoginStage::FullFeature => Stage::FullFeature,
    }
}

/// A received Login Request header and data, for the target's login state machine.
pub fn request_in(bhs: &iscsi_wire::LoginRequest, data: &[u8]) -> LoginRequest {
    LoginRequest {
        transit: bhs.transit,
        cont: bhs.cont,
        csg: stage_in(bhs.csg),
        nsg: stage_in(bhs.nsg),
        version_max: bhs.version_max,
        version_min: bhs.version_min,
        isid: bhs.isid,
        tsih: bhs.tsih,
        itt: bhs.itt,
        cid: bhs.cid,
        cmd_sn: bhs.cmd_sn,
        exp_stat_sn: bhs.exp_stat_sn,
        data: data.to_vec(),
    }
}

/// The initiator's login request as a PDU to send.
pub fn request_out(r: &LoginRequest) -> Pdu {
    let bhs = Bhs::LoginRequest(iscsi_wire::LoginRequest {
        transit: r.transit,
        cont: r.cont,
        csg: stage_out(r.csg),
        nsg: stage_out(r.nsg),
        version_max: r.version_max,
        version_min: r.version_min,
        isid: r.isid,
        tsih: r.tsih,
        itt: r.itt,
        cid: r.cid,
        cmd_sn: r.cmd_sn,
        exp_stat_sn: r.exp_stat_sn,
    });
    Pdu::new(bhs, Bytes::from(r.data.clone()))
}

/// A received Login Response header and data, for the initiator's login state machine.
pub fn response_in(bhs: &iscsi_wire::LoginResponse, data: &[u8]) -> LoginResponse {
    LoginResponse {
        transit: bhs.transit,
        cont: bhs.cont,
        csg: stage_in(bhs.csg),
        nsg: stage_in(bhs.nsg),
        version_max: bhs.version_max,
        version_active: bhs.version_active,
        isid: bhs.isid,
        tsih: bhs.tsih,
        itt: bhs.itt,
        stat_sn: bhs.stat_sn,
        status_class: bhs.status_class,
        status_detail: bhs.status_detail,
        data: data.to_vec(),
    }
}

/// The target's login response as a PDU, with the sequence numbers only the runtime knows.
pub fn response_out(r: &LoginResponse, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) -> Pdu {
    let bhs = Bhs::LoginResponse(iscsi_wire::LoginResponse {
        transit: r.transit,
        cont: r.cont,
        csg: stage_out(r.csg),
        nsg: stage_out(r.nsg),
        version_max: r.version_max,
        version_active: r.version_active,
        isid: r.isid,
        tsih: r.tsih,
        itt: r.itt,
        stat_sn,
        exp_cmd_sn,
        max_cmd_sn,
        status_class: r.status_class,
        status_detail: r.status_detail,
    });
    Pdu::new(bhs, Bytes::from(r.data.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_survives_both_mappings() {
        let req = LoginRequest {
            transit: true,
            cont: false,
            csg: LoginStage::Security,
            nsg: LoginStage::Operational,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 1, 2, 3, 4],
            tsih: 7,
            itt: 0x1000,
            cid: 1,
            cmd_sn: 5,
            exp_stat_sn: 9,
            data: b"InitiatorName=iqn.x\0".to_vec(),
        };
        let pdu = request_out(&req);
        let Bhs::LoginRequest(bhs) = &pdu.bhs else {
            panic!("not a login request")
        };
        assert_eq!(request_in(bhs, &pdu.data), req);
    }

    #[test]
    fn a_response_survives_both_mappings() {
        let rsp = LoginResponse {
            transit: true,
            cont: false,
            csg: LoginStage::Operational,
            nsg: LoginStage::FullFeature,
            version_max: 0,
            version_active: 0,
            isid: [0x80, 0, 1, 2, 3, 4],
            tsih: 3,
            itt: 0x1000,
            stat_sn: 1,
            status_class: 0,
            status_detail: 0,
            data: b"MaxBurstLength=262144\0".to_vec(),
        };
        let pdu = response_out(&rsp, 1, 2, 3);
        let Bhs::LoginResponse(bhs) = &pdu.bhs else {
            panic!("not a login response")
        };
        assert_eq!((bhs.stat_sn, bhs.exp_cmd_sn, bhs.max_cmd_sn), (1, 2, 3));
        assert_eq!(response_in(bhs, &pdu.data), rsp);
    }
}
