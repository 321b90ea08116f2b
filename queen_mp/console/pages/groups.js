// Consumer groups (/api/v1/consumer-groups): state, lag in messages and seconds, subscription;
// seek to the end or to a time (read-write), delete a group (admin).
import { act, api, badge, button, can, duration, h, num, replace, seg, table, when } from '../lib.js';

const POLL_MS = 5000;

export async function render(main, _args, life) {
  const list = h('div');
  main.append(h('h1', 'Consumer groups'),
    h('p.muted', 'Queue-mode consumers show as "queue mode". Lag counts the messages behind the group\'s cursors; time lag is the age of the oldest of them.'),
    list);
  const seekTo = (g, body, label) => (btn) => act(btn, label, async () => {
    await api(`/api/v1/consumer-groups/${seg(g.name)}/queues/${seg(g.queueName)}/seek`, { method: 'POST', body });
    await load();
  });
  const load = async () => {
    const groups = await api('/api/v1/consumer-groups');
    // an operator typing a seek time keeps the field: skip this redraw
    if (!life.alive || (list.contains(document.activeElement) && document.activeElement.tagName === 'INPUT')) return;
    replace(list, table([
      { label: 'Group', value: (g) => (g.name === '__QUEUE_MODE__' ? 'queue mode' : g.name) },
      { label: 'Queue', value: (g) => h('a', { href: `#/queues/${encodeURIComponent(g.queueName)}` }, g.queueName) },
      { label: 'State', value: (g) => badge(g.state, g.state === 'Stable' ? 'ok' : '') },
      { label: 'Members', num: true, value: (g) => num(g.members) },
      { label: 'Lag', num: true, value: (g) => num(g.totalLag) },
      { label: 'Time lag', num: true, value: (g) => duration(g.maxTimeLag) },
      { label: 'Subscription', value: (g) => g.subscriptionMode + (g.subscriptionTimestamp ? ` from ${g.subscriptionTimestamp}` : '') },
      { label: 'Last activity', value: (g) => when(g.lastActivityAt) },
      { label: '', value: (g) => (g.name === '__QUEUE_MODE__' ? '' : h('span.actions',
        button('read-write', 'Seek to end', seekTo(g, { toEnd: true }, `${g.name} moved to the end`)),
        can('read-write') ? h('input', { type: 'datetime-local', 'aria-label': 'Seek to time', on: {
          change: (e) => {
            if (Number.isNaN(new Date(e.target.value).getTime())) return; // cleared, or half typed
            seekTo(g, { timestamp: new Date(e.target.value).toISOString() }, `${g.name} moved`)(e.target);
          } } }) : null,
        button('admin', 'Delete', (btn) => {
          if (!window.confirm(`Delete consumer group ${g.name} (its cursors on every queue)?`)) return;
          act(btn, `${g.name} deleted`, async () => {
            await api(`/api/v1/consumer-groups/${seg(g.name)}`, { method: 'DELETE' });
            await load();
          });
        }, 'danger'))) },
    ], groups, { empty: 'No consumer group yet.' }));
  };
  life.every(POLL_MS, load);
}
