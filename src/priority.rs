//! The seven priorities, `lowest` = -3 … `highest` = 3.
//!
//! Stats index a priority as `value + 3`. Parsing accepts the names
//! (case-insensitive) and the integers -3..=3; anything else is an error
//! that names the value.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// A scheduling priority. Higher runs first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(i8)]
pub enum Priority {
    /// -3
    Lowest = -3,
    /// -2
    Lower = -2,
    /// -1
    Low = -1,
    /// 0, the default.
    #[default]
    Normal = 0,
    /// 1
    High = 1,
    /// 2
    Higher = 2,
    /// 3
    Highest = 3,
}

/// Number of priority levels.
pub const LEVELS: usize = 7;

impl Priority {
    /// All priorities, lowest first (so `ALL[p.index()] == p`).
    pub const ALL: [Priority; LEVELS] = [
        Priority::Lowest,
        Priority::Lower,
        Priority::Low,
        Priority::Normal,
        Priority::High,
        Priority::Higher,
        Priority::Highest,
    ];

    /// The integer value, -3..=3.
    pub const fn value(self) -> i8 {
        self as i8
    }

    /// The stats index, `value + 3`, 0..=6.
    pub const fn index(self) -> usize {
        (self as i8 + 3) as usize
    }

    /// The priority at stats index `i` (0..=6), or `None`.
    pub fn from_index(i: usize) -> Option<Priority> {
        Priority::ALL.get(i).copied()
    }

    /// The priority with integer value `v` (-3..=3).
    pub fn from_value(v: i64) -> Result<Priority, Error> {
        if (-3..=3).contains(&v) {
            Ok(Priority::ALL[(v + 3) as usize])
        } else {
            Err(Error::InvalidArgument(format!(
                "priority {v} is out of range: expected -3..=3 or a name (lowest, lower, low, normal, high, higher, highest)"
            )))
        }
    }

    /// The lowercase name, as the seed spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Priority::Lowest => "lowest",
            Priority::Lower => "lower",
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Higher => "higher",
            Priority::Highest => "highest",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Priority {
    type Err = Error;

    fn from_str(s: &str) -> Result<Priority, Error> {
        let t = s.trim();
        for p in Priority::ALL {
            if t.eq_ignore_ascii_case(p.name()) {
                return Ok(p);
            }
        }
        match t.parse::<i64>() {
            Ok(v) => Priority::from_value(v),
            Err(_) => Err(Error::InvalidArgument(format!(
                "priority {s:?} is not a priority: expected lowest, lower, low, normal, high, higher, highest or -3..=3"
            ))),
        }
    }
}

/// Parses a priority from a name (case-insensitive) or an integer -3..=3.
pub fn parse_priority(s: &str) -> Result<Priority, Error> {
    s.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_round_trip() {
        for p in Priority::ALL {
            assert_eq!(p.name().parse::<Priority>().unwrap(), p);
            assert_eq!(p.name().to_uppercase().parse::<Priority>().unwrap(), p);
            assert_eq!(p.value().to_string().parse::<Priority>().unwrap(), p);
            assert_eq!(Priority::from_index(p.index()), Some(p));
        }
        assert_eq!(Priority::Lowest.index(), 0);
        assert_eq!(Priority::Highest.index(), 6);
    }

    #[test]
    fn bad_values_name_the_value() {
        let e = "4".parse::<Priority>().unwrap_err().to_string();
        assert!(e.contains('4') && e.contains("-3..=3"), "{e}");
        let e = "urgent".parse::<Priority>().unwrap_err().to_string();
        assert!(e.contains("urgent"), "{e}");
        assert!("".parse::<Priority>().is_err());
        assert!("-4".parse::<Priority>().is_err());
    }
}
