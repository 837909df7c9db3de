// Stands in for the WIT import `acemq:plugin/host@0.4.0` when app.js runs
// under Node for the tests: each call goes to the test's current TestHost.
export const log = (level, text) => globalThis.acemqTestHost.log(level, text);
export const publish = (msg) => globalThis.acemqTestHost.publish(msg);
export const config = (key) => globalThis.acemqTestHost.config(key);
export const nowMs = () => globalThis.acemqTestHost.nowMs();
