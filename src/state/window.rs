//! Windows of event time: which window a record's time falls in, and when the window closes.
//!
//! A window of whole days is a run of *local* calendar days in a time zone (the seed's `dt`:
//! "a day" is a day where the users are), so it can be 23 or 25 hours long when the clocks
//! change; its start is the first instant of its first day there. Any other size is a fixed
//! length of time, aligned to the Unix epoch. A window closes `grace` after its end: records
//! for it after that are late.

use std::time::Duration;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

const DAY_MS: i64 = 86_400_000;

/// How long a window is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// This many local calendar days.
    Days(u32),
    /// This long (not a whole number of days).
    Fixed(Duration),
}

impl Size {
    /// A size of `d`: days when it is a whole number of them.
    pub fn of(d: Duration) -> Result<Size, String> {
        let ms = d.as_millis();
        if ms == 0 {
            return Err("must be longer than 0".into());
        }
        if ms.is_multiple_of(DAY_MS as u128) {
            let days = u32::try_from(ms / DAY_MS as u128).map_err(|_| "too long".to_string())?;
            return Ok(Size::Days(days));
        }
        Ok(Size::Fixed(d))
    }
}

/// One window: `[start, end)` in milliseconds since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    /// Its first millisecond.
    pub start: i64,
    /// The first millisecond after it.
    pub end: i64,
}

/// The windows records fall in.
#[derive(Clone, Debug)]
pub struct Windows {
    size: Size,
    tz: TimeZone,
    grace: i64,
}

impl Windows {
    /// Windows of `size` in `tz`, closing `grace` after their end.
    pub fn new(size: Size, tz: TimeZone, grace: Duration) -> Windows {
        let grace = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        Windows { size, tz, grace }
    }

    /// The window of event time `t` (ms since the epoch), if `t` is a time jiff can represent
    /// (years -9999 to 9999).
    pub fn of(&self, t: i64) -> Option<Window> {
        match self.size {
            Size::Fixed(d) => {
                let len = i64::try_from(d.as_millis()).ok()?;
                let start = t.div_euclid(len).checked_mul(len)?;
                Some(Window {
                    start,
                    end: start.checked_add(len)?,
                })
            }
            Size::Days(n) => {
                let local = Timestamp::from_millisecond(t)
                    .ok()?
                    .to_zoned(self.tz.clone());
                let day = day_number(local.date())?;
                let first = day.div_euclid(i64::from(n)) * i64::from(n);
                Some(Window {
                    start: self.start_of(first)?,
                    end: self.start_of(first + i64::from(n))?,
                })
            }
        }
    }

    /// The start of the first window still open at stream time `now`: every window that
    /// starts before it is closed (the one holding `now - grace` ends after it).
    pub fn first_open(&self, now: i64) -> Option<i64> {
        Some(self.of(now.saturating_sub(self.grace))?.start)
    }

    /// When `w` closes: later records for it are late.
    pub fn closes(&self, w: &Window) -> i64 {
        w.end.saturating_add(self.grace)
    }

    /// How `w` is named in outputs (`$window`) and in the store: its first day (`2026-12-02`)
    /// for windows of days, else its start in RFC 3339, in the time zone.
    pub fn label(&self, w: &Window) -> String {
        let Ok(start) = Timestamp::from_millisecond(w.start) else {
            return w.start.to_string();
        };
        let local: Zoned = start.to_zoned(self.tz.clone());
        match self.size {
            Size::Days(_) => local.date().to_string(),
            Size::Fixed(_) => local
                .timestamp()
                .display_with_offset(local.offset())
                .to_string(),
        }
    }

    /// The first millisecond of local day number `day` (days since 1970-01-01).
    fn start_of(&self, day: i64) -> Option<i64> {
        let date = Timestamp::from_second(day.checked_mul(86_400)?)
            .ok()?
            .to_zoned(TimeZone::UTC)
            .date();
        // Midnight, or the first instant after it where a clock change skips it.
        let zoned = date.to_zoned(self.tz.clone()).ok()?;
        Some(zoned.timestamp().as_millisecond())
    }
}

/// Days since 1970-01-01 of a calendar date.
fn day_number(date: Date) -> Option<i64> {
    let utc = date.to_zoned(TimeZone::UTC).ok()?;
    Some(utc.timestamp().as_second().div_euclid(86_400))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn days(n: u32, tz: &str) -> Windows {
        Windows::new(Size::Days(n), TimeZone::get(tz).unwrap(), Duration::ZERO)
    }

    #[test]
    fn a_day_is_a_local_day() {
        let w = days(1, "Asia/Shanghai");
        // 23:30 UTC on 1 December is 07:30 on 2 December in Shanghai.
        let win = w.of(ms("2026-12-01T23:30:00Z")).unwrap();
        assert_eq!(w.label(&win), "2026-12-02");
        assert_eq!(win.start, ms("2026-12-01T16:00:00Z"));
        assert_eq!(win.end, ms("2026-12-02T16:00:00Z"));
        // The same instant is still 1 December in UTC.
        let utc = days(1, "UTC");
        assert_eq!(
            utc.label(&utc.of(ms("2026-12-01T23:30:00Z")).unwrap()),
            "2026-12-01"
        );
        // The last millisecond of a window is in it, its end is not.
        assert_eq!(w.of(win.end - 1), Some(win));
        assert_ne!(w.of(win.end), Some(win));
    }

    #[test]
    fn a_day_with_a_clock_change_is_23_or_25_hours_long() {
        let w = days(1, "Europe/Berlin");
        let spring = w.of(ms("2026-03-29T12:00:00Z")).unwrap();
        assert_eq!(spring.end - spring.start, 23 * 3_600_000);
        let autumn = w.of(ms("2026-10-25T12:00:00Z")).unwrap();
        assert_eq!(autumn.end - autumn.start, 25 * 3_600_000);
        // Where midnight itself is skipped (Santiago, 2026-09-06), the day starts at 01:00.
        let chile = days(1, "America/Santiago");
        let skipped = chile.of(ms("2026-09-06T12:00:00Z")).unwrap();
        assert_eq!(skipped.start, ms("2026-09-06T04:00:00Z"));
    }

    #[test]
    fn windows_of_several_days_and_fixed_sizes_tile_time() {
        let w = days(7, "UTC");
        let a = w.of(ms("2026-12-02T00:00:00Z")).unwrap();
        assert_eq!(a.end - a.start, 7 * DAY_MS);
        assert!(a.start <= ms("2026-12-02T00:00:00Z"));
        assert_eq!(
            w.of(a.end),
            Some(Window {
                start: a.end,
                end: a.end + 7 * DAY_MS
            })
        );
        let h = Windows::new(
            Size::of(Duration::from_secs(3600)).unwrap(),
            TimeZone::UTC,
            Duration::from_secs(60),
        );
        let win = h.of(ms("2026-12-02T10:59:59.999Z")).unwrap();
        assert_eq!(win.start, ms("2026-12-02T10:00:00Z"));
        assert_eq!(h.closes(&win), ms("2026-12-02T11:01:00Z"));
        assert_eq!(h.label(&win), "2026-12-02T10:00:00+00:00");
        // Before the epoch too.
        assert_eq!(h.of(-1).unwrap().start, -3_600_000);
    }

    #[test]
    fn sizes_are_days_when_they_can_be() {
        assert_eq!(Size::of(Duration::from_secs(86_400)), Ok(Size::Days(1)));
        assert_eq!(Size::of(Duration::from_secs(2 * 86_400)), Ok(Size::Days(2)));
        assert_eq!(
            Size::of(Duration::from_secs(90)),
            Ok(Size::Fixed(Duration::from_secs(90)))
        );
        assert!(Size::of(Duration::ZERO).is_err());
    }

    #[test]
    fn times_out_of_range_have_no_window() {
        assert_eq!(days(1, "UTC").of(i64::MAX), None);
        assert_eq!(days(1, "UTC").of(i64::MIN), None);
    }
}
