/* probe head view: one example's attention, drawn from data inlined beside this script.
 * Plain JavaScript, no library, no network request, no eval: it runs under a Content-Security-Policy
 * of "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'".
 *
 * Markup (probe/view/html.py): a div of class "probe-hv" holding a style element, a JSON script element
 * of class "probe-hv-data" (the data, probe/view/data.py) and a script element with this file.
 * The script mounts the view it sits in (document.currentScript's parent), so several views on one page
 * (a notebook) each mount their own; it defines no page-level global. Token text is only ever drawn with
 * canvas fillText or set as textContent, never parsed as HTML.
 *
 * Drawing: two token columns (queries left, keys right) on one canvas the height of the visible window
 * (virtualized: only visible rows are drawn, lines to rows outside the window leave it at its edge), and a
 * strip per selected head with the focused token's whole row (or column) as a heatmap. Hover a token on
 * the left to see where it attends, on the right to see what attends to it; click to pin; arrow keys
 * move a pinned token. Lines are drawn for probabilities >= the line threshold, the strip shows all.
 * Word mode aggregates the token maps: to a word = sum over its tokens, from a word = mean over them.
 * The mounted element gets a small API, element.probeView (state, lines drawn, timings) used by tests.
 */
(function (script) {
  "use strict";
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#ad494a"];
  var FONT = "12px sans-serif", ROW = 18, MAX_H = 520, STRIP = 12, STRIP_LEFT = 26, LABEL_CHARS = 24;

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

  function mount(root) {
    if (root.probeView) return root.probeView;
    var t0 = performance.now();
    var node = root.querySelector("script.probe-hv-data");
    if (!node) return null;
    var data = JSON.parse(node.textContent), fallback = root.querySelector(".hv-fallback");
    if (fallback) root.removeChild(fallback);
    var n = data.n, H = data.heads, hasWords = !!data.units;
    var S = {layer: data.initial.layer, heads: data.initial.heads.slice(), mode: "tokens", hover: null, pin: null,
             threshold: data.threshold};
    var cache = {}, lastLines = [], lastStrip = {}, geom = {};
    var timings = {mountMs: 0, firstDrawMs: null, firstDrawAt: null, lastDrawMs: null, draws: 0};

    // ---------------------------------------------------------------- data
    function tokenMatrix(li, h) {
      var key = li + ":" + h + ":t";
      if (!cache[key]) cache[key] = data.maps[li][h] === null ? null : decode(data.maps[li][h], n * n, data.scale);
      return cache[key];
    }
    function wordMatrix(li, h) {
      var key = li + ":" + h + ":w";
      if (cache[key] !== undefined) return cache[key];
      var a = tokenMatrix(li, h);
      if (a === null) return (cache[key] = null);
      var units = data.units, U = data.unitLabels.length, w = new Float32Array(U * U), count = new Float32Array(U);
      for (var q = 0; q < n; q++) {
        var uq = units[q] * U, row = q * n;
        count[units[q]] += 1;
        for (var k = 0; k < n; k++) w[uq + units[k]] += a[row + k];
      }
      for (var u = 0; u < U; u++) for (var v = 0; v < U; v++) w[u * U + v] /= count[u];
      return (cache[key] = w);
    }
    function matrix(li, h) { return S.mode === "words" ? wordMatrix(li, h) : tokenMatrix(li, h); }
    function labels() { return S.mode === "words" ? data.unitLabels : data.tokens; }
    function size() { return labels().length; }
    function weight(m, side, f, j) { var M = size(); return side === "q" ? m[f * M + j] : m[j * M + f]; }

    // ---------------------------------------------------------------- DOM
    if (data.title) root.appendChild(el("div", "hv-title", data.title));
    (data.notes || []).forEach(function (t) { root.appendChild(el("div", "hv-note", t)); });
    var bar = el("div", "hv-bar"), layerSel = el("select"), modeSel = el("select"), thrSel = el("select");
    data.layers.forEach(function (l, i) {
      var o = el("option", null, "layer " + l); o.value = String(i); o.title = data.layerNames[i]; layerSel.appendChild(o);
    });
    [["tokens", "tokens"], ["words", "words"]].forEach(function (m) {
      var o = el("option", null, m[1]); o.value = m[0]; o.disabled = m[0] === "words" && !hasWords; modeSel.appendChild(o);
    });
    var thresholds = [0.001, 0.01, 0.05, 0.1, 0.2];
    if (thresholds.indexOf(data.threshold) < 0) thresholds.push(data.threshold);
    thresholds.sort(function (a, b) { return a - b; }).forEach(function (t) {
      var o = el("option", null, "\u2265 " + t); o.value = String(t); thrSel.appendChild(o);
    });
    thrSel.value = String(data.threshold);
    function labelled(text, control) { var s = el("label"); s.appendChild(document.createTextNode(text + " ")); s.appendChild(control); return s; }
    bar.appendChild(labelled("layer", layerSel));
    var headsBox = el("span", "hv-heads");
    bar.appendChild(headsBox);
    var allBtn = el("button", null, "all"), noneBtn = el("button", null, "none");
    allBtn.type = noneBtn.type = "button";
    bar.appendChild(allBtn); bar.appendChild(noneBtn);
    bar.appendChild(labelled("units", modeSel));
    bar.appendChild(labelled("lines", thrSel));
    root.appendChild(bar);
    var strip = el("canvas", "hv-strip"), scroller = el("div", "hv-scroll"), canvas = el("canvas"), spacer = el("div");
    canvas.tabIndex = 0;
    scroller.appendChild(canvas); scroller.appendChild(spacer);
    var status = el("div", "hv-status"), tip = el("div", "hv-tip");
    root.appendChild(strip); root.appendChild(scroller); root.appendChild(status); root.appendChild(tip);
    root.appendChild(el("div", "hv-status", "Hover a token: on the left, where it attends (its row); on the right, " +
      "what attends to it (its column). Click to pin, arrow keys to move, Esc to unpin. Lines for probabilities " +
      "at or above the line threshold; the strip above shows every key of the row, one band per head."));

    function buildHeads() {
      while (headsBox.firstChild) headsBox.removeChild(headsBox.firstChild);
      for (var h = 0; h < H; h++) {
        var removed = data.removed[S.layer][h], lab = el("label", "hv-head" + (removed ? " hv-removed" : ""));
        var box = el("input"), sw = el("span", "hv-sw"), name = data.headLabels[S.layer][h];
        box.type = "checkbox"; box.value = String(h); box.checked = S.heads.indexOf(h) >= 0; box.disabled = removed;
        sw.style.background = headColor(h);
        lab.title = "layer " + data.layers[S.layer] + " head " + h + (removed ? ": removed" : name ? ": " + name : "");
        lab.appendChild(box); lab.appendChild(sw); lab.appendChild(document.createTextNode(String(h)));
        box.addEventListener("change", onHeadToggle);
        headsBox.appendChild(lab);
      }
    }
    function onHeadToggle() {
      S.heads = [];
      headsBox.querySelectorAll("input").forEach(function (b) { if (b.checked) S.heads.push(Number(b.value)); });
      draw();
    }

    // ---------------------------------------------------------------- layout and drawing
    function layout() {
      var dpr = window.devicePixelRatio || 1, ctx = canvas.getContext("2d"), labs = labels(), m = labs.length;
      ctx.font = FONT;
      var lw = 0;
      for (var i = 0; i < m; i++) lw = Math.max(lw, ctx.measureText(short(labs[i], LABEL_CHARS)).width);
      var labelW = Math.min(190, Math.ceil(lw) + 14), avail = root.clientWidth || 720;
      var W = Math.max(2 * labelW + 100, Math.min(avail - 4, 2 * labelW + 360)), total = m * ROW, vh = Math.min(total, MAX_H);
      geom = {W: W, vh: vh, labelW: labelW, total: total, dpr: dpr, m: m, avail: avail};
      canvas.width = Math.round(W * dpr); canvas.height = Math.round(vh * dpr);
      canvas.style.width = W + "px"; canvas.style.height = vh + "px";
      scroller.style.height = vh + "px"; scroller.style.width = (W + 2) + "px";
      spacer.style.height = Math.max(0, total - vh) + "px";
      var sh = Math.max(1, S.heads.length) * STRIP + 4;
      strip.width = Math.round(W * dpr); strip.height = Math.round(sh * dpr);
      strip.style.width = W + "px"; strip.style.height = sh + "px";
    }

    function focus() { return S.pin || S.hover; }

    function draw() {
      var t = performance.now();
      if (geom.m !== size() || strip.height !== Math.round((Math.max(1, S.heads.length) * STRIP + 4) * geom.dpr)) layout();
      var g = geom, ctx = canvas.getContext("2d"), labs = labels(), m = labs.length, f = focus();
      ctx.setTransform(g.dpr, 0, 0, g.dpr, 0, 0);
      ctx.clearRect(0, 0, g.W, g.vh);
      ctx.font = FONT; ctx.textBaseline = "middle";
      var top = scroller.scrollTop, r0 = Math.max(0, Math.floor(top / ROW)), r1 = Math.min(m - 1, Math.ceil((top + g.vh) / ROW));
      var heads = S.heads.filter(function (h) { return matrix(S.layer, h) !== null; });
      var mats = heads.map(function (h) { return matrix(S.layer, h); });
      function y(r) { return r * ROW - top + ROW / 2; }
      var x1 = g.labelW, x2 = g.W - g.labelW;
      lastLines = [];
      if (f) {
        ctx.lineWidth = 2;
        for (var hi = 0; hi < heads.length; hi++) {
          ctx.strokeStyle = headColor(heads[hi]);
          for (var j = 0; j < m; j++) {
            var w = weight(mats[hi], f.side, f.i, j);
            if (!(w >= S.threshold)) continue;
            var q = f.side === "q" ? f.i : j, k = f.side === "q" ? j : f.i;
            lastLines.push({head: heads[hi], query: q, key: k, weight: w});
            ctx.globalAlpha = Math.min(1, 0.15 + 0.85 * w);
            ctx.beginPath(); ctx.moveTo(x1, y(q)); ctx.lineTo(x2, y(k)); ctx.stroke();
          }
        }
        ctx.globalAlpha = 1;
      }
      for (var r = r0; r <= r1; r++) {
        var text = short(labs[r], LABEL_CHARS);
        for (var side = 0; side < 2; side++) {
          var isQ = side === 0, x0 = isQ ? 0 : x2, here = f && f.i === r && (f.side === "q") === isQ;
          if (here) {
            ctx.fillStyle = "#333"; ctx.fillRect(x0 + 2, y(r) - ROW / 2 + 1, g.labelW - 4, ROW - 2);
          } else if (f && (f.side === "q") !== isQ) {
            var best = 0, bh = -1;
            for (hi = 0; hi < heads.length; hi++) {
              var v = weight(mats[hi], f.side, f.i, r);
              if (v > best) { best = v; bh = heads[hi]; }
            }
            if (bh >= 0) {
              ctx.globalAlpha = Math.min(1, best); ctx.fillStyle = headColor(bh);
              ctx.fillRect(x0 + 2, y(r) - ROW / 2 + 1, g.labelW - 4, ROW - 2); ctx.globalAlpha = 1;
            }
          }
          ctx.fillStyle = here ? "#fff" : "#222";
          ctx.textAlign = isQ ? "right" : "left";
          ctx.fillText(text, isQ ? g.labelW - 6 : x2 + 6, y(r));
        }
      }
      drawStrip(heads, mats, f, m);
      status.textContent = f ? (f.side === "q" ? "query " : "key ") + JSON.stringify(labs[f.i]) + " (" + f.i + ")" +
        (S.pin ? ", pinned" : "") + ": " + lastLines.length + " line(s)" : "";
      root.setAttribute("data-focus", f ? f.side + ":" + f.i : "");
      timings.draws += 1;
      timings.lastDrawMs = performance.now() - t;
      if (timings.firstDrawMs === null) { timings.firstDrawMs = performance.now() - t0; timings.firstDrawAt = performance.now(); }
      root.setAttribute("data-draws", String(timings.draws));
    }

    function drawStrip(heads, mats, f, m) {
      var g = geom, ctx = strip.getContext("2d"), x0 = STRIP_LEFT, cw = (g.W - x0) / m;
      ctx.setTransform(g.dpr, 0, 0, g.dpr, 0, 0);
      ctx.clearRect(0, 0, g.W, strip.height / g.dpr);
      ctx.font = "10px sans-serif"; ctx.textBaseline = "middle"; ctx.textAlign = "left";
      lastStrip = {};
      if (!f || !heads.length) {
        ctx.fillStyle = "#888"; ctx.font = FONT;
        ctx.fillText(heads.length ? "hover a token to see its whole row here" : "no head selected", 4, STRIP / 2 + 1);
        return;
      }
      for (var hi = 0; hi < heads.length; hi++) {
        var y0 = hi * STRIP, vals = [];
        ctx.fillStyle = headColor(heads[hi]); ctx.fillText("h" + heads[hi], 2, y0 + STRIP / 2);
        ctx.fillStyle = "#f2f2f2"; ctx.fillRect(x0, y0, g.W - x0, STRIP - 2);
        ctx.fillStyle = headColor(heads[hi]);
        for (var j = 0; j < m; j++) {
          var w = weight(mats[hi], f.side, f.i, j);
          vals.push(w);
          if (w > 0) { ctx.globalAlpha = Math.min(1, w); ctx.fillRect(x0 + j * cw, y0, Math.max(1, cw), STRIP - 2); }
        }
        ctx.globalAlpha = 1;
        lastStrip[heads[hi]] = vals;
      }
      ctx.fillStyle = "#000";
      ctx.fillRect(x0 + f.i * cw + Math.max(1, cw) / 2 - 0.5, heads.length * STRIP, 1, 4);
    }

    function stripIndex(e) {
      var rect = strip.getBoundingClientRect(), j = Math.floor((e.clientX - rect.left - STRIP_LEFT) / ((geom.W - STRIP_LEFT) / size()));
      return j >= 0 && j < size() ? j : -1;
    }

    var pending = false;
    function schedule() { if (!pending) { pending = true; requestAnimationFrame(function () { pending = false; draw(); }); } }

    // ---------------------------------------------------------------- events
    function at(e) {
      var rect = canvas.getBoundingClientRect(), x = e.clientX - rect.left, yy = e.clientY - rect.top;
      var i = Math.floor((yy + scroller.scrollTop) / ROW);
      if (i < 0 || i >= size()) return null;
      if (x < geom.labelW) return {side: "q", i: i};
      if (x > geom.W - geom.labelW) return {side: "k", i: i};
      return null;
    }
    function showTip(e, p) {
      if (!p) { tip.style.display = "none"; return; }
      var labs = labels(), lines = [JSON.stringify(labs[p.i]) + " (" + (p.side === "q" ? "query " : "key ") + p.i + ")"];
      var f = focus();
      if (f && f.side !== p.side) {
        S.heads.forEach(function (h) {
          var mat = matrix(S.layer, h);
          if (mat !== null) lines.push("head " + h + ": " + weight(mat, f.side, f.i, p.i).toFixed(3));
        });
      }
      var box = root.getBoundingClientRect();
      tip.textContent = lines.join("\n");
      tip.style.display = "block";
      tip.style.left = (e.clientX - box.left + 14) + "px"; tip.style.top = (e.clientY - box.top + 14) + "px";
    }
    canvas.addEventListener("mousemove", function (e) {
      var p = at(e);
      showTip(e, p);
      if (p && (!S.hover || S.hover.side !== p.side || S.hover.i !== p.i)) { S.hover = p; if (!S.pin) draw(); }
    });
    canvas.addEventListener("mouseleave", function () { tip.style.display = "none"; S.hover = null; if (!S.pin) draw(); });
    canvas.addEventListener("click", function (e) {
      var p = at(e);
      if (!p) return;
      S.pin = S.pin && S.pin.side === p.side && S.pin.i === p.i ? null : p;
      S.hover = p;
      draw();
    });
    canvas.addEventListener("keydown", function (e) {
      var f = S.pin || S.hover;
      if (e.key === "Escape") { S.pin = null; draw(); return; }
      if (!f || (e.key !== "ArrowUp" && e.key !== "ArrowDown")) return;
      e.preventDefault();
      var i = Math.max(0, Math.min(size() - 1, f.i + (e.key === "ArrowUp" ? -1 : 1)));
      S.pin = {side: f.side, i: i};
      if (i * ROW < scroller.scrollTop || (i + 1) * ROW > scroller.scrollTop + geom.vh) scroller.scrollTop = i * ROW - geom.vh / 2;
      draw();
    });
    scroller.addEventListener("scroll", schedule);
    strip.addEventListener("mousemove", function (e) {
      var f = focus(), j = stripIndex(e);
      if (!f || j < 0) { tip.style.display = "none"; return; }
      showTip(e, {side: f.side === "q" ? "k" : "q", i: j});
    });
    strip.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    strip.addEventListener("click", function (e) {
      var j = stripIndex(e);
      if (j >= 0) scroller.scrollTop = Math.max(0, j * ROW - geom.vh / 2);
    });
    layerSel.addEventListener("change", function () {
      S.layer = Number(layerSel.value);
      S.heads = S.heads.filter(function (h) { return !data.removed[S.layer][h]; });
      buildHeads(); draw();
    });
    modeSel.addEventListener("change", function () { S.mode = modeSel.value; S.hover = S.pin = null; layout(); draw(); });
    thrSel.addEventListener("change", function () { S.threshold = Number(thrSel.value); draw(); });
    allBtn.addEventListener("click", function () {
      S.heads = []; for (var h = 0; h < H; h++) if (!data.removed[S.layer][h]) S.heads.push(h);
      buildHeads(); draw();
    });
    noneBtn.addEventListener("click", function () { S.heads = []; buildHeads(); draw(); });
    if (window.ResizeObserver) {
      new ResizeObserver(function () { if ((root.clientWidth || 720) !== geom.avail) { layout(); schedule(); } }).observe(root);
    }

    // ---------------------------------------------------------------- API (tests, notebooks)
    var api = {
      data: data, timings: timings,
      state: function () {
        var f = focus();
        return {layer: data.layers[S.layer], layerIndex: S.layer, heads: S.heads.slice(), mode: S.mode,
                threshold: S.threshold, focus: f ? {side: f.side, i: f.i} : null, pinned: !!S.pin, units: size()};
      },
      lines: function () { return lastLines.map(function (l) { return {head: l.head, query: l.query, key: l.key, weight: l.weight}; }); },
      strip: function () { var o = {}; Object.keys(lastStrip).forEach(function (h) { o[h] = Array.prototype.slice.call(lastStrip[h]); }); return o; },
      matrix: function (layerIndex, h, mode) {
        var saved = S.mode; S.mode = mode || S.mode;
        var m = matrix(layerIndex, h), M = size();
        S.mode = saved;
        if (m === null) return null;
        var rows = [];
        for (var i = 0; i < M; i++) rows.push(Array.prototype.slice.call(m.subarray(i * M, (i + 1) * M)));
        return rows;
      },
      setLayer: function (i) { layerSel.value = String(i); layerSel.dispatchEvent(new Event("change")); },
      setHeads: function (hs) { S.heads = hs.slice(); buildHeads(); draw(); },
      setMode: function (m) { modeSel.value = m; modeSel.dispatchEvent(new Event("change")); },
      setThreshold: function (t) { S.threshold = t; draw(); },
      focus: function (side, i, pin) { S.hover = {side: side, i: i}; S.pin = pin ? S.hover : null; draw(); },
      point: function (side, i) {
        var want = Math.max(0, i * ROW - geom.vh / 2);
        if (scroller.scrollTop !== want) { scroller.scrollTop = want; draw(); }
        var rect = canvas.getBoundingClientRect();
        if (rect.top < 0 || rect.bottom > window.innerHeight) { canvas.scrollIntoView({block: "center"}); rect = canvas.getBoundingClientRect(); }
        return {x: rect.left + (side === "q" ? geom.labelW / 2 : geom.W - geom.labelW / 2),
                y: rect.top + i * ROW - scroller.scrollTop + ROW / 2};
      },
      redraw: draw
    };
    buildHeads();
    layout();
    timings.mountMs = performance.now() - t0;
    draw();
    return api;
  }

  var host = script && script.parentNode;
  if (host && host.classList && host.classList.contains("probe-hv")) { host.probeView = mount(host); return; }
  var all = document.querySelectorAll(".probe-hv");
  for (var i = 0; i < all.length; i++) if (!all[i].probeView) all[i].probeView = mount(all[i]);
})(document.currentScript);
