//! The control socket's request decoder (`ironsan target --control`, crate `control`): the
//! line framer, the JSON-RPC request decoder, and the params accessors the server's methods
//! use, `lun.add`'s LUN table included.
//!
//! Input: a first byte choosing how the rest is cut into reads (1 to 256 bytes each), then
//! the bytes a peer sends. The framer's limit is 4 KiB here, so long lines are reached.

use control::codec::{self, decode_request, encode_request, Framer, Id, Response};
use control::Params;

const LIMIT: usize = 4096;

pub fn control_request(data: &[u8]) {
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    // The whole input as one line, as the decoder sees a frame.
    check(stream);
    let chunk = usize::from(cut) + 1;
    let mut framer = Framer::new(LIMIT);
    for piece in stream.chunks(chunk) {
        framer.push(piece);
        loop {
            match framer.next_frame() {
                Ok(Some(line)) => {
                    assert!(line.len() <= LIMIT, "a frame past the limit");
                    assert!(!line.contains(&b'\n'), "a frame holds a newline");
                    check(&line);
                }
                Ok(None) => break,
                // The server answers and closes here.
                Err(_) => return,
            }
        }
        assert!(
            framer.buffered() <= LIMIT + chunk,
            "the framer holds {} bytes",
            framer.buffered()
        );
    }
}

/// Decodes one line; a request is read as the methods read theirs and must survive
/// encoding; an error must carry one of the decoder's codes and encode as a reply.
fn check(line: &[u8]) {
    match decode_request(line) {
        Ok(req) => {
            if let Id::Num(n) = req.id {
                let again = encode_request(
                    n,
                    &req.method,
                    Some(serde_json::Value::Object(req.params.clone())),
                );
                let back = decode_request(&again[..again.len() - 1]).expect("own encoding");
                // Numbers may come back a rounding apart (serde_json's float parsing); the
                // request's shape may not.
                assert_eq!((&back.id, &back.method), (&req.id, &req.method));
                assert!(
                    back.params.keys().eq(req.params.keys()),
                    "params changed in a round trip"
                );
            }
            let mut p = Params::new(req.params);
            let _ = p.opt_str("target");
            let _ = p.opt_u64("lun");
            let _ = p.opt_bool("read_only");
            let _ = p.rest::<scsi::LunConfig>("a LUN table");
            let _ = p.finish();
        }
        Err((id, e)) => {
            assert!(
                [
                    codec::PARSE_ERROR,
                    codec::INVALID_REQUEST,
                    codec::INVALID_PARAMS
                ]
                .contains(&e.code),
                "unexpected code {}",
                e.code
            );
            let reply = Response::err(id, e).encode();
            let back = Response::decode(&reply).expect("own reply decodes");
            assert!(back.outcome.is_err());
        }
    }
}
