//! ironsan's Prometheus exporter. The layers count with plain atomics and know no metrics
//! format (`scsi`'s per-LUN counters, `iscsi-target`'s `stats`, `datamover-iser`'s
//! `stats`); here a prometheus-client [`Collector`] reads their snapshots at scrape time
//! into metric families ([`TargetCollector`]), and [`serve`] answers `GET /metrics` with
//! them on a small HTTP/1.1 server of its own (one request per connection, its head bounded
//! in size and time: a scrape endpoint needs no more, and no HTTP stack has to come along).
//! prometheus-client writes the OpenMetrics text format, which a Prometheus server asks for;
//! other clients (curl, `promtool check metrics`, which parses only the classic format) get
//! the classic text format 0.0.4 ([`to_classic_text`]: the same samples, counter families
//! named with their `_total`). [`METRICS`] lists every family with its help.

mod collector;
mod http;

pub use collector::{TargetCollector, METRICS};
pub use http::{serve, serve_on, CLASSIC_CONTENT_TYPE, CONTENT_TYPE};

use prometheus_client::registry::Registry;

/// A registry holding `collector`: what [`serve`] encodes on every scrape.
pub fn registry(collector: TargetCollector) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    registry
}

/// The registry's metrics now, in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String fails only if a collector fails, and ours do not.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, registry) {
        tracing::warn!("encoding the metrics failed: {e}");
    }
    text
}

/// OpenMetrics text (as [`encode`] writes it) in the classic Prometheus text format 0.0.4:
/// a counter family's HELP and TYPE lines name it as its samples do (with `_total`), and the
/// UNIT and EOF lines, which that format does not have, are left out.
pub fn to_classic_text(open_metrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = open_metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut text = String::with_capacity(open_metrics.len() + 64 * counters.len());
    for line in open_metrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{tag}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => text.push_str(&l),
            None => text.push_str(line),
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counter_families_with_their_total() {
        let open = "# HELP a_bytes Bytes.\n# TYPE a_bytes counter\n# UNIT a_bytes bytes\n\
                    a_bytes_total{x=\"1\"} 3\n# HELP g A gauge.\n# TYPE g gauge\ng 2\n# EOF\n";
        assert_eq!(
            to_classic_text(open),
            "# HELP a_bytes_total Bytes.\n# TYPE a_bytes_total counter\n\
             a_bytes_total{x=\"1\"} 3\n# HELP g A gauge.\n# TYPE g gauge\ng 2\n"
        );
    }
}
