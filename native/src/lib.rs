//! The per-event work of a load, done in Rust once per block instead of once per event in Python.
//!
//! `scan_lines` finds the events and checkpoints of a block of FeedAPI NDJSON lines (the protocol
//! layer); `table_columns` and `event_ids` derive a feed table's columns from raw payloads (the
//! lakehouse layer). JSON is parsed by serde_json; payloads are borrowed as `RawValue`s, so the bytes
//! the server sent are the bytes handed back, never re-serialised. The Python callers keep every
//! protocol decision (pages, bounds, damage); this module only answers "where" and "what".
use std::fmt;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

// ------------------------------------------------------------------------------------------ lines

/// What a protocol line holds: an event (its payload's raw JSON) or a checkpoint. A line with
/// both is an event; a line with neither, or a `null` cursor, is a command of a future revision.
struct Line<'a> {
    event: Option<&'a RawValue>,
    cursor: Option<String>,
}

enum LineKey {
    Event,
    Cursor,
    Other,
}

struct LineKeySeed<'k> {
    event_key: &'k str,
}

impl<'de> DeserializeSeed<'de> for LineKeySeed<'_> {
    type Value = LineKey;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<LineKey, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for LineKeySeed<'_> {
    type Value = LineKey;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, key: &str) -> Result<LineKey, E> {
        Ok(if key == self.event_key {
            LineKey::Event
        } else if key == "cursor" {
            LineKey::Cursor
        } else {
            LineKey::Other
        })
    }
}

struct CursorValue(Option<String>);

impl<'de> de::Deserialize<'de> for CursorValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CursorVisitor)
    }
}

struct CursorVisitor;

impl<'de> Visitor<'de> for CursorVisitor {
    type Value = CursorValue;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a cursor: a string, an integer or null")
    }
    fn visit_str<E: de::Error>(self, value: &str) -> Result<CursorValue, E> {
        Ok(CursorValue(Some(value.to_owned())))
    }
    fn visit_i64<E: de::Error>(self, value: i64) -> Result<CursorValue, E> {
        Ok(CursorValue(Some(value.to_string())))
    }
    fn visit_u64<E: de::Error>(self, value: u64) -> Result<CursorValue, E> {
        Ok(CursorValue(Some(value.to_string())))
    }
    fn visit_unit<E: de::Error>(self) -> Result<CursorValue, E> {
        Ok(CursorValue(None))
    }
}

struct LineVisitor<'k> {
    event_key: &'k str,
}

impl<'de> Visitor<'de> for LineVisitor<'_> {
    type Value = Line<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a FeedAPI line object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Line<'de>, A::Error> {
        let mut line = Line { event: None, cursor: None };
        while let Some(key) = map.next_key_seed(LineKeySeed { event_key: self.event_key })? {
            match key {
                LineKey::Event => line.event = Some(map.next_value()?),
                LineKey::Cursor => line.cursor = map.next_value::<CursorValue>()?.0,
                LineKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(line)
    }
}

fn parse_line<'a>(text: &'a str, event_key: &str) -> serde_json::Result<Line<'a>> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let line = deserializer.deserialize_map(LineVisitor { event_key })?;
    deserializer.end()?;
    Ok(line)
}

/// Blank lines are skipped, as Python's `bytes.strip` sees blanks.
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n' | b'\x0b' | b'\x0c'))
}

struct Damage {
    kind: &'static str,
    start: usize,
    end: usize,
    message: String,
}

#[derive(Default)]
struct Scan {
    events: Vec<(usize, usize)>,
    checkpoints: Vec<(usize, String)>,
    damage: Option<Damage>,
}

fn scan(block: &[u8], event_key: &str) -> Scan {
    let mut scan = Scan::default();
    let mut start = 0;
    while start < block.len() {
        let end = memchr::memchr(b'\n', &block[start..]).map_or(block.len(), |at| start + at);
        let raw = &block[start..end];
        let line_start = start;
        start = end + 1;
        if is_blank(raw) {
            continue;
        }
        let damage = |kind, message| Some(Damage { kind, start: line_start, end, message });
        let text = match std::str::from_utf8(raw) {
            Ok(text) => text,
            Err(_) => {
                scan.damage = damage("utf8", "body is not valid UTF-8".to_owned());
                break;
            }
        };
        match parse_line(text, event_key) {
            Ok(Line { event: Some(value), .. }) => {
                let at = value.get().as_ptr() as usize - block.as_ptr() as usize;
                scan.events.push((at, at + value.get().len()));
            }
            Ok(Line { cursor: Some(cursor), .. }) => scan.checkpoints.push((scan.events.len(), cursor)),
            Ok(_) => {}
            Err(error) => {
                scan.damage = damage("json", error.to_string());
                break;
            }
        }
    }
    scan
}

type ScanResult<'py> = (Bound<'py, PyList>, Vec<(usize, String)>, Option<(&'static str, usize, usize, String)>);

/// The lines of `block` up to the first damaged one: the events' payloads (raw JSON bytes), the
/// checkpoints as (number of events before it, cursor), and the damage as (kind `utf8`|`json`,
/// line start, line end, message), or None.
#[pyfunction]
fn scan_lines<'py>(py: Python<'py>, block: &[u8], event_key: &str) -> PyResult<ScanResult<'py>> {
    let scan = py.detach(|| scan(block, event_key));
    let events = PyList::new(py, scan.events.iter().map(|&(start, end)| PyBytes::new(py, &block[start..end])))?;
    let damage = scan.damage.map(|d| (d.kind, d.start, d.end, d.message));
    Ok((events, scan.checkpoints, damage))
}

// ------------------------------------------------------------------------------------- payloads

struct FieldSeed<'f> {
    field: &'f str,
}

impl<'de> DeserializeSeed<'de> for FieldSeed<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FieldSeed<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.field)
    }
}

struct FieldVisitor<'f> {
    field: &'f str,
}

impl<'de> Visitor<'de> for FieldVisitor<'_> {
    type Value = Option<&'de RawValue>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(is_field) = map.next_key_seed(FieldSeed { field: self.field })? {
            if is_field {
                found = Some(map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

const OBJECT: i8 = 0;
const STRING: i8 = 1;

/// Index into the table's payload kinds: object, string, array, boolean, null, number.
fn kind(raw: &[u8]) -> i8 {
    match raw.first() {
        Some(b'{') => OBJECT,
        Some(b'"') => STRING,
        Some(b'[') => 2,
        Some(b't' | b'f') => 3,
        Some(b'n') => 4,
        _ => 5,
    }
}

fn text(raw: &[u8]) -> serde_json::Result<&str> {
    std::str::from_utf8(raw).map_err(|_| de::Error::custom("payload is not valid UTF-8"))
}

/// A JSON string's value, borrowed when it has no escapes.
fn unquoted(raw: &[u8]) -> serde_json::Result<std::borrow::Cow<'_, [u8]>> {
    if raw.len() >= 2 && !raw.contains(&b'\\') {
        return Ok(std::borrow::Cow::Borrowed(&raw[1..raw.len() - 1]));
    }
    let value: String = serde_json::from_str(text(raw)?)?;
    Ok(std::borrow::Cow::Owned(value.into_bytes()))
}

/// The id field of an object payload: a string id as its value, any other JSON value as its text.
fn event_id<'a>(raw: &'a [u8], field: &str) -> serde_json::Result<Option<std::borrow::Cow<'a, [u8]>>> {
    if kind(raw) != OBJECT {
        return Ok(None);
    }
    let mut deserializer = serde_json::Deserializer::from_str(text(raw)?);
    let Some(value) = deserializer.deserialize_map(FieldVisitor { field })? else {
        return Ok(None);
    };
    let value = value.get().as_bytes();
    if value.first() == Some(&b'"') {
        return unquoted(value).map(Some);
    }
    Ok(Some(std::borrow::Cow::Borrowed(value)))
}

/// Arrow buffers of a nullable string column with 64-bit offsets.
#[derive(Default)]
struct Strings {
    data: Vec<u8>,
    offsets: Vec<i64>,
    validity: Vec<u8>,
    nulls: usize,
}

impl Strings {
    fn with_capacity(count: usize) -> Self {
        let mut strings = Strings { offsets: Vec::with_capacity(count + 1), ..Default::default() };
        strings.offsets.push(0);
        strings.validity.resize(count.div_ceil(8), 0);
        strings
    }
    fn push(&mut self, value: Option<&[u8]>) {
        let index = self.offsets.len() - 1;
        match value {
            Some(value) => {
                self.data.extend_from_slice(value);
                self.validity[index >> 3] |= 1 << (index & 7);
            }
            None => self.nulls += 1,
        }
        self.offsets.push(self.data.len() as i64);
    }
}

struct Columns {
    payloads: Strings,
    kinds: Vec<i8>,
    ids: Strings,
}

fn columns(raws: &[&[u8]], field: &str) -> serde_json::Result<Columns> {
    let mut columns = Columns {
        payloads: Strings::with_capacity(raws.len()),
        kinds: Vec::with_capacity(raws.len()),
        ids: Strings::with_capacity(raws.len()),
    };
    columns.payloads.data.reserve(raws.iter().map(|raw| raw.len()).sum());
    for raw in raws {
        let kind = kind(raw);
        columns.kinds.push(kind);
        // a string payload is stored as the string itself, every other value as the JSON text sent
        if kind == STRING {
            columns.payloads.push(Some(&unquoted(raw)?));
        } else {
            columns.payloads.push(Some(raw));
        }
        columns.ids.push(event_id(raw, field)?.as_deref());
    }
    Ok(columns)
}

fn as_bytes<'py>(py: Python<'py>, values: &[i64]) -> Bound<'py, PyBytes> {
    let bytes: Vec<u8> = values.iter().flat_map(|value| value.to_le_bytes()).collect();
    PyBytes::new(py, &bytes)
}

fn payload_slices<'py>(raws: &Bound<'py, PyList>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    raws.iter().map(|raw| raw.cast_into::<PyBytes>().map_err(PyErr::from)).collect()
}

fn invalid(error: serde_json::Error) -> PyErr {
    PyValueError::new_err(format!("payload is not valid JSON: {error}"))
}

type Buffers<'py> = (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>);
type ColumnsResult<'py> = (Buffers<'py>, Bound<'py, PyBytes>, Buffers<'py>);

/// The payload, payload kind and event id columns of `raws` as Arrow buffers: (payload data,
/// 64-bit offsets, validity or None), the kinds as int8 indexes, (id data, offsets, validity).
#[pyfunction]
fn table_columns<'py>(py: Python<'py>, raws: &Bound<'py, PyList>, id_field: &str) -> PyResult<ColumnsResult<'py>> {
    let owned = payload_slices(raws)?;
    let slices: Vec<&[u8]> = owned.iter().map(|raw| raw.as_bytes()).collect();
    let columns = py.detach(|| columns(&slices, id_field)).map_err(invalid)?;
    let buffers = |strings: &Strings| -> Buffers<'py> {
        let validity = (strings.nulls > 0).then(|| PyBytes::new(py, &strings.validity));
        (PyBytes::new(py, &strings.data), as_bytes(py, &strings.offsets), validity)
    };
    let kinds: Vec<u8> = columns.kinds.iter().map(|&kind| kind as u8).collect();
    Ok((buffers(&columns.payloads), PyBytes::new(py, &kinds), buffers(&columns.ids)))
}

/// The event id of each payload (see `table_columns`), or None.
#[pyfunction]
fn event_ids<'py>(py: Python<'py>, raws: &Bound<'py, PyList>, id_field: &str) -> PyResult<Vec<Option<Bound<'py, PyBytes>>>> {
    payload_slices(raws)?
        .iter()
        .map(|raw| Ok(event_id(raw.as_bytes(), id_field).map_err(invalid)?.map(|id| PyBytes::new(py, &id))))
        .collect()
}

#[pymodule]
fn feedapi_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(scan_lines, module)?)?;
    module.add_function(wrap_pyfunction!(table_columns, module)?)?;
    module.add_function(wrap_pyfunction!(event_ids, module)?)?;
    Ok(())
}
