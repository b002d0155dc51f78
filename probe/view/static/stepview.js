/* probe attention-step view: one head's steps from the query and key vectors to the softmax, for a
 * chosen query token. Plain JavaScript, no library, no network request, no eval; runs under
 * "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'". Markup
 * (probe/view/stepview.py): a div of class "probe-sv" with a style element, a JSON script element of
 * class "probe-sv-data" and this script; or, where a page holds several views (a report), each div with
 * its JSON only and the style and this script once after them, which then mounts every such div. The numbers are the data's (the from-scratch attention's):
 * nothing is recomputed here except the elementwise products q_d * k_d drawn in the heat strip.
 * Tokens are set with textContent only. With data.source, pinning a query token of this site in that
 * head view (its "probe-pin" event) opens the token here; opening a query token sends "probe-query" ({query})
 * from the view's element. Its draw function is probeViews.stepView(element, data).
 * A head with sink logits (data.sink, one per query row: one more softmax column that no key holds) gets
 * a last row "sink" (class sv-sink): its logit and its probability, 1 minus the sum of the keys' (the
 * row's share that goes to no key), and a line saying so. A value probe could not compute (null in the
 * data: valueNorm where no output projection was found) is drawn "n/a", never NaN or 0.
 * A capture-only type's head (its own attention code; data.implied, [nq * nk]) gets one more column after
 * "scaled", "implied term": the part of the model's score that probe cannot see it compute, read back from
 * its probabilities (log p - scaled, mean 0 over the row's unmasked keys); its probability is then
 * softmax(scaled + implied term), as the rule line says. data.note (a line on where q, k and v came from) is
 * shown under the rule (class sv-note).
 * element.probeStepView is a small test API.
 */
(function (script) {
  "use strict";
  var CELL = 6, ROWH = 19;
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmt(v, d) {
    if (v === null || v === undefined || (typeof v === "number" && isNaN(v))) return "n/a";
    return v === -Infinity ? "-inf" : Number(v).toFixed(d);
  }

  function View(root, data) { this.root = root; this.data = data; this.query = data.query; }
  var V = View.prototype;
  V.build = function () {
    var d = this.data, root = this.root, self = this;
    root.appendChild(el("div", "sv-title", "Attention steps of " + d.name + (d.kvHead !== d.head ?
      " (keys and values from key/value head " + d.kvHead + ")" : "")));
    var rule = "scaled = " + (d.softcap ? d.softcap + " * tanh(q\u00b7k * " + d.scale.toPrecision(6) + " / " + d.softcap + ")"
      : "q\u00b7k * " + d.scale.toPrecision(6)) + (d.hasBias ? " + bias" : "") +
      (d.implied ? ";  probability = softmax of (scaled + implied term) over the unmasked keys"
        : ";  probability = softmax over the unmasked keys") + ";  contribution = probability * ||f(x_j)||";
    root.appendChild(el("div", "sv-rule", rule));
    if (d.note) root.appendChild(el("div", "sv-note", d.note));
    var bar = el("div", "sv-status", "query token ");
    this.sel = el("select");
    d.qTokens.forEach(function (t, i) { var o = el("option", null, i + ": " + t); o.value = String(i); self.sel.appendChild(o); });
    this.sel.addEventListener("change", function () { self.open(Number(self.sel.value)); });
    bar.appendChild(this.sel); root.appendChild(bar);
    this.qline = el("div", "sv-status"); root.appendChild(this.qline);
    var wrap = el("div", "sv-scroll"), flex = el("div");
    flex.style.display = "flex"; flex.style.gap = "8px"; flex.style.alignItems = "flex-start";
    this.table = el("table"); this.canvas = el("canvas");
    this.canvas.style.marginTop = ROWH + "px";
    flex.appendChild(this.table); flex.appendChild(this.canvas); wrap.appendChild(flex); root.appendChild(wrap);
    root.appendChild(el("div", "sv-status", "Strip right of the table: q_d * k_d for every dimension d of the head " +
      "(red positive, blue negative; each row sums to q\u00b7k). Grey rows: masked keys."));
    if (d.source) {
      var src = document.getElementById(d.source);
      if (src) src.addEventListener("probe-pin", function (e) {
        var p = e.detail;
        if (p.site === d.siteIndex && p.side === "q" && p.mode === "tokens" && p.i < d.nq) self.open(p.i);
      });
    }
  };
  V.row = function (j) {
    var d = this.data, i = this.query, at = i * d.nk + j;
    return {key: j, token: d.kTokens[j], score: d.score[at], bias: d.bias[at], scaled: d.scaled[at],
            implied: d.implied ? d.implied[at] : null, masked: !d.keep[at], probability: d.probs[at],
            valueNorm: d.valueNorm[j],
            contribution: d.valueNorm[j] === null ? null : d.probs[at] * d.valueNorm[j]};
  };
  // the sink of query row i: {logit, probability} (probability: 1 - the keys' sum), or null without sinks
  V.sink = function (i) {
    var d = this.data;
    if (!d.sink || d.sink[i] === null || d.sink[i] === undefined) return null;
    var sum = 0;
    for (var j = 0; j < d.nk; j++) sum += d.probs[i * d.nk + j] || 0;
    return {logit: d.sink[i], probability: Math.max(0, 1 - sum), keys: sum};
  };
  V.open = function (i) {
    var d = this.data, self = this;
    this.query = i; this.sel.value = String(i);
    var t = this.table;
    while (t.firstChild) t.removeChild(t.firstChild);
    var head = el("tr");
    ["key", "token", "q\u00b7k", "\u00d7 scale", d.softcap ? "capped" : null, "bias", "scaled",
     d.implied ? "implied term" : null, "mask", "probability",
     "||f(x_j)||", "||\u03b1 f(x_j)||"].forEach(function (h) { if (h !== null) head.appendChild(el("th", null, h)); });
    t.appendChild(head);
    var maxP = 0, sink = this.sink(i);
    for (var j = 0; j < d.nk; j++) maxP = Math.max(maxP, d.probs[i * d.nk + j]);
    if (sink) maxP = Math.max(maxP, sink.probability);
    for (j = 0; j < d.nk; j++) {
      var r = this.row(j), tr = el("tr", r.masked ? "sv-masked" : null), x = r.score * d.scale;
      var cells = [String(j), r.token, fmt(r.score, 4), fmt(x, 4)];
      if (d.softcap) cells.push(fmt(d.softcap * Math.tanh(x / d.softcap), 4));
      cells.push(fmt(r.bias, 4), fmt(r.scaled, 4));
      if (d.implied) cells.push(r.masked ? "" : fmt(r.implied, 4));
      cells.push(r.masked ? "masked" : "", fmt(r.probability, 4),
                 fmt(r.valueNorm, 3), fmt(r.contribution, 3));
      cells.forEach(function (c, k) { var td = el("td", k === 1 ? "sv-tok" : null, c); tr.appendChild(td); });
      var b = el("span", "sv-bar"); b.style.width = Math.round(40 * (maxP ? r.probability / maxP : 0)) + "px";
      tr.children[tr.children.length - 3].appendChild(b);
      tr.style.height = ROWH + "px";
      t.appendChild(tr);
    }
    if (sink) {  // one more softmax column: its logit is the scaled score of no key
      var sr = el("tr", "sv-sink"), sc = ["sink", "(no key)", "", ""];
      if (d.softcap) sc.push("");
      sc.push("", fmt(sink.logit, 4));
      if (d.implied) sc.push("");
      sc.push("", fmt(sink.probability, 4), "", "");
      sc.forEach(function (c, k) { sr.appendChild(el("td", k === 1 ? "sv-tok" : null, c)); });
      var sb = el("span", "sv-bar sv-sink-bar"); sb.style.width = Math.round(40 * (maxP ? sink.probability / maxP : 0)) + "px";
      sr.children[sr.children.length - 3].appendChild(sb);
      t.appendChild(sr);
    }
    // the query token is the select's; this line says only what the row adds (a sink's share)
    this.qline.textContent = sink ? "sink logit " + fmt(sink.logit, 4) + ": " + fmt(sink.probability, 4) +
      " of this row's attention goes to no key (the keys' probabilities sum to " + fmt(sink.keys, 4) + ")" : "";
    this.qline.style.display = sink ? "" : "none";
    this.drawProducts();
    this.root.setAttribute("data-query", String(i));
    if (typeof CustomEvent === "function") this.root.dispatchEvent(new CustomEvent("probe-query", {detail: {query: i}}));
  };
  V.products = function () {
    var d = this.data, i = this.query, out = [];
    for (var j = 0; j < d.nk; j++) {
      var row = [];
      for (var c = 0; c < d.dHead; c++) row.push(d.q[i * d.dHead + c] * d.k[j * d.dHead + c]);
      out.push(row);
    }
    return out;
  };
  V.drawProducts = function () {
    var d = this.data, p = this.products(), m = 0;
    p.forEach(function (r) { r.forEach(function (v) { m = Math.max(m, Math.abs(v)); }); });
    var cv = this.canvas, w = d.dHead * CELL, h = d.nk * ROWH;
    cv.width = w; cv.height = h; cv.style.width = w + "px"; cv.style.height = h + "px";
    var ctx = cv.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, w, h);
    for (var j = 0; j < d.nk; j++) for (var c = 0; c < d.dHead; c++) {
      var a = m ? p[j][c] / m : 0, s = Math.round(255 * (1 - Math.abs(a)));
      ctx.fillStyle = a >= 0 ? "rgb(255," + s + "," + s + ")" : "rgb(" + s + "," + s + ",255)";
      ctx.fillRect(c * CELL, j * ROWH + 2, CELL, ROWH - 4);
    }
  };
  V.api = function () {
    var self = this;
    return {
      data: self.data, query: function () { return self.query; }, open: function (i) { self.open(i); },
      products: function () { return self.products(); },
      rows: function () {  // the table as drawn: its keys' cells' text (the sink row: sink())
        return Array.prototype.slice.call(self.table.querySelectorAll("tr:not(.sv-sink)")).slice(1).map(function (tr) {
          return Array.prototype.map.call(tr.children, function (td) { return td.firstChild ? td.firstChild.textContent : ""; });
        });
      },
      sink: function () {  // the sink row's cells' text, or null where the head has no sink
        var tr = self.table.querySelector("tr.sv-sink");
        return tr ? Array.prototype.map.call(tr.children, function (td) { return td.firstChild ? td.firstChild.textContent : ""; }) : null;
      },
      status: function () { return self.qline.textContent; },
      header: function () { return Array.prototype.map.call(self.table.querySelectorAll("th"), function (th) { return th.textContent; }); }
    };
  };

  // render(root, data): the one draw function (report, saved view, live page, notebook widget).
  function render(root, data) {
    if (root.classList) root.classList.add("probe-sv");
    var view = new View(root, data), fallback = root.querySelector(".sv-fallback");
    if (fallback) root.removeChild(fallback);
    view.build(); view.open(view.data.query);
    root.probeStepView = view.api();
    return root.probeStepView;
  }
  function mount(root) {
    if (root.probeStepView) return root.probeStepView;
    var node = root.querySelector("script.probe-sv-data");
    if (!node) return null;
    return render(root, JSON.parse(node.textContent));
  }
  var views = (typeof window !== "undefined" ? window : globalThis);
  views = views.probeViews = views.probeViews || {};
  views.stepView = render;
  if (typeof document === "undefined") return;
  var host = script && script.parentNode;
  if (host && host.classList && host.classList.contains("probe-sv")) { host.probeStepView = mount(host); return; }
  var all = document.querySelectorAll(".probe-sv");
  for (var i = 0; i < all.length; i++) if (!all[i].probeStepView) all[i].probeStepView = mount(all[i]);
})(typeof document !== "undefined" ? document.currentScript : null);
