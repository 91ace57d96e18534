//! OSD-2 command semantics over an `OsdUnit` in a temporary directory.

use osd::attr::{number, page, AttrId, Attribute};
use osd::cdb::{Cdb, ServiceAction};
use osd::client::{self, Request};
use osd::{OsdUnit, Reply, CHECK_CONDITION, GOOD};
use proptest::prelude::*;

const P: u64 = 0x10000;

fn unit() -> (tempfile::TempDir, OsdUnit) {
    let dir = tempfile::tempdir().unwrap();
    let u = OsdUnit::open(dir.path(), 1 << 30).unwrap();
    (dir, u)
}

fn run(u: &OsdUnit, r: &Request) -> Reply {
    u.execute(&r.cdb.encode(), &r.data_out, r.data_in_len)
}

fn ok(u: &OsdUnit, r: &Request) -> Reply {
    let reply = run(u, r);
    assert_eq!(
        reply.status, GOOD,
        "{:?} failed: {:?}",
        r.cdb.action, reply.sense
    );
    reply
}

fn current(r: &Request, reply: &Reply) -> client::CurrentCommand {
    let attrs = client::parse_retrieved(&reply.data_in, r.retrieved_at().unwrap()).unwrap();
    client::current_command(&attrs).expect("current command page")
}

fn with_partition() -> (tempfile::TempDir, OsdUnit) {
    let (d, u) = unit();
    ok(&u, &client::create_partition(P));
    (d, u)
}

fn logical_length(u: &OsdUnit, oid: u64) -> u64 {
    let ids = [AttrId {
        page: page::USER_INFO,
        number: number::LOGICAL_LENGTH,
    }];
    let r = client::get_attributes(P, oid, &ids, 64);
    let attrs = client::parse_retrieved(&ok(u, &r).data_in, 0).unwrap();
    u64::from_be_bytes(attrs[0].value.clone().unwrap().try_into().unwrap())
}

#[test]
fn objects_with_given_and_device_chosen_ids() {
    let (_d, u) = with_partition();
    let r = client::create(P, 0x10042, 1);
    let cc = current(&r, &ok(&u, &r));
    assert_eq!(
        (cc.object_type, cc.partition, cc.object),
        (0x80, P, 0x10042)
    );
    let r = client::create(P, 0, 1);
    assert_eq!(current(&r, &ok(&u, &r)).object, 0x10043);
    let r = client::create(P, 0, 3);
    assert_eq!(current(&r, &ok(&u, &r)).object, 0x10046);
    // The same id twice is refused, pointing at the object id.
    let again = run(&u, &client::create(P, 0x10042, 1));
    assert_eq!(again.status, CHECK_CONDITION);
    assert_eq!(again.sense.unwrap().field, Some((true, 24)));
    // A device-chosen partition id.
    let r = client::create_partition(0);
    let cc = current(&r, &ok(&u, &r));
    assert_eq!((cc.object_type, cc.partition), (0x02, P + 1));
}

#[test]
fn write_read_back_and_append() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    ok(&u, &client::write(P, 0x10000, 0, b"hello, "));
    let r = client::append(P, 0x10000, b"objects");
    assert_eq!(current(&r, &ok(&u, &r)).append_address, Some(7));
    let back = ok(&u, &client::read(P, 0x10000, 0, 14));
    assert_eq!(back.data_in, b"hello, objects");
    let mid = ok(&u, &client::read(P, 0x10000, 7, 3));
    assert_eq!(mid.data_in, b"obj");
    assert_eq!(logical_length(&u, 0x10000), 14);
}

#[test]
fn clear_and_punch_zero_ranges() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    ok(&u, &client::write(P, 0x10000, 0, &[0xAA; 32]));
    ok(&u, &client::clear(P, 0x10000, 4, 4));
    ok(&u, &client::punch(P, 0x10000, 28, 100));
    let d = ok(&u, &client::read(P, 0x10000, 0, 32)).data_in;
    assert_eq!(&d[..4], &[0xAA; 4]);
    assert_eq!(&d[4..8], &[0; 4]);
    assert_eq!(&d[8..28], &[0xAA; 20]);
    assert_eq!(&d[28..], &[0; 4]);
    assert_eq!(
        logical_length(&u, 0x10000),
        32,
        "clear/punch keep the length"
    );
}

#[test]
fn read_past_the_logical_length() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    ok(&u, &client::write(P, 0x10000, 0, b"0123456789"));
    let reply = run(&u, &client::read(P, 0x10000, 4, 100));
    assert_eq!(reply.status, CHECK_CONDITION);
    assert_eq!(reply.data_in, b"456789");
    let s = reply.sense.unwrap();
    assert_eq!((s.key, s.asc, s.ascq), (0x1, 0x3B, 0x17));
    assert_eq!(s.information, Some(6));
    assert_eq!(s.object, Some((P, 0x10000)));
}

#[test]
fn list_pages_with_continuation() {
    let (_d, u) = with_partition();
    for i in 0..10 {
        ok(&u, &client::create(P, 0x10000 + i, 1));
    }
    ok(&u, &client::create_collection(P, 0x20000));
    let mut seen = Vec::new();
    let mut next = 0;
    let mut calls = 0;
    loop {
        // Room for 4 ids per answer.
        let page = client::parse_list(&ok(&u, &client::list(P, next, 24 + 32)).data_in).unwrap();
        assert_eq!(page.format, 0x21);
        assert!(page.ids.len() <= 4);
        seen.extend(page.ids);
        calls += 1;
        if page.continuation == 0 {
            break;
        }
        next = page.continuation;
    }
    assert_eq!(calls, 3);
    assert_eq!(seen, (0x10000..0x1000A).collect::<Vec<_>>());
    // Partitions of the root.
    ok(&u, &client::create_partition(P + 5));
    let roots = client::parse_list(&ok(&u, &client::list(0, 0, 1024)).data_in).unwrap();
    assert_eq!((roots.format, roots.ids), (0x01, vec![P, P + 5]));
}

#[test]
fn list_collection_members() {
    let (_d, u) = with_partition();
    ok(&u, &client::create_collection(P, 0x20000));
    for oid in [0x10001, 0x10002, 0x10003] {
        ok(&u, &client::create(P, oid, 1));
    }
    let join = |oid| {
        let member = Attribute::new(page::USER_COLLECTIONS, 1, 0x20000u64.to_be_bytes());
        ok(&u, &client::set_attributes(P, oid, &[member]));
    };
    join(0x10001);
    join(0x10003);
    let r = client::list_collection(P, 0x20000, 0, 1024);
    let l = client::parse_list(&ok(&u, &r).data_in).unwrap();
    assert_eq!((l.format, l.ids), (0x21, vec![0x10001, 0x10003]));
    let cols =
        client::parse_list(&ok(&u, &client::list_collection(P, 0, 0, 1024)).data_in).unwrap();
    assert_eq!((cols.format, cols.ids), (0x11, vec![0x20000]));
    // A collection with members is kept unless forced.
    let kept = run(&u, &client::remove_collection(P, 0x20000, false));
    assert_eq!(kept.sense.unwrap().asc, 0x2C);
    ok(&u, &client::remove_collection(P, 0x20000, true));
}

#[test]
fn attribute_lists_round_trip() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    let set = [
        Attribute::new(0x10000, 1, b"first".to_vec()),
        Attribute::new(0x10000, 2, vec![9u8; 40]),
        Attribute::new(page::USER_INFO, number::USERNAME, b"alice".to_vec()),
    ];
    ok(&u, &client::set_attributes(P, 0x10000, &set));
    let mut ids: Vec<AttrId> = set
        .iter()
        .map(|a| AttrId {
            page: a.page,
            number: a.number,
        })
        .collect();
    ids.push(AttrId {
        page: 0x10000,
        number: 3,
    });
    let got = client::parse_retrieved(
        &ok(&u, &client::get_attributes(P, 0x10000, &ids, 512)).data_in,
        0,
    )
    .unwrap();
    assert_eq!(&got[..3], &set);
    assert_eq!(got[3].value, None, "never set: undefined");
    // Read-only attributes cannot be set.
    let used = Attribute::new(page::USER_INFO, number::USED_CAPACITY, [0u8; 8]);
    let refused = run(&u, &client::set_attributes(P, 0x10000, &[used]));
    assert_eq!(refused.sense.unwrap().asc, 0x26);
}

#[test]
fn attributes_ride_on_write_and_read() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    let ids = [AttrId {
        page: page::USER_INFO,
        number: number::LOGICAL_LENGTH,
    }];
    let w = client::write(P, 0x10000, 0, &[1; 1000]).get_list(&ids, 64);
    let attrs = client::parse_retrieved(&ok(&u, &w).data_in, 0).unwrap();
    assert_eq!(attrs[0].value.as_deref(), Some(&1000u64.to_be_bytes()[..]));
    let r = client::read(P, 0x10000, 0, 1000).get_list(&ids, 64);
    let reply = ok(&u, &r);
    assert_eq!(&reply.data_in[..1000], &[1; 1000][..]);
    let attrs = client::parse_retrieved(&reply.data_in, r.retrieved_at().unwrap()).unwrap();
    assert_eq!(attrs[0].number, number::LOGICAL_LENGTH);
}

#[test]
fn page_mode_get_of_user_object_information() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    ok(&u, &client::write(P, 0x10000, 0, &[5; 123]));
    let r = client::get_page(P, 0x10000, page::USER_INFO, 1024);
    let attrs = client::parse_retrieved(&ok(&u, &r).data_in, 0).unwrap();
    let get = |num| {
        attrs
            .iter()
            .find(|a| a.number == num)
            .and_then(|a| a.value.clone())
    };
    assert_eq!(
        get(number::LOGICAL_LENGTH),
        Some(123u64.to_be_bytes().to_vec())
    );
    assert_eq!(get(number::PARTITION_ID), Some(P.to_be_bytes().to_vec()));
    assert_eq!(
        get(number::OBJECT_ID),
        Some(0x10000u64.to_be_bytes().to_vec())
    );
    assert_eq!(get(number::PAGE_IDENTIFICATION).map(|v| v.len()), Some(40));
}

#[test]
fn logical_length_attribute_truncates_and_extends() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    ok(&u, &client::write(P, 0x10000, 0, b"abcdef"));
    let len = |n: u64| Attribute::new(page::USER_INFO, number::LOGICAL_LENGTH, n.to_be_bytes());
    ok(&u, &client::set_attributes(P, 0x10000, &[len(3)]));
    ok(&u, &client::set_attributes(P, 0x10000, &[len(5)]));
    assert_eq!(ok(&u, &client::read(P, 0x10000, 0, 5)).data_in, b"abc\0\0");
}

#[test]
fn missing_partition_and_object() {
    let (_d, u) = with_partition();
    let s = run(&u, &client::read(P + 9, 0x10000, 0, 8)).sense.unwrap();
    assert_eq!((s.key, s.asc, s.field), (5, 0x24, Some((true, 16))));
    assert_eq!(s.object, Some((P + 9, 0x10000)));
    let s = run(&u, &client::read(P, 0x10077, 0, 8)).sense.unwrap();
    assert_eq!((s.key, s.asc, s.field), (5, 0x24, Some((true, 24))));
    assert_eq!(s.object, Some((P, 0x10077)));
    let d = s.to_descriptor();
    assert_eq!(d[0], 0x72);
}

#[test]
fn bad_cdbs_are_refused() {
    let (_d, u) = with_partition();
    let good = client::read(P, 0x10000, 0, 8).cdb.encode();
    let field = |cdb: &[u8]| run_raw(&u, cdb).sense.unwrap().field;
    let mut wrong_len = good;
    wrong_len[7] = 192;
    assert_eq!(field(&wrong_len), Some((true, 7)));
    let mut unknown = good;
    unknown[8..10].copy_from_slice(&0x88FFu16.to_be_bytes());
    assert_eq!(field(&unknown), Some((true, 8)));
    assert_eq!(field(&good[..100]), Some((true, 7)));
    let mut capkey = good;
    capkey[82] = 1;
    assert_eq!(field(&capkey), Some((true, 82)));
    let s = run_raw(&u, &[0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        .sense
        .unwrap();
    assert_eq!((s.asc, s.ascq), (0x20, 0x00));
}

fn run_raw(u: &OsdUnit, cdb: &[u8]) -> Reply {
    let reply = u.execute(cdb, &[], 64);
    assert_eq!(reply.status, CHECK_CONDITION);
    reply
}

#[test]
fn short_data_out_is_a_parameter_list_length_error() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    let mut w = client::write(P, 0x10000, 0, &[0; 64]);
    w.data_out.truncate(10);
    let s = run(&u, &w).sense.unwrap();
    assert_eq!((s.key, s.asc, s.ascq), (5, 0x1A, 0));
    let mut bad_list =
        client::set_attributes(P, 0x10000, &[Attribute::new(0x10000, 1, b"x".to_vec())]);
    bad_list.data_out[0] = 0x3;
    assert_eq!(run(&u, &bad_list).sense.unwrap().asc, 0x26);
}

#[test]
fn remove_partition_holding_objects_is_refused() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    let s = run(&u, &client::remove_partition(P)).sense.unwrap();
    assert_eq!((s.key, s.asc, s.ascq), (5, 0x2C, 0x0A));
    ok(&u, &client::remove(P, 0x10000));
    ok(&u, &client::remove_partition(P));
    let l = client::parse_list(&ok(&u, &client::list(0, 0, 1024)).data_in).unwrap();
    assert!(l.ids.is_empty());
}

#[test]
fn quotas_and_capacity_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let u = OsdUnit::open(dir.path(), 1000).unwrap();
    ok(&u, &client::create_partition(P));
    ok(&u, &client::create(P, 0x10000, 1));
    let over = run(&u, &client::write(P, 0x10000, 0, &[0; 1001]))
        .sense
        .unwrap();
    assert_eq!((over.key, over.asc, over.ascq), (0x7, 0x55, 0x07));
    ok(&u, &client::write(P, 0x10000, 0, &[0; 1000]));
    // A partition quota below the capacity.
    ok(&u, &client::format(1 << 20));
    ok(&u, &client::create_partition(P));
    ok(&u, &client::create(P, 0x10000, 1));
    let quota = Attribute::new(
        page::PARTITION_QUOTAS,
        number::CAPACITY_QUOTA,
        100u64.to_be_bytes(),
    );
    ok(&u, &client::set_attributes(P, 0, &[quota]));
    ok(&u, &client::write(P, 0x10000, 0, &[0; 100]));
    let s = run(&u, &client::append(P, 0x10000, b"x")).sense.unwrap();
    assert_eq!((s.asc, s.ascq, s.object), (0x55, 0x07, Some((P, 0x10000))));
}

#[test]
fn reopening_keeps_objects_and_attributes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let u = OsdUnit::open(dir.path(), 1 << 20).unwrap();
        ok(&u, &client::create_partition(P));
        ok(&u, &client::create(P, 0x10000, 1));
        ok(&u, &client::write(P, 0x10000, 0, b"persistent"));
        let a = Attribute::new(0x10000, 7, b"kept".to_vec());
        ok(&u, &client::set_attributes(P, 0x10000, &[a]));
    }
    let u = OsdUnit::open(dir.path(), 5).unwrap();
    assert_eq!(
        ok(&u, &client::read(P, 0x10000, 0, 10)).data_in,
        b"persistent"
    );
    let ids = [AttrId {
        page: 0x10000,
        number: 7,
    }];
    let got = client::parse_retrieved(
        &ok(&u, &client::get_attributes(P, 0x10000, &ids, 64)).data_in,
        0,
    )
    .unwrap();
    assert_eq!(got[0].value.as_deref(), Some(&b"kept"[..]));
    // The capacity given at first open is kept (total capacity, root information).
    let root = client::get_page(0, 0, page::ROOT_INFO, 1024);
    let attrs = client::parse_retrieved(&ok(&u, &root).data_in, 0).unwrap();
    let total = attrs.iter().find(|a| a.number == 0x80).unwrap();
    assert_eq!(
        total.value.as_deref(),
        Some(&(1u64 << 20).to_be_bytes()[..])
    );
}

#[test]
fn format_wipes_everything() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    ok(&u, &client::format(0));
    assert_eq!(
        run(&u, &client::read(P, 0x10000, 0, 1))
            .sense
            .unwrap()
            .field,
        Some((true, 16))
    );
}

#[test]
fn data_in_is_cut_to_the_expected_length() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    ok(&u, &client::write(P, 0x10000, 0, &[3; 50]));
    let mut r = client::read(P, 0x10000, 0, 50);
    r.data_in_len = 20;
    assert_eq!(ok(&u, &r).data_in.len(), 20);
}

#[test]
fn set_one_attribute_in_the_cdb() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    let mut cdb = Cdb::new(ServiceAction::SetAttributes, P, 0x10000);
    cdb.attrs = osd::cdb::AttrParams::SetOne {
        page: 0x10001,
        number: 1,
        value: b"tiny".to_vec(),
    };
    assert_eq!(u.execute(&cdb.encode(), &[], 0).status, GOOD);
    let ids = [AttrId {
        page: 0x10001,
        number: 1,
    }];
    let got = client::parse_retrieved(
        &ok(&u, &client::get_attributes(P, 0x10000, &ids, 64)).data_in,
        0,
    )
    .unwrap();
    assert_eq!(got[0].value.as_deref(), Some(&b"tiny"[..]));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_input_never_panics(
        cdb in proptest::collection::vec(any::<u8>(), 0..300),
        data_out in proptest::collection::vec(any::<u8>(), 0..600),
        data_in_len in 0u32..4096,
    ) {
        let (_d, u) = with_partition();
        let reply = u.execute(&cdb, &data_out, data_in_len);
        prop_assert!(reply.data_in.len() <= data_in_len as usize);
    }

    #[test]
    fn mutated_valid_cdbs_never_panic(
        action in 0usize..20,
        patches in proptest::collection::vec((8usize..236, any::<u8>()), 0..12),
        data_out in proptest::collection::vec(any::<u8>(), 0..600),
        data_in_len in 0u32..4096,
    ) {
        let (_d, u) = with_partition();
        ok(&u, &client::create(P, 0x10000, 1));
        let codes = [0x8881u16, 0x8882, 0x8883, 0x8884, 0x8885, 0x8886, 0x8887, 0x8888, 0x8889,
            0x888A, 0x888B, 0x888C, 0x888E, 0x888F, 0x8895, 0x8896, 0x8897, 0x889A, 0x889B, 0x889C];
        let mut cdb = client::read(P, 0x10000, 0, 16).cdb.encode();
        cdb[8..10].copy_from_slice(&codes[action].to_be_bytes());
        for (at, v) in patches {
            // Keep the service action most of the time so commands run deep.
            if at > 9 { cdb[at] = v; }
        }
        let reply = u.execute(&cdb, &data_out, data_in_len);
        prop_assert!(reply.data_in.len() <= data_in_len as usize);
        prop_assert!(reply.status == GOOD || reply.sense.is_some());
    }
}

#[test]
fn retrieved_list_is_cut_at_the_allocation_length() {
    let (_d, u) = with_partition();
    ok(&u, &client::create(P, 0x10000, 1));
    let ids = [
        AttrId {
            page: page::USER_INFO,
            number: number::PARTITION_ID,
        },
        AttrId {
            page: page::USER_INFO,
            number: number::OBJECT_ID,
        },
    ];
    let reply = ok(&u, &client::get_attributes(P, 0x10000, &ids, 40));
    assert_eq!(reply.data_in.len(), 40);
    // The header still counts both entries; only the complete one is parsed.
    assert_eq!(&reply.data_in[4..8], &48u32.to_be_bytes());
    let got = client::parse_retrieved(&reply.data_in, 0).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].number, number::PARTITION_ID);
}
