//! Bad input from a raw iSER initiator against the whole target (an `iser://` portal on the
//! software iWARP RNIC, started in-process). The raw initiator is written on the `rdma` API
//! with PDUs and iSER headers laid out byte by byte from RFC 7143 and RFC 7145, so it can say
//! what no well-behaved initiator says: STags that name nothing, another protection domain,
//! too little memory or the wrong rights; Sends longer than the target's receives, more of
//! them than its window, shorter than the headers; iSER opcodes that do not exist; commands
//! before login; more RDMA Read Requests than the target's IRD; unsolicited Data-Out that
//! breaks the rules; more Sends outstanding than the target has receives posted while its
//! session is busy (during login, a non-login PDU ends the connection at once; the login
//! channel's own credit is the endpoint's unit test); a WRITE past its connection's memory
//! budget. Peers on a driven RNIC whose engine the test stops ([`Peer::driven`]) never
//! answer the target's RDMA Read, or stop reading their socket.
//!
//! Each case must end as the standards say (a Terminate from the RNIC that saw the bad
//! access, a closed connection, or a Reject and CHECK CONDITION) and touch nothing else: a
//! session logged in before it carries on, and a fresh initiator logs in and writes and
//! reads verified data. Every wait is bounded by [`WAIT`]; the raw peer polls its completion
//! queue on the test's own thread while the target runs on the runtime's workers.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use iwarp::TerminateCode;
use rdma::{
    Access, ConnInfo, ConnParams, MemoryRegion, Provider, QpState, QueuePair, SendOp, SendWr, Wc,
    WcOpcode, WcStatus,
};
use rnic::{AccessError, Rnic};

use test_support::iser_raw::{iser_header, send_bytes, RingSizes, Rings};
use test_support::pdu::{be32, bhs, key_values, parse_keys, pattern, read10, write10};

/// Every wait in these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(10);
const IQN: &str = "iqn.2026-11.org.ironsan.test:iser-bad";
const INITIATOR: &str = "iqn.2026-11.org.ironsan.test:iser-raw";
/// The target's command window (it posts 2 × this + 64 receives).
const QUEUE_DEPTH: u32 = 16;

/// Receives the raw initiator keeps posted, and their size (the target's control PDUs carry
/// at most 128 bytes of data, Login Responses a few hundred).
const RECV_SLOTS: usize = 32;
const RECV_LEN: usize = 8192 + 128;
/// Send buffers, each big enough for a Send longer than the target's receives (16,768 bytes).
const SEND_SLOTS: usize = 64;
const SEND_LEN: usize = 17_408;
const RINGS: RingSizes = RingSizes {
    recv_slots: RECV_SLOTS,
    recv_len: RECV_LEN,
    send_slots: SEND_SLOTS,
    send_len: SEND_LEN,
};

/// The target's TargetRecvDataSegmentLength and FirstBurstLength over iSER.
const SEGMENT: usize = 16_384;

/// Starts a target with one 16 MiB RAM LUN 0 behind an `iser://` portal on an ephemeral
/// loopback port. IRONSAN_LOG=debug shows the target's log when a test fails.
async fn start_target() -> SocketAddr {
    start_target_with("").await
}

/// [`start_target`] with more top-level configuration keys.
async fn start_target_with(extra: &str) -> SocketAddr {
    let top = format!("queue_depth = {QUEUE_DEPTH}\n{extra}");
    let lun = "size = \"16MiB\"\nbackend = \"memory\"";
    let portals = "[\"iser://127.0.0.1:0\"]";
    test_support::start_target(&test_support::one_lun_config(portals, &top, IQN, "", lun)).await
}

/// A distinct ISID byte for every raw initiator of the process (no session reinstatement
/// between peers of one test).
fn next_isid() -> [u8; 6] {
    static NEXT: AtomicU8 = AtomicU8::new(1);
    [0x80, 0, 0, 0x15, 0xe4, NEXT.fetch_add(1, Ordering::Relaxed)]
}

/// A received Send.
#[derive(Debug, Clone)]
struct Rx {
    bhs: [u8; 48],
    data: Vec<u8>,
    /// The STag the target invalidated with it (Send with Invalidate).
    invalidated: Option<u32>,
}

impl Rx {
    fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3f
    }
    fn itt(&self) -> u32 {
        be32(&self.bhs[16..20])
    }
    fn field32(&self, at: usize) -> u32 {
        be32(&self.bhs[at..at + 4])
    }
}

/// How the raw initiator connects.
struct Connect {
    private_data: Vec<u8>,
    mpa_revision: u8,
    ird: u16,
    ord: u16,
}

impl Default for Connect {
    /// As Linux ib_iser: the iSER word 0x80 (ZBVA not used, Send with Invalidate accepted).
    fn default() -> Self {
        Connect {
            private_data: vec![0x80, 0, 0, 0],
            mpa_revision: 2,
            ird: 16,
            ord: 1,
        }
    }
}

/// A raw iSER initiator: a queue pair on its own software RNIC, a ring of posted receives
/// (each posted again once read), a ring of registered send buffers.
struct Peer {
    rings: Rings,
    pd: rnic::Pd,
    reads_done: u64,
    received: VecDeque<Rx>,
    /// Completions with an error status, in order.
    errors: Vec<Wc>,
    info: Option<ConnInfo>,
    isid: [u8; 6],
    cmd_sn: u32,
    exp_stat_sn: u32,
    next_itt: u32,
    /// The engine of a driven RNIC ([`Peer::driven`]), turned by [`Peer::poll`].
    driver: Option<rnic::Driver>,
    /// A driven RNIC whose engine is no longer turned: it neither reads its socket nor
    /// answers RDMA Read Requests, as a hostile user-space RNIC may do.
    frozen: bool,
    /// Declared last: the RNIC's progress thread outlives the queue pair.
    dev: Rnic,
}

impl Peer {
    /// A queue pair with every receive posted, not connected yet.
    fn new(max_send_wr: u32) -> Peer {
        Peer::on(Rnic::new().unwrap(), None, max_send_wr)
    }

    /// [`Peer::new`] on an RNIC without a progress thread: its engine moves only when the
    /// test polls, so the test can stop it.
    fn driven() -> Peer {
        let (dev, driver) = Rnic::new_driven(|| {}).unwrap();
        Peer::on(dev, Some(driver), 256)
    }

    fn on(dev: Rnic, driver: Option<rnic::Driver>, max_send_wr: u32) -> Peer {
        let pd = dev.alloc_pd().unwrap();
        let rings = Rings::new(&dev, &pd, 4096, max_send_wr, 4, RINGS).unwrap();
        Peer {
            rings,
            pd,
            reads_done: 0,
            received: VecDeque::new(),
            errors: Vec::new(),
            info: None,
            isid: next_isid(),
            cmd_sn: 1,
            exp_stat_sn: 0,
            next_itt: 0x100,
            driver,
            frozen: false,
            dev,
        }
    }

    /// Connects to the target (the MPA exchange; blocking, bounded by the RNIC's timeout).
    fn connect(mut self, addr: SocketAddr, c: &Connect) -> Peer {
        let params = ConnParams {
            private_data: c.private_data.clone(),
            mpa_revision: c.mpa_revision,
            ird: c.ird,
            ord: c.ord,
            ..ConnParams::default()
        };
        self.info = Some(self.rings.qp.connect(addr, &params).expect("connected"));
        self
    }

    fn to(addr: SocketAddr) -> Peer {
        Peer::new(256).connect(addr, &Connect::default())
    }

    /// A connected peer that has logged in.
    fn logged_in(addr: SocketAddr) -> Peer {
        let mut p = Peer::to(addr);
        p.login();
        p
    }

    fn itt(&mut self) -> u32 {
        self.next_itt += 1;
        self.next_itt
    }

    fn reg(&self, len: usize, access: Access) -> rnic::Mr {
        self.dev.reg_mr(&self.pd, len, access).unwrap()
    }

    /// Moves every waiting completion: received Sends are queued (their buffers posted
    /// again), Send and RDMA Read completions counted, the first error kept. A driven RNIC's
    /// engine is turned first, unless it is frozen.
    fn poll(&mut self) -> usize {
        if let Some(driver) = self.driver.as_mut().filter(|_| !self.frozen) {
            for _ in 0..64 {
                if !matches!(driver.turn(), rnic::Turn::More) {
                    break;
                }
            }
        }
        self.rings.poll(|wc, bytes| {
            if wc.status != WcStatus::Success {
                self.errors.push(*wc);
            } else if let Some(bytes) = bytes {
                assert!(bytes.len() >= 76, "a Send shorter than the headers");
                assert_eq!(bytes[0], 0x10, "a control PDU behind a plain iSER header");
                let bhs: [u8; 48] = bytes[28..76].try_into().unwrap();
                let len = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
                let start = 76 + bhs[4] as usize * 4;
                self.received.push_back(Rx {
                    bhs,
                    data: bytes[start..start + len].to_vec(),
                    invalidated: wc.invalidated_rkey,
                });
            } else if wc.opcode == WcOpcode::RdmaRead {
                self.reads_done += 1;
            }
        })
    }

    /// Posts `bytes` as one Send. False if the connection failed first.
    fn post(&mut self, bytes: &[u8]) -> bool {
        let deadline = Instant::now() + WAIT;
        while self.rings.full() {
            if !self.errors.is_empty() || self.rings.qp.state() == QpState::Error {
                return false;
            }
            assert!(Instant::now() < deadline, "a Send never completed");
            if self.poll() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.rings.post_send(bytes)
    }

    fn post_pdu(&mut self, header: &[u8; 28], bhs: &[u8; 48], data: &[u8]) -> bool {
        self.post(&send_bytes(header, bhs, data))
    }

    /// Posts one more Send on a driven RNIC, turns its engine one turn at a time until every
    /// Send has left, and freezes it: what the target sends in answer is neither read nor
    /// answered (a turn reads before it writes, so nothing after the last Send is taken).
    fn post_pdu_then_freeze(&mut self, header: &[u8; 28], bhs: &[u8; 48], data: &[u8]) {
        assert!(self.post_pdu(header, bhs, data));
        self.frozen = true;
        let mut driver = self.driver.take().expect("a driven RNIC");
        let deadline = Instant::now() + WAIT;
        while self.rings.sends_done < self.rings.sends_posted {
            assert!(Instant::now() < deadline, "the Sends never left");
            assert!(self.errors.is_empty(), "{:?}", self.errors);
            driver.turn();
            if self.poll() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.driver = Some(driver);
    }

    /// The next received PDU, or None when the connection ends (or nothing comes in time).
    fn try_recv(&mut self) -> Option<Rx> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(rx) = self.received.pop_front() {
                return Some(rx);
            }
            if self.poll() > 0 {
                continue;
            }
            if self.rings.qp.state() == QpState::Error || Instant::now() >= deadline {
                // What completed before the error still counts.
                self.poll();
                return self.received.pop_front();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The next PDU that is not a NOP-In ping from the target (answered as it comes).
    fn recv(&mut self) -> Rx {
        self.recv_or_end().expect("a PDU from the target in time")
    }

    /// [`Peer::recv`], or None when the connection ends (or nothing comes in time).
    fn recv_or_end(&mut self) -> Option<Rx> {
        loop {
            let rx = self.try_recv()?;
            if rx.opcode() == 0x20 && rx.field32(20) != u32::MAX {
                // A ping: answer it so the target keeps the connection.
                let mut b = bhs(0x40, 0x80, 0, u32::MAX);
                b[20..24].copy_from_slice(&rx.field32(20).to_be_bytes());
                b[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
                b[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
                self.post_pdu(&iser_header(None, None), &b, &[]);
                continue;
            }
            return Some(rx);
        }
    }

    /// Logs in to full feature phase in one Login Request (operational stage, no
    /// authentication), offering the iSER keys with immediate and unsolicited data.
    fn login(&mut self) -> HashMap<String, String> {
        let r = self.login_request(0x87, &login_keys());
        assert_eq!(r.opcode(), 0x23, "a Login Response");
        assert_eq!(&r.bhs[36..38], &[0, 0], "login status");
        assert_eq!(r.bhs[1] & 0x83, 0x83, "transit to full feature phase");
        self.exp_stat_sn = r.field32(24).wrapping_add(1);
        self.cmd_sn = r.field32(28);
        let keys = parse_keys(&r.data);
        assert_eq!(keys.get("RDMAExtensions").map(String::as_str), Some("Yes"));
        keys
    }

    /// Sends one Login Request (flags byte `flags`: T, CSG, NSG) with `keys`; returns the
    /// response.
    fn login_request(&mut self, flags: u8, keys: &[u8]) -> Rx {
        let mut b = bhs(0x43, flags, keys.len(), 0x4000_0000);
        b[8..14].copy_from_slice(&self.isid);
        b[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        b[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
        assert!(self.post_pdu(&iser_header(None, None), &b, keys));
        self.recv()
    }

    /// A SCSI Command BHS for LUN 0 with the next CmdSN and ITT (`final_`: no unsolicited
    /// Data-Out follows).
    fn command_bhs(&mut self, cdb: &[u8], read_len: u32, write_len: u32, imm: usize) -> [u8; 48] {
        self.command_bhs_f(cdb, read_len, write_len, imm, true)
    }

    fn command_bhs_f(
        &mut self,
        cdb: &[u8],
        read_len: u32,
        write_len: u32,
        imm: usize,
        final_: bool,
    ) -> [u8; 48] {
        let itt = self.itt();
        let flags = if final_ { 0x80 } else { 0 }
            | if read_len > 0 { 0x40 } else { 0 }
            | if write_len > 0 { 0x20 } else { 0 }
            | 1;
        let mut b = bhs(0x01, flags, imm, itt);
        b[20..24].copy_from_slice(&read_len.max(write_len).to_be_bytes());
        b[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        b[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
        b[32..32 + cdb.len()].copy_from_slice(cdb);
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        b
    }

    /// Waits for the SCSI Response to `itt`: (status, sense data).
    fn response(&mut self, itt: u32) -> (u8, Vec<u8>, Option<u32>) {
        let r = self.recv();
        assert_eq!(r.opcode(), 0x21, "a SCSI Response, got {r:?}");
        assert_eq!(r.itt(), itt, "the response to our command");
        self.exp_stat_sn = r.field32(24).wrapping_add(1);
        (r.bhs[3], r.data, r.invalidated)
    }

    /// WRITE(10) of `data` at `lba`: `imm` bytes of immediate data, the rest fetched by the
    /// target's RDMA Reads from the Write STag (whose address is where solicited data
    /// begins, as Linux sets it). Returns the status and the STag the response invalidated.
    fn write(&mut self, lba: u32, data: &[u8], imm: usize) -> (u8, Option<u32>) {
        let mr = self.reg(data.len(), Access::REMOTE_READ);
        mr.write_at(0, data);
        let b = self.command_bhs(
            &write10(lba, (data.len() / 512) as u16),
            0,
            data.len() as u32,
            imm,
        );
        let header = iser_header(Some((mr.rkey(), mr.addr() + imm as u64)), None);
        assert!(self.post_pdu(&header, &b, &data[..imm]));
        let (status, _, inv) = self.response(be32(&b[16..20]));
        assert!(
            inv.is_none_or(|s| s == mr.rkey()),
            "the Write STag invalidated"
        );
        (status, inv)
    }

    /// READ(10) of `blocks` at `lba` into a region the target RDMA-Writes.
    fn read(&mut self, lba: u32, blocks: u16) -> (u8, Vec<u8>, Option<u32>) {
        let len = blocks as usize * 512;
        let mr = self.reg(len, Access::REMOTE_WRITE);
        let b = self.command_bhs(&read10(lba, blocks), len as u32, 0, 0);
        let header = iser_header(None, Some((mr.rkey(), mr.addr())));
        assert!(self.post_pdu(&header, &b, &[]));
        let (status, _, inv) = self.response(be32(&b[16..20]));
        assert!(
            inv.is_none_or(|s| s == mr.rkey()),
            "the Read STag invalidated"
        );
        let mut data = vec![0u8; len];
        mr.read_at(0, &mut data);
        (status, data, inv)
    }

    /// Writes 48 KiB at `lba` (immediate data, then RDMA Reads) and reads it back.
    fn roundtrip(&mut self, lba: u32, seed: u8) {
        let data = pattern(48 * 1024, seed);
        assert_eq!(self.write(lba, &data, 4096).0, 0, "WRITE status");
        let (status, back, _) = self.read(lba, 96);
        assert_eq!(status, 0, "READ status");
        assert!(back == data, "read back what was written at LBA {lba}");
    }

    /// NOP-Out ping (immediate); the NOP-In echo's data.
    fn ping(&mut self, payload: &[u8]) -> Vec<u8> {
        self.ping_or_end(payload)
            .expect("a PDU from the target in time")
    }

    /// [`Peer::ping`], or None when the connection ends before the echo comes.
    fn ping_or_end(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        let itt = self.itt();
        let mut b = bhs(0x40, 0x80, payload.len(), itt);
        b[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        b[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
        b[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
        if !self.post_pdu(&iser_header(None, None), &b, payload) {
            return None;
        }
        let r = self.recv_or_end()?;
        assert_eq!((r.opcode(), r.itt()), (0x20, itt), "the NOP-In echo");
        Some(r.data)
    }

    /// Waits until the connection is gone (the queue pair in the error state, its
    /// receives flushed); returns the opcodes of the PDUs that arrived meanwhile.
    fn torn_down(&mut self) -> Vec<u8> {
        let mut got = Vec::new();
        let deadline = Instant::now() + WAIT;
        while self.rings.qp.state() != QpState::Error {
            assert!(
                Instant::now() < deadline,
                "the target did not end the connection"
            );
            if self.poll() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            got.extend(self.received.drain(..).map(|r| r.opcode()));
        }
        // The flushed receives report it too.
        let deadline = Instant::now() + WAIT;
        while !self.errors.iter().any(|wc| wc.opcode == WcOpcode::Recv) {
            assert!(
                Instant::now() < deadline,
                "no flushed receive: {:?}",
                self.errors
            );
            if self.poll() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        got.extend(self.received.drain(..).map(|r| r.opcode()));
        got
    }
}

fn login_keys() -> Vec<u8> {
    key_values(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", IQN),
        ("SessionType", "Normal"),
        ("RDMAExtensions", "Yes"),
        ("HeaderDigest", "None"),
        ("DataDigest", "None"),
        ("ImmediateData", "Yes"),
        ("InitialR2T", "No"),
        ("FirstBurstLength", "65536"),
        ("MaxBurstLength", "262144"),
        ("ErrorRecoveryLevel", "0"),
        ("InitiatorRecvDataSegmentLength", "8192"),
        ("TargetRecvDataSegmentLength", "8192"),
    ])
}

/// After a bad connection: the session logged in before it still reads and writes, and a
/// fresh initiator logs in and does too.
fn others_carry_on(addr: SocketAddr, keeper: &mut Peer, seed: u8) {
    keeper.roundtrip(1000 + seed as u32 * 100, seed);
    let mut fresh = Peer::logged_in(addr);
    fresh.roundtrip(20_000 + seed as u32 * 100, seed.wrapping_add(100));
}

/// A READ whose Read STag names no region, a region in another protection domain, too
/// little memory, or memory without remote write access: the target's RDMA Write is refused
/// by the initiator's RNIC with the Terminate RFC 5041 gives for the first failed check, the
/// connection ends, and the target carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_read_stags_are_terminated_and_only_that_connection_ends() {
    let addr = start_target().await;
    let mut keeper = Peer::logged_in(addr);
    keeper.roundtrip(0, 1);
    for (case, seed) in ["unregistered", "foreign", "beyond", "rights"]
        .into_iter()
        .zip(1u8..)
    {
        let mut p = Peer::logged_in(addr);
        let len = 4096;
        let other_pd = p.dev.alloc_pd().unwrap();
        let regions: Vec<rnic::Mr> = vec![
            p.reg(len, Access::REMOTE_WRITE),
            p.dev.reg_mr(&other_pd, len, Access::REMOTE_WRITE).unwrap(),
            p.reg(len, Access::REMOTE_READ),
        ];
        let (stag, va, expected) = match case {
            "unregistered" => (0x7fff_ff01, 0x1000, AccessError::InvalidStag),
            "foreign" => (regions[1].rkey(), regions[1].addr(), AccessError::WrongPd),
            // 4 KiB named from 512 bytes into a 4 KiB region.
            "beyond" => (
                regions[0].rkey(),
                regions[0].addr() + 512,
                AccessError::Bounds,
            ),
            _ => (regions[2].rkey(), regions[2].addr(), AccessError::Rights),
        };
        let b = p.command_bhs(&read10(0, 8), len as u32, 0, 0);
        assert!(p.post_pdu(&iser_header(None, Some((stag, va))), &b, &[]));
        let got = p.torn_down();
        assert!(
            !got.contains(&0x21),
            "{case}: no SCSI Response after a refused Write: {got:x?}"
        );
        assert_eq!(
            p.rings.qp.last_error().as_deref(),
            Some(format!("sent Terminate: {}", expected.ddp_code()).as_str()),
            "{case}: the initiator's RNIC terminated with the RFC 5041 code"
        );
        assert!(
            regions.iter().all(|r| {
                let mut v = vec![0u8; len];
                r.read_at(0, &mut v);
                v.iter().all(|&x| x == 0)
            }) || case == "beyond",
            "{case}: no byte placed outside what the STag allows"
        );
        drop(regions);
        others_carry_on(addr, &mut keeper, seed);
    }
}

/// A WRITE whose Write STag names no region, another protection domain, a region shorter
/// than the solicited data, or memory without remote read access: the target's RDMA Read
/// Request is refused by the initiator's RNIC (RFC 5040's Terminate codes), the command never
/// completes, the connection ends, and the target carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_write_stags_are_terminated_and_only_that_connection_ends() {
    let addr = start_target().await;
    let mut keeper = Peer::logged_in(addr);
    // What the refused writes would have overwritten.
    let before = pattern(8192, 77);
    assert_eq!(keeper.write(500, &before, 0).0, 0);
    for (case, seed) in ["unregistered", "foreign", "short", "rights"]
        .into_iter()
        .zip(11u8..)
    {
        let mut p = Peer::logged_in(addr);
        let len = 8192;
        let other_pd = p.dev.alloc_pd().unwrap();
        let foreign = p.dev.reg_mr(&other_pd, len, Access::REMOTE_READ).unwrap();
        let short = p.reg(len / 2, Access::REMOTE_READ);
        let write_only = p.reg(len, Access::REMOTE_WRITE);
        for r in [&foreign, &short, &write_only] {
            r.write_at(0, &vec![0xee; r.len()]);
        }
        let (stag, va, expected) = match case {
            "unregistered" => (0x7fff_fe01, 0x1000, AccessError::InvalidStag),
            "foreign" => (foreign.rkey(), foreign.addr(), AccessError::WrongPd),
            "short" => (short.rkey(), short.addr(), AccessError::Bounds),
            _ => (write_only.rkey(), write_only.addr(), AccessError::Rights),
        };
        // All 8 KiB solicited: the target must fetch it with an RDMA Read.
        let b = p.command_bhs(&write10(500, 16), 0, len as u32, 0);
        assert!(p.post_pdu(&iser_header(Some((stag, va)), None), &b, &[]));
        let got = p.torn_down();
        assert!(
            !got.contains(&0x21),
            "{case}: no SCSI Response for data never fetched: {got:x?}"
        );
        assert_eq!(
            p.rings.qp.last_error().as_deref(),
            Some(format!("sent Terminate: {}", expected.rdmap_code()).as_str()),
            "{case}: the initiator's RNIC terminated with the RFC 5040 code"
        );
        others_carry_on(addr, &mut keeper, seed);
        let (status, back, _) = keeper.read(500, 16);
        assert_eq!(status, 0);
        assert!(back == before, "{case}: the refused write changed nothing");
    }
}

/// A Send longer than the target's posted receives (16,768 bytes): its RNIC terminates
/// (RFC 5041 DDP "message too long") and the connection ends; the target carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_longer_than_the_posted_receive_is_terminated() {
    let addr = start_target().await;
    let mut keeper = Peer::logged_in(addr);
    for (logged_in, seed) in [(false, 21u8), (true, 22)] {
        let mut p = if logged_in {
            Peer::logged_in(addr)
        } else {
            Peer::to(addr)
        };
        // A NOP-Out announcing the 17,000 - 76 bytes it carries.
        let data = vec![0x5a; 17_000 - 76];
        let mut b = bhs(0x40, 0x80, data.len(), 0x77);
        b[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        p.post_pdu(&iser_header(None, None), &b, &data);
        p.torn_down();
        assert_eq!(
            p.rings.qp.last_error().as_deref(),
            Some(
                format!(
                    "peer sent Terminate: {}",
                    TerminateCode::DDP_UNTAGGED_TOO_LONG
                )
                .as_str()
            ),
            "the target's RNIC refused the Send"
        );
        others_carry_on(addr, &mut keeper, seed);
    }
}

impl Peer {
    /// Posts `n` WRITEs of one block of immediate data over `lba`, every one with a CmdSN
    /// past the window (from MaxCmdSN + 1), and waits until they are sent or the
    /// connection fails. Returns how many were posted.
    fn past_the_window(&mut self, n: u32, lba: u32) -> u32 {
        let window_end = self.cmd_sn.wrapping_add(QUEUE_DEPTH);
        let saved = self.cmd_sn;
        let mut posted = 0;
        for k in 0..n {
            self.cmd_sn = window_end.wrapping_add(k);
            let b = self.command_bhs(&write10(lba, 1), 0, 512, 512);
            if !self.post_pdu(&iser_header(None, None), &b, &[0xdd; 512]) {
                break;
            }
            posted += 1;
        }
        self.cmd_sn = saved;
        let deadline = Instant::now() + WAIT;
        while self.rings.sends_done < self.rings.sends_posted && self.errors.is_empty() {
            assert!(Instant::now() < deadline, "the Sends were never sent");
            if self.poll() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        posted
    }
}

/// Sends past the command window. A few dozen (fewer than the target's 2 × 16 + 64 posted
/// receives): commands beyond MaxCmdSN are ignored, not queued (none runs even once the
/// window has moved over their CmdSNs) and the connection goes on. Then a flood of 2000
/// posted at once: iWARP has no receiver-not-ready retry, so either a Send finds no receive
/// and the target's RNIC terminates (RFC 5041 "no buffer available"; what happens on this
/// machine), or the session falls more Sends behind than receives were posted and the target
/// ends the connection itself (its receive credit), or the target keeps up and ignores them
/// all. Either way nothing else is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_sends_past_the_command_window_touches_nothing_else() {
    let addr = start_target().await;
    let mut keeper = Peer::logged_in(addr);
    let before = pattern(512, 31);
    assert_eq!(keeper.write(700, &before, 512).0, 0);

    let mut p = Peer::logged_in(addr);
    assert_eq!(p.past_the_window(40, 700), 40);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(p.ping(b"still here"), b"still here");
    // Two commands move the window over the first two ignored CmdSNs.
    p.roundtrip(3000, 32);
    let (status, back, _) = p.read(700, 1);
    assert_eq!(status, 0);
    assert!(back == before, "no command past the window was executed");

    let mut p = Peer::logged_in(addr);
    let flood = 2000;
    let overruns = datamover_iser::credit::overruns();
    let posted = p.past_the_window(flood, 700);
    // Our Sends complete once sent; the target's Terminate for one that found no receive may
    // come after that, even after the ping below is posted (seen under load: the ping then
    // never got its echo).
    let mut terminated = !p.errors.is_empty() || p.rings.qp.state() != QpState::Rts;
    if !terminated {
        match p.ping_or_end(b"still here") {
            Some(echo) => assert_eq!(echo, b"still here"),
            None => terminated = true,
        }
    }
    if terminated {
        let got = p.torn_down();
        assert!(
            !got.contains(&0x21),
            "no command past the window ran: {got:x?}"
        );
        let no_buffer = format!(
            "peer sent Terminate: {}",
            TerminateCode::DDP_UNTAGGED_NO_BUFFER
        );
        assert!(
            p.rings.qp.last_error() == Some(no_buffer)
                || datamover_iser::credit::overruns() > overruns,
            "the target's RNIC ran out of receives or the target cut the peer off at its \
             receive credit ({posted} Sends posted; {:?})",
            p.rings.qp.last_error()
        );
    } else {
        assert_eq!(posted, flood);
        p.roundtrip(3200, 33);
    }
    let (status, back, _) = keeper.read(700, 1);
    assert_eq!(status, 0);
    assert!(back == before, "no command past the window was executed");
    others_carry_on(addr, &mut keeper, 34);
}

impl Peer {
    /// Posts up to `n` NOP-Outs that ask for no answer (ITT and TTT 0xffffffff: an ExpStatSN
    /// update), a few at a time so the target's RNIC finds its receives posted again, never
    /// waiting for the target. Stops when the connection fails; returns how many went out.
    fn flood_of_nops(&mut self, n: u32) -> u32 {
        let mut posted = 0;
        while posted < n {
            let mut b = bhs(0x40, 0x80, 0, u32::MAX);
            b[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
            b[24..28].copy_from_slice(&self.cmd_sn.to_be_bytes());
            b[28..32].copy_from_slice(&self.exp_stat_sn.to_be_bytes());
            if !self.errors.is_empty()
                || self.rings.qp.state() == QpState::Error
                || !self.post_pdu(&iser_header(None, None), &b, &[])
            {
                break;
            }
            posted += 1;
            if posted % 8 == 0 {
                self.poll();
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        posted
    }
}

/// After login, a peer stalls its session (a WRITE whose unsolicited Data-Out never comes,
/// then a Logout, whose answer waits for the connection's tasks) and sends NOP-Outs without
/// waiting for answers or reading its own receives: the target holds no more of them than it
/// posted receives, ends that connection (itself, not its RNIC: the flood is paced so each
/// Send finds a receive) long before the flood is through, and every other session carries
/// on. Before receive credits were kept, each Send was queued behind the stalled session
/// for as long as the peer went on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_sending_past_the_receive_credit_in_full_feature_phase_is_cut_off() {
    let addr = start_target().await;
    let mut keeper = Peer::logged_in(addr);
    keeper.roundtrip(0, 41);
    let overruns = datamover_iser::credit::overruns();

    let mut p = Peer::logged_in(addr);
    let b = p.command_bhs_f(&write10(4000, 1), 0, 512, 0, false);
    assert!(p.post_pdu(&iser_header(None, None), &b, &[]));
    let itt = p.itt();
    let mut logout = bhs(0x46, 0x80, 0, itt);
    logout[24..28].copy_from_slice(&p.cmd_sn.to_be_bytes());
    logout[28..32].copy_from_slice(&p.exp_stat_sn.to_be_bytes());
    assert!(p.post_pdu(&iser_header(None, None), &logout, &[]));
    p.rings.repost = false;
    let flood = 2000;
    let started = Instant::now();
    let posted = p.flood_of_nops(flood);
    p.torn_down();
    assert!(started.elapsed() < WAIT, "cut off within {WAIT:?}");
    assert!(
        posted < flood,
        "the connection ended before the flood was through ({posted} of {flood} posted)"
    );
    assert_ne!(
        p.rings.qp.last_error().as_deref(),
        Some(
            format!(
                "peer sent Terminate: {}",
                TerminateCode::DDP_UNTAGGED_NO_BUFFER
            )
            .as_str()
        ),
        "the target ended it, not its RNIC"
    );
    assert!(datamover_iser::credit::overruns() > overruns);
    others_carry_on(addr, &mut keeper, 42);
}

/// Sends shorter than the iSER header and a BHS (76 bytes), and Sends whose
/// DataSegmentLength announces more bytes than they carry, in login and in full feature
/// phase: the target ends the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_sends_and_overstated_data_lengths_end_the_connection() {
    let addr = start_target().await;
    let mut keeper = Peer::logged_in(addr);
    let cases: [(&str, bool); 6] = [
        ("40 bytes before login", false),
        ("75 bytes before login", false),
        ("login text cut short", false),
        ("40 bytes", true),
        ("75 bytes", true),
        ("immediate data cut short", true),
    ];
    for ((case, logged_in), seed) in cases.into_iter().zip(41u8..) {
        let mut p = if logged_in {
            Peer::logged_in(addr)
        } else {
            Peer::to(addr)
        };
        let bytes = if case.starts_with("40") || case.starts_with("75") {
            let n = if case.starts_with("40") { 40 } else { 75 };
            let mut v = send_bytes(&iser_header(None, None), &bhs(0x40, 0x80, 0, 1), &[]);
            v.truncate(n);
            v
        } else if logged_in {
            // A WRITE announcing 4 KiB of immediate data and carrying 1000 bytes.
            let mr = p.reg(4096, Access::REMOTE_READ);
            let b = p.command_bhs(&write10(0, 8), 0, 4096, 4096);
            let v = send_bytes(
                &iser_header(Some((mr.rkey(), mr.addr())), None),
                &b,
                &[1; 1000],
            );
            let mut w = v[..76].to_vec();
            w.extend_from_slice(&[1; 1000]);
            w
        } else {
            let keys = login_keys();
            let mut b = bhs(0x43, 0x87, keys.len(), 0x4000_0000);
            b[8..14].copy_from_slice(&p.isid);
            b[24..28].copy_from_slice(&1u32.to_be_bytes());
            let mut v = send_bytes(&iser_header(None, None), &b, &keys);
            v.truncate(100);
            v
        };
        p.post(&bytes);
        let got = p.torn_down();
        assert!(
            !got.contains(&0x23) && !got.contains(&0x21),
            "{case}: nothing answered but the connection closed: {got:x?}"
        );
        others_carry_on(addr, &mut keeper, seed);
    }
}

/// iSER Hello and HelloReply (RFC 5046's streaming-mode switch, which iSER on iWARP never
/// uses), opcodes that do not exist, and a control header with reserved flag bits, in login
/// and in full feature phase: the target ends the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_and_unknown_iser_opcodes_or_flags_end_the_connection() {
    let addr = start_target().await;
    let mut keeper = Peer::logged_in(addr);
    let mut seed = 51u8;
    for logged_in in [false, true] {
        for byte0 in [0x20u8, 0x30, 0x11, 0x12, 0x00, 0x40, 0xf0] {
            let mut p = if logged_in {
                Peer::logged_in(addr)
            } else {
                Peer::to(addr)
            };
            // A valid NOP-Out (or, before login, Login Request) behind the bad header.
            let mut v = if logged_in {
                let mut b = bhs(0x40, 0x80, 0, 0x55);
                b[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
                b[24..28].copy_from_slice(&p.cmd_sn.to_be_bytes());
                send_bytes(&iser_header(None, None), &b, &[])
            } else {
                let keys = login_keys();
                let mut b = bhs(0x43, 0x87, keys.len(), 0x4000_0000);
                b[8..14].copy_from_slice(&p.isid);
                b[24..28].copy_from_slice(&1u32.to_be_bytes());
                send_bytes(&iser_header(None, None), &b, &keys)
            };
            v[0] = byte0;
            p.post(&v);
            let got = p.torn_down();
            assert!(
                got.is_empty(),
                "iSER byte 0x{byte0:02x} (logged in: {logged_in}): answered with {got:x?}"
            );
            // Every few cases, check that the rest is untouched (the target's work is the
            // same each time; this keeps the test short).
            if byte0 == 0x20 || byte0 == 0xf0 {
                others_carry_on(addr, &mut keeper, seed);
                seed += 1;
            }
        }
    }
}

/// A SCSI Command or a NOP-Out as the first PDU, and a SCSI Command after a Login Request
/// that did not reach full feature phase: the target ends the connection (no session is
/// made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_login_pdu_before_login_completes_ends_the_connection() {
    let addr = start_target().await;
    let mut keeper = Peer::logged_in(addr);
    for (case, seed) in ["scsi first", "nop first", "scsi mid-login"]
        .into_iter()
        .zip(61u8..)
    {
        let mut p = Peer::to(addr);
        if case == "scsi mid-login" {
            // Security stage, no transit: the target answers and waits for more.
            let keys = key_values(&[
                ("InitiatorName", INITIATOR),
                ("TargetName", IQN),
                ("SessionType", "Normal"),
                ("AuthMethod", "None"),
            ]);
            let r = p.login_request(0x01, &keys);
            assert_eq!(r.opcode(), 0x23, "a Login Response");
            assert_eq!(&r.bhs[36..38], &[0, 0], "security stage status");
            assert_eq!(r.bhs[1] & 0x80, 0, "no transit yet");
            p.exp_stat_sn = r.field32(24).wrapping_add(1);
        }
        let b = if case == "nop first" {
            let mut b = bhs(0x40, 0x80, 0, 0x66);
            b[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
            b
        } else {
            p.command_bhs(&read10(0, 8), 4096, 0, 0)
        };
        p.post_pdu(&iser_header(None, None), &b, &[]);
        let got = p.torn_down();
        assert!(
            !got.contains(&0x21) && !got.contains(&0x20),
            "{case}: the command was not served: {got:x?}"
        );
        others_carry_on(addr, &mut keeper, seed);
    }
}

/// A refused login (a target name the portal does not serve): the Login Response says so
/// and the target leaves the initiator time to close first, as it must too, then closes.
/// Closing at once raced with the initiator's last Send (Linux siw: a fatal QP error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_leaves_the_initiator_time_to_close_first() {
    let addr = start_target().await;
    let mut p = Peer::to(addr);
    let keys = key_values(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", "iqn.2026-11.org.ironsan.test:not-served"),
        ("SessionType", "Normal"),
        ("AuthMethod", "None"),
    ]);
    let r = p.login_request(0x01, &keys);
    assert_eq!(r.opcode(), 0x23, "a Login Response");
    assert_eq!(&r.bhs[36..38], &[0x02, 0x03], "initiator error: not found");
    let refused = Instant::now();
    // The grace is 2 s; most of it must pass with the connection up.
    while refused.elapsed() < Duration::from_millis(1500) {
        p.poll();
        assert_ne!(
            p.rings.qp.state(),
            QpState::Error,
            "the target closed {:?} after refusing",
            refused.elapsed()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Then the target closes by itself (within `torn_down`'s bound).
    p.torn_down();
}

/// An MPA Request without the iSER CM word (no private data, or an MPA revision 1 Request)
/// is taken as flags 0xC0 (no ZBVA, no Send with Invalidate): the target answers with its
/// own word, logs in, and its SCSI Responses are plain Sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mpa_request_without_the_iser_word_is_served_without_send_with_invalidate() {
    let addr = start_target().await;
    for (revision, seed) in [(2u8, 71u8), (1, 72)] {
        let c = Connect {
            private_data: Vec::new(),
            mpa_revision: revision,
            ..Connect::default()
        };
        let mut p = Peer::new(256).connect(addr, &c);
        let flags = iser::CmFlags::decode(&p.info.as_ref().unwrap().peer_private_data);
        assert!(flags.no_zbva, "the target never uses ZBVA");
        assert!(
            flags.no_send_invalidate,
            "the target does not offer Send with Invalidate to an initiator that did not"
        );
        p.login();
        let data = pattern(48 * 1024, seed);
        let (status, inv) = p.write(4000, &data, 4096);
        assert_eq!((status, inv), (0, None), "a plain Send answers the WRITE");
        let (status, back, inv) = p.read(4000, 96);
        assert_eq!((status, inv), (0, None), "a plain Send answers the READ");
        assert!(back == data);
    }
}

/// More RDMA Read Requests than the target's IRD. The target advertises no STag of its
/// own, so a requester can only read nothing (zero-length Reads, which name no memory) or
/// memory it was never given. An MPA revision 1 Request carries no IRD/ORD, so the raw
/// requester keeps its ORD of 256 while the target's RNIC serves 16 at once: the 17th
/// outstanding Read Request is a protocol error and the target's RNIC terminates; a Read
/// Request naming a made-up STag is refused too. The target carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_requests_beyond_the_ird_or_into_target_memory_are_terminated() {
    let addr = start_target().await;
    let mut keeper = Peer::logged_in(addr);
    // Posted before the connection exists, so all go out in one burst once it does and
    // arrive at the target's RNIC before it can answer any.
    let reads = 64u64;
    let p = Peer::new(512);
    let sink = p.reg(64, Access::LOCAL_WRITE);
    for i in 0..reads {
        p.rings
            .qp
            .post_send(SendWr {
                wr_id: (2 << 32) | i,
                op: SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: 0,
                },
                sges: vec![sink.sge(0, 0)],
                signaled: true,
            })
            .unwrap();
    }
    let c = Connect {
        mpa_revision: 1,
        ird: 16,
        ord: 256,
        ..Connect::default()
    };
    let mut p = p.connect(addr, &c);
    assert_eq!(
        p.info.as_ref().unwrap().ord,
        256,
        "no IRD/ORD word: no clamp"
    );
    p.torn_down();
    assert!(
        p.reads_done < reads,
        "{} of {reads} Reads served",
        p.reads_done
    );
    assert_eq!(
        p.rings.qp.last_error().as_deref(),
        Some(
            format!(
                "peer sent Terminate: {}",
                TerminateCode::RDMAP_CATASTROPHIC_STREAM
            )
            .as_str()
        ),
        "the target's RNIC refused the Read Request beyond its IRD"
    );
    others_carry_on(addr, &mut keeper, 81);

    // One Read Request of 512 bytes from a made-up STag, after login.
    let mut p = Peer::logged_in(addr);
    let sink = p.reg(512, Access::LOCAL_WRITE);
    p.rings
        .qp
        .post_send(SendWr {
            wr_id: 3 << 32,
            op: SendOp::RdmaRead {
                remote_addr: 0x10_0000,
                rkey: 0x0000_0101,
            },
            sges: vec![sink.sge(0, 512)],
            signaled: true,
        })
        .unwrap();
    p.torn_down();
    let refused = [
        TerminateCode::RDMAP_INVALID_STAG,
        TerminateCode::RDMAP_STAG_NOT_ASSOC,
        TerminateCode::RDMAP_ACCESS,
    ]
    .map(|c| format!("peer sent Terminate: {c}"));
    let why = p.rings.qp.last_error();
    assert!(
        why.as_ref().is_some_and(|w| refused.contains(w)),
        "the target's RNIC refused the Read Request: {why:?}"
    );
    assert!(
        p.errors
            .iter()
            .any(|e| (e.opcode, e.status) == (WcOpcode::RdmaRead, WcStatus::RemoteAccess)),
        "the Read completed with a remote access error: {:?}",
        p.errors
    );
    others_carry_on(addr, &mut keeper, 82);
}

/// Unsolicited Data-Out over iSER that breaks the rules (past FirstBurstLength, a wrong
/// DataSN, a wrong buffer offset): as over TCP, a Reject (protocol error) carrying the
/// Data-Out's header, then the command ends with CHECK CONDITION, ABORTED COMMAND / DATA
/// PHASE ERROR, and the connection carries on. (Each command announces unsolicited data, F=0,
/// so the target waits for it: a stray Data-Out for a command that announced none may
/// arrive after the command completed and be discarded, a race no test can pin down.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_unsolicited_data_out_gets_reject_and_check_condition() {
    let addr = start_target().await;
    let mut keeper = Peer::logged_in(addr);
    let mut p = Peer::logged_in(addr);
    let before = pattern(32768, 91);
    assert_eq!(p.write(800, &before, 0).0, 0);
    // (DataSN, offset, length) of the one Data-Out (F=1) after 4 KiB of immediate data; the
    // command has F=0: unsolicited data to FirstBurstLength (16 KiB) follows.
    let cases: [(&str, u32, u32, usize); 3] = [
        ("past FirstBurstLength", 0, 4096, SEGMENT),
        ("wrong DataSN", 1, 4096, 4096),
        ("wrong offset", 0, 6144, 2048),
    ];
    for (case, data_sn, offset, len) in cases {
        let data = pattern(32768, 92);
        let mr = p.reg(data.len(), Access::REMOTE_READ);
        mr.write_at(0, &data);
        let b = p.command_bhs_f(&write10(800, 64), 0, 32768, 4096, false);
        let itt = be32(&b[16..20]);
        // Solicited data would begin after the unsolicited part.
        let header = iser_header(Some((mr.rkey(), mr.addr() + SEGMENT as u64)), None);
        assert!(p.post_pdu(&header, &b, &data[..4096]));
        let mut d = bhs(0x05, 0x80, len, itt);
        d[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        d[28..32].copy_from_slice(&p.exp_stat_sn.to_be_bytes());
        d[36..40].copy_from_slice(&data_sn.to_be_bytes());
        d[40..44].copy_from_slice(&offset.to_be_bytes());
        let off = offset as usize;
        assert!(p.post_pdu(&iser_header(None, None), &d, &data[off..off + len]));
        let r = p.recv();
        assert_eq!(r.opcode(), 0x3f, "{case}: a Reject, got {r:?}");
        assert_eq!(r.bhs[2], 0x04, "{case}: reason: protocol error");
        assert_eq!(
            &r.data[..48],
            &d[..],
            "{case}: the rejected header comes back"
        );
        p.exp_stat_sn = r.field32(24).wrapping_add(1);
        let (status, sense, _) = p.response(itt);
        assert_eq!(status, 0x02, "{case}: CHECK CONDITION");
        // A 2-byte SenseLength, then fixed-format sense: key at 2, ASC/ASCQ at 12/13.
        let s = &sense[2..];
        assert_eq!(s[2] & 0x0f, 0x0b, "{case}: ABORTED COMMAND");
        assert_eq!((s[12], s[13]), (0x4b, 0x00), "{case}: DATA PHASE ERROR");
        drop(mr);
        let (status, back, _) = p.read(800, 64);
        assert_eq!(status, 0);
        assert!(back == before, "{case}: the failed write changed nothing");
    }
    // The connection carries on, and so does everything else.
    p.roundtrip(900, 93);
    assert_eq!(p.ping(b"still here"), b"still here");
    others_carry_on(addr, &mut keeper, 94);
}

/// A WRITE whose region does not fit the connection's memory budget (64 MiB, all held by a
/// WRITE announcing 64 MiB just before it) gets TASK SET FULL without its data being fetched
/// (the target takes no region for it); the first runs, and the same write runs once the
/// memory is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_over_the_memory_budget_gets_task_set_full() {
    let addr =
        start_target_with("connection_memory_mib = 64\nsession_memory_mib = 64\nmemory_mib = 64")
            .await;
    let mut p = Peer::logged_in(addr);
    let big = 64usize << 20;
    let region = p.reg(big, Access::REMOTE_READ);
    region.write_at(0, &pattern(8192, 31));
    // 16 blocks written, 64 MiB announced (and fetched): the rest is an overflow.
    let first = p.command_bhs(&write10(40, 16), 0, big as u32, 0);
    let data = pattern(8192, 32);
    let small = p.reg(data.len(), Access::REMOTE_READ);
    small.write_at(0, &data);
    let second = p.command_bhs(&write10(60, 16), 0, data.len() as u32, 0);
    assert!(p.post_pdu(
        &iser_header(Some((region.rkey(), region.addr())), None),
        &first,
        &[]
    ));
    assert!(p.post_pdu(
        &iser_header(Some((small.rkey(), small.addr())), None),
        &second,
        &[]
    ));
    let mut statuses = HashMap::new();
    while statuses.len() < 2 {
        let r = p.recv();
        assert_eq!(r.opcode(), 0x21, "a SCSI Response, got {r:?}");
        p.exp_stat_sn = r.field32(24).wrapping_add(1);
        statuses.insert(r.itt(), r.bhs[3]);
    }
    assert_eq!(statuses[&be32(&first[16..20])], 0, "the first write");
    assert_eq!(statuses[&be32(&second[16..20])], 0x28, "TASK SET FULL");
    let (status, back, _) = p.read(60, 16);
    assert_eq!(status, 0);
    assert!(back != data, "the refused write changed nothing");
    assert_eq!(
        p.write(60, &data, 0).0,
        0,
        "the same write once memory is back"
    );
    assert_eq!(p.read(60, 16).1, data);
    assert_eq!(
        p.read(40, 16).1,
        pattern(8192, 31),
        "the first write landed"
    );
}

/// A WRITE that announces unsolicited data (F=0) and sends none ends its connection after
/// the data-out timeout; other sessions carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_unsolicited_data_never_comes_ends_its_connection() {
    let addr = start_target_with("data_out_timeout_secs = 2").await;
    let mut keeper = Peer::logged_in(addr);
    let mut p = Peer::logged_in(addr);
    let data = pattern(16384, 95);
    let mr = p.reg(data.len(), Access::REMOTE_READ);
    mr.write_at(0, &data);
    let b = p.command_bhs_f(&write10(900, 32), 0, 16384, 4096, false);
    let header = iser_header(Some((mr.rkey(), mr.addr() + SEGMENT as u64)), None);
    assert!(p.post_pdu(&header, &b, &data[..4096]));
    let start = Instant::now();
    let got = p.recv_or_end();
    let took = start.elapsed();
    assert!(got.is_none(), "no answer but the end: {got:?}");
    assert_eq!(
        p.rings.qp.state(),
        QpState::Error,
        "the target ended the connection"
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(6),
        "after the 2 s data-out timeout: {took:?}"
    );
    others_carry_on(addr, &mut keeper, 61);
}

/// A WRITE whose data the target fetches by RDMA Read, from an initiator whose RNIC never
/// answers the Read Request: after the data-out timeout the target drops the connection,
/// which gives the write's memory back (another session's large write finds room again),
/// and other sessions carry on meanwhile. Before, the task, its region and its budget were
/// held for as long as the peer kept the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_rdma_read_is_never_answered_ends_its_connection() {
    let addr = start_target_with(
        "data_out_timeout_secs = 2\nconnection_memory_mib = 64\nsession_memory_mib = 64\n\
         memory_mib = 64",
    )
    .await;
    let mut keeper = Peer::logged_in(addr);
    let mut p = Peer::driven().connect(addr, &Connect::default());
    p.login();
    // 48 MiB announced, all to be fetched by RDMA Read (none of it ever is).
    let source = p.reg(8192, Access::REMOTE_READ);
    let hostile = p.command_bhs(&write10(40, 16), 0, 48 << 20, 0);
    p.post_pdu_then_freeze(
        &iser_header(Some((source.rkey(), source.addr())), None),
        &hostile,
        &[],
    );
    let start = Instant::now();
    // Time for the target to take the hostile write first.
    std::thread::sleep(Duration::from_millis(300));
    // A 32 MiB write of another session: no room while the 48 MiB are held.
    let big = 32usize << 20;
    let data = pattern(8192, 41);
    let region = keeper.reg(big, Access::REMOTE_READ);
    region.write_at(0, &data);
    let mut refused = 0;
    let room_after = loop {
        assert!(
            start.elapsed() < WAIT,
            "the hostile write's memory never came back"
        );
        let b = keeper.command_bhs(&write10(80, 16), 0, big as u32, 0);
        // A refusal's response invalidated the STag the last attempt named.
        let stag = region.revalidate();
        assert!(keeper.post_pdu(&iser_header(Some((stag, region.addr())), None), &b, &[]));
        match keeper.response(be32(&b[16..20])).0 {
            0 => break start.elapsed(),
            0x28 => refused += 1,
            other => panic!("status 0x{other:02x}"),
        }
        // The session's other I/O goes on meanwhile.
        keeper.roundtrip(1200, 42);
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(refused > 0, "the hostile write held its memory at first");
    assert!(
        room_after >= Duration::from_millis(1500) && room_after < Duration::from_secs(5),
        "memory back after the 2 s data-out timeout: {room_after:?}"
    );
    assert_eq!(keeper.read(80, 16).1, data, "the large write landed");
    // The hostile peer, running again, finds its connection gone, its write unanswered.
    p.frozen = false;
    let got = p.recv_or_end();
    assert!(got.is_none(), "no answer but the end: {got:?}");
    assert_eq!(
        p.rings.qp.state(),
        QpState::Error,
        "the target ended the connection"
    );
    others_carry_on(addr, &mut keeper, 63);
}

/// READs from an initiator whose RNIC then stops reading its socket: the target's RDMA
/// Writes and status Sends stop completing, and after the send-stall time (the NOP timeout)
/// the target drops the connection, and with it what the commands held; other sessions
/// carry on meanwhile. Before, the connection and its commands stayed for as long as the
/// peer kept its socket open: once it read again, every read completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_is_dropped_after_the_send_stall_time() {
    // Pings every minute: what ends the connection here is the send stall, not a ping
    // that goes unanswered.
    let addr = start_target_with("nop_timeout_secs = 2\nnop_interval_secs = 60").await;
    let mut keeper = Peer::logged_in(addr);
    let mut p = Peer::driven().connect(addr, &Connect::default());
    p.login();
    // 32 MiB of read data: more than the sockets and the target's RNIC buffer between them.
    const READS: usize = 16;
    const LEN: usize = 2 << 20;
    // A region each: a status invalidates its read's STag.
    let sinks: Vec<rnic::Mr> = (0..READS)
        .map(|_| p.reg(LEN, Access::REMOTE_WRITE))
        .collect();
    let mut itts = Vec::new();
    for (i, sink) in sinks.iter().enumerate() {
        let blocks = (LEN / 512) as u16;
        let lba = (i % 8) as u32 * u32::from(blocks);
        let b = p.command_bhs(&read10(lba, blocks), LEN as u32, 0, 0);
        itts.push(be32(&b[16..20]));
        let header = iser_header(None, Some((sink.rkey(), sink.addr())));
        if i + 1 < READS {
            assert!(p.post_pdu(&header, &b, &[]));
        } else {
            p.post_pdu_then_freeze(&header, &b, &[]);
        }
    }
    let start = Instant::now();
    // Another session writes blocks the stalled reads hold (read data leaves straight from
    // the RAM LUN's image, whose range stays locked until its RDMA Write completes): done
    // once the connection is dropped.
    keeper.roundtrip(1300, 43);
    let first_write = start.elapsed();
    assert!(
        first_write < Duration::from_secs(5),
        "the other session's write waited {first_write:?} for the stalled reads"
    );
    // Past the 2 s send stall and the check's lag, other sessions' I/O goes on.
    let mut round = 1;
    while start.elapsed() < Duration::from_millis(4500) {
        keeper.roundtrip(1300 + round * 100, 43);
        round += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    // Running again, the peer gets what was already in the sockets, then the end.
    p.frozen = false;
    let mut answered = 0;
    while let Some(r) = p.recv_or_end() {
        assert_eq!(r.opcode(), 0x21, "a SCSI Response, got {r:?}");
        assert!(itts.contains(&r.itt()));
        answered += 1;
    }
    assert_eq!(
        p.rings.qp.state(),
        QpState::Error,
        "the target ended the connection"
    );
    assert!(
        answered < READS,
        "the connection was dropped before all {READS} reads were answered ({answered} were)"
    );
    others_carry_on(addr, &mut keeper, 64);
}
