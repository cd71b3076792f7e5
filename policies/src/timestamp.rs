//! Timestamps for `since` / `until` and the injected clock.
//!
//! Invariants: a [`Timestamp`] is whole seconds since the Unix epoch (UTC);
//! nothing in this crate reads the system clock, so every decision is a
//! function of the timestamp passed in. Text forms are a date
//! (`2026-09-15`, meaning midnight UTC) or an RFC 3339 date-time.

use std::fmt;

use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{Date, OffsetDateTime};

/// Seconds since the Unix epoch, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

/// A text that is neither a date nor an RFC 3339 date-time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("reading timestamp {text:?}: expected a date like 2026-09-15 or an RFC 3339 date-time")]
pub struct TimestampError {
    /// The text that was given.
    pub text: String,
}

impl Timestamp {
    /// Parses `YYYY-MM-DD` (midnight UTC) or an RFC 3339 date-time.
    pub fn parse(text: &str) -> Result<Self, TimestampError> {
        let err = || TimestampError {
            text: text.to_owned(),
        };
        if let Ok(dt) = OffsetDateTime::parse(text, &Rfc3339) {
            return Ok(Self(dt.unix_timestamp()));
        }
        let date =
            Date::parse(text, format_description!("[year]-[month]-[day]")).map_err(|_| err())?;
        Ok(Self(date.midnight().assume_utc().unix_timestamp()))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match OffsetDateTime::from_unix_timestamp(self.0)
            .ok()
            .and_then(|dt| dt.format(&Rfc3339).ok())
        {
            Some(s) => f.write_str(&s),
            None => write!(f, "@{}", self.0),
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Timestamp::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn date_is_midnight_utc_and_round_trips() {
        let t = Timestamp::parse("2026-09-15").unwrap();
        let u = Timestamp::parse("2026-09-15T00:00:00Z").unwrap();
        assert_eq!(t, u);
        assert_eq!(Timestamp::parse(&t.to_string()).unwrap(), t);
        assert_eq!(Timestamp::parse("2026-09-16").unwrap().0 - t.0, 86_400);
    }

    #[test]
    fn garbage_is_refused() {
        assert!(Timestamp::parse("yesterday").is_err());
        assert!(Timestamp::parse("2026-13-01").is_err());
    }
}
