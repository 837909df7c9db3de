"""The Rust plugin's tests, against app.py under plain CPython.

`python3 -m unittest test_app` here (plugins/order-router-py). The `wit_world` bindings are faked in
memory by guest-sdk/python/acemq_testing.py (the real ones exist only inside the component), so this
tests the decisions and texts, not the build.
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


class TestHost(acemq_testing.FakeHost):
    """What the host did for one handle call of the order router."""

    def route(self, body):
        return self.handle(app.Handler(), acemq_testing.message(body))


L = host.Level


class OrderRouterTest(unittest.TestCase):
    def test_valid_order_publishes_an_event_and_accepts(self):
        h = TestHost(now_ms=42)
        outcome = h.route('{"id":"o-1","customer":"acme","total":12.5,"lines":[]}')
        self.assertEqual(outcome, wtypes.Outcome_Accept())
        [event] = h.published
        self.assertEqual((event.exchange, event.routing_key), ("orders.events", "order.accepted"))
        self.assertEqual(event.content_type, "application/json")
        self.assertTrue(event.persistent)
        self.assertEqual((event.headers, event.mandatory, event.deliver_at_ms), ([], None, None))
        self.assertEqual(event.envelope, wtypes.EnvelopeFields(None, None, None, None, None))
        self.assertEqual(event.body, b'{"id":"o-1","customer":"acme","total":12.5,"routed_at_ms":42}')
        self.assertEqual(h.logs, [(L.INFO, "order o-1 from acme (total 12.5) accepted: "
                                           "order.accepted to orders.events")])

    def test_events_exchange_comes_from_config(self):
        h = TestHost(config={"events_exchange": "shop.events"})
        self.assertEqual(h.route('{"id":"o-1","customer":"acme","total":1}'), wtypes.Outcome_Accept())
        self.assertEqual(h.published[0].exchange, "shop.events")
        # As serde_json writes an f64 read from `1`.
        self.assertEqual(json.loads(h.published[0].body)["total"], 1.0)
        self.assertIn(b'"total":1.0,', h.published[0].body)
        self.assertEqual(h.logs[0][1], "order o-1 from acme (total 1) accepted: order.accepted to shop.events")

    def test_missing_field_is_rejected_by_name(self):
        h = TestHost()
        outcome = h.route('{"id":"o-1","total":3}')
        self.assertEqual(outcome, wtypes.Outcome_Reject(
            "body is not a valid Order: missing field `customer` at line 1 column 22"))
        self.assertEqual(h.published, [])
        self.assertEqual(len(h.logs), 1)
        self.assertEqual(h.logs[0][0], L.WARN)

    def test_non_positive_total_is_rejected_with_the_id(self):
        for total, shown in (("0", "0"), ("-4.5", "-4.5")):
            h = TestHost()
            outcome = h.route(f'{{"id":"o-7","customer":"acme","total":{total}}}')
            reason = f"order o-7: total must be positive, got {shown}"
            self.assertEqual(outcome, wtypes.Outcome_Reject(reason))
            self.assertEqual(h.published, [])
            self.assertEqual(h.logs, [(L.WARN, f"reject: {reason}")])

    def test_not_json_is_rejected(self):
        outcome = TestHost().route("<order/>")
        self.assertEqual(outcome, wtypes.Outcome_Reject(
            "body is not a valid Order: expected value at line 1 column 1"))

    def test_wrong_types_are_rejected(self):
        for body, problem in (
            ('{"id":"o-1","customer":"acme","total":"3"}', 'invalid type: string "3", expected f64'),
            ('{"id":1,"customer":"acme","total":3}', "invalid type: integer `1`, expected a string"),
            ('{"id":"o-1","customer":"acme","total":true}', "invalid type: boolean `true`, expected f64"),
            ('{"id":"o-1","customer":"acme","total":NaN}', "expected value (NaN is not JSON)"),
            ('"o-1"', 'invalid type: string "o-1", expected struct Order'),
        ):
            self.assertEqual(TestHost().route(body),
                             wtypes.Outcome_Reject(f"body is not a valid Order: {problem}"), body)

    def test_refused_publish_is_retried(self):
        h = TestHost(publish_to=["elsewhere"])
        outcome = h.route('{"id":"o-1","customer":"acme","total":1}')
        self.assertIsInstance(outcome, wtypes.Outcome_Retry)
        self.assertIn("`orders.events`", outcome.value)
        self.assertTrue(outcome.value.startswith(
            "publish to exchange `orders.events` with routing key `order.accepted` failed: "))
        self.assertEqual(h.logs, [(L.WARN, f"retry: {outcome.value}")])

    def test_numbers_are_shown_as_rust_shows_them(self):
        for x, display, js in ((12.5, "12.5", "12.5"), (1.0, "1", "1.0"), (1e-5, "0.00001", "0.00001"),
                               (1e-7, "0.0000001", "1e-7"), (1.5e300, "15" + "0" * 299, "1.5e300"),
                               (1e16, "10000000000000000", "1e16"), (123.0, "123", "123.0"),
                               (1e21, "1000000000000000000000", "1e21"), (-0.0, "-0", "-0.0")):
            self.assertEqual((app.f64_display(x), app.f64_json(x)), (display, js))


if __name__ == "__main__":
    unittest.main()
