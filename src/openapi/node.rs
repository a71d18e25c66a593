//! A document as it was written: YAML or JSON read into a tree that keeps the order of every
//! mapping, so that a document merged with the gateway's contract reads like the one given
//! (the crate's `serde_json::Value` sorts keys: its `preserve_order` would change how request
//! bodies are fingerprinted, which must never change).

use indexmap::IndexMap;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// One value of a document.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    String(String),
    Array(Vec<Node>),
    Object(IndexMap<String, Node>),
}

impl Node {
    /// An empty mapping.
    pub fn object() -> Self {
        Node::Object(IndexMap::new())
    }

    /// The member `key` of a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Object(map) => map.get(key),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Node::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// A whole non-negative number.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Node::Int(n) => u64::try_from(*n).ok(),
            Node::Float(f) if f.fract() == 0.0 && *f >= 0.0 && *f < 1e18 => Some(*f as u64),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Node]> {
        match self {
            Node::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&IndexMap<String, Node>> {
        match self {
            Node::Object(map) => Some(map),
            _ => None,
        }
    }

    pub fn as_object_mut(&mut self) -> Option<&mut IndexMap<String, Node>> {
        match self {
            Node::Object(map) => Some(map),
            _ => None,
        }
    }

    /// What kind of value this is, for an error message.
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Int(_) | Node::Float(_) => "a number",
            Node::String(_) => "a string",
            Node::Array(_) => "a list",
            Node::Object(_) => "a mapping",
        }
    }
}

impl From<&str> for Node {
    fn from(s: &str) -> Self {
        Node::String(s.to_owned())
    }
}

impl From<String> for Node {
    fn from(s: String) -> Self {
        Node::String(s)
    }
}

impl From<bool> for Node {
    fn from(b: bool) -> Self {
        Node::Bool(b)
    }
}

impl From<u64> for Node {
    fn from(n: u64) -> Self {
        i64::try_from(n).map_or(Node::Float(n as f64), Node::Int)
    }
}

/// Builds a mapping from `(key, value)` pairs, in their order.
pub fn object<const N: usize>(members: [(&str, Node); N]) -> Node {
    Node::Object(members.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a YAML or JSON value")
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Node, E> {
        Ok(Node::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Node, E> {
        Ok(Node::Int(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Node, E> {
        Ok(Node::from(n))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Node, E> {
        Ok(Node::Float(f))
    }
    fn visit_str<E>(self, s: &str) -> Result<Node, E> {
        Ok(Node::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Node, E> {
        Ok(Node::String(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut members = IndexMap::new();
        while let Some(Key(key)) = map.next_key()? {
            // The crate's serde_json keeps numbers as written (`arbitrary_precision`) and hands
            // a number that is not an integer to a visitor as this one-member map.
            if members.is_empty() && key == NUMBER_TOKEN {
                let text: String = map.next_value()?;
                return text
                    .parse::<f64>()
                    .map(Node::Float)
                    .map_err(|_| de::Error::custom(format!("{text:?} is not a number")));
            }
            let value = map.next_value()?;
            // A key written twice: YAML and JSON leave it undefined; refused, not guessed.
            if members.insert(key.clone(), value).is_some() {
                return Err(de::Error::custom(format!("the key {key:?} appears twice in one mapping")));
            }
        }
        Ok(Node::Object(members))
    }
}

/// The key under which serde_json with `arbitrary_precision` passes a number as a map.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// A mapping's key: YAML writes response codes as numbers (`200:`), OpenAPI reads them as text.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string, number or boolean as a mapping's key")
            }
            fn visit_str<E>(self, s: &str) -> Result<Key, E> {
                Ok(Key(s.to_owned()))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Key, E> {
                Ok(Key(n.to_string()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Key, E> {
                Ok(Key(n.to_string()))
            }
            fn visit_f64<E>(self, f: f64) -> Result<Key, E> {
                Ok(Key(f.to_string()))
            }
            fn visit_bool<E>(self, b: bool) -> Result<Key, E> {
                Ok(Key(b.to_string()))
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Null => serializer.serialize_unit(),
            Node::Bool(b) => serializer.serialize_bool(*b),
            Node::Int(n) => serializer.serialize_i64(*n),
            Node::Float(f) => serializer.serialize_f64(*f),
            Node::String(s) => serializer.serialize_str(s),
            Node::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Object(members) => {
                let mut map = serializer.serialize_map(Some(members.len()))?;
                for (k, v) in members {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_from_json_stay_numbers() {
        let node: Node = serde_json::from_str(r#"{"a": 1.5, "b": -2, "c": 18446744073709551615, "d": 1e3}"#).unwrap();
        assert_eq!(node.get("a"), Some(&Node::Float(1.5)));
        assert_eq!(node.get("b"), Some(&Node::Int(-2)));
        assert_eq!(node.get("c"), Some(&Node::Float(18446744073709551615.0)));
        assert_eq!(serde_json::to_string(&node).unwrap(), r#"{"a":1.5,"b":-2,"c":1.8446744073709552e+19,"d":1000.0}"#);
        let yaml: Node = serde_saphyr::from_str("a: 1.5\n200: x\n").unwrap();
        assert_eq!(yaml.get("a"), Some(&Node::Float(1.5)));
        assert!(yaml.get("200").is_some(), "a numeric key is read as text");
    }
}
