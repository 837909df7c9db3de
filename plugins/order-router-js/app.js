// Routes orders: validates each JSON order and, for a valid one, publishes
// an `order.accepted` event. The JavaScript twin of plugins/order-router.
//
// - Body `{"id": string, "customer": string, "total": number, ...}`; other
//   fields are ignored.
// - Not JSON, or a field missing or of the wrong type: reject, saying what
//   was wrong (`body is not a valid Order: missing field `total` at line 1 column 24`).
// - `total` zero or negative: reject, naming the order id.
// - Otherwise: publish `{id, customer, total, routed_at_ms}` to the exchange
//   in config key `events_exchange` (default `orders.events`) with routing
//   key `order.accepted`, and accept. A publish the host refuses: retry.
//
// One log line per decision.
//
// Built by build.sh with jco componentize against wit/plugin.wit, world
// `handler-plugin`: the import below is the WIT interface `host`, and the
// export `handler` is the WIT interface `handler`.

import { log, publish, config, nowMs } from 'acemq:plugin/host@0.4.0';

// Consumer config key naming the exchange events are published to.
const EVENTS_EXCHANGE_KEY = 'events_exchange';
const DEFAULT_EVENTS_EXCHANGE = 'orders.events';
const ACCEPTED_ROUTING_KEY = 'order.accepted';

export const handler = {
  // `msg` is the WIT resource `message`, lent for this call only.
  handle(msg) {
    const [outcome, level, line] = route(msg);
    log(level, line);
    return outcome;
  },
};

// Decides for one message: [outcome, log level, log line].
function route(msg) {
  let order;
  try {
    order = parseOrder(msg.body());
  } catch (e) {
    if (!(e instanceof BodyError)) throw e;
    return reject(e.reason);
  }
  const { id, customer, total } = order;
  // JSON has no NaN, so `<=` catches every non-positive total.
  if (total <= 0) {
    return reject(`order ${id}: total must be positive, got ${f64Display(total)}`);
  }

  const exchange = config(EVENTS_EXCHANGE_KEY) ?? DEFAULT_EVENTS_EXCHANGE;
  // Written by hand to match the Rust plugin byte for byte: compact, in
  // field order, `total` always with a fraction or an exponent.
  const event =
    `{"id":${JSON.stringify(id)},"customer":${JSON.stringify(customer)},` +
    `"total":${f64Json(total)},"routed_at_ms":${nowMs()}}`;
  try {
    publish({
      exchange,
      routingKey: ACCEPTED_ROUTING_KEY,
      body: new TextEncoder().encode(event),
      contentType: 'application/json',
      headers: [],
      // Every field unset: the host's defaults (a derived id, message type
      // = the routing key, version 1, the input's correlation, causation =
      // the input's id). `publish` returns the id and correlation that go
      // on the wire; the log line stays the Rust plugin's, which has none.
      envelope: {},
      persistent: true,
      mandatory: undefined, // the consumer's `mandatory_outputs` decides
      deliverAtMs: undefined, // now, not through the scheduler
    });
  } catch (e) {
    // A WIT `result` error arrives as a thrown error whose `payload` is the
    // host's reason. A refusal usually comes from the consumer's
    // configuration, which an operator can fix while the retry policy holds
    // the message.
    const problem = e && e.payload !== undefined ? e.payload : String(e);
    const reason =
      `publish to exchange \`${exchange}\` with routing key ` +
      `\`${ACCEPTED_ROUTING_KEY}\` failed: ${problem}`;
    return [{ tag: 'retry', val: reason }, 'warn', `retry: ${reason}`];
  }
  const line =
    `order ${id} from ${customer} (total ${f64Display(total)}) ` +
    `accepted: ${ACCEPTED_ROUTING_KEY} to ${exchange}`;
  return [{ tag: 'accept' }, 'info', line];
}

function reject(reason) {
  return [{ tag: 'reject', val: reason }, 'warn', `reject: ${reason}`];
}

class BodyError extends Error {
  constructor(problem) {
    super(problem);
    this.reason = `body is not a valid Order: ${problem}`;
  }
}

// {id, customer, total} from a JSON body (bytes), or a BodyError worded as
// the Rust plugin (serde_json) words it.
export function parseOrder(body) {
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body);
  } catch {
    throw new BodyError('invalid unicode code point');
  }
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new BodyError(serdeWording(String(e && e.message)));
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new BodyError(`invalid type: ${jsonKind(value)}, expected struct Order`);
  }
  const has = (field) => Object.prototype.hasOwnProperty.call(value, field);
  for (const [field, type, expected] of [
    ['id', 'string', 'a string'],
    ['customer', 'string', 'a string'],
    ['total', 'number', 'f64'],
  ]) {
    if (has(field) && typeof value[field] !== type) {
      throw new BodyError(`invalid type: ${jsonKind(value[field])}, expected ${expected}`);
    }
  }
  for (const field of ['id', 'customer', 'total']) {
    if (!has(field)) {
      // serde_json points after the closing brace of the object.
      const before = new TextEncoder().encode(text.replace(/[ \t\r\n]+$/, ''));
      const lastNewline = before.lastIndexOf(10);
      const line = before.filter((b) => b === 10).length + 1;
      const column = before.length - (lastNewline + 1);
      throw new BodyError(`missing field \`${field}\` at line ${line} column ${column}`);
    }
  }
  return { id: value.id, customer: value.customer, total: value.total };
}

function jsonKind(v) {
  if (v === null) return 'null';
  switch (typeof v) {
    case 'boolean':
      return `boolean \`${v}\``;
    case 'number':
      return Number.isInteger(v) && !Object.is(v, -0)
        ? `integer \`${f64Display(v)}\``
        : `floating point \`${f64Display(v)}\``;
    case 'string':
      return `string ${JSON.stringify(v)}`;
    default:
      return Array.isArray(v) ? 'sequence' : 'map';
  }
}

// SpiderMonkey (the engine inside the component) says
// `JSON.parse: unexpected character at line 1 column 1 of the JSON data`;
// serde_json says `expected value at line 1 column 1`.
const SERDE_WORDING = [
  [/^unexpected character$/, 'expected value'],
  [/^unexpected non-whitespace character after JSON data$/, 'trailing characters'],
  [/^expected property name or '}'$/, 'key must be a string'],
  [/^expected double-quoted property name$/, 'key must be a string'],
  [/^expected ':' after property name in object$/, 'expected `:`'],
  [/^expected ',' or '}' after property value in object$/, 'expected `,` or `}`'],
  [/^expected ',' or ']' after array element$/, 'expected `,` or `]`'],
  [/^unterminated string literal$/, 'EOF while parsing a string'],
  [/^(unexpected )?end of data.*$/, 'EOF while parsing a value'],
];

export function serdeWording(message) {
  const m = /^JSON\.parse: (.*) at line (\d+) column (\d+) of the JSON data$/.exec(message);
  if (!m) return message;
  const [, what, line, column] = m;
  const found = SERDE_WORDING.find(([pattern]) => pattern.test(what));
  return `${found ? found[1] : what} at line ${line} column ${column}`;
}

// x as sign, shortest round-trip digits d, and where the decimal point falls
// in d (12.5 -> '', '125', 2).
function decimalParts(x) {
  const [mantissa, exponent] = Math.abs(x).toExponential().split('e');
  const d = mantissa.replace('.', '');
  const sign = x < 0 || Object.is(x, -0) ? '-' : '';
  return [sign, d, Number(exponent) + 1];
}

// x as Rust's `{}` shows an f64: shortest digits, never an exponent, no `.0`
// on whole numbers (12.5, 1, -4.5, 0.00001, 1000000000000000000000).
export function f64Display(x) {
  const [sign, d, point] = decimalParts(x);
  if (d === '0') return `${sign}0`;
  if (point >= d.length) return sign + d + '0'.repeat(point - d.length);
  if (point > 0) return `${sign}${d.slice(0, point)}.${d.slice(point)}`;
  return `${sign}0.${'0'.repeat(-point)}${d}`;
}

// x as serde_json writes an f64 (ryu's layout): positional with `.0` on whole
// numbers up to 16 digits (`1.0`, `12.5`, `0.0001`), an exponent past that
// (`1e16`, `1e-7`).
export function f64Json(x) {
  const [sign, d, point] = decimalParts(x);
  const n = d.length;
  let text;
  if (d === '0') text = '0.0';
  else if (point >= n && point <= 16) text = `${d}${'0'.repeat(point - n)}.0`;
  else if (point > 0 && point <= 16) text = `${d.slice(0, point)}.${d.slice(point)}`;
  else if (point > -5 && point <= 0) text = `0.${'0'.repeat(-point)}${d}`;
  else text = `${d[0]}${n > 1 ? '.' + d.slice(1) : ''}e${point - 1}`;
  return sign + text;
}
