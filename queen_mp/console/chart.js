// A small SVG line chart that redraws in place: no library, a few dozen lines.
const NS = 'http://www.w3.org/2000/svg';
const W = 480;
const H = 150;
const PAD = { l: 44, r: 8, t: 8, b: 18 };

const svg = (tag, attrs = {}) => {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
};

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((m) => m >= v);
}

const short = (v) => (v >= 1e6 ? `${+(v / 1e6).toFixed(1)}M` : v >= 1e3 ? `${+(v / 1e3).toFixed(1)}k`
  : `${+v.toFixed(v < 10 ? 2 : 0)}`);

// series: [{name, cls}] ; each push() adds one point per series (null = a gap).
export class LineChart {
  constructor(title, series, { points = 60, unit = '' } = {}) {
    this.series = series.map((s) => ({ ...s, data: [] }));
    this.points = points;
    this.unit = unit;
    this.el = document.createElement('figure');
    this.el.className = 'chart';
    const cap = document.createElement('figcaption');
    cap.append(title);
    for (const s of this.series) {
      const key = document.createElement('span');
      key.className = `key ${s.cls}`;
      key.textContent = s.name;
      cap.append(key);
    }
    this.svg = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': title });
    this.el.append(cap, this.svg);
    this.draw();
  }

  push(...values) {
    this.series.forEach((s, i) => {
      s.data.push(values[i] ?? null);
      if (s.data.length > this.points) s.data.shift();
    });
    this.draw();
  }

  draw() {
    const all = this.series.flatMap((s) => s.data).filter((v) => v !== null);
    const max = niceMax(Math.max(0, ...all));
    const x = (i) => PAD.l + (i * (W - PAD.l - PAD.r)) / (this.points - 1);
    const y = (v) => H - PAD.b - (v / max) * (H - PAD.t - PAD.b);
    const nodes = [];
    for (const f of [0, 0.5, 1]) {
      nodes.push(svg('line', { x1: PAD.l, x2: W - PAD.r, y1: y(max * f), y2: y(max * f), class: 'grid' }));
      const t = svg('text', { x: PAD.l - 4, y: y(max * f) + 4, class: 'axis', 'text-anchor': 'end' });
      t.textContent = short(max * f) + (f === 1 ? this.unit : '');
      nodes.push(t);
    }
    for (const s of this.series) {
      const offset = this.points - s.data.length;
      let d = '';
      s.data.forEach((v, i) => {
        if (v === null) return;
        d += `${d && s.data[i - 1] !== null ? 'L' : 'M'}${x(i + offset).toFixed(1)},${y(v).toFixed(1)}`;
      });
      nodes.push(svg('path', { d: d || 'M0,0', class: `line ${s.cls}` }));
    }
    const label = svg('text', { x: W - PAD.r, y: H - 4, class: 'axis', 'text-anchor': 'end' });
    label.textContent = 'now';
    nodes.push(label);
    this.svg.replaceChildren(...nodes);
  }
}
