/* probe live: the page of `probe live` and of the notebook explorer (probe.Explorer). Plain JavaScript, no
 * library, no network request but to the server it came from (or the widget's messages), no eval; it runs
 * under "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'".
 *
 * probeViews.live(root, transport) builds the page into root. transport(route, body) returns a Promise of
 * {status, body}: over HTTP (probeViews.httpTransport, the token from the page's address sent as a header)
 * or over the widget's messages (probe/live/widget.js). Every view is drawn by the view modules of
 * probe/view/static (probeViews.headView, modelView, stepView), fed the records the session returns: the
 * same draw functions as the static reports and probe.show.
 *
 * Each edit of the text re-runs the model after a pause of DEBOUNCE ms; every request carries the page's
 * id and a sequence number per route, and an answer older than the newest one drawn is dropped (the
 * server also drops a request a newer one overtook, status 409). Text is only ever set as textContent.
 * root.probeLive is the small API the tests read (state, counts, the grid as drawn, timings).
 */
(function () {
  "use strict";
  var DEBOUNCE = 150;
  var PROGRESS_MS = 500;  // how often the page asks what a patch request has done
  var views = (typeof window !== "undefined" ? window : globalThis);
  views = views.probeViews = views.probeViews || {};

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); return e; }
  function fmt(v, d) {
    if (v === null || v === undefined) return "";
    var s = Number(v).toFixed(d === undefined ? 3 : d);
    return /^-0\.?0*$/.test(s) ? s.slice(1) : s;  // a value that rounds to zero is shown without a sign
  }
  var SHORT = {"previous-token": "prev", "next-token": "next", "first-token": "1st", "broad": "brd", "self": "self",
               "punctuation": "punc", "sep": "sep", "induction": "ind", "duplicate-token": "dup", "long-range": "long",
               "local": "loc"};
  function short(label) {  // a cell's label in at most 4 characters (the full label in its tooltip)
    if (!label || label === "mixed") return "\u00b7";
    return SHORT[label] || label.replace(/[^a-z0-9]/gi, "").slice(0, 4);
  }
  function titled(title, line) {  // "Why: " + a line, unless the line already names it ("why: ...", "attention steps ...")
    var lower = String(line).toLowerCase(), t = title.toLowerCase();
    if (lower.indexOf(t + ": ") === 0) line = String(line).slice(t.length + 2);
    else if (lower.indexOf(t + " ") === 0) return line.charAt(0).toUpperCase() + line.slice(1);
    return title + ": " + line;
  }
  function option(text, value) { var o = el("option", null, text); o.value = value; return o; }
  function labelled(text, control) {
    var s = el("label", "pl-field"); s.appendChild(document.createTextNode(text + " ")); s.appendChild(control); return s;
  }

  views.httpTransport = function (base, token) {
    return function (route, body) {
      var read = route === "info" || route === "progress", url = base + "api/" + route;
      var init = {method: read ? "GET" : "POST", headers: {"X-Probe-Token": token}, cache: "no-store"};
      if (!read) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
      else if (body && body.page) url += "?page=" + encodeURIComponent(body.page);
      return fetch(url, init).then(function (r) {
        return r.json().then(function (b) { return {status: r.status, body: b}; },
                             function () { return {status: r.status, body: {error: "the server answered " + r.status}}; });
      });
    };
  };

  function Live(root, transport) {
    this.root = root; this.transport = transport;
    this.page = Math.random().toString(36).slice(2) + Date.now().toString(36);
    this.seq = {}; this.drawn = {};
    this.S = {text: "", corrupted: "", layer: 0, head: null, query: null, off: [], kind: "zero", mode: "inspect",
              stat: "max_weight"};
    this.counts = {edit: 0, head: 0, ablate: 0, patch: 0, errors: 0, stale: 0};
    this.timings = {editMs: [], lastEditMs: null, typedAt: null};
    this.last = {};
  }
  var L = Live.prototype;

  // ------------------------------------------------------------------ requests
  L.request = function (route, body) {
    var self = this, seq = (this.seq[route] = (this.seq[route] || 0) + 1);
    body.page = this.page; body.seq = seq;
    this.busy(route, true);
    return this.transport(route, body).then(function (res) {
      self.busy(route, false);
      if (res.status === 409 || seq < (self.drawn[route] || 0) || seq !== self.seq[route]) {
        self.counts.stale += 1;  // a newer request of this route was sent: this answer is not drawn
        return null;
      }
      self.drawn[route] = seq;
      if (res.status !== 200) { self.fail(route, res.body && res.body.error || ("status " + res.status)); return null; }
      self.ok(route);
      return res.body;
    }, function (err) {
      self.busy(route, false);
      self.fail(route, "no answer from the server (" + (err && err.message || err) + ")");
      return null;
    });
  };
  L.busy = function (route, on) {
    this.pending = (this.pending || 0) + (on ? 1 : -1);
    this.root.setAttribute("data-busy", String(this.pending));
    this.statusLine.textContent = this.pending > 0 ? "running\u2026" : "";
  };
  L.fail = function (route, message) {
    this.counts.errors += 1;
    this.errors[route] = message;
    this.showErrors();
  };
  L.ok = function (route) { if (this.errors[route]) { delete this.errors[route]; this.showErrors(); } };
  L.showErrors = function () {
    var self = this, lines = Object.keys(this.errors).map(function (r) { return r + ": " + self.errors[r]; });
    this.errorLine.textContent = lines.join("\n");
    this.errorLine.style.display = lines.length ? "block" : "none";
  };

  // ------------------------------------------------------------------ page
  L.build = function (info) {
    var root = this.root, self = this;
    this.info = info;
    clear(root);
    root.classList.add("probe-live");
    var head = el("div", "pl-head");
    head.appendChild(el("span", "pl-model", info.model));
    head.appendChild(el("span", "pl-meta", info.kind + ", " + info.layers + " layers \u00d7 " + info.heads + " heads"));
    this.statusLine = el("span", "pl-status");
    head.appendChild(this.statusLine);
    root.appendChild(head);

    this.textBox = el("textarea", "pl-text");
    this.textBox.rows = 2; this.textBox.maxLength = info.maxChars; this.textBox.spellcheck = false;
    this.textBox.placeholder = "Type a sentence (at most " + info.maxTokens + " tokens)";
    this.textBox.setAttribute("aria-label", "text");
    root.appendChild(this.textBox);
    this.corruptBox = el("textarea", "pl-text pl-corrupt");
    this.corruptBox.rows = 1; this.corruptBox.maxLength = info.maxChars; this.corruptBox.spellcheck = false;
    this.corruptBox.placeholder = info.patching ? "Corrupted text: no patching on this model (below)" :
      "Corrupted text (same token count): turns on activation patching";
    this.corruptBox.setAttribute("aria-label", "corrupted text");
    this.corruptBox.disabled = !!info.patching;
    root.appendChild(this.corruptBox);
    if (info.patching) {  // the library's line ends without a full stop (a one-line error); here it is a sentence
      root.appendChild(el("div", "pl-note pl-nopatch", "Patching: " + info.patching.replace(/([^.!?])$/, "$1.")));
    }
    if (info.ablation) {  // a model whose heads cannot be switched off (capture-only, pruned): said before a click
      root.appendChild(el("div", "pl-note pl-noablation", "Switching heads off: " +
                          info.ablation.replace(/([^.!?])$/, "$1.")));
    }
    this.errorLine = el("div", "pl-error"); this.errorLine.style.display = "none"; this.errors = {};
    root.appendChild(this.errorLine);
    this.tokenLine = el("div", "pl-tokens"); root.appendChild(this.tokenLine);

    var bar = el("div", "pl-bar");
    this.modeSel = el("select");
    this.modeSel.appendChild(option("inspect it", "inspect")); this.modeSel.appendChild(option("switch it off", "off"));
    if (info.ablation) this.modeSel.options[1].disabled = true;
    this.kindSel = el("select");
    this.kindSel.appendChild(option("zero", "zero")); this.kindSel.appendChild(option("mean", "mean"));
    this.statSel = el("select");
    this.clearBtn = el("button", null, "all heads on"); this.clearBtn.type = "button";
    this.kindSel.disabled = this.clearBtn.disabled = !!info.ablation;
    [labelled("click a head to", this.modeSel), labelled("ablation", this.kindSel), this.clearBtn,
     labelled("shade", this.statSel)].forEach(function (e) { bar.appendChild(e); });
    root.appendChild(bar);

    var gridBox = el("div", "pl-scroll pl-gridbox");
    this.grid = el("table", "pl-grid"); gridBox.appendChild(this.grid); root.appendChild(gridBox);
    this.gridNote = el("div", "pl-note"); root.appendChild(this.gridNote);

    this.outBox = el("div", "pl-section pl-output"); root.appendChild(this.outBox);

    var views = el("div", "pl-section");
    var vbar = el("div", "pl-bar");
    this.layerSel = el("select");
    for (var l = 0; l < info.layers; l++) this.layerSel.appendChild(option("layer " + l, String(l)));
    vbar.appendChild(labelled("maps of", this.layerSel));
    views.appendChild(vbar);
    this.headViewBox = el("div", "pl-view"); this.ablatedBox = el("div", "pl-view");
    this.modelViewBox = el("div", "pl-view");
    views.appendChild(this.headViewBox); views.appendChild(this.ablatedBox); views.appendChild(this.modelViewBox);
    root.appendChild(views);

    this.headBox = el("div", "pl-section pl-headpanel"); root.appendChild(this.headBox);
    this.patchBox = el("div", "pl-section pl-patch"); root.appendChild(this.patchBox);
    this.bind();
  };
  L.bind = function () {
    var self = this, S = this.S, timer = null;
    this.textBox.addEventListener("input", function () {
      self.timings.typedAt = performance.now();
      if (timer) clearTimeout(timer);
      timer = setTimeout(function () { timer = null; self.edit(); }, DEBOUNCE);
    });
    var ptimer = null;
    this.corruptBox.addEventListener("input", function () {
      if (ptimer) clearTimeout(ptimer);
      ptimer = setTimeout(function () { ptimer = null; S.corrupted = self.corruptBox.value; self.patch(); }, DEBOUNCE);
    });
    this.modeSel.addEventListener("change", function () { S.mode = self.modeSel.value; });
    this.kindSel.addEventListener("change", function () { S.kind = self.kindSel.value; self.ablate(); });
    this.clearBtn.addEventListener("click", function () { S.off = []; self.drawGrid(); self.ablate(); });
    this.statSel.addEventListener("change", function () { S.stat = self.statSel.value; self.drawGrid(); });
    this.layerSel.addEventListener("change", function () { S.layer = Number(self.layerSel.value); self.edit(); });
  };

  // ------------------------------------------------------------------ edit: grid, head view, model view
  L.edit = function () {
    var self = this, S = this.S, text = this.textBox.value;
    S.text = text;
    if (!text.trim()) return Promise.resolve(null);
    var typed = this.timings.typedAt;
    return this.request("edit", {text: text, layer: S.layer}).then(function (r) {
      if (!r) return null;
      self.last.edit = r;
      self.counts.edit += 1;
      self.drawEdit(r);
      if (typed !== null) {
        var ms = performance.now() - typed;
        self.timings.lastEditMs = ms; self.timings.editMs.push(ms); self.timings.typedAt = null;
      }
      self.root.setAttribute("data-edits", String(self.counts.edit));
      if (S.query !== null && S.query >= r.tokens.length) S.query = null;
      var more = [];
      if (S.head !== null) more.push(self.inspect(S.head[0], S.head[1]));
      if (S.off.length) more.push(self.ablate());
      if (S.corrupted.trim()) more.push(self.patch());
      return Promise.all(more).then(function () { return r; });
    });
  };
  L.drawEdit = function (r) {
    var self = this, S = this.S;
    clear(this.tokenLine);
    r.tokens.forEach(function (t, i) {
      var s = el("span", "pl-tok", t); s.title = "token " + i; self.tokenLine.appendChild(s);
    });
    this.gridData = r.grid;
    if (!this.statSel.options.length) {
      Object.keys(r.grid.statistics).forEach(function (k) { self.statSel.appendChild(option(k, k)); });
      if (!r.grid.statistics[S.stat]) S.stat = Object.keys(r.grid.statistics)[0];
      this.statSel.value = S.stat;
    }
    this.drawGrid();
    this.drawHeadView(this.headViewBox, r.headView, "hv");
    clear(this.modelViewBox);
    var mv = el("div"); this.modelViewBox.appendChild(mv);
    views.modelView(mv, r.modelView);
    mv.addEventListener("probe-open", function (e) {
      e.preventDefault();
      var site = e.detail.site, head = e.detail.head;
      self.S.head = [site, head];
      if (site !== S.layer) { S.layer = site; self.layerSel.value = String(site); self.edit(); }
      else { self.drawGrid(); self.inspect(site, head); }
    });
  };
  L.drawHeadView = function (box, data, key) {
    var from = key === "ablated" ? this.headViewBox : box;  // the ablated view shows the heads the clean one shows
    var prev = from.firstChild && from.firstChild.probeView, S = this.S;
    if (prev && prev.state().layer === data.layers[0]) {  // keep the reader's choice of heads across edits
      data.initial = {layer: 0, heads: prev.state().heads.filter(function (h) { return !data.removed[0][h]; })};
    } else if (S.head !== null && S.head[0] === data.layers[0]) {
      data.initial = {layer: 0, heads: [S.head[1]]};
    }
    clear(box);
    var div = el("div"); box.appendChild(div);
    views.headView(div, data);
    return div.probeView;
  };
  L.drawGrid = function () {
    var g = this.gridData, S = this.S, self = this, info = this.info;
    if (!g) return;
    var t = clear(this.grid), stat = g.statistics[S.stat] || [], top = 0;
    stat.forEach(function (row) { row.forEach(function (v) { if (v !== null && Math.abs(v) > top) top = Math.abs(v); }); });
    var hr = el("tr"); hr.appendChild(el("th", null, ""));
    for (var h = 0; h < info.heads; h++) hr.appendChild(el("th", null, "H" + h));
    t.appendChild(hr);
    for (var l = 0; l < info.layers; l++) {
      var tr = el("tr"); tr.appendChild(el("th", null, "L" + l));
      for (h = 0; h < info.heads; h++) {
        var label = g.labels[l][h], v = stat[l] ? stat[l][h] : null;
        var td = el("td", "pl-cell", short(label));
        td.setAttribute("data-layer", String(l)); td.setAttribute("data-head", String(h));
        td.setAttribute("data-label", label || "");
        var a = v === null || !top ? 0 : Math.abs(v) / top;
        td.style.background = "rgba(44,111,187," + (0.08 + 0.8 * a).toFixed(3) + ")";
        td.style.color = a > 0.55 ? "#fff" : "#111";
        if (this.isOff(l, h)) td.classList.add("pl-off");
        if (S.head && S.head[0] === l && S.head[1] === h) td.classList.add("pl-chosen");
        td.title = info.headNames[l][h] + ": " + (g.allLabels[l][h] || label) + "\n" + Object.keys(g.statistics).map(
          function (k) { return k + " = " + fmt(g.statistics[k][l][h]); }).join("\n");
        td.addEventListener("click", this.clicked.bind(this, l, h));
        tr.appendChild(td);
      }
      t.appendChild(tr);
    }
    this.gridNote.textContent = "Cell: the head's label for this text (" + "\u00b7 mixed), shaded by " + S.stat +
      " (darkest " + fmt(top) + "). " + (S.off.length ? S.off.length + " head(s) switched off (" + S.kind + ")." : "");
    this.root.setAttribute("data-grid", String((Number(this.root.getAttribute("data-grid")) || 0) + 1));
  };
  L.isOff = function (l, h) { return this.S.off.some(function (x) { return x[0] === l && x[1] === h; }); };
  L.clicked = function (l, h) {
    var S = this.S;
    if (S.mode === "off") {
      if (this.isOff(l, h)) S.off = S.off.filter(function (x) { return !(x[0] === l && x[1] === h); });
      else S.off.push([l, h]);
      this.drawGrid();
      return this.ablate();
    }
    S.head = [l, h];
    this.drawGrid();
    if (l !== S.layer) {  // the maps follow the head: its layer's head view (and then its steps)
      S.layer = l; this.layerSel.value = String(l);
      return this.edit();
    }
    var hv = this.headViewBox.firstChild && this.headViewBox.firstChild.probeView;
    if (hv) hv.setHeads([h]);
    return this.inspect(l, h);
  };

  // ------------------------------------------------------------------ a head: steps and why
  L.inspect = function (l, h) {
    var self = this, S = this.S;
    if (!S.text.trim()) return Promise.resolve(null);
    var body = {text: S.text, layer: l, head: h};
    if (S.query !== null) body.query = S.query;
    return this.request("head", body).then(function (r) {
      if (!r) return null;
      self.last.head = r; self.counts.head += 1;
      self.drawHead(r);
      self.root.setAttribute("data-heads", String(self.counts.head));
      return r;
    });
  };
  L.drawHead = function (r) {
    var self = this, box = clear(this.headBox), name = this.info.headNames[r.layer][r.head];
    var label = this.gridData ? this.gridData.labels[r.layer][r.head] : "";
    // two labels, said apart: the grid's is this text's; why's is probe why's (the sample texts', labelsNote)
    box.appendChild(el("div", "pl-title", name + (label ? " \u00b7 " + label + " on this text" : "") + ": query " + r.query +
      (r.queryFrom === "mask" ? " (the mask token: the position the output panel predicts at)" : "")));
    var stepsBox = el("div", "pl-view pl-steps"); box.appendChild(stepsBox);
    if (r.steps) {
      var div = el("div"); stepsBox.appendChild(div);
      views.stepView(div, r.steps);
      div.addEventListener("probe-query", function (e) {
        if (e.detail.query !== self.S.query && e.detail.query !== r.query) { self.S.query = e.detail.query; self.inspect(r.layer, r.head); }
      });
    } else {
      stepsBox.appendChild(el("div", "pl-refusal", titled("Attention steps", r.stepsRefusal)));
    }
    var whyBox = el("div", "pl-why"); box.appendChild(whyBox);
    if (!r.why) { whyBox.appendChild(el("div", "pl-refusal", titled("Why", r.whyRefusal))); return; }
    var w = r.why;
    whyBox.appendChild(el("div", "pl-title", "Why " + w.head + (w.label ? " (" + w.label + " over the sample texts)" : "") +
      " attends where it does at query " + w.query + " (" + JSON.stringify(w.query_token) +
      "): each score split by the sources of its query and key"));
    if (w.labelsNote || w.labelsRefusal) whyBox.appendChild(el("div", "pl-note pl-labels", w.labelsNote || w.labelsRefusal));
    var checks = el("div", "pl-check");
    checks.textContent = (w.holds ? "check holds: " : "check FAILS: ") + w.checks.map(function (c) {
      return "key " + c.key + ": sum " + fmt(c.sum, 5) + " vs score " + fmt(c.score, 5);
    }).join("; ") + " (largest gap " + Number(w.residual).toExponential(2) + ", tolerance " +
      Number(w.tolerance).toExponential(2) + ")";
    whyBox.appendChild(checks);
    var scroll = el("div", "pl-scroll"), t = el("table", "pl-table");
    var hr = el("tr");
    ["key", "token", "attention", "score", "query source", "its label", "key source", "its label",
     "contribution"].forEach(function (c) {
      hr.appendChild(el("th", null, c)); });
    t.appendChild(hr);
    var byKey = {};
    w.pairs.forEach(function (p) { (byKey[p.key] = byKey[p.key] || []).push(p); });
    w.top_keys.forEach(function (k) {
      (byKey[k.key] || []).slice(0, 4).forEach(function (p, i) {
        var tr = el("tr", i === 0 ? "pl-first" : null);
        [i === 0 ? String(p.key) : "", i === 0 ? p.key_token : "", i === 0 ? fmt(p.attention) : "",
         i === 0 ? fmt(p.score) : "", p.query_source, p.query_label || "", p.key_source, p.key_label || "",
         fmt(p.contribution)].forEach(function (c) {
          tr.appendChild(el("td", null, c)); });
        t.appendChild(tr);
      });
    });
    scroll.appendChild(t); whyBox.appendChild(scroll);
  };

  // ------------------------------------------------------------------ ablation
  L.ablate = function () {
    var self = this, S = this.S;
    if (!S.text.trim()) return Promise.resolve(null);
    if (!S.off.length) {
      clear(this.outBox); clear(this.ablatedBox); this.last.ablate = null;
      return Promise.resolve(null);
    }
    return this.request("ablate", {text: S.text, heads: S.off.slice(), ablation: S.kind, layer: S.layer}).then(function (r) {
      if (!r) return null;
      self.last.ablate = r; self.counts.ablate += 1;
      self.drawOutput(r);
      self.root.setAttribute("data-ablations", String(self.counts.ablate));
      return r;
    });
  };
  L.drawOutput = function (r) {
    var box = clear(this.outBox), o = r.output, names = this.info.headNames;
    box.appendChild(el("div", "pl-title", "Switched off (" + r.ablation + "): " + r.heads.map(function (x) {
      return names[x[0]][x[1]]; }).join(", ")));
    box.appendChild(el("div", "pl-note", o.what));
    if (o.kind === "embedding") {
      var c = el("div", "pl-cosine", "cosine to the unablated embedding: " + fmt(o.cosine, 6));
      c.setAttribute("data-cosine", String(o.cosine));
      box.appendChild(c);
    } else if (o.tokens) {
      var scroll = el("div", "pl-scroll"), t = el("table", "pl-table pl-probs"), hr = el("tr");
      ["token", "before", "after", "change"].forEach(function (c) { hr.appendChild(el("th", null, c)); });
      t.appendChild(hr);
      o.tokens.forEach(function (row) {
        var tr = el("tr");
        tr.setAttribute("data-id", String(row.id));
        [JSON.stringify(row.token), fmt(row.before, 4), fmt(row.after, 4),
         (row.after >= row.before ? "+" : "") + fmt(row.after - row.before, 4)].forEach(function (c) {
          tr.appendChild(el("td", null, c)); });
        t.appendChild(tr);
      });
      scroll.appendChild(t); box.appendChild(scroll);
    }
    clear(this.ablatedBox).appendChild(el("div", "pl-title", "The same layer with the heads switched off"));
    var hv = el("div"); this.ablatedBox.appendChild(hv);
    this.drawHeadView(hv, r.headView, "ablated");
  };

  // ------------------------------------------------------------------ patching
  L.patch = function () {
    var self = this, S = this.S, key = S.text + "\u0000" + S.corrupted;
    if (!S.corrupted.trim() || !S.text.trim()) { clear(this.patchBox); this.patched = null; return Promise.resolve(null); }
    if (key === this.patched) return Promise.resolve(this.last.patch);  // drawn already (a layer changed, not a text)
    var watch = this.watchProgress();
    return this.request("patch", {text: S.text, corrupted: S.corrupted}).then(function (r) {
      watch.stop();
      if (!r) return null;
      self.last.patch = r; self.counts.patch += 1; self.patched = key;
      self.drawPatch(r);
      self.root.setAttribute("data-patches", String(self.counts.patch));
      return r;
    });
  };
  // while a patch request runs: its progress (GET /api/progress, or the widget's last message) every PROGRESS_MS
  L.watchProgress = function () {
    var self = this, line = el("div", "pl-note pl-progress", "patching: starting\u2026"), timer = null, on = true;
    var t0 = performance.now();
    this.patchBox.insertBefore(line, this.patchBox.firstChild);
    function poll() {
      self.transport("progress", {page: self.page}).then(function (res) {
        if (!on) return;
        var p = res && res.status === 200 ? res.body : null;
        if (p && p.busy && p.yours && p.route === "patch") line.textContent = progressLine(p);
        else if (p && p.busy && !p.yours) line.textContent = "patching: waiting for another page's request (" +
          ((performance.now() - t0) / 1000).toFixed(0) + " s)";
        self.root.setAttribute("data-progress", line.textContent);
        timer = setTimeout(poll, PROGRESS_MS);
      }, function () { if (on) timer = setTimeout(poll, PROGRESS_MS); });
    }
    timer = setTimeout(poll, PROGRESS_MS);
    return {stop: function () { on = false; if (timer) clearTimeout(timer); if (line.parentNode) line.parentNode.removeChild(line); }};
  };
  function progressLine(p) {
    var s = "patching: " + (p.total ? p.done + " of " + p.total + " patched runs" : "the clean and corrupted runs") +
      ", " + p.seconds.toFixed(0) + " s so far";
    return p.estimate ? s + "; " + p.estimate : s;
  }
  L.drawPatch = function (r) {
    var box = clear(this.patchBox), info = this.info, top = 0;
    box.appendChild(el("div", "pl-title", "Activation patching (denoising): each head's clean output put into the " +
      "corrupted run; answer " + JSON.stringify(r.answer) + " vs " + JSON.stringify(r.wrong)));
    box.appendChild(el("div", "pl-note", "logit difference clean " + fmt(r.ldClean) + ", corrupted " +
      fmt(r.ldCorrupted) + (r.normalized ? "; effect 1 = all of it restored" : "; raw differences (logits)") +
      (r.notes.length ? ". " + r.notes.join(" ") : "")));
    r.effect.forEach(function (row) { row.forEach(function (v) { if (v !== null) top = Math.max(top, Math.abs(v)); }); });
    var scroll = el("div", "pl-scroll"), t = el("table", "pl-grid pl-effects"), hr = el("tr");
    hr.appendChild(el("th", null, ""));
    for (var h = 0; h < info.heads; h++) hr.appendChild(el("th", null, "H" + h));
    t.appendChild(hr);
    for (var l = 0; l < info.layers; l++) {
      var tr = el("tr"); tr.appendChild(el("th", null, "L" + l));
      for (h = 0; h < info.heads; h++) {
        var v = r.effect[l][h], a = v === null || !top ? 0 : v / top, td = el("td", "pl-cell", fmt(v, 2));
        td.style.background = a >= 0 ? "rgba(200,40,40," + (0.05 + 0.8 * a).toFixed(3) + ")" :
          "rgba(40,80,200," + (0.05 - 0.8 * a).toFixed(3) + ")";
        td.title = info.headNames[l][h] + ": effect " + fmt(v, 4) + " (last position " + fmt(r.effectLast[l][h], 4) + ")";
        td.setAttribute("data-effect", String(v));
        tr.appendChild(td);
      }
      t.appendChild(tr);
    }
    scroll.appendChild(t); box.appendChild(scroll);
  };

  // ------------------------------------------------------------------ API (tests)
  L.api = function () {
    var self = this;
    return {
      state: function () { return JSON.parse(JSON.stringify(self.S)); },
      counts: function () { return JSON.parse(JSON.stringify(self.counts)); },
      timings: function () { return JSON.parse(JSON.stringify(self.timings)); },
      last: function (route) { return self.last[route] || null; },
      errors: function () { return JSON.parse(JSON.stringify(self.errors)); },
      grid: function () {  // the labels as drawn
        return Array.prototype.map.call(self.grid.querySelectorAll("tr"), function (tr) {
          return Array.prototype.map.call(tr.querySelectorAll("td"), function (td) { return td.getAttribute("data-label"); });
        }).slice(1);
      },
      type: function (text) { self.textBox.value = text; self.textBox.dispatchEvent(new Event("input")); },
      click: function (l, h) { return self.clicked(l, h); },
      setMode: function (m) { self.modeSel.value = m; self.modeSel.dispatchEvent(new Event("change")); }
    };
  };

  views.live = function (root, transport, text) {
    var live = new Live(root, transport);
    root.probeLive = live.api();
    root.setAttribute("data-ready", "0");
    return transport("info", {}).then(function (res) {
      if (res.status !== 200) {
        clear(root).appendChild(el("div", "pl-error", "probe live: " + (res.body && res.body.error || res.status)));
        return null;
      }
      live.build(res.body);
      root.setAttribute("data-ready", "1");
      if (text) { live.textBox.value = text; return live.edit(); }
      return null;
    }, function (err) {
      clear(root).appendChild(el("div", "pl-error", "probe live: no answer from the server (" + err + ")"));
    });
  };
})();
