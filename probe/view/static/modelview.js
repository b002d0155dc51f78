/* probe model view: every head of every site as a thumbnail of one example's attention map.
 * Plain JavaScript, no library, no network request, no eval; runs under "default-src 'none';
 * script-src 'unsafe-inline'; style-src 'unsafe-inline'". Markup (probe/view/modelview.py): a div of
 * class "probe-mv" holding a style element, a JSON script element of class "probe-mv-data" and this
 * script, which mounts the view it sits in. One canvas per grid (site kind), its pixels written at once
 * (putImageData): a cell's colour is white for 0 and dark blue for 1, red channel = 255 - value.
 * Each thumbnail's border has its head's primary label colour (grey: none). A click opens the head in
 * the head view named by data.target (element.probeView.setLayer / setHeads) and sends the event "probe-open"
 * ({site, head}) from the view's element (a listener that cancels it opens the head itself). Its draw function is probeViews.modelView(element, data). The mounted element gets
 * element.probeModelView (timings, cells, pixel read-back, click points) used by tests.
 */
(function (script) {
  "use strict";
  var BOX = 40, GAP = 6, LEFT = 44, TOP = 18, BORDER = 2, FONT = "11px sans-serif";

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function bytes(b64) {
    var s = atob(b64), out = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  function hex(c) { return [parseInt(c.slice(1, 3), 16), parseInt(c.slice(3, 5), 16), parseInt(c.slice(5, 7), 16)]; }

  function Grid(view, g) {
    var data = view.data, self = this;
    this.view = view; this.sites = g.sites;
    var first = data.sites[g.sites[0]];
    var nq = 0, nk = 0, rows = 0, cols = 0;
    g.sites.forEach(function (x) {
      var s = data.sites[x];
      nq = Math.max(nq, s.nq); nk = Math.max(nk, s.nk); rows = Math.max(rows, s.rows); cols = Math.max(cols, s.cols);
    });
    var m = Math.max(nq, nk);  // the map's shape, and at least one pixel per cell
    this.w = Math.max(8, cols + 2 * BORDER, Math.round(BOX * nk / m));
    this.h = Math.max(8, rows + 2 * BORDER, Math.round(BOX * nq / m));
    this.heads = first.heads.length;
    this.W = LEFT + this.heads * (this.w + GAP); this.H = TOP + g.sites.length * (this.h + GAP);
    if (g.title) view.root.appendChild(el("div", "mv-grid-title", g.title));
    this.scroll = el("div", "mv-scroll"); this.canvas = el("canvas");
    this.canvas.width = this.W; this.canvas.height = this.H;
    this.canvas.style.width = this.W + "px"; this.canvas.style.height = this.H + "px";
    this.scroll.appendChild(this.canvas); view.root.appendChild(this.scroll);
    this.decoded = g.sites.map(function (x) { return data.sites[x].heads.map(bytes); });
    this.canvas.addEventListener("mousemove", function (e) { self.hover(e); });
    this.canvas.addEventListener("mouseleave", function () { view.tip.style.display = "none"; });
    this.canvas.addEventListener("click", function (e) { var c = self.at(e); if (c) view.open(c.site, c.head); });
  }
  var G = Grid.prototype;
  G.origin = function (r, h) { return {x: LEFT + h * (this.w + GAP) + BORDER, y: TOP + r * (this.h + GAP) + BORDER}; };
  G.draw = function () {
    var ctx = this.canvas.getContext("2d", {willReadFrequently: true}), data = this.view.data, self = this;  // read back by tests
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, this.W, this.H);
    var img = ctx.createImageData(this.W, this.H), px = img.data;
    for (var i = 0; i < px.length; i += 4) { px[i] = px[i + 1] = px[i + 2] = 255; px[i + 3] = 255; }
    var iw = this.w - 2 * BORDER, ih = this.h - 2 * BORDER;
    this.sites.forEach(function (x, r) {
      var s = data.sites[x], rows = s.rows, cols = s.cols;
      var sw = iw, sh = ih;
      for (var h = 0; h < s.heads.length; h++) {
        var cells = self.decoded[r][h], o = self.origin(r, h);
        for (var yy = 0; yy < sh; yy++) {
          var ci = Math.floor(yy * rows / sh) * cols, base = ((o.y + yy) * self.W + o.x) * 4;
          for (var xx = 0; xx < sw; xx++) {
            var v = cells[ci + Math.floor(xx * cols / sw)], p = base + xx * 4;
            px[p] = 255 - v; px[p + 1] = 255 - Math.round(v * 0.75); px[p + 2] = 255 - Math.round(v * 0.3);
          }
        }
      }
    });
    ctx.putImageData(img, 0, 0);
    ctx.font = FONT; ctx.fillStyle = "#444"; ctx.textBaseline = "middle";
    for (var h = 0; h < this.heads; h++) ctx.fillText("H" + h, LEFT + h * (this.w + GAP) + 2, TOP / 2);
    this.sites.forEach(function (x, r) {
      var s = data.sites[x];
      ctx.fillStyle = "#444"; ctx.fillText("L" + s.layer, 4, TOP + r * (self.h + GAP) + self.h / 2);
      s.labels.forEach(function (lab, h) {
        var fam = lab ? data.families[lab] : "", c = (fam && data.colors[fam]) || "#cccccc";
        if (c.toUpperCase() === "#FFFFFF") c = "#cccccc";
        ctx.strokeStyle = c; ctx.lineWidth = BORDER;
        var o = self.origin(r, h);
        ctx.strokeRect(o.x - BORDER / 2, o.y - BORDER / 2, iw + BORDER, ih + BORDER);
      });
    });
  };
  G.at = function (e) {
    var rect = this.canvas.getBoundingClientRect(), x = e.clientX - rect.left - LEFT, y = e.clientY - rect.top - TOP;
    if (x < 0 || y < 0) return null;
    var h = Math.floor(x / (this.w + GAP)), r = Math.floor(y / (this.h + GAP));
    if (h >= this.heads || r >= this.sites.length || x % (this.w + GAP) > this.w || y % (this.h + GAP) > this.h) return null;
    return {site: this.sites[r], head: h, row: r};
  };
  G.hover = function (e) {
    var c = this.at(e), tip = this.view.tip, s = c && this.view.data.sites[c.site];
    if (!c) { tip.style.display = "none"; return; }
    tip.textContent = s.names[c.head] + (s.labels[c.head] ? " \u00b7 " + s.labels[c.head] : "") + "\nclick: open in the head view";
    var host = this.view.root.getBoundingClientRect();
    tip.style.left = (e.clientX - host.left + 12) + "px"; tip.style.top = (e.clientY - host.top + 12) + "px";
    tip.style.display = "block";
  };

  function View(root, data) {
    this.root = root; this.data = data; this.grids = []; this.opened = null;
    this.timings = {mountMs: 0, firstDrawMs: null, firstFrameMs: null};
  }
  View.prototype.open = function (site, head) {
    if (typeof CustomEvent === "function") {  // a page that draws the head view itself (the live page) takes it
      var ev = new CustomEvent("probe-open", {detail: {site: site, head: head}, cancelable: true});
      if (!this.root.dispatchEvent(ev)) { this.opened = {site: site, head: head}; return; }
    }
    var target = this.data.target && document.getElementById(this.data.target), name = this.data.sites[site].names[head];
    var at = this.data.shown.indexOf(site);
    if (!target || !target.probeView) { this.status.textContent = name + ": no head view on this page"; return; }
    if (at < 0) { this.status.textContent = name + ": its layer is not in the head view (size budget)"; return; }
    target.probeView.setLayer(at); target.probeView.setHeads([head]);
    this.opened = {site: site, head: head};
    this.status.textContent = name + " opened in the head view";
    if (target.scrollIntoView) target.scrollIntoView({block: "start"});
  };
  View.prototype.api = function () {
    var self = this;
    function find(site) {
      for (var g = 0; g < self.grids.length; g++) {
        var r = self.grids[g].sites.indexOf(site);
        if (r >= 0) return {grid: self.grids[g], row: r};
      }
      return null;
    }
    return {
      data: self.data, timings: self.timings,
      opened: function () { return self.opened; },
      cells: function (site, head) { var f = find(site); return Array.prototype.slice.call(f.grid.decoded[f.row][head]); },
      drawn: function (site, head) {  // every cell's value as drawn, read back from the canvas (one readback)
        var f = find(site), s = self.data.sites[site], g = f.grid, o = g.origin(f.row, head);
        var iw = g.w - 2 * BORDER, ih = g.h - 2 * BORDER, d = g.canvas.getContext("2d").getImageData(o.x, o.y, iw, ih).data;
        var out = [];
        for (var r = 0; r < s.rows; r++) {
          var row = [];
          for (var c = 0; c < s.cols; c++) {
            var x = Math.ceil(c * iw / s.cols), y = Math.ceil(r * ih / s.rows);  // the first pixel of cell (r, c)
            row.push(255 - d[(y * iw + x) * 4]);
          }
          out.push(row);
        }
        return out;
      },
      point: function (site, head) {
        var f = find(site), o = f.grid.origin(f.row, head);
        f.grid.canvas.scrollIntoView({block: "center"});
        var rect = f.grid.canvas.getBoundingClientRect();
        return {x: rect.left + o.x + 5, y: rect.top + o.y + 5};
      }
    };
  };

  // render(root, data): the one draw function (report, saved view, live page, notebook widget).
  function render(root, data) {
    var t0 = performance.now();
    if (root.classList) root.classList.add("probe-mv");
    var view = new View(root, data), fallback = root.querySelector(".mv-fallback");
    if (fallback) root.removeChild(fallback);
    if (view.data.title) root.appendChild(el("div", "mv-title", view.data.title));
    view.data.grids.forEach(function (g) { view.grids.push(new Grid(view, g)); });
    view.status = el("div", "mv-status", "Each thumbnail: one head's map (rows: queries, columns: keys; darker = " +
      "larger; a cell holds the largest probability of its block of tokens). Border: the head's primary label. " +
      "Click a thumbnail to open it in the head view.");
    view.tip = el("div", "mv-tip");
    root.appendChild(view.status); root.appendChild(view.tip);
    view.timings.mountMs = performance.now() - t0;
    view.grids.forEach(function (g) { g.draw(); });
    view.timings.firstDrawMs = performance.now() - t0;
    root.setAttribute("data-drawn", "1");
    requestAnimationFrame(function () { view.timings.firstFrameMs = performance.now() - t0; });
    root.probeModelView = view.api();
    return root.probeModelView;
  }
  function mount(root) {
    if (root.probeModelView) return root.probeModelView;
    var node = root.querySelector("script.probe-mv-data");
    if (!node) return null;
    return render(root, JSON.parse(node.textContent));
  }

  var views = (typeof window !== "undefined" ? window : globalThis);
  views = views.probeViews = views.probeViews || {};
  views.modelView = render;
  if (typeof document === "undefined") return;
  var host = script && script.parentNode;
  if (host && host.classList && host.classList.contains("probe-mv")) { host.probeModelView = mount(host); return; }
  var all = document.querySelectorAll(".probe-mv");
  for (var i = 0; i < all.length; i++) if (!all[i].probeModelView) all[i].probeModelView = mount(all[i]);
})(typeof document !== "undefined" ? document.currentScript : null);
