//! `[[subsystem]]` in the target's TOML: read, written back, and refused when a namespace
//! names no block LUN of a configured target.

use iscsi_target::Config;

const BASE: &str = r#"
[[target]]
name = "iqn.2026-11.org.example:both"

[target.lun.0]
size = "64MiB"
backend = "memory"
"#;

fn with_subsystem(ns: &str) -> String {
    format!(
        "{BASE}\n[[subsystem]]\nnqn = \"nqn.2026-11.org.example:both\"\nallow_any_host = true\n\
         listen = [\"127.0.0.1:4420\"]\n\n[[subsystem.namespace]]\n{ns}\n"
    )
}

#[test]
fn subsystems_are_read_and_written_back() {
    let c = Config::parse(
        &with_subsystem("nsid = 1\ntarget = \"IQN.2026-11.org.example:both\"\nlun = 0"),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.subsystems.len(), 1);
    assert_eq!(c.subsystems[0].namespaces[0].nsid, 1);
    let again = Config::parse(&c.to_toml(), "again.toml").unwrap();
    assert_eq!(again, c);
    // None: the key is left out of what is written.
    let plain = Config::parse(BASE, "plain.toml").unwrap();
    assert!(plain.subsystems.is_empty());
    assert!(!plain.to_toml().contains("subsystem"));
}

#[test]
fn namespaces_must_name_a_block_lun() {
    for (ns, why) in [
        (
            "nsid = 1\ntarget = \"iqn.2026-11.org.example:other\"\nlun = 0",
            "has no LUN 0",
        ),
        (
            "nsid = 1\ntarget = \"iqn.2026-11.org.example:both\"\nlun = 3",
            "has no LUN 3",
        ),
        (
            "nsid = 0\ntarget = \"iqn.2026-11.org.example:both\"\nlun = 0",
            "nsid 0",
        ),
    ] {
        let e = Config::parse(&with_subsystem(ns), "t.toml").unwrap_err().0;
        assert!(e.contains(why), "{e}");
        assert!(e.starts_with("t.toml:"), "{e}");
    }
    let e = Config::parse(&format!("{BASE}\n[[subsystem]]\nnqn = \"x\"\n"), "t.toml")
        .unwrap_err()
        .0;
    assert!(e.contains("not an NQN"), "{e}");
}
