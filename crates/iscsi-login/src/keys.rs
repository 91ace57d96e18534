//! The text key table (RFC 7143 §13, RFC 7144, RFC 7145) and the pure
//! negotiation functions each key uses.

/// How the result of a key is computed from the offer and the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Negotiation {
    /// Offer is a preference-ordered list; answer is the first supported item.
    List,
    /// Numerical, result = the smaller value.
    Min,
    /// Numerical, result = the larger value.
    Max,
    /// Boolean, result = Yes only if both say Yes.
    And,
    /// Boolean, result = Yes if either says Yes.
    Or,
    /// Each side states its own value; nothing is computed.
    Declarative,
    /// Handled by dedicated code (CHAP keys, SendTargets, marker ranges).
    Special,
}

/// Where in the protocol a key may appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyStage {
    /// Security negotiation stage only (AuthMethod, CHAP_*).
    Security,
    /// Operational negotiation stage of login (and FFP for `Use: ALL` keys).
    Operational,
    /// Either login stage (names, aliases, SessionType, TargetPortalGroupTag).
    AnyLoginStage,
    /// Full feature phase only (SendTargets).
    FullFeature,
}

/// RFC 7143 "Use": when a key may be negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUse {
    /// IO: login of any connection, never in full feature phase.
    InitialOnly,
    /// LO: login of the leading connection only.
    LeadingOnly,
    /// ALL: login and full feature phase.
    All,
    /// FFPO: full feature phase only.
    FullFeatureOnly,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Session,
    Connection,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    Initiator,
    Target,
    Both,
}

/// One row of the key table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDef {
    pub name: &'static str,
    pub negotiation: Negotiation,
    pub stage: KeyStage,
    pub usage: KeyUse,
    pub scope: Scope,
    pub sender: Sender,
    /// The RFC default, as it would be written on the wire ("" if none).
    pub default: &'static str,
    /// Inclusive numeric range for numerical keys.
    pub range: Option<(u64, u64)>,
    /// Session keys that mean nothing in a discovery session (answered
    /// `Irrelevant` there, as LIO and open-iscsi do).
    pub irrelevant_in_discovery: bool,
    /// Only meaningful on iSER connections.
    pub iser_only: bool,
}

const MAX24: u64 = 16_777_215;

// One positional row per key keeps the table readable as a table.
#[allow(clippy::too_many_arguments)]
const fn key(
    name: &'static str,
    negotiation: Negotiation,
    stage: KeyStage,
    usage: KeyUse,
    scope: Scope,
    sender: Sender,
    default: &'static str,
    range: Option<(u64, u64)>,
) -> KeyDef {
    KeyDef {
        name,
        negotiation,
        stage,
        usage,
        scope,
        sender,
        default,
        range,
        irrelevant_in_discovery: false,
        iser_only: false,
    }
}

const fn discovery_irrelevant(mut k: KeyDef) -> KeyDef {
    k.irrelevant_in_discovery = true;
    k
}

const fn iser(mut k: KeyDef) -> KeyDef {
    k.iser_only = true;
    k
}

use KeyStage::*;
use KeyUse::*;
use Negotiation::*;

/// Every key ironsan knows, in the order they are documented.
#[rustfmt::skip]
pub static KEYS: &[KeyDef] = &[
    key("AuthMethod", List, Security, InitialOnly, Scope::Connection, Sender::Both, "None", None),
    key("CHAP_A", Special, Security, InitialOnly, Scope::Connection, Sender::Both, "", None),
    key("CHAP_I", Special, Security, InitialOnly, Scope::Connection, Sender::Both, "", None),
    key("CHAP_C", Special, Security, InitialOnly, Scope::Connection, Sender::Both, "", None),
    key("CHAP_N", Special, Security, InitialOnly, Scope::Connection, Sender::Both, "", None),
    key("CHAP_R", Special, Security, InitialOnly, Scope::Connection, Sender::Both, "", None),
    key("HeaderDigest", List, Operational, InitialOnly, Scope::Connection, Sender::Both, "None", None),
    key("DataDigest", List, Operational, InitialOnly, Scope::Connection, Sender::Both, "None", None),
    discovery_irrelevant(key("MaxConnections", Min, Operational, LeadingOnly, Scope::Session, Sender::Both, "1", Some((1, 65_535)))),
    key("SendTargets", Special, FullFeature, FullFeatureOnly, Scope::Session, Sender::Initiator, "", None),
    key("TargetName", Declarative, AnyLoginStage, InitialOnly, Scope::Session, Sender::Initiator, "", None),
    key("InitiatorName", Declarative, AnyLoginStage, InitialOnly, Scope::Session, Sender::Initiator, "", None),
    key("TargetAlias", Declarative, AnyLoginStage, All, Scope::Session, Sender::Target, "", None),
    key("InitiatorAlias", Declarative, AnyLoginStage, All, Scope::Session, Sender::Initiator, "", None),
    key("TargetAddress", Declarative, AnyLoginStage, All, Scope::Session, Sender::Target, "", None),
    key("TargetPortalGroupTag", Declarative, AnyLoginStage, InitialOnly, Scope::Session, Sender::Target, "", Some((0, 65_535))),
    discovery_irrelevant(key("InitialR2T", Or, Operational, LeadingOnly, Scope::Session, Sender::Both, "Yes", None)),
    discovery_irrelevant(key("ImmediateData", And, Operational, LeadingOnly, Scope::Session, Sender::Both, "Yes", None)),
    key("MaxRecvDataSegmentLength", Declarative, Operational, All, Scope::Connection, Sender::Both, "8192", Some((512, MAX24))),
    discovery_irrelevant(key("MaxBurstLength", Min, Operational, LeadingOnly, Scope::Session, Sender::Both, "262144", Some((512, MAX24)))),
    discovery_irrelevant(key("FirstBurstLength", Min, Operational, LeadingOnly, Scope::Session, Sender::Both, "65536", Some((512, MAX24)))),
    key("DefaultTime2Wait", Max, Operational, LeadingOnly, Scope::Session, Sender::Both, "2", Some((0, 3600))),
    key("DefaultTime2Retain", Min, Operational, LeadingOnly, Scope::Session, Sender::Both, "20", Some((0, 3600))),
    discovery_irrelevant(key("MaxOutstandingR2T", Min, Operational, LeadingOnly, Scope::Session, Sender::Both, "1", Some((1, 65_535)))),
    discovery_irrelevant(key("DataPDUInOrder", Or, Operational, LeadingOnly, Scope::Session, Sender::Both, "Yes", None)),
    discovery_irrelevant(key("DataSequenceInOrder", Or, Operational, LeadingOnly, Scope::Session, Sender::Both, "Yes", None)),
    key("ErrorRecoveryLevel", Min, Operational, LeadingOnly, Scope::Session, Sender::Both, "0", Some((0, 2))),
    key("SessionType", Declarative, AnyLoginStage, LeadingOnly, Scope::Session, Sender::Initiator, "Normal", None),
    discovery_irrelevant(key("TaskReporting", List, Operational, LeadingOnly, Scope::Session, Sender::Both, "RFC3720", None)),
    key("iSCSIProtocolLevel", Min, Operational, LeadingOnly, Scope::Session, Sender::Both, "1", Some((0, 31))),
    // RFC 3720 markers, removed by RFC 7143: only "No" is ever agreed.
    key("IFMarker", And, Operational, InitialOnly, Scope::Connection, Sender::Both, "No", None),
    key("OFMarker", And, Operational, InitialOnly, Scope::Connection, Sender::Both, "No", None),
    key("IFMarkInt", Special, Operational, InitialOnly, Scope::Connection, Sender::Both, "2048~2048", None),
    key("OFMarkInt", Special, Operational, InitialOnly, Scope::Connection, Sender::Both, "2048~2048", None),
    // RFC 7145 (iSER). Both lengths may come from either side: open-iscsi
    // sends TargetRecvDataSegmentLength as its expectation (LIO: both).
    discovery_irrelevant(key("RDMAExtensions", And, Operational, LeadingOnly, Scope::Session, Sender::Both, "No", None)),
    discovery_irrelevant(iser(key("InitiatorRecvDataSegmentLength", Declarative, Operational, All, Scope::Connection, Sender::Both, "8192", Some((512, MAX24))))),
    discovery_irrelevant(iser(key("TargetRecvDataSegmentLength", Declarative, Operational, All, Scope::Connection, Sender::Both, "8192", Some((512, MAX24))))),
    discovery_irrelevant(iser(key("MaxOutstandingUnexpectedPDUs", Declarative, Operational, All, Scope::Connection, Sender::Both, "0", Some((0, u32::MAX as u64))))),
];

/// Looks a key up by its exact (case-sensitive) name.
pub fn lookup(name: &str) -> Option<&'static KeyDef> {
    KEYS.iter().find(|k| k.name == name)
}

/// True for the vendor-specific key namespaces (`X-…`, `X#…`, `Y#…`).
pub fn is_vendor_key(name: &str) -> bool {
    name.starts_with("X-") || name.starts_with("X#") || name.starts_with("Y#")
}

/// Reply values with special meaning (RFC 7143 §6.2).
pub const NOT_UNDERSTOOD: &str = "NotUnderstood";
pub const IRRELEVANT: &str = "Irrelevant";
pub const REJECT: &str = "Reject";

/// True if a value is one of the special reply constants.
pub fn is_special_reply(value: &str) -> bool {
    matches!(value, NOT_UNDERSTOOD | IRRELEVANT | REJECT)
}

/// List negotiation: the first item of `offered` (in the offerer's order)
/// that appears in `supported`. Items are compared exactly; an empty item
/// never matches.
pub fn negotiate_list<'a>(offered: &'a str, supported: &[&str]) -> Option<&'a str> {
    offered
        .split(',')
        .find(|item| !item.is_empty() && supported.contains(item))
}

/// Numerical negotiation result for `Min`/`Max` keys.
pub fn negotiate_number(negotiation: Negotiation, offered: u64, ours: u64) -> u64 {
    match negotiation {
        Negotiation::Max => offered.max(ours),
        _ => offered.min(ours),
    }
}

/// Boolean negotiation result for `And`/`Or` keys.
pub fn negotiate_bool(negotiation: Negotiation, offered: bool, ours: bool) -> bool {
    match negotiation {
        Negotiation::Or => offered || ours,
        _ => offered && ours,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_unique_names_and_sane_ranges() {
        for (i, a) in KEYS.iter().enumerate() {
            for b in &KEYS[i + 1..] {
                assert_ne!(a.name, b.name);
            }
            if matches!(a.negotiation, Min | Max) {
                let (lo, hi) = a.range.expect("numeric key needs a range");
                let d: u64 = a.default.parse().unwrap();
                assert!(lo <= d && d <= hi, "{}", a.name);
            }
            assert!(a.name.len() <= 63);
        }
    }

    #[test]
    fn functions_per_rfc() {
        let f = |n: &str| lookup(n).unwrap().negotiation;
        assert_eq!(f("MaxConnections"), Min);
        assert_eq!(f("DefaultTime2Wait"), Max);
        assert_eq!(f("DefaultTime2Retain"), Min);
        assert_eq!(f("InitialR2T"), Or);
        assert_eq!(f("ImmediateData"), And);
        assert_eq!(f("DataPDUInOrder"), Or);
        assert_eq!(f("DataSequenceInOrder"), Or);
        assert_eq!(f("MaxRecvDataSegmentLength"), Declarative);
        assert_eq!(f("HeaderDigest"), List);
        assert_eq!(f("ErrorRecoveryLevel"), Min);
        assert_eq!(f("RDMAExtensions"), And);
        assert_eq!(lookup("MaxBurstLength").unwrap().range, Some((512, MAX24)));
        assert!(lookup("maxburstlength").is_none());
        assert!(lookup("MaxXmitDataSegmentLength").is_none());
        assert!(lookup("InitialR2T").unwrap().irrelevant_in_discovery);
        assert!(!lookup("DefaultTime2Wait").unwrap().irrelevant_in_discovery);
        assert_eq!(lookup("SendTargets").unwrap().usage, FullFeatureOnly);
        assert_eq!(lookup("MaxConnections").unwrap().usage, LeadingOnly);
        assert_eq!(lookup("HeaderDigest").unwrap().scope, Scope::Connection);
    }

    #[test]
    fn list_negotiation() {
        assert_eq!(
            negotiate_list("CRC32C,None", &["None", "CRC32C"]),
            Some("CRC32C")
        );
        assert_eq!(
            negotiate_list("None,CRC32C", &["CRC32C", "None"]),
            Some("None")
        );
        assert_eq!(negotiate_list("CRC32C", &["None"]), None);
        assert_eq!(negotiate_list("", &["None"]), None);
        assert_eq!(negotiate_list("Non", &["None"]), None);
        assert_eq!(negotiate_list(",None", &["None"]), Some("None"));
    }

    #[test]
    fn number_and_bool_negotiation() {
        assert_eq!(negotiate_number(Min, 10, 5), 5);
        assert_eq!(negotiate_number(Min, 5, 10), 5);
        assert_eq!(negotiate_number(Max, 5, 10), 10);
        assert_eq!(negotiate_number(Max, 10, 5), 10);
        for a in [false, true] {
            for b in [false, true] {
                assert_eq!(negotiate_bool(And, a, b), a && b);
                assert_eq!(negotiate_bool(Or, a, b), a || b);
            }
        }
    }

    #[test]
    fn vendor_keys() {
        assert!(is_vendor_key("X-com.example.foo"));
        assert!(is_vendor_key("X#1234.foo"));
        assert!(!is_vendor_key("Xfoo"));
    }
}
