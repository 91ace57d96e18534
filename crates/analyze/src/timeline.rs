//! The timeline picture: one lane per connection and direction, each PDU a mark at the time
//! its bytes were on the wire, each SCSI command a span from command to status, pauses on the
//! wire shaded, and TCP retransmissions and losses flagged in red. [`svg`] gives the SVG;
//! [`html`] wraps it in a self-contained page with zoom, pan and hover details.

use std::fmt::Write as _;

use crate::analysis::Analysis;
use crate::iscsi::Dir;
use crate::listing::pdu_line;
use crate::stats::{CommandStat, StatsOptions};
use crate::tcp::TcpEventKind;

const WIDTH: f64 = 1400.0;
const LEFT: f64 = 170.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const LANE_H: f64 = 26.0;
const CMD_H: f64 = 14.0;
const CONN_GAP: f64 = 14.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn colour(opcode: u8) -> &'static str {
    match opcode {
        0x01 => "#4e79a7",        // SCSI Command
        0x25 | 0x05 => "#59a14f", // data
        0x21 => "#f28e2b",        // response
        0x31 => "#b07aa1",        // R2T
        0x03 | 0x23 => "#9c755f", // login
        0x3f => "#e15759",        // reject
        _ => "#bab0ac",
    }
}

/// Time axis: seconds from the capture start to x pixels.
struct Scale {
    t0: u64,
    span: f64,
}

impl Scale {
    fn x(&self, ts: u64) -> f64 {
        LEFT + (ts.saturating_sub(self.t0) as f64 / self.span) * (WIDTH - LEFT - RIGHT)
    }
}

fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// The timeline as an SVG document.
pub fn svg(a: &Analysis, cmds: &[CommandStat], opts: &StatsOptions) -> String {
    let t0 = a.start_ns;
    let span = (a.end_ns.saturating_sub(t0)).max(1) as f64;
    let sc = Scale { t0, span };
    let conn_h = 2.0 * LANE_H + CMD_H + CONN_GAP;
    let height = TOP + conn_h * a.connections.len().max(1) as f64 + 40.0;
    let mut s = String::with_capacity(256 + a.pdus.len() * 200);
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<defs><clipPath id="plotclip"><rect x="{LEFT}" y="0" width="{}" height="{height}"/></clipPath></defs>"#,
        WIDTH - LEFT - RIGHT
    );
    let _ = write!(
        s,
        r#"<text x="{LEFT}" y="16" font-size="13">iSCSI timeline: {} PDUs on {} connection(s), {:.6} s; shaded: no packet for at least {} us</text>"#,
        a.pdus.len(),
        a.connections.len(),
        span / 1e9,
        opts.idle_gap_ns / 1000
    );
    // Lane labels stay outside the zoomed group.
    for (ci, c) in a.connections.iter().enumerate() {
        let y0 = TOP + ci as f64 * conn_h;
        for (li, dir) in [Dir::ToTarget, Dir::ToInitiator].iter().enumerate() {
            let y = y0 + li as f64 * (LANE_H + CMD_H);
            let _ = write!(
                s,
                r#"<text x="6" y="{:.1}">c{} {} {}</text>"#,
                y + LANE_H * 0.65,
                c.id,
                dir.arrow(),
                esc(&match dir {
                    Dir::ToTarget => c.target.to_string(),
                    Dir::ToInitiator => c.initiator.to_string(),
                })
            );
        }
    }
    s.push_str(r#"<g clip-path="url(#plotclip)"><g id="zoom">"#);
    for (ci, c) in a.connections.iter().enumerate() {
        let y0 = TOP + ci as f64 * conn_h;
        let lane_y = |d: Dir| match d {
            Dir::ToTarget => y0,
            Dir::ToInitiator => y0 + LANE_H + CMD_H,
        };
        // Idle gaps: between consecutive payload packets of this connection.
        let mut times: Vec<u64> = c.packets.iter().map(|p| p.ts_ns).collect();
        times.sort_unstable();
        for w in times.windows(2) {
            if w[1] - w[0] >= opts.idle_gap_ns {
                let (x0, x1) = (sc.x(w[0]), sc.x(w[1]));
                let _ = write!(
                    s,
                    r##"<rect class="idle" x="{x0:.3}" y="{y0:.1}" width="{:.3}" height="{:.1}" fill="#dddddd"><title>idle {:.1} us</title></rect>"##,
                    (x1 - x0).max(0.0),
                    2.0 * LANE_H + CMD_H,
                    (w[1] - w[0]) as f64 / 1e3
                );
            }
        }
        for dir in [Dir::ToTarget, Dir::ToInitiator] {
            let _ = write!(
                s,
                r##"<g class="lane" data-conn="{}" data-dir="{}"><line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#999" stroke-width="0.5" vector-effect="non-scaling-stroke"/>"##,
                c.id,
                dir.arrow(),
                WIDTH - RIGHT,
                y = lane_y(dir) + LANE_H / 2.0
            );
            for p in a.pdus.iter().filter(|p| p.conn == c.id && p.dir == dir) {
                let x0 = sc.x(p.first_ts_ns);
                let x1 = sc.x(p.ts_ns);
                let _ = write!(
                    s,
                    r#"<rect class="pdu" data-i="{}" x="{x0:.3}" y="{:.1}" width="{:.3}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                    p.index,
                    lane_y(dir) + 3.0,
                    (x1 - x0).max(0.6),
                    LANE_H - 6.0,
                    colour(p.opcode),
                    esc(pdu_line(p).trim())
                );
            }
            s.push_str("</g>");
        }
        // Command spans between the two lanes.
        let cy = y0 + LANE_H + 2.0;
        for k in cmds.iter().filter(|k| k.conn == c.id) {
            let end = k.end_ns.unwrap_or(a.end_ns);
            let (x0, x1) = (sc.x(k.start_ns), sc.x(end));
            let _ = write!(
                s,
                r##"<rect class="cmd" x="{x0:.3}" y="{cy:.1}" width="{:.3}" height="{:.1}" fill="#4e79a7" fill-opacity="0.35" stroke="#4e79a7" stroke-width="0.5" vector-effect="non-scaling-stroke"><title>{} ITT 0x{:08x}: {}</title></rect>"##,
                (x1 - x0).max(0.6),
                CMD_H - 4.0,
                esc(&k.cdb),
                k.itt,
                k.latency_us
                    .map_or("no response in capture".to_string(), |l| format!(
                        "{l:.1} us, idle {:.1} us",
                        k.idle_us
                    ))
            );
        }
        // TCP anomalies.
        for (dir, e) in &c.tcp_events {
            let label = match e.kind {
                TcpEventKind::Retransmission => "retransmission",
                TcpEventKind::LostRetransmitted => "lost segment, retransmitted",
                TcpEventKind::OutOfOrder => "segment after a hole",
                TcpEventKind::Unrecovered => "bytes never captured",
            };
            let x = sc.x(e.ts_ns);
            let y = lane_y(*dir);
            let _ = write!(
                s,
                r##"<rect class="tcp-event" data-kind="{:?}" x="{:.3}" y="{y:.1}" width="2" height="{LANE_H}" fill="#e15759"><title>{label}: frame {} stream offset {} len {}</title></rect>"##,
                e.kind,
                x - 1.0,
                e.frame,
                e.offset,
                e.len
            );
        }
    }
    s.push_str("</g></g>");
    // Time axis (recomputed by the HTML page's script when zooming).
    let axis_y = height - 24.0;
    let _ = write!(
        s,
        r##"<g id="axis"><line x1="{LEFT}" x2="{}" y1="{axis_y}" y2="{axis_y}" stroke="#333"/>"##,
        WIDTH - RIGHT
    );
    let secs = span / 1e9;
    let step = nice_step(secs / 8.0);
    let mut k = 0.0;
    // At most about 12 ticks by construction of `step`.
    while k <= secs + step * 1e-9 && step > 0.0 {
        let x = LEFT + k / secs * (WIDTH - LEFT - RIGHT);
        let _ = write!(
            s,
            r##"<line x1="{x:.2}" x2="{x:.2}" y1="{axis_y}" y2="{}" stroke="#333"/><text x="{x:.2}" y="{}" text-anchor="middle">{}</text>"##,
            axis_y + 4.0,
            axis_y + 16.0,
            fmt_secs(k)
        );
        k += step;
    }
    s.push_str("</g></svg>\n");
    s
}

fn fmt_secs(s: f64) -> String {
    if s == 0.0 {
        "0".into()
    } else if s < 1e-3 {
        format!("{:.0} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

/// A self-contained HTML page: the SVG inline, wheel to zoom the time axis, drag to pan,
/// hover for the PDU/command details.
pub fn html(a: &Analysis, cmds: &[CommandStat], opts: &StatsOptions) -> String {
    let svg = svg(a, cmds, opts);
    let span_s = a.end_ns.saturating_sub(a.start_ns).max(1) as f64 / 1e9;
    format!(
        r##"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>ironsan timeline</title>
<style>
body {{ font-family: sans-serif; margin: 8px; }}
#wrap {{ border: 1px solid #ccc; overflow: hidden; cursor: grab; }}
#tip {{ position: fixed; pointer-events: none; background: #ffffe0; border: 1px solid #999;
        padding: 3px 6px; font: 12px monospace; display: none; white-space: pre; }}
</style></head><body>
<div>wheel: zoom time axis &middot; drag: pan &middot; double-click: reset &middot; hover: details</div>
<div id="wrap">{svg}</div><div id="tip"></div>
<script>
(function() {{
  var LEFT = {LEFT}, W = {WIDTH}, RIGHT = {RIGHT}, SPAN = {span_s};
  var svg = document.querySelector('#wrap svg'), g = document.getElementById('zoom');
  var axis = document.getElementById('axis'), tip = document.getElementById('tip');
  var k = 1, tx = 0, drag = null;
  function fmt(s) {{ return s === 0 ? '0' : s < 1e-3 ? (s*1e6).toFixed(1)+' us' : s < 1 ? (s*1e3).toFixed(3)+' ms' : s.toFixed(3)+' s'; }}
  function redraw() {{
    g.setAttribute('transform', 'translate(' + (LEFT + tx - LEFT * k) + ',0) scale(' + k + ',1)');
    var y = parseFloat(axis.querySelector('line').getAttribute('y1'));
    var pw = W - LEFT - RIGHT, t0 = (-tx / k) / pw * SPAN, t1 = t0 + SPAN / k;
    var raw = (t1 - t0) / 8, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    var step = p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10);
    var out = '<line x1="' + LEFT + '" x2="' + (W - RIGHT) + '" y1="' + y + '" y2="' + y + '" stroke="#333"/>';
    for (var t = Math.ceil(t0 / step) * step, n = 0; t <= t1 && n < 20; t += step, n++) {{
      var x = LEFT + (t - t0) / (t1 - t0) * pw;
      out += '<line x1="' + x + '" x2="' + x + '" y1="' + y + '" y2="' + (y + 4) + '" stroke="#333"/>' +
             '<text x="' + x + '" y="' + (y + 16) + '" text-anchor="middle">' + fmt(t) + '</text>';
    }}
    axis.innerHTML = out;
  }}
  function px(ev) {{ var r = svg.getBoundingClientRect(); return (ev.clientX - r.left) * W / r.width; }}
  svg.addEventListener('wheel', function(ev) {{
    ev.preventDefault();
    var x = px(ev) - LEFT, f = ev.deltaY < 0 ? 1.25 : 0.8, nk = Math.max(1, Math.min(k * f, 1e6));
    tx = x - (x - tx) * nk / k; k = nk; if (k === 1) tx = 0; redraw();
  }}, {{ passive: false }});
  svg.addEventListener('mousedown', function(ev) {{ drag = {{ x: px(ev), tx: tx }}; }});
  window.addEventListener('mouseup', function() {{ drag = null; }});
  svg.addEventListener('mousemove', function(ev) {{
    if (drag) {{ tx = Math.min(0, drag.tx + px(ev) - drag.x); redraw(); }}
    var t = ev.target.querySelector ? ev.target.querySelector('title') : null;
    if (t && ev.target.tagName === 'rect') {{
      tip.textContent = t.textContent; tip.style.display = 'block';
      tip.style.left = (ev.clientX + 12) + 'px'; tip.style.top = (ev.clientY + 12) + 'px';
    }} else {{ tip.style.display = 'none'; }}
  }});
  svg.addEventListener('dblclick', function() {{ k = 1; tx = 0; redraw(); }});
}})();
</script></body></html>
"##
    )
}
