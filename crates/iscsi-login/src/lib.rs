//! iscsi-login: the sans-IO login and text-negotiation core of iSCSI
//! (RFC 7143, with the RFC 7144 and RFC 7145 keys) for both the target and
//! the initiator side, plus CHAP authentication. It never touches sockets,
//! clocks or threads: the runtime feeds it Login PDUs decoded by the codec
//! (`iscsi_wire`'s header structs with their data segments, see [`pdu`]) and
//! the fields of Text PDUs, and sends the responses it returns.

pub mod chap;
pub mod directory;
pub mod initiator;
pub mod keys;
pub mod params;
pub mod pdu;
pub mod target;
pub mod text;
pub mod textneg;

pub use chap::{ChapAlgorithm, ChapCredentials, Entropy};
pub use directory::{AuthRequirement, Portal, StaticDirectory, StaticTarget, TargetDirectory};
pub use initiator::{
    DesiredSession, DigestPreference, InitiatorAuth, InitiatorLogin, InitiatorLoginConfig,
    InitiatorStep, LoginError,
};
pub use params::{ConnectionParams, SessionParams, SessionType, TaskReporting, TransportKind};
pub use pdu::{LoginRequest, LoginResponse, LoginStatus, Stage};
pub use target::{
    DigestPolicy, ExistingSession, LoginOutcome, LoginState, LoginStep, SessionIdentity,
    TargetLimits, TargetLogin, TargetLoginConfig,
};
pub use textneg::{
    negotiate_text, parse_send_targets, send_targets, DiscoveredTarget, TargetAddress, TextContext,
    TextPiece, TextResponder,
};
