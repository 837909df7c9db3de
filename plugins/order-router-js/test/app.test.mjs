// The Rust plugin's test cases, against app.js under Node:
// `node --test test/` here (plugins/order-router-js). The WIT import is faked
// (test/fake-host.mjs), so this tests the decisions and texts, not the build.
import { register } from 'node:module';
import { test } from 'node:test';
import assert from 'node:assert/strict';

// The test host acemq-host ships (guest-sdk/js): both WIT imports resolve to it.
const TESTING = '../../../guest-sdk/js/acemq-testing.mjs';
register(TESTING, import.meta.url);
const { TestHost, message } = await import(TESTING);
const { handler, f64Display, f64Json, serdeWording } = await import('../app.js');
// The WIT import as app.js sees it.
const wit = await import('acemq:plugin/host@0.4.0');

// The order router's host: `route(body)` is one call.
class RouterHost extends TestHost {
  constructor(options = {}) {
    super({ nowMs: 0n, ...options });
  }
  route(body) {
    return this.handle(handler, message(body));
  }
}

test('a valid order publishes an event and accepts', () => {
  const host = new RouterHost({ nowMs: 42n });
  const outcome = host.route('{"id":"o-1","customer":"acme","total":12.5,"lines":[]}');
  assert.deepEqual(outcome, { tag: 'accept' });
  assert.equal(host.published.length, 1);
  const [event] = host.published;
  assert.equal(event.exchange, 'orders.events');
  assert.equal(event.routingKey, 'order.accepted');
  assert.equal(event.contentType, 'application/json');
  assert.equal(event.persistent, true);
  assert.deepEqual([event.headers, event.mandatory, event.deliverAtMs], [[], undefined, undefined]);
  assert.deepEqual(event.envelope, {}, "the host's defaults");
  assert.equal(
    new TextDecoder().decode(event.body),
    '{"id":"o-1","customer":"acme","total":12.5,"routed_at_ms":42}',
  );
  assert.deepEqual(host.logs, [
    ['info', 'order o-1 from acme (total 12.5) accepted: order.accepted to orders.events'],
  ]);
});

test('the events exchange comes from config', () => {
  const host = new RouterHost({ config: { events_exchange: 'shop.events' } });
  assert.deepEqual(host.route('{"id":"o-1","customer":"acme","total":1}'), { tag: 'accept' });
  assert.equal(host.published[0].exchange, 'shop.events');
  // As serde_json writes an f64 read from `1`.
  assert.match(new TextDecoder().decode(host.published[0].body), /"total":1\.0,/);
  assert.equal(host.logs[0][1], 'order o-1 from acme (total 1) accepted: order.accepted to shop.events');
});

test('a missing field is rejected by name', () => {
  const host = new RouterHost();
  assert.deepEqual(host.route('{"id":"o-1","total":3}'), {
    tag: 'reject',
    val: 'body is not a valid Order: missing field `customer` at line 1 column 22',
  });
  assert.deepEqual(host.published, []);
  assert.equal(host.logs.length, 1);
  assert.equal(host.logs[0][0], 'warn');
});

test('a non-positive total is rejected with the id', () => {
  for (const [total, shown] of [['0', '0'], ['-4.5', '-4.5'], ['-0.0', '-0']]) {
    const host = new RouterHost();
    const reason = `order o-7: total must be positive, got ${shown}`;
    assert.deepEqual(host.route(`{"id":"o-7","customer":"acme","total":${total}}`), {
      tag: 'reject',
      val: reason,
    });
    assert.deepEqual(host.published, []);
    assert.deepEqual(host.logs, [['warn', `reject: ${reason}`]]);
  }
});

test('not JSON is rejected', () => {
  const outcome = new RouterHost().route('<order/>');
  assert.equal(outcome.tag, 'reject');
  // Node's wording here; inside the component SpiderMonkey's, which
  // serdeWording turns into serde_json's (tested below).
  assert.ok(outcome.val.startsWith('body is not a valid Order: '), outcome.val);
});

test('wrong types are rejected', () => {
  for (const [body, problem] of [
    ['{"id":"o-1","customer":"acme","total":"3"}', 'invalid type: string "3", expected f64'],
    ['{"id":1,"customer":"acme","total":3}', 'invalid type: integer `1`, expected a string'],
    ['{"id":"o-1","customer":"acme","total":true}', 'invalid type: boolean `true`, expected f64'],
    ['{"id":"o-1","customer":null,"total":1}', 'invalid type: null, expected a string'],
    ['"o-1"', 'invalid type: string "o-1", expected struct Order'],
  ]) {
    assert.deepEqual(new RouterHost().route(body), {
      tag: 'reject',
      val: `body is not a valid Order: ${problem}`,
    });
  }
});

test('a refused publish is retried', () => {
  const host = new RouterHost({ publishTo: ['elsewhere'] });
  const outcome = host.route('{"id":"o-1","customer":"acme","total":1}');
  assert.equal(outcome.tag, 'retry');
  assert.ok(
    outcome.val.startsWith(
      'publish to exchange `orders.events` with routing key `order.accepted` failed: exchange `orders.events`',
    ),
    outcome.val,
  );
  assert.deepEqual(host.logs, [['warn', `retry: ${outcome.val}`]]);
});

test('a delayed publish keeps its due time, and is refused as by the host', () => {
  // What a handler that publishes ten minutes from now hands the host.
  const remind = () =>
    wit.publish({
      exchange: 'reminders',
      routingKey: 'reminder',
      body: new TextEncoder().encode('call'),
      contentType: 'text/plain',
      headers: [],
      envelope: {},
      persistent: true,
      mandatory: undefined,
      deliverAtMs: wit.nowMs() + 600_000n,
    });
  const host = new RouterHost({ nowMs: 1_000n });
  globalThis.acemqTestHost = host;
  assert.equal(remind().id, 'output-0');
  assert.equal(host.published[0].deliverAtMs, 601_000n);

  globalThis.acemqTestHost = new RouterHost({ publishDelayed: false });
  assert.throws(remind, {
    payload:
      'delayed publishing (deliver-at-ms) is not allowed for this consumer: ' +
      'set publish_delayed = true in its [[consumers]] entry',
  });
  assert.deepEqual(globalThis.acemqTestHost.published, []);

  globalThis.acemqTestHost = new RouterHost({ maxDelayMs: 599_999n });
  assert.throws(remind, (e) => e.payload.includes('beyond the longest delay this host schedules'));
  globalThis.acemqTestHost = new RouterHost({ maxDelayMs: 600_000n });
  assert.equal(remind().id, 'output-0', 'the limit itself is allowed');
});

test("SpiderMonkey's JSON errors are worded as serde_json's", () => {
  for (const [spidermonkey, serde] of [
    ['JSON.parse: unexpected character at line 1 column 1 of the JSON data', 'expected value at line 1 column 1'],
    [
      'JSON.parse: unexpected non-whitespace character after JSON data at line 1 column 42 of the JSON data',
      'trailing characters at line 1 column 42',
    ],
  ]) {
    assert.equal(serdeWording(spidermonkey), serde);
  }
});

test('numbers are shown as Rust shows an f64', () => {
  for (const [x, display, json] of [
    [12.5, '12.5', '12.5'],
    [1, '1', '1.0'],
    [123, '123', '123.0'],
    [1e-5, '0.00001', '0.00001'],
    [1e-7, '0.0000001', '1e-7'],
    [1.5e300, '15' + '0'.repeat(299), '1.5e300'],
    [1e16, '10000000000000000', '1e16'],
    [1e21, '1000000000000000000000', '1e21'],
    [-0, '-0', '-0.0'],
  ]) {
    assert.deepEqual([f64Display(x), f64Json(x)], [display, json], String(x));
  }
});
