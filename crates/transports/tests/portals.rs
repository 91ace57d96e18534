//! Portals added to and removed from a running target: a portal added is served and listed by
//! SendTargets; a portal removed stops accepting and is no longer listed, while the sessions
//! it accepted carry on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use iscsi_initiator::{IscsiUrl, SessionConfig};

const CONFIG: &str = r#"
portals = ["127.0.0.1:0"]
[[target]]
name = "iqn.2026-11.org.ironsan:plain"
[target.lun.0]
size = "4MiB"
backend = "memory"
"#;

const T: Duration = Duration::from_secs(20);

/// The ports SendTargets lists through the portal at `addr`.
async fn listed_ports(addr: SocketAddr) -> Vec<u16> {
    let u = IscsiUrl::from_portal_or_url(&addr.to_string()).unwrap();
    let targets = transports::discover(&u, &SessionConfig::default())
        .await
        .expect("discovery");
    let mut ports: Vec<u16> = targets[0].addresses.iter().map(|a| a.port).collect();
    ports.sort();
    ports
}

fn lun_url(addr: SocketAddr) -> IscsiUrl {
    IscsiUrl::parse_lun(&format!("iscsi://{addr}/iqn.2026-11.org.ironsan:plain/0")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_added_serves_and_a_portal_removed_stops_accepting() {
    tokio::time::timeout(T, async {
        let config = iscsi_target::Config::parse(CONFIG, "test.toml").expect("config");
        let (first, target) = test_support::serve(config).await;

        let portal = datamover_tcp::TcpPortal::bind("127.0.0.1:0".parse().unwrap())
            .await
            .expect("second portal");
        let second = datamover::Portal::local_addr(&portal);
        target.add_portal(Arc::new(portal));
        assert_eq!(target.portals().len(), 2);
        let mut both = vec![first.port(), second.port()];
        both.sort();
        assert_eq!(listed_ports(first).await, both);

        let url = lun_url(second);
        let s = test_support::connect(&url)
            .await
            .expect("login through the added portal");
        s.test_unit_ready(0).await.expect("TEST UNIT READY");

        assert!(target.remove_portal(second));
        assert!(!target.remove_portal(second), "removed once");
        assert_eq!(target.portals().len(), 1);
        assert_eq!(listed_ports(first).await, vec![first.port()]);
        // Its listener closes once its accept loop has ended: bounded wait.
        let mut refused = false;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(second).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(refused, "the removed portal still accepts connections");
        s.test_unit_ready(0)
            .await
            .expect("the session logged in through the removed portal carries on");
        s.logout().await.expect("logout");
    })
    .await
    .expect("in time");
}
