"""The velocity check's tests, against app.py under plain CPython.

`python3 -m unittest test_app` here (plugins/velocity-py). The `wit_world` bindings, the state
interface included, are faked in memory by plugins/python-testing/fake_wit.py (the real ones exist
only inside the component): its namespace outlives the calls and takes an order's writes only when
the handler accepts, as the host's does. So this tests the decisions, texts and state, not the build.
"""

import json
import sys
import unittest
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parent / "python-testing"))
import fake_wit  # noqa: E402

host, wtypes, Err = fake_wit.install()
sys.path.insert(0, str(here / "src"))
import app  # noqa: E402

L = host.Level
T0 = 1_700_000_000_000
MINUTE = 60_000
ACCEPT = wtypes.Outcome_Accept()


class TestHost(fake_wit.FakeHost):
    """The host of one velocity consumer, its namespace kept across orders."""

    def __init__(self, now_ms=T0, **kw):
        super().__init__(now_ms=now_ms, **kw)

    def order(self, customer="acme", order_id="o-1", **kw):
        return self.send(json.dumps({"id": order_id, "customer": customer, "total": 1}), **kw)

    def send(self, body, **kw):
        return self.handle(app.Handler(), fake_wit.message(body), **kw)

    def times(self, customer="acme"):
        value = self.state.get(f"customer/{customer}")
        return None if value is None else json.loads(value)


def park(customer, n, window="10m", limit=5):
    return wtypes.Outcome_Park(f"customer {customer} placed {n} orders within {window} (limit {limit})")


class VelocityTest(unittest.TestCase):
    def test_accepts_up_to_the_limit_and_parks_the_next(self):
        h = TestHost()
        for i in range(5):
            self.assertEqual(h.order(order_id=f"o-{i}"), ACCEPT)
            h.now += 1_000
        self.assertEqual(h.times(), [T0, T0 + 1_000, T0 + 2_000, T0 + 3_000, T0 + 4_000])
        self.assertEqual(h.logs[0], (L.INFO, "order o-0 from acme accepted: 1 of 5 within 10m"))
        self.assertEqual(h.logs[4], (L.INFO, "order o-4 from acme accepted: 5 of 5 within 10m"))
        self.assertEqual(h.order(order_id="o-5"), park("acme", 5))
        self.assertEqual(h.logs[5], (L.WARN, "park: customer acme placed 5 orders within 10m (limit 5)"))
        self.assertEqual(h.published, [])

    def test_the_key_value_and_ttl_are_as_documented(self):
        h = TestHost()
        h.order()
        entry = h.state.entry(b"customer/acme")
        self.assertEqual(entry.value, b"[%d]" % T0)
        # The key goes when its newest time leaves the window.
        self.assertEqual(entry.expires_at_ms, T0 + 10 * MINUTE)
        self.assertEqual(h.state.keys(), [b"customer/acme"])
        h.now += 5
        h.order()
        self.assertEqual(h.state.get(b"customer/acme"), b"[%d,%d]" % (T0, T0 + 5))
        self.assertEqual(h.state.entry(b"customer/acme").expires_at_ms, T0 + 5 + 10 * MINUTE)

    def test_orders_leave_the_window_and_are_dropped(self):
        h = TestHost()
        for _ in range(5):
            h.order()
            h.now += MINUTE
        self.assertEqual(h.order(), park("acme", 5))
        # 10 minutes after the first order (T0), it no longer counts.
        h.now = T0 + 10 * MINUTE
        self.assertEqual(h.order(), ACCEPT)
        self.assertEqual(h.times(), [T0 + i * MINUTE for i in range(1, 5)] + [T0 + 10 * MINUTE])
        self.assertEqual(h.order(), park("acme", 5))
        # A quiet customer's key expires; the next order starts afresh.
        h.now += 10 * MINUTE
        self.assertIsNone(h.times())
        self.assertEqual(h.order(), ACCEPT)
        self.assertEqual(h.times(), [h.now])

    def test_the_window_edge(self):
        h = TestHost(config={"limit": "1", "window": "30s"})
        h.order()
        h.now = T0 + 29_999
        self.assertEqual(h.order(), park("acme", 1, "30s", 1))
        h.now = T0 + 30_000
        self.assertEqual(h.order(), ACCEPT)

    def test_customers_are_independent(self):
        h = TestHost(config={"limit": "2"})
        for customer in ("acme", "zed", "acme", "zed"):
            self.assertEqual(h.order(customer), ACCEPT)
        self.assertEqual(h.order("acme"), park("acme", 2, limit=2))
        self.assertEqual(h.order("zed"), park("zed", 2, limit=2))
        self.assertEqual(h.order("émile"), ACCEPT)
        self.assertEqual(h.state.keys(),
                         [b"customer/acme", b"customer/zed", "customer/émile".encode()])

    def test_config_is_honoured(self):
        for window, ms in (("500ms", 500), ("30s", 30_000), ("10m", 600_000), ("1h", 3_600_000)):
            h = TestHost(config={"limit": "3", "window": window})
            for _ in range(3):
                self.assertEqual(h.order(), ACCEPT)
            self.assertEqual(h.order(), park("acme", 3, window, 3))
            self.assertEqual(h.state.entry(b"customer/acme").expires_at_ms, T0 + ms)
            h.now = T0 + ms - 1
            self.assertEqual(h.order(), park("acme", 3, window, 3))
            h.now = T0 + ms
            self.assertEqual(h.order(), ACCEPT, window)

    def test_config_it_cannot_read_is_retried(self):
        for config, reason in (
            ({"limit": "five"}, 'config `limit` = "five" is not a positive integer'),
            ({"limit": "0"}, 'config `limit` = "0" is not a positive integer'),
            ({"limit": "-1"}, 'config `limit` = "-1" is not a positive integer'),
            ({"window": "10"}, 'config `window` = "10" is not a duration such as 500ms, 30s, 10m or 1h'),
            ({"window": "1d"}, 'config `window` = "1d" is not a duration such as 500ms, 30s, 10m or 1h'),
            ({"window": "0s"}, 'config `window` = "0s" is not a duration such as 500ms, 30s, 10m or 1h'),
        ):
            h = TestHost(config=config)
            self.assertEqual(h.order(), wtypes.Outcome_Retry(reason))
            self.assertEqual(h.logs, [(L.WARN, f"retry: {reason}")])
            self.assertEqual(h.state.items(), {})

    def test_bad_bodies_are_rejected_saying_what_was_wrong(self):
        for body, reason in (
            ("<order/>", "body is not JSON: Expecting value: line 1 column 1 (char 0)"),
            (b"\xff{}", "body is not JSON: invalid UTF-8 at byte 0"),
            ('["acme"]', "body is not a JSON object but an array"),
            ('{"id":"o-1"}', "order has no `customer`"),
            ('{"id":"o-1","customer":""}', "order's `customer` must be a non-empty string, not an empty string"),
            ('{"id":"o-1","customer":7}', "order's `customer` must be a non-empty string, not a number"),
            ('{"id":"o-1","customer":null}', "order's `customer` must be a non-empty string, not null"),
        ):
            h = TestHost()
            self.assertEqual(h.send(body), wtypes.Outcome_Reject(reason), body)
            self.assertEqual(h.logs, [(L.WARN, f"reject: {reason}")])
            self.assertEqual(h.state.items(), {})

    def test_only_the_customer_is_needed(self):
        h = TestHost()
        self.assertEqual(h.send('{"customer":"acme"}'), ACCEPT)
        self.assertEqual(h.logs, [(L.INFO, "order (no id) from acme accepted: 1 of 5 within 10m")])

    def test_parked_orders_are_not_counted(self):
        h = TestHost(config={"limit": "2", "window": "1m"})
        h.order()
        h.now += 30_000
        h.order()
        stored = h.state.entry(b"customer/acme")
        for _ in range(3):
            self.assertEqual(h.order(), park("acme", 2, "1m", 2))
            self.assertFalse(h.committed)
        self.assertEqual(h.state.entry(b"customer/acme"), stored)
        # Once the first order leaves the window there is room for one.
        h.now = T0 + 60_000
        self.assertEqual(h.order(), ACCEPT)
        self.assertEqual(h.times(), [T0 + 30_000, T0 + 60_000])

    def test_a_conflict_leaves_nothing(self):
        h = TestHost()
        h.state.seed("customer/acme", json.dumps([T0 - 1]))
        # Another order of the customer committed while this one ran.
        h.concurrently(lambda ns: ns.seed("customer/acme", json.dumps([T0 - 2, T0 - 1])))
        self.assertEqual(h.order(), ACCEPT)
        self.assertEqual(h.conflict, b"customer/acme")
        self.assertEqual(h.times(), [T0 - 2, T0 - 1])

    def test_a_conflict_is_decided_again_on_the_other_orders_list(self):
        h = TestHost(config={"limit": "2"})
        h.order()
        # The other order took the last place meanwhile: the re-run parks.
        h.concurrently(lambda ns: ns.seed("customer/acme", json.dumps([T0, T0])))
        self.assertEqual(h.order(reruns=5), park("acme", 2, limit=2))
        self.assertEqual((h.runs, h.times()), (2, [T0, T0]))
        # A re-run with room accepts on top of the other order's list.
        h.state.seed("customer/zed", json.dumps([T0]))
        h.concurrently(lambda ns: ns.seed("customer/zed", json.dumps([T0 - 1])))
        self.assertEqual(h.order("zed", reruns=5), ACCEPT)
        self.assertEqual((h.runs, h.times("zed")), (2, [T0 - 1, T0]))

    def test_a_first_order_raced_by_another_first_order_conflicts(self):
        h = TestHost()
        h.concurrently(lambda ns: ns.seed("customer/acme", json.dumps([T0])))
        self.assertEqual(h.order(), ACCEPT)
        self.assertEqual((h.conflict, h.times()), (b"customer/acme", [T0]))

    def test_a_consumer_without_state_retries_with_the_hosts_reason(self):
        h = TestHost(state=None)
        reason = f"state get-versioned of `customer/acme` failed: {fake_wit.NO_STATE_STORE}"
        self.assertEqual(h.order(), wtypes.Outcome_Retry(reason))
        self.assertEqual(h.logs, [(L.WARN, f"retry: {reason}")])

    def test_a_refused_write_is_retried(self):
        h = TestHost()
        long = "c" * 1020
        outcome = h.order(long)
        self.assertIsInstance(outcome, wtypes.Outcome_Retry)
        self.assertTrue(outcome.value.startswith(f"state get-versioned of `customer/{long}` failed: "
                                                 "a state key is 1 to 1024 bytes"), outcome.value)

    def test_a_list_it_cannot_read_is_retried(self):
        for stored in (b"six", b'{"t":1}', b'[1,"2"]', b"\xff"):
            h = TestHost()
            h.state.seed("customer/acme", stored)
            outcome = h.order()
            self.assertEqual(outcome, wtypes.Outcome_Retry(
                "state key `customer/acme` does not hold a JSON list of epoch-ms times "
                "(delete it with `acemq-host state delete`)"), stored)
            self.assertEqual(h.state.get("customer/acme"), stored)

    def test_window_ms(self):
        for text, ms in (("500ms", 500), ("30s", 30_000), ("10m", 600_000), ("1h", 3_600_000),
                         ("90m", 5_400_000), ("1", None), ("1.5s", None), ("s", None),
                         ("0ms", None), ("10 m", None), ("", None)):
            self.assertEqual(app.window_ms(text), ms, text)


if __name__ == "__main__":
    unittest.main()
