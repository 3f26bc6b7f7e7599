//! `Vec<u8>` fields as serde byte strings (`#[serde(with = "flashrt::byte_string")]`): a length
//! and the bytes, copied in one piece instead of visited element by element. postcard (the
//! observation log) and CDR (ROS 2 messages, where it is the wire format of `uint8[]`) both
//! write a byte string as they write a sequence of `u8`, and read it back checked against the
//! bytes left.

use serde::de::{Deserializer, Error, Visitor};
use serde::ser::Serializer;

pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(bytes)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    d.deserialize_byte_buf(ByteString)
}

struct ByteString;

impl<'de> Visitor<'de> for ByteString {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }
}
