/* probe head view: one example's attention, drawn from data inlined beside this script.
 * Plain JavaScript, no library, no network request, no eval: it runs under a Content-Security-Policy
 * of "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'".
 *
 * Markup (probe/view/html.py): a div of class "probe-hv" holding a style element, a JSON script element
 * of class "probe-hv-data" (the data, probe/view/data.py) and a script element with this file.
 * The script mounts the view it sits in (document.currentScript's parent), so several views on one page
 * (a notebook) each mount their own. Its one page-level name is the namespace probeViews, where it puts its
 * draw function probeViews.headView(element, data): the live page and the notebook widget draw with it. Token text is only ever drawn with
 * canvas fillText or set as textContent, never parsed as HTML.
 *
 * Drawing: two token columns (queries left, keys right) on one canvas the height of the visible window
 * (virtualized: only visible rows are drawn, lines to rows outside the window leave it at its edge), and a
 * strip per selected head with the focused token's whole row (or column) as a heatmap. Hover a token on
 * the left to see where it attends, on the right to see what attends to it; click to pin; arrow keys
 * move a pinned token. With no token hovered or pinned (as at load) every token's lines are drawn, each
 * line's opacity its weight (as bertviz's head view does). Lines are drawn for probabilities >= the line
 * threshold, the strip shows all.
 * Word mode aggregates the token maps: to a word = sum over its tokens, from a word = mean over them.
 * Each layer (site) has its own query and key tokens (data.sides, data.axes): an encoder-decoder model's
 * decoder self-attention is drawn target x target, its cross-attention target (left) x source (right).
 * The mounted element gets a small API, element.probeView (state, lines drawn, timings) used by tests.
 */
(function (script) {
  "use strict";
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#ad494a"];
  var FONT = "12px sans-serif", ROW = 18, MAX_H = 520, STRIP = 12, STRIP_LEFT = 26, LABEL_CHARS = 24;
  var ALPHA_LEVELS = 20;  // opacity steps of the lines drawn for every token (each line's weight rounded up)

  function headColor(h) {
    if (h < PALETTE.length) return PALETTE[h];
    return "hsl(" + Math.round((h * 137.508) % 360) + ",60%," + (h % 2 ? 38 : 52) + "%)";
  }
  function short(s, k) { return s.length > k ? s.slice(0, k - 1) + "\u2026" : s; }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function decode(enc, size, scale) {
    var out = new Float32Array(size), p = 0;
    for (var i = 0; i < enc.length; i++) {
      var v = enc[i];
      if (v < 0) p -= v; else out[p++] = v / scale;
    }
    return out;
  }

  function View(root, data, t0) {
    if (!data.sides) {  // data of version 1: one side for every layer
      data.sides = [{tokens: data.tokens, units: data.units, unitLabels: data.unitLabels}];
      data.axes = data.layers.map(function () { return [0, 0]; });
    }
    this.root = root; this.data = data; this.t0 = t0;
    this.S = {layer: data.initial.layer, heads: data.initial.heads.slice(), mode: "tokens", hover: null, pin: null,
              threshold: data.threshold};
    this.cache = {}; this.lastLines = []; this.lastStrip = {}; this.geom = {}; this.pending = false;
    this.timings = {mountMs: 0, firstDrawMs: null, firstDrawAt: null, lastDrawMs: null, draws: 0};
  }
  var V = View.prototype;

  // ------------------------------------------------------------------ data
  V.sideOf = function (li, side) { return this.data.sides[this.data.axes[li][side === "q" ? 0 : 1]]; };
  function unitsOf(sd) {  // a side without word ids: each token its own unit
    if (sd.units) return {units: sd.units, labels: sd.unitLabels};
    return {units: sd.tokens.map(function (_, i) { return i; }), labels: sd.tokens};
  }
  V.tokenMatrix = function (li, h) {
    var key = li + ":" + h + ":t", enc = this.data.maps[li][h];
    var nq = this.sideOf(li, "q").tokens.length, nk = this.sideOf(li, "k").tokens.length;
    if (this.cache[key] === undefined) this.cache[key] = enc === null ? null : decode(enc, nq * nk, this.data.scale);
    return this.cache[key];
  };
  V.wordMatrix = function (li, h) {  // to a unit: sum over its tokens; from a unit: mean over its tokens
    var key = li + ":" + h + ":w";
    if (this.cache[key] !== undefined) return this.cache[key];
    var a = this.tokenMatrix(li, h);
    if (a === null) return (this.cache[key] = null);
    var Q = unitsOf(this.sideOf(li, "q")), K = unitsOf(this.sideOf(li, "k"));
    var nq = Q.units.length, nk = K.units.length, UQ = Q.labels.length, UK = K.labels.length;
    var w = new Float32Array(UQ * UK), count = new Float32Array(UQ);
    for (var q = 0; q < nq; q++) {
      var uq = Q.units[q] * UK, row = q * nk;
      count[Q.units[q]] += 1;
      for (var k = 0; k < nk; k++) w[uq + K.units[k]] += a[row + k];
    }
    for (var u = 0; u < UQ; u++) for (var v = 0; v < UK; v++) w[u * UK + v] /= count[u];
    return (this.cache[key] = w);
  };
  V.matrix = function (li, h) { return this.S.mode === "words" ? this.wordMatrix(li, h) : this.tokenMatrix(li, h); };
  V.labels = function (side) {  // the current layer's query ("q") or key ("k") labels in the current mode
    var sd = this.sideOf(this.S.layer, side);
    return this.S.mode === "words" ? unitsOf(sd).labels : sd.tokens;
  };
  V.size = function (side) { return this.labels(side).length; };
  V.rows = function () { return Math.max(this.size("q"), this.size("k")); };
  V.other = function (side) { return side === "q" ? "k" : "q"; };
  V.headName = function (h) { var n = this.data.headNames; return n ? n[this.S.layer][h] : "H" + h; };
  V.weight = function (m, side, f, j) { var K = this.size("k"); return side === "q" ? m[f * K + j] : m[j * K + f]; };
  V.focus = function () { return this.S.pin || this.S.hover; };
  V.shown = function () {  // selected heads that are there, and their matrices
    var self = this, heads = this.S.heads.filter(function (h) { return self.matrix(self.S.layer, h) !== null; });
    return {heads: heads, mats: heads.map(function (h) { return self.matrix(self.S.layer, h); })};
  };

  // ------------------------------------------------------------------ DOM
  function option(text, value) { var o = el("option", null, text); o.value = value; return o; }
  function labelled(text, control) {
    var s = el("label"); s.appendChild(document.createTextNode(text + " ")); s.appendChild(control); return s;
  }
  V.build = function () {
    var data = this.data, root = this.root, self = this;
    if (data.title) root.appendChild(el("div", "hv-title", data.title));
    (data.notes || []).forEach(function (t) { root.appendChild(el("div", "hv-note", t)); });
    var bar = el("div", "hv-bar");
    this.layerSel = el("select"); this.modeSel = el("select"); this.thrSel = el("select");
    data.layers.forEach(function (l, i) {
      var o = option(data.layerTitles ? data.layerTitles[i] : "layer " + l, String(i));
      o.title = data.layerNames[i]; self.layerSel.appendChild(o);
    });
    ["tokens", "words"].forEach(function (m) {
      var o = option(m, m); o.disabled = m === "words" && !data.units; self.modeSel.appendChild(o);
    });
    var thresholds = [0.001, 0.01, 0.05, 0.1, 0.2];
    if (thresholds.indexOf(data.threshold) < 0) thresholds.push(data.threshold);
    thresholds.sort(function (a, b) { return a - b; }).forEach(function (t) {
      self.thrSel.appendChild(option("\u2265 " + t, String(t)));
    });
    this.thrSel.value = String(data.threshold);
    this.layerSel.value = String(this.S.layer);  // the initial layer, as drawn
    this.headsBox = el("span", "hv-heads");
    this.allBtn = el("button", null, "all"); this.noneBtn = el("button", null, "none");
    this.allBtn.type = this.noneBtn.type = "button";
    [labelled("layer", this.layerSel), this.headsBox, this.allBtn, this.noneBtn, labelled("units", this.modeSel),
     labelled("lines", this.thrSel)].forEach(function (e) { bar.appendChild(e); });
    root.appendChild(bar);
    this.strip = el("canvas", "hv-strip"); this.scroller = el("div", "hv-scroll");
    this.canvas = el("canvas"); this.spacer = el("div");
    this.canvas.tabIndex = 0;
    this.scroller.appendChild(this.canvas); this.scroller.appendChild(this.spacer);
    this.status = el("div", "hv-status"); this.tip = el("div", "hv-tip"); this.axesNote = el("div", "hv-status");
    [this.axesNote, this.strip, this.scroller, this.status, this.tip].forEach(function (e) { root.appendChild(e); });
    root.appendChild(el("div", "hv-status", "Hover a token: on the left, where it attends (its row); on the right, " +
      "what attends to it (its column); with none hovered, every token's lines, each as opaque as its weight. " +
      "Click to pin, arrow keys to move, Esc to unpin. Lines for probabilities " +
      "at or above the line threshold; the strip above shows every key of the row, one band per head."));
  };
  V.buildHeads = function () {
    var data = this.data, S = this.S, box = this.headsBox, self = this;
    while (box.firstChild) box.removeChild(box.firstChild);
    for (var h = 0; h < data.heads; h++) {
      var removed = data.removed[S.layer][h], lab = el("label", "hv-head" + (removed ? " hv-removed" : ""));
      var input = el("input"), sw = el("span", "hv-sw"), name = data.headLabels[S.layer][h];
      input.type = "checkbox"; input.value = String(h); input.checked = S.heads.indexOf(h) >= 0; input.disabled = removed;
      sw.style.background = headColor(h);
      lab.title = this.headName(h) + (removed ? ": removed" : name ? ": " + name : "");
      lab.appendChild(input); lab.appendChild(sw); lab.appendChild(document.createTextNode(String(h)));
      input.addEventListener("change", function () { self.readHeads(); });
      box.appendChild(lab);
    }
  };
  V.readHeads = function () {
    var heads = [];
    this.headsBox.querySelectorAll("input").forEach(function (b) { if (b.checked) heads.push(Number(b.value)); });
    this.S.heads = heads;
    this.draw();
  };

  // ------------------------------------------------------------------ layout and drawing
  V.stripHeight = function () { return Math.max(1, this.S.heads.length) * STRIP + 4; };
  V.layout = function () {
    var dpr = window.devicePixelRatio || 1, ctx = this.canvas.getContext("2d"), labs = this.labels("q").concat(this.labels("k"));
    var m = this.rows(), key = this.S.layer + ":" + this.S.mode;
    ctx.font = FONT;
    var lw = 0, sw = 0;
    for (var i = 0; i < labs.length; i++) lw = Math.max(lw, ctx.measureText(short(labs[i], LABEL_CHARS)).width);
    ctx.font = "10px sans-serif";
    for (var h = 0; h < this.data.heads; h++) sw = Math.max(sw, ctx.measureText(this.headName(h)).width);
    this.stripLeft = Math.max(STRIP_LEFT, Math.ceil(sw) + 6);
    var labelW = Math.min(190, Math.ceil(lw) + 14), avail = this.root.clientWidth || 720;
    var W = Math.max(2 * labelW + 100, Math.min(avail - 4, 2 * labelW + 360)), total = m * ROW, vh = Math.min(total, MAX_H);
    var sh = this.stripHeight();
    this.geom = {W: W, vh: vh, labelW: labelW, total: total, dpr: dpr, m: m, key: key, avail: avail, sh: sh};
    sizeCanvas(this.canvas, W, vh, dpr); sizeCanvas(this.strip, W, sh, dpr);
    this.scroller.style.height = vh + "px"; this.scroller.style.width = (W + 2) + "px";
    this.spacer.style.height = Math.max(0, total - vh) + "px";
  };
  function sizeCanvas(canvas, w, h, dpr) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
    canvas.style.width = w + "px"; canvas.style.height = h + "px";
  }
  V.y = function (r) { return r * ROW - this.scroller.scrollTop + ROW / 2; };

  V.draw = function () {
    var t = performance.now(), g, f = this.focus(), sel = this.shown();
    if (this.geom.key !== this.S.layer + ":" + this.S.mode || this.geom.sh !== this.stripHeight()) this.layout();
    g = this.geom;
    var ctx = this.canvas.getContext("2d");
    ctx.setTransform(g.dpr, 0, 0, g.dpr, 0, 0);
    ctx.clearRect(0, 0, g.W, g.vh);
    this.drawLines(ctx, sel, f);
    this.drawLabels(ctx, sel, f);
    this.drawStrip(sel, f);
    this.status.textContent = f ? (f.side === "q" ? "query " : "key ") + JSON.stringify(this.labels(f.side)[f.i]) + " (" + f.i + ")" +
      (this.S.pin ? ", pinned" : "") + ": " + this.lastLines.length + " line(s)" :
      sel.heads.length ? "every token: " + this.lastLines.length + " line(s) in view, opacity = weight; hover a token for its own" : "";
    this.root.setAttribute("data-focus", f ? f.side + ":" + f.i : "");
    var q = this.sideOf(this.S.layer, "q").name, k = this.sideOf(this.S.layer, "k").name;
    this.axesNote.textContent = this.data.sides.length > 1 ? "left: " + q + " tokens (queries); right: " + k +
      " tokens (keys)" : "";
    var tm = this.timings, now = performance.now();
    tm.draws += 1; tm.lastDrawMs = now - t;
    if (tm.firstDrawMs === null) { tm.firstDrawMs = now - this.t0; tm.firstDrawAt = now; }
    this.root.setAttribute("data-draws", String(tm.draws));
  };
  V.drawLines = function (ctx, sel, f) {  // lines from the focused token, weights >= threshold
    this.lastLines = [];
    if (!f) { this.drawAllLines(ctx, sel); return; }
    var g = this.geom, m = this.size(this.other(f.side)), x1 = g.labelW, x2 = g.W - g.labelW;
    ctx.lineWidth = 2;
    for (var hi = 0; hi < sel.heads.length; hi++) {
      ctx.strokeStyle = headColor(sel.heads[hi]);
      for (var j = 0; j < m; j++) {
        var w = this.weight(sel.mats[hi], f.side, f.i, j);
        if (!(w + 1e-6 >= this.S.threshold)) continue;  // float32 data: 0.01 is stored as 0.0099999998
        var q = f.side === "q" ? f.i : j, k = f.side === "q" ? j : f.i;
        this.lastLines.push({head: sel.heads[hi], query: q, key: k, weight: w});
        ctx.globalAlpha = Math.min(1, 0.15 + 0.85 * w);
        ctx.beginPath(); ctx.moveTo(x1, this.y(q)); ctx.lineTo(x2, this.y(k)); ctx.stroke();
      }
    }
    ctx.globalAlpha = 1;
  };
  V.drawAllLines = function (ctx, sel) {  // no focus (as at load): every query's lines, opacity = weight
    var g = this.geom, nq = this.size("q"), nk = this.size("k"), x1 = g.labelW, x2 = g.W - g.labelW;
    var top = this.scroller.scrollTop, r0 = Math.floor(top / ROW), r1 = Math.ceil((top + g.vh) / ROW);
    ctx.lineWidth = 1;
    for (var hi = 0; hi < sel.heads.length; hi++) {
      var mat = sel.mats[hi], paths = [];  // one path per opacity level (1/ALPHA_LEVELS steps): few strokes
      for (var q = 0; q < nq; q++) {
        for (var k = 0; k < nk; k++) {
          var w = mat[q * nk + k];
          if (!(w + 1e-6 >= this.S.threshold)) continue;
          if ((q < r0 && k < r0) || (q > r1 && k > r1)) continue;  // both ends outside the window: not drawn
          this.lastLines.push({head: sel.heads[hi], query: q, key: k, weight: w});
          var level = Math.max(1, Math.min(ALPHA_LEVELS, Math.ceil(w * ALPHA_LEVELS)));
          (paths[level] = paths[level] || []).push(q, k);
        }
      }
      ctx.strokeStyle = headColor(sel.heads[hi]);
      for (var lv = 1; lv <= ALPHA_LEVELS; lv++) {
        var pts = paths[lv];
        if (!pts) continue;
        ctx.globalAlpha = lv / ALPHA_LEVELS;
        ctx.beginPath();
        for (var i = 0; i < pts.length; i += 2) { ctx.moveTo(x1, this.y(pts[i])); ctx.lineTo(x2, this.y(pts[i + 1])); }
        ctx.stroke();
      }
    }
    ctx.globalAlpha = 1;
  };
  V.drawLabels = function (ctx, sel, f) {  // visible rows only; the other side shaded by the strongest head
    var g = this.geom, top = this.scroller.scrollTop, x2 = g.W - g.labelW, both = [this.labels("q"), this.labels("k")];
    var r0 = Math.max(0, Math.floor(top / ROW)), r1 = Math.min(g.m - 1, Math.ceil((top + g.vh) / ROW));
    ctx.font = FONT; ctx.textBaseline = "middle";
    for (var r = r0; r <= r1; r++) {
      var y = this.y(r);
      for (var side = 0; side < 2; side++) {
        if (r >= both[side].length) continue;
        var text = short(both[side][r], LABEL_CHARS);
        var isQ = side === 0, x0 = isQ ? 0 : x2, here = f && f.i === r && (f.side === "q") === isQ;
        if (here) {
          ctx.fillStyle = "#333"; ctx.fillRect(x0 + 2, y - ROW / 2 + 1, g.labelW - 4, ROW - 2);
        } else if (f && (f.side === "q") !== isQ) {
          var best = 0, bh = -1;
          for (var hi = 0; hi < sel.heads.length; hi++) {
            var v = this.weight(sel.mats[hi], f.side, f.i, r);
            if (v > best) { best = v; bh = sel.heads[hi]; }
          }
          if (bh >= 0) {
            ctx.globalAlpha = Math.min(1, best); ctx.fillStyle = headColor(bh);
            ctx.fillRect(x0 + 2, y - ROW / 2 + 1, g.labelW - 4, ROW - 2); ctx.globalAlpha = 1;
          }
        }
        ctx.fillStyle = here ? "#fff" : "#222";
        ctx.textAlign = isQ ? "right" : "left";
        ctx.fillText(text, isQ ? g.labelW - 6 : x2 + 6, y);
      }
    }
  };
  V.drawStrip = function (sel, f) {  // the focused token's whole row (or column), one band per head
    var g = this.geom, ctx = this.strip.getContext("2d"), x0 = this.stripLeft || STRIP_LEFT;
    var m = f ? this.size(this.other(f.side)) : 1, cw = (g.W - x0) / m;
    ctx.setTransform(g.dpr, 0, 0, g.dpr, 0, 0);
    ctx.clearRect(0, 0, g.W, g.sh);
    ctx.font = "10px sans-serif"; ctx.textBaseline = "middle"; ctx.textAlign = "left";
    this.lastStrip = {};
    if (!f || !sel.heads.length) {
      ctx.fillStyle = "#888"; ctx.font = FONT;
      ctx.fillText(sel.heads.length ? "hover a token to see its whole row here" : "no head selected", 4, STRIP / 2 + 1);
      return;
    }
    for (var hi = 0; hi < sel.heads.length; hi++) {
      var y0 = hi * STRIP, vals = [], color = headColor(sel.heads[hi]);
      ctx.fillStyle = color; ctx.fillText(this.headName(sel.heads[hi]), 2, y0 + STRIP / 2);
      ctx.fillStyle = "#f2f2f2"; ctx.fillRect(x0, y0, g.W - x0, STRIP - 2);
      ctx.fillStyle = color;
      for (var j = 0; j < m; j++) {
        var w = this.weight(sel.mats[hi], f.side, f.i, j);
        vals.push(w);
        if (w > 0) { ctx.globalAlpha = Math.min(1, w); ctx.fillRect(x0 + j * cw, y0, Math.max(1, cw), STRIP - 2); }
      }
      ctx.globalAlpha = 1;
      this.lastStrip[sel.heads[hi]] = vals;
    }
    if (this.data.axes[this.S.layer][0] === this.data.axes[this.S.layer][1]) {  // same tokens: mark the focus
      ctx.fillStyle = "#000";
      ctx.fillRect(x0 + f.i * cw + Math.max(1, cw) / 2 - 0.5, sel.heads.length * STRIP, 1, 4);
    }
  };
  V.schedule = function () {
    var self = this;
    if (!this.pending) { this.pending = true; requestAnimationFrame(function () { self.pending = false; self.draw(); }); }
  };

  // ------------------------------------------------------------------ events
  V.at = function (e) {  // the token under the mouse: {side: "q" | "k", i} or null
    var rect = this.canvas.getBoundingClientRect(), x = e.clientX - rect.left;
    var i = Math.floor((e.clientY - rect.top + this.scroller.scrollTop) / ROW);
    var side = x < this.geom.labelW ? "q" : x > this.geom.W - this.geom.labelW ? "k" : null;
    if (side === null || i < 0 || i >= this.size(side)) return null;
    return {side: side, i: i};
  };
  V.stripIndex = function (e) {
    var f = this.focus(), x0 = this.stripLeft || STRIP_LEFT;
    if (!f) return -1;
    var rect = this.strip.getBoundingClientRect(), m = this.size(this.other(f.side));
    var j = Math.floor((e.clientX - rect.left - x0) / ((this.geom.W - x0) / m));
    return j >= 0 && j < m ? j : -1;
  };
  V.showTip = function (e, p) {
    var tip = this.tip, f = this.focus(), self = this;
    if (!p) { tip.style.display = "none"; return; }
    var lines = [JSON.stringify(this.labels(p.side)[p.i]) + " (" + (p.side === "q" ? "query " : "key ") + p.i + ")"];
    if (f && f.side !== p.side) {
      this.S.heads.forEach(function (h) {
        var mat = self.matrix(self.S.layer, h);
        if (mat !== null) lines.push(self.headName(h) + ": " + self.weight(mat, f.side, f.i, p.i).toFixed(3));
      });
    }
    var box = this.root.getBoundingClientRect();
    tip.textContent = lines.join("\n");
    tip.style.display = "block";
    tip.style.left = (e.clientX - box.left + 14) + "px"; tip.style.top = (e.clientY - box.top + 14) + "px";
  };
  V.key = function (e) {  // Esc unpins; arrow keys move the pinned (or hovered) token
    var S = this.S, f = S.pin || S.hover, sc = this.scroller;
    if (e.key === "Escape") { S.pin = null; this.draw(); return; }
    if (!f || (e.key !== "ArrowUp" && e.key !== "ArrowDown")) return;
    e.preventDefault();
    var i = Math.max(0, Math.min(this.size(f.side) - 1, f.i + (e.key === "ArrowUp" ? -1 : 1)));
    S.pin = {side: f.side, i: i};
    if (i * ROW < sc.scrollTop || (i + 1) * ROW > sc.scrollTop + this.geom.vh) sc.scrollTop = i * ROW - this.geom.vh / 2;
    this.draw();
    this.announce();
  };
  V.announce = function () {  // a pinned token, for a step view on the page (event "probe-pin" on the root)
    var p = this.S.pin;
    if (!p || typeof CustomEvent !== "function") return;
    this.root.dispatchEvent(new CustomEvent("probe-pin", {detail: {site: this.data.layers[this.S.layer],
      side: p.side, i: p.i, mode: this.S.mode, heads: this.S.heads.slice()}}));
  };
  V.bind = function () {
    var self = this, S = this.S, data = this.data, tip = this.tip;
    this.canvas.addEventListener("mousemove", function (e) {
      var p = self.at(e);  // the hover first: the tip reads the focus this event sets, not the last one
      if (p && (!S.hover || S.hover.side !== p.side || S.hover.i !== p.i)) { S.hover = p; if (!S.pin) self.draw(); }
      self.showTip(e, p);
    });
    this.canvas.addEventListener("mouseleave", function () {
      tip.style.display = "none"; S.hover = null; if (!S.pin) self.draw();
    });
    this.canvas.addEventListener("click", function (e) {
      var p = self.at(e);
      if (!p) return;
      S.pin = S.pin && S.pin.side === p.side && S.pin.i === p.i ? null : p;
      S.hover = p;
      self.draw();
      self.announce();
    });
    this.canvas.addEventListener("keydown", function (e) { self.key(e); });
    this.scroller.addEventListener("scroll", function () { self.schedule(); });
    this.strip.addEventListener("mousemove", function (e) {
      var f = self.focus(), j = self.stripIndex(e);
      if (!f || j < 0) { tip.style.display = "none"; return; }
      self.showTip(e, {side: f.side === "q" ? "k" : "q", i: j});
    });
    this.strip.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    this.strip.addEventListener("click", function (e) {
      var j = self.stripIndex(e);
      if (j >= 0) self.scroller.scrollTop = Math.max(0, j * ROW - self.geom.vh / 2);
    });
    this.layerSel.addEventListener("change", function () {
      var before = String(data.axes[S.layer]);
      S.layer = Number(self.layerSel.value);
      if (String(data.axes[S.layer]) !== before) S.hover = S.pin = null;  // other tokens: the focus does not carry
      S.heads = S.heads.filter(function (h) { return !data.removed[S.layer][h]; });
      self.buildHeads(); self.draw();
    });
    this.modeSel.addEventListener("change", function () {
      S.mode = self.modeSel.value; S.hover = S.pin = null; self.layout(); self.draw();
    });
    this.thrSel.addEventListener("change", function () { S.threshold = Number(self.thrSel.value); self.draw(); });
    this.allBtn.addEventListener("click", function () {
      S.heads = [];
      for (var h = 0; h < data.heads; h++) if (!data.removed[S.layer][h]) S.heads.push(h);
      self.buildHeads(); self.draw();
    });
    this.noneBtn.addEventListener("click", function () { S.heads = []; self.buildHeads(); self.draw(); });
    if (window.ResizeObserver) {
      new ResizeObserver(function () {
        if ((self.root.clientWidth || 720) !== self.geom.avail) { self.layout(); self.schedule(); }
      }).observe(this.root);
    }
  };

  // ------------------------------------------------------------------ API (tests, notebooks): element.probeView
  V.api = function () {
    var self = this, S = this.S;
    function copy(a) { return Array.prototype.slice.call(a); }
    return {
      data: this.data, timings: this.timings,
      state: function () {
        var f = self.focus();
        return {layer: self.data.layers[S.layer], layerIndex: S.layer, heads: S.heads.slice(), mode: S.mode,
                threshold: S.threshold, focus: f ? {side: f.side, i: f.i} : null, pinned: !!S.pin, units: self.size("q"),
                queries: self.labels("q").slice(), keys: self.labels("k").slice()};
      },
      lines: function () {
        return self.lastLines.map(function (l) { return {head: l.head, query: l.query, key: l.key, weight: l.weight}; });
      },
      strip: function () {
        var o = {};
        Object.keys(self.lastStrip).forEach(function (h) { o[h] = copy(self.lastStrip[h]); });
        return o;
      },
      setLayer: function (i) { self.layerSel.value = String(i); self.layerSel.dispatchEvent(new Event("change")); },
      setHeads: function (hs) { S.heads = hs.slice(); self.buildHeads(); self.draw(); },
      setMode: function (m) { self.modeSel.value = m; self.modeSel.dispatchEvent(new Event("change")); },
      setThreshold: function (t) { S.threshold = t; self.draw(); },
      focus: function (side, i, pin) { S.hover = {side: side, i: i}; S.pin = pin ? S.hover : null; self.draw(); },
      point: function (side, i) { return self.point(side, i); },
      tip: function () { return self.tip.style.display === "none" ? null : self.tip.textContent; },
      redraw: function () { self.draw(); }
    };
  };
  V.point = function (side, i) {  // client coordinates of a token's label, scrolled into view
    var want = Math.max(0, i * ROW - this.geom.vh / 2), g = this.geom;
    if (this.scroller.scrollTop !== want) { this.scroller.scrollTop = want; this.draw(); }
    var rect = this.canvas.getBoundingClientRect();
    if (rect.top < 0 || rect.bottom > window.innerHeight) {
      this.canvas.scrollIntoView({block: "center"});
      rect = this.canvas.getBoundingClientRect();
    }
    return {x: rect.left + (side === "q" ? g.labelW / 2 : g.W - g.labelW / 2), y: rect.top + this.y(i)};
  };

  // render(root, data): draw a view of data (probe/view/data.py's dict) into root, the one draw function every page
  // (report, saved view, live page, notebook widget) calls; mount(root) reads the data beside the script first.
  function render(root, data) {
    var t0 = performance.now();
    if (root.classList) root.classList.add("probe-hv");
    var view = new View(root, data, t0), fallback = root.querySelector(".hv-fallback");
    if (fallback) root.removeChild(fallback);
    view.build(); view.buildHeads(); view.bind(); view.layout();
    view.timings.mountMs = performance.now() - t0;
    view.draw();
    root.probeView = view.api();
    return root.probeView;
  }
  function mount(root) {
    if (root.probeView) return root.probeView;
    var node = root.querySelector("script.probe-hv-data");
    if (!node) return null;
    return render(root, JSON.parse(node.textContent));
  }

  var views = (typeof window !== "undefined" ? window : globalThis);
  views = views.probeViews = views.probeViews || {};
  views.headView = render;
  if (typeof document === "undefined") return;
  var host = script && script.parentNode;
  if (host && host.classList && host.classList.contains("probe-hv")) { host.probeView = mount(host); return; }
  var all = document.querySelectorAll(".probe-hv");
  for (var i = 0; i < all.length; i++) if (!all[i].probeView) all[i].probeView = mount(all[i]);
})(typeof document !== "undefined" ? document.currentScript : null);
