//! msgpack with numpy arrays, as `openpi_client.msgpack_numpy` writes and reads them: an array is
//! the map `{b"__ndarray__": True, b"data": <bytes>, b"dtype": "<f4", b"shape": [..]}` and a numpy
//! scalar `{b"__npgeneric__": True, b"data": <value>, b"dtype": "<f4"}` (keys as msgpack bin,
//! dtype as str, the bytes in the dtype's byte order, C order).
//!
//! Decoding borrows every string and byte array from the message (rmpv's `ValueRef`), after a
//! scan that bounds what the message can make us allocate: a message is read from a bounded
//! websocket frame, but a few bytes can declare an array of 2^32 elements, and each decoded
//! element costs 40 bytes of tree.

use rmpv::ValueRef;

use crate::error::{Error, Result};

/// Largest number of msgpack values (map keys and values, array elements, scalars) in one
/// message: an observation has tens; the decoded tree then stays under a few MiB.
pub const MAX_VALUES: usize = 65_536;
/// Deepest nesting accepted (an observation nests maps two or three levels).
pub const MAX_DEPTH: usize = 32;

/// Decodes one msgpack value that spans the whole of `bytes`.
pub fn decode(bytes: &[u8]) -> Result<ValueRef<'_>> {
    scan(bytes)?;
    let mut rd = bytes;
    let value = rmpv::decode::read_value_ref_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| Error::invalid("request", format!("not msgpack: {e}")))?;
    Ok(value)
}

/// Walks the message's structure without building it: refuses truncated data, trailing bytes,
/// reserved markers and more than [`MAX_VALUES`] values. No allocation, no recursion.
fn scan(bytes: &[u8]) -> Result<()> {
    use rmp::Marker as M;
    let bad = |m: String| Error::invalid("request", format!("not msgpack: {m}"));
    let (mut pos, mut pending, mut values) = (0usize, 1u64, 0usize);
    let take = |pos: &mut usize, n: usize| -> Result<usize> {
        let start = *pos;
        match start.checked_add(n).filter(|&end| end <= bytes.len()) {
            Some(end) => {
                *pos = end;
                Ok(start)
            }
            None => Err(bad(format!("truncated: {n} bytes declared at byte {start}, {} left", bytes.len() - start))),
        }
    };
    let be = |pos: &mut usize, n: usize| -> Result<u64> {
        let at = take(pos, n)?;
        Ok(bytes[at..at + n].iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b)))
    };
    while pending > 0 {
        if bytes.len() <= pos {
            return Err(bad(format!("truncated: {pending} more values expected at the end ({} bytes)", bytes.len())));
        }
        values += 1;
        if values > MAX_VALUES {
            return Err(Error::invalid("request", format!("more than {MAX_VALUES} msgpack values")));
        }
        pending -= 1;
        let marker = M::from_u8(bytes[pos]);
        pos += 1;
        // Payload bytes to skip, and values that follow as children.
        let (skip, children): (u64, u64) = match marker {
            M::FixPos(_) | M::FixNeg(_) | M::Null | M::True | M::False => (0, 0),
            M::U8 | M::I8 => (1, 0),
            M::U16 | M::I16 => (2, 0),
            M::U32 | M::I32 | M::F32 => (4, 0),
            M::U64 | M::I64 | M::F64 => (8, 0),
            M::FixStr(n) => (u64::from(n), 0),
            M::Str8 | M::Bin8 => (be(&mut pos, 1)?, 0),
            M::Str16 | M::Bin16 => (be(&mut pos, 2)?, 0),
            M::Str32 | M::Bin32 => (be(&mut pos, 4)?, 0),
            M::FixArray(n) => (0, u64::from(n)),
            M::Array16 => (0, be(&mut pos, 2)?),
            M::Array32 => (0, be(&mut pos, 4)?),
            M::FixMap(n) => (0, 2 * u64::from(n)),
            M::Map16 => (0, 2 * be(&mut pos, 2)?),
            M::Map32 => (0, 2 * be(&mut pos, 4)?),
            M::FixExt1 => (2, 0),
            M::FixExt2 => (3, 0),
            M::FixExt4 => (5, 0),
            M::FixExt8 => (9, 0),
            M::FixExt16 => (17, 0),
            M::Ext8 => (be(&mut pos, 1)? + 1, 0),
            M::Ext16 => (be(&mut pos, 2)? + 1, 0),
            M::Ext32 => (be(&mut pos, 4)? + 1, 0),
            M::Reserved => return Err(bad(format!("reserved marker 0xc1 at byte {}", pos - 1))),
        };
        take(&mut pos, usize::try_from(skip).unwrap_or(usize::MAX))?;
        pending += children;
    }
    if pos != bytes.len() {
        return Err(bad(format!("{} trailing bytes after the message", bytes.len() - pos)));
    }
    Ok(())
}

/// Element types numpy arrays arrive in (`dtype.str` without its byte-order character).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    F32,
    F64,
}

impl Kind {
    pub fn size(self) -> usize {
        match self {
            Kind::Bool | Kind::U8 | Kind::I8 => 1,
            Kind::U16 | Kind::I16 | Kind::F16 => 2,
            Kind::U32 | Kind::I32 | Kind::F32 => 4,
            Kind::U64 | Kind::I64 | Kind::F64 => 8,
        }
    }
}

/// A numpy dtype string: element kind and byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dtype {
    pub kind: Kind,
    pub big_endian: bool,
}

impl Dtype {
    /// Parses `dtype.str` (`"|u1"`, `"<f4"`, `">i8"`, ...); `None` for the types observations never
    /// hold (strings, objects, complex, datetimes, ...).
    pub fn parse(s: &str) -> Option<Dtype> {
        let (order, code) = s.split_at_checked(1)?;
        let big_endian = match order {
            "<" | "|" | "=" => false,
            ">" => true,
            _ => return None,
        };
        let kind = match code {
            "b1" => Kind::Bool,
            "u1" => Kind::U8,
            "i1" => Kind::I8,
            "u2" => Kind::U16,
            "i2" => Kind::I16,
            "u4" => Kind::U32,
            "i4" => Kind::I32,
            "u8" => Kind::U64,
            "i8" => Kind::I64,
            "f2" => Kind::F16,
            "f4" => Kind::F32,
            "f8" => Kind::F64,
            _ => return None,
        };
        Some(Dtype { kind, big_endian })
    }

    /// Reads element `i` of `data` as f64 (exact for every kind but u64/i64 beyond 2^53).
    fn get(self, data: &[u8], i: usize) -> f64 {
        let n = self.kind.size();
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&data[i * n..][..n]);
        if self.big_endian {
            b[..n].reverse();
        }
        match self.kind {
            Kind::Bool => f64::from(u8::from(b[0] != 0)),
            Kind::U8 => f64::from(b[0]),
            Kind::I8 => f64::from(b[0] as i8),
            Kind::U16 => f64::from(u16::from_le_bytes([b[0], b[1]])),
            Kind::I16 => f64::from(i16::from_le_bytes([b[0], b[1]])),
            Kind::U32 => f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Kind::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Kind::U64 => u64::from_le_bytes(b) as f64,
            Kind::I64 => i64::from_le_bytes(b) as f64,
            Kind::F16 => f64::from(half::f16::from_le_bytes([b[0], b[1]])),
            Kind::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            Kind::F64 => f64::from_le_bytes(b),
        }
    }
}

/// A numpy array borrowed from a message; `data` holds exactly `shape`'s product elements.
#[derive(Clone, Debug, PartialEq)]
pub struct NdArray<'a> {
    pub dtype: Dtype,
    /// The dtype as the client wrote it, for messages.
    pub dtype_str: &'a str,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

impl NdArray<'_> {
    pub fn len(&self) -> usize {
        self.data.len() / self.dtype.kind.size()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Every element as f32 (floats rounded, integers and booleans converted), appended to `out`.
    pub fn extend_f32(&self, out: &mut Vec<f32>) {
        out.extend((0..self.len()).map(|i| self.dtype.get(self.data, i) as f32));
    }
}

/// What an observation leaf can be: a numpy array or scalar, a plain msgpack scalar or list of
/// numbers, or a string.
#[derive(Clone, Debug, PartialEq)]
pub enum Leaf<'a> {
    Array(NdArray<'a>),
    /// A number (plain msgpack, or a numpy scalar).
    Number(f64),
    /// A list of plain numbers (a Python list).
    Numbers(Vec<f64>),
    Str(&'a str),
    /// Anything else, described for a message (`"nil"`, `"a map"`, `"a list of strings"`, ...).
    Other(&'static str),
}

fn key_str<'a>(key: &ValueRef<'a>) -> Option<&'a str> {
    match key {
        ValueRef::String(s) => s.into_str(),
        ValueRef::Binary(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

fn number(v: &ValueRef) -> Option<f64> {
    match v {
        ValueRef::Integer(i) => i.as_f64(),
        ValueRef::F32(f) => Some(f64::from(*f)),
        ValueRef::F64(f) => Some(*f),
        ValueRef::Boolean(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

fn describe(v: &ValueRef) -> &'static str {
    match v {
        ValueRef::Nil => "nil",
        ValueRef::Boolean(_) => "a boolean",
        ValueRef::Integer(_) | ValueRef::F32(_) | ValueRef::F64(_) => "a number",
        ValueRef::String(_) => "a string",
        ValueRef::Binary(_) => "raw bytes",
        ValueRef::Array(_) => "a list",
        ValueRef::Map(_) => "a map",
        ValueRef::Ext(..) => "a msgpack extension",
    }
}

/// The entries of a msgpack map as (name, value), names as strings; `field` names the map in
/// errors. A map that is a numpy array or scalar is not a map of entries: `None`.
pub fn entries<'a, 'v>(value: &'v ValueRef<'a>, field: &str) -> Result<Option<Vec<(&'a str, &'v ValueRef<'a>)>>> {
    let ValueRef::Map(pairs) = value else { return Ok(None) };
    if pairs.iter().any(|(k, _)| matches!(key_str(k), Some("__ndarray__" | "__npgeneric__"))) {
        return Ok(None);
    }
    pairs
        .iter()
        .map(|(k, v)| match key_str(k) {
            Some(name) => Ok((name, v)),
            None => Err(Error::invalid(field, format!("a map key is {}, expected a string", describe(k)))),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Reads a leaf (anything but a map of entries); `field` names it in errors. `max_array_bytes`
/// caps a numpy array's data.
pub fn leaf<'a>(value: &ValueRef<'a>, field: &str, max_array_bytes: usize) -> Result<Leaf<'a>> {
    match value {
        ValueRef::Map(pairs) => {
            let get = |name: &str| pairs.iter().find(|(k, _)| key_str(k) == Some(name)).map(|(_, v)| v);
            let bad = |m: String| Error::invalid(field, m);
            let dtype_of = || -> Result<(Dtype, &'a str)> {
                let s = match get("dtype") {
                    Some(ValueRef::String(s)) => s.into_str(),
                    Some(ValueRef::Binary(b)) => std::str::from_utf8(b).ok(),
                    _ => None,
                }
                .ok_or_else(|| bad("a numpy value without a dtype string".into()))?;
                Ok((Dtype::parse(s).ok_or_else(|| bad(format!("dtype {s:?} is not supported (bool, integers, float16/32/64)")))?, s))
            };
            if get("__ndarray__").is_some() {
                let (dtype, dtype_str) = dtype_of()?;
                let data = match get("data") {
                    Some(ValueRef::Binary(b)) => *b,
                    _ => return Err(bad("a numpy array without its data bytes".into())),
                };
                let shape = match get("shape") {
                    Some(ValueRef::Array(dims)) => dims
                        .iter()
                        .map(|d| match d {
                            ValueRef::Integer(i) => i.as_u64().and_then(|u| usize::try_from(u).ok()),
                            _ => None,
                        })
                        .collect::<Option<Vec<usize>>>()
                        .ok_or_else(|| bad("the shape is not a list of non-negative integers".into()))?,
                    _ => return Err(bad("a numpy array without a shape list".into())),
                };
                if data.len() > max_array_bytes {
                    return Err(bad(format!("{} bytes of array data exceed the limit of {max_array_bytes} bytes", data.len())));
                }
                let expected = shape.iter().try_fold(dtype.kind.size(), |acc, &d| acc.checked_mul(d));
                if expected != Some(data.len()) {
                    return Err(bad(format!("shape {shape:?} of {dtype_str} does not match the {} bytes of data", data.len())));
                }
                Ok(Leaf::Array(NdArray { dtype, dtype_str, shape, data }))
            } else if get("__npgeneric__").is_some() {
                let data = get("data").ok_or_else(|| bad("a numpy scalar without data".into()))?;
                match data {
                    ValueRef::String(s) => s.into_str().map(Leaf::Str).ok_or_else(|| bad("a string that is not UTF-8".into())),
                    v => {
                        dtype_of()?;
                        number(v).map(Leaf::Number).ok_or_else(|| bad(format!("a numpy scalar holding {}", describe(v))))
                    }
                }
            } else {
                Ok(Leaf::Other("a map"))
            }
        }
        ValueRef::String(s) => s.into_str().map(Leaf::Str).ok_or_else(|| Error::invalid(field, "a string that is not UTF-8")),
        ValueRef::Array(items) => match items.iter().map(number).collect::<Option<Vec<f64>>>() {
            Some(numbers) => Ok(Leaf::Numbers(numbers)),
            None => Ok(Leaf::Other("a list that is not all numbers")),
        },
        v => Ok(number(v).map(Leaf::Number).unwrap_or(Leaf::Other(describe(v)))),
    }
}

/// Writes `{b"__ndarray__": True, b"data": .., b"dtype": "<f4", b"shape": [..]}` for f32 data.
pub fn write_f32_array(out: &mut Vec<u8>, data: &[f32], shape: &[usize]) {
    write_array(out, "<f4", shape, |out| {
        let _ = rmp::encode::write_bin_len(out, (data.len() * 4) as u32);
        out.extend(data.iter().flat_map(|v| v.to_le_bytes()));
    });
}

/// Writes a uint8 array as openpi_client packs it (an image, HWC or CHW), for clients.
pub fn write_u8_array(out: &mut Vec<u8>, data: &[u8], shape: &[usize]) {
    write_array(out, "|u1", shape, |out| {
        let _ = rmp::encode::write_bin(out, data);
    });
}

/// The ndarray map of msgpack_numpy with `write_data` writing the `data` value (a bin).
fn write_array(out: &mut Vec<u8>, dtype: &str, shape: &[usize], write_data: impl FnOnce(&mut Vec<u8>)) {
    use rmp::encode as enc;
    // Writing into a Vec cannot fail.
    let _ = enc::write_map_len(out, 4);
    let _ = enc::write_bin(out, b"__ndarray__");
    let _ = enc::write_bool(out, true);
    let _ = enc::write_bin(out, b"data");
    write_data(out);
    let _ = enc::write_bin(out, b"dtype");
    let _ = enc::write_str(out, dtype);
    let _ = enc::write_bin(out, b"shape");
    let _ = enc::write_array_len(out, shape.len() as u32);
    for &d in shape {
        let _ = enc::write_uint(out, d as u64);
    }
}

/// A reply value: what the server sends back (actions, timings, metadata).
pub enum Reply<'a> {
    Nil,
    /// A value already encoded as msgpack.
    Raw(&'a [u8]),
    F32Array(&'a [f32], Vec<usize>),
    F64(f64),
    Int(i64),
    Str(&'a str),
    List(Vec<Reply<'a>>),
    Map(Vec<(&'a str, Reply<'a>)>),
}

impl Reply<'_> {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut Vec<u8>) {
        use rmp::encode as enc;
        match self {
            Reply::Nil => {
                let _ = enc::write_nil(out);
            }
            Reply::Raw(bytes) => out.extend_from_slice(bytes),
            Reply::F32Array(data, shape) => write_f32_array(out, data, shape),
            Reply::F64(v) => {
                let _ = enc::write_f64(out, *v);
            }
            Reply::Int(v) => {
                let _ = enc::write_sint(out, *v);
            }
            Reply::Str(s) => {
                let _ = enc::write_str(out, s);
            }
            Reply::List(items) => {
                let _ = enc::write_array_len(out, items.len() as u32);
                items.iter().for_each(|i| i.write(out));
            }
            Reply::Map(entries) => {
                let _ = enc::write_map_len(out, entries.len() as u32);
                for (k, v) in entries {
                    let _ = enc::write_str(out, k);
                    v.write(out);
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use proptest::prelude::*;

    use super::*;

    /// An array as openpi_client's `pack_array` writes it (keys as bin, dtype as str).
    pub(in crate::serve) fn pack_array(out: &mut Vec<u8>, dtype: &str, shape: &[usize], data: &[u8]) {
        use rmp::encode as enc;
        enc::write_map_len(out, 4).unwrap();
        enc::write_bin(out, b"__ndarray__").unwrap();
        enc::write_bool(out, true).unwrap();
        enc::write_bin(out, b"data").unwrap();
        enc::write_bin(out, data).unwrap();
        enc::write_bin(out, b"dtype").unwrap();
        enc::write_str(out, dtype).unwrap();
        enc::write_bin(out, b"shape").unwrap();
        enc::write_array_len(out, shape.len() as u32).unwrap();
        for &d in shape {
            enc::write_uint(out, d as u64).unwrap();
        }
    }

    const LIMIT: usize = 1 << 20;

    #[test]
    fn decodes_numpy_arrays_and_scalars() {
        // Produced by openpi_client 0.1.2: msgpack_numpy.packb({"a": np.arange(3, dtype="<i2"),
        // "s": np.float32(1.5), "p": "hi"}).
        let bytes: &[u8] = &[
            0x83, 0xa1, 0x61, 0x84, 0xc4, 0x0b, 0x5f, 0x5f, 0x6e, 0x64, 0x61, 0x72, 0x72, 0x61, 0x79, 0x5f, 0x5f, 0xc3, 0xc4, 0x04, 0x64,
            0x61, 0x74, 0x61, 0xc4, 0x06, 0x00, 0x00, 0x01, 0x00, 0x02, 0x00, 0xc4, 0x05, 0x64, 0x74, 0x79, 0x70, 0x65, 0xa3, 0x3c, 0x69,
            0x32, 0xc4, 0x05, 0x73, 0x68, 0x61, 0x70, 0x65, 0x91, 0x03, 0xa1, 0x73, 0x83, 0xc4, 0x0d, 0x5f, 0x5f, 0x6e, 0x70, 0x67, 0x65,
            0x6e, 0x65, 0x72, 0x69, 0x63, 0x5f, 0x5f, 0xc3, 0xc4, 0x04, 0x64, 0x61, 0x74, 0x61, 0xcb, 0x3f, 0xf8, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0xc4, 0x05, 0x64, 0x74, 0x79, 0x70, 0x65, 0xa3, 0x3c, 0x66, 0x34, 0xa1, 0x70, 0xa2, 0x68, 0x69,
        ];
        let v = decode(bytes).unwrap();
        let e = entries(&v, "request").unwrap().unwrap();
        assert_eq!(e.iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["a", "s", "p"]);
        let Leaf::Array(a) = leaf(e[0].1, "a", LIMIT).unwrap() else { panic!("not an array") };
        assert_eq!((a.dtype.kind, a.shape.as_slice()), (Kind::I16, &[3][..]));
        let mut f = Vec::new();
        a.extend_f32(&mut f);
        assert_eq!(f, [0.0, 1.0, 2.0]);
        assert_eq!(leaf(e[1].1, "s", LIMIT).unwrap(), Leaf::Number(1.5));
        assert_eq!(leaf(e[2].1, "p", LIMIT).unwrap(), Leaf::Str("hi"));
        // An array is a leaf, not a map of entries.
        assert!(entries(e[0].1, "a").unwrap().is_none());
    }

    #[test]
    fn refuses_malformed_messages_by_name() {
        let err = |b: &[u8]| match decode(b) {
            Ok(_) => panic!("accepted {} bytes", b.len()),
            Err(e) => e.to_string(),
        };
        assert!(err(&[0x92, 0x01]).contains("truncated"), "{}", err(&[0x92, 0x01]));
        assert!(err(&[0x01, 0x02]).contains("trailing"));
        assert!(err(&[0xc1]).contains("reserved"));
        assert!(err(&[]).contains("truncated"));
        // Four bytes declaring 2^32-1 array elements: refused by the scan, nothing allocated.
        assert!(err(&[0xdd, 0xff, 0xff, 0xff, 0xff]).contains("truncated"));
        // A bin declaring more bytes than follow.
        assert!(err(&[0xc6, 0x7f, 0xff, 0xff, 0xff, 0x00]).contains("truncated"));
        // Many small values.
        let mut many = vec![0xdd, 0x00, 0x01, 0x00, 0x00];
        many.extend(std::iter::repeat_n(0xc0, 0x1_0000));
        assert!(err(&many).contains("more than 65536"));
        // Too deep.
        let deep: Vec<u8> = std::iter::repeat_n(0x91, 40).chain([0xc0]).collect();
        assert!(err(&deep).contains("not msgpack"), "{}", err(&deep));
    }

    #[test]
    fn refuses_bad_arrays_by_name() {
        let bad = |dtype: &str, shape: &[usize], data: &[u8], limit: usize| {
            let mut b = Vec::new();
            pack_array(&mut b, dtype, shape, data);
            let v = decode(&b).unwrap();
            leaf(&v, "observation/state", limit).unwrap_err().to_string()
        };
        let e = bad("<f4", &[3], &[0; 8], LIMIT);
        assert!(e.contains("observation/state") && e.contains("does not match the 8 bytes"), "{e}");
        let e = bad("<U5", &[1], &[0; 20], LIMIT);
        assert!(e.contains("\"<U5\" is not supported"), "{e}");
        let e = bad("|u1", &[64], &[0; 64], 63);
        assert!(e.contains("exceed the limit of 63"), "{e}");
        // A shape whose product overflows.
        let e = bad("<f8", &[1 << 62, 1 << 62], &[0; 8], LIMIT);
        assert!(e.contains("does not match"), "{e}");
    }

    #[test]
    fn big_endian_and_every_kind_convert() {
        for (dtype, bytes, want) in [
            (">f4", 1.5f32.to_be_bytes().to_vec(), 1.5),
            ("<f8", (-2.25f64).to_le_bytes().to_vec(), -2.25),
            (">i2", (-7i16).to_be_bytes().to_vec(), -7.0),
            ("<f2", half::f16::from_f32(0.5).to_le_bytes().to_vec(), 0.5),
            ("|b1", vec![1], 1.0),
            ("<u8", 9u64.to_le_bytes().to_vec(), 9.0),
        ] {
            let mut b = Vec::new();
            pack_array(&mut b, dtype, &[1], &bytes);
            let v = decode(&b).unwrap();
            let Leaf::Array(a) = leaf(&v, "x", LIMIT).unwrap() else { panic!("{dtype}") };
            let mut f = Vec::new();
            a.extend_f32(&mut f);
            assert_eq!(f, [want], "{dtype}");
        }
    }

    proptest! {
        /// What the server writes, its own decoder reads back bit for bit.
        #[test]
        fn f32_arrays_round_trip(rows in 1usize..6, cols in 1usize..9, seed in any::<u32>()) {
            let data: Vec<f32> = (0..rows * cols).map(|i| f32::from_bits(seed.wrapping_mul(2654435761).wrapping_add(i as u32 * 97) & 0x7f7f_ffff)).collect();
            let reply = Reply::Map(vec![("actions", Reply::F32Array(&data, vec![rows, cols])), ("n", Reply::Int(-3))]);
            let bytes = reply.encode();
            let v = decode(&bytes).unwrap();
            let e = entries(&v, "reply").unwrap().unwrap();
            let Leaf::Array(a) = leaf(e[0].1, "actions", LIMIT).unwrap() else { panic!("not an array") };
            prop_assert_eq!(&a.shape, &vec![rows, cols]);
            prop_assert_eq!(a.dtype_str, "<f4");
            let mut back = Vec::new();
            a.extend_f32(&mut back);
            prop_assert_eq!(back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), data.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            prop_assert_eq!(leaf(e[1].1, "n", LIMIT).unwrap(), Leaf::Number(-3.0));
        }

        /// Arbitrary bytes never panic the decoder: they decode or are refused.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(v) = decode(&bytes) {
                let _ = leaf(&v, "x", LIMIT);
                let _ = entries(&v, "x");
            }
        }
    }
}
