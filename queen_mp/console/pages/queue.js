// One queue: its configuration (editable with read-write), partitions, each consumer group's lag
// per partition (/api/v1/status/queues/{queue}), and a message browser by partition and status,
// over a recent range, from a time or from an offset of one partition
// (/api/v1/status/queues/{queue}/messages, /api/v1/messages/{partitionId}/{transactionId}).
import { act, api, badge, button, can, h, num, payloadView, q, replace, section, seg, table, toast, when } from '../lib.js';

const PAGE = 50;
const RANGES = [['15 min', 900], ['1 hour', 3600], ['24 hours', 86400], ['7 days', 604800], ['30 days', 2592000]];
// the browser's modes besides a range: from a time (up to now), from an offset of one partition
const FROM_TIME = 'time';
const FROM_OFFSET = 'offset';
const STATUSES = ['', 'pending', 'processing', 'completed', 'dead_letter'];

function configForm(name, detail, reload) {
  const options = detail.options || {};
  const editable = can('read-write');
  const inputs = {};
  const rows = Object.keys(options).sort().map((k) => {
    const v = options[k];
    const input = typeof v === 'boolean'
      ? h('input', { type: 'checkbox', checked: v, disabled: !editable, name: k })
      : h('input', { type: 'number', value: String(v), disabled: !editable, name: k, step: 'any' });
    inputs[k] = input;
    return h('tr', h('th', h('label', k)), h('td', input));
  });
  const save = button('read-write', 'Save configuration', (btn) => act(btn, 'Configuration saved', async () => {
    const changed = {};
    for (const [k, input] of Object.entries(inputs)) {
      const v = input.type === 'checkbox' ? input.checked : Number(input.value);
      if (v !== options[k]) changed[k] = v;
    }
    await api('/api/v1/configure', { method: 'POST', body: { queue: name, options: changed } });
    reload();
  }));
  return h('form.config', { on: { submit: (e) => e.preventDefault() } },
    h('table.kv', h('tbody', rows)), save);
}

function groupLag(detail) {
  const groups = detail.consumerGroups || [];
  if (!groups.length) return h('p.muted.empty', 'No consumer has popped from this queue yet.');
  return h('div', groups.map((g) => h('div.group',
    h('h3', g.name === '__QUEUE_MODE__' ? 'queue mode' : g.name, ' ',
      badge(`${num(g.pending)} behind`, g.pending ? 'warn' : 'ok'), ' ', badge(`${g.members} members`)),
    table([
      { label: 'Partition', value: (c) => c.partition },
      { label: 'Committed', num: true, value: (c) => num(c.committedOffset) },
      { label: 'Last offset', num: true, value: (c) => num(c.lastOffset) },
      { label: 'Lag', num: true, value: (c) => num(c.pending) },
      { label: 'Lease', value: (c) => (c.leaseActive ? `until ${new Date(c.leaseExpiresAt).toLocaleTimeString()}` : '—') },
      { label: 'Last consumed', value: (c) => when(c.lastConsumedAt) },
    ], g.cursors || []))));
}

function payloadNote(msg) {
  if (!msg.encrypted) return '';
  if (msg.dataWithheld) return ' (encrypted, withheld from this role)';
  return msg.data === null ? ' (encrypted, not decryptable here)' : ' (decrypted by the broker)';
}

function messageView(msg, afterChange) {
  const dead = msg.status === 'dead_letter';
  const path = `/api/v1/messages/${seg(msg.partitionId)}/${seg(msg.transactionId)}`;
  return h('div.message', { dataset: { testid: 'message-detail' } },
    h('h3', 'Message ', h('code', msg.transactionId)),
    h('table.kv', h('tbody',
      [['Partition', `${msg.partition} (id ${msg.partitionId})`], ['Offset', msg.offset], ['Status', msg.status],
        ['Created', msg.createdAt], ['Message id', msg.id], ['Trace id', msg.traceId || '—'],
        ['Producer', msg.producerSub || '—'], ['Error', msg.errorMessage || '—'], ['Retries', msg.retryCount ?? '—']]
        .map(([k, v]) => h('tr', h('th', k), h('td', String(v)))))),
    h('h4', 'Payload', payloadNote(msg)),
    payloadView(msg),
    h('h4', 'Consumer groups'),
    table([{ label: 'Group', value: (g) => g.name }, { label: 'Status', value: (g) => g.status }],
      msg.consumerGroups || []),
    dead ? h('div.actions',
      button('read-write', 'Retry', (btn) => act(btn, 'Dead letter replayed', async () => {
        await api(`${path}/retry`, { method: 'POST' });
        afterChange();
      })),
      button('read-write', 'Delete dead letter', (btn) => {
        if (!window.confirm('Delete this dead letter? The log keeps the message.')) return;
        act(btn, 'Dead letter deleted', async () => {
          await api(path, { method: 'DELETE' });
          afterChange();
        });
      }, 'danger')) : null);
}

// The browser's window: a range up to the anchor, everything from a time, or one partition
// from an offset (the API wants the partition then: offsets are per partition).
function windowOf(range, fromTime, fromOffset, partition, anchor) {
  if (range.value === FROM_TIME) {
    const t = new Date(fromTime.value);
    return Number.isNaN(t.getTime()) ? { missing: 'Pick the time to browse from.' } : { from: t.toISOString() };
  }
  if (range.value === FROM_OFFSET) {
    if (!partition.value) return { missing: 'Pick a partition: offsets are per partition.' };
    const n = Number(fromOffset.value || '1');
    return Number.isInteger(n) && n >= 1 ? { fromOffset: n } : { missing: 'The offset is a whole number from 1.' };
  }
  return { from: new Date(anchor.getTime() - Number(range.value) * 1000).toISOString(), to: anchor.toISOString() };
}

function browser(name, detail) {
  const partition = h('select', { name: 'partition', 'aria-label': 'Partition' },
    h('option', { value: '' }, 'every partition'),
    (detail.partitions || []).map((p) => h('option', { value: p.name }, p.name)));
  const status = h('select', { name: 'status', 'aria-label': 'Status' },
    STATUSES.map((s) => h('option', { value: s }, s || 'any status')));
  const range = h('select', { name: 'range', 'aria-label': 'Created within' },
    RANGES.map(([label, s]) => h('option', { value: String(s) }, `last ${label}`)),
    h('option', { value: FROM_TIME }, 'from a time…'), h('option', { value: FROM_OFFSET }, 'from an offset…'));
  range.value = '86400';
  const fromTime = h('input', { type: 'datetime-local', name: 'fromTime', 'aria-label': 'From time', step: 1, hidden: true });
  const fromOffset = h('input', { type: 'number', name: 'fromOffset', 'aria-label': 'From offset', min: 1, step: 1, placeholder: 'offset', hidden: true });
  const list = h('div');
  const view = h('div');
  const pager = h('div.pager');
  let offset = 0;
  let anchor = new Date();
  let latest = 0; // the newest load
  const load = async () => {
    fromTime.hidden = range.value !== FROM_TIME;
    fromOffset.hidden = range.value !== FROM_OFFSET;
    const mine = ++latest;
    const win = windowOf(range, fromTime, fromOffset, partition, anchor);
    if (win.missing) {
      replace(list, h('p.muted.empty', win.missing));
      replace(pager);
      return;
    }
    const page = await api(`/api/v1/status/queues/${seg(name)}/messages${q({
      partition: partition.value, status: status.value, ...win, limit: PAGE, offset })}`);
    if (mine !== latest) return; // an older answer arriving after a newer load
    replace(list, table([
      { label: 'Partition', value: (m) => m.partition },
      { label: 'Offset', num: true, value: (m) => num(m.offset) },
      { label: 'Transaction id', value: (m) => h('button.link', {
        type: 'button', on: { click: () => open(m).catch((e) => toast(e.message, 'error')) }, dataset: { testid: 'message-row' } }, m.transactionId) },
      { label: 'Status', value: (m) => badge(m.status, m.status === 'dead_letter' ? 'warn' : '') },
      { label: 'Created', value: (m) => when(m.createdAt) },
    ], page.messages, { empty: 'No message in this range.' }));
    replace(pager, `${num(page.total)} messages · `,
      h('button', { type: 'button', disabled: offset === 0, on: { click: () => { offset = Math.max(0, offset - PAGE); load(); } } }, 'Previous'),
      h('button', { type: 'button', disabled: offset + PAGE >= page.total, on: { click: () => { offset += PAGE; load(); } } }, 'Next'));
  };
  const open = async (m) => {
    const msg = await api(`/api/v1/messages/${seg(m.partitionId)}/${seg(m.transactionId)}`);
    replace(view, messageView(msg, () => { replace(view); load(); }));
  };
  const refresh = () => { offset = 0; anchor = new Date(); load().catch((e) => toast(e.message, 'error')); };
  for (const s of [partition, status, range, fromTime, fromOffset]) s.addEventListener('change', refresh);
  load();
  return h('div.browser',
    h('div.toolbar', partition, status, range, fromTime, fromOffset,
      h('button', { type: 'button', on: { click: refresh } }, 'Refresh')),
    list, pager, view);
}

export async function render(main, args, life) {
  const name = args[0];
  const head = h('div.head');
  const body = h('div');
  main.append(h('p.crumbs', h('a', { href: '#/queues' }, 'Queues'), ' / ', name), head, body);
  const load = async () => {
    const d = await api(`/api/v1/status/queues/${seg(name)}`);
    if (!life.alive) return;
    const m = d.totals.messages;
    replace(head, h('h1', name),
      h('p.muted', `namespace ${d.namespace || '—'} · task ${d.task || '—'} · created ${d.createdAt}`),
      h('div.cards',
        [['Backlog', m.pending], ['Processing', m.processing], ['Dead letters', m.deadLetter], ['Retained', m.total],
          ['Partitions', d.totals.partitions], ['Evicted', d.totals.evicted]]
          .map(([k, v]) => h('div.card', h('div.card-label', k), h('div.card-value', num(v))))),
      h('div.actions', button('admin', 'Delete queue', (btn) => {
        if (!window.confirm(`Delete queue ${name} with all its messages, cursors and dead letters?`)) return;
        act(btn, 'Queue deleted', async () => {
          await api(`/api/v1/resources/queues/${seg(name)}`, { method: 'DELETE' });
          location.hash = '#/queues';
        });
      }, 'danger')));
    replace(body,
      section('Partitions', table([
        { label: 'Partition', value: (p) => p.name },
        { label: 'Id', num: true, value: (p) => p.id },
        { label: 'Backlog', num: true, value: (p) => num(p.messages.pending) },
        { label: 'Processing', num: true, value: (p) => num(p.messages.processing) },
        { label: 'Retained', num: true, value: (p) => num(p.messages.total) },
        { label: 'Offsets', value: (p) => `${p.logStartOffset ?? '—'} … ${p.lastOffset ?? '—'}` },
        { label: 'Last write', value: (p) => when(p.lastWriteAt) },
      ], d.partitions || [])),
      section('Consumer groups', groupLag(d)),
      section('Messages', browser(name, d)),
      section('Configuration', configForm(name, d, load)));
  };
  await load();
}
