//! The pseudo initiator: the smallest iSCSI initiator that can drive the long-delay
//! experiment against any target. One connection, no authentication, no digests,
//! InitialR2T=Yes and ImmediateData=No (so a WRITE costs command, R2T, data and status
//! trips), one command outstanding; READ(10)/WRITE(10) and READ CAPACITY(10).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use iscsi_wire::{
    encode_pdu, Bhs, DataOut, Digests, FrameLayout, LoginRequest, NopOut, Pdu, ScsiCommand, Stage,
    BHS_LEN, MAX_DATA_SEGMENT, RESERVED_TAG,
};

/// A logged-in session on one connection.
pub struct PseudoInitiator {
    stream: TcpStream,
    cmd_sn: u32,
    exp_stat_sn: u32,
    next_itt: u32,
    /// The target's MaxRecvDataSegmentLength (limit for our Data-Out PDUs).
    max_send: u32,
    /// Negotiated MaxBurstLength.
    pub max_burst: u32,
    pub lun: u64,
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn text(pairs: &[(&str, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

fn parse_text(data: &[u8]) -> Vec<(String, String)> {
    data.split(|&b| b == 0)
        .filter_map(|kv| {
            let s = String::from_utf8_lossy(kv);
            let (k, v) = s.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

impl PseudoInitiator {
    /// Connects and logs in to `target_name` (security stage, then operational stage).
    pub fn login(addr: SocketAddr, target_name: &str, lun: u16) -> io::Result<PseudoInitiator> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut s = PseudoInitiator {
            stream,
            cmd_sn: 1,
            exp_stat_sn: 0,
            next_itt: 1,
            max_send: 8192,
            max_burst: 262_144,
            lun: iscsi_wire::lun_to_wire(lun),
        };
        let isid = [0x80, 0x00, 0x49, 0x52, 0x4f, 0x4e];
        let security = text(&[
            (
                "InitiatorName",
                "iqn.2024-01.org.ironsan:pseudo-initiator".into(),
            ),
            ("TargetName", target_name.into()),
            ("SessionType", "Normal".into()),
            ("AuthMethod", "None".into()),
        ]);
        let operational = text(&[
            ("HeaderDigest", "None".into()),
            ("DataDigest", "None".into()),
            ("MaxRecvDataSegmentLength", "262144".into()),
            ("InitialR2T", "Yes".into()),
            ("ImmediateData", "No".into()),
            ("MaxBurstLength", "16776192".into()),
            ("FirstBurstLength", "262144".into()),
            ("MaxOutstandingR2T", "1".into()),
            ("MaxConnections", "1".into()),
            ("ErrorRecoveryLevel", "0".into()),
            ("DataPDUInOrder", "Yes".into()),
            ("DataSequenceInOrder", "Yes".into()),
            ("DefaultTime2Wait", "0".into()),
            ("DefaultTime2Retain", "0".into()),
        ]);
        let mut stage = Stage::Security;
        let mut tsih = 0u16;
        // A login takes a handful of exchanges; bound them.
        for _ in 0..8 {
            let (data, nsg) = match stage {
                Stage::Security => (security.clone(), Stage::Operational),
                _ => (operational.clone(), Stage::FullFeature),
            };
            let req = Bhs::LoginRequest(LoginRequest {
                transit: true,
                cont: false,
                csg: stage,
                nsg,
                version_max: 0,
                version_min: 0,
                isid,
                tsih,
                itt: 0,
                cid: 0,
                cmd_sn: s.cmd_sn,
                exp_stat_sn: s.exp_stat_sn,
            });
            s.send(req, &data)?;
            let (bhs, data) = s.recv()?;
            let Bhs::LoginResponse(rsp) = bhs else {
                return Err(bad("expected a Login Response"));
            };
            if rsp.status_class != 0 {
                return Err(bad(format!(
                    "login rejected: status {}/{}",
                    rsp.status_class, rsp.status_detail
                )));
            }
            s.exp_stat_sn = rsp.stat_sn.wrapping_add(1);
            tsih = rsp.tsih;
            for (k, v) in parse_text(&data) {
                match k.as_str() {
                    "MaxRecvDataSegmentLength" => s.max_send = v.parse().unwrap_or(8192),
                    "MaxBurstLength" => s.max_burst = v.parse().unwrap_or(262_144),
                    _ => {}
                }
            }
            if rsp.transit {
                if rsp.nsg == Stage::FullFeature {
                    s.clear_unit_attention()?;
                    return Ok(s);
                }
                stage = rsp.nsg;
            }
        }
        Err(bad("login did not reach full feature phase"))
    }

    fn send(&mut self, bhs: Bhs, data: &[u8]) -> io::Result<()> {
        let pdu = Pdu::new(bhs, Bytes::copy_from_slice(data));
        self.stream.write_all(&encode_pdu(&pdu, None, None))
    }

    /// Reads one PDU (no digests were negotiated).
    fn recv(&mut self) -> io::Result<(Bhs, Vec<u8>)> {
        let mut head = [0u8; BHS_LEN];
        self.stream.read_exact(&mut head)?;
        let lay = FrameLayout::of(&head, Digests::default(), MAX_DATA_SEGMENT)
            .map_err(|e| bad(e.to_string()))?;
        let mut rest = vec![0u8; lay.header_rest_len() + lay.data_part_len()];
        self.stream.read_exact(&mut rest)?;
        let bhs = Bhs::decode(&head).map_err(|e| bad(e.to_string()))?.bhs;
        let start = lay.header_rest_len();
        rest.truncate(start + lay.data_len as usize);
        rest.drain(..start);
        Ok((bhs, rest))
    }

    /// Runs one command to completion; `out` is the data to write (for R2Ts), `input`
    /// receives Data-In. Returns the SCSI status.
    fn command(
        &mut self,
        cdb: [u8; 16],
        read_len: u32,
        out: &[u8],
        input: &mut Vec<u8>,
    ) -> io::Result<u8> {
        let itt = self.next_itt;
        self.next_itt = self.next_itt.wrapping_add(1).max(1);
        let cmd = Bhs::ScsiCommand(ScsiCommand {
            immediate: false,
            final_: true,
            read: read_len > 0,
            write: !out.is_empty(),
            attr: 1,
            lun: self.lun,
            itt,
            expected_data_len: read_len.max(out.len() as u32),
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb,
        });
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.send(cmd, &[])?;
        input.clear();
        input.resize(read_len as usize, 0);
        // Each PDU read moves the command forward; bound the loop by a generous count.
        for _ in 0..10_000_000u64 {
            let (bhs, data) = self.recv()?;
            match bhs {
                Bhs::DataIn(d) if d.itt == itt => {
                    let at = d.buffer_offset as usize;
                    let end = (at + data.len()).min(input.len());
                    if at < end {
                        input[at..end].copy_from_slice(&data[..end - at]);
                    }
                    if d.status_present {
                        self.exp_stat_sn = d.stat_sn.wrapping_add(1);
                        return Ok(d.status);
                    }
                }
                Bhs::R2t(r) if r.itt == itt => {
                    let (mut off, end) = (
                        r.buffer_offset as usize,
                        (r.buffer_offset + r.desired_len) as usize,
                    );
                    let end = end.min(out.len());
                    let mut data_sn = 0;
                    while off < end {
                        let n = (end - off).min(self.max_send as usize);
                        let d = Bhs::DataOut(DataOut {
                            final_: off + n == end,
                            lun: self.lun,
                            itt,
                            ttt: r.ttt,
                            exp_stat_sn: self.exp_stat_sn,
                            data_sn,
                            buffer_offset: off as u32,
                        });
                        self.send(d, &out[off..off + n])?;
                        off += n;
                        data_sn += 1;
                    }
                }
                Bhs::ScsiResponse(r) if r.itt == itt => {
                    self.exp_stat_sn = r.stat_sn.wrapping_add(1);
                    return Ok(if r.response == 0 { r.status } else { 0xff });
                }
                Bhs::NopIn(n) if n.ttt != RESERVED_TAG => {
                    let reply = Bhs::NopOut(NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.cmd_sn,
                        exp_stat_sn: self.exp_stat_sn,
                    });
                    self.send(reply, &[])?;
                }
                _ => {}
            }
        }
        Err(bad("command did not complete"))
    }

    /// TEST UNIT READY until GOOD: a new session first gets the power-on unit attention.
    fn clear_unit_attention(&mut self) -> io::Result<()> {
        let mut buf = Vec::new();
        for _ in 0..5 {
            if self.command([0u8; 16], 0, &[], &mut buf)? == 0 {
                return Ok(());
            }
        }
        Err(bad("the logical unit does not become ready"))
    }

    /// READ CAPACITY(10): (number of blocks, block size).
    pub fn read_capacity(&mut self) -> io::Result<(u64, u32)> {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x25;
        let mut buf = Vec::new();
        let st = self.command(cdb, 8, &[], &mut buf)?;
        if st != 0 || buf.len() < 8 {
            return Err(bad(format!("READ CAPACITY failed, status 0x{st:02x}")));
        }
        let last = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as u64;
        let bs = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
        Ok((last + 1, bs))
    }

    fn rw10(op: u8, lba: u64, blocks: u32) -> io::Result<[u8; 16]> {
        if lba > u32::MAX as u64 || blocks > u16::MAX as u32 {
            return Err(bad("LBA or length does not fit a 10-byte CDB"));
        }
        let mut cdb = [0u8; 16];
        cdb[0] = op;
        cdb[2..6].copy_from_slice(&(lba as u32).to_be_bytes());
        cdb[7..9].copy_from_slice(&(blocks as u16).to_be_bytes());
        Ok(cdb)
    }

    /// READ(10) of `blocks` blocks of `block_size` bytes into `buf`; returns the status.
    pub fn read(
        &mut self,
        lba: u64,
        blocks: u32,
        block_size: u32,
        buf: &mut Vec<u8>,
    ) -> io::Result<u8> {
        let cdb = Self::rw10(0x28, lba, blocks)?;
        self.command(cdb, blocks * block_size, &[], buf)
    }

    /// WRITE(10) of `data` (a whole number of blocks); returns the status.
    pub fn write(&mut self, lba: u64, block_size: u32, data: &[u8]) -> io::Result<u8> {
        let cdb = Self::rw10(0x2a, lba, (data.len() / block_size as usize) as u32)?;
        let mut sink = Vec::new();
        self.command(cdb, 0, data, &mut sink)
    }
}
