//! Alertmanager's time intervals: named sets of times (`times`, `weekdays`, `days_of_month`, `months`,
//! `years`, in a `location`), which a route names as `mute_time_intervals` (no notifications while any of
//! them holds) or `active_time_intervals` (notifications only while one holds). Parsed and judged as
//! Alertmanager does: a time range is `[start, end)` in minutes of the day (`24:00` ends it), the other
//! ranges are inclusive, weekdays run from Sunday (0), negative days of the month count from its end.

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// A named set of time intervals, as the routing file's `time_intervals` (or the older
/// `mute_time_intervals`) lists them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Named {
    /// What routes call it.
    pub name: String,
    /// It holds while any of these does.
    pub time_intervals: Vec<Spec>,
}

/// One time interval as written: every field given must hold (an absent one always does).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Times of the day, `{start_time: "09:00", end_time: "17:00"}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub times: Vec<TimeRange>,
    /// `monday:friday`, `saturday`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weekdays: Vec<String>,
    /// `1:5`, `-3:-1` (the last three days).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub days_of_month: Vec<String>,
    /// `january:march`, `12`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub months: Vec<String>,
    /// `2026:2027`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub years: Vec<String>,
    /// An IANA time zone (`Europe/Berlin`); UTC when absent.
    #[serde(default, alias = "time_zone", skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

/// `start_time` and `end_time`, `HH:MM`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeRange {
    /// Start (included).
    pub start_time: String,
    /// End (excluded); `24:00` is the end of the day.
    pub end_time: String,
}

/// A time interval, checked and ready to judge a time.
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    times: Vec<(u32, u32)>,
    weekdays: Vec<(u32, u32)>,
    days_of_month: Vec<(i32, i32)>,
    months: Vec<(u32, u32)>,
    years: Vec<(i32, i32)>,
    location: Option<chrono_tz::Tz>,
}

const WEEKDAYS: [&str; 7] = [
    "sunday",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
];
const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

fn err(msg: String) -> ConfigError {
    ConfigError(msg)
}

/// `a:b` or `a`, each member through `member`.
fn range<T: Copy>(
    s: &str,
    member: impl Fn(&str) -> Option<T>,
    what: &str,
) -> Result<(T, T), ConfigError> {
    let s = s.trim().to_lowercase();
    let (a, b) = s.split_once(':').unwrap_or((&s, &s));
    let bad = || {
        err(format!(
            "{s:?} is not a valid {what} (or range of them, `a:b`)"
        ))
    };
    Ok((
        member(a.trim()).ok_or_else(bad)?,
        member(b.trim()).ok_or_else(bad)?,
    ))
}

fn minutes(s: &str) -> Result<u32, ConfigError> {
    let bad = || {
        err(format!(
            "couldn't parse timestamp {s}, invalid format (HH:MM, up to 24:00)"
        ))
    };
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if (h == 24 && m == 0) || (h < 24 && m < 60) {
        Ok(h * 60 + m)
    } else {
        Err(bad())
    }
}

impl Spec {
    /// Checks it as Alertmanager does when it loads a configuration.
    pub fn compile(&self) -> Result<Interval, ConfigError> {
        let mut times = Vec::new();
        for t in &self.times {
            let (a, b) = (minutes(&t.start_time)?, minutes(&t.end_time)?);
            if a >= b {
                return Err(err(format!(
                    "start time {} cannot be equal or greater than end time {}",
                    t.start_time, t.end_time
                )));
            }
            times.push((a, b));
        }
        let weekday = |s: &str| WEEKDAYS.iter().position(|w| *w == s).map(|i| i as u32);
        let mut weekdays = Vec::new();
        for w in &self.weekdays {
            let r = range(w, weekday, "weekday")?;
            if r.0 > r.1 {
                return Err(err(format!("{w}: start day cannot be after end day")));
            }
            weekdays.push(r);
        }
        let mut days_of_month = Vec::new();
        for d in &self.days_of_month {
            let r: (i32, i32) = range(d, |x| x.parse().ok(), "day of the month")?;
            for n in [r.0, r.1] {
                if n == 0 || !(-31..=31).contains(&n) {
                    return Err(err(format!(
                        "{n} is not a valid day of the month: out of range"
                    )));
                }
            }
            if r.0 < 0 && r.1 > 0 {
                return Err(err(format!(
                    "{d}: end day must be negative if start day is negative"
                )));
            }
            let at = |n: i32| if n < 0 { 28 + n } else { n };
            if at(r.0) > at(r.1) {
                return Err(err(format!(
                    "end day {} is always before start day {}",
                    r.1, r.0
                )));
            }
            days_of_month.push(r);
        }
        let month = |s: &str| {
            MONTHS
                .iter()
                .position(|m| *m == s)
                .map(|i| i as u32 + 1)
                .or_else(|| s.parse().ok().filter(|n| (1..=12).contains(n)))
        };
        let mut months = Vec::new();
        for m in &self.months {
            let r = range(m, month, "month")?;
            if r.0 > r.1 {
                return Err(err(format!("{m}: end month is before start month")));
            }
            months.push(r);
        }
        let mut years = Vec::new();
        for y in &self.years {
            let r: (i32, i32) = range(y, |x| x.parse().ok().filter(|n: &i32| *n > 0), "year")?;
            if r.0 > r.1 {
                return Err(err(format!(
                    "end year {} is before start year {}",
                    r.1, r.0
                )));
            }
            years.push(r);
        }
        let location = match &self.location {
            None => None,
            Some(l) if l == "UTC" || l == "Local" => None,
            Some(l) => Some(
                l.parse::<chrono_tz::Tz>()
                    .map_err(|e| err(format!("location {l:?}: {e}")))?,
            ),
        };
        Ok(Interval {
            times,
            weekdays,
            days_of_month,
            months,
            years,
            location,
        })
    }
}

fn days_in_month(year: i32, month: u32) -> i32 {
    let (ny, nm) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    chrono::NaiveDate::from_ymd_opt(ny, nm, 1)
        .and_then(|d| d.pred_opt())
        .map_or(31, |d| d.day() as i32)
}

impl Interval {
    /// Whether `t` is in it.
    pub fn contains(&self, t: DateTime<Utc>) -> bool {
        match self.location {
            Some(tz) => self.contains_local(&t.with_timezone(&tz)),
            None => self.contains_local(&t),
        }
    }

    fn contains_local<T: Datelike + Timelike>(&self, t: &T) -> bool {
        let minute = t.hour() * 60 + t.minute();
        if !self.times.is_empty() && !self.times.iter().any(|(a, b)| (*a..*b).contains(&minute)) {
            return false;
        }
        if !self.days_of_month.is_empty() {
            let n = days_in_month(t.year(), t.month());
            let day = t.day() as i32;
            let hit = self.days_of_month.iter().any(|(a, b)| {
                let a = if *a < 0 { n + a + 1 } else { *a };
                let b = if *b < 0 { n + b + 1 } else { *b };
                // a start beyond this month's end does not hold; the end is clamped to it
                a <= n && day >= a && day <= b.min(n)
            });
            if !hit {
                return false;
            }
        }
        if !self.months.is_empty()
            && !self
                .months
                .iter()
                .any(|(a, b)| (*a..=*b).contains(&t.month()))
        {
            return false;
        }
        let weekday = t.weekday().num_days_from_sunday();
        if !self.weekdays.is_empty()
            && !self
                .weekdays
                .iter()
                .any(|(a, b)| (*a..=*b).contains(&weekday))
        {
            return false;
        }
        if !self.years.is_empty()
            && !self
                .years
                .iter()
                .any(|(a, b)| (*a..=*b).contains(&t.year()))
        {
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn compile(yaml: &str) -> Result<Interval, ConfigError> {
        serde_yaml::from_str::<Spec>(yaml).unwrap().compile()
    }

    #[test]
    fn business_hours_in_a_time_zone() {
        let i = compile(
            "{times: [{start_time: '09:00', end_time: '17:00'}], weekdays: ['monday:friday'], location: Europe/Berlin}",
        )
        .unwrap();
        // Thursday 2026-12-03, 08:30 UTC is 09:30 in Berlin (CET, +1)
        assert!(i.contains(at("2026-12-03T08:30:00Z")));
        assert!(!i.contains(at("2026-12-03T07:59:00Z")), "08:59 in Berlin");
        assert!(!i.contains(at("2026-12-03T16:00:00Z")), "17:00 is excluded");
        assert!(!i.contains(at("2026-12-05T10:00:00Z")), "a Saturday");
        // in summer Berlin is +2
        assert!(i.contains(at("2026-07-01T07:00:00Z")));
    }

    #[test]
    fn days_of_month_count_from_the_end_and_ranges_are_inclusive() {
        let last_two =
            compile("{days_of_month: ['-2:-1'], months: ['february'], years: ['2028']}").unwrap();
        // 2028 is a leap year: the 28th and 29th
        assert!(last_two.contains(at("2028-02-28T12:00:00Z")));
        assert!(last_two.contains(at("2028-02-29T12:00:00Z")));
        assert!(!last_two.contains(at("2028-02-27T12:00:00Z")));
        assert!(
            !last_two.contains(at("2027-02-28T12:00:00Z")),
            "another year"
        );
        let late = compile("{days_of_month: ['30:31']}").unwrap();
        assert!(
            !late.contains(at("2026-02-28T00:00:00Z")),
            "February has no 30th"
        );
        assert!(late.contains(at("2026-01-31T23:59:00Z")));
        let night = compile("{times: [{start_time: '22:00', end_time: '24:00'}]}").unwrap();
        assert!(night.contains(at("2026-01-31T23:59:00Z")));
        assert!(!night.contains(at("2026-02-01T00:00:00Z")));
    }

    #[test]
    fn mistakes_are_named_as_alertmanager_names_them() {
        for (yaml, want) in [
            (
                "{times: [{start_time: '17:00', end_time: '09:00'}]}",
                "cannot be equal or greater",
            ),
            (
                "{times: [{start_time: '9:00', end_time: '10:00'}]}",
                "invalid format",
            ),
            (
                "{weekdays: ['friday:monday']}",
                "start day cannot be after end day",
            ),
            ("{weekdays: ['funday']}", "not a valid weekday"),
            ("{days_of_month: ['0']}", "out of range"),
            ("{days_of_month: ['-3:2']}", "must be negative"),
            ("{months: ['march:january']}", "before start month"),
            ("{location: Mars/Olympus}", "location"),
        ] {
            let e = compile(yaml).unwrap_err().to_string();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }
}
