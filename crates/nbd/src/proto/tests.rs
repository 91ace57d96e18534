//! The protocol core against hand-built bytes.

use super::*;

fn export() -> Export {
    Export {
        name: "disk".into(),
        description: "a test disk".into(),
        size: 1 << 20,
        read_only: false,
        block_sizes: BlockSizes {
            minimum: 1,
            preferred: 4096,
            maximum: 64 << 10,
        },
    }
}

fn option(code: u32, data: &[u8]) -> Vec<u8> {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&code.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut v = (name.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        v.extend_from_slice(&i.to_be_bytes());
    }
    v
}

/// One option reply taken off the front of `out`: (option, type, payload).
fn take_reply(out: &mut &[u8]) -> (u32, u32, Vec<u8>) {
    assert!(out.len() >= 20, "short option reply: {out:?}");
    assert_eq!(
        u64::from_be_bytes(out[0..8].try_into().unwrap()),
        OPTION_REPLY_MAGIC
    );
    let option = u32::from_be_bytes(out[8..12].try_into().unwrap());
    let kind = u32::from_be_bytes(out[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
    let payload = out[20..20 + len].to_vec();
    *out = &out[20 + len..];
    (option, kind, payload)
}

/// A handshake past the greeting and client flags.
fn started(client_flags: u32) -> Handshake {
    let mut h = Handshake::new(export());
    let greeting = h.take_output();
    assert_eq!(&greeting[0..8], b"NBDMAGIC");
    assert_eq!(&greeting[8..16], b"IHAVEOPT");
    assert_eq!(
        u16::from_be_bytes([greeting[16], greeting[17]]),
        FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
    );
    assert_eq!(greeting.len(), 18);
    assert_eq!(
        h.receive(&client_flags.to_be_bytes()).unwrap(),
        Progress::NeedMore
    );
    assert!(h.take_output().is_empty());
    h
}

#[test]
fn go_with_block_size_enters_transmission() {
    let mut h = started(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let p = h
        .receive(&option(
            opt::GO,
            &go_data("", &[info::BLOCK_SIZE, info::NAME]),
        ))
        .unwrap();
    assert_eq!(p, Progress::Transmission);
    let out = h.take_output();
    let mut o = &out[..];
    let (op, kind, payload) = take_reply(&mut o);
    assert_eq!((op, kind), (opt::GO, rep::INFO));
    assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), info::EXPORT);
    assert_eq!(
        u64::from_be_bytes(payload[2..10].try_into().unwrap()),
        1 << 20
    );
    let flags = u16::from_be_bytes([payload[10], payload[11]]);
    assert_eq!(
        flags,
        tflag::HAS_FLAGS
            | tflag::SEND_FLUSH
            | tflag::SEND_FUA
            | tflag::SEND_TRIM
            | tflag::SEND_WRITE_ZEROES
            | tflag::CAN_MULTI_CONN
    );
    let (_, kind, payload) = take_reply(&mut o);
    assert_eq!(kind, rep::INFO);
    assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), info::NAME);
    assert_eq!(&payload[2..], b"disk");
    let (_, kind, payload) = take_reply(&mut o);
    assert_eq!(kind, rep::INFO);
    assert_eq!(
        payload,
        [
            &[0, 3][..],
            &1u32.to_be_bytes(),
            &4096u32.to_be_bytes(),
            &(64u32 << 10).to_be_bytes()
        ]
        .concat()
    );
    let (_, kind, payload) = take_reply(&mut o);
    assert_eq!((kind, payload.len()), (rep::ACK, 0));
    assert!(o.is_empty());
    let (t, rest) = h.finish();
    assert!(!t.structured());
    assert!(rest.is_empty());
}

#[test]
fn byte_at_a_time_and_structured_replies() {
    let mut h = started(FLAG_C_FIXED_NEWSTYLE);
    let mut bytes = option(opt::STRUCTURED_REPLY, &[]);
    bytes.extend(option(opt::GO, &go_data("disk", &[])));
    let mut last = Progress::NeedMore;
    for b in &bytes {
        assert_eq!(last, Progress::NeedMore);
        last = h.receive(std::slice::from_ref(b)).unwrap();
    }
    assert_eq!(last, Progress::Transmission);
    // A request pipelined right behind GO stays for the transmission phase.
    assert_eq!(h.receive(&[0x25, 0x60]).unwrap(), Progress::Transmission);
    assert!(h.structured());
    let out = h.take_output();
    let mut o = &out[..];
    assert_eq!(take_reply(&mut o).1, rep::ACK);
    let (_, kind, payload) = take_reply(&mut o);
    assert_eq!(kind, rep::INFO);
    let flags = u16::from_be_bytes([payload[10], payload[11]]);
    assert_ne!(
        flags & tflag::SEND_DF,
        0,
        "DF is offered with structured replies"
    );
    let (t, rest) = h.finish();
    assert!(t.structured());
    assert_eq!(&rest[..], &[0x25, 0x60]);
}

#[test]
fn unknown_option_is_unsupported_and_haggling_goes_on() {
    let mut h = started(FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(
        h.receive(&option(0x4242, b"whatever")).unwrap(),
        Progress::NeedMore
    );
    let out = h.take_output();
    let mut o = &out[..];
    let (op, kind, msg) = take_reply(&mut o);
    assert_eq!((op, kind), (0x4242, rep::ERR_UNSUP));
    assert!(String::from_utf8(msg).unwrap().contains("not supported"));
    // TLS is refused by policy, and the client may still go on.
    h.receive(&option(opt::STARTTLS, &[])).unwrap();
    let out = h.take_output();
    assert_eq!(take_reply(&mut &out[..]).1, rep::ERR_POLICY);
    assert_eq!(
        h.receive(&option(opt::GO, &go_data("", &[]))).unwrap(),
        Progress::Transmission
    );
}

#[test]
fn option_errors() {
    let mut h = started(FLAG_C_FIXED_NEWSTYLE);
    // GO naming another export: unknown, haggling continues.
    h.receive(&option(opt::GO, &go_data("other", &[]))).unwrap();
    let out = h.take_output();
    assert_eq!(take_reply(&mut &out[..]).1, rep::ERR_UNKNOWN);
    // INFO whose name length runs past the data, and one with trailing bytes.
    let mut bad = go_data("disk", &[]);
    bad[3] = 200;
    h.receive(&option(opt::INFO, &bad)).unwrap();
    let mut trailing = go_data("disk", &[1]);
    trailing.push(0);
    h.receive(&option(opt::INFO, &trailing)).unwrap();
    h.receive(&option(opt::INFO, &[0, 0])).unwrap();
    let out = h.take_output();
    let mut o = &out[..];
    for _ in 0..3 {
        let (op, kind, msg) = take_reply(&mut o);
        assert_eq!((op, kind), (opt::INFO, rep::ERR_INVALID));
        assert!(!msg.is_empty(), "errors carry a message");
    }
    // Options that take no data.
    h.receive(&option(opt::LIST, b"x")).unwrap();
    h.receive(&option(opt::STRUCTURED_REPLY, b"x")).unwrap();
    let out = h.take_output();
    let mut o = &out[..];
    assert_eq!(take_reply(&mut o).1, rep::ERR_INVALID);
    assert_eq!(take_reply(&mut o).1, rep::ERR_INVALID);
    assert!(!h.structured());
    // INFO does not end haggling.
    assert_eq!(
        h.receive(&option(opt::INFO, &go_data("disk", &[])))
            .unwrap(),
        Progress::NeedMore
    );
}

#[test]
fn list_then_abort() {
    let mut h = started(FLAG_C_FIXED_NEWSTYLE);
    h.receive(&option(opt::LIST, &[])).unwrap();
    let out = h.take_output();
    let mut o = &out[..];
    let (_, kind, payload) = take_reply(&mut o);
    assert_eq!(kind, rep::SERVER);
    assert_eq!(u32::from_be_bytes(payload[0..4].try_into().unwrap()), 4);
    assert_eq!(&payload[4..8], b"disk");
    assert_eq!(&payload[8..], b"a test disk");
    assert_eq!(take_reply(&mut o).1, rep::ACK);
    assert_eq!(
        h.receive(&option(opt::ABORT, &[])).unwrap(),
        Progress::Abort
    );
    let out = h.take_output();
    assert_eq!(take_reply(&mut &out[..]), (opt::ABORT, rep::ACK, vec![]));
}

#[test]
fn export_name_with_and_without_zeroes() {
    for (flags, len) in [(FLAG_C_FIXED_NEWSTYLE, 10 + 124), (FLAG_C_NO_ZEROES, 10)] {
        let mut h = started(flags);
        let p = h.receive(&option(opt::EXPORT_NAME, b"disk")).unwrap();
        assert_eq!(p, Progress::Transmission);
        let out = h.take_output();
        assert_eq!(out.len(), len);
        assert_eq!(u64::from_be_bytes(out[0..8].try_into().unwrap()), 1 << 20);
        assert!(out[10..].iter().all(|&b| b == 0));
    }
    let mut h = started(0);
    assert_eq!(
        h.receive(&option(opt::EXPORT_NAME, b"nope")),
        Err(ProtoError::UnknownExport("nope".into()))
    );
}

#[test]
fn handshake_violations_end_the_connection() {
    let mut h = Handshake::new(export());
    assert_eq!(
        h.receive(&4u32.to_be_bytes()),
        Err(ProtoError::ClientFlags(4))
    );
    let mut h = started(FLAG_C_FIXED_NEWSTYLE);
    let mut bad = option(opt::GO, &[]);
    bad[0] = b'X';
    assert!(matches!(h.receive(&bad), Err(ProtoError::OptionMagic(_))));
    let mut h = started(FLAG_C_FIXED_NEWSTYLE);
    let mut huge = IHAVEOPT.to_be_bytes().to_vec();
    huge.extend_from_slice(&opt::GO.to_be_bytes());
    huge.extend_from_slice(&(1u32 << 30).to_be_bytes());
    assert_eq!(
        h.receive(&huge),
        Err(ProtoError::OptionTooLong {
            option: opt::GO,
            len: 1 << 30
        })
    );
    let mut h = started(FLAG_C_FIXED_NEWSTYLE);
    let many: Vec<u8> = (0..=MAX_OPTIONS).flat_map(|_| option(0x77, &[])).collect();
    assert_eq!(h.receive(&many), Err(ProtoError::TooManyOptions));
}

fn request(flags: u16, kind: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut v = REQUEST_MAGIC.to_be_bytes().to_vec();
    v.extend_from_slice(&flags.to_be_bytes());
    v.extend_from_slice(&kind.to_be_bytes());
    v.extend_from_slice(&handle.to_be_bytes());
    v.extend_from_slice(&offset.to_be_bytes());
    v.extend_from_slice(&len.to_be_bytes());
    v
}

fn parse_one(t: &Transmission, bytes: &[u8]) -> Request {
    let mut b = BytesMut::from(bytes);
    let r = t.parse(&mut b).unwrap().expect("a complete request");
    assert!(b.is_empty());
    r
}

#[test]
fn requests_parse() {
    let t = Transmission::new(export(), false);
    let r = parse_one(&t, &request(0, cmd::READ, 7, 1000, 3000));
    assert_eq!(r.handle, 7);
    assert!(r.is_read());
    assert_eq!(
        r.command,
        Ok(Command::Read {
            offset: 1000,
            length: 3000
        })
    );
    // A write arriving in pieces: nothing until the payload is complete.
    let mut w = request(cflag::FUA, cmd::WRITE, 8, 4096, 5);
    w.extend_from_slice(b"hello");
    w.extend(request(0, cmd::FLUSH, 9, 0, 0));
    let mut b = BytesMut::new();
    b.extend_from_slice(&w[..30]);
    assert_eq!(t.missing(&b), 3);
    assert_eq!(t.parse(&mut b).unwrap(), None);
    b.extend_from_slice(&w[30..]);
    let r = t.parse(&mut b).unwrap().unwrap();
    assert_eq!(
        r.command,
        Ok(Command::Write {
            offset: 4096,
            data: Bytes::from_static(b"hello"),
            fua: true
        })
    );
    assert_eq!(
        t.parse(&mut b).unwrap().unwrap().command,
        Ok(Command::Flush)
    );
    assert_eq!(t.parse(&mut b).unwrap(), None);
    let r = parse_one(&t, &request(cflag::NO_HOLE, cmd::WRITE_ZEROES, 1, 0, 4096));
    assert_eq!(
        r.command,
        Ok(Command::WriteZeroes {
            offset: 0,
            length: 4096,
            fua: false,
            no_hole: true
        })
    );
    let r = parse_one(&t, &request(0, cmd::TRIM, 1, 512, 512));
    assert_eq!(
        r.command,
        Ok(Command::Trim {
            offset: 512,
            length: 512,
            fua: false
        })
    );
    assert_eq!(
        parse_one(&t, &request(0, cmd::DISC, 1, 0, 0)).command,
        Ok(Command::Disconnect)
    );
}

fn refused(t: &Transmission, bytes: &[u8]) -> u32 {
    match parse_one(t, bytes).command {
        Err(r) => r.errno,
        Ok(c) => panic!("accepted {c:?}"),
    }
}

#[test]
fn out_of_range_and_invalid_requests_are_refused() {
    let t = Transmission::new(export(), false);
    let size = 1u64 << 20;
    // The last byte is fine, one past it is not.
    assert!(parse_one(&t, &request(0, cmd::READ, 1, size - 1, 1))
        .command
        .is_ok());
    assert_eq!(
        refused(&t, &request(0, cmd::READ, 1, size, 1)),
        errno::EINVAL
    );
    assert_eq!(
        refused(&t, &request(0, cmd::READ, 1, u64::MAX, 2)),
        errno::EINVAL
    );
    let mut w = request(0, cmd::WRITE, 1, size - 2, 4);
    w.extend_from_slice(&[1, 2, 3, 4]);
    assert_eq!(refused(&t, &w), errno::ENOSPC);
    assert_eq!(
        refused(&t, &request(0, cmd::WRITE_ZEROES, 1, size, 1)),
        errno::ENOSPC
    );
    assert_eq!(
        refused(&t, &request(0, cmd::TRIM, 1, size, 1)),
        errno::EINVAL
    );
    // Larger than the advertised maximum.
    assert_eq!(
        refused(&t, &request(0, cmd::READ, 1, 0, 128 << 10)),
        errno::EINVAL
    );
    // Flags not valid for the request; DF only with structured replies.
    assert_eq!(
        refused(&t, &request(cflag::NO_HOLE, cmd::WRITE, 1, 0, 0)),
        errno::EINVAL
    );
    assert_eq!(
        refused(&t, &request(cflag::DF, cmd::READ, 1, 0, 1)),
        errno::EINVAL
    );
    assert_eq!(
        refused(&t, &request(0x100, cmd::READ, 1, 0, 1)),
        errno::EINVAL
    );
    let ts = Transmission::new(export(), true);
    assert!(parse_one(&ts, &request(cflag::DF, cmd::READ, 1, 0, 1))
        .command
        .is_ok());
    // FLUSH with an offset, an unknown type (BLOCK_STATUS was not negotiated).
    assert_eq!(
        refused(&t, &request(0, cmd::FLUSH, 1, 4096, 0)),
        errno::EINVAL
    );
    assert_eq!(refused(&t, &request(0, 7, 1, 0, 4096)), errno::EINVAL);
    assert_eq!(refused(&t, &request(0, 99, 1, 0, 0)), errno::EINVAL);
    // A read-only export refuses writes.
    let ro = Transmission::new(
        Export {
            read_only: true,
            ..export()
        },
        false,
    );
    assert_eq!(refused(&ro, &request(0, cmd::TRIM, 1, 0, 1)), errno::EPERM);
    assert_eq!(
        refused(&ro, &request(cflag::FUA, cmd::FLUSH, 1, 0, 0)),
        errno::EINVAL
    );
}

#[test]
fn framing_errors() {
    let t = Transmission::new(export(), false);
    let mut bad = request(0, cmd::READ, 1, 0, 1);
    bad[0] = 0;
    assert!(matches!(
        t.parse(&mut BytesMut::from(&bad[..])),
        Err(ProtoError::RequestMagic(_))
    ));
}

#[test]
fn refused_writes_are_skipped_not_buffered() {
    let t = Transmission::new(export(), false);
    let size = export().size;
    // Beyond the advertised maximum (64 KiB here): EINVAL as soon as the header is in,
    // nothing to reserve, the whole gigabyte left for the caller to skip.
    let mut b = BytesMut::from(&request(0, cmd::WRITE, 1, 0, 1 << 30)[..]);
    assert_eq!(t.missing(&b), 0);
    let r = t.parse(&mut b).unwrap().expect("answered at the header");
    assert_eq!(r.command.unwrap_err().errno, errno::EINVAL);
    assert_eq!((r.handle, r.discard), (1, 1 << 30));
    assert!(b.is_empty());
    // Past the end, with part of the payload and nothing else in: ENOSPC, the part
    // that is in is dropped, the rest is to be skipped.
    let mut w = request(0, cmd::WRITE, 2, size - 10, 4096);
    w.extend_from_slice(&[0xaa; 1000]);
    let mut b = BytesMut::from(&w[..]);
    assert_eq!(t.missing(&b), 0);
    let r = t.parse(&mut b).unwrap().unwrap();
    assert_eq!(r.command.unwrap_err().errno, errno::ENOSPC);
    assert_eq!(r.discard, 4096 - 1000);
    assert!(b.is_empty());
    // The whole payload in, then the next request: the payload goes, the next stays.
    let mut w = request(0, cmd::WRITE, 3, size, 8);
    w.extend_from_slice(&[0xbb; 8]);
    w.extend(request(0, cmd::FLUSH, 4, 0, 0));
    let mut b = BytesMut::from(&w[..]);
    let r = t.parse(&mut b).unwrap().unwrap();
    assert_eq!(
        (r.command.unwrap_err().errno, r.discard),
        (errno::ENOSPC, 0)
    );
    let r = t.parse(&mut b).unwrap().unwrap();
    assert_eq!((r.handle, r.command), (4, Ok(Command::Flush)));
    // A write that is carried out is buffered whole: missing() reserves it.
    let b = BytesMut::from(&request(0, cmd::WRITE, 5, 0, 4096)[..]);
    assert_eq!(t.missing(&b), 4096);
}

#[test]
fn simple_replies() {
    let (h, d) = encode_reply(
        false,
        &Reply::Done {
            handle: 5,
            read: false,
        },
    );
    assert_eq!(
        h,
        [
            &SIMPLE_REPLY_MAGIC.to_be_bytes()[..],
            &[0; 4],
            &5u64.to_be_bytes()
        ]
        .concat()
    );
    assert!(d.is_empty());
    let data = Bytes::from_static(b"abc");
    let (h, d) = encode_reply(
        false,
        &Reply::Data {
            handle: 6,
            offset: 100,
            data: data.clone(),
        },
    );
    assert_eq!(h.len(), SIMPLE_REPLY_LEN);
    assert_eq!(d, data);
    let (h, d) = encode_reply(
        false,
        &Reply::Error {
            handle: 6,
            read: true,
            errno: errno::EINVAL,
            message: "no".into(),
        },
    );
    assert_eq!(
        u32::from_be_bytes(h[4..8].try_into().unwrap()),
        errno::EINVAL
    );
    assert!(d.is_empty(), "no payload after an error");
}

fn chunk(h: &[u8]) -> (u16, u16, u64, u32) {
    assert_eq!(
        u32::from_be_bytes(h[0..4].try_into().unwrap()),
        STRUCTURED_REPLY_MAGIC
    );
    (
        u16::from_be_bytes([h[4], h[5]]),
        u16::from_be_bytes([h[6], h[7]]),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
        u32::from_be_bytes(h[16..20].try_into().unwrap()),
    )
}

#[test]
fn structured_replies() {
    let data = Bytes::from_static(b"abcd");
    let (h, d) = encode_reply(
        true,
        &Reply::Data {
            handle: 9,
            offset: 4096,
            data: data.clone(),
        },
    );
    assert_eq!(chunk(&h), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 9, 12));
    assert_eq!(u64::from_be_bytes(h[20..28].try_into().unwrap()), 4096);
    assert_eq!(h.len(), 28);
    assert_eq!(d, data);
    let (h, _) = encode_reply(
        true,
        &Reply::Error {
            handle: 10,
            read: true,
            errno: errno::EINVAL,
            message: "past the end".into(),
        },
    );
    assert_eq!(chunk(&h), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 10, 6 + 12));
    assert_eq!(
        u32::from_be_bytes(h[20..24].try_into().unwrap()),
        errno::EINVAL
    );
    assert_eq!(u16::from_be_bytes([h[24], h[25]]), 12);
    assert_eq!(&h[26..], b"past the end");
    // A read of nothing: a NONE chunk; other successes: a simple reply.
    let (h, _) = encode_reply(
        true,
        &Reply::Done {
            handle: 11,
            read: true,
        },
    );
    assert_eq!(chunk(&h), (REPLY_FLAG_DONE, REPLY_TYPE_NONE, 11, 0));
    let (h, _) = encode_reply(
        true,
        &Reply::Done {
            handle: 12,
            read: false,
        },
    );
    assert_eq!(h.len(), SIMPLE_REPLY_LEN);
    // Messages are cut at a character boundary.
    let long = "é".repeat(1000);
    let (h, _) = encode_reply(
        true,
        &Reply::Error {
            handle: 1,
            read: false,
            errno: errno::EIO,
            message: long,
        },
    );
    let n = u16::from_be_bytes([h[24], h[25]]) as usize;
    assert!(n <= 1024 && std::str::from_utf8(&h[26..26 + n]).is_ok());
}

#[test]
fn a_refusing_handshake_errors_every_option_but_abort() {
    let mut h = Handshake::new(export()).refusing("too many clients".into());
    let _greeting = h.take_output();
    let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    input.extend(option(opt::STRUCTURED_REPLY, &[]));
    input.extend(option(opt::LIST, &[]));
    input.extend(option(opt::GO, &go_data("disk", &[])));
    assert_eq!(h.receive(&input), Ok(Progress::NeedMore));
    let out = h.take_output();
    let mut rest = &out[..];
    for code in [opt::STRUCTURED_REPLY, opt::LIST, opt::GO] {
        assert_eq!(
            take_reply(&mut rest),
            (code, rep::ERR_POLICY, b"too many clients".to_vec())
        );
    }
    assert!(rest.is_empty(), "nothing but the refusals: {rest:?}");
    assert!(!h.structured());
    assert_eq!(h.receive(&option(opt::ABORT, &[])), Ok(Progress::Abort));
    let out = h.take_output();
    assert_eq!(take_reply(&mut &out[..]), (opt::ABORT, rep::ACK, vec![]));

    let mut h = Handshake::new(export()).refusing("too many clients".into());
    let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    input.extend(option(opt::EXPORT_NAME, b"disk"));
    assert_eq!(h.receive(&input), Ok(Progress::Refused));
    let greeting_only = h.take_output();
    assert_eq!(
        greeting_only.len(),
        18,
        "no export details for a refused client"
    );
}
