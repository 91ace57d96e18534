//! The router against stand-in paths that answer INQUIRY, VPD 0x83/0x80, TEST UNIT READY and
//! REPORT TARGET PORT GROUPS with canned bytes, and READ/WRITE with scripted sense or a lost
//! connection.

use super::*;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;

use crate::core::Residual;

const T: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
enum Answer {
    Sense(u8, u8, u8),
    Lost,
}

struct Fake {
    naa: Vec<u8>,
    tpg: u16,
    alua: bool,
    rtpg: Mutex<Vec<u8>>,
    script: Mutex<VecDeque<Answer>>,
    dead: AtomicBool,
    refuse_login: AtomicBool,
    served: AtomicU64,
}

fn fake(naa: u8, tpg: u16, alua: bool) -> Arc<Fake> {
    Arc::new(Fake {
        naa: vec![
            0x60 | (naa & 0x0f),
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            8,
            9,
            10,
            11,
            12,
            13,
            14,
            15,
        ],
        tpg,
        alua,
        rtpg: Mutex::new(Vec::new()),
        script: Mutex::new(VecDeque::new()),
        dead: AtomicBool::new(false),
        refuse_login: AtomicBool::new(false),
        served: AtomicU64::new(0),
    })
}

fn sense(key: u8, asc: u8, ascq: u8) -> Bytes {
    let mut s = vec![0u8; 18];
    s[0] = 0x70;
    s[2] = key;
    s[7] = 10;
    s[12] = asc;
    s[13] = ascq;
    Bytes::from(s)
}

fn good(data: Vec<u8>) -> CommandResult {
    CommandResult {
        status: status::GOOD,
        data: Bytes::from(data),
        sense: Bytes::new(),
        residual: Residual::None,
        bidi_read_residual: None,
    }
}

/// REPORT TARGET PORT GROUPS data: (group, state code) descriptors with one port each.
fn rtpg(groups: &[(u16, u8)]) -> Vec<u8> {
    let mut d = Vec::new();
    for (i, (g, code)) in groups.iter().enumerate() {
        d.extend_from_slice(&[*code, 0x0f]);
        d.extend_from_slice(&g.to_be_bytes());
        d.extend_from_slice(&[0, 0, 0, 1, 0, 0]);
        d.extend_from_slice(&(i as u16 + 1).to_be_bytes());
    }
    let mut out = (d.len() as u32).to_be_bytes().to_vec();
    out.extend(d);
    out
}

impl Fake {
    fn vpd83(&self) -> Vec<u8> {
        let mut d = vec![0x01, 0x03, 0, self.naa.len() as u8];
        d.extend_from_slice(&self.naa);
        d.extend_from_slice(&[0x01, 0x14, 0, 4, 0, 0]);
        d.extend_from_slice(&self.tpg.to_be_bytes());
        d.extend_from_slice(&[0x01, 0x15, 0, 4, 0, 0]);
        d.extend_from_slice(&self.tpg.to_be_bytes());
        let mut p = vec![0, 0x83];
        p.extend_from_slice(&(d.len() as u16).to_be_bytes());
        p.extend(d);
        p
    }

    fn answer(&self, req: &CommandRequest) -> Result<CommandResult, Error> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(Error::Task(TaskError::ConnectionLost("gone".into())));
        }
        let cdb = &req.cdb;
        Ok(match cdb[0] {
            0x12 if cdb[1] & 1 == 1 && cdb[2] == 0x83 => good(self.vpd83()),
            0x12 if cdb[1] & 1 == 1 && cdb[2] == 0x80 => good(b"\x00\x80\x00\x03SN1".to_vec()),
            0x12 => {
                let mut d = vec![0u8; 96];
                d[5] = if self.alua { 0x10 } else { 0 };
                good(d)
            }
            0x00 => good(Vec::new()),
            0xa3 => good(self.rtpg.lock().unwrap().clone()),
            _ => match self.script.lock().unwrap().pop_front() {
                Some(Answer::Sense(k, a, q)) => CommandResult {
                    status: status::CHECK_CONDITION,
                    sense: sense(k, a, q),
                    ..good(Vec::new())
                },
                Some(Answer::Lost) => {
                    return Err(Error::Task(TaskError::ConnectionLost("cut".into())))
                }
                None => {
                    self.served.fetch_add(1, Ordering::SeqCst);
                    good(vec![0u8; req.read_len as usize])
                }
            },
        })
    }
}

impl PathLink for Fake {
    fn submit(&self, req: CommandRequest) -> PendingCommand {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(self.answer(&req));
        PendingCommand::routed(rx)
    }
    fn failure(&self) -> Option<String> {
        self.dead.load(Ordering::SeqCst).then(|| "gone".into())
    }
    fn abort(&self, _itt: u32) -> BoxFut<'_, Result<u8, Error>> {
        Box::pin(async { Ok(0) })
    }
    fn logout(&self) -> BoxFut<'_, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }
    fn close(&self) {}
    fn params(&self) -> Option<SessionParams> {
        None
    }
    fn window(&self) -> Option<u32> {
        None
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn quick() -> MultipathConfig {
    MultipathConfig {
        no_path_retry: Duration::from_millis(300),
        command_timeout: Duration::from_secs(2),
        check_interval: Duration::from_millis(50),
        reconnect_min: Duration::from_millis(20),
        reconnect_max: Duration::from_millis(100),
    }
}

async fn start(fakes: &[Arc<Fake>]) -> Result<Arc<Multipath>, Error> {
    let list = fakes.to_vec();
    let opener: Opener = Arc::new(move |i| {
        let f = list[i].clone();
        Box::pin(async move {
            if f.refuse_login.load(Ordering::SeqCst) {
                return Err(Error::Io("connection refused".into()));
            }
            f.dead.store(false, Ordering::SeqCst);
            Ok(f as Arc<dyn PathLink>)
        })
    });
    let url = IscsiUrl::parse_lun("iscsi://a,b/iqn.2026-11.org.x:t/0").unwrap();
    let portals = ["a:3260".to_string(), "b:3260".to_string()];
    Multipath::start(url, portals[..fakes.len()].to_vec(), quick(), opener).await
}

fn read_req() -> CommandRequest {
    CommandRequest::read(0, scsi::read_write(false, 0, 1, false), 512)
}

/// Waits (bounded) until `f` holds.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 2 s");
}

#[test]
fn designators_and_port_groups_parse() {
    let a = fake(1, 7, true);
    let d = parse_designators(&a.vpd83());
    assert_eq!(d.naa.as_deref(), Some(&a.naa[..]));
    assert_eq!(d.target_port_group, Some(7));
    assert_eq!(d.relative_target_port, Some(7));
    // Cut anywhere: what came before is kept, nothing panics.
    let page = a.vpd83();
    for n in 0..page.len() {
        let _ = parse_designators(&page[..n]);
    }
    let g = parse_rtpg(&rtpg(&[(1, 0x82), (2, 0x0e), (3, 0x0f)]));
    assert_eq!(g.len(), 3);
    assert_eq!(
        (g[0].id, g[0].state, g[0].preferred),
        (1, AluaState::Standby, true)
    );
    assert_eq!((g[1].id, g[1].state), (2, AluaState::Offline));
    assert_eq!((g[2].id, g[2].state), (3, AluaState::Transitioning));
    assert_eq!(g[2].relative_target_ports, vec![3]);
    let full = rtpg(&[(1, 0), (2, 1)]);
    assert_eq!(parse_rtpg(&full[..full.len() - 1]).len(), 1);
    assert!(parse_rtpg(&[0, 0]).is_empty());
    // Extended header (format 1): descriptors from byte 8.
    let mut ext = full.clone();
    ext.splice(4..4, [0x10, 0, 0, 0]);
    let len = (ext.len() - 4) as u32;
    ext[..4].copy_from_slice(&len.to_be_bytes());
    assert_eq!(parse_rtpg(&ext).len(), 2);
    assert_eq!(rtpg_cdb(4096)[..2], [0xa3, 0x0a]);
    // A path's own group: by group designator, else by its relative target port.
    let by = |tpg, rtpi| Designators {
        naa: None,
        target_port_group: tpg,
        relative_target_port: rtpi,
    };
    assert_eq!(own_group(&g, &by(Some(2), Some(1))).map(|x| x.id), Some(2));
    assert_eq!(own_group(&g, &by(None, Some(3))).map(|x| x.id), Some(3));
    assert_eq!(own_group(&g, &by(None, Some(9))), None);
    assert_eq!(own_group(&g, &by(None, None)), None);
}

#[test]
fn sense_verdicts_and_idempotence() {
    let r = |k, a, q| CommandResult {
        status: status::CHECK_CONDITION,
        sense: sense(k, a, q),
        ..good(Vec::new())
    };
    assert_eq!(verdict(&r(2, 4, 0x0a)), Verdict::Transitioning);
    assert_eq!(
        verdict(&r(2, 4, 0x0b)),
        Verdict::Unusable(AluaState::Standby)
    );
    assert_eq!(
        verdict(&r(2, 4, 0x0c)),
        Verdict::Unusable(AluaState::Unavailable)
    );
    assert_eq!(verdict(&r(6, 0x2a, 0x06)), Verdict::StatesChanged);
    assert_eq!(verdict(&r(6, 0x29, 0)), Verdict::Done);
    assert_eq!(verdict(&r(3, 0x11, 0)), Verdict::Done);
    assert_eq!(verdict(&good(Vec::new())), Verdict::Done);
    assert!(is_idempotent(&scsi::read_write(true, 0, 1, false)));
    assert!(!is_idempotent(&[0x89; 16]));
    assert!(!is_idempotent(&[0x5f; 10]));
    assert!(is_idempotent(&[]));
    let ids = |naa: Option<u8>, serial: Option<&str>| LunIdentity {
        naa: naa.map(|n| vec![n]),
        serial: serial.map(str::to_string),
    };
    assert!(ids(Some(1), None)
        .check_same(&ids(Some(1), Some("x")))
        .is_ok());
    assert!(ids(Some(1), None).check_same(&ids(Some(2), None)).is_err());
    assert!(ids(None, Some("a"))
        .check_same(&ids(Some(2), Some("b")))
        .is_err());
    assert!(ids(Some(1), None)
        .check_same(&ids(None, Some("a")))
        .is_err());
}

#[tokio::test]
async fn standby_is_skipped_and_a_state_change_moves_the_traffic() {
    let (a, b) = (fake(1, 1, true), fake(1, 2, true));
    for f in [&a, &b] {
        *f.rtpg.lock().unwrap() = rtpg(&[(1, 0x02), (2, 0x00)]);
    }
    let m = start(&[a.clone(), b.clone()]).await.unwrap();
    let st = m.status();
    assert_eq!(st[0].state, Some(AluaState::Standby));
    assert_eq!(st[1].state, Some(AluaState::ActiveOptimized));
    assert_eq!(st[0].target_port_group, Some(1));
    m.submit(read_req())
        .wait()
        .await
        .unwrap()
        .good("READ")
        .unwrap();
    assert_eq!(
        (
            a.served.load(Ordering::SeqCst),
            b.served.load(Ordering::SeqCst)
        ),
        (0, 1)
    );
    // The gateways swap roles; B reports it with 2A/06, the command is sent again and the
    // states read again: traffic goes to A.
    for f in [&a, &b] {
        *f.rtpg.lock().unwrap() = rtpg(&[(1, 0x00), (2, 0x01)]);
    }
    b.script
        .lock()
        .unwrap()
        .push_back(Answer::Sense(6, 0x2a, 0x06));
    let r = tokio::time::timeout(T, m.submit(read_req()).wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status, status::GOOD);
    until("A optimized, B non-optimized", || {
        let st = m.status();
        st[0].state == Some(AluaState::ActiveOptimized)
            && st[1].state == Some(AluaState::ActiveNonOptimized)
    })
    .await;
    let before = a.served.load(Ordering::SeqCst);
    m.submit(read_req()).wait().await.unwrap();
    assert_eq!(a.served.load(Ordering::SeqCst), before + 1);
    m.close();
}

#[tokio::test]
async fn standby_and_transitioning_answers_move_the_command() {
    let (a, b) = (fake(1, 1, false), fake(1, 2, false));
    let m = start(&[a.clone(), b.clone()]).await.unwrap();
    // No ALUA: both active/optimized, the first preferred.
    m.submit(read_req()).wait().await.unwrap();
    assert_eq!(a.served.load(Ordering::SeqCst), 1);
    a.script
        .lock()
        .unwrap()
        .push_back(Answer::Sense(2, 4, 0x0a));
    let r = m.submit(read_req()).wait().await.unwrap();
    assert_eq!(r.status, status::GOOD);
    assert_eq!(b.served.load(Ordering::SeqCst), 1, "moved to B");
    // A's check (TEST UNIT READY, GOOD) brings it back; then a standby answer moves again.
    until("A back", || {
        m.status()[0].state == Some(AluaState::ActiveOptimized)
    })
    .await;
    a.script
        .lock()
        .unwrap()
        .push_back(Answer::Sense(2, 4, 0x0b));
    m.submit(read_req()).wait().await.unwrap();
    assert_eq!(b.served.load(Ordering::SeqCst), 2);
    m.close();
}

#[tokio::test]
async fn a_lone_path_in_transition_is_retried_with_backoff() {
    let a = fake(1, 1, false);
    let m = start(std::slice::from_ref(&a)).await.unwrap();
    for _ in 0..2 {
        a.script
            .lock()
            .unwrap()
            .push_back(Answer::Sense(2, 4, 0x0a));
    }
    let t0 = Instant::now();
    let r = m.submit(read_req()).wait().await.unwrap();
    assert_eq!(r.status, status::GOOD);
    assert_eq!(a.served.load(Ordering::SeqCst), 1);
    assert!(
        t0.elapsed() >= Duration::from_millis(50),
        "paused before retrying"
    );
    m.close();
}

#[tokio::test]
async fn a_lost_path_moves_reads_but_not_compare_and_write() {
    let (a, b) = (fake(1, 1, false), fake(1, 2, false));
    let m = start(&[a.clone(), b.clone()]).await.unwrap();
    a.script.lock().unwrap().push_back(Answer::Lost);
    let r = m.submit(read_req()).wait().await.unwrap();
    assert_eq!(r.status, status::GOOD);
    assert_eq!(b.served.load(Ordering::SeqCst), 1);
    // A is logged in again in the background and takes the traffic back (failback).
    until("A back", || m.status()[0].up).await;
    m.submit(read_req()).wait().await.unwrap();
    assert_eq!(a.served.load(Ordering::SeqCst), 1);
    a.script.lock().unwrap().push_back(Answer::Lost);
    let caw = CommandRequest::write(
        0,
        vec![0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0],
        Bytes::from(vec![0u8; 1024]),
    );
    let e = m.submit(caw).wait().await.unwrap_err().to_string();
    assert!(
        e.contains("COMPARE AND WRITE") && e.contains("not sent again"),
        "{e}"
    );
    assert_eq!(b.served.load(Ordering::SeqCst), 1, "not retried on B");
    m.close();
}

#[tokio::test]
async fn no_path_waits_its_time_then_fails() {
    let (a, b) = (fake(1, 1, false), fake(1, 2, false));
    let m = start(&[a.clone(), b.clone()]).await.unwrap();
    for f in [&a, &b] {
        f.refuse_login.store(true, Ordering::SeqCst);
        f.dead.store(true, Ordering::SeqCst);
    }
    let t0 = Instant::now();
    let e = m.submit(read_req()).wait().await.unwrap_err();
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < T,
        "{waited:?}"
    );
    let e = e.to_string();
    assert!(
        e.contains("no usable path") && e.contains("a:3260: down"),
        "{e}"
    );
    // A path back within the wait serves the queued command.
    let pending = m.submit(read_req());
    a.refuse_login.store(false, Ordering::SeqCst);
    let r = pending.wait().await.unwrap();
    assert_eq!(r.status, status::GOOD);
    m.close();
}

#[tokio::test]
async fn paths_showing_different_lus_are_refused() {
    let e = start(&[fake(1, 1, false), fake(2, 2, false)])
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("different logical units") && e.contains("NAA"),
        "{e}"
    );
    assert!(!e.contains('\n'));
    // One path down at the start is no reason to fail: it is reconnected later.
    let (a, b) = (fake(1, 1, false), fake(1, 2, false));
    a.refuse_login.store(true, Ordering::SeqCst);
    let m = start(&[a.clone(), b.clone()]).await.unwrap();
    assert!(!m.status()[0].up);
    m.submit(read_req()).wait().await.unwrap();
    assert_eq!(b.served.load(Ordering::SeqCst), 1);
    m.close();
}
