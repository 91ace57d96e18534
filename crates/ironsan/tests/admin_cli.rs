//! `ironsan admin` against a running `ironsan target --control`: a RAM LUN added through the
//! control socket is served (REPORT LUNS through `ironsan ls` lists it, with its size), a
//! removed one is not; a bad request is refused with one line and exit status 1 and changes
//! nothing; the socket is owner-only and gone after the target stops.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{Proc, LIMIT};

const T: &str = "iqn.2026-11.org.ironsan:default";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ironsan-admin-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs ironsan to completion (bounded by `timeout`, the coreutils command): status, stdout,
/// stderr.
fn run(args: &[&str]) -> (bool, String, String) {
    let o = Command::new("timeout")
        .arg(LIMIT.as_secs().to_string())
        .arg(env!("CARGO_BIN_EXE_ironsan"))
        .args(args)
        .env_remove("IRONSAN_LOG")
        .output()
        .expect("run ironsan");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn admin(socket: &Path, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["admin", "--socket", socket.to_str().unwrap()];
    all.extend_from_slice(args);
    run(&all)
}

/// The LUN lines `ironsan ls` (REPORT LUNS, READ CAPACITY) prints for the portal.
fn served_luns(portal: &str) -> Vec<String> {
    let (ok, out, err) = run(&["ls", portal]);
    assert!(ok, "ironsan ls: {out}{err}");
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Lun: "))
        .map(String::from)
        .collect()
}

#[test]
fn luns_added_and_removed_through_the_control_socket_are_served_and_gone() {
    let dir = scratch("luns");
    let socket = dir.join("control.sock");
    let mut target = Proc::spawn(&[
        "target",
        "--portal",
        "127.0.0.1:0",
        "--control",
        socket.to_str().unwrap(),
    ]);
    let portal = target.wait_line("ironsan: serving iSCSI on ", ' ');
    let said = target.wait_line("ironsan: control socket ", ' ');
    assert_eq!(said, socket.to_str().unwrap());
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    assert_eq!(served_luns(&portal).len(), 1);

    let (ok, out, err) = admin(&socket, &["lun", "add", T, "7", "--ram", "16MiB"]);
    assert!(ok, "lun add: {out}{err}");
    assert!(
        out.contains("added LUN 7") && out.contains("16 MiB"),
        "{out}"
    );
    let luns = served_luns(&portal);
    assert_eq!(luns.len(), 2, "{luns:?}");
    assert!(luns[1].starts_with("7  Size: 16 MiB"), "{luns:?}");

    let (ok, out, _) = admin(&socket, &["--json", "target", "show", T]);
    assert!(ok);
    let doc: serde_json::Value = serde_json::from_str(&out).expect("--json is JSON");
    let numbers: Vec<u64> = doc["luns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lun"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, vec![0, 7]);
    assert_eq!(doc["luns"][1]["size"], 16 << 20);

    // Refused, one line each, exit status 1, nothing changed.
    for (args, want) in [
        (
            vec!["lun", "add", T, "7", "--ram", "1MiB"],
            "already in use",
        ),
        (
            vec!["lun", "add", "iqn.nope", "8", "--ram", "1MiB"],
            "no target is named iqn.nope",
        ),
        (vec!["lun", "add", T, "8", "--ram", "lots"], "params"),
        (
            vec![
                "call",
                "lun.add",
                r#"{"target": "iqn.2026-11.org.ironsan:default", "lun": "8"}"#,
            ],
            "params.lun: expected an unsigned integer, got a string",
        ),
        (vec!["call", "lun.ad", "{}"], "no method \"lun.ad\""),
        (vec!["call", "lun.add", "{not json"], "not JSON"),
        (vec!["lun", "rm", T, "3"], "there is no LUN 3"),
    ] {
        let (ok, out, err) = admin(&socket, &args);
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    let mut raw = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    std::io::Write::write_all(&mut raw, b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"lun.remove\",\"params\":{\"target\":\"iqn.2026-11.org.ironsan:default\",\"lun\":7}}]\n").unwrap();
    let mut reply = String::new();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(raw), &mut reply).unwrap();
    assert!(
        reply.contains("-32600") && reply.contains("batch"),
        "{reply}"
    );
    assert_eq!(
        served_luns(&portal).len(),
        2,
        "bad requests changed the LUNs"
    );

    let (ok, out, err) = admin(&socket, &["lun", "rm", T, "7"]);
    assert!(ok, "lun rm: {out}{err}");
    assert_eq!(served_luns(&portal).len(), 1);
    let (ok, out, _) = admin(&socket, &["luns", T]);
    assert!(
        ok && out.contains("1 GiB") && !out.contains("16 MiB"),
        "{out}"
    );

    target.signal("-INT");
    assert!(target.wait_exit(LIMIT).success());
    assert!(!socket.exists(), "the socket outlived the target");
    let (ok, _, err) = admin(&socket, &["targets"]);
    assert!(!ok && err.contains("cannot connect"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn portals_are_added_and_removed_through_the_control_socket() {
    let dir = scratch("portals");
    let socket = dir.join("control.sock");
    let config = dir.join("target.toml");
    std::fs::write(
        &config,
        format!(
            "portals = [\"127.0.0.1:0\"]\ncontrol_socket = \"{}\"\n\n[[target]]\nname = \"{T}\"\n\n[target.lun.0]\nsize = \"1MiB\"\nbackend = \"memory\"\n",
            socket.display()
        ),
    )
    .unwrap();
    let mut target = Proc::spawn(&["target", "--config", config.to_str().unwrap()]);
    target.wait_line("ironsan: serving iSCSI on ", ' ');
    target.wait_line("ironsan: control socket ", ' ');
    let (ok, out, err) = admin(&socket, &["--json", "portal", "add", "tcp://127.0.0.1:0"]);
    assert!(ok, "{out}{err}");
    let added: serde_json::Value = serde_json::from_str(&out).unwrap();
    let address = added["address"].as_str().unwrap().to_string();
    assert_eq!(served_luns(&address).len(), 1, "the added portal serves");
    let (ok, out, _) = admin(&socket, &["portals"]);
    assert!(ok && out.contains(&address), "{out}");
    let (ok, out, _) = admin(&socket, &["config"]);
    assert!(
        ok && out.contains(&format!("tcp://{address}")),
        "saved with the rest: {out}"
    );
    let (ok, _, err) = admin(&socket, &["portal", "add", "iser://127.0.0.1:0"]);
    assert!(!ok && err.contains("only tcp://"), "{err}");
    let (ok, out, err) = admin(&socket, &["portal", "rm", &address]);
    assert!(ok, "{out}{err}");
    let (ok, _, err) = admin(&socket, &["portal", "rm", &address]);
    assert!(!ok && err.contains("no portal is bound"), "{err}");
    let (ok, out, _) = admin(&socket, &["config"]);
    assert!(
        ok && !out.contains(&address),
        "removed from the config: {out}"
    );
    let (ok, out, _) = admin(&socket, &["sessions"]);
    assert!(ok && out.starts_with("TSIH"), "{out}");
    target.signal("-INT");
    assert!(target.wait_exit(LIMIT).success());
    assert!(!socket.exists(), "the socket outlived the target");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The state `admin --json` lists: every target as `target show` gives it.
fn listed_state(socket: &Path) -> Vec<serde_json::Value> {
    let (ok, out, err) = admin(socket, &["--json", "targets"]);
    assert!(ok, "{out}{err}");
    let targets: serde_json::Value = serde_json::from_str(&out).unwrap();
    targets
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let name = t["name"].as_str().unwrap();
            let (ok, out, err) = admin(socket, &["--json", "target", "show", name]);
            assert!(ok, "{out}{err}");
            serde_json::from_str(&out).unwrap()
        })
        .collect()
}

#[test]
fn live_changes_are_saved_and_the_next_start_lists_the_same_state() {
    let dir = scratch("save");
    let socket = dir.join("control.sock");
    let config = dir.join("target.toml");
    let first = format!(
        "portals = [\"127.0.0.1:0\"]\ncontrol_socket = \"{}\"\n\n[[target]]\nname = \"{T}\"\n\n[target.lun.0]\nsize = \"1MiB\"\nbackend = \"memory\"\n",
        socket.display()
    );
    std::fs::write(&config, &first).unwrap();
    let mut target = Proc::spawn(&["target", "--config", config.to_str().unwrap()]);
    target.wait_line("ironsan: serving iSCSI on ", ' ');
    target.wait_line("ironsan: control socket ", ' ');
    let second = "iqn.2026-11.org.ironsan:second";
    for args in [
        vec![
            "target",
            "add",
            second,
            "--initiator",
            "iqn.2026-11.org.example:a",
        ],
        vec!["lun", "add", second, "0", "--ram", "8MiB"],
        vec!["acl", "add", second, "iqn.2026-11.org.example:b"],
        vec!["lun", "read-only", T, "0", "on"],
        vec!["lun", "resize", T, "0", "2MiB"],
        vec![
            "chap",
            "--target",
            second,
            "--user",
            "u",
            "--secret",
            "s3cret-s3cret-1",
        ],
    ] {
        let (ok, out, err) = admin(&socket, &args);
        assert!(ok, "{args:?}: {out}{err}");
    }
    // Refused changes leave the state as it was.
    let before = listed_state(&socket);
    for (args, want) in [
        (vec!["target", "add", second], "defined twice"),
        (vec!["acl", "rm", "iqn.nope", "iqn.x"], "no target"),
        (vec!["lun", "resize", T, "9", "2MiB"], "no LUN 9"),
        (vec!["session", "drop", "77"], "no session"),
    ] {
        let (ok, _, err) = admin(&socket, &args);
        assert!(!ok && err.contains(want), "{args:?}: {err}");
    }
    assert_eq!(listed_state(&socket), before);
    let lun0 = &before[0]["luns"][0];
    assert_eq!(
        (lun0["size"].as_u64(), lun0["read_only"].as_bool()),
        (Some(2 << 20), Some(true))
    );
    assert_eq!(before[1]["chap"], true);
    assert_eq!(before[1]["initiators"].as_array().unwrap().len(), 2);

    let (ok, out, err) = admin(&socket, &["save"]);
    assert!(ok && out.contains("saved"), "{out}{err}");
    let backup = std::fs::read_to_string(dir.join("target.toml.bak")).unwrap();
    assert_eq!(backup, first, "the previous file is kept as .bak");
    target.signal("-INT");
    assert!(target.wait_exit(LIMIT).success());

    let mut target = Proc::spawn(&["target", "--config", config.to_str().unwrap()]);
    target.wait_line("ironsan: serving iSCSI on ", ' ');
    target.wait_line("ironsan: control socket ", ' ');
    assert_eq!(listed_state(&socket), before, "the restart lists what ran");
    target.signal("-INT");
    assert!(target.wait_exit(LIMIT).success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_save_on_change_every_change_is_in_the_file_at_once() {
    let dir = scratch("autosave");
    let socket = dir.join("control.sock");
    let config = dir.join("target.toml");
    std::fs::write(
        &config,
        format!(
            "portals = [\"127.0.0.1:0\"]\ncontrol_socket = \"{}\"\nsave_on_change = true\n\n[[target]]\nname = \"{T}\"\n\n[target.lun.0]\nsize = \"1MiB\"\nbackend = \"memory\"\n",
            socket.display()
        ),
    )
    .unwrap();
    let mut target = Proc::spawn(&["target", "--config", config.to_str().unwrap()]);
    target.wait_line("ironsan: control socket ", ' ');
    let (ok, out, err) = admin(&socket, &["lun", "add", T, "5", "--ram", "2MiB"]);
    assert!(ok, "{out}{err}");
    let saved = std::fs::read_to_string(&config).unwrap();
    assert!(saved.contains("[target.lun.5]"), "{saved}");
    assert!(dir.join("target.toml.bak").exists());
    // A refused change writes nothing.
    let (ok, _, _) = admin(&socket, &["lun", "add", T, "5", "--ram", "2MiB"]);
    assert!(!ok);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), saved);
    target.signal("-INT");
    assert!(target.wait_exit(LIMIT).success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn alua_show_tells_a_gateways_state_for_each_lun() {
    let dir = scratch("alua");
    let socket = dir.join("control.sock");
    let image = dir.join("lun.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let config = dir.join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "portals = [\"127.0.0.1:0\"]\n[gateway]\ngroup = \"pair\"\nname = \"gw-a\"\n\
             port_group = 1\nrelative_port = 1\n[[gateway.peer]]\nname = \"gw-b\"\n\
             port_group = 2\nrelative_port = 2\n[[target]]\nname = \"{T}\"\n[target.lun.0]\n\
             backend = {{ type = \"file\", path = \"{}\" }}\nowner_lock = \"{}\"\n\
             [target.lun.1]\nsize = \"1MiB\"\nbackend = \"memory\"\n",
            image.display(),
            dir.join("lun.owner").display()
        ),
    )
    .unwrap();
    let mut target = Proc::spawn(&[
        "target",
        "--config",
        config.to_str().unwrap(),
        "--control",
        socket.to_str().unwrap(),
    ]);
    target.wait_line("ironsan: control socket ", ' ');
    let params = format!("{{\"target\": \"{T}\"}}");
    let mut doc = serde_json::Value::Null;
    for _ in 0..100 {
        let (ok, out, err) = admin(&socket, &["call", "alua.show", &params]);
        assert!(ok, "alua.show: {out}{err}");
        doc = serde_json::from_str(&out).expect("JSON");
        if doc["luns"][0]["state"] == "active/optimized" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(doc["gateway"]["name"], "gw-a");
    assert_eq!(doc["gateway"]["port_group"], 1);
    let (shared, ram) = (&doc["luns"][0], &doc["luns"][1]);
    assert_eq!(shared["state"], "active/optimized", "{doc}");
    assert_eq!(
        (&shared["shared"], &shared["owner"]),
        (&true.into(), &"gw-a".into())
    );
    assert_eq!(shared["acquired"], 1);
    assert_eq!((&ram["lun"], &ram["shared"]), (&1.into(), &false.into()));
    assert_eq!(ram["state"], "active/optimized");
}
