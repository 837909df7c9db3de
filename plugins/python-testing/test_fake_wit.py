"""The shared fake bindings' own tests: what a plugin's tests rely on them for.

`python3 -m unittest test_fake_wit` here (plugins/python-testing).
"""

import unittest

import fake_wit

host, wtypes, Err = fake_wit.install()


class Reminder:
    """A handler as a plugin writes one: publishes its body to `reminders`,
    ten minutes from now when `delay` is set."""

    def __init__(self, delay):
        self.delay = delay

    def handle(self, msg):
        with msg:
            body = msg.body()
        due = host.now_ms() + 600_000 if self.delay else None
        try:
            host.publish(wtypes.Outgoing(
                exchange="reminders", routing_key="reminder", body=body,
                content_type="text/plain", headers=[],
                envelope=wtypes.EnvelopeFields(id=None, message_type=None, version=None,
                                               correlation_id=None, causation_id=None),
                persistent=True, mandatory=None, deliver_at_ms=due))
        except Err as e:
            return wtypes.Outcome_Retry(e.value)
        return wtypes.Outcome_Accept()


class DelayedPublishingTest(unittest.TestCase):
    def test_a_delayed_output_keeps_its_due_time(self):
        h = fake_wit.FakeHost(now_ms=1_000)
        self.assertEqual(h.handle(Reminder(delay=True), fake_wit.message("call")),
                         wtypes.Outcome_Accept())
        [out] = h.published
        self.assertEqual(out.deliver_at_ms, 601_000)
        h = fake_wit.FakeHost()
        h.handle(Reminder(delay=False), fake_wit.message("call"))
        self.assertIsNone(h.published[0].deliver_at_ms)

    def test_a_consumer_without_publish_delayed_is_refused_as_by_the_host(self):
        h = fake_wit.FakeHost(publish_delayed=False)
        self.assertEqual(h.handle(Reminder(delay=True), fake_wit.message("call")),
                         wtypes.Outcome_Retry(
                             "delayed publishing (deliver-at-ms) is not allowed for this consumer: "
                             "set publish_delayed = true in its [[consumers]] entry"))
        self.assertEqual(h.published, [])
        # Publishing now needs no scheduler.
        self.assertEqual(h.handle(Reminder(delay=False), fake_wit.message("call")),
                         wtypes.Outcome_Accept())

    def test_a_due_time_beyond_max_delay_is_refused(self):
        h = fake_wit.FakeHost(max_delay_ms=599_999)
        outcome = h.handle(Reminder(delay=True), fake_wit.message("call"))
        self.assertIsInstance(outcome, wtypes.Outcome_Retry)
        self.assertIn("beyond the longest delay this host schedules", outcome.value)
        self.assertEqual(h.published, [])
        # The limit itself is allowed.
        h = fake_wit.FakeHost(max_delay_ms=600_000)
        self.assertEqual(h.handle(Reminder(delay=True), fake_wit.message("call")),
                         wtypes.Outcome_Accept())


if __name__ == "__main__":
    unittest.main()
