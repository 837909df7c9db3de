// The test host of a JavaScript plugin: it stands in for the WIT imports
// `acemq:plugin/host@0.4.0` and `acemq:plugin/state@0.4.0` when a plugin
// runs under Node for its tests (`node --test test/`), with no install.
//
// It is its own module hook: `register('<this file>', import.meta.url)` in a
// test makes both imports resolve to it. Each `host` call then goes to the
// test's current TestHost (`globalThis.acemqTestHost`, which `handle` below
// sets), each `state` call to the state call that `handle` opened on it.
// `TestHost` records what the handler logged and published, answers
// `config` and `nowMs`, refuses publishes as the host does (`publishTo`,
// `publishDelayed`, `maxDelayMs`), and keeps a state namespace across
// calls; `message(body, ...)` is the WIT resource `message` a handler gets.
//
// It ships with acemq-host: `acemq-host plugin new NAME --lang js` writes
// this file into the new plugin's folder (it is built into the binary), and
// the JavaScript plugins of the acemq-host repository (plugins/*-js) import
// it from guest-sdk/js.
export const log = (level, text) => globalThis.acemqTestHost.log(level, text);
export const publish = (msg) => globalThis.acemqTestHost.publish(msg);
export const config = (key) => globalThis.acemqTestHost.config(key);
export const nowMs = () => globalThis.acemqTestHost.nowMs();
export const reply = (msg) => globalThis.acemqTestHost.reply(msg);

// ---------------------------------------------------------------------------
// State (docs/state.md), as jco and componentize-js hand it to JavaScript:
// keys and values are `Uint8Array`s, every `s64`/`u64` a `BigInt` (`ttlMs`,
// `by`, `version`, what `increment` returns), an absent `option` is
// `undefined`, `getVersioned` returns `[value, version]`, and a WIT `result`
// error is a thrown error whose `payload` is the host's reason. `delete` is a
// reserved word: import it renamed (`import { delete as del } from ...`).
//
// A TestHost with state has `state`, a FakeNamespace kept across calls
// (undefined or null: a consumer without `state`, whose every state call
// throws NO_STATE_STORE), and runs the handler through `handle(host, handler,
// msg)`, which commits the call's writes when it accepts.
// ---------------------------------------------------------------------------

export const STATE_MAX_KEY_BYTES = 1024;
export const STATE_MAX_VALUE_BYTES = 1_048_576;
export const STATE_MAX_WRITES_PER_CALL = 1000;
export const NO_STATE_STORE =
  'this consumer has no state store: set state = "NAME" in its [[consumers]] entry';
export const I64_MIN = -(1n << 63n);
export const I64_MAX = (1n << 63n) - 1n;
export const U64_MAX = (1n << 64n) - 1n;

const current = (name) => {
  const call = globalThis.acemqTestHost?.stateCall;
  if (!call) throw new Error(`state ${name} was called outside handle(host, handler, msg)`);
  return call;
};
export const get = (key) => current('get').get(key);
export const set = (key, value, ttlMs) => current('set').set(key, value, ttlMs);
const _delete = (key) => current('delete').delete(key);
export { _delete as delete };
export const increment = (key, by, ttlMs) => current('increment').increment(key, by, ttlMs);
export const getVersioned = (key) => current('getVersioned').getVersioned(key);
export const setIfVersion = (key, value, version, ttlMs) =>
  current('setIfVersion').setIfVersion(key, value, version, ttlMs);

// How a WIT `result` error reaches JS: a thrown error with a payload.
function refuse(payload) {
  const e = new Error(payload);
  e.payload = payload;
  throw e;
}

const utf8 = new TextEncoder();

// A key or value as the helpers take it: a Uint8Array, or a string (UTF-8).
const asBytes = (v) => (typeof v === 'string' ? utf8.encode(v) : Uint8Array.from(v));
// Map keys: the bytes as hex.
const hex = (bytes) => Buffer.from(bytes).toString('hex');
const unhex = (text) => new Uint8Array(Buffer.from(text, 'hex'));

// `text` quoted as Rust's `{:?}` shows a str (near enough: quotes,
// backslashes and control characters escaped, the rest as it is).
const ESCAPES = { '"': '\\"', '\\': '\\\\', '\n': '\\n', '\r': '\\r', '\t': '\\t', '\0': '\\0' };
export const rustDebug = (text) =>
  `"${[...text]
    .map((c) => ESCAPES[c] ?? (/[\p{C}\p{Zl}\p{Zp}]/u.test(c) ? `\\u{${c.codePointAt(0).toString(16)}}` : c))
    .join('')}"`;

// Bytes as text when they are UTF-8, else undefined.
function utf8Text(bytes) {
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    return undefined;
  }
}

/** A key as the host's errors name it: `the key "text"` when it is UTF-8,
 * else `the key 0x` and hex (host/src/state/call.rs). */
export function showKey(key) {
  const text = utf8Text(key);
  return text === undefined ? `the key 0x${hex(key)}` : `the key ${rustDebug(text)}`;
}

function bytesArg(name, v) {
  if (!(v instanceof Uint8Array)) {
    throw new TypeError(`${name} must be a Uint8Array (a WIT list<u8>), not ${typeof v}`);
  }
  return v.slice();
}

function bigintArg(name, v, lo, hi, wit) {
  if (typeof v !== 'bigint') throw new TypeError(`${name} must be a BigInt (a WIT ${wit}), not ${typeof v}`);
  if (v < lo || v > hi) throw new RangeError(`${name} ${v} is out of the range of a WIT ${wit}`);
  return v;
}

const ttlArg = (ttlMs) => (ttlMs === undefined ? undefined : bigintArg('ttlMs', ttlMs, 0n, U64_MAX, 'u64'));
const live = (entry, now) => entry.expiresAtMs === undefined || entry.expiresAtMs > now;

/**
 * A state namespace's committed entries, as the store keeps them between
 * calls: `{ value, version, expiresAtMs }` (epoch ms, undefined: never).
 * Versions come from one counter of the namespace, so they are unique and
 * never reused; an entry whose expiry has passed on `clock` reads as absent.
 * Its methods are the test's: `seed` and `remove` change it directly (as an
 * input committed before, or meanwhile), the rest read it. Keys and values
 * may be given as strings (UTF-8).
 */
export class FakeNamespace {
  constructor({ clock = () => 0n, name = 'test' } = {}) {
    Object.assign(this, { clock, name, lastVersion: 0n });
    this.entries = new Map();
  }
  nextVersion() {
    this.lastVersion += 1n;
    return this.lastVersion;
  }
  /** The live entry of `key`, or undefined. */
  entry(key) {
    const e = this.entries.get(hex(asBytes(key)));
    return e && live(e, this.clock()) ? e : undefined;
  }
  get(key) {
    return this.entry(key)?.value;
  }
  /** The value of `key` decoded as UTF-8, or undefined. */
  getText(key) {
    const value = this.get(key);
    return value === undefined ? undefined : new TextDecoder().decode(value);
  }
  /** The version of `key`, 0n when it does not exist. */
  version(key) {
    return this.entry(key)?.version ?? 0n;
  }
  /** Every live key in byte order, as text when it is UTF-8, else `0x`
   * and hex (as `acemq-host state list` shows keys). */
  keys() {
    const now = this.clock();
    return [...this.entries]
      .filter(([, e]) => live(e, now))
      .map(([k]) => k)
      .sort()
      .map((k) => utf8Text(unhex(k)) ?? `0x${k}`);
  }
  /** Sets `key` as a committed input would have (expiring `ttlMs` after the
   * clock's now); returns its new version. */
  seed(key, value, ttlMs) {
    const version = this.nextVersion();
    const expiresAtMs = ttlMs === undefined ? undefined : this.clock() + BigInt(ttlMs);
    this.entries.set(hex(asBytes(key)), { value: asBytes(value), version, expiresAtMs });
    return version;
  }
  /** Deletes `key` as a committed input would have. */
  remove(key) {
    this.entries.delete(hex(asBytes(key)));
  }
  /** Applies one call's writes if every check holds: the key (hex) of the
   * first check that failed, nothing applied, or undefined. */
  commit(writes, checks) {
    for (const [key, expected] of checks) {
      if (this.version(unhex(key)) !== expected) return key;
    }
    for (const [key, write] of writes) {
      if (write === null) this.entries.delete(key);
      else this.entries.set(key, { ...write, version: this.nextVersion() });
    }
    return undefined;
  }
}

/**
 * One call's view of a namespace, as host/src/state/call.rs keeps it: the
 * committed entries plus its own writes (`writes`: hex key -> `{ value,
 * expiresAtMs }`, or null for a delete; the last write of a key wins), the
 * versions its commit depends on (`checks`: hex key -> version, from an
 * `increment` of a committed value and from `setIfVersion`, the first check
 * of a key kept; 0n: the key must not exist), and how many writes it made.
 * The version of a key this call wrote is that of the committed entry its
 * write replaces (0n if none): what the commit checks. The limits and error
 * texts are the host's.
 */
export class StateCall {
  constructor(namespace, nowMs) {
    Object.assign(this, { namespace: namespace ?? null, now: nowMs, writeCount: 0 });
    this.writes = new Map();
    this.checks = new Map();
  }
  store() {
    if (this.namespace === null) refuse(NO_STATE_STORE);
  }
  key(key) {
    key = bytesArg('key', key);
    if (key.length === 0) refuse('a state key must not be empty');
    if (key.length > STATE_MAX_KEY_BYTES) {
      refuse(`a state key is at most ${STATE_MAX_KEY_BYTES} bytes; this one is ${key.length}`);
    }
    return key;
  }
  value(value) {
    value = bytesArg('value', value);
    if (value.length > STATE_MAX_VALUE_BYTES) {
      refuse(`a state value is at most ${STATE_MAX_VALUE_BYTES} bytes; this one is ${value.length}`);
    }
    return value;
  }
  write(key, write) {
    if (this.writeCount >= STATE_MAX_WRITES_PER_CALL) {
      refuse(
        `a call makes at most ${STATE_MAX_WRITES_PER_CALL} state writes; ` +
          `this would be write ${this.writeCount + 1}`,
      );
    }
    this.writeCount += 1;
    this.writes.set(hex(key), write);
  }
  expiry(ttlMs) {
    ttlMs = ttlArg(ttlMs);
    if (ttlMs === 0n) refuse('ttl-ms must be at least 1 (none: the key never expires)');
    return ttlMs === undefined ? undefined : this.now + ttlMs;
  }
  // { value, expiresAtMs, version } as this call sees `key`, or undefined.
  seen(key) {
    const committed = this.namespace.entry(key);
    const version = committed?.version ?? 0n;
    const k = hex(key);
    if (this.writes.has(k)) {
      const w = this.writes.get(k);
      return w === null ? undefined : { ...w, version };
    }
    return committed && { ...committed };
  }
  get(key) {
    this.store();
    return this.seen(this.key(key))?.value.slice();
  }
  getVersioned(key) {
    this.store();
    const seen = this.seen(this.key(key));
    return seen && [seen.value.slice(), seen.version];
  }
  set(key, value, ttlMs) {
    this.store();
    [key, value] = [this.key(key), this.value(value)];
    this.write(key, { value, expiresAtMs: this.expiry(ttlMs) });
  }
  delete(key) {
    this.store();
    this.write(this.key(key), null);
  }
  increment(key, by, ttlMs) {
    this.store();
    [key, by] = [this.key(key), bigintArg('by', by, I64_MIN, I64_MAX, 's64')];
    const ttl = this.expiry(ttlMs);
    const seen = this.seen(key);
    let current = 0n;
    let expiresAtMs;
    if (seen) {
      // As Rust's i64 parses it: a sign, then ASCII digits.
      const text = Buffer.from(seen.value).toString('latin1');
      const n = /^[+-]?[0-9]+$/.test(text) ? BigInt(text) : undefined;
      if (n === undefined || n < I64_MIN || n > I64_MAX) {
        refuse(
          `${showKey(key)} does not hold an integer (increment keeps decimal text such as "6"), ` +
            'so it cannot be incremented',
        );
      }
      [current, expiresAtMs] = [n, seen.expiresAtMs];
    }
    const total = current + by;
    if (total < I64_MIN || total > I64_MAX) {
      refuse(`incrementing ${showKey(key)} by ${by} overflows a 64-bit integer (it holds ${current})`);
    }
    // Based on a committed value it is checked at commit; on this call's own
    // write it is not.
    const depends = !this.writes.has(hex(key));
    this.write(key, { value: utf8.encode(String(total)), expiresAtMs: ttl ?? expiresAtMs });
    if (depends) this.check(key, seen?.version ?? 0n);
    return total;
  }
  setIfVersion(key, value, version, ttlMs) {
    this.store();
    [key, value] = [this.key(key), this.value(value)];
    version = bigintArg('version', version, 0n, U64_MAX, 'u64');
    this.write(key, { value, expiresAtMs: this.expiry(ttlMs) });
    this.check(key, version);
  }
  // A second check of the same key keeps the first: the commit depends on
  // what the call read first.
  check(key, version) {
    if (!this.checks.has(hex(key))) this.checks.set(hex(key), version);
  }
}

/**
 * Runs `handler.handle(msg)` on `host` as the host would, with state: makes
 * `host` the current TestHost, answers the state calls from a StateCall on
 * `host.state` (kept in `host.lastCall`), then applies the changes queued
 * with `concurrently(host, change)` (another input committing meanwhile)
 * and, when the handler accepted, commits the call's writes unless a version
 * its `increment` or `setIfVersion` depended on changed: then nothing is
 * committed and `host.conflict` is the key (a Uint8Array), and up to
 * `reruns` more runs follow on fresh state (`msg` again, the outputs in
 * `host.published` and `host.replies` of a conflicted run dropped), as the host runs the call
 * again. `host.committed`, `host.runs` say how it went. Returns the outcome
 * of the last run.
 */
export function handle(host, handler, msg, { reruns = 0 } = {}) {
  host.runs = 0;
  for (;;) {
    const [published, replies] = [host.published?.length, host.replies?.length];
    const outcome = run(host, handler, msg);
    if (host.conflict === undefined || host.runs > reruns) return outcome;
    if (published !== undefined) host.published.length = published;
    if (replies !== undefined) host.replies.length = replies;
  }
}

function run(host, handler, msg) {
  globalThis.acemqTestHost = host;
  host.runs += 1;
  host.committed = false;
  host.conflict = undefined;
  host.lastCall = host.stateCall = new StateCall(host.state, host.nowMs());
  let outcome;
  try {
    outcome = handler.handle(msg);
  } finally {
    host.stateCall = undefined;
  }
  const concurrent = host.concurrent ?? [];
  host.concurrent = [];
  for (const change of concurrent) change(host.state);
  if (outcome?.tag === 'accept' && host.state) {
    const conflict = host.state.commit(host.lastCall.writes, host.lastCall.checks);
    host.conflict = conflict === undefined ? undefined : unhex(conflict);
    host.committed = conflict === undefined;
  }
  return outcome;
}

/** Queues `change(host.state)` for after the next call on `host` returns
 * and before its commit, e.g. `(ns) => ns.seed('k', 'v')`. */
export function concurrently(host, change) {
  (host.concurrent ??= []).push(change);
}

// ---------------------------------------------------------------------------
// The message a handler gets, and the host it calls.
// ---------------------------------------------------------------------------

export const REPLY_TO_HEADER = 'acemq-reply-to';
// The host's `[scheduler] max_delay` when its configuration sets none: 30 days.
export const DEFAULT_MAX_DELAY_MS = 30n * 24n * 3600n * 1000n;

/** The WIT record `envelope` of a test message, `fields` replacing the
 * defaults (every `u64` a BigInt, an absent `option` undefined). */
export const envelope = (fields = {}) => ({
  id: 'test-message-1',
  messageType: 'test',
  version: 1,
  correlationId: 'test-correlation-1',
  causationId: undefined,
  attempt: 1,
  firstSeenMs: 1_700_000_000_000n,
  origin: undefined,
  route: undefined,
  ...fields,
});

/** The WIT record `delivery` of a test message, `fields` replacing the defaults. */
export const delivery = (fields = {}) => ({
  queue: 'test.queue',
  exchange: 'test.exchange',
  routingKey: 'test',
  redelivered: false,
  streamOffset: undefined,
  replyTo: undefined,
  amqpCorrelationId: undefined,
  ...fields,
});

/**
 * The WIT resource `message`, as a handler gets it: `body` a string (as
 * UTF-8) or a Uint8Array; `headers` an object of name -> string (a `text`
 * header) or a `{ tag, val }` header value; `replyTo` makes it an AceMQ
 * request (the `acemq-reply-to` header and the `reply-to` property).
 */
export function message(body, { headers = {}, contentType, envelope: env, delivery: del, replyTo } = {}) {
  const bytes = typeof body === 'string' ? utf8.encode(body) : Uint8Array.from(body);
  const list = Object.entries(headers).map(([name, value]) => [
    name,
    typeof value === 'string' ? { tag: 'text', val: value } : value,
  ]);
  const to = delivery(del);
  if (replyTo !== undefined) {
    list.push([REPLY_TO_HEADER, { tag: 'text', val: replyTo }]);
    to.replyTo = replyTo;
  }
  const the = envelope(env);
  return {
    body: () => bytes.slice(),
    headers: () => list.map(([name, value]) => [name, { ...value }]),
    envelope: () => ({ ...the }),
    delivery: () => ({ ...to }),
    contentType: () => contentType,
  };
}

/**
 * Answers the `host` functions for one test and records what the handler
 * did: `logs` [[level, text]], `published` [outgoing, as the handler handed
 * it], `replies` [[outgoing-reply, reply queue or undefined]]. As the host
 * does, a `publishTo` list refuses a publish to any other exchange,
 * `publishDelayed: false` (the consumer's `publish_delayed` unset) refuses a
 * delayed one, and so does a due time more than `maxDelayMs` after `nowMs`.
 * `state` is the consumer's namespace, kept across calls: true (the default)
 * makes one on this host's clock, a FakeNamespace shares one, null is a
 * consumer without `state`. Run the handler with `host.handle(handler, msg)`.
 * The ids it returns are stand-ins (`output-N`, `reply`), not the host's.
 */
export class TestHost {
  constructor({
    config = {},
    nowMs = 1_700_000_000_000n,
    publishTo,
    publishDelayed = true,
    maxDelayMs = DEFAULT_MAX_DELAY_MS,
    state = true,
  } = {}) {
    Object.assign(this, { configs: { ...config }, now: nowMs, publishTo, publishDelayed, maxDelayMs });
    Object.assign(this, { logs: [], published: [], replies: [] });
    this.state = state === true ? new FakeNamespace({ clock: () => this.now }) : state;
    this.input = { envelope: envelope(), replyTo: undefined };
  }
  log(level, text) {
    this.logs.push([level, text]);
  }
  config(key) {
    return this.configs[key];
  }
  nowMs() {
    return this.now;
  }
  publish(msg) {
    if (this.publishTo && !this.publishTo.includes(msg.exchange)) {
      refuse(`exchange \`${msg.exchange}\` is not in this consumer's publish_to`);
    }
    if (msg.deliverAtMs !== undefined) this.checkDelay(msg.deliverAtMs);
    this.published.push(msg);
    // The WIT `sent` record: the id and correlation that go on the wire.
    return {
      id: msg.envelope?.id ?? `output-${this.published.length - 1}`,
      correlationId: msg.envelope?.correlationId ?? this.input.envelope.correlationId,
    };
  }
  checkDelay(deliverAtMs) {
    if (!this.publishDelayed) {
      refuse(
        'delayed publishing (deliver-at-ms) is not allowed for this consumer: ' +
          'set publish_delayed = true in its [[consumers]] entry',
      );
    }
    const ahead = deliverAtMs - this.now;
    if (ahead > this.maxDelayMs) {
      refuse(
        `deliver-at-ms ${deliverAtMs} is ${ahead} ms from now, beyond the longest delay ` +
          `this host schedules ([scheduler] max_delay = ${this.maxDelayMs} ms)`,
      );
    }
  }
  reply(msg) {
    if (this.replies.length) refuse('this call has already replied: a request gets one answer');
    if (msg.envelope?.correlationId !== undefined || msg.envelope?.causationId !== undefined) {
      refuse("a reply's correlation and causation are the request's; they cannot be set");
    }
    this.replies.push([msg, this.input.replyTo]);
    return { id: msg.envelope?.id ?? 'reply', correlationId: this.input.envelope.correlationId };
  }
  /** Runs `handler.handle(msg)` on this host: see `handle` above. */
  handle(handler, msg, options) {
    const header = msg.headers?.().find(([name]) => name === REPLY_TO_HEADER)?.[1];
    this.input = {
      envelope: msg.envelope?.() ?? envelope(),
      replyTo: (header?.tag === 'text' && header.val) || msg.delivery?.().replyTo || undefined,
    };
    return handle(this, handler, msg, options);
  }
}

// Node module hooks: the WIT imports resolve to this file.
export async function resolve(specifier, context, next) {
  if (specifier.startsWith('acemq:plugin/host@') || specifier.startsWith('acemq:plugin/state@')) {
    return { url: import.meta.url, shortCircuit: true };
  }
  return next(specifier, context);
}
