//! How an iSER logout ends its connection. The peer here is an iSER target written on plain
//! TCP with the iwarp crate's codecs (MPA, DDP, RDMAP) and the iser crate's, so it can do
//! what no RNIC lets a peer do: hold its end of the close back. `Session::logout` must
//! return only once the close has run its course on the wire (our FIN, then the peer's), so
//! that a CLI command exiting right after it does not cut the close short (a socket closed
//! under a close still running made Linux siw report a fatal QP error at LIO), and must still
//! return, bounded, when the peer never closes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iscsi_initiator::{IscsiUrl, Session, SessionConfig};
use iscsi_wire::{Bhs, LogoutResponse, Pdu};
use iwarp::ddp::{DdpHeader, Opcode, UntaggedHeader, QN_SEND};
use iwarp::{fpdu, mpa};

/// The bound on any single wait.
const T: Duration = Duration::from_secs(10);
const TARGET_NAME: &str = "iqn.2026-11.org.ironsan:mpa-peer";
/// The iSER CM word of a target that will use Send with Invalidate.
const WORD_SIE: [u8; 4] = [0x80, 0, 0, 0];

/// One iSER connection on TCP, spoken by hand.
struct MpaPeer {
    sock: TcpStream,
    crc: bool,
    /// The next Send's message sequence number (RFC 5041: the first is 1).
    msn: u32,
    /// Received bytes not yet decoded.
    buf: Vec<u8>,
    stat_sn: u32,
    exp_cmd_sn: u32,
}

impl MpaPeer {
    /// Accepts a connection and answers its MPA Request with our iSER CM word.
    fn accept(listener: &TcpListener) -> Result<MpaPeer, String> {
        let (sock, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        sock.set_read_timeout(Some(T)).map_err(|e| e.to_string())?;
        let mut peer = MpaPeer {
            sock,
            crc: false,
            msn: 1,
            buf: Vec::new(),
            stat_sn: 0,
            exp_cmd_sn: 0,
        };
        let mut header = [0u8; mpa::HEADER_LEN];
        peer.sock
            .read_exact(&mut header)
            .map_err(|e| e.to_string())?;
        let len = mpa::MpaFrame::frame_len(&header).map_err(|e| format!("{e:?}"))?;
        let mut frame = header.to_vec();
        frame.resize(len, 0);
        peer.sock
            .read_exact(&mut frame[mpa::HEADER_LEN..])
            .map_err(|e| e.to_string())?;
        let (frame, _) = mpa::MpaFrame::decode(&frame, mpa::MpaKind::Request, 512)
            .map_err(|e| format!("MPA Request: {e:?}"))?;
        let req = mpa::parse_request(frame).map_err(|e| format!("MPA Request: {e:?}"))?;
        let local = mpa::LocalParams {
            private_data: WORD_SIE.to_vec(),
            ..mpa::LocalParams::default()
        };
        let (reply, negotiated) =
            mpa::build_reply(&req, &local).map_err(|e| format!("MPA Reply: {e:?}"))?;
        peer.crc = negotiated.crc;
        peer.sock
            .write_all(&reply.encode())
            .map_err(|e| e.to_string())?;
        Ok(peer)
    }

    /// The next PDU the initiator sent (each in one untagged Send), or None at its FIN.
    fn recv_pdu(&mut self) -> Result<Option<Pdu>, String> {
        loop {
            let decoded = fpdu::decode(&self.buf, self.crc).map_err(|e| format!("{e:?}"))?;
            if let Some((ulpdu, used)) = decoded {
                let ulpdu = &self.buf[ulpdu];
                let header = DdpHeader::decode(ulpdu).map_err(|e| format!("{e:?}"))?;
                if header.opcode() != Opcode::Send || !header.last() {
                    return Err(format!("expected a whole Send, got {header:?}"));
                }
                let send = Bytes::copy_from_slice(&ulpdu[header.len()..]);
                self.buf.drain(..used);
                let pdu = iser::parse_send(&send, 65536)
                    .map_err(|e| format!("{e:?}"))?
                    .pdu;
                if let Bhs::LogoutRequest(r) = &pdu.bhs {
                    self.exp_cmd_sn = r.cmd_sn.wrapping_add(1);
                }
                return Ok(Some(pdu));
            }
            let mut chunk = [0u8; 4096];
            match self.sock.read(&mut chunk) {
                Ok(0) => return Ok(None),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("reading: {e}")),
            }
        }
    }

    /// Sends `pdu` in one Send, stamped with our numbers.
    fn send_pdu(&mut self, pdu: Pdu) -> Result<(), String> {
        let send = test_support::iser_raw::raw_target_send(pdu, &mut self.stat_sn, self.exp_cmd_sn);
        let header = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: Opcode::Send,
            inv_stag: 0,
            qn: QN_SEND,
            msn: self.msn,
            mo: 0,
        });
        self.msn += 1;
        self.sock
            .write_all(&fpdu::encode(&header.to_bytes(), &send, self.crc))
            .map_err(|e| format!("sending: {e}"))
    }

    /// Answers the Login Request straight into full feature phase, in iSER mode.
    fn login(&mut self) -> Result<(), String> {
        let pdu = self.recv_pdu()?.ok_or("closed before the login")?;
        let Bhs::LoginRequest(r) = pdu.bhs else {
            return Err(format!("expected a Login Request, got {:?}", pdu.bhs));
        };
        self.exp_cmd_sn = r.cmd_sn;
        self.send_pdu(test_support::iser_raw::iser_login_response(&r))
    }

    /// The initiator's FIN, with no PDU before it.
    fn expect_fin(&mut self) -> Result<(), String> {
        match self.recv_pdu()? {
            None => Ok(()),
            Some(pdu) => Err(format!("a PDU after the logout: {:?}", pdu.bhs)),
        }
    }

    /// Answers the Logout Request (other PDUs are skipped).
    fn answer_logout(&mut self) -> Result<(), String> {
        loop {
            let pdu = self.recv_pdu()?.ok_or("closed before the logout")?;
            if let Bhs::LogoutRequest(r) = pdu.bhs {
                let rsp = Bhs::LogoutResponse(LogoutResponse {
                    itt: r.itt,
                    ..Default::default()
                });
                return self.send_pdu(Pdu::new(rsp, Bytes::new()));
            }
        }
    }
}

/// The report of a peer thread: what its script returned, or why it failed.
type Served<R> = mpsc::Receiver<Result<R, String>>;

/// Serves one connection on a thread of its own: login, the logout answered, then `after`
/// (given when the Logout Response went out); reports what `after` returned.
fn serve_logout<R: Send + 'static>(
    after: impl FnOnce(&mut MpaPeer, Instant) -> Result<R, String> + Send + 'static,
) -> (SocketAddr, Served<R>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let outcome = MpaPeer::accept(&listener).and_then(|mut peer| {
            peer.login()?;
            let answered = Instant::now();
            peer.answer_logout()?;
            after(&mut peer, answered)
        });
        let _ = tx.send(outcome);
    });
    (addr, rx)
}

async fn connect(addr: SocketAddr) -> Session {
    let url = IscsiUrl::parse_lun(&format!("iser://{addr}/{TARGET_NAME}/0")).expect("url");
    let cfg = SessionConfig {
        nop_interval: None,
        connect_timeout: T,
        login_timeout: T,
        ..SessionConfig::from_url(&url)
    };
    tokio::time::timeout(T, transports::connect_session(&url, cfg))
        .await
        .expect("login in time")
        .expect("iSER login to the MPA peer")
}

/// Logs in to the peer at `addr` and out again: how long the logout took, and what the peer
/// reported.
async fn logout_from<R>(addr: SocketAddr, served: Served<R>) -> (Duration, R) {
    let s = connect(addr).await;
    let start = Instant::now();
    tokio::time::timeout(T, s.logout())
        .await
        .expect("logout in time")
        .expect("logout answered");
    let took = start.elapsed();
    let report = served
        .recv_timeout(T + T)
        .expect("the peer ended")
        .expect("the peer saw login, logout, then our FIN");
    (took, report)
}

/// How long a logout took, the peer closing its end `hold` after our FIN, and how long after
/// the peer's Logout Response our FIN came.
async fn logout_against(hold: Duration) -> (Duration, Duration) {
    let (addr, served) = serve_logout(move |peer, answered| {
        peer.expect_fin()?;
        let fin_after = answered.elapsed();
        std::thread::sleep(hold);
        // Dropping the socket closes our end.
        Ok(fin_after)
    });
    logout_from(addr, served).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_waits_for_the_peer_to_close_its_end() {
    let hold = Duration::from_millis(600);
    let (took, _) = logout_against(hold).await;
    assert!(
        took >= hold,
        "logout returned after {took:?}, before the peer closed its end ({hold:?} after our FIN)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_returns_in_bounded_time_when_the_peer_never_closes() {
    let (took, _) = logout_against(Duration::from_secs(3)).await;
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(5),
        "logout took {took:?}: it waits about 2 s for a peer that does not close, then returns"
    );
}

/// A target that closes its end once its Logout Response is sent (Linux LIO) gets a moment to
/// do so before our FIN: LIO's siw fails a Send still finishing when the peer's FIN arrives.
/// (Measured at the peer from before it sent the response, so a slow peer thread only makes
/// the interval longer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_logout_the_target_is_given_a_moment_to_close_first() {
    let (_, fin_after) = logout_against(Duration::ZERO).await;
    assert!(
        fin_after >= Duration::from_millis(90),
        "our FIN came {fin_after:?} after the Logout Response: the target had no time to close first"
    );
}

/// A target that does close first (right after its Logout Response) is met cleanly: the
/// logout succeeds, and our end closes after its own with nothing sent in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_closing_first_after_the_logout_ends_the_connection() {
    let (addr, served) = serve_logout(|peer, _| {
        peer.sock
            .shutdown(std::net::Shutdown::Write)
            .map_err(|e| e.to_string())?;
        peer.expect_fin()
    });
    logout_from(addr, served).await;
}
