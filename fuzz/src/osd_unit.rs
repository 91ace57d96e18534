//! The OSD logical unit (`osd::OsdUnit`) fed OSD-2 CDBs with data-out, as an initiator
//! sends them in one SCSI Command (its Extended CDB AHS) and its data-out.
//!
//! Checked after every command:
//! - it answers GOOD or CHECK CONDITION, and CHECK CONDITION always with sense (a key and
//!   descriptor sense that starts 0x72) — never HARDWARE ERROR, which would mean the store
//!   itself failed on what the fuzzer sent;
//! - data-in never exceeds the expected length;
//! - every file the store keeps stays inside its directory.
//!
//! Input: commands, each a flag byte choosing one of the client's well-formed CDBs as a
//! template (low 5 bits) and whether the CDB is sent whole or cut (bit 7), a record of
//! bytes XORed over the template from a position (the first byte; so the fuzzer mutates a
//! valid CDB instead of finding opcode 0x7F and length 228 on its own), a data-out record,
//! and the expected data-in length (16 bits). Every input starts on a freshly formatted
//! store, so inputs do not depend on each other.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use osd::client::{self, Request};
use osd::OsdUnit;

use crate::Input;

/// Most commands one input runs.
const MAX_COMMANDS: usize = 16;

const P: u64 = 0x10000;
const O: u64 = 0x10000;

/// The well-formed CDBs mutations start from.
fn templates() -> Vec<Request> {
    let ids = [osd::attr::AttrId {
        page: osd::attr::page::USER_INFO,
        number: osd::attr::number::LOGICAL_LENGTH,
    }];
    let label = osd::attr::Attribute::new(0x10000, 1, b"fuzz".to_vec());
    vec![
        client::create_partition(P),
        client::create(P, O, 1),
        client::create(P, 0, 3),
        client::write(P, O, 0, &[7; 64]),
        client::append(P, O, &[8; 16]),
        client::read(P, O, 0, 128),
        client::clear(P, O, 8, 8),
        client::punch(P, O, 0, 16),
        client::list(P, 0, 256),
        client::list(0, 0, 256),
        client::get_attributes(P, O, &ids, 64),
        client::get_page(P, O, osd::attr::page::USER_INFO, 256),
        client::set_attributes(P, O, &[label]),
        client::create_collection(P, 0x20000),
        client::list_collection(P, 0x20000, 0, 256),
        client::remove_collection(P, 0x20000, true),
        client::remove(P, O),
        client::remove_partition(P),
        client::flush(P, O),
        client::flush_osd(),
        client::write(P, O, 0, &[1; 64]).get_list(&ids, 64),
        client::format(1 << 20),
    ]
}

struct Store {
    dir: PathBuf,
    unit: OsdUnit,
    templates: Vec<Request>,
}

/// One store per process, formatted again for every input.
fn store() -> &'static Mutex<Store> {
    static STORE: OnceLock<Mutex<Store>> = OnceLock::new();
    STORE.get_or_init(|| {
        // In memory where the machine has it: the store's files and database are rewritten by
        // every input.
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        remove_stale_stores(&base);
        let dir = base.join(format!("{STORE_PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let unit = OsdUnit::open(&dir, 1 << 20).expect("a store in the temporary directory");
        // Canonical once, so each check compares paths without resolving the root again.
        let dir = dir.canonicalize().expect("the store's directory");
        Mutex::new(Store {
            dir,
            unit,
            templates: templates(),
        })
    })
}

const STORE_PREFIX: &str = "ironsan-fuzz-osd-";

/// Stores left by fuzzing processes that have ended (a static is never dropped).
fn remove_stale_stores(base: &Path) {
    for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(STORE_PREFIX) else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

pub fn osd(data: &[u8]) {
    let store = store().lock().unwrap_or_else(|p| p.into_inner());
    let format = client::format(1 << 20);
    let r = store
        .unit
        .execute(&format.cdb.encode(), &format.data_out, format.data_in_len);
    assert_eq!(r.status, osd::GOOD, "FORMAT OSD failed: {:?}", r.sense);
    let mut input = Input::new(data);
    for _ in 0..MAX_COMMANDS {
        if input.is_empty() {
            break;
        }
        let flags = input.u8();
        let template = &store.templates[usize::from(flags & 0x1f) % store.templates.len()];
        let mut cdb = template.cdb.encode().to_vec();
        let at = usize::from(input.u8()) % cdb.len();
        for (c, x) in cdb[at..].iter_mut().zip(input.record()) {
            *c ^= x;
        }
        if flags & 0x80 != 0 {
            cdb.truncate(usize::from(input.u8()));
        }
        let data_out = match input.record() {
            [] => template.data_out.as_slice(),
            d => d,
        };
        let data_in_len = u32::from(input.u16());
        let reply = store.unit.execute(&cdb, data_out, data_in_len);
        check(&reply, data_in_len);
    }
    check_files_inside(&store.dir, &store.dir);
}

fn check(reply: &osd::Reply, data_in_len: u32) {
    assert!(
        reply.data_in.len() <= data_in_len as usize,
        "{} bytes of data-in where {data_in_len} were expected",
        reply.data_in.len()
    );
    match reply.status {
        osd::GOOD => {}
        osd::CHECK_CONDITION => {
            let sense = reply.sense.as_ref().expect("CHECK CONDITION without sense");
            assert_ne!(
                sense.key,
                osd::sense::key::HARDWARE_ERROR,
                "the store failed: {sense:?}"
            );
            assert_eq!(sense.to_descriptor().first(), Some(&0x72));
        }
        s => panic!("status 0x{s:02x}"),
    }
}

/// No file or directory of the store lies outside its directory (ids become file names).
fn check_files_inside(root: &Path, dir: &Path) {
    for e in std::fs::read_dir(dir).expect("store directory").flatten() {
        let p = e.path();
        let canonical = p.canonicalize().unwrap_or_else(|_| p.clone());
        assert!(
            canonical.starts_with(root),
            "{} is outside the store",
            p.display()
        );
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            check_files_inside(root, &p);
        }
    }
}
