//! Bad input toward the iSER initiator: a raw target written directly on the `rdma` API, on
//! its own software iWARP RNIC, accepts the initiator's connection (the iSER word in its MPA
//! Reply as the test chooses), answers the Login Request in a Send and then, in full feature
//! phase, misbehaves: a SCSI Response in a Send with Invalidate naming an STag the command
//! never advertised, or after its own CM reply refused remote invalidation, or an RDMA Write
//! outside the buffer a READ advertised. The initiator must fail the connection with an error
//! that says why, fail the commands (or, with `reconnect`, resend them on a new connection,
//! which the raw target then serves properly), never panic, and its RNIC must answer a
//! placement outside the buffer with a Terminate. And the CM word it sends when it refuses
//! remote invalidation is 0xc0. Every wait is bounded.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iscsi_initiator::{scsi, CommandRequest, Error, IscsiUrl, Session, SessionConfig, TaskError};
use iscsi_wire::{Bhs, NopIn, Pdu, ScsiCommand, ScsiResponse};
use iser::IserHeader;
use iwarp::TerminateCode;
use rdma::{
    Access, CompletionQueue, ConnParams, ConnectRequest, Listener, MemoryRegion, Provider, QpCaps,
    QueuePair, RecvWr, SendOp, SendWr, Wc, WcOpcode, WcStatus,
};
use rnic::Rnic;
use tokio::sync::mpsc;

use test_support::iser_raw::{iser_login_response, raw_target_send};
use test_support::random_bytes;

/// The bound on any single wait (generous for a busy 2-core machine, short enough for CI).
const T: Duration = Duration::from_secs(10);
/// The iSER CM word of a target that will use Send with Invalidate (as Linux LIO sends it).
const WORD_SIE: [u8; 4] = [0x80, 0, 0, 0];
/// The iSER CM word of a target that will not (0x40: Send with Invalidate not used).
const WORD_NO_SIE: [u8; 4] = [0xc0, 0, 0, 0];
/// A READ whose length is a whole pool class of the initiator (a power of two from 4 KiB):
/// the registered region is exactly the advertised buffer, so any byte outside it is outside
/// the region and its STag.
const READ_LEN: usize = 16384;
const TARGET_NAME: &str = "iqn.2026-11.org.ironsan:raw-target";

// ------------------------------------------------------------------------ the raw target

/// Receive and send buffers of the raw target.
const SLOTS: usize = 32;
const SLOT_LEN: usize = 16384;
/// RDMA Write sources of the raw target.
const DATA_SLOTS: usize = 16;
const DATA_SLOT: usize = 65536;

/// One accepted connection of the raw target, in full feature phase after [`RawConn::login`].
struct RawConn {
    qp: rnic::Qp,
    cq: rnic::Cq,
    recv: rnic::Mr,
    send: rnic::Mr,
    /// Where RDMA Writes leave from.
    data: rnic::Mr,
    next_data: usize,
    next_send: usize,
    stat_sn: u32,
    exp_cmd_sn: u32,
    /// Whether Send with Invalidate may be used: both CM words allow it.
    sie: bool,
    /// The first byte of the initiator's iSER CM word.
    initiator_word: u8,
    /// The iSER header of the last SCSI Command received.
    last_header: Option<IserHeader>,
}

/// A READ as the raw target received it.
struct ReadCmd {
    itt: u32,
    lba: u64,
    len: usize,
    /// The Read STag and VA of its iSER header.
    stag: u32,
    va: u64,
}

impl RawConn {
    /// Accepts the next connection request on `listener` with `word` as our iSER CM word.
    fn accept(dev: &Rnic, listener: &rnic::RnicListener, word: [u8; 4]) -> Result<Self, String> {
        let req = listener
            .get_request(T)
            .map_err(|e| format!("listening: {e}"))?
            .ok_or("no connection request in time")?;
        let theirs = req.private_data().first().copied();
        // 0x80: no ZBVA, Send with Invalidate accepted; 0xc0: refused (asked for plain Sends).
        let Some(initiator_word @ (0x80 | 0xc0)) = theirs else {
            return Err(format!(
                "the initiator's iSER CM word is {theirs:?}, not 0x80 or 0xc0"
            ));
        };
        let e = |e: rdma::Error| e.to_string();
        let pd = dev.alloc_pd().map_err(e)?;
        let cq = dev.create_cq(1024, None).map_err(e)?;
        let qp = dev.create_qp(&pd, &cq, &cq, QpCaps::default()).map_err(e)?;
        let recv = dev
            .reg_mr(&pd, SLOTS * SLOT_LEN, Access::LOCAL_WRITE)
            .map_err(e)?;
        let send = dev.reg_mr(&pd, SLOTS * SLOT_LEN, Access::NONE).map_err(e)?;
        let data = dev
            .reg_mr(&pd, DATA_SLOTS * DATA_SLOT, Access::NONE)
            .map_err(e)?;
        for slot in 0..SLOTS {
            qp.post_recv(RecvWr {
                wr_id: slot as u64,
                sges: vec![recv.sge(slot * SLOT_LEN, SLOT_LEN)],
            })
            .map_err(e)?;
        }
        let params = ConnParams {
            private_data: word.to_vec(),
            ird: 16,
            ord: 16,
            ..ConnParams::default()
        };
        req.accept(&qp, &params)
            .map_err(|e| format!("accepting: {e}"))?;
        Ok(RawConn {
            qp,
            cq,
            recv,
            send,
            data,
            next_data: 0,
            next_send: 0,
            stat_sn: 0,
            exp_cmd_sn: 0,
            sie: word[0] & 0x40 == 0 && initiator_word & 0x40 == 0,
            initiator_word,
            last_header: None,
        })
    }

    /// The next received Send (send completions are skipped; any failed completion is an
    /// error naming the QP's state).
    fn recv_pdu(&mut self) -> Result<Pdu, String> {
        let deadline = Instant::now() + T;
        let mut wc = [Wc::EMPTY];
        loop {
            if self.cq.poll(&mut wc) == 1 {
                let wc = wc[0];
                if wc.status != WcStatus::Success {
                    return Err(format!(
                        "completion {:?} {:?}; QP error: {:?}",
                        wc.opcode,
                        wc.status,
                        self.qp.last_error()
                    ));
                }
                if wc.opcode != WcOpcode::Recv {
                    continue;
                }
                let slot = wc.wr_id as usize;
                let mut bytes = vec![0u8; wc.byte_len as usize];
                self.recv.read_at(slot * SLOT_LEN, &mut bytes);
                self.qp
                    .post_recv(RecvWr {
                        wr_id: slot as u64,
                        sges: vec![self.recv.sge(slot * SLOT_LEN, SLOT_LEN)],
                    })
                    .map_err(|e| e.to_string())?;
                let s = iser::parse_send(&Bytes::from(bytes), 65536).map_err(|e| e.to_string())?;
                if let Bhs::ScsiCommand(c) = &s.pdu.bhs {
                    // Keep the read's STag with the command (see next_read).
                    self.last_header = Some(s.header);
                    if !c.immediate {
                        self.exp_cmd_sn = self.exp_cmd_sn.max(c.cmd_sn.wrapping_add(1));
                    }
                }
                return Ok(s.pdu);
            }
            if Instant::now() > deadline {
                return Err("nothing received in time".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Posts `pdu` in a Send (`op`: Send or Send with Invalidate), stamped with our numbers.
    fn send_pdu(&mut self, pdu: Pdu, op: SendOp) -> Result<(), String> {
        let bytes = raw_target_send(pdu, &mut self.stat_sn, self.exp_cmd_sn);
        let len = bytes.len();
        let at = (self.next_send % SLOTS) * SLOT_LEN;
        self.next_send += 1;
        self.send.write_at(at, &bytes);
        self.qp
            .post_send(SendWr {
                wr_id: 1 << 32,
                op,
                sges: vec![self.send.sge(at, len)],
                signaled: true,
            })
            .map_err(|e| format!("posting a Send: {e}"))
    }

    /// RDMA-Writes `data` (at most [`DATA_SLOT`] bytes) to the initiator's `(stag, va)`.
    fn rdma_write(&mut self, stag: u32, va: u64, data: &[u8]) -> Result<(), String> {
        // Each Write leaves from a slot of its own: the RNIC reads the source as it transmits.
        let at = self.next_data % DATA_SLOTS * DATA_SLOT;
        self.next_data += 1;
        self.data.write_at(at, data);
        self.qp
            .post_send(SendWr {
                wr_id: 2 << 32,
                op: SendOp::RdmaWrite {
                    remote_addr: va,
                    rkey: stag,
                },
                sges: vec![self.data.sge(at, data.len())],
                signaled: true,
            })
            .map_err(|e| format!("posting an RDMA Write: {e}"))
    }

    /// Answers the Login Request (operational stage straight to full feature phase, in iSER
    /// mode), as the ironsan and LIO targets do.
    fn login(&mut self) -> Result<(), String> {
        let pdu = self.recv_pdu()?;
        let Bhs::LoginRequest(r) = pdu.bhs else {
            return Err(format!("expected a Login Request, got {:?}", pdu.bhs));
        };
        let text = String::from_utf8_lossy(&pdu.data).to_string();
        if !text.contains("RDMAExtensions=Yes") || !text.contains(TARGET_NAME) {
            return Err(format!("unexpected login text {text:?}"));
        }
        self.stat_sn = 0;
        self.exp_cmd_sn = r.cmd_sn;
        self.send_pdu(iser_login_response(&r), SendOp::Send)
    }

    /// The next READ command (other PDUs, such as a NOP-Out, are skipped).
    fn next_read(&mut self) -> Result<ReadCmd, String> {
        loop {
            let pdu = self.recv_pdu()?;
            let Bhs::ScsiCommand(c) = pdu.bhs else {
                continue;
            };
            let header = self.last_header.take().ok_or("no iSER header")?;
            return read_cmd(&c, &header);
        }
    }

    /// A SCSI Response (GOOD) for `itt`, sent with `op`.
    fn respond(&mut self, itt: u32, op: SendOp) -> Result<(), String> {
        let rsp = ScsiResponse {
            itt,
            status: 0,
            ..Default::default()
        };
        self.send_pdu(Pdu::new(Bhs::ScsiResponse(rsp), Bytes::new()), op)
    }

    /// Serves `cmd` properly: its data (random_bytes(len, lba)) into its buffer, then the
    /// SCSI Response, with Invalidate of its Read STag when our CM word allowed it.
    fn serve(&mut self, cmd: &ReadCmd) -> Result<(), String> {
        self.rdma_write(cmd.stag, cmd.va, &random_bytes(cmd.len, cmd.lba))?;
        let op = if self.sie {
            SendOp::SendInvalidate { rkey: cmd.stag }
        } else {
            SendOp::Send
        };
        self.respond(cmd.itt, op)
    }

    /// Waits for the connection to end (the initiator closing it, or a Terminate); returns
    /// the QP's error, if it has one.
    fn wait_ended(&self) -> Result<Option<String>, String> {
        if !self.qp.wait_closed(T) {
            return Err("the initiator did not end the connection in time".into());
        }
        Ok(self.qp.last_error())
    }
}

fn read_cmd(c: &ScsiCommand, header: &IserHeader) -> Result<ReadCmd, String> {
    let (stag, va) = header
        .read
        .ok_or_else(|| format!("a command without a Read STag: {c:?}"))?;
    let lba = match c.cdb[0] {
        0x28 => u64::from(u32::from_be_bytes(c.cdb[2..6].try_into().unwrap())),
        0x88 => u64::from_be_bytes(c.cdb[2..10].try_into().unwrap()),
        op => return Err(format!("not a READ: opcode 0x{op:02x}")),
    };
    Ok(ReadCmd {
        itt: c.itt,
        lba,
        len: c.expected_data_len as usize,
        stag,
        va,
    })
}

/// What the raw target does on one connection, after login: Ok with what it saw.
type Script = Box<dyn FnOnce(&mut RawConn) -> Result<String, String> + Send>;

/// A raw target serving one connection per script, in order, on a thread of its own; each
/// script's outcome is reported on the channel.
struct RawTarget {
    addr: SocketAddr,
    reports: mpsc::UnboundedReceiver<Result<String, String>>,
}

impl RawTarget {
    fn start(scripts: Vec<([u8; 4], Script)>) -> RawTarget {
        RawTarget::start_with(RawConn::login, scripts)
    }

    /// [`RawTarget::start`] with `login` answering each connection's Login Request.
    fn start_with(
        login: fn(&mut RawConn) -> Result<(), String>,
        scripts: Vec<([u8; 4], Script)>,
    ) -> RawTarget {
        let dev = Rnic::new().expect("a software RNIC");
        let listener = dev.listen("127.0.0.1:0".parse().unwrap()).expect("listen");
        let addr = listener.local_addr();
        let (tx, reports) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for (word, script) in scripts {
                let outcome = RawConn::accept(&dev, &listener, word).and_then(|mut conn| {
                    login(&mut conn)?;
                    let got = script(&mut conn);
                    // Dropping the QP aborts the connection; the scripts wait for its end.
                    drop(conn);
                    got
                });
                let failed = outcome.is_err();
                let _ = tx.send(outcome);
                if failed {
                    return;
                }
            }
        });
        RawTarget { addr, reports }
    }

    /// The next script's outcome.
    async fn report(&mut self) -> String {
        match tokio::time::timeout(T + T, self.reports.recv()).await {
            Ok(Some(Ok(what))) => what,
            Ok(Some(Err(why))) => panic!("the raw target: {why}"),
            Ok(None) => panic!("the raw target stopped"),
            Err(_) => panic!("no report from the raw target in time"),
        }
    }
}

// ------------------------------------------------------------------------ the initiator side

/// Counts panics on the runtimes' worker threads, where the initiator's tasks run (a panicking
/// tokio task would otherwise go unnoticed; a test's own assertions fail on its own thread).
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some("tokio-runtime-worker") {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

/// The raw target's LUN 0 at `addr`, and a session configuration for it: every wait bounded
/// by [`T`], no NOP-Outs.
fn raw_target_session(addr: SocketAddr) -> (IscsiUrl, SessionConfig) {
    count_panics();
    let url = IscsiUrl::parse_lun(&format!("iser://{addr}/{TARGET_NAME}/0")).expect("url");
    let cfg = SessionConfig {
        nop_interval: None,
        connect_timeout: T,
        login_timeout: T,
        ..SessionConfig::from_url(&url)
    };
    (url, cfg)
}

async fn connect(addr: SocketAddr, reconnect: bool) -> Session {
    let (url, cfg) = raw_target_session(addr);
    let cfg = SessionConfig {
        reconnect,
        reconnect_attempts: 2,
        ..cfg
    };
    tokio::time::timeout(T + T, transports::connect_session(&url, cfg))
        .await
        .expect("login in time")
        .expect("iSER login to the raw target")
}

/// Submits a READ of `len` bytes at `lba`.
fn submit_read(s: &Session, lba: u64, len: usize) -> iscsi_initiator::PendingCommand {
    let cdb = scsi::read_write(false, lba, (len / 512) as u32, false);
    s.submit(CommandRequest::read(0, cdb, len as u32))
}

/// The command's outcome, in time: its data, or the error it failed with.
async fn outcome(cmd: iscsi_initiator::PendingCommand) -> Result<Bytes, Error> {
    tokio::time::timeout(T + T, cmd.wait())
        .await
        .expect("the command ended in time (no hang)")
        .map(|r| r.data)
}

/// The error text of a command that failed with the connection.
fn connection_lost(r: Result<Bytes, Error>) -> String {
    match r {
        Err(Error::Task(TaskError::ConnectionLost(why))) => why,
        Err(e) => panic!("failed, but not with the connection: {e}"),
        Ok(d) => panic!("the command succeeded ({} bytes)", d.len()),
    }
}

/// The session failed for good: a new command fails at once, with the same reason.
async fn session_failed(s: &Session, reason: &str) {
    let why = connection_lost(outcome(submit_read(s, 0, 512)).await);
    assert!(why.contains(reason), "{why}");
}

fn no_panics() {
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "a task of the initiator panicked"
    );
}

/// A script: two READs; the first's SCSI Response is a Send with Invalidate naming the
/// second's Read STag (valid at the initiator's RNIC, which invalidates it, but not the
/// command's). Reports "<foreign STag> <ITT>".
fn invalidate_the_other_commands_stag() -> Script {
    Box::new(|c| {
        let a = c.next_read()?;
        let b = c.next_read()?;
        c.respond(a.itt, SendOp::SendInvalidate { rkey: b.stag })?;
        c.wait_ended()?;
        Ok(format!("{:08x} {:08x}", b.stag, a.itt))
    })
}

/// A script serving `n` READs properly, then waiting for the initiator to go.
fn serve(n: usize) -> Script {
    Box::new(move |c| {
        for _ in 0..n {
            let cmd = c.next_read()?;
            c.serve(&cmd)?;
        }
        c.wait_ended()?;
        Ok(String::new())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_stag_invalidated_with_a_scsi_response_fails_the_connection() {
    let mut raw = RawTarget::start(vec![(WORD_SIE, invalidate_the_other_commands_stag())]);
    let s = connect(raw.addr, false).await;
    let a = submit_read(&s, 8, READ_LEN);
    let b = submit_read(&s, 64, READ_LEN);
    let (a, b) = (outcome(a).await, outcome(b).await);
    let seen = raw.report().await;
    let (stag, itt) = seen.split_once(' ').unwrap();
    let why = connection_lost(a);
    assert!(
        why.contains(&format!(
            "the target invalidated STag 0x{stag}, not one of ITT 0x{itt}"
        )),
        "{why}"
    );
    assert_eq!(
        connection_lost(b),
        why,
        "both commands fail, for one reason"
    );
    session_failed(&s, &why).await;
    no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_reconnect_a_foreign_invalidation_resends_the_commands_on_a_new_connection() {
    let mut raw = RawTarget::start(vec![
        (WORD_SIE, invalidate_the_other_commands_stag()),
        (WORD_SIE, serve(2)),
    ]);
    let s = connect(raw.addr, true).await;
    let a = submit_read(&s, 8, READ_LEN);
    let b = submit_read(&s, 64, READ_LEN);
    let (a, b) = (outcome(a).await, outcome(b).await);
    raw.report().await;
    assert!(
        a.expect("READ a, resent") == random_bytes(READ_LEN, 8),
        "READ a's data"
    );
    assert!(
        b.expect("READ b, resent") == random_bytes(READ_LEN, 64),
        "READ b's data"
    );
    assert_eq!(s.connection_count(), 1);
    drop(s);
    raw.report().await;
    no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_stag_in_a_send_with_invalidate_gets_a_terminate() {
    // An STag the initiator never registered: its RNIC cannot invalidate it, answers with a
    // Terminate and fails the queue pair before the ULP sees the Send.
    let made_up = 0x7fff_ff42;
    let mut raw = RawTarget::start(vec![(
        WORD_SIE,
        Box::new(move |c| {
            let a = c.next_read()?;
            c.respond(a.itt, SendOp::SendInvalidate { rkey: made_up })?;
            Ok(c.wait_ended()?.unwrap_or_default())
        }),
    )]);
    let s = connect(raw.addr, false).await;
    let why = connection_lost(outcome(submit_read(&s, 8, READ_LEN)).await);
    let qp_error = raw.report().await;
    assert!(
        qp_error.contains(&format!(
            "peer sent Terminate: {}",
            TerminateCode::RDMAP_CANNOT_INVALIDATE
        )),
        "the raw target's QP: {qp_error}"
    );
    assert!(why.contains("RDMA operation failed"), "{why}");
    session_failed(&s, &why).await;
    no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_with_invalidate_on_a_nop_in_fails_the_connection() {
    // Invalidation only ever comes with a SCSI Response (here: a NOP-In invalidating the
    // outstanding READ's own STag).
    let mut raw = RawTarget::start(vec![(
        WORD_SIE,
        Box::new(|c| {
            let a = c.next_read()?;
            let nop = NopIn {
                itt: iscsi_wire::RESERVED_TAG,
                ttt: iscsi_wire::RESERVED_TAG,
                ..Default::default()
            };
            c.send_pdu(
                Pdu::new(Bhs::NopIn(nop), Bytes::new()),
                SendOp::SendInvalidate { rkey: a.stag },
            )?;
            c.wait_ended()?;
            Ok(String::new())
        }),
    )]);
    let s = connect(raw.addr, false).await;
    let why = connection_lost(outcome(submit_read(&s, 8, READ_LEN)).await);
    raw.report().await;
    assert!(
        why.contains("a Send with Invalidate that is no SCSI Response"),
        "{why}"
    );
    session_failed(&s, &why).await;
    no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_invalidating_the_rejected_commands_stag_fails_only_that_command() {
    // Linux LIO's isert sends a Reject of a command in a Send with Invalidate of that
    // command's STag: the command fails with the Reject, the connection carries on.
    let mut raw = RawTarget::start(vec![(
        WORD_SIE,
        Box::new(|c| {
            let a = c.next_read()?;
            let mut rejected = vec![0u8; 48];
            rejected[0] = 0x01; // the SCSI Command's BHS: only its ITT matters here
            rejected[16..20].copy_from_slice(&a.itt.to_be_bytes());
            let reject = iscsi_wire::Reject {
                reason: 0x04,
                ..Default::default()
            };
            c.send_pdu(
                Pdu::new(Bhs::Reject(reject), Bytes::from(rejected)),
                SendOp::SendInvalidate { rkey: a.stag },
            )?;
            let b = c.next_read()?;
            c.serve(&b)?;
            c.wait_ended()?;
            Ok(String::new())
        }),
    )]);
    let s = connect(raw.addr, false).await;
    match outcome(submit_read(&s, 8, READ_LEN)).await {
        Err(Error::Task(TaskError::Rejected(0x04))) => {}
        other => panic!("not failed with the Reject: {other:?}"),
    }
    let data = outcome(submit_read(&s, 40, READ_LEN))
        .await
        .expect("the next READ");
    assert!(data == random_bytes(READ_LEN, 40), "the next READ's data");
    drop(s); // closes the connection the raw target waits on
    raw.report().await;
    no_panics();
}

/// A script: our CM reply refused Send with Invalidate; the READ is answered with one anyway
/// (naming the command's own Read STag). Reports that STag.
fn invalidate_though_refused() -> Script {
    Box::new(|c| {
        let a = c.next_read()?;
        c.rdma_write(a.stag, a.va, &random_bytes(a.len, a.lba))?;
        c.respond(a.itt, SendOp::SendInvalidate { rkey: a.stag })?;
        c.wait_ended()?;
        Ok(format!("{:08x}", a.stag))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_with_invalidate_after_the_target_refused_it_fails_the_connection() {
    let mut raw = RawTarget::start(vec![(WORD_NO_SIE, invalidate_though_refused())]);
    let s = connect(raw.addr, false).await;
    let r = outcome(submit_read(&s, 8, READ_LEN)).await;
    let stag = raw.report().await;
    let why = connection_lost(r);
    assert!(
        why.contains(&format!(
            "the target invalidated STag 0x{stag} with a Send, though its CM reply refused remote invalidation"
        )),
        "{why}"
    );
    session_failed(&s, &why).await;
    no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_reconnect_after_a_refused_invalidation_the_read_is_resent_and_plain_sends_serve_it() {
    // The second connection's target refuses remote invalidation too and keeps to it (plain
    // Sends): the initiator invalidates its own STags and the data is right.
    let mut raw = RawTarget::start(vec![
        (WORD_NO_SIE, invalidate_though_refused()),
        (WORD_NO_SIE, serve(2)),
    ]);
    let s = connect(raw.addr, true).await;
    let r = outcome(submit_read(&s, 8, READ_LEN)).await;
    raw.report().await;
    assert!(
        r.expect("the READ, resent") == random_bytes(READ_LEN, 8),
        "the READ's data"
    );
    let r = outcome(submit_read(&s, 100, 4096)).await;
    assert!(r.expect("a READ") == random_bytes(4096, 100), "its data");
    drop(s);
    raw.report().await;
    no_panics();
}

/// A script: the READ's data is RDMA-Written to its Read STag at `delta` bytes from the
/// advertised VA, `len` bytes of it, partly outside the buffer; reports the QP's error.
fn write_outside(delta: i64, len: usize) -> Script {
    write_outside_read_of(READ_LEN, delta, len)
}

/// [`write_outside`] for a READ of `read_len` bytes.
fn write_outside_read_of(read_len: usize, delta: i64, len: usize) -> Script {
    Box::new(move |c| {
        let a = c.next_read()?;
        if a.len != read_len {
            return Err(format!("a READ of {} bytes", a.len));
        }
        let va = a.va.wrapping_add_signed(delta);
        c.rdma_write(a.stag, va, &vec![0xee; len])?;
        Ok(c.wait_ended()?.unwrap_or_default())
    })
}

fn assert_terminated(qp_error: &str) {
    assert!(
        qp_error.contains(&format!(
            "peer sent Terminate: {}",
            TerminateCode::DDP_TAGGED_BASE_BOUNDS
        )),
        "the raw target's QP: {qp_error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rdma_write_past_the_read_buffer_gets_a_terminate_and_fails_the_read() {
    // 512 bytes inside the buffer, 512 past its end.
    let mut raw = RawTarget::start(vec![(WORD_SIE, write_outside(READ_LEN as i64 - 512, 1024))]);
    let s = connect(raw.addr, false).await;
    let r = outcome(submit_read(&s, 8, READ_LEN)).await;
    assert_terminated(&raw.report().await);
    let why = connection_lost(r);
    session_failed(&s, &why).await;
    no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_reconnect_an_rdma_write_before_the_read_buffer_gets_a_terminate_and_the_read_is_resent(
) {
    // 64 bytes before the advertised VA and 64 in the buffer; the resent READ is served
    // properly and its data holds no byte of the refused Write.
    let mut raw = RawTarget::start(vec![
        (WORD_SIE, write_outside(-64, 128)),
        (WORD_SIE, serve(1)),
    ]);
    let s = connect(raw.addr, true).await;
    let r = outcome(submit_read(&s, 8, READ_LEN)).await;
    assert_terminated(&raw.report().await);
    let data = r.expect("the READ, resent");
    assert!(data == random_bytes(READ_LEN, 8), "the READ's data");
    drop(s);
    raw.report().await;
    no_panics();
}

/// `--no-remote-invalidation` (SessionConfig::iser_remote_invalidation = false) is the CM word
/// 0xc0 on the wire, and the READ is served with plain Sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_remote_invalidation_sends_the_cm_word_0xc0() {
    let word = Box::new(|c: &mut RawConn| {
        let cmd = c.next_read()?;
        c.serve(&cmd)?;
        let seen = format!("{:02x} {}", c.initiator_word, c.sie);
        c.wait_ended()?;
        Ok(seen)
    });
    let mut raw = RawTarget::start(vec![(WORD_SIE, word)]);
    let (url, cfg) = raw_target_session(raw.addr);
    let cfg = SessionConfig {
        iser_remote_invalidation: false,
        ..cfg
    };
    let s = tokio::time::timeout(T + T, transports::connect_session(&url, cfg))
        .await
        .expect("login in time")
        .expect("iSER login to the raw target");
    let r = outcome(submit_read(&s, 8, 4096)).await;
    assert!(r.expect("the READ") == random_bytes(4096, 8), "its data");
    drop(s);
    assert_eq!(
        raw.report().await,
        "c0 false",
        "the initiator's CM word, and Send with Invalidate unused"
    );
    no_panics();
}

/// A READ shorter than its pooled region's size class (5 KiB in an 8 KiB region): its STag
/// reaches only the 5 KiB, so an RDMA Write just past them, inside the region, is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rdma_write_past_a_short_read_inside_its_region_gets_a_terminate() {
    const SHORT: usize = 5120;
    let mut raw = RawTarget::start(vec![(
        WORD_SIE,
        write_outside_read_of(SHORT, SHORT as i64, 512),
    )]);
    let s = connect(raw.addr, false).await;
    let r = outcome(submit_read(&s, 8, SHORT)).await;
    assert_terminated(&raw.report().await);
    let why = connection_lost(r);
    session_failed(&s, &why).await;
    no_panics();
}

// ------------------------------------------------------------------------ a refused login

/// How long the raw target watches for the initiator's close after refusing its login:
/// the initiator must leave the closing to the target that long (it waits 100 ms).
const LET_CLOSE: Duration = Duration::from_millis(50);

impl RawConn {
    /// Answers the Login Request with a refusal: status 0x0201, authentication failure.
    fn refuse_login(&mut self) -> Result<(), String> {
        let pdu = self.recv_pdu()?;
        let Bhs::LoginRequest(r) = pdu.bhs else {
            return Err(format!("expected a Login Request, got {:?}", pdu.bhs));
        };
        let Bhs::LoginResponse(mut rsp) = iser_login_response(&r).bhs else {
            unreachable!("iser_login_response makes a Login Response")
        };
        rsp.transit = false;
        rsp.tsih = 0;
        rsp.status_class = 2;
        rsp.status_detail = 1;
        self.exp_cmd_sn = r.cmd_sn;
        self.send_pdu(
            Pdu::new(Bhs::LoginResponse(rsp), Bytes::new()),
            SendOp::Send,
        )
    }
}

/// A raw target that refuses one login, checks that the initiator has not closed the
/// connection within [`LET_CLOSE`], then closes it itself (`target_closes`) or waits for the
/// initiator to; reports the QP's error, if any, as the connection ended.
fn refusing_target(target_closes: bool) -> RawTarget {
    let script: Script = Box::new(move |conn: &mut RawConn| {
        if conn.qp.wait_closed(LET_CLOSE) {
            return Err(format!(
                "the initiator closed within {LET_CLOSE:?} of the refusal, before the target \
                 could (QP error: {:?})",
                conn.qp.last_error()
            ));
        }
        if target_closes {
            conn.qp.disconnect();
        }
        Ok(format!("ended, QP error {:?}", conn.wait_ended()?))
    });
    RawTarget::start_with(RawConn::refuse_login, vec![(WORD_SIE, script)])
}

/// The login error of a session the target refused, and how long the login took.
async fn refused_login(addr: SocketAddr) -> (Error, Duration) {
    let (url, cfg) = raw_target_session(addr);
    let started = Instant::now();
    let got = tokio::time::timeout(T + T, transports::connect_session(&url, cfg))
        .await
        .expect("the login ended in time");
    match got {
        Err(e) => (e, started.elapsed()),
        Ok(_) => panic!("the refused login succeeded"),
    }
}

/// A target refusing the login closes its end first (as Linux LIO does; its siw fails the
/// refusal's Send when the initiator's FIN overtakes it): the initiator waits for that close,
/// then reports the refusal. The connection ends cleanly (no Terminate, no QP error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_lets_the_target_close_first() {
    let mut raw = refusing_target(true);
    let (e, took) = refused_login(raw.addr).await;
    assert!(e.to_string().contains("authentication failure"), "{e}");
    // The target closes no sooner than LET_CLOSE after its refusal: a login failing sooner
    // did not wait, and a process exiting on it would cut the target's answer short.
    assert!(
        took >= LET_CLOSE && took < T,
        "the login failed after {took:?}"
    );
    assert_eq!(raw.report().await, "ended, QP error None");
    no_panics();
}

/// A target that refuses the login and leaves the closing to the initiator gets it after the
/// initiator's grace (100 ms): the login fails, and the initiator's close reaches the target
/// (before, a refused login's connection stayed open until the process exited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_is_closed_by_the_initiator_when_the_target_does_not() {
    let mut raw = refusing_target(false);
    let (e, took) = refused_login(raw.addr).await;
    assert!(e.to_string().contains("authentication failure"), "{e}");
    assert!(took < T, "the login failed after {took:?}");
    assert_eq!(
        raw.report().await,
        "ended, QP error Some(\"connection closed by peer\")"
    );
    no_panics();
}

impl RawConn {
    /// Answers the Login Request with a Login Response for another ITT: a protocol error.
    fn misanswer_login(&mut self) -> Result<(), String> {
        let pdu = self.recv_pdu()?;
        let Bhs::LoginRequest(mut r) = pdu.bhs else {
            return Err(format!("expected a Login Request, got {:?}", pdu.bhs));
        };
        self.exp_cmd_sn = r.cmd_sn;
        r.itt = r.itt.wrapping_add(1);
        self.send_pdu(iser_login_response(&r), SendOp::Send)
    }
}

/// A login that fails for any other reason (here a Login Response for another ITT) closes its
/// connection too, at once: before, only a refusal did, and any other failed login kept its
/// connection open until the process exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_login_closes_its_connection() {
    let ends: Script =
        Box::new(|conn: &mut RawConn| Ok(format!("ended, QP error {:?}", conn.wait_ended()?)));
    let mut raw = RawTarget::start_with(RawConn::misanswer_login, vec![(WORD_SIE, ends)]);
    let (url, cfg) = raw_target_session(raw.addr);
    let got = tokio::time::timeout(T + T, transports::connect_session(&url, cfg))
        .await
        .expect("the login ended in time");
    let e = got.err().expect("a login answered for another ITT fails");
    assert!(e.to_string().contains("ITT"), "{e}");
    assert_eq!(
        raw.report().await,
        "ended, QP error Some(\"connection closed by peer\")"
    );
    no_panics();
}
