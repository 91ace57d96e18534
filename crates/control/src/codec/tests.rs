use super::*;
use proptest::prelude::*;

fn decode(text: &str) -> Result<Request, (Id, RpcError)> {
    decode_request(text.as_bytes())
}

fn code_of(text: &str) -> i64 {
    decode(text).expect_err("refused").1.code
}

#[test]
fn a_request_decodes_with_its_id_method_and_params() {
    let r =
        decode(r#"{"jsonrpc":"2.0","id":7,"method":"lun.add","params":{"target":"t","lun":1}}"#)
            .expect("valid");
    assert_eq!(r.id, Id::Num(7));
    assert_eq!(r.method, "lun.add");
    assert_eq!(r.params["lun"], 1);
    let r = decode(r#"{"jsonrpc":"2.0","id":"a","method":"targets.list"}"#).expect("valid");
    assert_eq!(r.id, Id::Str("a".into()));
    assert!(r.params.is_empty());
}

#[test]
fn malformed_requests_get_the_standard_codes() {
    assert_eq!(code_of("{not json"), PARSE_ERROR);
    assert_eq!(code_of("\u{0}"), PARSE_ERROR);
    assert_eq!(code_of("42"), INVALID_REQUEST);
    assert_eq!(
        code_of(r#"[{"jsonrpc":"2.0","id":1,"method":"x"}]"#),
        INVALID_REQUEST
    );
    assert_eq!(
        code_of(r#"{"jsonrpc":"2.0","method":"x"}"#),
        INVALID_REQUEST
    );
    assert_eq!(
        code_of(r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#),
        INVALID_REQUEST
    );
    assert_eq!(
        code_of(r#"{"jsonrpc":"2.0","id":1,"method":3}"#),
        INVALID_REQUEST
    );
    assert_eq!(
        code_of(r#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#),
        INVALID_REQUEST
    );
    assert_eq!(
        code_of(r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#),
        INVALID_REQUEST
    );
    assert_eq!(
        code_of(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":3}"#),
        INVALID_REQUEST
    );
    assert_eq!(
        code_of(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#),
        INVALID_PARAMS
    );
    assert_eq!(
        code_of(r#"{"jsonrpc":"2.0","id":1,"method":"x","extra":1}"#),
        INVALID_REQUEST
    );
}

#[test]
fn an_error_answers_under_the_request_id_once_it_is_known() {
    let (id, e) = decode(r#"{"jsonrpc":"1.0","id":9,"method":"x"}"#).unwrap_err();
    assert_eq!(id, Id::Num(9));
    assert!(e.message.contains("2.0"), "{e}");
    let (id, e) = decode(r#"[1]"#).unwrap_err();
    assert_eq!(id, Id::Null);
    assert!(e.message.contains("batch"), "{e}");
}

#[test]
fn responses_round_trip() {
    for r in [
        Response::ok(Id::Num(3), serde_json::json!({"luns": [0, 1]})),
        Response::ok(Id::Str("x".into()), Value::Null),
        Response::err(
            Id::Null,
            RpcError::refused("LUN 1 is in use: pick another number"),
        ),
    ] {
        let line = r.encode();
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(Response::decode(&line).expect("decodes"), r);
    }
}

#[test]
fn framer_splits_lines_and_skips_blank_ones() {
    let mut f = Framer::new(100);
    f.push(b"{\"a\":1}\r\n\n  \n{\"b\"");
    assert_eq!(f.next_frame(), Ok(Some(b"{\"a\":1}".to_vec())));
    assert_eq!(f.next_frame(), Ok(None));
    f.push(b":2}\n");
    assert_eq!(f.next_frame(), Ok(Some(b"{\"b\":2}".to_vec())));
    assert_eq!(f.next_frame(), Ok(None));
    assert_eq!(f.buffered(), 0);
}

#[test]
fn framer_refuses_a_long_line_without_holding_it_whole() {
    let mut f = Framer::new(10);
    f.push(b"0123456789");
    assert_eq!(f.next_frame(), Ok(None));
    f.push(b"a");
    assert_eq!(f.next_frame(), Err(Oversize));
    let mut f = Framer::new(10);
    f.push(b"0123456789abc\n");
    assert_eq!(f.next_frame(), Err(Oversize));
    let mut f = Framer::new(10);
    f.push(b"0123456789\r\n");
    assert_eq!(f.next_frame(), Ok(Some(b"0123456789".to_vec())));
}

proptest! {
    #[test]
    fn any_bytes_decode_or_refuse_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        match decode_request(&bytes) {
            Ok(r) => prop_assert!(!matches!(r.id, Id::Null)),
            Err((_, e)) => prop_assert!([PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS].contains(&e.code)),
        }
    }

    #[test]
    fn encoded_requests_decode_to_what_was_sent(id in any::<i64>(), method in "[a-z.]{1,20}", n in any::<u64>(), s in ".{0,40}") {
        let line = encode_request(id, &method, Some(serde_json::json!({"n": n, "s": s})));
        let r = decode_request(&line[..line.len() - 1]).expect("decodes");
        prop_assert_eq!(r.id, Id::Num(id));
        prop_assert_eq!(r.method, method);
        prop_assert_eq!(&r.params["n"], &Value::from(n));
        prop_assert_eq!(&r.params["s"], &Value::from(s));
    }

    #[test]
    fn framing_does_not_depend_on_how_reads_split(lines in proptest::collection::vec("[ -~]{0,30}", 0..8), cut in 1usize..17) {
        let stream: Vec<u8> = lines.iter().flat_map(|l| format!("{l}\n").into_bytes()).collect();
        let mut f = Framer::new(64);
        let mut got = Vec::new();
        for chunk in stream.chunks(cut) {
            f.push(chunk);
            while let Some(frame) = f.next_frame().expect("under the limit") {
                got.push(String::from_utf8(frame).unwrap());
            }
            prop_assert!(f.buffered() <= 64 + cut);
        }
        let want: Vec<String> = lines.into_iter().filter(|l| !l.trim().is_empty()).collect();
        prop_assert_eq!(got, want);
    }
}
