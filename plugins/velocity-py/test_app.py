"""The velocity check's tests, against app.py under plain CPython.

`python3 -m unittest test_app` here (plugins/velocity-py). The `wit_world` bindings, the state
interface included, are faked in memory by guest-sdk/python/acemq_testing.py (the real ones exist
only inside the component): its namespace outlives the calls and takes an order's writes only when
the handler accepts, as the host's does. So this tests the decisions, texts and state, not the build.
"""

import json
import sys
import unittest
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[1] / "guest-sdk" / "python"))
import acemq_testing  # noqa: E402

host, wtypes, Err = acemq_testing.install()
sys.path.insert(0, str(here / "src"))
import app  # noqa: E402

L = host.Level
T0 = 1_700_000_000_000
MINUTE = 60_000
ACCEPT = wtypes.Outcome_Accept()


class TestHost(acemq_testing.FakeHost):
    """The host of one velocity consumer, its namespace kept across orders."""

    def __init__(self, now_ms=T0, **kw):
        super().__init__(now_ms=now_ms, **kw)

    def order(self, customer="acme", order_id="o-1", **kw):
        return self.send(json.dumps({"id": order_id, "customer": customer, "total": 1}), **kw)

    def send(self, body, **kw):
        return self.handle(app.Handler(), acemq_testing.message(body), **kw)

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
        self.assertEqual(h.logs[0], (L.INFO, "order o-0 of customer acme: 1 of 5 within 10m"))
        self.assertEqual(h.logs[4], (L.INFO, "order o-4 of customer acme: 5 of 5 within 10m"))
        self.assertEqual(h.order(order_id="o-5"), park("acme", 5))
        self.assertFalse(h.committed)
        # Only accepted orders are logged; the host reports the rest.
        self.assertEqual(len(h.logs), 5)
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
        for window, ms in (("500ms", 500), ("30s", 30_000), ("10m", 600_000), ("1h", 3_600_000),
                           ("1d", 86_400_000), ("1h 30m", 5_400_000)):
            h = TestHost(config={"limit": "3", "window": window})
            for _ in range(3):
                self.assertEqual(h.order(), ACCEPT)
            self.assertEqual(h.order(), park("acme", 3, window, 3))
            self.assertEqual(h.state.entry(b"customer/acme").expires_at_ms, T0 + ms)
            h.now = T0 + ms - 1
            self.assertEqual(h.order(), park("acme", 3, window, 3))
            h.now = T0 + ms
            self.assertEqual(h.order(), ACCEPT, window)

    def test_the_window_as_configured_is_trimmed_in_reasons_and_logs(self):
        h = TestHost(config={"window": " 1h 30m ", "limit": " 1 "})
        self.assertEqual(h.order(), ACCEPT)
        self.assertEqual(h.logs, [(L.INFO, "order o-1 of customer acme: 1 of 1 within 1h 30m")])
        self.assertEqual(h.state.entry(b"customer/acme").expires_at_ms, T0 + 5_400_000)
        self.assertEqual(h.order(), park("acme", 1, "1h 30m", 1))

    def test_config_it_cannot_read_is_retried(self):
        for limit in ("0", "-1", "five", "", "1.5"):
            h = TestHost(config={"limit": limit})
            self.assertEqual(h.order(), wtypes.Outcome_Retry(
                f"the consumer's config `limit` must be a whole number, 1 or more, "
                f"got {json.dumps(limit)}"))
            self.assertEqual((h.logs, h.state.items()), ([], {}))
        for window in ("10", "ten minutes", "0s", "10x", "m", "1.5h", "", "10 m", "1w", "-1m"):
            h = TestHost(config={"window": window})
            self.assertEqual(h.order(), wtypes.Outcome_Retry(
                f"the consumer's config `window` must be a duration such as 10m, 30s, 1h "
                f"or 500ms, got {json.dumps(window)}"))
            self.assertEqual(h.state.items(), {})

    def test_bad_bodies_are_rejected_saying_what_was_wrong(self):
        too_long = "c" * (app.MAX_CUSTOMER_BYTES + 1)
        for body, reason in (
            ("<order/>", "the body is not JSON: Expecting value: line 1 column 1 (char 0)"),
            (b"\xff{}", "the body is not JSON: invalid UTF-8 at byte 0"),
            ('["o-1","acme"]', 'the body is not a JSON object (an order: {"id": ..., "customer": ...})'),
            ('{"id":"o-1"}', "order o-1 has no `customer` (the text naming who placed it)"),
            ('{"customer":null}', "the order has no `customer` (the text naming who placed it)"),
            ('{"id":7,"customer":42}', "order 7 has a `customer` that is not text: 42"),
            ('{"id":true,"customer":["a", "b"]}',
             'the order has a `customer` that is not text: ["a","b"]'),
            ('{"id":"o-1","customer":""}', "order o-1 has an empty `customer`"),
            (json.dumps({"id": "o-1", "customer": too_long}),
             "order o-1 has a `customer` of 1016 bytes; at most 1015 fit in a state key"),
        ):
            h = TestHost()
            self.assertEqual(h.send(body), wtypes.Outcome_Reject(reason), body)
            self.assertEqual((h.logs, h.state.items()), ([], {}))

    def test_the_longest_customer_fits_in_a_state_key(self):
        h = TestHost()
        self.assertEqual(h.order("c" * app.MAX_CUSTOMER_BYTES), ACCEPT)
        self.assertEqual(len(h.state.keys()[0]), 1024)
        self.assertEqual(app.MAX_CUSTOMER_BYTES, 1015)

    def test_only_the_customer_is_needed(self):
        h = TestHost()
        self.assertEqual(h.send('{"customer":"acme"}'), ACCEPT)
        self.assertEqual(h.send('{"id":12,"customer":"acme"}'), ACCEPT)
        self.assertEqual(h.logs, [(L.INFO, "the order of customer acme: 1 of 5 within 10m"),
                                  (L.INFO, "order 12 of customer acme: 2 of 5 within 10m")])

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
        self.assertEqual(h.order(), wtypes.Outcome_Retry(
            'state get_versioned of key `customer/acme` failed: this consumer has no state '
            'store: set state = "NAME" in its [[consumers]] entry'))
        self.assertEqual(h.logs, [])

    def test_a_refused_write_is_retried_with_the_hosts_reason(self):
        # The host refusing the write (a test's stand-in for any of its reasons).
        h = TestHost()

        def refuse(*_):
            raise Err("a state value is at most 1048576 bytes; this one is 2000000")

        acemq_testing.state_module().set_if_version = refuse
        self.assertEqual(h.order(), wtypes.Outcome_Retry(
            "state set_if_version of key `customer/acme` failed: a state value is at most "
            "1048576 bytes; this one is 2000000"))
        self.assertEqual(app.state_failed("get", "k" * 70, "no"),
                         f"state get of key `{'k' * 64}...` failed: no")

    def test_state_that_is_not_a_list_of_times_is_parked_for_a_person(self):
        for stored, problem in (
            (b'{"edited": true}', "expected a list of whole numbers of milliseconds"),
            (b'[1,"2"]', "expected a list of whole numbers of milliseconds"),
            (b"[1.5]", "expected a list of whole numbers of milliseconds"),
            (b"[-1]", "expected a list of whole numbers of milliseconds"),
            (b"six", "Expecting value: line 1 column 1 (char 0)"),
        ):
            h = TestHost()
            h.state.seed("customer/acme", stored)
            self.assertEqual(h.order(), wtypes.Outcome_Park(
                f"the state key `customer/acme` does not hold a JSON list of epoch-ms times: "
                f"{problem}"), stored)
            self.assertEqual(h.state.get("customer/acme"), stored)

    def test_durations_are_read_as_config_writes_them(self):
        for text, ms in (("500ms", 500), ("30s", 30_000), ("10m", 600_000), ("1h", 3_600_000),
                         ("2d", 172_800_000), ("1h 30m", 5_400_000), ("1h30m15s", 5_415_000),
                         (" 10m ", 600_000)):
            self.assertEqual(app.parse_duration(text), ms, text)
        for bad in ("", "10", "m", "0m", "0s 0ms", "10 m", "1.5h", "-1m", "10M", "1w", "1m,2s",
                    "99999999999999999999d"):
            self.assertIsNone(app.parse_duration(bad), bad)


if __name__ == "__main__":
    unittest.main()
