// System: the instance (/health), its pool and requests (/metrics), the disk spool
// (/api/v1/status/buffers), and the maintenance switches (admin: /api/v1/system/maintenance*).
import { act, api, badge, button, bytes, duration, h, num, replace, section } from '../lib.js';

const POLL_MS = 3000;

const kv = (pairs) => h('table.kv', h('tbody', pairs.map(([k, v]) => h('tr', h('th', k), h('td', v)))));

export async function render(main, _args, life) {
  const instance = h('div');
  const maintenance = h('div');
  const spool = h('div');
  main.append(h('h1', 'System'), section('Instance', instance), section('Maintenance', maintenance),
    section('Disk spool', spool));
  const load = async () => {
    const [health, m, buf] = await Promise.all([api('/health'), api('/metrics'), api('/api/v1/status/buffers')]);
    if (!life.alive) return;
    replace(instance, kv([
      ['Status', badge(health.status, health.status === 'healthy' ? 'ok' : 'warn')],
      ['Instance', health.instance], ['Version', health.version], ['Uptime', duration(health.uptimeSeconds)],
      ['Shards alive', `${health.shards.alive} of ${health.shards.total}`],
      ['Answered by front worker', String(health.workerId)],
      ['PostgreSQL', `${health.database}${health.databaseHost ? ` · ${health.databaseHost}` : ''}${
        health.databaseWritable === false ? ' · read-only (standby)' : ''}`],
      ['Pool (this worker)', `${num(m.database.poolSize)} connections · ${num(m.database.idleConnections)} idle · ${
        num(m.database.waitingRequests)} waiting`],
      ['Requests', `${num(m.requests.total)} since start`],
      ['Parked pops', num(m.parkedPops)],
      ['Fusion', `${num(m.fusion.commits)} commits · ${num(m.fusion.segmentsPerCommit, 2)} segments per commit`],
      health.error ? ['Problem', h('span.error-text', health.error)] : null,
    ].filter(Boolean)));
    const toggle = (label, path, on) => h('div.switch', { dataset: { testid: path.endsWith('/pop') ? 'pop-maintenance' : 'push-maintenance' } },
      h('span', label, ' ', on ? badge('on', 'warn') : badge('off', 'ok')),
      button('admin', on ? 'Turn off' : 'Turn on', (btn) => act(btn, `${label} ${on ? 'off' : 'on'}`, async () => {
        await api(path, { method: 'POST', body: { enabled: !on } });
        await load();
      })));
    replace(maintenance,
      h('p.muted', 'Push maintenance writes pushes to the disk spool (answered "buffered") and replays them when turned off; pop maintenance makes pops claim nothing.'),
      toggle('Push maintenance', '/api/v1/system/maintenance', health.maintenanceMode),
      toggle('Pop maintenance', '/api/v1/system/maintenance/pop', health.popMaintenanceMode));
    replace(spool, kv([
      ['Pending', num(buf.pending)], ['Failed for good', num(buf.failed)], ['Files', `${num(buf.files)} · ${bytes(buf.bytes)}`],
      ['Draining', buf.draining ? 'yes' : 'no'], ['Last drain', buf.lastDrainAt || '—'],
      ['Database healthy', buf.dbHealthy ? 'yes' : 'no'],
    ]), h('div.actions', button('admin', 'Drain now', (btn) => act(btn, 'Drain started', async () => {
      await api('/api/v1/system/spool/drain', { method: 'POST', body: {} });
      await load();
    }))));
  };
  life.every(POLL_MS, load);
}
