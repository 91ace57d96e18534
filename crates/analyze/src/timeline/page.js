// ironsan timeline page: draws the embedded capture data (see data.rs for the columns) on a
// canvas. Only the visible time range is walked (binary search in sorted times), so zooming
// and panning cost the PDUs in view, not the capture. Zoomed out, a pixel column holding more
// than D.agg PDUs of a lane is drawn as one density bar; zoomed in, each PDU is a mark.
(function () {
  'use strict';
  var T0 = performance.now();
  var D = JSON.parse(document.getElementById('data').textContent);
  var LEFT = 210, RIGHT = 14, AXIS = 24, PAD = 4, CONN_GAP = 14;
  var HEIGHT = { pdu: 22, cmd: 40, out: 40, tput: 44, win: 40, ev: 12, cwnd: 36, rtt: 36 };
  var MIN_SPAN = 2; // µs
  var EVENT_NAMES = ['retransmission', 'lost, retransmitted', 'segment after a hole', 'bytes never captured'];
  var EVENT_COLOURS = ['#e15759', '#b30000', '#ff9f40', '#7a0177'];
  // Every colour drawn goes through use(key): the legend lists these keys, and the
  // self-test checks that each one drawn has its legend entry.
  var LEGEND = [];
  D.cats.forEach(function (c, i) { LEGEND.push(['cat' + i, c[1], 'PDU: ' + c[0]]); });
  LEGEND.push(['dens', 'linear-gradient(#bab0ac,#4e79a7)', 'zoomed out: bar height = PDUs in the pixel column (colour: most frequent kind)']);
  LEGEND.push(['idle', '#e4e4e4', 'no packet for at least ' + D.idle_us + ' us (idle)']);
  LEGEND.push(['cmdR', '#4e79a7', 'command: READ (request to status)']);
  LEGEND.push(['cmdW', '#f28e2b', 'command: WRITE']);
  LEGEND.push(['cmdO', '#9d9d9d', 'command: other']);
  LEGEND.push(['cmdD', '#a0cbe8', 'zoomed out: commands active in the pixel column']);
  LEGEND.push(['out', '#76b7b2', 'outstanding commands (mean over the column)']);
  LEGEND.push(['rd', '#1f5fa8', 'read MB/s (Data-In, RDMA Write)']);
  LEGEND.push(['wr', '#d9480f', 'write MB/s (immediate, Data-Out, RDMA Read Response)']);
  LEGEND.push(['fl', '#edc948', 'bytes in flight (capture)']);
  LEGEND.push(['win', '#2f8f3a', 'advertised receive window (capture)']);
  EVENT_NAMES.forEach(function (n, i) { LEGEND.push(['ev' + i, EVENT_COLOURS[i], 'TCP: ' + n]); });
  LEGEND.push(['cwnd', '#8e44ad', 'cwnd, segments (TCP_INFO)']);
  LEGEND.push(['rtt', '#c2185b', 'smoothed RTT, us (TCP_INFO)']);
  var COLOUR = {};
  LEGEND.forEach(function (l) { COLOUR[l[0]] = l[1].indexOf('gradient') >= 0 ? '#7f8fa6' : l[1]; });
  var used = {};
  function use(key) { used[key] = true; return COLOUR[key]; }

  // ---- decoding ----
  function undelta(a) {
    var out = new Float64Array(a.length), acc = 0;
    for (var i = 0; i < a.length; i++) { acc += a[i]; out[i] = acc; }
    return out;
  }
  var TPL = D.tpl, SLOTS = TPL.map(function (t) {
    var n = 0;
    for (var i = 0; i < t.length; i++) { var c = t.charCodeAt(i); if (c === 1) n++; else if (c === 2) { n++; i++; } }
    return n;
  });
  // Lines packed as template + numbers (differences from the same slot of the previous line
  // with that template): makes the numbers absolute and records where each line's start.
  function unpack(ids, nums) {
    var off = new Uint32Array(ids.length + 1), prev = {}, k = 0, abs = new Float64Array(nums.length);
    for (var j = 0; j < ids.length; j++) {
      var id = ids[j], n = SLOTS[id], p = prev[id] || (prev[id] = new Float64Array(n));
      off[j] = k;
      for (var s = 0; s < n; s++, k++) { p[s] += nums[k]; abs[k] = p[s]; }
    }
    off[ids.length] = k;
    return { ids: ids, off: off, nums: abs };
  }
  function expand(pk, j) {
    var t = TPL[pk.ids[j]], k = pk.off[j], s = '';
    for (var i = 0; i < t.length; i++) {
      var c = t.charCodeAt(i);
      if (c === 1) s += String(pk.nums[k++]);
      else if (c === 2) {
        var w = t.charCodeAt(++i) - 48, h = pk.nums[k++].toString(16);
        while (h.length < w) h = '0' + h;
        s += h;
      } else s += t[i];
    }
    return s;
  }
  function fmtTime(us) { var s = (us / 1e6).toFixed(6); while (s.length < 12) s = ' ' + s; return s; }
  function lowerBound(a, x) { var lo = 0, hi = a.length; while (lo < hi) { var m = (lo + hi) >> 1; if (a[m] < x) lo = m + 1; else hi = m; } return lo; }
  function maxOf(a) { var m = 0; for (var i = 0; i < a.length; i++) if (a[i] > m) m = a[i]; return m; }

  var conns = D.conns.map(function (c) {
    var lanes = c.lanes.map(function (l, li) {
      return { li: li, arrow: l.arrow, t: undelta(l.t), d: l.d, k: l.k, b: l.b, maxD: maxOf(l.d), lines: unpack(l.p, l.n) };
    });
    var ct = undelta(c.cmds.t), ce = new Float64Array(ct.length), maxDur = 0;
    for (var i = 0; i < ct.length; i++) {
      ce[i] = c.cmds.d[i] < 0 ? D.span : ct[i] + c.cmds.d[i];
      maxDur = Math.max(maxDur, ce[i] - ct[i]);
    }
    // Outstanding commands as a step function with its running integral, so the mean over
    // any interval is two look-ups.
    var evs = [];
    for (i = 0; i < ct.length; i++) { evs.push([ct[i], 1]); evs.push([ce[i], -1]); }
    evs.sort(function (a, b) { return a[0] - b[0] || a[1] - b[1]; });
    var et = new Float64Array(evs.length), en = new Float64Array(evs.length), ei = new Float64Array(evs.length), n = 0, integ = 0;
    for (i = 0; i < evs.length; i++) {
      if (i > 0) integ += n * (evs[i][0] - evs[i - 1][0]);
      n += evs[i][1]; et[i] = evs[i][0]; en[i] = n; ei[i] = integ;
    }
    var win = c.win.map(function (w) { return { dir: w.dir, t: undelta(w.t), f: w.f, w: undelta(w.w) }; });
    var ti = c.ti && { name: c.ti.name, how: c.ti.how, t: undelta(c.ti.t), cwnd: c.ti.cwnd, rtt: c.ti.rtt };
    return {
      id: c.id, ini: c.ini, tgt: c.tgt, lanes: lanes,
      cmds: { t: ct, e: ce, d: c.cmds.d, r: c.cmds.r, w: c.cmds.w, rows: c.cmds.rows, maxDur: maxDur, lines: unpack(c.cmds.p, c.cmds.n) },
      outs: { t: et, n: en, i: ei },
      rdma: { t: undelta(c.rdma.t), b: c.rdma.b, r: c.rdma.r },
      win: win, ev: c.ev, ti: ti, idle: undelta(c.idle)
    };
  });
  var T_DECODED = performance.now();

  // ---- layout ----
  var rows = [], y = AXIS + PAD;
  conns.forEach(function (c, ci) {
    function row(type, label, extra) {
      var r = { type: type, c: ci, y: y, h: HEIGHT[type], label: label };
      for (var k in extra) r[k] = extra[k];
      rows.push(r); y += r.h + PAD;
      return r;
    }
    row('pdu', 'c' + c.id + ' \u2192 ' + c.tgt, { l: 0 });
    row('cmd', 'c' + c.id + ' commands');
    row('pdu', 'c' + c.id + ' \u2190 ' + c.ini, { l: 1 });
    row('out', 'outstanding');
    row('tput', 'MB/s read, write');
    c.win.forEach(function (w, wi) { row('win', (w.dir ? '\u2190' : '\u2192') + ' in flight / window', { w: wi }); });
    row('ev', 'TCP events');
    if (c.ti) { row('cwnd', 'cwnd (' + c.ti.name + ')'); row('rtt', 'rtt (' + c.ti.name + ')'); }
    y += CONN_GAP;
  });
  var HEIGHT_PX = y + 6;

  // ---- view ----
  var canvas = document.getElementById('tl'), ctx = canvas.getContext('2d');
  var tip = document.getElementById('tip');
  var W = 800, PW = 600, v0 = 0, v1 = Math.max(D.span, MIN_SPAN);
  var stats = {}; // per row: {agg, detail, cnt}
  var hoverInfo = {}; // per row: what the hover reads
  function xOf(t) { return LEFT + (t - v0) * PW / (v1 - v0); }
  function tOf(x) { return v0 + (x - LEFT) * (v1 - v0) / PW; }
  function fmtSpan(us) { return us >= 1e6 ? (us / 1e6).toFixed(3) + ' s' : us >= 1e3 ? (us / 1e3).toFixed(3) + ' ms' : us.toFixed(1) + ' us'; }
  function fmtNum(v) { return v >= 1e9 ? (v / 1e9).toFixed(1) + 'G' : v >= 1e6 ? (v / 1e6).toFixed(1) + 'M' : v >= 1e4 ? (v / 1e3).toFixed(0) + 'k' : v >= 100 ? v.toFixed(0) : v.toFixed(1); }

  function resize() {
    var dpr = window.devicePixelRatio || 1;
    W = Math.max(600, document.getElementById('wrap').clientWidth);
    PW = W - LEFT - RIGHT;
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(HEIGHT_PX * dpr);
    canvas.style.width = W + 'px'; canvas.style.height = HEIGHT_PX + 'px';
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }

  function axis() {
    var span = v1 - v0, raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    var step = p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10);
    ctx.font = '11px sans-serif'; ctx.textAlign = 'center';
    for (var t = Math.ceil(v0 / step) * step, n = 0; t <= v1 && n < 30; t += step, n++) {
      var x = xOf(t);
      ctx.fillStyle = '#eee'; ctx.fillRect(x, AXIS, 1, HEIGHT_PX - AXIS);
      ctx.fillStyle = '#333'; ctx.fillRect(x, AXIS - 5, 1, 5);
      ctx.fillText(fmtSpan(t), x, AXIS - 8);
    }
    ctx.textAlign = 'left';
  }

  function drawPdus(r, c) {
    var l = c.lanes[r.l], t = l.t, k = l.k, d = l.d, sc = PW / (v1 - v0);
    var lo = lowerBound(t, v0), hi = lowerBound(t, v1 + l.maxD + 1);
    var cnt = new Int32Array(PW), cat = new Int32Array(PW * 8), j, col, x;
    for (j = lo; j < hi; j++) {
      col = Math.floor((t[j] - v0) * sc);
      if (col < 0 || col >= PW) continue;
      cnt[col]++; cat[col * 8 + k[j]]++;
    }
    var maxC = 1, agg = 0, detail = 0;
    for (col = 0; col < PW; col++) if (cnt[col] > maxC) maxC = cnt[col];
    var lmax = Math.log(maxC + 1);
    for (col = 0; col < PW; col++) {
      if (cnt[col] <= D.agg) continue;
      var best = 0;
      for (var q = 1; q < 8; q++) if (cat[col * 8 + q] > cat[col * 8 + best]) best = q;
      use('dens');
      ctx.fillStyle = use('cat' + best);
      var h = Math.max(2, (r.h - 2) * Math.log(cnt[col] + 1) / lmax);
      ctx.fillRect(LEFT + col, r.y + r.h - 1 - h, 1, h);
      agg++;
    }
    for (j = lo; j < hi; j++) {
      x = (t[j] - v0) * sc; col = Math.floor(x);
      if (col < 0 || col >= PW || cnt[col] > D.agg) continue;
      var x0 = Math.max(0, (t[j] - d[j] - v0) * sc);
      ctx.fillStyle = use('cat' + k[j]);
      ctx.fillRect(LEFT + x0, r.y + 3, Math.max(1.5, x - x0), r.h - 6);
      detail++;
    }
    stats[rows.indexOf(r)] = { agg: agg, detail: detail, cnt: cnt };
  }

  function drawCmds(r, c) {
    var m = c.cmds, sc = PW / (v1 - v0);
    var lo = lowerBound(m.t, v0 - m.maxDur - 1), hi = lowerBound(m.t, v1 + 1), visible = 0, j;
    for (j = lo; j < hi; j++) if (m.e[j] >= v0) visible++;
    if (visible > PW * 2) {
      // Too many to see one by one: how many are active in each column (the mean of the
      // outstanding step function over it), as a shade.
      var vals = meanOutstanding(c), mx = maxOf(vals) || 1;
      ctx.fillStyle = use('cmdD');
      for (var col = 0; col < PW; col++) {
        var h = (r.h - 2) * vals[col] / mx;
        if (h > 0) ctx.fillRect(LEFT + col, r.y + r.h - 1 - h, 1, h);
      }
      stats[rows.indexOf(r)] = { agg: PW, detail: 0 };
      return;
    }
    var rh = (r.h - 2) / m.rows;
    for (j = lo; j < hi; j++) {
      if (m.e[j] < v0) continue;
      var x0 = Math.max(-2, (m.t[j] - v0) * sc), x1 = Math.min(PW + 2, (m.e[j] - v0) * sc);
      ctx.fillStyle = use(m.w[j] === 1 ? 'cmdR' : m.w[j] === 2 ? 'cmdW' : 'cmdO');
      ctx.fillRect(LEFT + x0, r.y + 1 + m.r[j] * rh, Math.max(1, x1 - x0), Math.max(1, rh - 1));
    }
    stats[rows.indexOf(r)] = { agg: 0, detail: visible };
  }

  function integralAt(o, t) {
    var i = lowerBound(o.t, t + 1e-9) - 1;
    if (i < 0) return 0;
    return o.i[i] + o.n[i] * (t - o.t[i]);
  }
  function meanOutstanding(c) {
    var vals = new Float64Array(PW), cw = (v1 - v0) / PW, prev = integralAt(c.outs, v0);
    for (var col = 0; col < PW; col++) {
      var next = integralAt(c.outs, v0 + (col + 1) * cw);
      vals[col] = (next - prev) / cw; prev = next;
    }
    return vals;
  }

  function scaleLabel(r, text) {
    ctx.fillStyle = '#666'; ctx.font = '10px sans-serif'; ctx.textAlign = 'right';
    ctx.fillText(text, W - RIGHT - 2, r.y + 9); ctx.textAlign = 'left';
  }

  function drawArea(r, vals, key, mx, line) {
    ctx.fillStyle = use(key); ctx.strokeStyle = ctx.fillStyle;
    if (line) { ctx.beginPath(); }
    for (var col = 0; col < vals.length; col++) {
      var h = (r.h - 12) * vals[col] / mx, yy = r.y + r.h - 1 - h;
      if (line) { if (col === 0) ctx.moveTo(LEFT + col, yy); else ctx.lineTo(LEFT + col, yy); }
      else if (h > 0) ctx.fillRect(LEFT + col, yy, 1, h);
    }
    if (line) { ctx.lineWidth = 1.2; ctx.stroke(); }
  }

  function drawOut(r, c) {
    var vals = meanOutstanding(c), mx = Math.max(1, maxOf(vals));
    drawArea(r, vals, 'out', mx, false);
    scaleLabel(r, 'max ' + fmtNum(mx));
    hoverInfo[rows.indexOf(r)] = function (col) { return 'c' + c.id + ' outstanding commands (mean): ' + vals[col].toFixed(2); };
  }

  // Throughput in bins of a fixed share of the view (a single pixel would show each PDU's
  // bytes as a spike), drawn per pixel column.
  function drawTput(r, c) {
    var NB = Math.min(200, PW), bw = (v1 - v0) / NB, rd = new Float64Array(NB), wr = new Float64Array(NB);
    function add(t, b, arr) {
      var lo = lowerBound(t, v0), hi = lowerBound(t, v1);
      for (var j = lo; j < hi; j++) if (b[j]) arr[Math.min(NB - 1, Math.floor((t[j] - v0) / bw))] += b[j];
    }
    add(c.lanes[1].t, c.lanes[1].b, rd);
    add(c.lanes[0].t, c.lanes[0].b, wr);
    var rt = c.rdma.t, lo = lowerBound(rt, v0), hi = lowerBound(rt, v1);
    for (var j = lo; j < hi; j++) (c.rdma.r[j] ? rd : wr)[Math.min(NB - 1, Math.floor((rt[j] - v0) / bw))] += c.rdma.b[j];
    var rc = new Float64Array(PW), wc = new Float64Array(PW);
    for (var col = 0; col < PW; col++) {
      var b = Math.min(NB - 1, Math.floor(col * NB / PW));
      rc[col] = rd[b] / bw; wc[col] = wr[b] / bw; // bytes per µs = MB/s
    }
    var mx = Math.max(1e-9, maxOf(rc), maxOf(wc));
    if (maxOf(rc) > 0) drawArea(r, rc, 'rd', mx, true);
    if (maxOf(wc) > 0) drawArea(r, wc, 'wr', mx, true);
    scaleLabel(r, 'max ' + fmtNum(mx) + ' MB/s');
    hoverInfo[rows.indexOf(r)] = function (col) { return 'c' + c.id + ' read ' + rc[col].toFixed(1) + ' MB/s, write ' + wc[col].toFixed(1) + ' MB/s (bins of ' + fmtSpan(bw) + ')'; };
  }

  function val(v, j) { return v.clip ? Math.min(v.clip[j], val.mx) : v[j]; }
  // A series of samples (t, value): steps through each one when they are fewer than the
  // pixels, else the maximum per pixel column.
  function drawSamples(r, t, series, labelFn) {
    var lo = Math.max(0, lowerBound(t, v0) - 1), hi = Math.min(t.length, lowerBound(t, v1) + 1), mx = 1, full = 1;
    // The scale follows the series marked `scale` (bytes in flight: a window many times
    // larger would flatten it); the others are clipped at the lane's top.
    series.forEach(function (s) {
      for (var j = lo; j < hi; j++) { if (s.v[j] > full) full = s.v[j]; if (s.scale !== false && s.v[j] > mx) mx = s.v[j]; }
    });
    if (series.some(function (s) { return s.scale === false; })) mx = Math.min(full, mx * 1.25);
    val.mx = mx; // where clipped series stop
    var sc = PW / (v1 - v0), base = r.y + r.h - 1, hh = r.h - 12;
    series.forEach(function (s) {
      ctx.fillStyle = use(s.key); ctx.strokeStyle = ctx.fillStyle; ctx.lineWidth = 1.2;
      var v = s.scale === false ? { clip: s.v } : s.v;
      if (hi - lo <= PW) {
        var py = base;
        ctx.beginPath();
        for (var j = lo; j < hi; j++) {
          var x = LEFT + Math.max(-1, Math.min(PW + 1, (t[j] - v0) * sc)), yy = base - hh * val(v, j) / mx;
          if (j === lo) ctx.moveTo(x, yy); else { ctx.lineTo(x, py); ctx.lineTo(x, yy); }
          py = yy;
        }
        if (hi > lo) ctx.lineTo(LEFT + Math.min(PW, (t[hi - 1] - v0) * sc + 1), py);
        if (s.area) { ctx.globalAlpha = 0.35; ctx.lineTo(LEFT + Math.min(PW, (t[hi - 1] - v0) * sc), base); ctx.lineTo(LEFT + Math.max(0, (t[lo] - v0) * sc), base); ctx.fill(); ctx.globalAlpha = 1; }
        else ctx.stroke();
      } else {
        var colMax = new Float64Array(PW), any = new Uint8Array(PW);
        for (var j2 = lo; j2 < hi; j2++) {
          var col = Math.floor((t[j2] - v0) * sc);
          if (col < 0 || col >= PW) continue;
          if (val(v, j2) >= colMax[col]) colMax[col] = val(v, j2);
          any[col] = 1;
        }
        for (col = 0; col < PW; col++) if (any[col]) {
          var h = hh * colMax[col] / mx;
          if (s.area) ctx.fillRect(LEFT + col, base - h, 1, h); else ctx.fillRect(LEFT + col, base - h - 1, 1, 2);
        }
      }
    });
    scaleLabel(r, full > mx ? 'scale ' + fmtNum(mx) + ' (clipped, up to ' + fmtNum(full) + ')' : 'max ' + fmtNum(mx));
    hoverInfo[rows.indexOf(r)] = function (col) {
      var tm = tOf(LEFT + col + 0.5), j = Math.min(t.length - 1, Math.max(0, lowerBound(t, tm) - 1));
      return t.length ? labelFn(j) : '';
    };
  }

  // Idle stretches (pairs of start, end in c.idle) shaded behind the PDU and command lanes.
  function drawIdle(r, c) {
    var g = c.idle, sc = PW / (v1 - v0);
    for (var i = 0; i + 1 < g.length; i += 2) {
      if (g[i + 1] < v0 || g[i] > v1) continue;
      var x0 = Math.max(0, (g[i] - v0) * sc), x1 = Math.min(PW, (g[i + 1] - v0) * sc);
      if (x1 - x0 < 0.5) continue;
      ctx.fillStyle = use('idle');
      ctx.fillRect(LEFT + x0, r.y, x1 - x0, r.h);
    }
  }

  function drawEvents(r, c) {
    var sc = PW / (v1 - v0);
    c.ev.forEach(function (e) {
      if (e[0] < v0 || e[0] > v1) return;
      ctx.fillStyle = use('ev' + e[2]);
      ctx.fillRect(LEFT + (e[0] - v0) * sc - 1, r.y, 2, r.h);
    });
  }

  var drawn = 0;
  function redraw() {
    ctx.clearRect(0, 0, W, HEIGHT_PX);
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, W, HEIGHT_PX);
    axis();
    ctx.save();
    ctx.beginPath(); ctx.rect(LEFT, 0, PW, HEIGHT_PX); ctx.clip();
    rows.forEach(function (r) {
      var c = conns[r.c];
      ctx.fillStyle = '#fafafa'; ctx.fillRect(LEFT, r.y, PW, r.h);
      if (r.type === 'pdu' || r.type === 'cmd') drawIdle(r, c);
      if (r.type === 'pdu') drawPdus(r, c);
      else if (r.type === 'cmd') drawCmds(r, c);
      else if (r.type === 'out') drawOut(r, c);
      else if (r.type === 'tput') drawTput(r, c);
      else if (r.type === 'win') {
        var w = c.win[r.w];
        drawSamples(r, w.t, [{ key: 'fl', v: w.f, area: true }, { key: 'win', v: w.w, scale: false }], function (j) {
          return 'c' + c.id + (w.dir ? ' \u2190' : ' \u2192') + ' at ' + fmtTime(w.t[j]).trim() + ' s: ' + w.f[j] + ' bytes in flight, window ' + w.w[j];
        });
      } else if (r.type === 'ev') drawEvents(r, c);
      else if (r.type === 'cwnd') drawSamples(r, c.ti.t, [{ key: 'cwnd', v: c.ti.cwnd }], function (j) { return c.ti.name + ' at ' + fmtTime(c.ti.t[j]).trim() + ' s: cwnd ' + c.ti.cwnd[j] + ' segments (' + c.ti.how + ')'; });
      else if (r.type === 'rtt') drawSamples(r, c.ti.t, [{ key: 'rtt', v: c.ti.rtt }], function (j) { return c.ti.name + ' at ' + fmtTime(c.ti.t[j]).trim() + ' s: rtt ' + c.ti.rtt[j] + ' us (' + c.ti.how + ')'; });
    });
    ctx.restore();
    ctx.fillStyle = '#222'; ctx.font = '11px sans-serif';
    rows.forEach(function (r) {
      ctx.fillText(r.label.length > 32 ? r.label.slice(0, 31) + '\u2026' : r.label, 4, r.y + Math.min(r.h, 22) / 2 + 4);
    });
    document.getElementById('range').textContent = fmtSpan(v0) + ' \u2013 ' + fmtSpan(v1) + ' (' + fmtSpan(v1 - v0) + ' shown)';
    drawn++;
  }

  function legend() {
    var el = document.getElementById('legend');
    LEGEND.forEach(function (l) {
      var it = document.createElement('span');
      it.className = 'item'; it.setAttribute('data-key', l[0]);
      var sw = document.createElement('span');
      sw.className = 'sw'; sw.style.background = l[1];
      it.appendChild(sw); it.appendChild(document.createTextNode(l[2]));
      el.appendChild(it);
    });
  }

  // ---- interaction ----
  function setView(a, b) {
    var span = Math.min(Math.max(b - a, MIN_SPAN), Math.max(D.span, MIN_SPAN));
    a = Math.max(0, Math.min(a, Math.max(D.span, MIN_SPAN) - span));
    v0 = a; v1 = a + span;
    redraw();
  }
  function zoomAt(x, f) {
    var ta = tOf(Math.max(LEFT, Math.min(LEFT + PW, x)));
    setView(ta - (ta - v0) * f, ta + (v1 - ta) * f);
  }
  function local(ev) { var b = canvas.getBoundingClientRect(); return { x: ev.clientX - b.left, y: ev.clientY - b.top }; }
  canvas.addEventListener('wheel', function (ev) {
    ev.preventDefault();
    zoomAt(local(ev).x, ev.deltaY < 0 ? 1 / 1.5 : 1.5);
  }, { passive: false });
  document.getElementById('zin').onclick = function () { zoomAt(LEFT + PW / 2, 1 / 2); };
  document.getElementById('zout').onclick = function () { zoomAt(LEFT + PW / 2, 2); };
  document.getElementById('zreset').onclick = function () { setView(0, D.span); };
  canvas.addEventListener('dblclick', function () { setView(0, D.span); });
  var drag = null, pending = false;
  canvas.addEventListener('mousedown', function (ev) { drag = { x: local(ev).x, v0: v0, v1: v1 }; canvas.style.cursor = 'grabbing'; });
  window.addEventListener('mouseup', function () { drag = null; canvas.style.cursor = ''; });

  function hoverText(px, py) {
    var ri = -1;
    for (var i = 0; i < rows.length; i++) if (py >= rows[i].y && py < rows[i].y + rows[i].h) ri = i;
    if (ri < 0 || px < LEFT || px >= LEFT + PW) return '';
    var r = rows[ri], c = conns[r.c], col = Math.floor(px - LEFT), sc = PW / (v1 - v0);
    if (r.type === 'pdu') {
      var l = c.lanes[r.l], t = l.t, tm = tOf(px), best = 1e9, hits = [];
      var j0 = lowerBound(t, tm - 6 / sc - l.maxD), j1 = lowerBound(t, tm + 6 / sc);
      for (var j = j0; j < j1 && j < j0 + 100000; j++) {
        var xa = xOf(t[j] - l.d[j]), xb = xOf(t[j]), dist = px < xa ? xa - px : px > xb + 1.5 ? px - xb - 1.5 : 0;
        if (dist > 6) continue;
        if (dist < best - 0.5) { best = dist; hits = [j]; } else if (dist <= best + 0.5) hits.push(j);
      }
      if (!hits.length) return '';
      var out = hits.slice(0, 8).map(function (j) {
        return fmtTime(t[j]) + ' c' + c.id + ' ' + l.arrow + ' ' + expand(l.lines, j);
      });
      if (hits.length > 8) out.push('... ' + (hits.length - 8) + ' more at this point');
      var st = stats[ri];
      if (st && st.cnt && st.cnt[col] > D.agg) out.push('(' + st.cnt[col] + ' PDUs in this pixel column: zoom in)');
      return out.join('\n');
    }
    if (r.type === 'cmd') {
      var m = c.cmds, rh = (r.h - 2) / m.rows, row = Math.floor((py - r.y - 1) / rh), tm2 = tOf(px), tol = 2 / sc;
      var a = lowerBound(m.t, tm2 - m.maxDur - tol), b = lowerBound(m.t, tm2 + tol), found = -1, n = 0;
      for (var k = a; k < b && k < a + 200000; k++) {
        if (m.e[k] + tol < tm2) continue;
        n++;
        if (found < 0 && m.r[k] === row) found = k;
      }
      if (found < 0) return n ? 'c' + c.id + ': ' + n + ' commands active here' : '';
      return 'c' + c.id + ' ' + expand(m.lines, found) + '\nfrom ' + fmtTime(m.t[found]).trim() + ' s, ' +
        (m.d[found] < 0 ? 'no status in the capture' : 'latency ' + m.d[found] + ' us') + (n > 1 ? ' (' + n + ' active here)' : '');
    }
    if (r.type === 'ev') {
      var near = null, bd = 6;
      c.ev.forEach(function (e) { var d = Math.abs(xOf(e[0]) - px); if (d <= bd) { bd = d; near = e; } });
      return near ? 'c' + c.id + (near[1] ? ' \u2190 ' : ' \u2192 ') + EVENT_NAMES[near[2]] + ' at ' + fmtTime(near[0]).trim() + ' s: frame ' + near[3] + ' stream offset ' + near[4] + ' len ' + near[5] : '';
    }
    return hoverInfo[ri] ? hoverInfo[ri](col) : '';
  }
  canvas.addEventListener('mousemove', function (ev) {
    var p = local(ev);
    if (drag) {
      var dt = (p.x - drag.x) * (drag.v1 - drag.v0) / PW;
      if (!pending) {
        pending = true;
        requestAnimationFrame(function () { pending = false; if (drag) setView(drag.v0 - dt, drag.v1 - dt); });
      }
      return;
    }
    var text = hoverText(p.x, p.y);
    tip.textContent = text;
    tip.style.display = text ? 'block' : 'none';
    tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 420) + 'px';
    tip.style.top = (ev.clientY + 14) + 'px';
  });
  canvas.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
  window.addEventListener('resize', function () { resize(); redraw(); });

  // ---- first drawing ----
  document.getElementById('title').textContent = D.title;
  legend();
  resize();
  redraw();
  var T_DRAWN = performance.now();
  var status = document.getElementById('status');
  status.setAttribute('data-render-ms', (T_DRAWN - T0).toFixed(0));
  // performance.now() counts from the navigation: T0 is when the page's bytes were loaded
  // and parsed up to this script.
  status.setAttribute('data-first-render-ms', T_DRAWN.toFixed(0));
  status.textContent = 'page loaded in ' + T0.toFixed(0) + ' ms, data decoded in ' + (T_DECODED - T0).toFixed(0) + ' ms, drawn in ' + (T_DRAWN - T_DECODED).toFixed(0) +
    ' ms; ' + Object.keys(used).length + ' colours in use; a column holding more than ' + D.agg + ' PDUs of a lane is drawn as a density bar.';

  // ---- self-test (#selftest): legend, lanes, zoom from aggregate to detail, hover ----
  function selftest() {
    var why = [], legendKeys = {};
    Array.prototype.forEach.call(document.querySelectorAll('#legend .item'), function (it) { legendKeys[it.getAttribute('data-key')] = true; });
    Object.keys(used).forEach(function (k) { if (!legendKeys[k]) why.push('colour ' + k + ' has no legend entry'); });
    var want = 0;
    D.conns.forEach(function (c, ci) {
      var types = ['pdu', 'cmd', 'out', 'tput', 'ev'].concat(c.ti ? ['cwnd', 'rtt'] : []);
      want += 6 + c.win.length + (c.ti ? 2 : 0);
      types.forEach(function (ty) {
        if (!rows.some(function (r) { return r.c === ci && r.type === ty && r.h > 0 && r.y + r.h <= HEIGHT_PX; })) why.push('c' + c.id + ' has no ' + ty + ' lane');
      });
    });
    if (rows.length !== want) why.push(rows.length + ' lanes, expected ' + want);
    var st = D.st, ri = -1;
    rows.forEach(function (r, i) { if (r.type === 'pdu' && r.c === st.c && r.l === st.l) ri = i; });
    var r = rows[ri], lane = conns[st.c].lanes[st.l];
    function colAt(t) { return Math.max(0, Math.min(PW - 1, Math.floor(xOf(t) - LEFT))); }
    // Of the candidates (PDUs alone at their time, with their listing lines from the Rust
    // side), the one in the fullest pixel column.
    var pick = st.cand[0];
    st.cand.forEach(function (c) { if (stats[ri].cnt[colAt(lane.t[c[0]])] > stats[ri].cnt[colAt(lane.t[pick[0]])]) pick = c; });
    st = { j: pick[0], line: pick[1] };
    var tt = lane.t[st.j];
    function colOf() { return colAt(tt); }
    var span0 = v1 - v0, cnt0 = stats[ri].cnt[colOf()], agg0 = stats[ri].agg;
    if (!(cnt0 > D.agg)) why.push('the PDU\'s column was not aggregated at full view (' + cnt0 + ' PDUs)');
    var box = canvas.getBoundingClientRect(), cy = box.top + r.y + r.h / 2, wheels = 0;
    while (wheels < 80 && stats[ri].cnt[colOf()] > D.agg && v1 - v0 > MIN_SPAN) {
      canvas.dispatchEvent(new WheelEvent('wheel', { deltaY: -120, clientX: box.left + xOf(tt), clientY: cy, bubbles: true, cancelable: true }));
      wheels++;
    }
    var span1 = v1 - v0, cnt1 = stats[ri].cnt[colOf()], det1 = stats[ri].detail;
    // Then on until no other mark is within a few pixels, so that the hover is unambiguous.
    function crowded() {
      var j = st.j, t = lane.t, d = lane.d, x = xOf(tt);
      return (j > 0 && x - xOf(t[j - 1]) < 8) || (j + 1 < t.length && xOf(t[j + 1] - d[j + 1]) - x < 8);
    }
    while (wheels < 120 && crowded() && v1 - v0 > MIN_SPAN) {
      canvas.dispatchEvent(new WheelEvent('wheel', { deltaY: -120, clientX: box.left + xOf(tt), clientY: cy, bubbles: true, cancelable: true }));
      wheels++;
    }
    if (!(span1 < span0)) why.push('the span did not shrink');
    if (!(cnt1 <= D.agg && det1 > 0)) why.push('still aggregated after zooming (' + cnt1 + ' PDUs in the column)');
    var hx = (xOf(tt - lane.d[st.j]) + xOf(tt)) / 2;
    canvas.dispatchEvent(new MouseEvent('mousemove', { clientX: box.left + hx, clientY: cy, bubbles: true }));
    var shown = tip.textContent;
    if (tip.style.display !== 'block' || shown.split('\n').indexOf(st.line) < 0) why.push('hover showed "' + shown.replace(/\n/g, ' / ') + '", not "' + st.line + '"');
    var pre = document.createElement('pre');
    pre.id = 'selftest';
    pre.textContent = (why.length ? 'FAIL ' + why.join('; ') : 'PASS') + ' lanes=' + rows.length + ' legend=' +
      Object.keys(legendKeys).length + ' colours=' + Object.keys(used).length + ' wheel_events=' + wheels + ' span ' +
      fmtSpan(span0) + ' -> ' + fmtSpan(span1) + ' column=' + cnt0 + '->' + cnt1 + ' PDUs (aggregate columns ' + agg0 +
      ', detail marks ' + det1 + ') render_ms=' + (T_DRAWN - T0).toFixed(0) + ' hover="' + st.line.trim() + '"';
    document.body.appendChild(pre);
  }
  if (location.hash === '#selftest' && D.st) setTimeout(selftest, 0);
})();
