//! `ironsan mount URL DIR`: the LUNs of a target as regular files in a FUSE file system
//! (`DIR/lun0`, `DIR/lun1`, ...), so `losetup --direct-io=on` turns one into a local disk
//! without a kernel initiator.
//!
//! FUSE crate: `fuser` (0.18). It is the maintained successor of the `fuse` crate, used
//! widely, implements the kernel protocol in Rust (lets a reply be sent later from another
//! thread, which is how requests here run concurrently on the initiator's runtime), and on
//! Linux mounts without libfuse: as root with mount(2) on /dev/fuse, otherwise through the
//! setuid `fusermount3` (Debian's fuse3 package). So building needs no C library or
//! pkg-config; the alternatives either bind libfuse (fuse-sys, fuse3 bindings) or are
//! async-only wrappers with fewer users.
//!
//! The I/O itself is `lun_io::Lun` (crates/lun-io, shared with `ironsan nbd`); `fs` is
//! the thin FUSE glue over it.

mod fs;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use iscsi_initiator::{IscsiUrl, Session};

use super::initiator::{run_with, LoginOpts};

/// What the foreground process prints once the file system is mounted (the daemonizing
/// parent waits for it).
const READY: &str = "ironsan: mounted ";

#[derive(clap::Args)]
pub struct MountArgs {
    /// iscsi://[user%password@]HOST[:PORT][,HOST2[:PORT]...]/TARGET-IQN[/LUN] (or iser://...; several hosts: multipath): every LUN of
    /// the target, or only the one named
    pub url: String,
    /// The directory to mount on (exists, usually empty).
    pub dir: PathBuf,
    /// Stay in the foreground (otherwise the mount runs on in the background once
    /// mounted; `umount DIR` ends it either way).
    #[arg(long, short = 'f')]
    pub foreground: bool,
    /// A read, write or fsync not answered within this many seconds fails with EIO
    /// (reconnecting included).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub io_timeout: u64,
    /// Mount read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Let other users than the one mounting use the files (FUSE's allow_other).
    #[arg(long)]
    pub allow_other: bool,
    #[command(flatten)]
    pub login: LoginOpts,
}

pub fn run(args: MountArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.io_timeout > 0,
        "--io-timeout {}: say 1 or more seconds",
        args.io_timeout
    );
    anyhow::ensure!(args.dir.is_dir(), "{}: not a directory", args.dir.display());
    if !args.foreground {
        return daemonize(&args.dir);
    }
    init_logging();
    let (url, only) = parse_url(&args.url)?;
    // --reconnect is one of the login options.
    let cfg = args.login.config(&url)?;
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("{}", args.dir.display()))?;
    let io_timeout = Duration::from_secs(args.io_timeout);
    run_with(&args.login, async {
        let session = Arc::new(
            transports::connect_session(&url, cfg)
                .await
                .with_context(|| format!("logging in to {url}"))?,
        );
        let numbers = match only {
            Some(n) => vec![n],
            None => {
                let mut l = session.report_luns().await.context("REPORT LUNS")?;
                l.sort_unstable();
                l
            }
        };
        let mut files = Vec::new();
        let mut luns = Vec::new();
        for n in numbers {
            match lun_io::Lun::open(session.clone(), n).await {
                Ok(lun) => {
                    let geo = lun.geometry();
                    files.push(fs::LunFile {
                        name: format!("lun{n}"),
                        size: lun.size(),
                        block_size: geo.block_size,
                        read_only: args.read_only || geo.write_protected,
                    });
                    luns.push(Arc::new(lun));
                }
                Err(e) if only.is_some() => {
                    return Err(anyhow::Error::new(e).context(format!("opening LUN {n}")))
                }
                Err(e) => tracing::warn!("LUN {n} left out: {e}"),
            }
        }
        anyhow::ensure!(!files.is_empty(), "{}: no LUN to mount", args.url);
        let listing: Vec<String> = files
            .iter()
            .map(|f| {
                format!(
                    "{} ({} bytes, blocks of {}{})",
                    f.name,
                    f.size,
                    f.block_size,
                    if f.read_only { ", read-only" } else { "" }
                )
            })
            .collect();
        let first = files[0].name.clone();
        let layout = fs::Layout {
            files,
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            mounted_at: SystemTime::now(),
        };
        // The kernel's queue of asynchronous requests: the session's window, so that
        // requests wait in the session (in CmdSN order) rather than in the kernel.
        let background = session.window().clamp(16, 1024) as u16;
        let filesystem = fs::LunFs::new(
            layout,
            luns,
            tokio::runtime::Handle::current(),
            io_timeout,
            background,
        );
        let mut options = vec![
            // No commas: they separate mount options.
            fuser::MountOption::FSName(format!("ironsan:{url}").replace(',', "_")),
            fuser::MountOption::Subtype("ironsan".into()),
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoAtime,
        ];
        if args.read_only {
            options.push(fuser::MountOption::RO);
        }
        let mut config = fuser::Config::default();
        config.mount_options = options;
        if args.allow_other {
            config.acl = fuser::SessionACL::All;
        }
        // One dispatch thread is enough: it only hands requests to tasks.
        config.n_threads = Some(1);
        let mut fuse = {
            let at = dir.clone();
            tokio::task::spawn_blocking(move || fuser::Session::new(filesystem, &at, &config))
                .await?
                .with_context(|| format!("mounting on {}", dir.display()))?
        };
        let mut unmounter = Some(fuse.unmount_callable());
        let (done_tx, mut done) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("fuse".into())
            .spawn(move || {
                let _ = done_tx.send(fuse.run());
            })
            .context("starting the FUSE thread")?;
        say(&format!(
            "ironsan: try: losetup --direct-io=on --find --show {}",
            dir.join(&first).display()
        ));
        say(&format!(
            "{READY}{url} on {}: {}",
            dir.display(),
            listing.join(", ")
        ));
        let mut signals = shutdown_signals();
        let ended = loop {
            tokio::select! {
                r = &mut done => break r,
                _ = signals.recv() => {
                    // fuser's own unmount first (it then knows not to unmount again as
                    // the session ends); it is good for one try, so after a refusal
                    // (busy) the next signal unmounts by itself.
                    let r = match unmounter.take() {
                        Some(mut u) => u.unmount().map_err(anyhow::Error::from),
                        None => unmount(&dir),
                    };
                    match r {
                        Ok(()) => tracing::info!("unmounting {}", dir.display()),
                        Err(e) => tracing::warn!(
                            "unmounting {}: {e}; still serving (release what uses it, e.g. \
                             `losetup -d`, then Ctrl-C again or `umount {}`)",
                            dir.display(),
                            dir.display()
                        ),
                    }
                }
            }
        };
        match ended {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("the FUSE session ended: {e}"),
            Err(_) => tracing::warn!("the FUSE thread ended without a word"),
        }
        say(&format!("ironsan: unmounted {}", dir.display()));
        logout(session).await;
        Ok(())
    })
}

/// The URL to log in with and the one LUN it names, if it names one: `.../TARGET-IQN/LUN`
/// mounts that LUN, `.../TARGET-IQN` (or with a trailing slash) every LUN of the target.
fn parse_url(s: &str) -> anyhow::Result<(IscsiUrl, Option<u16>)> {
    if let Ok(u) = IscsiUrl::parse_lun(s) {
        let lun = u.lun;
        return Ok((u, lun));
    }
    let (path, query) = match s.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (s, None),
    };
    let mut with_lun = format!("{}/0", path.trim_end_matches('/'));
    if let Some(q) = query {
        with_lun = format!("{with_lun}?{q}");
    }
    match IscsiUrl::parse_lun(&with_lun) {
        Ok(u) => Ok((u, None)),
        // The original's complaint is the one that names what the user wrote.
        Err(_) => Err(IscsiUrl::parse_lun(s).expect_err("failed above").into()),
    }
}

/// As `ironsan target`'s logging (IRONSAN_LOG), fuser's only for errors: its warnings are
/// about calls answered ENOSYS, and a second unmount attempt when `umount DIR` ended it.
fn init_logging() {
    super::target::init_logging_or("info,fuser=error");
}

/// A line on stdout that never fails the program (the daemonizing parent may have gone).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The requests still running let go of the session as they end (each is bounded by the
/// I/O timeout); then a logout, bounded too.
async fn logout(mut session: Arc<Session>) {
    for _ in 0..200 {
        match Arc::try_unwrap(session) {
            Ok(s) => {
                match tokio::time::timeout(Duration::from_secs(5), s.logout()).await {
                    Ok(Ok(())) => tracing::debug!("logged out"),
                    Ok(Err(e)) => tracing::warn!("logout: {e}"),
                    Err(_) => tracing::warn!("logout: no answer within 5 s"),
                }
                return;
            }
            Err(s) => {
                session = s;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    tracing::warn!("requests still hold the session after 2 s: closing it without logout");
}

/// SIGINT (Ctrl-C) and SIGTERM, as many times as they come.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

fn shutdown_signals() -> Signals {
    use tokio::signal::unix::{signal, SignalKind};
    Signals {
        int: signal(SignalKind::interrupt()).expect("SIGINT handler"),
        term: signal(SignalKind::terminate()).expect("SIGTERM handler"),
    }
}

impl Signals {
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// Unmounts `dir`: umount(2) as root, `fusermount3 -u` (or `fusermount -u`) otherwise. A
/// busy mount (a loop device on a file, an open file) stays mounted and says so.
fn unmount(dir: &Path) -> anyhow::Result<()> {
    match nix::mount::umount(dir) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => {
            for tool in ["fusermount3", "fusermount"] {
                if let Ok(o) = Command::new(tool).arg("-u").arg(dir).output() {
                    anyhow::ensure!(
                        o.status.success(),
                        "{tool} -u: {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    );
                    return Ok(());
                }
            }
            anyhow::bail!("not root, and neither fusermount3 nor fusermount is installed")
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs this command again with `--foreground` in a session of its own, shows what it
/// prints until it has mounted (or failed), and returns, leaving it serving. Its later
/// log lines are dropped (run with `--foreground` to keep them); holding on to this
/// process's stdout or stderr would keep a caller that reads them to the end waiting.
fn daemonize(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("finding the ironsan executable")?;
    let mut child = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .arg("--foreground")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("starting the background process")?;
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("{line}");
        }
    });
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        println!("{line}");
        if line.starts_with(READY) {
            println!(
                "ironsan: serving in the background (pid {}); `umount {}` ends it",
                child.id(),
                dir.display()
            );
            return Ok(());
        }
    }
    let status = child.wait()?;
    // What it said on stderr is on its way through the thread above.
    std::thread::sleep(Duration::from_millis(50));
    anyhow::bail!("the mount did not start ({status})")
}
