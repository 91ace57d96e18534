//! Initiator side of the login phase: [`InitiatorLogin`] builds each Login
//! Request and checks each Login Response until full feature phase.
//!
//! Without CHAP the first request goes straight to the operational stage
//! (names plus every operational offer, T=1 to full feature phase), as
//! libiscsi does. With CHAP it starts in the security stage offering
//! `AuthMethod=CHAP,None` (only `CHAP` when mutual CHAP is configured, so
//! a target cannot downgrade it).

use std::fmt;

use crate::chap::{self, ChapAlgorithm, ChapCredentials, Entropy};
use crate::keys::{self, Negotiation, IRRELEVANT, NOT_UNDERSTOOD, REJECT};
use crate::params::{
    ConnectionParams, SessionParams, SessionType, TaskReporting, TransportKind,
    DEFAULT_DATA_SEGMENT_LENGTH,
};
use crate::pdu::{LoginRequest, LoginResponse, LoginStatus, Stage, SUPPORTED_VERSION};
use crate::text::{self, TextError};

/// How the initiator authenticates.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum InitiatorAuth {
    #[default]
    None,
    Chap {
        credentials: ChapCredentials,
        /// Set to require the target to prove itself too.
        mutual: Option<ChapCredentials>,
        /// CHAP_A offer in preference order, e.g. `[Sha256, Md5]`.
        algorithms: Vec<ChapAlgorithm>,
    },
}

/// What the initiator offers for a digest key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DigestPreference {
    #[default]
    None,
    Crc32c,
    /// `CRC32C,None`
    PreferCrc32c,
    /// `None,CRC32C`
    PreferNone,
}

impl DigestPreference {
    fn offer(self) -> &'static str {
        match self {
            DigestPreference::None => "None",
            DigestPreference::Crc32c => "CRC32C",
            DigestPreference::PreferCrc32c => "CRC32C,None",
            DigestPreference::PreferNone => "None,CRC32C",
        }
    }
}

/// Session parameters the initiator asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredSession {
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub max_connections: u16,
    pub max_outstanding_r2t: u16,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    /// Highest ErrorRecoveryLevel offered (iSCSI/TCP; iSER always offers 0).
    pub error_recovery_level: u8,
}

impl Default for DesiredSession {
    fn default() -> Self {
        DesiredSession {
            immediate_data: true,
            initial_r2t: false,
            max_burst_length: 1_048_576,
            first_burst_length: 262_144,
            max_connections: 1,
            max_outstanding_r2t: 1,
            default_time2wait: 2,
            default_time2retain: 20,
            error_recovery_level: 0,
        }
    }
}

/// iSER: the TargetRecvDataSegmentLength an initiator offers (Linux ib_iser's value; LIO
/// declares the same, and takes the offer as what it may receive: offering more would have it
/// accept Sends its receive buffers cannot hold).
pub const ISER_TARGET_RECV_DATA: u32 = 8192;

/// iSER: the most data ironsan's initiator puts in one Send (what its send buffers hold): a
/// target that declares a larger TargetRecvDataSegmentLength is sent no more than this.
pub const ISER_SEND_DATA_MAX: u32 = 16_384;

/// Everything an [`InitiatorLogin`] needs.
#[derive(Debug, Clone)]
pub struct InitiatorLoginConfig {
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// `None` for a discovery session.
    pub target_name: Option<String>,
    pub isid: [u8; 6],
    /// 0 for a new session; the session's TSIH to add a connection.
    pub tsih: u16,
    pub cid: u16,
    pub cmd_sn: u32,
    /// ExpStatSN of the first Login Request: when the login restarts a connection (its CID
    /// logged in again after it failed), the old connection's ExpStatSN, which acknowledges
    /// its statuses (RFC 7143 §11.12.8); otherwise 0. Later requests acknowledge the Login
    /// Responses.
    pub exp_stat_sn: u32,
    /// ITT of the login task.
    pub itt: u32,
    pub auth: InitiatorAuth,
    pub header_digest: DigestPreference,
    pub data_digest: DigestPreference,
    /// Declared as MaxRecvDataSegmentLength (or, over iSER,
    /// InitiatorRecvDataSegmentLength).
    pub max_recv_data_segment_length: u32,
    pub session: DesiredSession,
    pub transport: TransportKind,
}

impl InitiatorLoginConfig {
    /// A config with defaults for everything but the names.
    pub fn new(initiator_name: impl Into<String>, target_name: Option<String>) -> Self {
        InitiatorLoginConfig {
            initiator_name: initiator_name.into(),
            initiator_alias: None,
            target_name,
            isid: [0x80, 0, 0, 0, 0, 1],
            tsih: 0,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
            itt: 0,
            auth: InitiatorAuth::None,
            header_digest: DigestPreference::None,
            data_digest: DigestPreference::None,
            max_recv_data_segment_length: 262_144,
            session: DesiredSession::default(),
            transport: TransportKind::Tcp,
        }
    }
}

/// Why a login failed on the initiator side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginError {
    /// The target answered with a non-zero status.
    Rejected {
        status: LoginStatus,
        /// `TargetAddress` of a redirection (class 1).
        target_address: Option<String>,
    },
    /// The target broke the protocol (bad flags, values, stage order...).
    Protocol(String),
    /// The target's text data could not be decoded.
    BadText(TextError),
    /// Mutual CHAP: the target did not prove it knows the secret.
    MutualChapFailed(String),
}

impl fmt::Display for LoginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoginError::Rejected {
                status,
                target_address,
            } => {
                write!(f, "login failed: {status}")?;
                let hint = status.hint();
                if !hint.is_empty() {
                    write!(f, ": {hint}")?;
                }
                if let Some(a) = target_address {
                    write!(f, " ({a})")?;
                }
                Ok(())
            }
            LoginError::Protocol(m) => write!(f, "login failed: target protocol error: {m}"),
            LoginError::BadText(e) => write!(f, "login failed: bad text data from target: {e}"),
            LoginError::MutualChapFailed(m) => write!(
                f,
                "login failed: mutual CHAP: the target did not authenticate ({m}); check the target's CHAP user/secret"
            ),
        }
    }
}

impl std::error::Error for LoginError {}

/// What to do after a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitiatorStep {
    Send(LoginRequest),
    Complete {
        tsih: u16,
        session: SessionParams,
        connection: ConnectionParams,
        target_portal_group_tag: Option<u16>,
    },
}

enum ChapPhase {
    /// AuthMethod offered, waiting for the target's choice.
    Offered,
    /// CHAP_A sent.
    AlgorithmSent,
    /// CHAP_N/CHAP_R sent; for mutual CHAP our challenge is pending.
    ResponseSent {
        mutual: Option<(ChapAlgorithm, u8, Vec<u8>)>,
    },
    /// Done (or mutual verified).
    Done,
}

const MAX_EXCHANGES: u32 = 64;

/// Initiator-side login state machine for one connection.
pub struct InitiatorLogin {
    config: InitiatorLoginConfig,
    stage: Stage,
    chap: ChapPhase,
    ops_offered: bool,
    offered: Vec<(String, String)>,
    response_buffer: Vec<u8>,
    session: SessionParams,
    connection: ConnectionParams,
    tpgt: Option<u16>,
    exchanges: u32,
    last_transit: bool,
    last_nsg: Stage,
    peer_declared_recv: bool,
    /// The next request's ExpStatSN.
    exp_stat_sn: u32,
}

fn protocol(m: impl Into<String>) -> LoginError {
    LoginError::Protocol(m.into())
}

impl InitiatorLogin {
    pub fn new(config: InitiatorLoginConfig) -> Self {
        let mut session = SessionParams {
            initiator_name: config.initiator_name.clone(),
            initiator_alias: config.initiator_alias.clone(),
            target_name: config.target_name.clone(),
            session_type: if config.target_name.is_some() {
                SessionType::Normal
            } else {
                SessionType::Discovery
            },
            ..SessionParams::default()
        };
        session.rdma_extensions = false;
        InitiatorLogin {
            stage: Stage::Security,
            chap: ChapPhase::Offered,
            ops_offered: false,
            offered: Vec::new(),
            response_buffer: Vec::new(),
            session,
            connection: ConnectionParams::default(),
            tpgt: None,
            exchanges: 0,
            last_transit: false,
            last_nsg: Stage::Security,
            exp_stat_sn: config.exp_stat_sn,
            peer_declared_recv: false,
            config,
        }
    }

    fn leading(&self) -> bool {
        self.config.tsih == 0
    }

    fn request(&mut self, transit: bool, nsg: Stage, pairs: &[(String, String)]) -> LoginRequest {
        self.last_transit = transit;
        self.last_nsg = nsg;
        LoginRequest {
            header: iscsi_wire::LoginRequest {
                transit,
                cont: false,
                csg: self.stage,
                nsg: if transit { nsg } else { self.stage },
                version_max: SUPPORTED_VERSION,
                version_min: SUPPORTED_VERSION,
                isid: self.config.isid,
                tsih: self.config.tsih,
                itt: self.config.itt,
                cid: self.config.cid,
                cmd_sn: self.config.cmd_sn,
                exp_stat_sn: self.exp_stat_sn,
            },
            data: text::encode(pairs),
        }
    }

    fn name_keys(&self) -> Vec<(String, String)> {
        let mut p = vec![(
            "InitiatorName".to_string(),
            self.config.initiator_name.clone(),
        )];
        if let Some(a) = &self.config.initiator_alias {
            p.push(("InitiatorAlias".into(), a.clone()));
        }
        match &self.config.target_name {
            Some(t) => {
                p.push(("TargetName".into(), t.clone()));
                p.push(("SessionType".into(), "Normal".into()));
            }
            None => p.push(("SessionType".into(), "Discovery".into())),
        }
        p
    }

    /// The operational offers for this connection.
    fn operational_keys(&self) -> Vec<(String, String)> {
        let c = &self.config;
        let d = &c.session;
        let mut p: Vec<(String, String)> = Vec::new();
        let mut add = |k: &str, v: String| p.push((k.to_string(), v));
        let normal = c.target_name.is_some();
        let iser = c.transport == TransportKind::Iser && normal;
        if !iser {
            add("HeaderDigest", c.header_digest.offer().into());
            add("DataDigest", c.data_digest.offer().into());
        }
        if self.leading() {
            add("DefaultTime2Wait", d.default_time2wait.to_string());
            add("DefaultTime2Retain", d.default_time2retain.to_string());
            let erl = if c.transport == TransportKind::Iser {
                0
            } else {
                d.error_recovery_level.min(2)
            };
            add("ErrorRecoveryLevel", erl.to_string());
        }
        add("IFMarker", "No".into());
        add("OFMarker", "No".into());
        if normal && self.leading() {
            add("InitialR2T", text::bool_str(d.initial_r2t).into());
            add("ImmediateData", text::bool_str(d.immediate_data).into());
            add("MaxBurstLength", clamp_len(d.max_burst_length).to_string());
            add(
                "FirstBurstLength",
                clamp_len(d.first_burst_length).to_string(),
            );
            add("MaxConnections", d.max_connections.max(1).to_string());
            add(
                "MaxOutstandingR2T",
                d.max_outstanding_r2t.max(1).to_string(),
            );
            add("DataPDUInOrder", "Yes".into());
            add("DataSequenceInOrder", "Yes".into());
        }
        if iser {
            if self.leading() {
                add("RDMAExtensions", "Yes".into());
            }
            add(
                "InitiatorRecvDataSegmentLength",
                clamp_len(c.max_recv_data_segment_length).to_string(),
            );
            // As Linux ib_iser offers it: LIO waits for an answer to a key it has to propose
            // itself and never moves on (MaxOutstandingUnexpectedPDUs, which Linux does not
            // send, LIO does not understand).
            add(
                "TargetRecvDataSegmentLength",
                ISER_TARGET_RECV_DATA.to_string(),
            );
        } else {
            add(
                "MaxRecvDataSegmentLength",
                clamp_len(c.max_recv_data_segment_length).to_string(),
            );
        }
        p
    }

    /// The first Login Request of the connection.
    pub fn first_request(&mut self) -> LoginRequest {
        let mut pairs = self.name_keys();
        match &self.config.auth {
            InitiatorAuth::None => {
                self.stage = Stage::Operational;
                self.chap = ChapPhase::Done;
                let ops = self.operational_keys();
                self.ops_offered = true;
                self.note_offers(&ops);
                self.offered = ops.clone();
                pairs.extend(ops);
                self.request(true, Stage::FullFeature, &pairs)
            }
            InitiatorAuth::Chap { mutual, .. } => {
                self.stage = Stage::Security;
                let offer = if mutual.is_some() {
                    "CHAP"
                } else {
                    "CHAP,None"
                };
                pairs.push(("AuthMethod".into(), offer.into()));
                self.request(true, Stage::Operational, &pairs)
            }
        }
    }

    /// Handles one Login Response; `rng` provides mutual-CHAP challenges.
    pub fn on_response(
        &mut self,
        resp: &LoginResponse,
        rng: &mut dyn Entropy,
    ) -> Result<InitiatorStep, LoginError> {
        self.exchanges += 1;
        if self.exchanges > MAX_EXCHANGES {
            return Err(protocol("login did not converge"));
        }
        let status = resp.status();
        if !status.is_success() {
            let target_address = text::parse(&resp.data).ok().and_then(|p| {
                p.into_iter()
                    .find(|(k, _)| k == "TargetAddress")
                    .map(|(_, v)| v)
            });
            return Err(LoginError::Rejected {
                status,
                target_address,
            });
        }
        if resp.header.version_active != SUPPORTED_VERSION {
            return Err(protocol(format!(
                "version-active {} is not 0",
                resp.header.version_active
            )));
        }
        if resp.header.isid != self.config.isid || resp.header.itt != self.config.itt {
            return Err(protocol("response ISID/ITT does not match the request"));
        }
        self.exp_stat_sn = resp.header.stat_sn.wrapping_add(1);
        if resp.header.transit && resp.header.cont {
            return Err(protocol("T and C both set"));
        }
        if resp.header.csg != self.stage {
            return Err(protocol(format!(
                "response CSG {:?} while in {:?}",
                resp.header.csg, self.stage
            )));
        }
        if resp.header.transit && (!self.last_transit || resp.header.nsg > self.last_nsg) {
            return Err(protocol(
                "target moved to a stage the initiator did not ask for",
            ));
        }
        if resp.header.transit && resp.header.nsg <= self.stage {
            return Err(protocol("target transit does not move forward"));
        }
        if self.response_buffer.len() + resp.data.len() > 64 * 1024 {
            return Err(protocol("login response data too long"));
        }
        self.response_buffer.extend_from_slice(&resp.data);
        if resp.header.cont {
            // Fetch the rest with an empty request.
            let stage = self.stage;
            return Ok(InitiatorStep::Send(self.request(false, stage, &[])));
        }
        let data = std::mem::take(&mut self.response_buffer);
        let pairs = text::parse(&data).map_err(LoginError::BadText)?;

        let mut replies: Vec<(String, String)> = Vec::new();
        let mut chap_keys: Vec<(String, String)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (k, v) in &pairs {
            if !seen.insert(k.clone()) {
                return Err(protocol(format!("key {k} sent twice")));
            }
            match k.as_str() {
                "AuthMethod" | "CHAP_A" | "CHAP_I" | "CHAP_C" | "CHAP_N" | "CHAP_R" => {
                    if self.stage != Stage::Security {
                        return Err(protocol(format!("{k} outside the security stage")));
                    }
                    chap_keys.push((k.clone(), v.clone()));
                }
                "TargetPortalGroupTag" => {
                    let t = text::parse_number_in(v, 0, 65_535)
                        .map_err(|e| protocol(format!("TargetPortalGroupTag: {e}")))?;
                    self.tpgt = Some(t as u16);
                    self.session.target_portal_group_tag = t as u16;
                }
                "TargetAlias" => self.session.target_alias = Some(v.clone()),
                "TargetAddress" => {}
                _ => self.operational_reply(k, v, &mut replies)?,
            }
        }
        let mut chap_pairs = Vec::new();
        if self.stage == Stage::Security {
            self.chap_step(&chap_keys, resp.header.transit, &mut chap_pairs, rng)?;
        }

        if resp.header.transit {
            self.stage = resp.header.nsg;
            if resp.header.nsg == Stage::FullFeature {
                if !matches!(self.chap, ChapPhase::Done) {
                    return Err(LoginError::MutualChapFailed(
                        "the target completed login without answering our challenge".into(),
                    ));
                }
                if self.leading() && resp.header.tsih == 0 {
                    return Err(protocol("final login response without a TSIH"));
                }
                if !self.leading() && resp.header.tsih != self.config.tsih {
                    return Err(protocol("final login response with a different TSIH"));
                }
                self.finish_params();
                return Ok(InitiatorStep::Complete {
                    tsih: resp.header.tsih,
                    session: self.session.clone(),
                    connection: self.connection,
                    target_portal_group_tag: self.tpgt,
                });
            }
        }

        // Build the next request.
        let mut pairs = chap_pairs;
        let (transit, nsg) = match self.stage {
            Stage::Security => match self.chap {
                ChapPhase::AlgorithmSent => (false, Stage::Operational),
                _ => (true, Stage::Operational),
            },
            _ => {
                if !self.ops_offered {
                    let ops = self.operational_keys();
                    self.ops_offered = true;
                    self.note_offers(&ops);
                    self.offered = ops.clone();
                    pairs.extend(ops);
                }
                (true, Stage::FullFeature)
            }
        };
        pairs.extend(replies);
        Ok(InitiatorStep::Send(self.request(transit, nsg, &pairs)))
    }

    fn offered_value(&self, k: &str) -> Option<&str> {
        self.offered
            .iter()
            .find(|(ok, _)| ok == k)
            .map(|(_, v)| v.as_str())
    }

    /// Applies a target's reply to one of our offers, or answers a key the
    /// target offered itself.
    fn operational_reply(
        &mut self,
        k: &str,
        v: &str,
        replies: &mut Vec<(String, String)>,
    ) -> Result<(), LoginError> {
        let Some(def) = keys::lookup(k) else {
            if keys::is_special_reply(v) {
                return Ok(());
            }
            replies.push((k.to_string(), NOT_UNDERSTOOD.to_string()));
            return Ok(());
        };
        let offered = self.offered_value(k).map(str::to_string);
        if keys::is_special_reply(v) {
            // The name keys of the first request count as offered: LIO answers
            // SessionType=NotUnderstood on a connection joining a session.
            let named = self.name_keys().iter().any(|(nk, _)| nk == k);
            if offered.is_none() && !named {
                return Err(protocol(format!("{k}={v} for a key never offered")));
            }
            // Rejected/irrelevant offers keep their defaults.
            return Ok(());
        }
        let (lo, hi) = def.range.unwrap_or((0, u64::MAX));
        let bad = |why: &str| protocol(format!("{k}={v}: {why}"));
        match def.negotiation {
            Negotiation::Min | Negotiation::Max => {
                let got = text::parse_number_in(v, lo, hi).map_err(|_| bad("out of range"))?;
                match &offered {
                    Some(o) => {
                        let ours = text::parse_number(o).unwrap_or(got);
                        let ok = match def.negotiation {
                            Negotiation::Min => got <= ours,
                            _ => got >= ours,
                        };
                        if !ok {
                            return Err(bad("not a valid result of the negotiation"));
                        }
                    }
                    None => {
                        // The target offered it: answer with our result.
                        let ours: u64 = def.default.parse().unwrap_or(got);
                        let result = keys::negotiate_number(def.negotiation, got, ours);
                        replies.push((k.to_string(), result.to_string()));
                        self.store_number(k, result);
                        return Ok(());
                    }
                }
                self.store_number(k, got);
            }
            Negotiation::And | Negotiation::Or => {
                let got = text::parse_bool(v).map_err(|_| bad("not Yes/No"))?;
                match &offered {
                    Some(o) => {
                        let ours = text::parse_bool(o).unwrap_or(got);
                        let expect = match def.negotiation {
                            Negotiation::And => got && ours,
                            _ => got || ours,
                        };
                        // A reply only ever confirms the computed result.
                        let valid = match def.negotiation {
                            Negotiation::And => !got || ours,
                            _ => got || !ours,
                        };
                        if !valid {
                            return Err(bad("not a valid result of the negotiation"));
                        }
                        self.store_bool(k, expect);
                    }
                    None => {
                        let ours = match k {
                            "RDMAExtensions" => self.config.transport == TransportKind::Iser,
                            "IFMarker" | "OFMarker" => false,
                            _ => text::parse_bool(def.default).unwrap_or(false),
                        };
                        let result = keys::negotiate_bool(def.negotiation, got, ours);
                        replies.push((k.to_string(), text::bool_str(result).to_string()));
                        self.store_bool(k, result);
                    }
                }
            }
            Negotiation::List => {
                if v.contains(',') {
                    match &offered {
                        Some(_) => return Err(bad("a list in a reply")),
                        None => {
                            // Target offering a list: take the first we support.
                            let supported: &[&str] = match k {
                                "HeaderDigest" | "DataDigest" => &["None", "CRC32C"],
                                "TaskReporting" => &["RFC3720"],
                                _ => &[],
                            };
                            let chosen = keys::negotiate_list(v, supported).unwrap_or(REJECT);
                            replies.push((k.to_string(), chosen.to_string()));
                            self.store_list(k, chosen);
                            return Ok(());
                        }
                    }
                }
                match &offered {
                    Some(o) => {
                        if !o.split(',').any(|item| item == v) {
                            return Err(bad("not one of the offered values"));
                        }
                        self.store_list(k, v);
                    }
                    None => {
                        let ok = match k {
                            "HeaderDigest" | "DataDigest" => v == "None" || v == "CRC32C",
                            "TaskReporting" => v == "RFC3720",
                            _ => false,
                        };
                        let answer = if ok { v } else { REJECT };
                        replies.push((k.to_string(), answer.to_string()));
                        if ok {
                            self.store_list(k, v);
                        }
                    }
                }
            }
            Negotiation::Declarative => {
                let got = text::parse_number_in(v, lo, hi).map_err(|_| bad("out of range"))?;
                let got = got as u32;
                match k {
                    "MaxRecvDataSegmentLength" => {
                        self.connection.max_send_data_segment_length = got;
                        self.peer_declared_recv = true;
                    }
                    "TargetRecvDataSegmentLength" => {
                        self.connection.target_recv_data_segment_length = got;
                    }
                    "InitiatorRecvDataSegmentLength" => {
                        let ours = self.connection.initiator_recv_data_segment_length;
                        self.connection.initiator_recv_data_segment_length = got.min(ours);
                    }
                    "MaxOutstandingUnexpectedPDUs" => {
                        self.connection.max_outstanding_unexpected_pdus_send = got;
                    }
                    _ => {}
                }
            }
            Negotiation::Special => {
                if matches!(k, "IFMarkInt" | "OFMarkInt") && offered.is_none() {
                    replies.push((k.to_string(), IRRELEVANT.to_string()));
                }
            }
        }
        Ok(())
    }

    fn store_number(&mut self, k: &str, v: u64) {
        let s = &mut self.session;
        match k {
            "MaxConnections" => s.max_connections = v as u16,
            "MaxBurstLength" => s.max_burst_length = v as u32,
            "FirstBurstLength" => s.first_burst_length = v as u32,
            "DefaultTime2Wait" => s.default_time2wait = v as u16,
            "DefaultTime2Retain" => s.default_time2retain = v as u16,
            "MaxOutstandingR2T" => s.max_outstanding_r2t = v as u16,
            "ErrorRecoveryLevel" => s.error_recovery_level = v as u8,
            "iSCSIProtocolLevel" => s.iscsi_protocol_level = v as u8,
            _ => {}
        }
    }

    fn store_bool(&mut self, k: &str, v: bool) {
        let s = &mut self.session;
        match k {
            "InitialR2T" => s.initial_r2t = v,
            "ImmediateData" => s.immediate_data = v,
            "DataPDUInOrder" => s.data_pdu_in_order = v,
            "DataSequenceInOrder" => s.data_sequence_in_order = v,
            "RDMAExtensions" => s.rdma_extensions = v,
            _ => {}
        }
    }

    fn store_list(&mut self, k: &str, v: &str) {
        match k {
            "HeaderDigest" => self.connection.header_digest = v == "CRC32C",
            "DataDigest" => self.connection.data_digest = v == "CRC32C",
            "TaskReporting" => {
                self.session.task_reporting = TaskReporting::from_name(v).unwrap_or_default()
            }
            _ => {}
        }
    }

    fn chap_step(
        &mut self,
        chap_keys: &[(String, String)],
        transit: bool,
        out: &mut Vec<(String, String)>,
        rng: &mut dyn Entropy,
    ) -> Result<(), LoginError> {
        let get = |name: &str| {
            chap_keys
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let InitiatorAuth::Chap {
            credentials,
            mutual,
            algorithms,
        } = &self.config.auth
        else {
            if chap_keys.is_empty() {
                return Ok(());
            }
            return Err(protocol("CHAP keys although no authentication was offered"));
        };
        match &self.chap {
            ChapPhase::Offered => match get("AuthMethod") {
                Some("CHAP") => {
                    let list: Vec<String> =
                        algorithms.iter().map(|a| a.code().to_string()).collect();
                    let list = if list.is_empty() {
                        "5".to_string()
                    } else {
                        list.join(",")
                    };
                    out.push(("CHAP_A".into(), list));
                    self.chap = ChapPhase::AlgorithmSent;
                    Ok(())
                }
                Some("None") if mutual.is_none() => {
                    self.chap = ChapPhase::Done;
                    Ok(())
                }
                Some("None") => Err(LoginError::MutualChapFailed(
                    "the target refused to authenticate (AuthMethod=None)".into(),
                )),
                Some(other) => Err(protocol(format!("AuthMethod={other}"))),
                None if transit && mutual.is_none() => {
                    // Target skipped authentication entirely.
                    self.chap = ChapPhase::Done;
                    Ok(())
                }
                None => Err(protocol("no AuthMethod in the target's answer")),
            },
            ChapPhase::AlgorithmSent => {
                let a = get("CHAP_A").ok_or_else(|| protocol("no CHAP_A from target"))?;
                let allowed: Vec<ChapAlgorithm> = if algorithms.is_empty() {
                    vec![ChapAlgorithm::Md5]
                } else {
                    algorithms.clone()
                };
                let alg = chap::select_algorithm(a, &allowed)
                    .filter(|_| !a.contains(','))
                    .ok_or_else(|| protocol(format!("CHAP_A={a} was not offered")))?;
                let id = get("CHAP_I")
                    .and_then(chap::parse_identifier)
                    .ok_or_else(|| protocol("missing or bad CHAP_I"))?;
                let challenge = get("CHAP_C")
                    .and_then(|c| text::parse_binary(c).ok())
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| protocol("missing or bad CHAP_C"))?;
                let r = chap::response(alg, id, &credentials.secret, &challenge);
                out.push(("CHAP_N".into(), credentials.user.clone()));
                out.push(("CHAP_R".into(), text::encode_hex(&r)));
                let pending = if mutual.is_some() {
                    let mut mid = [0u8; 1];
                    rng.fill(&mut mid);
                    let mut mc = vec![0u8; alg.challenge_len()];
                    rng.fill(&mut mc);
                    if mc == challenge {
                        // Never hand the target its own challenge back.
                        mc[0] ^= 0xff;
                    }
                    out.push(("CHAP_I".into(), mid[0].to_string()));
                    out.push(("CHAP_C".into(), text::encode_hex(&mc)));
                    Some((alg, mid[0], mc))
                } else {
                    None
                };
                self.chap = ChapPhase::ResponseSent { mutual: pending };
                Ok(())
            }
            ChapPhase::ResponseSent { mutual: pending } => {
                if let Some((alg, mid, mc)) = pending {
                    let Some(m) = mutual else {
                        return Err(protocol("mutual state without credentials"));
                    };
                    let n = get("CHAP_N")
                        .ok_or_else(|| LoginError::MutualChapFailed("no CHAP_N".into()))?;
                    let r = get("CHAP_R")
                        .ok_or_else(|| LoginError::MutualChapFailed("no CHAP_R".into()))?;
                    if n != m.user {
                        return Err(LoginError::MutualChapFailed(format!(
                            "target user {n:?} is not {:?}",
                            m.user
                        )));
                    }
                    let r = text::parse_binary(r)
                        .map_err(|_| LoginError::MutualChapFailed("bad CHAP_R".into()))?;
                    if !chap::verify(*alg, *mid, &m.secret, mc, &r) {
                        return Err(LoginError::MutualChapFailed("wrong CHAP_R".into()));
                    }
                } else if !chap_keys.is_empty() {
                    return Err(protocol("unexpected CHAP keys after our response"));
                }
                self.chap = ChapPhase::Done;
                Ok(())
            }
            ChapPhase::Done => {
                if chap_keys.is_empty() {
                    Ok(())
                } else {
                    Err(protocol("CHAP keys after authentication finished"))
                }
            }
        }
    }

    fn finish_params(&mut self) {
        // A responder may leave a Boolean key unanswered when our offer already decides the
        // result (RFC 7143 6.2.1: ImmediateData=No under AND, InitialR2T=Yes under OR); LIO
        // does, and the default (Yes) must not stand in for the answer: an initiator that
        // offered ImmediateData=No and sent immediate data anyway got Reject 0x04 from LIO's
        // isert. With an answer these are no-ops (the answer already is the AND / the OR).
        if self.config.target_name.is_some() && self.leading() {
            let d = &self.config.session;
            self.session.immediate_data &= d.immediate_data;
            self.session.initial_r2t |= d.initial_r2t;
        }
        if !self.peer_declared_recv {
            self.connection.max_send_data_segment_length = DEFAULT_DATA_SEGMENT_LENGTH;
        }
        if self.session.first_burst_length > self.session.max_burst_length {
            self.session.first_burst_length = self.session.max_burst_length;
        }
    }

    /// Records our own declarations as they are offered.
    fn note_offers(&mut self, ops: &[(String, String)]) {
        for (k, v) in ops {
            let Ok(n) = text::parse_number(v) else {
                continue;
            };
            match k.as_str() {
                "MaxRecvDataSegmentLength" => {
                    self.connection.max_recv_data_segment_length = n as u32
                }
                "InitiatorRecvDataSegmentLength" => {
                    self.connection.initiator_recv_data_segment_length = n as u32
                }
                "MaxOutstandingUnexpectedPDUs" => {
                    self.connection.max_outstanding_unexpected_pdus_recv = n as u32
                }
                _ => {}
            }
        }
    }
}

fn clamp_len(v: u32) -> u32 {
    v.clamp(512, 16_777_215)
}
