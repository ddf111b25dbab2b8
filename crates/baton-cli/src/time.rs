//! Times for people: a date in UTC with how long ago (or how soon) it is,
//! and durations as `humantime` writes them.

use std::time::{Duration, UNIX_EPOCH};

use baton::run::{Clock, SystemClock, Timestamp};

/// `2026-12-03 08:14:02 UTC, 3m ago` (or `in 25s` for a time to come),
/// against the system clock.
pub fn when(at: Timestamp) -> String {
    when_at(at, SystemClock.now())
}

/// [`when`] against a given `now`.
pub fn when_at(at: Timestamp, now: Timestamp) -> String {
    let relative = if at.millis() <= now.millis() {
        let ago = Duration::from_millis(now.millis() - at.millis());
        if ago < Duration::from_secs(1) {
            "just now".to_owned()
        } else {
            format!("{} ago", rounded(ago))
        }
    } else {
        format!(
            "in {}",
            rounded(Duration::from_millis(at.millis() - now.millis()))
        )
    };
    format!("{}, {relative}", date(at))
}

/// `2026-12-03 08:14:02 UTC`.
pub fn date(at: Timestamp) -> String {
    let system = UNIX_EPOCH + Duration::from_millis(at.millis());
    // RFC 3339 (`2026-12-03T08:14:02Z`), read as a date and a time of day.
    let text = humantime::format_rfc3339_seconds(system).to_string();
    format!("{} UTC", text.replace('T', " ").trim_end_matches('Z'))
}

/// RFC 3339 in UTC, for JSON: `2026-12-03T08:14:02.120Z`.
pub fn rfc3339(at: Timestamp) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at.millis())).to_string()
}

/// A duration as given on the command line: `10s`, `2m 30s`, `500ms`.
pub fn duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// A duration in its largest whole unit: `3m`, `2h`, `5d`, `12s`.
fn rounded(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3_600 => format!("{}m", seconds / 60),
        3_600..86_400 => format!("{}h", seconds / 3_600),
        _ => format!("{}d", seconds / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_read_as_utc_with_how_long_ago() {
        let at = Timestamp(1_796_285_642_000); // 2026-12-03 08:14:02 UTC
        assert_eq!(date(at), "2026-12-03 08:14:02 UTC");
        assert_eq!(
            when_at(at, Timestamp(at.millis() + 180_500)),
            "2026-12-03 08:14:02 UTC, 3m ago"
        );
        assert_eq!(
            when_at(at, Timestamp(at.millis() - 25_000)),
            "2026-12-03 08:14:02 UTC, in 25s"
        );
        assert_eq!(when_at(at, at), "2026-12-03 08:14:02 UTC, just now");
        assert_eq!(
            when_at(at, Timestamp(at.millis() + 3 * 86_400_000)),
            "2026-12-03 08:14:02 UTC, 3d ago"
        );
        assert_eq!(rfc3339(at), "2026-12-03T08:14:02.000Z");
    }

    #[test]
    fn durations_read_as_they_are_written() {
        assert_eq!(duration(Duration::from_secs(150)), "2m 30s");
        assert_eq!(duration(Duration::from_millis(500)), "500ms");
    }
}
