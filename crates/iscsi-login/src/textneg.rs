//! Full-feature-phase Text negotiation: the keys allowed after login,
//! SendTargets (target answer and initiator parsing), and splitting long
//! Text responses into PDUs with the C bit and a target transfer tag.

use std::fmt;

use crate::directory::TargetDirectory;
use crate::keys::{self, KeyUse, NOT_UNDERSTOOD, REJECT};
use crate::params::{ConnectionParams, SessionParams, SessionType, TransportKind};
use crate::text::{self, TextError};

/// The reserved "no tag" value for ITT/TTT.
pub const NO_TAG: u32 = 0xffff_ffff;

/// Why a SendTargets value cannot be answered with a target list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendTargetsError {
    /// Not `All`, empty, or an iSCSI name (`iqn.`, `eui.`, `naa.`).
    InvalidValue(String),
}

impl fmt::Display for SendTargetsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendTargetsError::InvalidValue(v) => write!(f, "invalid SendTargets value {v:?}"),
        }
    }
}

impl std::error::Error for SendTargetsError {}

fn is_iscsi_name(v: &str) -> bool {
    v.starts_with("iqn.") || v.starts_with("eui.") || v.starts_with("naa.")
}

/// Answers `SendTargets=<value>`.
///
/// - `All`: in a discovery session every target `initiator` may use; in a
///   normal session only the current target (libiscsi's SendTargets test
///   runs in a normal session and expects a successful answer).
/// - empty: the current target (nothing in a discovery session).
/// - an iSCSI name: that target if it exists and `initiator` may use it,
///   else an empty answer.
///
/// Each target is `TargetName=` followed by one `TargetAddress=addr:port,tpgt`
/// per portal. Anything else (`Alle`, `A`, ...) is an error; the caller
/// answers `SendTargets=Reject` ([`negotiate_text`] does).
pub fn send_targets(
    value: &str,
    directory: &dyn TargetDirectory,
    session_type: SessionType,
    current_target: Option<&str>,
    initiator: &str,
) -> Result<Vec<(String, String)>, SendTargetsError> {
    let names: Vec<String> = match value {
        "All" => match session_type {
            SessionType::Discovery => directory.target_names(),
            SessionType::Normal => current_target.map(str::to_string).into_iter().collect(),
        },
        "" => current_target.map(str::to_string).into_iter().collect(),
        v if is_iscsi_name(v) => vec![v.to_string()],
        v => return Err(SendTargetsError::InvalidValue(v.to_string())),
    };
    let mut out = Vec::new();
    for name in names {
        if !directory.target_exists(&name) || !directory.initiator_allowed(&name, initiator) {
            continue;
        }
        let portals = directory.portals(&name);
        out.push(("TargetName".to_string(), name));
        for p in portals {
            out.push(("TargetAddress".to_string(), p.target_address()));
        }
    }
    Ok(out)
}

/// What [`negotiate_text`] needs to know about the session.
pub struct TextContext<'a> {
    pub directory: &'a dyn TargetDirectory,
    pub transport: TransportKind,
    /// Our MaxRecvDataSegmentLength, declared back when the initiator
    /// declares its own.
    pub our_max_recv_data_segment_length: u32,
}

/// Target side: answers the keys of a full-feature Text Request and
/// updates the parameters they change. Keys allowed after login are
/// `SendTargets`, `MaxRecvDataSegmentLength`, `InitiatorAlias` and the
/// iSER length keys; other known keys are answered `Reject`, unknown and
/// vendor keys `NotUnderstood`, a key repeated in one request `Reject`.
pub fn negotiate_text(
    pairs: &[(String, String)],
    session: &mut SessionParams,
    connection: &mut ConnectionParams,
    ctx: &TextContext<'_>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (k, v) in pairs {
        if !seen.insert(k.as_str()) {
            out.push((k.clone(), REJECT.into()));
            continue;
        }
        let Some(def) = keys::lookup(k) else {
            out.push((k.clone(), NOT_UNDERSTOOD.into()));
            continue;
        };
        match k.as_str() {
            "SendTargets" => {
                match send_targets(
                    v,
                    ctx.directory,
                    session.session_type,
                    session.target_name.as_deref(),
                    &session.initiator_name,
                ) {
                    Ok(list) => out.extend(list),
                    Err(_) => out.push((k.clone(), REJECT.into())),
                }
            }
            "MaxRecvDataSegmentLength" => match text::parse_number_in(v, 512, 16_777_215) {
                Ok(n) => {
                    connection.max_send_data_segment_length = n as u32;
                    let ours = ctx.our_max_recv_data_segment_length.clamp(512, 16_777_215);
                    connection.max_recv_data_segment_length = ours;
                    out.push((k.clone(), ours.to_string()));
                }
                Err(_) => out.push((k.clone(), REJECT.into())),
            },
            "InitiatorAlias" => session.initiator_alias = Some(v.clone()),
            "InitiatorRecvDataSegmentLength" if ctx.transport == TransportKind::Iser => {
                match text::parse_number_in(v, 512, 16_777_215) {
                    Ok(n) => {
                        connection.initiator_recv_data_segment_length = n as u32;
                        out.push((k.clone(), n.to_string()));
                    }
                    Err(_) => out.push((k.clone(), REJECT.into())),
                }
            }
            _ if def.usage == KeyUse::All && def.sender != keys::Sender::Target => {
                out.push((k.clone(), keys::IRRELEVANT.into()))
            }
            _ => out.push((k.clone(), REJECT.into())),
        }
    }
    out
}

/// One Text Response PDU's worth of a (possibly long) answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextPiece {
    /// F bit: last piece.
    pub final_: bool,
    /// C bit: more follows (never together with F).
    pub cont: bool,
    /// TTT to put in the response: `NO_TAG` on the final piece.
    pub ttt: u32,
    pub data: Vec<u8>,
}

/// Why a continuation request does not fit the response in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextContinueError {
    /// The request's TTT is not the one we handed out.
    WrongTag { expected: u32, got: u32 },
    /// A continuation request must be empty.
    NotEmpty,
    /// Everything was sent already.
    Finished,
}

/// Target side: hands out a long Text response in pieces no longer than
/// the initiator's MaxRecvDataSegmentLength. Every piece but the last has
/// C=1 and a TTT; the initiator fetches the next with an empty Text
/// Request echoing that TTT.
#[derive(Debug, Clone)]
pub struct TextResponder {
    data: Vec<u8>,
    offset: usize,
    max: usize,
    ttt: u32,
    started: bool,
}

impl TextResponder {
    /// `ttt` is the tag used while pieces remain (must not be `NO_TAG`;
    /// it is replaced by 0 if it is).
    pub fn new(data: Vec<u8>, max_segment: u32, ttt: u32) -> Self {
        TextResponder {
            data,
            offset: 0,
            max: (max_segment as usize).max(1),
            ttt: if ttt == NO_TAG { 0 } else { ttt },
            started: false,
        }
    }

    pub fn is_done(&self) -> bool {
        self.started && self.offset >= self.data.len()
    }

    /// The first piece (call once).
    pub fn first_piece(&mut self) -> TextPiece {
        self.piece()
    }

    fn piece(&mut self) -> TextPiece {
        self.started = true;
        let end = (self.offset + self.max).min(self.data.len());
        let data = self.data[self.offset..end].to_vec();
        self.offset = end;
        let last = self.offset >= self.data.len();
        TextPiece {
            final_: last,
            cont: !last,
            ttt: if last { NO_TAG } else { self.ttt },
            data,
        }
    }

    /// The next piece, for a continuation request with `ttt` and `data`.
    pub fn on_continue(&mut self, ttt: u32, data: &[u8]) -> Result<TextPiece, TextContinueError> {
        if self.is_done() {
            return Err(TextContinueError::Finished);
        }
        if ttt != self.ttt {
            return Err(TextContinueError::WrongTag {
                expected: self.ttt,
                got: ttt,
            });
        }
        if !data.is_empty() {
            return Err(TextContinueError::NotEmpty);
        }
        Ok(self.piece())
    }
}

/// A target found by SendTargets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredTarget {
    pub name: String,
    pub addresses: Vec<TargetAddress>,
}

/// A parsed `TargetAddress` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetAddress {
    /// Host name or address, without IPv6 brackets.
    pub host: String,
    /// 3260 when the value names no port.
    pub port: u16,
    pub tpgt: Option<u16>,
}

impl TargetAddress {
    /// Parses `host[:port][,tpgt]`, with IPv6 hosts in brackets.
    pub fn parse(v: &str) -> Option<TargetAddress> {
        let (hostport, tpgt) = match v.rsplit_once(',') {
            Some((hp, t)) => (hp, Some(t.parse::<u16>().ok()?)),
            None => (v, None),
        };
        let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
            let (h, after) = rest.split_once(']')?;
            let port = match after {
                "" => 3260,
                p => p.strip_prefix(':')?.parse().ok()?,
            };
            (h.to_string(), port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().ok()?),
                None => (hostport.to_string(), 3260),
            }
        };
        if host.is_empty() {
            return None;
        }
        Some(TargetAddress { host, port, tpgt })
    }
}

/// A SendTargets answer the initiator cannot use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoveryError {
    Text(TextError),
    /// A key other than TargetName/TargetAddress (e.g. `SendTargets=Reject`).
    UnexpectedKey(String, String),
    /// TargetAddress before any TargetName.
    AddressWithoutTarget,
    BadAddress(String),
}

impl fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiscoveryError::Text(e) => write!(f, "bad SendTargets text: {e}"),
            DiscoveryError::UnexpectedKey(k, v) => {
                write!(f, "target answered SendTargets with {k}={v}")
            }
            DiscoveryError::AddressWithoutTarget => write!(f, "TargetAddress before TargetName"),
            DiscoveryError::BadAddress(a) => write!(f, "bad TargetAddress {a:?}"),
        }
    }
}

impl std::error::Error for DiscoveryError {}

/// Initiator side: parses a (reassembled) SendTargets Text response.
pub fn parse_send_targets(data: &[u8]) -> Result<Vec<DiscoveredTarget>, DiscoveryError> {
    let pairs = text::parse(data).map_err(DiscoveryError::Text)?;
    let mut out: Vec<DiscoveredTarget> = Vec::new();
    for (k, v) in pairs {
        match k.as_str() {
            "TargetName" => out.push(DiscoveredTarget {
                name: v,
                addresses: Vec::new(),
            }),
            "TargetAddress" => {
                let a = TargetAddress::parse(&v).ok_or(DiscoveryError::BadAddress(v.clone()))?;
                out.last_mut()
                    .ok_or(DiscoveryError::AddressWithoutTarget)?
                    .addresses
                    .push(a);
            }
            _ => return Err(DiscoveryError::UnexpectedKey(k, v)),
        }
    }
    Ok(out)
}
