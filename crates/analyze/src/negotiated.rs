//! The operational parameters a connection negotiated at login, as far as the capture shows
//! the exchange: digests (which the framer then needs not guess) and the keys that shape the
//! data phases (InitialR2T, ImmediateData, FirstBurstLength, MaxBurstLength,
//! MaxOutstandingR2T, each side's MaxRecvDataSegmentLength).

use serde::Serialize;

use crate::iscsi::Dir;

/// RFC 7143 defaults, for keys the login did not mention (or a capture without the login).
pub const DEFAULT_INITIAL_R2T: bool = true;
pub const DEFAULT_IMMEDIATE_DATA: bool = true;
pub const DEFAULT_FIRST_BURST_LENGTH: u32 = 65536;
pub const DEFAULT_MAX_BURST_LENGTH: u32 = 262144;
pub const DEFAULT_MAX_OUTSTANDING_R2T: u32 = 1;

/// What the login of one connection settled. `None`: the key was not seen in a settled form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Negotiated {
    /// A Login PDU was in the capture.
    pub login_seen: bool,
    /// The target's final Login Response (transit to full feature, status success) was seen.
    pub login_complete: bool,
    pub header_digest: Option<bool>,
    pub data_digest: Option<bool>,
    pub initial_r2t: Option<bool>,
    pub immediate_data: Option<bool>,
    pub first_burst_length: Option<u32>,
    pub max_burst_length: Option<u32>,
    pub max_outstanding_r2t: Option<u32>,
    /// Declared by the target: the largest data segment it receives (Data-Out, immediate).
    pub target_max_recv_data_segment_length: Option<u32>,
    /// Declared by the initiator: the largest data segment it receives (Data-In).
    pub initiator_max_recv_data_segment_length: Option<u32>,
}

fn yes_no(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn digest_value(v: &str) -> Option<bool> {
    match v {
        "None" => Some(false),
        "CRC32C" => Some(true),
        _ => None,
    }
}

impl Negotiated {
    /// Takes the key=value pairs of one Login (or Text) PDU sent in direction `dir`. A value
    /// that is a list (an offer such as `None,CRC32C`) or a refusal (`NotUnderstood`,
    /// `Irrelevant`, `Reject`) settles nothing; otherwise the later PDU of the exchange (the
    /// answer) wins over the earlier (the offer), which is how the negotiated result appears
    /// on the wire for every key kept here.
    pub fn apply(&mut self, dir: Dir, pairs: &[String]) {
        for pair in pairs {
            let Some((key, value)) = pair.split_once('=') else {
                continue;
            };
            if value.contains(',') {
                continue;
            }
            let number = || value.parse::<u32>().ok();
            match key {
                "HeaderDigest" => self.header_digest = digest_value(value).or(self.header_digest),
                "DataDigest" => self.data_digest = digest_value(value).or(self.data_digest),
                "InitialR2T" => self.initial_r2t = yes_no(value).or(self.initial_r2t),
                "ImmediateData" => self.immediate_data = yes_no(value).or(self.immediate_data),
                "FirstBurstLength" => {
                    self.first_burst_length = number().or(self.first_burst_length)
                }
                "MaxBurstLength" => self.max_burst_length = number().or(self.max_burst_length),
                "MaxOutstandingR2T" => {
                    self.max_outstanding_r2t = number().or(self.max_outstanding_r2t)
                }
                "MaxRecvDataSegmentLength" => match dir {
                    Dir::ToTarget => {
                        self.initiator_max_recv_data_segment_length =
                            number().or(self.initiator_max_recv_data_segment_length)
                    }
                    Dir::ToInitiator => {
                        self.target_max_recv_data_segment_length =
                            number().or(self.target_max_recv_data_segment_length)
                    }
                },
                _ => {}
            }
        }
    }

    /// The digests in force once the login completed (None before that).
    pub fn digests(&self) -> Option<(bool, bool)> {
        self.login_complete.then(|| {
            (
                self.header_digest.unwrap_or(false),
                self.data_digest.unwrap_or(false),
            )
        })
    }

    pub fn initial_r2t_or_default(&self) -> bool {
        self.initial_r2t.unwrap_or(DEFAULT_INITIAL_R2T)
    }

    pub fn immediate_data_or_default(&self) -> bool {
        self.immediate_data.unwrap_or(DEFAULT_IMMEDIATE_DATA)
    }

    pub fn first_burst_length_or_default(&self) -> u32 {
        self.first_burst_length
            .unwrap_or(DEFAULT_FIRST_BURST_LENGTH)
    }

    pub fn max_burst_length_or_default(&self) -> u32 {
        self.max_burst_length.unwrap_or(DEFAULT_MAX_BURST_LENGTH)
    }

    pub fn max_outstanding_r2t_or_default(&self) -> u32 {
        self.max_outstanding_r2t
            .unwrap_or(DEFAULT_MAX_OUTSTANDING_R2T)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: &[&str]) -> Vec<String> {
        s.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn the_answer_settles_a_key_and_offers_do_not() {
        let mut n = Negotiated::default();
        n.apply(
            Dir::ToTarget,
            &pairs(&[
                "HeaderDigest=None,CRC32C",
                "InitialR2T=No",
                "MaxBurstLength=262144",
                "MaxRecvDataSegmentLength=262144",
            ]),
        );
        n.apply(
            Dir::ToInitiator,
            &pairs(&[
                "HeaderDigest=CRC32C",
                "InitialR2T=Yes",
                "MaxBurstLength=65536",
                "MaxRecvDataSegmentLength=8192",
                "DataDigest=NotUnderstood",
            ]),
        );
        assert_eq!(n.header_digest, Some(true));
        assert_eq!(n.data_digest, None);
        assert_eq!(n.initial_r2t, Some(true));
        assert_eq!(n.max_burst_length, Some(65536));
        assert_eq!(n.initiator_max_recv_data_segment_length, Some(262144));
        assert_eq!(n.target_max_recv_data_segment_length, Some(8192));
        assert_eq!(n.digests(), None, "not before the login completes");
        n.login_complete = true;
        assert_eq!(n.digests(), Some((true, false)));
        assert_eq!(
            n.first_burst_length_or_default(),
            DEFAULT_FIRST_BURST_LENGTH
        );
    }
}
