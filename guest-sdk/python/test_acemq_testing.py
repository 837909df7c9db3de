"""The shared fake bindings' own tests: what a plugin's tests rely on them for
(delayed publishing, and the state interface as docs/state.md describes it).

`python3 -m unittest test_acemq_testing` here (guest-sdk/python).
"""

import unittest

import acemq_testing

host, wtypes, Err = acemq_testing.install()
# As a plugin imports it: `from wit_world.imports import state`.
from wit_world.imports import state  # noqa: E402


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
        h = acemq_testing.FakeHost(now_ms=1_000)
        self.assertEqual(h.handle(Reminder(delay=True), acemq_testing.message("call")),
                         wtypes.Outcome_Accept())
        [out] = h.published
        self.assertEqual(out.deliver_at_ms, 601_000)
        h = acemq_testing.FakeHost()
        h.handle(Reminder(delay=False), acemq_testing.message("call"))
        self.assertIsNone(h.published[0].deliver_at_ms)

    def test_a_consumer_without_publish_delayed_is_refused_as_by_the_host(self):
        h = acemq_testing.FakeHost(publish_delayed=False)
        self.assertEqual(h.handle(Reminder(delay=True), acemq_testing.message("call")),
                         wtypes.Outcome_Retry(
                             "delayed publishing (deliver-at-ms) is not allowed for this consumer: "
                             "set publish_delayed = true in its [[consumers]] entry"))
        self.assertEqual(h.published, [])
        # Publishing now needs no scheduler.
        self.assertEqual(h.handle(Reminder(delay=False), acemq_testing.message("call")),
                         wtypes.Outcome_Accept())

    def test_a_due_time_beyond_max_delay_is_refused(self):
        h = acemq_testing.FakeHost(max_delay_ms=599_999)
        outcome = h.handle(Reminder(delay=True), acemq_testing.message("call"))
        self.assertIsInstance(outcome, wtypes.Outcome_Retry)
        self.assertIn("beyond the longest delay this host schedules", outcome.value)
        self.assertEqual(h.published, [])
        # The limit itself is allowed.
        h = acemq_testing.FakeHost(max_delay_ms=600_000)
        self.assertEqual(h.handle(Reminder(delay=True), acemq_testing.message("call")),
                         wtypes.Outcome_Accept())


class Script:
    """A handler that runs `steps()` (the state calls under test) and keeps
    what it returned in `result`; it returns that when it is an outcome,
    else Accept."""

    def __init__(self, steps):
        self.steps, self.result = steps, None

    def handle(self, msg):
        with msg:
            pass
        self.result = self.steps()
        outcomes = (wtypes.Outcome_Accept, wtypes.Outcome_Retry, wtypes.Outcome_Reject,
                    wtypes.Outcome_Park)
        return self.result if isinstance(self.result, outcomes) else wtypes.Outcome_Accept()


def run(h, steps, **kw):
    """Runs `steps` as one call on `h`: (outcome, what steps returned)."""
    script = Script(steps)
    outcome = h.handle(script, acemq_testing.message("x"), **kw)
    return outcome, script.result


def raised(f, *args):
    """The reason of the Err `f(*args)` raised (fails if it returned)."""
    try:
        f(*args)
    except Err as e:
        return e.value
    raise AssertionError(f"{f.__name__}{args} raised no Err")


class StateCallsTest(unittest.TestCase):
    def test_reads_see_the_calls_own_writes_and_commit_on_accept(self):
        h = acemq_testing.FakeHost()

        def steps():
            before = state.get(b"k")
            state.set(b"k", b"v1", None)
            during = state.get(b"k")
            state.delete(b"gone")
            return before, during

        self.assertEqual(run(h, steps), (wtypes.Outcome_Accept(), (None, b"v1")))
        self.assertTrue(h.committed)
        self.assertEqual(h.state.items(), {b"k": b"v1"})
        # The next call reads what the last one committed.
        self.assertEqual(run(h, lambda: state.get(b"k"))[1], b"v1")
        self.assertEqual(h.last_call.writes, {})

    def test_an_input_not_accepted_leaves_no_write(self):
        for outcome in (wtypes.Outcome_Retry("later"), wtypes.Outcome_Reject("bad"),
                        wtypes.Outcome_Park("aside")):
            h = acemq_testing.FakeHost()
            h.state.seed("kept", "old")

            def steps():
                state.set(b"kept", b"new", None)
                state.set(b"fresh", b"1", None)
                state.increment(b"n", 1, None)
                return outcome

            self.assertEqual(run(h, steps)[0], outcome)
            self.assertFalse(h.committed)
            self.assertEqual(h.state.items(), {b"kept": b"old"})
            # What it would have written stays readable for the test.
            self.assertEqual(sorted(h.last_call.writes), [b"fresh", b"kept", b"n"])

    def test_a_handler_that_raises_commits_nothing(self):
        h = acemq_testing.FakeHost()

        def steps():
            state.set(b"k", b"v", None)
            raise ValueError("trap")

        with self.assertRaises(ValueError):
            run(h, steps)
        self.assertEqual(h.state.items(), {})

    def test_a_consumer_without_state_gets_the_error_from_every_call(self):
        h = acemq_testing.FakeHost(state=None)
        self.assertIsNone(h.state)
        calls = ((state.get, b"k"), (state.set, b"k", b"v", None), (state.delete, b"k"),
                 (state.increment, b"k", 1, None), (state.get_versioned, b"k"),
                 (state.set_if_version, b"k", b"v", 0, None))
        reasons = run(h, lambda: [raised(*c) for c in calls])[1]
        self.assertEqual(reasons, [acemq_testing.NO_STATE_STORE] * 6)
        self.assertEqual(acemq_testing.NO_STATE_STORE,
                         'this consumer has no state store: set state = "NAME" in its '
                         '[[consumers]] entry')

    def test_state_calls_outside_handle_are_a_test_mistake(self):
        acemq_testing.FakeHost()
        with self.assertRaisesRegex(RuntimeError, "outside FakeHost.handle"):
            state.get(b"k")

    def test_keys_and_values_are_bytes(self):
        h = acemq_testing.FakeHost()
        with self.assertRaises(TypeError):
            run(h, lambda: state.get("k"))
        with self.assertRaises(TypeError):
            run(h, lambda: state.set(b"k", "v", None))
        with self.assertRaises(OverflowError):
            run(h, lambda: state.increment(b"k", 1 << 63, None))
        self.assertEqual(run(h, lambda: state.set(b"k", bytearray(b"v"), None))[0],
                         wtypes.Outcome_Accept())
        self.assertEqual(h.state.get(b"k"), b"v")


class StateExpiryTest(unittest.TestCase):
    def test_ttl_is_on_the_fake_clock_and_none_never_expires(self):
        h = acemq_testing.FakeHost(now_ms=1_000)

        def steps():
            state.set(b"brief", b"1", 500)
            state.set(b"forever", b"2", None)

        run(h, steps)
        self.assertEqual(h.state.entry(b"brief").expires_at_ms, 1_500)
        self.assertIsNone(h.state.entry(b"forever").expires_at_ms)
        h.now = 1_499
        self.assertEqual(run(h, lambda: state.get(b"brief"))[1], b"1")
        h.now = 1_500
        self.assertEqual(run(h, lambda: (state.get(b"brief"), state.get_versioned(b"brief")))[1],
                         (None, None))
        self.assertEqual(h.state.keys(), [b"forever"])
        h.now = 10 ** 15
        self.assertEqual(run(h, lambda: state.get(b"forever"))[1], b"2")

    def test_a_zero_ttl_is_refused_as_by_the_host(self):
        h = acemq_testing.FakeHost()
        reason = "ttl-ms must be at least 1 (none: the key never expires)"
        self.assertEqual(run(h, lambda: [raised(state.set, b"k", b"v", 0),
                                         raised(state.increment, b"n", 1, 0),
                                         raised(state.set_if_version, b"k", b"v", 0, 0)])[1],
                         [reason] * 3)
        self.assertEqual((h.last_call.writes, h.state.items()), ({}, {}))

    def test_seeded_entries_expire_too(self):
        h = acemq_testing.FakeHost(now_ms=0)
        h.state.seed(b"k", b"v", ttl_ms=10)
        self.assertEqual(h.state.get(b"k"), b"v")
        h.now = 10
        self.assertIsNone(h.state.get(b"k"))
        self.assertEqual(h.state.version(b"k"), 0)


class IncrementTest(unittest.TestCase):
    def test_counts_from_zero_and_stores_ascii_decimal(self):
        h = acemq_testing.FakeHost()
        self.assertEqual(run(h, lambda: (state.increment(b"n", 5, None),
                                         state.increment(b"n", 1, None),
                                         state.get(b"n")))[1], (5, 6, b"6"))
        self.assertEqual(h.state.get(b"n"), b"6")
        self.assertEqual(run(h, lambda: state.increment(b"n", -10, None))[1], -4)
        self.assertEqual(h.state.get(b"n"), b"-4")

    def test_reads_a_value_set_as_text(self):
        h = acemq_testing.FakeHost()
        h.state.seed(b"n", b"41")
        self.assertEqual(run(h, lambda: state.increment(b"n", 1, None))[1], 42)
        # As Rust's i64 parses it, a sign may lead.
        h.state.seed(b"n", b"+7")
        self.assertEqual(run(h, lambda: state.increment(b"n", 1, None))[1], 8)

    def test_a_non_integer_value_is_an_error(self):
        for value in (b"six", b"6.0", b" 6", b"", b"99999999999999999999", "\u0666".encode()):
            h = acemq_testing.FakeHost()
            h.state.seed(b"n", value)
            reason = run(h, lambda: raised(state.increment, b"n", 1, None))[1]
            self.assertEqual(reason, 'the key "n" does not hold an integer (increment keeps '
                                     'decimal text such as "6"), so it cannot be incremented', value)
            self.assertEqual(h.state.get(b"n"), value)
            self.assertEqual(h.last_call.writes, {})

    def test_overflow_is_an_error(self):
        h = acemq_testing.FakeHost()
        h.state.seed(b"n", str(acemq_testing.I64_MAX).encode())
        self.assertEqual(run(h, lambda: raised(state.increment, b"n", 1, None))[1],
                         f'incrementing the key "n" by 1 overflows a 64-bit integer '
                         f'(it holds {acemq_testing.I64_MAX})')
        h.state.seed(b"n", str(acemq_testing.I64_MIN).encode())
        self.assertIn("overflows", run(h, lambda: raised(state.increment, b"n", -1, None))[1])
        self.assertEqual(run(h, lambda: state.increment(b"n", 0, None))[1], acemq_testing.I64_MIN)

    def test_no_ttl_keeps_the_keys_own_expiry_and_a_ttl_sets_a_new_one(self):
        h = acemq_testing.FakeHost(now_ms=0)
        h.state.seed(b"n", b"1", ttl_ms=1_000)
        h.state.seed(b"m", b"1")
        h.now = 400
        run(h, lambda: (state.increment(b"n", 1, None), state.increment(b"m", 1, None),
                        state.increment(b"new", 1, None)))
        self.assertEqual(h.state.entry(b"n").expires_at_ms, 1_000)
        self.assertIsNone(h.state.entry(b"m").expires_at_ms)
        self.assertIsNone(h.state.entry(b"new").expires_at_ms)
        run(h, lambda: state.increment(b"n", 1, 5_000))
        self.assertEqual(h.state.entry(b"n"), acemq_testing.StateEntry(b"3", h.state.version(b"n"), 5_400))
        # Within one call, a key's own expiry is the one the call set.
        run(h, lambda: (state.set(b"t", b"0", 100), state.increment(b"t", 1, None)))
        self.assertEqual(h.state.entry(b"t").expires_at_ms, 500)

    def test_an_increment_conflicts_when_its_key_changed_before_the_commit(self):
        h = acemq_testing.FakeHost()
        h.state.seed(b"n", b"1")
        h.concurrently(lambda ns: ns.seed(b"n", b"10"))
        self.assertEqual(run(h, lambda: state.increment(b"n", 1, None))[1], 2)
        self.assertEqual(h.conflict, b"n")
        self.assertFalse(h.committed)
        self.assertEqual(h.state.get(b"n"), b"10")
        # The host runs it again on fresh state.
        h.concurrently(lambda ns: ns.seed(b"n", b"20"))
        self.assertEqual(run(h, lambda: state.increment(b"n", 1, None), reruns=5)[1], 21)
        self.assertEqual((h.runs, h.conflict, h.state.get(b"n")), (2, None, b"21"))

    def test_an_increment_of_the_calls_own_write_checks_nothing(self):
        h = acemq_testing.FakeHost()
        h.state.seed(b"n", b"1")
        h.concurrently(lambda ns: ns.seed(b"n", b"10"))
        run(h, lambda: (state.set(b"n", b"5", None), state.increment(b"n", 1, None)))
        self.assertEqual((h.conflict, h.state.get(b"n")), (None, b"6"))


class VersionsTest(unittest.TestCase):
    def test_versions_are_unique_and_never_reused(self):
        h = acemq_testing.FakeHost()
        v1 = h.state.seed(b"a", b"1")
        run(h, lambda: (state.set(b"b", b"1", None), state.set(b"a", b"2", None)))
        va, vb = h.state.version(b"a"), h.state.version(b"b")
        self.assertEqual(len({v1, va, vb}), 3)
        self.assertTrue(all(v > 0 for v in (v1, va, vb)))
        run(h, lambda: state.delete(b"a"))
        self.assertEqual(h.state.version(b"a"), 0)
        run(h, lambda: state.set(b"a", b"1", None))
        self.assertGreater(h.state.version(b"a"), max(v1, va, vb))
        self.assertEqual(run(h, lambda: state.get_versioned(b"a"))[1],
                         (b"1", h.state.version(b"a")))

    def test_set_if_version_commits_when_the_version_held(self):
        h = acemq_testing.FakeHost()
        v = h.state.seed(b"k", b"old")

        def steps():
            value, version = state.get_versioned(b"k")
            state.set_if_version(b"k", value + b"+new", version, None)
            # Its own write, based on the same committed version.
            return state.get_versioned(b"k")

        self.assertEqual(run(h, steps)[1], (b"old+new", v))
        self.assertTrue(h.committed)
        self.assertEqual(h.state.get(b"k"), b"old+new")
        self.assertGreater(h.state.version(b"k"), v)

    def test_version_zero_means_only_if_absent(self):
        h = acemq_testing.FakeHost()
        run(h, lambda: state.set_if_version(b"k", b"first", 0, None))
        self.assertEqual((h.committed, h.state.get(b"k")), (True, b"first"))
        run(h, lambda: state.set_if_version(b"k", b"second", 0, None))
        self.assertEqual((h.committed, h.conflict, h.state.get(b"k")), (False, b"k", b"first"))

    def test_a_stale_version_conflicts_at_the_commit(self):
        h = acemq_testing.FakeHost()
        v = h.state.seed(b"k", b"1")
        h.state.seed(b"k", b"2")
        # The call is not refused; its commit is.
        outcome, result = run(h, lambda: (state.set_if_version(b"k", b"3", v, None),
                                          state.get(b"k")))
        self.assertEqual((outcome, result), (wtypes.Outcome_Accept(), (None, b"3")))
        self.assertEqual((h.conflict, h.state.get(b"k")), (b"k", b"2"))

    def test_a_concurrent_change_makes_the_commit_conflict_and_leaves_nothing(self):
        h = acemq_testing.FakeHost()
        h.state.seed(b"k", b"1")

        def steps():
            value, version = state.get_versioned(b"k")
            state.set_if_version(b"k", value + b"1", version, 60_000)
            state.set(b"other", b"x", None)
            host.publish(wtypes.Outgoing(
                exchange="x", routing_key="r", body=b"", content_type=None, headers=[],
                envelope=wtypes.EnvelopeFields(None, None, None, None, None),
                persistent=True, mandatory=None, deliver_at_ms=None))

        h.concurrently(lambda ns: ns.seed(b"k", b"changed"))
        self.assertEqual(run(h, steps)[0], wtypes.Outcome_Accept())
        self.assertEqual((h.committed, h.conflict), (False, b"k"))
        # Nothing of the call, not even its last-writer-wins set.
        self.assertEqual(h.state.items(), {b"k": b"changed"})
        self.assertEqual(len(h.published), 1, "kept for the test; the host publishes none")

    def test_reruns_run_the_call_again_on_fresh_state(self):
        h = acemq_testing.FakeHost()
        h.state.seed(b"k", b"a")
        h.concurrently(lambda ns: ns.seed(b"k", b"b"))
        published = []

        def steps():
            value, version = state.get_versioned(b"k")
            state.set_if_version(b"k", value + b"!", version, None)
            published.append(value)
            host.publish(wtypes.Outgoing(
                exchange="x", routing_key="r", body=value, content_type=None, headers=[],
                envelope=wtypes.EnvelopeFields(None, None, None, None, None),
                persistent=True, mandatory=None, deliver_at_ms=None))

        run(h, steps, reruns=5)
        self.assertEqual((h.runs, h.committed, h.state.get(b"k")), (2, True, b"b!"))
        self.assertEqual(published, [b"a", b"b"])
        # The conflicted run's output is dropped.
        self.assertEqual([o.body for o in h.published], [b"b"])

    def test_the_first_check_of_a_key_is_kept(self):
        h = acemq_testing.FakeHost()
        v = h.state.seed(b"k", b"1")

        def steps():
            state.set_if_version(b"k", b"2", v, None)
            # Checked against what the call read first, not this.
            state.set_if_version(b"k", b"3", 12345, None)

        run(h, steps)
        self.assertEqual((h.conflict, h.state.get(b"k")), (None, b"3"))
        self.assertEqual(h.last_call.checks, {b"k": v})

    def test_a_plain_set_or_delete_never_conflicts(self):
        h = acemq_testing.FakeHost()
        h.state.seed(b"k", b"1")
        h.concurrently(lambda ns: ns.seed(b"k", b"2"))
        run(h, lambda: (state.get_versioned(b"k"), state.set(b"k", b"mine", None)))
        self.assertEqual((h.conflict, h.state.get(b"k")), (None, b"mine"))
        h.concurrently(lambda ns: ns.seed(b"k", b"3"))
        run(h, lambda: state.delete(b"k"))
        self.assertEqual(h.state.items(), {})


class StateLimitsTest(unittest.TestCase):
    def test_keys_are_1_to_1024_bytes(self):
        h = acemq_testing.FakeHost()
        reasons = run(h, lambda: [raised(state.get, b""), raised(state.set, b"k" * 1025, b"", None),
                                  state.set(b"k" * 1024, b"v", None)])[1]
        self.assertEqual(reasons, ["a state key must not be empty",
                                   "a state key is at most 1024 bytes; this one is 1025", None])
        self.assertEqual(h.state.keys(), [b"k" * 1024])

    def test_values_are_at_most_1_mib(self):
        h = acemq_testing.FakeHost()
        mib = acemq_testing.STATE_MAX_VALUE_BYTES
        self.assertEqual(mib, 1 << 20)
        reasons = run(h, lambda: [raised(state.set, b"k", b"x" * (mib + 1), None),
                                  raised(state.set_if_version, b"k", b"x" * (mib + 1), 0, None),
                                  state.set(b"k", b"x" * mib, None)])[1]
        self.assertEqual(reasons[:2], ["a state value is at most 1048576 bytes; "
                                       "this one is 1048577"] * 2)
        self.assertEqual(len(h.state.get(b"k")), mib)

    def test_a_call_makes_at_most_1000_writes(self):
        h = acemq_testing.FakeHost()

        def steps():
            for i in range(999):
                state.set(b"k%d" % i, b"", None)
            state.delete(b"k0")
            return [raised(f, *args) for f, *args in (
                (state.set, b"one-more", b"", None), (state.delete, b"k1"),
                (state.increment, b"n", 1, None), (state.set_if_version, b"k", b"", 0, None))]

        reasons = run(h, steps)[1]
        self.assertEqual(set(reasons), {"a call makes at most 1000 state writes; "
                                        "this would be write 1001"})
        self.assertEqual(len(h.state.keys()), 998)
        # Reads are not writes; the next call has its own 1000.
        run(h, lambda: [state.get(b"k1") for _ in range(2000)] and state.set(b"k", b"", None))
        self.assertTrue(h.committed)


class SharedNamespaceTest(unittest.TestCase):
    def test_two_consumers_naming_one_namespace_share_it(self):
        a = acemq_testing.FakeHost(now_ms=5)
        b = acemq_testing.FakeHost(now_ms=5, state=a.state)
        run(a, lambda: state.increment(b"n", 1, None))
        self.assertEqual(run(b, lambda: state.increment(b"n", 1, None))[1], 2)
        self.assertEqual(a.state.items(), {b"n": b"2"})

    def test_helpers_take_text_and_show_keys_as_the_host_does(self):
        ns = acemq_testing.FakeNamespace()
        ns.seed("customer/acme", "[1]")
        self.assertEqual(ns.get(b"customer/acme"), b"[1]")
        ns.remove("customer/acme")
        self.assertEqual(ns.items(), {})
        self.assertEqual(acemq_testing.show_key(b"customer/acme"), 'the key "customer/acme"')
        self.assertEqual(acemq_testing.show_key('a"\n\u00e9'.encode()), 'the key "a\\"\\né"')
        self.assertEqual(acemq_testing.show_key(b"\xff\x00"), "the key 0xff00")


if __name__ == "__main__":
    unittest.main()
