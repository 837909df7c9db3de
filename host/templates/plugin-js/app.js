// {{name}}: an acemq-host handler plugin, in JavaScript.
//
// Each message: a body that is not UTF-8 text, or is only whitespace, is
// rejected (the host dead-letters it, with the reason); any other is logged
// and accepted. With `forward_to = "EXCHANGE"` in the consumer's
// [consumers.config] (and EXCHANGE in its `publish_to`), the body also goes
// on to EXCHANGE in capitals, with the routing key it came with.
//
// The import below is the WIT interface `host` of wit/plugin.wit, the
// export `handler` its interface `handler`; the tests resolve the import to
// acemq-testing.mjs. Top-level code runs once, at build time, not in each
// host process: see README.md.

import { log, publish, config } from 'acemq:plugin/host@0.4.0';

// The [consumers.config] key naming the exchange the body goes on to.
const FORWARD_TO = 'forward_to';

export const handler = {
  // `msg` is the WIT resource `message`, lent for this call only.
  handle(msg) {
    const body = msg.body();
    let text;
    try {
      text = new TextDecoder('utf-8', { fatal: true }).decode(body);
    } catch (e) {
      // Never readable, however often it is tried: reject.
      return { tag: 'reject', val: `body is not UTF-8 text: ${e.message}` };
    }
    if (text.trim() === '') return { tag: 'reject', val: 'the body is empty' };
    const { routingKey } = msg.delivery();
    log('info', `${body.length} bytes with routing key '${routingKey}'`);
    const exchange = config(FORWARD_TO);
    if (exchange !== undefined) {
      try {
        // Buffered: the host publishes it only if this call accepts.
        publish({
          exchange,
          routingKey,
          body: new TextEncoder().encode(text.toUpperCase()),
          contentType: 'text/plain; charset=utf-8',
          headers: [],
          // Every field unset: the host's defaults (a derived id, message
          // type = the routing key, version 1, the input's correlation,
          // causation = the input's id).
          envelope: {},
          persistent: true,
          mandatory: undefined, // the consumer's `mandatory_outputs` decides
          deliverAtMs: undefined, // now, not through the scheduler
        });
      } catch (e) {
        // A WIT `result` error is a thrown error whose `payload` is the
        // host's reason. Refused: retry, as the Rust SDK's `?` does. (An
        // exchange outside `publish_to` parks the message whatever this
        // returns: see README.md.)
        const problem = e?.payload ?? String(e);
        return {
          tag: 'retry',
          val: `publish to exchange \`${exchange}\` with routing key \`${routingKey}\` failed: ${problem}`,
        };
      }
    }
    return { tag: 'accept' };
  },
};
