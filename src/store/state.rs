//! The one vocabulary for the state of a record: each state's letter (as Redis and the Lua
//! scripts hold it) and its name (as the admin API, the CLI and the logs say it), written
//! once. The states and every transition are drawn in docs/architecture.md.

use std::fmt;

/// The state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// A claim is open: its request may be running upstream.
    InProgress,
    /// The answer is stored and replayed to every retry.
    Completed,
    /// The request ran and answered, but its body was too large to keep: retries get the
    /// status and headers as `response-not-stored`.
    Executed,
    /// The request was sent and nobody knows whether the upstream acted on it.
    Unknown,
    /// A tombstone keeping the attempt count: the next request runs.
    Released,
}

impl State {
    /// Every state, in the order of a key's life.
    pub const ALL: [State; 5] = [Self::InProgress, Self::Completed, Self::Executed, Self::Unknown, Self::Released];

    /// The states that need an operator, each kept in an index (see `index`).
    pub const HELD: [State; 2] = [Self::Unknown, Self::Executed];

    /// The byte the record starts with in Redis (see `redis/layout.rs`): byte-compatible with
    /// every earlier version, so never changed.
    pub fn letter(self) -> u8 {
        match self {
            Self::InProgress => b'p',
            Self::Completed => b'c',
            Self::Executed => b'x',
            Self::Unknown => b'u',
            Self::Released => b'r',
        }
    }

    /// The state whose letter is `letter`.
    pub fn from_letter(letter: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.letter() == letter)
    }

    /// The name the admin API, the CLI and the logs use.
    pub fn name(self) -> &'static str {
        match self {
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Executed => "executed",
            Self::Unknown => "unknown",
            Self::Released => "released",
        }
    }

    /// The state named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.name() == name)
    }

    /// Whether a record in this state needs an operator (and so is in the index).
    pub fn is_held(self) -> bool {
        Self::HELD.contains(&self)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for State {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for State {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::parse(&name).ok_or_else(|| serde::de::Error::custom(format!("no state is called {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Letters and names are what Redis and the admin API hold: pinned, each once.
    #[test]
    fn letters_and_names_are_pinned_and_read_back() {
        let pinned = [
            (State::InProgress, b'p', "in_progress"),
            (State::Completed, b'c', "completed"),
            (State::Executed, b'x', "executed"),
            (State::Unknown, b'u', "unknown"),
            (State::Released, b'r', "released"),
        ];
        for (state, letter, name) in pinned {
            assert_eq!((state.letter(), state.name()), (letter, name));
            assert_eq!(State::from_letter(letter), Some(state));
            assert_eq!(State::parse(name), Some(state));
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(serde_json::from_str::<State>(&json).unwrap(), state);
        }
        assert_eq!(State::from_letter(b'r' + 1), None);
        assert_eq!(State::parse("absent"), None);
        assert_eq!(State::ALL.iter().filter(|s| s.is_held()).count(), 2);
    }
}
