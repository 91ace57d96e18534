//! Target side of the login phase: one [`TargetLogin`] per connection,
//! fed each Login Request, answering with the Login Response to send.
//!
//! Choices where RFC 7143 leaves room (following Linux LIO unless noted):
//! - Keys of the other login stage (operational keys in the security stage,
//!   AuthMethod/CHAP_* in the operational stage), keys only the target may
//!   send, SendTargets during login, unknown and vendor (`X-`) keys are
//!   answered `NotUnderstood`.
//! - Session-wide keys in a discovery session, leading-only keys on a
//!   non-leading connection, iSER keys over TCP and the marker intervals
//!   are answered `Irrelevant`.
//! - A value out of range or malformed is answered `Reject` and the key
//!   keeps its default; a key offered twice fails the login (0x0200).
//! - Every offered key is answered (libiscsi relies on it); the target
//!   itself only declares: TargetPortalGroupTag and TargetAlias in the
//!   first response, MaxRecvDataSegmentLength (TCP) or
//!   TargetRecvDataSegmentLength (iSER) in the first operational response.
//! - CHAP: the algorithm is the first one the initiator lists that the
//!   target allows; any CHAP error is an authentication failure (0x0201).
//!
//! TSIH: a [`LoginState::Complete`] step of a leading login carries TSIH 0
//! in its response. The runtime allocates the session (performing session
//! reinstatement when [`LoginOutcome::identity`] matches an existing
//! session), writes the new non-zero TSIH into `response.header.tsih`, then sends
//! it. For an added connection the response already carries the
//! session's TSIH; one whose ISID or CHAP user is not its session's is
//! refused (see [`ExistingSession`]). MaxConnections accounting (0x0206) and unknown TSIHs
//! (0x020a) are the runtime's too: see [`LoginResponse::failure`].

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use crate::chap::{self, ChapAlgorithm, ChapCredentials, Entropy};
use crate::directory::{AuthRequirement, TargetDirectory};
use crate::keys::{self, KeyStage, KeyUse, Negotiation, IRRELEVANT, NOT_UNDERSTOOD, REJECT};
use crate::params::{
    ConnectionParams, SessionParams, SessionType, TaskReporting, TransportKind,
    DEFAULT_DATA_SEGMENT_LENGTH,
};
use crate::pdu::{LoginRequest, LoginResponse, LoginStatus, Stage, SUPPORTED_VERSION};
use crate::text;

/// Whether a digest may or must be used on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DigestPolicy {
    /// Only `None` is accepted.
    Never,
    /// Either; the initiator's order decides.
    #[default]
    Allowed,
    /// Only `CRC32C` is accepted.
    Required,
}

impl DigestPolicy {
    fn supported(self) -> &'static [&'static str] {
        match self {
            DigestPolicy::Never => &["None"],
            DigestPolicy::Allowed => &["CRC32C", "None"],
            DigestPolicy::Required => &["CRC32C"],
        }
    }
}

/// The target's own limits and preferences, used as "our value" in each
/// negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLimits {
    /// Declared as MaxRecvDataSegmentLength (512..=16777215).
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub immediate_data: bool,
    pub initial_r2t: bool,
    pub max_outstanding_r2t: u16,
    pub max_connections: u16,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    /// Highest ErrorRecoveryLevel supported.
    pub error_recovery_level: u8,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub header_digest: DigestPolicy,
    pub data_digest: DigestPolicy,
    /// CHAP algorithms accepted.
    pub chap_algorithms: Vec<ChapAlgorithm>,
    /// iSER: declared as TargetRecvDataSegmentLength.
    pub iser_recv_data_segment_length: u32,
    /// iSER: declared as MaxOutstandingUnexpectedPDUs (0 = no limit).
    pub max_outstanding_unexpected_pdus: u32,
}

impl Default for TargetLimits {
    fn default() -> Self {
        TargetLimits {
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1_048_576,
            first_burst_length: 262_144,
            immediate_data: true,
            initial_r2t: false,
            max_outstanding_r2t: 1,
            max_connections: 8,
            default_time2wait: 2,
            default_time2retain: 20,
            error_recovery_level: 0,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            header_digest: DigestPolicy::Allowed,
            data_digest: DigestPolicy::Allowed,
            chap_algorithms: ChapAlgorithm::ALL.to_vec(),
            iser_recv_data_segment_length: 262_144,
            max_outstanding_unexpected_pdus: 0,
        }
    }
}

/// Everything a [`TargetLogin`] needs for one connection.
#[derive(Clone)]
pub struct TargetLoginConfig {
    /// TPGT of the portal the connection came in on.
    pub portal_group_tag: u16,
    /// `None` for a leading login (TSIH 0); for a connection added to an
    /// existing session (TSIH ≠ 0, looked up by the runtime), that session.
    pub existing_session: Option<ExistingSession>,
    pub transport: TransportKind,
    pub limits: TargetLimits,
    pub directory: Arc<dyn TargetDirectory + Send + Sync>,
}

/// The session a non-leading login asks to join, as the runtime knows it.
/// The joining login must name the same initiator, target and session type,
/// carry the same ISID (else 0x020a, session does not exist: the TSIH
/// names no session of this initiator port), and authenticate as the same
/// CHAP user (else 0x0202, authorization failure).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExistingSession {
    pub params: SessionParams,
    pub isid: [u8; 6],
    /// The CHAP user name the session's leading login authenticated as;
    /// `None` when it logged in without CHAP.
    pub chap_user: Option<String>,
}

/// The identity that decides session reinstatement: a new leading login
/// with the same identity as a live session replaces that session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionIdentity {
    pub initiator_name: String,
    pub isid: [u8; 6],
    pub target_name: Option<String>,
    pub target_portal_group_tag: u16,
}

/// The result of a successful login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginOutcome {
    pub session_type: SessionType,
    pub initiator_name: String,
    /// `None` for discovery sessions.
    pub target_name: Option<String>,
    pub isid: [u8; 6],
    pub cid: u16,
    /// TSIH of the request: 0 for a leading login (runtime assigns one).
    pub tsih: u16,
    pub leading: bool,
    /// The CHAP user name this connection authenticated as; `None` without
    /// CHAP.
    pub chap_user: Option<String>,
    pub session: SessionParams,
    pub connection: ConnectionParams,
}

impl LoginOutcome {
    pub fn identity(&self) -> SessionIdentity {
        SessionIdentity {
            initiator_name: self.initiator_name.clone(),
            isid: self.isid,
            target_name: self.target_name.clone(),
            target_portal_group_tag: self.session.target_portal_group_tag,
        }
    }
}

/// What to do after a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginState {
    /// Send the response and wait for the next request.
    Continue,
    /// Send the response (non-zero status) and close the connection.
    Failed,
    /// Send the response (after filling the TSIH of a new session) and
    /// enter full feature phase.
    Complete(Box<LoginOutcome>),
}

/// The response to send and what happens next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginStep {
    pub response: LoginResponse,
    pub state: LoginState,
}

/// Largest login data segment we send, and the most we buffer from C-bit
/// continuations (the login phase uses the 8192 default both ways).
const LOGIN_SEGMENT: usize = 8192;
const MAX_LOGIN_DATA: usize = 64 * 1024;

enum ChapState {
    /// AuthMethod=CHAP agreed; waiting for CHAP_A.
    AwaitAlgorithm,
    /// Challenge sent; waiting for CHAP_N/CHAP_R.
    AwaitResponse {
        alg: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
}

enum AuthState {
    /// Auth not negotiated yet.
    NotStarted,
    Chap(ChapState),
    /// Authenticated, or none required and agreed.
    Done,
}

/// Pending pieces of a response that did not fit one PDU.
struct PendingResponse {
    chunks: VecDeque<Vec<u8>>,
    transit: bool,
    nsg: Stage,
    outcome: Option<Box<LoginOutcome>>,
}

/// Target-side login state machine for one connection.
pub struct TargetLogin {
    config: TargetLoginConfig,
    stage: Stage,
    first: bool,
    finished: bool,
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
    request_buffer: Vec<u8>,
    pending: Option<PendingResponse>,
    seen: HashSet<String>,
    session: SessionParams,
    connection: ConnectionParams,
    declared_recv: Option<u32>,
    declared_iser_recv: bool,
    auth_required: AuthRequirement,
    auth: AuthState,
    /// The CHAP user name proven on this connection.
    chap_user: Option<String>,
}

struct Fail(LoginStatus);

impl TargetLogin {
    pub fn new(config: TargetLoginConfig) -> Self {
        let mut session = config
            .existing_session
            .as_ref()
            .map(|e| e.params.clone())
            .unwrap_or_default();
        session.target_portal_group_tag = config.portal_group_tag;
        TargetLogin {
            stage: Stage::Security,
            first: true,
            finished: false,
            isid: [0; 6],
            tsih: 0,
            cid: 0,
            request_buffer: Vec::new(),
            pending: None,
            seen: HashSet::new(),
            session,
            connection: ConnectionParams::default(),
            declared_recv: None,
            declared_iser_recv: false,
            auth_required: AuthRequirement::None,
            auth: AuthState::NotStarted,
            chap_user: None,
            config,
        }
    }

    /// The initiator's name, once the first request is whole (it may come in several
    /// PDUs) and has named one.
    pub fn initiator_name(&self) -> Option<&str> {
        let name = self.session.initiator_name.as_str();
        (!self.first && !name.is_empty()).then_some(name)
    }

    /// Whether the login must authenticate with CHAP: known once the first request is
    /// whole (false before).
    pub fn requires_chap(&self) -> bool {
        !self.first && matches!(self.auth_required, AuthRequirement::Chap { .. })
    }

    fn leading(&self) -> bool {
        self.config.existing_session.is_none()
    }

    fn response(&self, req: &LoginRequest, transit: bool, cont: bool, nsg: Stage) -> LoginResponse {
        LoginResponse {
            header: iscsi_wire::LoginResponse {
                transit,
                cont,
                csg: self.stage,
                nsg: if transit { nsg } else { self.stage },
                version_max: SUPPORTED_VERSION,
                version_active: SUPPORTED_VERSION,
                isid: req.header.isid,
                tsih: if self.leading() { 0 } else { req.header.tsih },
                itt: req.header.itt,
                stat_sn: 0,
                exp_cmd_sn: 0,
                max_cmd_sn: 0,
                status_class: 0,
                status_detail: 0,
            },
            data: Vec::new(),
        }
    }

    fn fail(&mut self, req: &LoginRequest, status: LoginStatus) -> LoginStep {
        self.finished = true;
        let mut response = LoginResponse::failure(req, status);
        response.header.csg = self.stage;
        LoginStep {
            response,
            state: LoginState::Failed,
        }
    }

    /// Handles one Login Request. Never panics on any input.
    pub fn on_request(&mut self, req: &LoginRequest, rng: &mut dyn Entropy) -> LoginStep {
        if self.finished {
            return self.fail(req, LoginStatus::INVALID_DURING_LOGIN);
        }
        match self.handle(req, rng) {
            Ok(step) => step,
            Err(Fail(status)) => self.fail(req, status),
        }
    }

    fn handle(&mut self, req: &LoginRequest, rng: &mut dyn Entropy) -> Result<LoginStep, Fail> {
        if req.header.transit && req.header.cont {
            return Err(Fail(LoginStatus::INITIATOR_ERROR));
        }
        // Version 0 is the only one; any version-max covers it.
        if req.header.version_min > SUPPORTED_VERSION {
            return Err(Fail(LoginStatus::UNSUPPORTED_VERSION));
        }
        if self.first {
            if req.header.csg == Stage::FullFeature {
                return Err(Fail(LoginStatus::INITIATOR_ERROR));
            }
            self.stage = req.header.csg;
            self.isid = req.header.isid;
            self.tsih = req.header.tsih;
            self.cid = req.header.cid;
        } else if req.header.isid != self.isid
            || req.header.tsih != self.tsih
            || req.header.cid != self.cid
        {
            return Err(Fail(LoginStatus::INITIATOR_ERROR));
        }
        if req.header.csg != self.stage {
            // Going backwards, or skipping a stage without a transition.
            return Err(Fail(LoginStatus::INITIATOR_ERROR));
        }
        if req.header.transit {
            let legal = match req.header.csg {
                Stage::Security => {
                    matches!(req.header.nsg, Stage::Operational | Stage::FullFeature)
                }
                Stage::Operational => req.header.nsg == Stage::FullFeature,
                Stage::FullFeature => false,
            };
            if !legal {
                return Err(Fail(LoginStatus::INITIATOR_ERROR));
            }
        }

        // The initiator is fetching the rest of a long response.
        if self.pending.is_some() {
            if !req.data.is_empty() || req.header.cont {
                return Err(Fail(LoginStatus::INITIATOR_ERROR));
            }
            return Ok(self.next_pending_chunk(req));
        }

        if self.request_buffer.len() + req.data.len() > MAX_LOGIN_DATA {
            return Err(Fail(LoginStatus::OUT_OF_RESOURCES));
        }
        self.request_buffer.extend_from_slice(&req.data);
        if req.header.cont {
            // More of this request follows: acknowledge with an empty response.
            return Ok(LoginStep {
                response: self.response(req, false, false, self.stage),
                state: LoginState::Continue,
            });
        }
        let data = std::mem::take(&mut self.request_buffer);
        let pairs = text::parse(&data).map_err(|_| Fail(LoginStatus::INITIATOR_ERROR))?;

        let mut replies: Vec<(String, String)> = Vec::new();
        let is_first = self.first;
        if is_first {
            self.first_request(&pairs, &mut replies)?;
            self.first = false;
        }

        let mut chap_keys: Vec<(String, String)> = Vec::new();
        for (k, v) in &pairs {
            if !self.seen.insert(k.clone()) {
                return Err(Fail(LoginStatus::INITIATOR_ERROR));
            }
            self.login_key(k, v, is_first, &mut replies, &mut chap_keys)?;
        }
        if self.stage == Stage::Security {
            self.chap_step(&chap_keys, &mut replies, rng)?;
        }

        if self.stage == Stage::Operational {
            self.operational_declarations(&mut replies);
        }

        // Decide on the transition.
        let mut transit = false;
        if req.header.transit {
            transit = match self.stage {
                Stage::Security => match (&self.auth, &self.auth_required) {
                    (AuthState::Done, _) => true,
                    (AuthState::NotStarted, AuthRequirement::None) => {
                        self.auth = AuthState::Done;
                        true
                    }
                    (AuthState::NotStarted, AuthRequirement::Chap { .. }) => {
                        return Err(Fail(LoginStatus::AUTHENTICATION_FAILURE))
                    }
                    // CHAP still running: stay in the security stage.
                    (AuthState::Chap(_), _) => false,
                },
                _ => true,
            };
        }
        if req.header.csg == Stage::Operational
            && matches!(self.auth_required, AuthRequirement::Chap { .. })
        {
            // Started in (or reached) the operational stage without CHAP.
            if !matches!(self.auth, AuthState::Done) {
                return Err(Fail(LoginStatus::AUTHENTICATION_FAILURE));
            }
        }

        let mut outcome = None;
        if transit && req.header.nsg == Stage::FullFeature {
            // A digest the target requires but the initiator refused (or never offered, so it
            // stays None) ends the login: the connection would otherwise run unprotected.
            let limits = &self.config.limits;
            if self.config.transport == TransportKind::Tcp
                && ((limits.header_digest == DigestPolicy::Required
                    && !self.connection.header_digest)
                    || (limits.data_digest == DigestPolicy::Required
                        && !self.connection.data_digest))
            {
                return Err(Fail(LoginStatus::INITIATOR_ERROR));
            }
            // A joining connection proves the identity its session proved: another CHAP
            // user (or none) must not take over a session it did not authenticate.
            if let Some(existing) = &self.config.existing_session {
                if existing.chap_user != self.chap_user {
                    return Err(Fail(LoginStatus::AUTHORIZATION_FAILURE));
                }
            }
            self.finalize_params();
            outcome = Some(Box::new(self.outcome()));
        }

        let data = text::encode(&replies);
        let mut chunks: VecDeque<Vec<u8>> =
            data.chunks(LOGIN_SEGMENT).map(|c| c.to_vec()).collect();
        if chunks.len() > 1 {
            let first = chunks.pop_front().unwrap_or_default();
            self.pending = Some(PendingResponse {
                chunks,
                transit,
                nsg: req.header.nsg,
                outcome,
            });
            let mut response = self.response(req, false, true, self.stage);
            response.data = first;
            return Ok(LoginStep {
                response,
                state: LoginState::Continue,
            });
        }
        let mut response = self.response(req, transit, false, req.header.nsg);
        response.data = chunks.pop_front().unwrap_or_default();
        Ok(self.finish_step(response, transit, req.header.nsg, outcome))
    }

    fn finish_step(
        &mut self,
        response: LoginResponse,
        transit: bool,
        nsg: Stage,
        outcome: Option<Box<LoginOutcome>>,
    ) -> LoginStep {
        if transit {
            self.stage = nsg;
        }
        match outcome {
            Some(o) => {
                self.finished = true;
                LoginStep {
                    response,
                    state: LoginState::Complete(o),
                }
            }
            None => LoginStep {
                response,
                state: LoginState::Continue,
            },
        }
    }

    fn next_pending_chunk(&mut self, req: &LoginRequest) -> LoginStep {
        let Some(mut pending) = self.pending.take() else {
            return self.fail(req, LoginStatus::TARGET_ERROR);
        };
        let chunk = pending.chunks.pop_front().unwrap_or_default();
        if pending.chunks.is_empty() {
            let mut response = self.response(req, pending.transit, false, pending.nsg);
            response.data = chunk;
            self.finish_step(response, pending.transit, pending.nsg, pending.outcome)
        } else {
            let mut response = self.response(req, false, true, self.stage);
            response.data = chunk;
            self.pending = Some(pending);
            LoginStep {
                response,
                state: LoginState::Continue,
            }
        }
    }

    /// Names, session type, target lookup, ACL and the auth requirement.
    fn first_request(
        &mut self,
        pairs: &[(String, String)],
        replies: &mut Vec<(String, String)>,
    ) -> Result<(), Fail> {
        let get = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let initiator = match get("InitiatorName") {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => return Err(Fail(LoginStatus::MISSING_PARAMETER)),
        };
        let session_type = match get("SessionType") {
            None | Some("Normal") => SessionType::Normal,
            Some("Discovery") => SessionType::Discovery,
            Some(_) => return Err(Fail(LoginStatus::INITIATOR_ERROR)),
        };
        let target_name = get("TargetName").map(str::to_string);
        let directory = Arc::clone(&self.config.directory);
        let (target, auth) = match session_type {
            SessionType::Normal => {
                let Some(target) = target_name.clone().filter(|t| !t.is_empty()) else {
                    return Err(Fail(LoginStatus::MISSING_PARAMETER));
                };
                if !directory.target_exists(&target) {
                    return Err(Fail(LoginStatus::NOT_FOUND));
                }
                if !directory.initiator_allowed(&target, &initiator) {
                    return Err(Fail(LoginStatus::AUTHORIZATION_FAILURE));
                }
                let auth = directory.target_auth(&target);
                (Some(target), auth)
            }
            SessionType::Discovery => (None, directory.discovery_auth()),
        };
        if let Some(existing) = &self.config.existing_session {
            // The session is named by ISID and TSIH together: another ISID with this
            // TSIH names no session.
            if existing.isid != self.isid {
                return Err(Fail(LoginStatus::SESSION_DOES_NOT_EXIST));
            }
            let existing = &existing.params;
            if existing.initiator_name != initiator
                || existing.target_name != target
                || existing.session_type != session_type
            {
                return Err(Fail(LoginStatus::CANT_INCLUDE_IN_SESSION));
            }
        }
        self.session.session_type = session_type;
        self.session.initiator_name = initiator;
        self.session.target_name = target.clone();
        self.auth_required = auth;
        if target_name.is_some() {
            replies.push((
                "TargetPortalGroupTag".into(),
                self.config.portal_group_tag.to_string(),
            ));
        }
        if let Some(t) = &target {
            if let Some(alias) = directory.target_alias(t) {
                self.session.target_alias = Some(alias.clone());
                replies.push(("TargetAlias".into(), alias));
            }
        }
        Ok(())
    }

    fn login_key(
        &mut self,
        k: &str,
        v: &str,
        is_first: bool,
        replies: &mut Vec<(String, String)>,
        chap_keys: &mut Vec<(String, String)>,
    ) -> Result<(), Fail> {
        let reply = |replies: &mut Vec<(String, String)>, value: &str| {
            replies.push((k.to_string(), value.to_string()));
        };
        // Names and the session type are read from the first request only.
        if matches!(k, "InitiatorName" | "TargetName" | "SessionType") {
            if !is_first {
                return Err(Fail(LoginStatus::INITIATOR_ERROR));
            }
            return Ok(());
        }
        let Some(def) = keys::lookup(k) else {
            reply(replies, NOT_UNDERSTOOD);
            return Ok(());
        };
        if def.sender == keys::Sender::Target || def.usage == KeyUse::FullFeatureOnly {
            reply(replies, NOT_UNDERSTOOD);
            return Ok(());
        }
        match (self.stage, def.stage) {
            (Stage::Security, KeyStage::Security) => {
                if k == "AuthMethod" {
                    return self.auth_method(v, replies);
                }
                chap_keys.push((k.to_string(), v.to_string()));
                return Ok(());
            }
            (_, KeyStage::AnyLoginStage) => {
                if k == "InitiatorAlias" {
                    self.session.initiator_alias = Some(v.to_string());
                }
                return Ok(());
            }
            (Stage::Operational, KeyStage::Operational) => {}
            _ => {
                reply(replies, NOT_UNDERSTOOD);
                return Ok(());
            }
        }
        // Operational keys.
        if keys::is_special_reply(v) {
            // An offer cannot be NotUnderstood/Irrelevant/Reject.
            reply(replies, REJECT);
            return Ok(());
        }
        let discovery = self.session.session_type == SessionType::Discovery;
        let tcp = self.config.transport == TransportKind::Tcp;
        if (discovery && def.irrelevant_in_discovery)
            || (!self.leading() && def.usage == KeyUse::LeadingOnly)
            || (tcp && def.iser_only)
            || matches!(k, "IFMarkInt" | "OFMarkInt")
        {
            reply(replies, IRRELEVANT);
            return Ok(());
        }
        let answer = self.operational_value(k, v, def);
        reply(replies, &answer);
        Ok(())
    }

    /// Negotiates one operational key; returns the reply value.
    fn operational_value(&mut self, k: &str, v: &str, def: &keys::KeyDef) -> String {
        let limits = &self.config.limits;
        let (lo, hi) = def.range.unwrap_or((0, u64::MAX));
        match def.negotiation {
            Negotiation::Min | Negotiation::Max => {
                let Ok(offered) = text::parse_number_in(v, lo, hi) else {
                    return REJECT.into();
                };
                let ours: u64 = match k {
                    "MaxConnections" => limits.max_connections.into(),
                    "MaxBurstLength" => limits.max_burst_length.into(),
                    // iSER: unsolicited data arrives in Sends, each needing a posted receive
                    // (iWARP has no receiver-not-ready retry); at most one such Send per
                    // command keeps the receives a target posts bounded by its window.
                    "FirstBurstLength" if self.config.transport == TransportKind::Iser => limits
                        .first_burst_length
                        .min(limits.iser_recv_data_segment_length.max(512))
                        .into(),
                    "FirstBurstLength" => limits.first_burst_length.into(),
                    "DefaultTime2Wait" => limits.default_time2wait.into(),
                    "DefaultTime2Retain" => limits.default_time2retain.into(),
                    "MaxOutstandingR2T" => limits.max_outstanding_r2t.into(),
                    // iSER sessions stay at level 0: without digests there is nothing for
                    // SNACK or recovery R2Ts to mend, and the RDMA layer is reliable.
                    "ErrorRecoveryLevel" if self.config.transport == TransportKind::Iser => 0,
                    "ErrorRecoveryLevel" => limits.error_recovery_level.into(),
                    "iSCSIProtocolLevel" => 1,
                    _ => return NOT_UNDERSTOOD.into(),
                };
                let ours = ours.clamp(lo, hi);
                let result = keys::negotiate_number(def.negotiation, offered, ours);
                let s = &mut self.session;
                match k {
                    "MaxConnections" => s.max_connections = result as u16,
                    "MaxBurstLength" => s.max_burst_length = result as u32,
                    "FirstBurstLength" => s.first_burst_length = result as u32,
                    "DefaultTime2Wait" => s.default_time2wait = result as u16,
                    "DefaultTime2Retain" => s.default_time2retain = result as u16,
                    "MaxOutstandingR2T" => s.max_outstanding_r2t = result as u16,
                    "ErrorRecoveryLevel" => s.error_recovery_level = result as u8,
                    _ => s.iscsi_protocol_level = result as u8,
                }
                result.to_string()
            }
            Negotiation::And | Negotiation::Or => {
                let Ok(offered) = text::parse_bool(v) else {
                    return REJECT.into();
                };
                let ours = match k {
                    "InitialR2T" => limits.initial_r2t,
                    "ImmediateData" => limits.immediate_data,
                    "DataPDUInOrder" => limits.data_pdu_in_order,
                    "DataSequenceInOrder" => limits.data_sequence_in_order,
                    "RDMAExtensions" => self.config.transport == TransportKind::Iser,
                    // IFMarker/OFMarker: markers are never used.
                    _ => false,
                };
                let result = keys::negotiate_bool(def.negotiation, offered, ours);
                let s = &mut self.session;
                match k {
                    "InitialR2T" => s.initial_r2t = result,
                    "ImmediateData" => s.immediate_data = result,
                    "DataPDUInOrder" => s.data_pdu_in_order = result,
                    "DataSequenceInOrder" => s.data_sequence_in_order = result,
                    "RDMAExtensions" => s.rdma_extensions = result,
                    _ => {}
                }
                text::bool_str(result).into()
            }
            Negotiation::List => {
                let supported: &[&str] = match k {
                    "HeaderDigest" | "DataDigest"
                        if self.config.transport == TransportKind::Iser =>
                    {
                        &["None"]
                    }
                    "HeaderDigest" => limits.header_digest.supported(),
                    "DataDigest" => limits.data_digest.supported(),
                    "TaskReporting" => &["RFC3720"],
                    _ => &[],
                };
                match keys::negotiate_list(v, supported) {
                    Some(chosen) => {
                        let chosen = chosen.to_string();
                        match k {
                            "HeaderDigest" => self.connection.header_digest = chosen == "CRC32C",
                            "DataDigest" => self.connection.data_digest = chosen == "CRC32C",
                            _ => {
                                self.session.task_reporting =
                                    TaskReporting::from_name(&chosen).unwrap_or_default()
                            }
                        }
                        chosen
                    }
                    None => REJECT.into(),
                }
            }
            Negotiation::Declarative => {
                let Ok(value) = text::parse_number_in(v, lo, hi) else {
                    return REJECT.into();
                };
                match k {
                    "MaxRecvDataSegmentLength" => {
                        self.connection.max_send_data_segment_length = value as u32;
                        let ours = clamp_len(limits.max_recv_data_segment_length);
                        self.declared_recv = Some(ours);
                        ours.to_string()
                    }
                    "InitiatorRecvDataSegmentLength" => {
                        self.connection.initiator_recv_data_segment_length = value as u32;
                        value.to_string()
                    }
                    // The initiator's value is its expectation (Linux ib_iser offers 8192);
                    // what the target receives is the target's to declare: its own limit.
                    "TargetRecvDataSegmentLength" => {
                        let ours = clamp_len(limits.iser_recv_data_segment_length);
                        self.connection.target_recv_data_segment_length = ours;
                        self.declared_iser_recv = true;
                        ours.to_string()
                    }
                    _ => {
                        // MaxOutstandingUnexpectedPDUs: 0 or 2..
                        if value == 1 {
                            return REJECT.into();
                        }
                        self.connection.max_outstanding_unexpected_pdus_send = value as u32;
                        let ours = limits.max_outstanding_unexpected_pdus;
                        let ours = if ours == 1 { 2 } else { ours };
                        self.connection.max_outstanding_unexpected_pdus_recv = ours;
                        ours.to_string()
                    }
                }
            }
            Negotiation::Special => IRRELEVANT.into(),
        }
    }

    /// Declarations the target makes in its first operational response.
    fn operational_declarations(&mut self, replies: &mut Vec<(String, String)>) {
        let normal = self.session.session_type == SessionType::Normal;
        match self.config.transport {
            TransportKind::Tcp => {
                if self.declared_recv.is_none() {
                    let ours = clamp_len(self.config.limits.max_recv_data_segment_length);
                    self.declared_recv = Some(ours);
                    replies.push(("MaxRecvDataSegmentLength".into(), ours.to_string()));
                }
            }
            TransportKind::Iser => {
                if normal && !self.declared_iser_recv {
                    let ours = clamp_len(self.config.limits.iser_recv_data_segment_length);
                    self.declared_iser_recv = true;
                    self.connection.target_recv_data_segment_length = ours;
                    replies.push(("TargetRecvDataSegmentLength".into(), ours.to_string()));
                }
            }
        }
        // FirstBurstLength must not exceed MaxBurstLength (RFC 7143 §13.14).
        if self.session.first_burst_length > self.session.max_burst_length {
            let mbl = self.session.max_burst_length;
            self.session.first_burst_length = mbl;
            match replies.iter_mut().find(|(k, _)| k == "FirstBurstLength") {
                Some(r) => r.1 = mbl.to_string(),
                None if normal && self.leading() => {
                    replies.push(("FirstBurstLength".into(), mbl.to_string()))
                }
                None => {}
            }
        }
    }

    fn auth_method(&mut self, v: &str, replies: &mut Vec<(String, String)>) -> Result<(), Fail> {
        if !matches!(self.auth, AuthState::NotStarted) {
            return Err(Fail(LoginStatus::INITIATOR_ERROR));
        }
        let supported: &[&str] = match self.auth_required {
            AuthRequirement::None => &["None"],
            AuthRequirement::Chap { .. } => &["CHAP"],
        };
        match keys::negotiate_list(v, supported) {
            Some("CHAP") => {
                self.auth = AuthState::Chap(ChapState::AwaitAlgorithm);
                replies.push(("AuthMethod".into(), "CHAP".into()));
                Ok(())
            }
            Some(_) => {
                self.auth = AuthState::Done;
                replies.push(("AuthMethod".into(), "None".into()));
                Ok(())
            }
            None => Err(Fail(LoginStatus::AUTHENTICATION_FAILURE)),
        }
    }

    fn chap_step(
        &mut self,
        chap_keys: &[(String, String)],
        replies: &mut Vec<(String, String)>,
        rng: &mut dyn Entropy,
    ) -> Result<(), Fail> {
        let get = |name: &str| {
            chap_keys
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let auth_fail = || Fail(LoginStatus::AUTHENTICATION_FAILURE);
        let AuthState::Chap(state) = &self.auth else {
            if chap_keys.is_empty() {
                return Ok(());
            }
            return Err(auth_fail());
        };
        let AuthRequirement::Chap {
            credentials,
            mutual,
        } = &self.auth_required
        else {
            return Err(auth_fail());
        };
        match state {
            ChapState::AwaitAlgorithm => {
                if chap_keys.is_empty() {
                    // AuthMethod was just agreed in this request.
                    return Ok(());
                }
                let offered = get("CHAP_A").ok_or_else(auth_fail)?;
                if chap_keys.len() != 1 {
                    return Err(auth_fail());
                }
                let alg = chap::select_algorithm(offered, &self.config.limits.chap_algorithms)
                    .ok_or_else(auth_fail)?;
                let mut id = [0u8; 1];
                rng.fill(&mut id);
                let mut challenge = vec![0u8; alg.challenge_len()];
                rng.fill(&mut challenge);
                replies.push(("CHAP_A".into(), alg.code().to_string()));
                replies.push(("CHAP_I".into(), id[0].to_string()));
                replies.push(("CHAP_C".into(), text::encode_hex(&challenge)));
                self.auth = AuthState::Chap(ChapState::AwaitResponse {
                    alg,
                    id: id[0],
                    challenge,
                });
                Ok(())
            }
            ChapState::AwaitResponse { alg, id, challenge } => {
                if get("CHAP_A").is_some() {
                    return Err(auth_fail());
                }
                let name = get("CHAP_N").ok_or_else(auth_fail)?;
                let resp = get("CHAP_R").ok_or_else(auth_fail)?;
                // The user name is compared literally, even if it looks
                // like a hex or base64 item.
                if name != credentials.user {
                    return Err(auth_fail());
                }
                let resp = text::parse_binary(resp).map_err(|_| auth_fail())?;
                if !chap::verify(*alg, *id, &credentials.secret, challenge, &resp) {
                    return Err(auth_fail());
                }
                match (get("CHAP_I"), get("CHAP_C")) {
                    (None, None) => {}
                    (Some(mi), Some(mc)) => {
                        let Some(ChapCredentials { user, secret }) = mutual else {
                            return Err(auth_fail());
                        };
                        let mid = chap::parse_identifier(mi).ok_or_else(auth_fail)?;
                        let mchallenge = text::parse_binary(mc).map_err(|_| auth_fail())?;
                        if mchallenge.is_empty()
                            || mchallenge.len() > 1024
                            || mchallenge == *challenge
                        {
                            // Empty, oversized, or our own challenge reflected.
                            return Err(auth_fail());
                        }
                        let r = chap::response(*alg, mid, secret, &mchallenge);
                        replies.push(("CHAP_N".into(), user.clone()));
                        replies.push(("CHAP_R".into(), text::encode_hex(&r)));
                    }
                    _ => return Err(auth_fail()),
                }
                self.chap_user = Some(name.to_string());
                self.auth = AuthState::Done;
                Ok(())
            }
        }
    }

    fn finalize_params(&mut self) {
        self.connection.max_recv_data_segment_length =
            self.declared_recv.unwrap_or(DEFAULT_DATA_SEGMENT_LENGTH);
        if self.session.first_burst_length > self.session.max_burst_length {
            self.session.first_burst_length = self.session.max_burst_length;
        }
    }

    fn outcome(&self) -> LoginOutcome {
        LoginOutcome {
            session_type: self.session.session_type,
            initiator_name: self.session.initiator_name.clone(),
            target_name: self.session.target_name.clone(),
            isid: self.isid,
            cid: self.cid,
            tsih: self.tsih,
            leading: self.leading(),
            chap_user: self.chap_user.clone(),
            session: self.session.clone(),
            connection: self.connection,
        }
    }
}

fn clamp_len(v: u32) -> u32 {
    v.clamp(512, 16_777_215)
}
