// The console's shell: the login (with JWT on), the hash router, and the polling lifecycle.
import { authMode, claims, getToken, h, replace, role, setToken } from './lib.js';

const PAGES = {
  overview: () => import('./pages/overview.js'),
  queues: () => import('./pages/queues.js'),
  queue: () => import('./pages/queue.js'),
  groups: () => import('./pages/groups.js'),
  dlq: () => import('./pages/dlq.js'),
  traces: () => import('./pages/traces.js'),
  system: () => import('./pages/system.js'),
};

const main = document.getElementById('main');
let current = null; // { timers: Set, alive: boolean }

// Per page: timers that stop when the operator leaves it, so no page polls in the background.
function lifecycle() {
  const life = { alive: true, timers: new Set() };
  life.every = (ms, fn) => {
    const tick = async () => {
      if (!life.alive) return;
      try {
        await fn();
      } catch (err) {
        showError(err);
      }
      if (life.alive) life.timers.add(setTimeout(tick, ms));
    };
    tick();
  };
  life.stop = () => {
    life.alive = false;
    life.timers.forEach(clearTimeout);
  };
  return life;
}

function showError(err) {
  if (err && err.status === 401) return; // the login form takes over
  const box = document.getElementById('page-error');
  if (box) replace(box, err.message || String(err));
}

function parseHash() {
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  let [page, ...rest] = parts;
  if (page === 'queues' && rest.length && rest[0]) page = 'queue';
  return { page: PAGES[page] ? page : 'overview', args: rest };
}

async function route() {
  if (current) current.stop();
  if (authMode() === 'jwt' && !getToken()) {
    login();
    return;
  }
  showWho();
  const { page, args } = parseHash();
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('active', a.dataset.page === (page === 'queue' ? 'queues' : page));
  }
  const life = (current = lifecycle());
  const mod = await PAGES[page]();
  if (!life.alive) return;
  const errorBox = h('div.error', { id: 'page-error', role: 'alert' });
  replace(main, errorBox);
  main.dataset.page = page;
  try {
    await mod.render(main, args, life);
  } catch (err) {
    showError(err);
  }
}

function showWho() {
  const who = document.getElementById('who');
  if (authMode() === 'off') {
    replace(who, h('span.muted', 'authentication off'));
    return;
  }
  const c = claims();
  replace(who, h('span', { dataset: { testid: 'role' } }, `${c.sub ? `${c.sub} · ` : ''}${role()}`),
    h('button.link', { type: 'button', on: { click: () => { setToken(null); route(); } } }, 'Sign out'));
}

function login(message) {
  replace(document.getElementById('who'));
  const input = h('textarea', { id: 'token', name: 'token', rows: 4, required: true, placeholder: 'eyJhbGciOi…', autocomplete: 'off' });
  const form = h('form.login', {
    on: {
      submit: (e) => {
        e.preventDefault();
        setToken(input.value.trim());
        route();
      },
    },
  },
  h('h1', 'Sign in'),
  h('p', 'This broker asks for a JWT (docs/api.md 1.5). It is kept for this tab only (sessionStorage) and sent to this broker alone.'),
  message ? h('p.error', message) : null,
  h('label', { for: 'token' }, 'Token'), input,
  h('button', { type: 'submit' }, 'Sign in'));
  replace(main, form);
  main.dataset.page = 'login';
  input.focus();
}

window.addEventListener('queen:unauthorized', () => {
  if (current) current.stop();
  setToken(null);
  login('The broker refused the token (missing, expired or not acceptable). Sign in again.');
});
window.addEventListener('hashchange', route);
route();
