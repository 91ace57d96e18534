//! rping-compatible ping over the verbs provider (a real RDMA device, e.g. siw):
//!
//!     verbs-ping --server 10.0.2.15:7174 [-v]
//!     verbs-ping 10.0.2.2:7174 [--count N] [--size BYTES] [-v]
//!
//! The same ping code as `ironsan rdma ping`, run on libibverbs/librdmacm instead of the software
//! RNIC; the kernel-peer scenario `siw-verbs` runs it over Linux siw.
use rdma::Provider;
use rdma_tools::rping::{self, PingOptions};
use std::time::Duration;

fn main() {
    if let Err(e) = run() {
        eprintln!("verbs-ping: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (mut server, mut addr) = (false, None);
    let mut opt = PingOptions {
        timeout: Duration::from_secs(20),
        ..Default::default()
    };
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> Result<usize, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or(format!("{what} needs a number"))
        };
        match a.as_str() {
            "--server" => server = true,
            "--count" => opt.count = num("--count")? as u32,
            "--size" => opt.size = num("--size")?,
            "-v" => opt.verbose = true,
            _ => addr = Some(a.parse().map_err(|e| format!("{a}: {e}"))?),
        }
    }
    let addr = addr.ok_or("give ADDR:PORT")?;
    let dev = verbs::Verbs::open().map_err(|e| e.to_string())?;
    println!("device: {}", dev.name());
    let print = |l: String| println!("{l}");
    if server {
        let listener = dev
            .listen(addr)
            .map_err(|e| format!("listen on {addr}: {e}"))?;
        println!("verbs ping server listening on {addr}");
        let served = rping::server(&dev, &listener, &opt, print)?;
        println!("verbs ping server: client disconnected after {served} pings");
    } else {
        let r = rping::client(&dev, addr, &opt, print)?;
        println!(
            "verbs ping {addr}: {}/{} pings ok",
            r.rtt_us.len(),
            r.iterations
        );
    }
    Ok(())
}
