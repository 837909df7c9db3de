// The state half of guest-sdk/js/acemq-testing.mjs, as a plugin's tests rely on it:
// `node --test test/` here (plugins/order-router-js). The handlers below call
// the WIT import `acemq:plugin/state@0.4.0` as a plugin does; the fake keeps
// a namespace across calls and commits a call's writes only when it accepts
// (docs/state.md).
import { register } from 'node:module';
import { test } from 'node:test';
import assert from 'node:assert/strict';

// The test host acemq-host ships (guest-sdk/js) is its own resolve hook:
// both WIT imports resolve to it.
const TESTING = '../../../guest-sdk/js/acemq-testing.mjs';
register(TESTING, import.meta.url);
const fake = await import(TESTING);
// As a plugin imports it.
const state = await import('acemq:plugin/state@0.4.0');
const { delete: del } = state;
const host = await import('acemq:plugin/host@0.4.0');

const enc = (s) => new TextEncoder().encode(s);
const dec = (b) => (b === undefined ? undefined : new TextDecoder().decode(b));
const ACCEPT = { tag: 'accept' };

// A TestHost with state (`state: null`: a consumer without `state`), which
// runs `steps` as one call.
class TestHost extends fake.TestHost {
  // [outcome, what steps returned]. A `{ tag }` it returns is the outcome,
  // anything else means accept.
  run(steps, options) {
    let result;
    const handler = {
      handle() {
        result = steps();
        return result && typeof result.tag === 'string' ? result : ACCEPT;
      },
    };
    return [this.handle(handler, fake.message(''), options), result];
  }
}

// The payload of what `f` threw (fails if it returned).
function raised(f) {
  try {
    f();
  } catch (e) {
    if (e.payload !== undefined) return e.payload;
    throw e;
  }
  assert.fail('no error thrown');
}

test('reads see the call’s own writes, and an accept commits them', () => {
  const h = new TestHost();
  const [outcome, seen] = h.run(() => {
    const before = state.get(enc('k'));
    state.set(enc('k'), enc('v1'), undefined);
    del(enc('gone'));
    return [before, dec(state.get(enc('k')))];
  });
  assert.deepEqual([outcome, seen], [ACCEPT, [undefined, 'v1']]);
  assert.equal(h.committed, true);
  assert.deepEqual(h.state.keys(), ['k']);
  // The next call reads what the last one committed.
  assert.equal(dec(h.run(() => state.get(enc('k')))[1]), 'v1');
});

test('an input not accepted leaves no write', () => {
  for (const outcome of [
    { tag: 'retry', val: 'later' },
    { tag: 'reject', val: 'bad' },
    { tag: 'park', val: 'aside' },
  ]) {
    const h = new TestHost();
    h.state.seed('kept', 'old');
    h.run(() => {
      state.set(enc('kept'), enc('new'), undefined);
      state.increment(enc('n'), 1n, undefined);
      return outcome;
    });
    assert.equal(h.committed, false);
    assert.deepEqual(h.state.keys(), ['kept']);
    assert.equal(h.state.getText('kept'), 'old');
    assert.equal(h.lastCall.writes.size, 2, 'what it would have written stays readable');
  }
});

test('a consumer without state gets the error from every call', () => {
  const h = new TestHost({ state: null });
  const calls = [
    () => state.get(enc('k')),
    () => state.set(enc('k'), enc('v'), undefined),
    () => del(enc('k')),
    () => state.increment(enc('k'), 1n, undefined),
    () => state.getVersioned(enc('k')),
    () => state.setIfVersion(enc('k'), enc('v'), 0n, undefined),
  ];
  const [, reasons] = h.run(() => calls.map(raised));
  assert.deepEqual(reasons, Array(6).fill(fake.NO_STATE_STORE));
  assert.equal(
    fake.NO_STATE_STORE,
    'this consumer has no state store: set state = "NAME" in its [[consumers]] entry',
  );
});

test('the types are the bindings’: Uint8Array and BigInt', () => {
  const h = new TestHost();
  assert.throws(() => h.run(() => state.get('k')), TypeError);
  assert.throws(() => h.run(() => state.set(enc('k'), enc('v'), 5)), TypeError);
  assert.throws(() => h.run(() => state.increment(enc('k'), 1, undefined)), TypeError);
  assert.throws(() => h.run(() => state.increment(enc('k'), 1n << 63n, undefined)), RangeError);
  assert.throws(() => state.get(enc('k')), /outside handle/);
  const [, [n, versioned]] = h.run(() => [
    state.increment(enc('n'), 2n, undefined),
    state.getVersioned(enc('n')),
  ]);
  assert.equal(n, 2n);
  assert.equal(dec(versioned[0]), '2');
  assert.equal(typeof versioned[1], 'bigint');
});

test('ttlMs is on the fake clock, and undefined never expires', () => {
  const h = new TestHost({ nowMs: 1_000n });
  h.run(() => {
    state.set(enc('brief'), enc('1'), 500n);
    state.set(enc('forever'), enc('2'), undefined);
  });
  assert.equal(h.state.entry('brief').expiresAtMs, 1_500n);
  assert.equal(h.state.entry('forever').expiresAtMs, undefined);
  h.now = 1_499n;
  assert.equal(dec(h.run(() => state.get(enc('brief')))[1]), '1');
  h.now = 1_500n;
  assert.deepEqual(h.run(() => [state.get(enc('brief')), state.getVersioned(enc('brief'))])[1], [
    undefined,
    undefined,
  ]);
  assert.deepEqual(h.state.keys(), ['forever']);
});

test('increment counts from 0 and stores ASCII decimal', () => {
  const h = new TestHost();
  const [, got] = h.run(() => [
    state.increment(enc('n'), 5n, undefined),
    state.increment(enc('n'), 1n, undefined),
    dec(state.get(enc('n'))),
  ]);
  assert.deepEqual(got, [5n, 6n, '6']);
  assert.equal(h.state.getText('n'), '6');
  assert.equal(h.run(() => state.increment(enc('n'), -10n, undefined))[1], -4n);
  assert.equal(h.state.getText('n'), '-4');
});

test('increment refuses a value that is not an integer, and overflow', () => {
  for (const value of ['six', '6.0', ' 6', '', '99999999999999999999']) {
    const h = new TestHost();
    h.state.seed('n', value);
    assert.equal(
      h.run(() => raised(() => state.increment(enc('n'), 1n, undefined)))[1],
      'the key "n" does not hold an integer (increment keeps decimal text such as "6"), so it cannot be incremented',
    );
    assert.equal(h.state.getText('n'), value);
  }
  const h = new TestHost();
  h.state.seed('n', String(fake.I64_MAX));
  assert.equal(
    h.run(() => raised(() => state.increment(enc('n'), 1n, undefined)))[1],
    `incrementing the key "n" by 1 overflows a 64-bit integer (it holds ${fake.I64_MAX})`,
  );
  h.state.seed('n', '+7');
  assert.equal(h.run(() => state.increment(enc('n'), 1n, undefined))[1], 8n, 'a sign may lead');
});

test('a ttlMs of 0n is refused, as by the host', () => {
  const h = new TestHost();
  const [, reasons] = h.run(() => [
    raised(() => state.set(enc('k'), enc('v'), 0n)),
    raised(() => state.increment(enc('n'), 1n, 0n)),
    raised(() => state.setIfVersion(enc('k'), enc('v'), 0n, 0n)),
  ]);
  assert.deepEqual(reasons, Array(3).fill('ttl-ms must be at least 1 (none: the key never expires)'));
  assert.equal(h.lastCall.writes.size, 0);
});

test('the first check of a key is kept', () => {
  const h = new TestHost();
  const v = h.state.seed('k', '1');
  h.run(() => {
    state.setIfVersion(enc('k'), enc('2'), v, undefined);
    // Checked against what the call read first, not this.
    state.setIfVersion(enc('k'), enc('3'), 12345n, undefined);
  });
  assert.deepEqual([h.conflict, h.state.getText('k')], [undefined, '3']);
  assert.deepEqual([...h.lastCall.checks.values()], [v]);
});

test('increment without ttlMs keeps the key’s expiry; with one sets a new one', () => {
  const h = new TestHost({ nowMs: 0n });
  h.state.seed('n', '1', 1_000n);
  h.now = 400n;
  h.run(() => state.increment(enc('n'), 1n, undefined));
  assert.equal(h.state.entry('n').expiresAtMs, 1_000n);
  h.run(() => state.increment(enc('n'), 1n, 5_000n));
  assert.equal(h.state.entry('n').expiresAtMs, 5_400n);
  assert.equal(h.state.getText('n'), '3');
});

test('versions are unique and never reused', () => {
  const h = new TestHost();
  const v1 = h.state.seed('a', '1');
  h.run(() => state.set(enc('a'), enc('2'), undefined));
  const v2 = h.state.version('a');
  assert.ok(v2 > v1);
  h.run(() => del(enc('a')));
  assert.equal(h.state.version('a'), 0n);
  h.run(() => state.set(enc('a'), enc('3'), undefined));
  assert.ok(h.state.version('a') > v2);
});

test('setIfVersion commits when the version held; 0n means only if absent', () => {
  const h = new TestHost();
  h.run(() => state.setIfVersion(enc('k'), enc('first'), 0n, undefined));
  assert.deepEqual([h.committed, h.state.getText('k')], [true, 'first']);
  h.run(() => state.setIfVersion(enc('k'), enc('second'), 0n, undefined));
  assert.deepEqual([h.committed, dec(h.conflict), h.state.getText('k')], [false, 'k', 'first']);
  h.run(() => {
    const [value, version] = state.getVersioned(enc('k'));
    state.setIfVersion(enc('k'), enc(`${dec(value)}+`), version, undefined);
  });
  assert.deepEqual([h.committed, h.state.getText('k')], [true, 'first+']);
});

test('a concurrent change makes the commit conflict, and nothing is committed', () => {
  const h = new TestHost();
  h.state.seed('k', '1');
  fake.concurrently(h, (ns) => ns.seed('k', 'changed'));
  const steps = () => {
    const [value, version] = state.getVersioned(enc('k'));
    state.setIfVersion(enc('k'), enc(`${dec(value)}!`), version, 60_000n);
    state.set(enc('other'), enc('x'), undefined);
    host.publish({ exchange: 'x', body: value });
  };
  assert.deepEqual(h.run(steps)[0], ACCEPT);
  assert.deepEqual([h.committed, dec(h.conflict)], [false, 'k']);
  assert.deepEqual(h.state.keys(), ['k']);
  assert.equal(h.state.getText('k'), 'changed');

  // The host runs the call again on fresh state; the conflicted run's
  // outputs are dropped.
  const again = new TestHost();
  again.state.seed('k', 'a');
  fake.concurrently(again, (ns) => ns.seed('k', 'b'));
  again.run(steps, { reruns: 5 });
  assert.deepEqual([again.runs, again.committed, again.state.getText('k')], [2, true, 'b!']);
  assert.deepEqual(again.published.map((o) => dec(o.body)), ['b']);
});

test('an increment conflicts when its key changed; a plain set never does', () => {
  const h = new TestHost();
  h.state.seed('n', '1');
  fake.concurrently(h, (ns) => ns.seed('n', '10'));
  assert.equal(h.run(() => state.increment(enc('n'), 1n, undefined))[1], 2n);
  assert.deepEqual([dec(h.conflict), h.state.getText('n')], ['n', '10']);
  fake.concurrently(h, (ns) => ns.seed('n', '20'));
  h.run(() => state.set(enc('n'), enc('mine'), undefined));
  assert.deepEqual([h.conflict, h.state.getText('n')], [undefined, 'mine']);
});

test('the limits: keys 1 to 1024 bytes, values 1 MiB, 1000 writes a call', () => {
  const h = new TestHost();
  const [, reasons] = h.run(() => [
    raised(() => state.get(new Uint8Array(0))),
    raised(() => state.set(new Uint8Array(1025), enc(''), undefined)),
    raised(() => state.set(enc('k'), new Uint8Array(fake.STATE_MAX_VALUE_BYTES + 1), undefined)),
  ]);
  assert.deepEqual(reasons, [
    'a state key must not be empty',
    'a state key is at most 1024 bytes; this one is 1025',
    'a state value is at most 1048576 bytes; this one is 1048577',
  ]);
  const [, last] = h.run(() => {
    state.set(new Uint8Array(1024).fill(107), new Uint8Array(fake.STATE_MAX_VALUE_BYTES), undefined);
    for (let i = 1; i < 1000; i++) state.set(enc(`k${i}`), enc(''), undefined);
    return raised(() => del(enc('k1')));
  });
  assert.equal(last, 'a call makes at most 1000 state writes; this would be write 1001');
  assert.equal(h.state.keys().length, 1000);
});

test('two consumers naming one namespace share it', () => {
  const a = new TestHost();
  const b = new TestHost({ state: a.state });
  a.run(() => state.increment(enc('n'), 1n, undefined));
  assert.equal(b.run(() => state.increment(enc('n'), 1n, undefined))[1], 2n);
  assert.equal(a.state.getText('n'), '2');
  assert.equal(fake.showKey(enc('customer/acme')), 'the key "customer/acme"');
  assert.equal(fake.showKey(enc('a"\n\u00e9\u0001')), 'the key "a\\"\\né\\u{1}"');
  assert.equal(fake.showKey(new Uint8Array([0xff, 0])), 'the key 0xff00');
});
