//! A raw iSCSI initiator over TCP: PDUs are built byte by byte from RFC 7143's layouts
//! (not with the project's codec, see [`crate::pdu`]), so tests check the target against the
//! standard rather than against our own encoder. Also the target these tests start (one RAM
//! LUN 0 on an ephemeral loopback port) and round trips through it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use crate::pdu::{be32, bhs, crc32c, key_values, parse_keys, pattern, put32, read10, write10};
pub use crate::target::log_from_env;

pub const IQN: &str = "iqn.2026-11.org.ironsan.test:raw";
pub const INITIATOR: &str = "iqn.2026-11.org.ironsan.test:raw-initiator";
/// Every wait in these tests is bounded by this.
pub const WAIT: Duration = Duration::from_secs(10);

/// Starts a target with one 64 MiB RAM LUN 0 on an ephemeral loopback port.
pub async fn start_target(extra_config: &str) -> SocketAddr {
    start_target_with_lun(extra_config, "size = \"64MiB\"\nbackend = \"memory\"").await
}

/// [`start_target`] with LUN 0 configured by `lun_config` (its table's keys).
pub async fn start_target_with_lun(extra_config: &str, lun_config: &str) -> SocketAddr {
    start_target_with(extra_config, "", lun_config).await
}

/// A target [`IQN`] on an ephemeral loopback port: `top` top-level configuration,
/// `target_keys` in the one target's table, LUN 0 configured by `lun_config`.
pub async fn start_target_with(top: &str, target_keys: &str, lun_config: &str) -> SocketAddr {
    let text = crate::one_lun_config("[\"127.0.0.1:0\"]", top, IQN, target_keys, lun_config);
    crate::start_target(&text).await
}

/// The status (class, detail) of a Login Response.
pub fn login_status(r: &Rx) -> [u8; 2] {
    [r.bhs[36], r.bhs[37]]
}

/// One received PDU: the 48-byte BHS and the data segment (padding dropped).
#[derive(Debug, Clone)]
pub struct Rx {
    pub bhs: [u8; 48],
    pub data: Vec<u8>,
}

impl Rx {
    pub fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3f
    }
    pub fn itt(&self) -> u32 {
        be32(&self.bhs[16..20])
    }
    pub fn field32(&self, at: usize) -> u32 {
        be32(&self.bhs[at..at + 4])
    }
}

/// One iSCSI/TCP connection driven PDU by PDU.
pub struct RawConn {
    pub stream: TcpStream,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub next_itt: u32,
    pub tsih: u16,
    pub cid: u16,
    pub isid: [u8; 6],
    /// The target's MaxRecvDataSegmentLength: our Data-Out limit.
    pub target_mrdsl: usize,
    pub params: HashMap<String, String>,
    /// DataDigest=CRC32C was negotiated: data segments carry a digest both ways, and every
    /// received one is checked.
    pub data_digest: bool,
    /// Data digests received and found correct.
    pub digests_checked: usize,
    /// The TargetName logged in to (default [`IQN`]).
    pub target_name: String,
    /// HeaderDigest=CRC32C was negotiated: every header carries one both ways.
    pub header_digest: bool,
    /// Flip a bit of the next PDU sent: in its header digest (`Header`) or its data
    /// digest (`Data`), as a bad link would.
    pub corrupt_next: Option<Corrupt>,
}

/// Which digest of the next PDU sent is made wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corrupt {
    Header,
    Data,
}

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> RawConn {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("connect in time")
            .expect("connect");
        stream.set_nodelay(true).unwrap();
        RawConn {
            stream,
            cmd_sn: 0,
            exp_stat_sn: 0,
            next_itt: 1,
            tsih: 0,
            cid: 1,
            isid: [0x80, 0, 0, 0x12, 0x34, 0x56],
            target_mrdsl: 8192,
            params: HashMap::new(),
            data_digest: false,
            digests_checked: 0,
            target_name: IQN.to_string(),
            header_digest: false,
            corrupt_next: None,
        }
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("send");
    }

    /// Sends a BHS and a data segment with its padding (and the digests negotiated).
    pub async fn send(&mut self, bhs: &[u8; 48], data: &[u8]) {
        let corrupt = self.corrupt_next.take();
        let mut buf = bhs.to_vec();
        if self.header_digest {
            let mut crc = crc32c(bhs);
            if corrupt == Some(Corrupt::Header) {
                crc ^= 1;
            }
            buf.extend_from_slice(&crc.to_le_bytes());
        }
        let data_at = buf.len();
        buf.extend_from_slice(data);
        buf.resize(data_at + data.len().next_multiple_of(4), 0);
        if self.data_digest && !data.is_empty() {
            let mut crc = crc32c(&buf[data_at..]);
            if corrupt == Some(Corrupt::Data) {
                crc ^= 1;
            }
            buf.extend_from_slice(&crc.to_le_bytes());
        }
        self.send_raw(&buf).await;
    }

    /// Reads the header digest after a BHS (and AHS), when negotiated, and checks it.
    async fn header_digest_in(&mut self, bhs: &[u8; 48], ahs: &[u8]) -> Option<()> {
        if !self.header_digest {
            return Some(());
        }
        let mut got = [0u8; 4];
        tokio::time::timeout(WAIT, self.stream.read_exact(&mut got))
            .await
            .expect("a header digest in time")
            .ok()?;
        let mut header = bhs.to_vec();
        header.extend_from_slice(ahs);
        assert_eq!(u32::from_le_bytes(got), crc32c(&header), "header digest");
        Some(())
    }

    /// Receives one PDU (no digests), or None at EOF / connection reset.
    pub async fn try_recv(&mut self) -> Option<Rx> {
        let mut bhs = [0u8; 48];
        let r = tokio::time::timeout(WAIT, self.stream.read_exact(&mut bhs))
            .await
            .expect("a PDU or EOF in time");
        r.ok()?;
        let len = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
        let ahs = bhs[4] as usize * 4;
        let mut ahs_bytes = vec![0u8; ahs];
        tokio::time::timeout(WAIT, self.stream.read_exact(&mut ahs_bytes))
            .await
            .expect("an AHS in time")
            .ok()?;
        self.header_digest_in(&bhs, &ahs_bytes).await?;
        let digest_len = if self.data_digest && len > 0 { 4 } else { 0 };
        let mut rest = ahs_bytes;
        rest.resize(ahs + len.next_multiple_of(4) + digest_len, 0);
        tokio::time::timeout(WAIT, self.stream.read_exact(&mut rest[ahs..]))
            .await
            .expect("a data segment in time")
            .ok()?;
        if digest_len > 0 {
            let (segment, got) = rest[ahs..].split_at(len.next_multiple_of(4));
            assert_eq!(
                u32::from_le_bytes(got.try_into().unwrap()),
                crc32c(segment),
                "data digest of a PDU with opcode 0x{:02x}",
                bhs[0] & 0x3f
            );
            self.digests_checked += 1;
        }
        Some(Rx {
            bhs,
            data: rest[ahs..ahs + len].to_vec(),
        })
    }

    /// Receives one PDU if one arrives within `d`.
    pub async fn recv_within(&mut self, d: Duration) -> Option<Rx> {
        let mut bhs = [0u8; 48];
        tokio::time::timeout(d, self.stream.read_exact(&mut bhs))
            .await
            .ok()?
            .ok()?;
        let len = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
        let digests =
            4 * (usize::from(self.header_digest) + usize::from(self.data_digest && len > 0));
        let mut rest = vec![0u8; bhs[4] as usize * 4 + len.next_multiple_of(4) + digests];
        tokio::time::timeout(WAIT, self.stream.read_exact(&mut rest))
            .await
            .ok()?
            .ok()?;
        Some(Rx { bhs, data: rest })
    }

    pub async fn recv(&mut self) -> Rx {
        self.try_recv().await.expect("a PDU, not EOF")
    }

    /// True when the target closes the connection (EOF or reset) within the wait, after
    /// skipping at most `max_pdus` PDUs it sends first (a Reject, a login response).
    pub async fn closed_by_target(&mut self, max_pdus: usize) -> bool {
        for _ in 0..=max_pdus {
            if self.try_recv().await.is_none() {
                return true;
            }
        }
        false
    }

    /// One Login Request; returns the response.
    pub async fn login_request(&mut self, csg: u8, nsg: u8, transit: bool, keys: &[u8]) -> Rx {
        let mut b = bhs(
            0x43,
            (u8::from(transit) << 7) | (csg << 2) | nsg,
            keys.len(),
            0x4000_0000,
        );
        b[8..14].copy_from_slice(&self.isid);
        b[14..16].copy_from_slice(&self.tsih.to_be_bytes());
        b[20..22].copy_from_slice(&self.cid.to_be_bytes());
        b[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        b[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
        self.send(&b, keys).await;
        self.recv().await
    }

    /// Security stage with AuthMethod=None, then the operational stage with `keys`; enters
    /// full feature phase. Returns the negotiated keys.
    pub async fn login(&mut self, cid: u16, keys: &[(&str, &str)]) -> HashMap<String, String> {
        let first = key_values(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", &self.target_name),
            ("SessionType", "Normal"),
            ("AuthMethod", "None"),
        ]);
        self.cid = cid;
        let r = self.login_request(0, 1, true, &first).await;
        assert_eq!(r.opcode(), 0x23, "login response");
        assert_eq!(login_status(&r), [0, 0], "security stage status");
        self.took_login_response(&r);
        assert_eq!(
            self.operational_stage(keys).await,
            [0, 0],
            "operational stage status"
        );
        self.params.clone()
    }

    /// Takes the ExpStatSN a Login Response that passed gives (the TSIH counts only in the
    /// final one, which [`RawConn::operational_stage`] takes).
    pub fn took_login_response(&mut self, r: &Rx) {
        self.exp_stat_sn = r.field32(24).wrapping_add(1);
    }

    /// After a security stage that passed: the operational stage with `keys`, to full
    /// feature phase. Returns the Login Response's status (class, detail); when it is
    /// 0x0000 the connection is in full feature phase with the negotiated keys in `params`.
    pub async fn operational_stage(&mut self, keys: &[(&str, &str)]) -> [u8; 2] {
        let r = self.login_request(1, 3, true, &key_values(keys)).await;
        assert_eq!(r.opcode(), 0x23, "login response");
        let status = login_status(&r);
        if status != [0, 0] {
            return status;
        }
        assert!(r.bhs[1] & 0x80 != 0, "transit to full feature");
        self.took_login_response(&r);
        self.tsih = u16::from_be_bytes([r.bhs[14], r.bhs[15]]);
        self.cmd_sn = r.field32(28);
        self.params = parse_keys(&r.data);
        self.target_mrdsl = self
            .params
            .get("MaxRecvDataSegmentLength")
            .map(|v| v.parse().unwrap())
            .unwrap_or(8192);
        status
    }

    /// A discovery session's login (no target name, AuthMethod=None); enters full feature
    /// phase.
    pub async fn login_discovery(&mut self) {
        let keys = key_values(&[
            ("InitiatorName", INITIATOR),
            ("SessionType", "Discovery"),
            ("AuthMethod", "None"),
        ]);
        let r = self.login_request(0, 1, true, &keys).await;
        assert_eq!(login_status(&r), [0, 0], "discovery security stage status");
        self.took_login_response(&r);
        assert_eq!(
            self.operational_stage(&[("HeaderDigest", "None")]).await,
            [0, 0],
            "discovery login"
        );
    }

    pub fn itt(&mut self) -> u32 {
        self.next_itt += 1;
        self.next_itt
    }

    /// A SCSI Command BHS for LUN 0 with the next CmdSN.
    pub fn scsi_bhs(&mut self, cdb: &[u8], read_len: u32, write_len: u32, imm: usize) -> [u8; 48] {
        let itt = self.itt();
        let flags =
            0x80 | if read_len > 0 { 0x40 } else { 0 } | if write_len > 0 { 0x20 } else { 0 } | 1;
        let mut b = bhs(0x01, flags, imm, itt);
        b[20..24].copy_from_slice(&(read_len.max(write_len)).to_be_bytes());
        b[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        b[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
        b[32..32 + cdb.len()].copy_from_slice(cdb);
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        b
    }

    /// Runs one command to completion: answers R2Ts from `data_out`, gathers Data-In.
    /// Returns (SCSI status, sense/response data, read data).
    pub async fn command(
        &mut self,
        cdb: &[u8],
        read_len: u32,
        data_out: &[u8],
    ) -> (u8, Vec<u8>, Vec<u8>) {
        let b = self.scsi_bhs(cdb, read_len, data_out.len() as u32, 0);
        let itt = be32(&b[16..20]);
        self.send(&b, &[]).await;
        self.finish(itt, data_out).await
    }

    /// Reads PDUs until the response for `itt`, answering its R2Ts.
    pub async fn finish(&mut self, itt: u32, data_out: &[u8]) -> (u8, Vec<u8>, Vec<u8>) {
        let mut read = Vec::new();
        for _ in 0..100_000 {
            let r = self.recv().await;
            match r.opcode() {
                0x31 => {
                    assert_eq!(r.itt(), itt, "R2T for our command");
                    let (ttt, off, len) = (r.field32(20), r.field32(40), r.field32(44));
                    self.data_out(itt, ttt, off, &data_out[off as usize..(off + len) as usize])
                        .await;
                }
                0x25 => {
                    assert_eq!(r.itt(), itt);
                    assert_eq!(r.field32(40) as usize, read.len(), "Data-In in order");
                    read.extend_from_slice(&r.data);
                    if r.bhs[1] & 0x01 != 0 {
                        self.exp_stat_sn = r.field32(24).wrapping_add(1);
                        return (r.bhs[3], Vec::new(), read);
                    }
                }
                0x21 => {
                    assert_eq!(r.itt(), itt, "response for our command");
                    self.exp_stat_sn = r.field32(24).wrapping_add(1);
                    return (r.bhs[3], r.data, read);
                }
                0x20 => {} // NOP-In ping from the target: not due this fast; ignored
                op => panic!("unexpected opcode 0x{op:02x} while waiting for ITT {itt}"),
            }
        }
        panic!("no response for ITT {itt}");
    }

    /// [`RawConn::finish`] for a command whose first R2T, `r2t`, was already received.
    pub async fn finish_after_r2t(
        &mut self,
        itt: u32,
        r2t: Rx,
        data_out: &[u8],
    ) -> (u8, Vec<u8>, Vec<u8>) {
        let (ttt, off, len) = (r2t.field32(20), r2t.field32(40), r2t.field32(44));
        self.data_out(itt, ttt, off, &data_out[off as usize..(off + len) as usize])
            .await;
        self.finish(itt, data_out).await
    }

    /// Sends the Data-Out sequence for one R2T, split at the target's MaxRecvDataSegmentLength.
    pub async fn data_out(&mut self, itt: u32, ttt: u32, offset: u32, data: &[u8]) {
        let chunks: Vec<&[u8]> = data.chunks(self.target_mrdsl).collect();
        let n = chunks.len();
        let mut off = offset;
        for (sn, chunk) in chunks.into_iter().enumerate() {
            let mut b = bhs(0x05, if sn + 1 == n { 0x80 } else { 0 }, chunk.len(), itt);
            b[20..24].copy_from_slice(&ttt.to_be_bytes());
            b[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
            b[36..40].copy_from_slice(&(sn as u32).to_be_bytes());
            b[40..44].copy_from_slice(&off.to_be_bytes());
            self.send(&b, chunk).await;
            off += chunk.len() as u32;
        }
    }

    /// The BHS of an immediate NOP-Out that wants an answer (TTT 0xffffffff), with this
    /// connection's CmdSN and ExpStatSN.
    pub fn nop_out(&self, itt: u32, data_len: usize) -> [u8; 48] {
        let mut b = bhs(0x40, 0x80, data_len, itt);
        b[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        b[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        b[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
        b
    }

    /// NOP-Out ping (immediate) with a payload; returns the NOP-In echo.
    pub async fn ping(&mut self, payload: &[u8]) -> Rx {
        let itt = self.itt();
        let b = self.nop_out(itt, payload.len());
        self.send(&b, payload).await;
        for _ in 0..1000 {
            let r = self.recv().await;
            if r.opcode() == 0x20 && r.itt() == itt {
                return r;
            }
        }
        panic!("no NOP-In for the ping");
    }
}

/// [`plain_keys`] with the values of `changes` in place of theirs.
pub fn plain_keys_with<'a>(changes: &[(&str, &'a str)]) -> Vec<(&'static str, &'a str)> {
    let mut keys: Vec<(&'static str, &'a str)> = plain_keys();
    for (k, v) in keys.iter_mut() {
        if let Some((_, new)) = changes.iter().find(|(ck, _)| ck == k) {
            *v = new;
        }
    }
    keys
}

/// Default operational keys: R2T for every write (exercises the solicited path).
pub fn plain_keys() -> Vec<(&'static str, &'static str)> {
    vec![
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
        ("ImmediateData", "No"),
        ("InitialR2T", "Yes"),
        ("MaxRecvDataSegmentLength", "65536"),
        ("MaxBurstLength", "262144"),
        ("FirstBurstLength", "65536"),
        ("MaxConnections", "4"),
        ("ErrorRecoveryLevel", "0"),
    ]
}

/// Logs in a fresh session and checks a write/read round trip at `lba`.
pub async fn healthy_session(addr: SocketAddr, lba: u32, seed: u8) {
    let mut c = RawConn::connect(addr).await;
    c.isid[5] = seed;
    c.login(1, &plain_keys()).await;
    roundtrip(&mut c, lba, 64, seed).await;
}

/// Reads the final READ(10) of `blocks` at `lba` and checks it equals `want`.
pub async fn read_back(c: &mut RawConn, lba: u32, want: &[u8]) {
    let (st, _, got) = c
        .command(
            &read10(lba, (want.len() / 512) as u16),
            want.len() as u32,
            &[],
        )
        .await;
    assert_eq!(st, 0, "READ(10) status");
    assert!(got == want, "read back what was written at LBA {lba}");
}

pub async fn roundtrip(c: &mut RawConn, lba: u32, blocks: u16, seed: u8) {
    let data = pattern(blocks as usize * 512, seed);
    let (st, _, _) = c.command(&write10(lba, blocks), 0, &data).await;
    assert_eq!(st, 0, "WRITE(10) status");
    let (st, _, got) = c
        .command(&read10(lba, blocks), data.len() as u32, &[])
        .await;
    assert_eq!(st, 0, "READ(10) status");
    assert!(got == data, "read back what was written at LBA {lba}");
}
