//! `log`: every line is recorded, in order, for the test to read
//! ([`Handled::logs`](super::Handled::logs)); none is bounded or dropped.

use super::with_state;
use crate::log::Level;

pub(crate) fn log(level: Level, text: &str) {
    with_state(|s| s.logs.push((level, text.to_owned())));
}
