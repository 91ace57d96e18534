//! The collector: the target's, its LUNs' and iSER's counters read at scrape time into
//! metric families.

use std::fmt;
use std::sync::Arc;

use iscsi_target::stats::{RecoveryTotals, TargetStatsSnapshot};
use iscsi_target::Target;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use scsi::stats::{LatencySnapshot, LATENCY_BOUNDS_US};
use scsi::{Direction, LunStatsSnapshot};

/// Every family exported, as exposed (counters with their `_total`) and with its help.
pub const METRICS: &[(&str, &str)] = &[
    (
        "ironsan_lun_read_ops_total",
        "READ commands ended on the LUN",
    ),
    (
        "ironsan_lun_write_ops_total",
        "WRITE commands ended on the LUN",
    ),
    (
        "ironsan_lun_other_ops_total",
        "Other commands ended on the LUN",
    ),
    ("ironsan_lun_read_bytes_total", "Bytes read from the LUN"),
    ("ironsan_lun_write_bytes_total", "Bytes written to the LUN"),
    (
        "ironsan_lun_other_bytes_total",
        "Data-in bytes of the LUN's other commands",
    ),
    (
        "ironsan_lun_read_latency_seconds",
        "Latency of READ commands",
    ),
    (
        "ironsan_lun_write_latency_seconds",
        "Latency of WRITE commands",
    ),
    (
        "ironsan_lun_other_latency_seconds",
        "Latency of other commands",
    ),
    ("ironsan_lun_queue_depth", "Commands in flight on the LUN"),
    ("ironsan_iscsi_sessions", "Sessions open"),
    (
        "ironsan_iscsi_connections",
        "Connections in full feature phase",
    ),
    (
        "ironsan_iscsi_connections_closed_total",
        "Connections that left full feature phase",
    ),
    (
        "ironsan_iscsi_logins_accepted_total",
        "Logins that reached full feature phase",
    ),
    (
        "ironsan_iscsi_logins_refused_total",
        "Logins refused or broken off, by reason",
    ),
    (
        "ironsan_iscsi_session_reinstatements_total",
        "Sessions closed by a reinstating login",
    ),
    ("ironsan_iscsi_logouts_total", "Logout Requests answered"),
    (
        "ironsan_iscsi_header_digest_errors_total",
        "PDUs discarded for a header digest error",
    ),
    (
        "ironsan_iscsi_data_digest_errors_total",
        "PDUs rejected for a data digest error",
    ),
    ("ironsan_iscsi_snacks_total", "SNACKs received, by kind"),
    (
        "ironsan_iscsi_recovery_r2ts_total",
        "Recovery R2Ts sent for lost write data (ERL 1)",
    ),
    (
        "ironsan_iscsi_task_reassigns_total",
        "Tasks reassigned to another connection (ERL 2)",
    ),
    (
        "ironsan_iser_rdma_writes_total",
        "RDMA Writes posted (read data)",
    ),
    (
        "ironsan_iser_rdma_write_bytes_total",
        "Bytes of RDMA Writes posted",
    ),
    (
        "ironsan_iser_rdma_reads_total",
        "RDMA Reads completed (write data)",
    ),
    (
        "ironsan_iser_rdma_read_bytes_total",
        "Bytes of RDMA Reads completed",
    ),
    (
        "ironsan_iser_registrations_total",
        "Memory regions registered for RDMA operations",
    ),
    (
        "ironsan_iser_registration_cache_hits_total",
        "RDMA operations on a region registered earlier",
    ),
    (
        "ironsan_iser_lun_image_writes_total",
        "RDMA Writes sent straight from a registered LUN image",
    ),
    (
        "ironsan_iser_credit_overruns_total",
        "Connections ended for overrunning their receive credit",
    ),
];

/// The help of the family `exposed` (as listed in [`METRICS`]).
fn help(exposed: &str) -> &'static str {
    METRICS
        .iter()
        .find(|(n, _)| *n == exposed)
        .map_or("", |(_, h)| h)
}

/// Reads a target runtime's counters at every scrape.
pub struct TargetCollector {
    target: Arc<Target>,
}

impl TargetCollector {
    pub fn new(target: Arc<Target>) -> TargetCollector {
        TargetCollector { target }
    }
}

impl fmt::Debug for TargetCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TargetCollector")
    }
}

impl Collector for TargetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        encode_luns(&mut encoder, &self.target.lun_stats())?;
        encode_target(&mut encoder, &self.target.stats())?;
        encode_iser(&mut encoder, &datamover_iser::stats::snapshot())
    }
}

type Labels<'a> = Vec<(&'static str, &'a str)>;

/// A counter family: `name` (without `_total`), one sample per label set.
fn counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    unit: Option<Unit>,
    samples: &[(Labels, u64)],
) -> fmt::Result {
    let exposed = match &unit {
        Some(u) => format!("{name}_{}_total", u.as_str()),
        None => format!("{name}_total"),
    };
    let mut family =
        encoder.encode_descriptor(name, help(&exposed), unit.as_ref(), MetricType::Counter)?;
    if let [(labels, value)] = samples {
        if labels.is_empty() {
            return ConstCounter::new(*value).encode(family);
        }
    }
    for (labels, value) in samples {
        ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A counter family without labels.
fn counter(encoder: &mut DescriptorEncoder, name: &str, unit: Option<Unit>, v: u64) -> fmt::Result {
    counters(encoder, name, unit, &[(Vec::new(), v)])
}

/// A gauge family, one sample per label set.
fn gauges(encoder: &mut DescriptorEncoder, name: &str, samples: &[(Labels, u64)]) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help(name), None, MetricType::Gauge)?;
    if let [(labels, value)] = samples {
        if labels.is_empty() {
            return ConstGauge::new(*value).encode(family);
        }
    }
    for (labels, value) in samples {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A latency histogram's buckets in seconds, as the encoder takes them (the last unbounded).
fn seconds_buckets(h: &LatencySnapshot) -> Vec<(f64, u64)> {
    LATENCY_BOUNDS_US
        .iter()
        .map(|us| *us as f64 / 1e6)
        .chain([f64::MAX])
        .zip(h.buckets)
        .collect()
}

fn encode_luns(
    encoder: &mut DescriptorEncoder,
    luns: &[(String, u64, LunStatsSnapshot)],
) -> fmt::Result {
    let lun_numbers: Vec<String> = luns.iter().map(|(_, l, _)| l.to_string()).collect();
    let labels = |i: usize| -> Labels { vec![("target", &luns[i].0), ("lun", &lun_numbers[i])] };
    for d in Direction::ALL {
        let dir = d.as_str();
        let ops: Vec<_> = (0..luns.len())
            .map(|i| (labels(i), luns[i].2.of(d).ops))
            .collect();
        counters(encoder, &format!("ironsan_lun_{dir}_ops"), None, &ops)?;
        let bytes: Vec<_> = (0..luns.len())
            .map(|i| (labels(i), luns[i].2.of(d).bytes))
            .collect();
        counters(
            encoder,
            &format!("ironsan_lun_{dir}"),
            Some(Unit::Bytes),
            &bytes,
        )?;
    }
    for d in Direction::ALL {
        let name = format!("ironsan_lun_{}_latency", d.as_str());
        let exposed = format!("{name}_seconds");
        let mut family = encoder.encode_descriptor(
            &name,
            help(&exposed),
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (i, (_, _, s)) in luns.iter().enumerate() {
            let h = &s.of(d).latency;
            let sum = h.sum_ns as f64 / 1e9;
            let buckets = seconds_buckets(h);
            family
                .encode_family(&labels(i))?
                .encode_histogram::<NoLabelSet>(sum, h.count(), &buckets, None)?;
        }
    }
    let depth: Vec<_> = (0..luns.len())
        .map(|i| (labels(i), luns[i].2.in_flight))
        .collect();
    gauges(encoder, "ironsan_lun_queue_depth", &depth)
}

fn encode_target(encoder: &mut DescriptorEncoder, s: &TargetStatsSnapshot) -> fmt::Result {
    gauges(
        encoder,
        "ironsan_iscsi_sessions",
        &[(Vec::new(), s.sessions)],
    )?;
    gauges(
        encoder,
        "ironsan_iscsi_connections",
        &[(Vec::new(), s.connections)],
    )?;
    counter(
        encoder,
        "ironsan_iscsi_connections_closed",
        None,
        s.connections_closed,
    )?;
    counter(
        encoder,
        "ironsan_iscsi_logins_accepted",
        None,
        s.logins_accepted,
    )?;
    let refused: Vec<_> = s
        .logins_refused
        .iter()
        .map(|(r, n)| (vec![("reason", r.as_str())], *n))
        .collect();
    counters(encoder, "ironsan_iscsi_logins_refused", None, &refused)?;
    counter(
        encoder,
        "ironsan_iscsi_session_reinstatements",
        None,
        s.session_reinstatements,
    )?;
    counter(encoder, "ironsan_iscsi_logouts", None, s.logouts)?;
    encode_recovery(encoder, &s.recovery)
}

fn encode_recovery(encoder: &mut DescriptorEncoder, r: &RecoveryTotals) -> fmt::Result {
    counter(
        encoder,
        "ironsan_iscsi_header_digest_errors",
        None,
        r.header_digest_errors,
    )?;
    counter(
        encoder,
        "ironsan_iscsi_data_digest_errors",
        None,
        r.data_digest_errors,
    )?;
    let snacks = [
        (vec![("kind", "status")], r.status_snacks),
        (vec![("kind", "data")], r.data_snacks),
        (vec![("kind", "data_ack")], r.data_acks),
    ];
    counters(encoder, "ironsan_iscsi_snacks", None, &snacks)?;
    counter(
        encoder,
        "ironsan_iscsi_recovery_r2ts",
        None,
        r.recovery_r2ts,
    )?;
    counter(
        encoder,
        "ironsan_iscsi_task_reassigns",
        None,
        r.task_reassigns,
    )
}

fn encode_iser(
    encoder: &mut DescriptorEncoder,
    s: &datamover_iser::stats::IserStats,
) -> fmt::Result {
    counter(encoder, "ironsan_iser_rdma_writes", None, s.rdma_writes)?;
    counter(
        encoder,
        "ironsan_iser_rdma_write",
        Some(Unit::Bytes),
        s.rdma_write_bytes,
    )?;
    counter(encoder, "ironsan_iser_rdma_reads", None, s.rdma_reads)?;
    counter(
        encoder,
        "ironsan_iser_rdma_read",
        Some(Unit::Bytes),
        s.rdma_read_bytes,
    )?;
    counter(encoder, "ironsan_iser_registrations", None, s.registrations)?;
    counter(
        encoder,
        "ironsan_iser_registration_cache_hits",
        None,
        s.registration_pool_hits,
    )?;
    counter(
        encoder,
        "ironsan_iser_lun_image_writes",
        None,
        s.writes_from_lun_images,
    )?;
    counter(
        encoder,
        "ironsan_iser_credit_overruns",
        None,
        s.credit_overruns,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_has_every_family_with_its_help_and_the_luns_labels() {
        let mut config = iscsi_target::Config::embedded_default();
        let lun = scsi::LunConfig::memory(1 << 20);
        config.targets[0].lun.insert("0".into(), lun);
        let bound = Target::with_portals(config, Vec::new()).expect("a target");
        let registry = crate::registry(TargetCollector::new(bound.target()));
        let text = crate::to_classic_text(&crate::encode(&registry));
        for (name, help) in METRICS {
            assert!(!help.is_empty());
            assert!(
                text.contains(&format!("# HELP {name} {help}")),
                "{name} missing:\n{text}"
            );
        }
        let labels = format!("{{target=\"{}\",lun=\"0\"}}", iscsi_target::DEFAULT_IQN);
        assert!(
            text.contains(&format!("ironsan_lun_read_ops_total{labels} 0\n")),
            "{text}"
        );
        assert!(text.contains("ironsan_iscsi_sessions 0\n"), "{text}");
        assert!(text.contains("ironsan_iscsi_logins_refused_total{reason=\"acl\"} 0\n"));
        // The histogram's buckets in seconds, ending unbounded.
        assert!(
            text.contains("ironsan_lun_read_latency_seconds_bucket{"),
            "{text}"
        );
        assert!(
            text.contains("le=\"0.00005\"") || text.contains("le=\"5e-5\""),
            "{text}"
        );
        assert!(text.contains("le=\"+Inf\""), "{text}");
    }
}
