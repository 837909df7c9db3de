// {{name}}'s tests, natively: `node --test test/` (or `npm test`) in this
// folder, no install needed. acemq-testing.mjs stands in for the host: it
// answers the WIT imports and records what the handler logged and
// published, so these test the decisions, not the build.
import { register } from 'node:module';
import { test } from 'node:test';
import assert from 'node:assert/strict';

// The test host is its own module hook: `acemq:plugin/host@0.4.0` (and
// `acemq:plugin/state@0.4.0`) resolve to it.
register('../acemq-testing.mjs', import.meta.url);
const { TestHost, message } = await import('../acemq-testing.mjs');
const { handler } = await import('../app.js');

const text = (bytes) => new TextDecoder().decode(bytes);

test('forwards the body in capitals', () => {
  const host = new TestHost({ config: { forward_to: 'out' }, publishTo: ['out'] });
  assert.deepEqual(host.handle(handler, message('hello')), { tag: 'accept' });
  assert.equal(host.published.length, 1);
  const [out] = host.published;
  assert.deepEqual([out.exchange, out.routingKey, text(out.body)], ['out', 'test', 'HELLO']);
  assert.deepEqual(host.logs, [['info', "5 bytes with routing key 'test'"]]);
});

test('accepts without forwarding when not configured', () => {
  const host = new TestHost();
  assert.deepEqual(host.handle(handler, message('hello')), { tag: 'accept' });
  assert.deepEqual(host.published, []);
});

test('rejects an empty body', () => {
  const host = new TestHost();
  assert.deepEqual(host.handle(handler, message('  ')), { tag: 'reject', val: 'the body is empty' });
});
