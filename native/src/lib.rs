//! The per-event work of a load, done in Rust once per block instead of once per event in Python.
//!
//! `scan_lines` finds the events and checkpoints of a block of FeedAPI NDJSON lines (the protocol
//! layer) and hands the events as `Payloads`, spans of the block; `table_columns` and `event_ids`
//! derive a feed table's columns from those spans (the lakehouse layer). JSON is parsed by
//! serde_json; payloads are borrowed as `RawValue`s, so the bytes the server sent are the bytes
//! handed back, never re-serialised. The Python callers keep every
//! protocol decision (pages, bounds, damage); this module only answers "where" and "what".
use std::fmt;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::basic::CompareOp;
use pyo3::types::{PyBytes, PyList, PySlice};
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
    checkpoints: Vec<(usize, usize, String)>,
    events_bytes: usize,
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
                scan.events_bytes += value.get().len();
            }
            Ok(Line { cursor: Some(cursor), .. }) => {
                scan.checkpoints.push((scan.events.len(), scan.events_bytes, cursor))
            }
            Ok(_) => {}
            Err(error) => {
                scan.damage = damage("json", error.to_string());
                break;
            }
        }
    }
    scan
}

type ScanResult<'py> = (
    Payloads,
    Vec<usize>,
    Vec<usize>,
    Vec<String>,
    usize,
    Option<(&'static str, usize, usize, String)>,
);

/// The lines of `block` up to the first damaged one: the events' payloads (raw JSON bytes); for each
/// checkpoint, the number of events before it, their payload bytes and its cursor; the payload bytes
/// of all events; the damage as (kind `utf8`|`json`, line start, line end, message), or None.
#[pyfunction]
fn scan_lines<'py>(py: Python<'py>, block: &Bound<'py, PyBytes>, event_key: &str) -> PyResult<ScanResult<'py>> {
    let bytes = block.as_bytes();
    let scan = py.detach(|| scan(bytes, event_key));
    let events = Payloads::from_part(Part { block: block.clone().unbind(), spans: scan.events });
    let mut ends = Vec::with_capacity(scan.checkpoints.len());
    let mut sizes = Vec::with_capacity(scan.checkpoints.len());
    let mut cursors = Vec::with_capacity(scan.checkpoints.len());
    for (end, size, cursor) in scan.checkpoints {
        ends.push(end);
        sizes.push(size);
        cursors.push(cursor);
    }
    let damage = scan.damage.map(|d| (d.kind, d.start, d.end, d.message));
    Ok((events, ends, sizes, cursors, scan.events_bytes, damage))
}

// ------------------------------------------------------------------------------------- Payloads

/// Spans of one response block (a Python `bytes` kept alive by the span list).
struct Part {
    block: Py<PyBytes>,
    spans: Vec<(usize, usize)>,
}

/// Event payloads as spans of the blocks they arrived in: a read-only sequence of `bytes` that makes
/// no Python object per event unless one is asked for. A load never asks: its columns are built
/// from the spans (touching a million small `bytes` objects cost a cache miss each).
#[pyclass(frozen, sequence, module = "feedapi_native")]
struct Payloads {
    parts: Vec<Part>,
    len: usize,
}

impl Payloads {
    fn from_part(part: Part) -> Self {
        let len = part.spans.len();
        Payloads { parts: if len > 0 { vec![part] } else { Vec::new() }, len }
    }

    fn from_parts(py: Python<'_>, parts: impl IntoIterator<Item = (Py<PyBytes>, Vec<(usize, usize)>)>) -> Self {
        let parts: Vec<Part> = parts
            .into_iter()
            .filter(|(_, spans)| !spans.is_empty())
            .map(|(block, spans)| Part { block: block.clone_ref(py), spans })
            .collect();
        let len = parts.iter().map(|part| part.spans.len()).sum();
        Payloads { parts, len }
    }

    fn slices<'a>(&'a self, py: Python<'_>) -> impl Iterator<Item = &'a [u8]> + 'a {
        let blocks: Vec<&'a [u8]> = self.parts.iter().map(|part| part.block.as_bytes(py)).collect();
        self.parts
            .iter()
            .zip(blocks)
            .flat_map(|(part, block)| part.spans.iter().map(move |&(start, end)| &block[start..end]))
    }

    fn range(&self, py: Python<'_>, start: usize, stop: usize) -> Payloads {
        let mut parts = Vec::new();
        let mut offset = 0;
        for part in &self.parts {
            let (first, last) = (offset, offset + part.spans.len());
            offset = last;
            let (from, to) = (start.max(first), stop.min(last));
            if from < to {
                parts.push((part.block.clone_ref(py), part.spans[from - first..to - first].to_vec()));
            }
        }
        Payloads::from_parts(py, parts)
    }

    fn to_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items: Vec<Bound<'py, PyBytes>> = self.slices(py).map(|raw| PyBytes::new(py, raw)).collect();
        PyList::new(py, items)
    }

    fn coerce(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Payloads> {
        match value.cast::<Payloads>() {
            Ok(payloads) => Ok(payloads.get().range(py, 0, payloads.get().len)),
            Err(_) => Payloads::new(py, Some(value)),
        }
    }
}

#[pymethods]
impl Payloads {
    /// Payloads from an iterable of `bytes` (copied into one block), or none.
    #[new]
    #[pyo3(signature = (items=None))]
    fn new(py: Python<'_>, items: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let Some(items) = items else { return Ok(Payloads { parts: Vec::new(), len: 0 }) };
        let mut data = Vec::new();
        let mut spans = Vec::new();
        for item in items.try_iter()? {
            let item = item?;
            let raw = item.cast::<PyBytes>()?.as_bytes();
            spans.push((data.len(), data.len() + raw.len()));
            data.extend_from_slice(raw);
        }
        Ok(Payloads::from_part(Part { block: PyBytes::new(py, &data).unbind(), spans }))
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __getitem__<'py>(&self, py: Python<'py>, index: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(slice) = index.cast::<PySlice>() {
            let range = slice.indices(self.len as isize)?;
            if range.step == 1 {
                let (start, stop) = (range.start as usize, (range.stop.max(range.start)) as usize);
                return Ok(Bound::new(py, self.range(py, start, stop))?.into_any());
            }
            return self.to_list(py)?.as_any().get_item(index);
        }
        let mut at: isize = index.extract()?;
        if at < 0 {
            at += self.len as isize;
        }
        if at < 0 || at as usize >= self.len {
            return Err(pyo3::exceptions::PyIndexError::new_err("payload index out of range"));
        }
        let raw = self.slices(py).nth(at as usize).expect("index checked against the length");
        Ok(PyBytes::new(py, raw).into_any())
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.to_list(py)?.try_iter()?.into_any())
    }

    fn __add__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Payloads> {
        let other = Payloads::coerce(py, other)?;
        let parts = self
            .parts
            .iter()
            .chain(&other.parts)
            .map(|part| (part.block.clone_ref(py), part.spans.clone()));
        Ok(Payloads::from_parts(py, parts))
    }

    fn __richcmp__(&self, py: Python<'_>, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
        let equal = match Payloads::coerce(py, other) {
            Ok(other) => other.len == self.len && other.slices(py).eq(self.slices(py)),
            Err(_) => false,
        };
        match op {
            CompareOp::Eq => Ok(equal.into_pyobject(py)?.to_owned().into_any().unbind()),
            CompareOp::Ne => Ok((!equal).into_pyobject(py)?.to_owned().into_any().unbind()),
            _ => Ok(py.NotImplemented()),
        }
    }

    /// The payloads' bytes in all.
    #[getter]
    fn nbytes(&self) -> usize {
        self.parts.iter().flat_map(|part| &part.spans).map(|(start, end)| end - start).sum()
    }

    fn __repr__(&self) -> String {
        format!("Payloads({} events, {} bytes)", self.len, self.nbytes())
    }
}

// ------------------------------------------------------------------------------------- payloads

// Payloads reach the columns validated (by `scan_lines`), so finding the id field needs no parser:
// walking the object's top level, skipping values by their brackets and quotes, stops at the field,
// which a feed usually sends first. Out-of-range reads end the walk instead of panicking.

fn skip_whitespace(s: &[u8], mut at: usize) -> usize {
    while matches!(s.get(at), Some(b' ' | b'\t' | b'\r' | b'\n')) {
        at += 1;
    }
    at
}

/// The index after the string starting at `at` (its opening quote).
fn skip_string(s: &[u8], mut at: usize) -> usize {
    at += 1;
    while let Some(found) = memchr::memchr2(b'"', b'\\', s.get(at..).unwrap_or_default()) {
        if s[at + found] == b'\\' {
            at += found + 2;
        } else {
            return at + found + 1;
        }
    }
    s.len()
}

/// The index after the value starting at `at`.
fn skip_value(s: &[u8], mut at: usize) -> usize {
    match s.get(at) {
        Some(b'"') => skip_string(s, at),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            while let Some(&byte) = s.get(at) {
                match byte {
                    b'"' => at = skip_string(s, at),
                    b'{' | b'[' => {
                        depth += 1;
                        at += 1;
                    }
                    b'}' | b']' => {
                        depth -= 1;
                        at += 1;
                        if depth == 0 {
                            return at;
                        }
                    }
                    _ => at += 1,
                }
            }
            at
        }
        _ => {
            while !matches!(s.get(at), None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n')) {
                at += 1;
            }
            at
        }
    }
}

/// The raw value of the first top-level `field` of the object `s`.
fn top_level_field<'a>(s: &'a [u8], field: &str) -> Option<&'a [u8]> {
    let mut at = skip_whitespace(s, 1);
    while s.get(at) == Some(&b'"') {
        let key_end = skip_string(s, at);
        let key = s.get(at + 1..key_end - 1)?;
        let matches = if key.contains(&b'\\') {
            serde_json::from_slice::<String>(&s[at..key_end]).is_ok_and(|key| key == field)
        } else {
            key == field.as_bytes()
        };
        let value = skip_whitespace(s, skip_whitespace(s, key_end) + 1);
        let value_end = skip_value(s, value);
        if matches {
            return s.get(value..value_end);
        }
        at = skip_whitespace(s, value_end);
        if s.get(at) != Some(&b',') {
            return None;
        }
        at = skip_whitespace(s, at + 1);
    }
    None
}

const OBJECT: u8 = 0;
const STRING: u8 = 1;

/// Index into the table's payload kinds: object, string, array, boolean, null, number.
fn kind(raw: &[u8]) -> u8 {
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

/// The first top-level id field of an object payload: a string id as its value, any other JSON
/// value as its text.
fn event_id<'a>(raw: &'a [u8], field: &str) -> serde_json::Result<Option<std::borrow::Cow<'a, [u8]>>> {
    if kind(raw) != OBJECT {
        return Ok(None);
    }
    match top_level_field(raw, field) {
        Some(value) if value.first() == Some(&b'"') => unquoted(value).map(Some),
        Some(value) => Ok(Some(std::borrow::Cow::Borrowed(value))),
        None => Ok(None),
    }
}

/// Arrow buffers of a nullable string column (32-bit offsets, as the table's `string` columns).
#[derive(Default)]
struct Strings {
    data: Vec<u8>,
    offsets: Vec<i32>,
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

    fn push(&mut self, value: Option<&[u8]>) -> Result<(), String> {
        let index = self.offsets.len() - 1;
        match value {
            Some(value) => {
                self.data.extend_from_slice(value);
                self.validity[index >> 3] |= 1 << (index & 7);
            }
            None => self.nulls += 1,
        }
        let end = i32::try_from(self.data.len()).map_err(|_| "more than 2 GiB of text in one column".to_owned())?;
        self.offsets.push(end);
        Ok(())
    }

    fn into_python(self, py: Python<'_>) -> Buffers<'_> {
        let offsets: Vec<u8> = self.offsets.iter().flat_map(|offset| offset.to_le_bytes()).collect();
        let validity = (self.nulls > 0).then(|| PyBytes::new(py, &self.validity));
        (PyBytes::new(py, &self.data), PyBytes::new(py, &offsets), validity)
    }
}

const KIND_NAMES: [&[u8]; 6] = [b"object", b"string", b"array", b"boolean", b"null", b"number"];

struct Columns {
    payloads: Strings,
    kinds: Strings,
    ids: Strings,
    cursors: Strings,
}

fn columns(raws: &[&[u8]], field: &str, ends: &[usize], cursors: &[String]) -> Result<Columns, String> {
    if ends.len() != cursors.len() || ends.windows(2).any(|pair| pair[0] > pair[1]) || ends.last() != Some(&raws.len()) {
        return Err("ends must be non-decreasing, one per cursor, the last one the number of payloads".to_owned());
    }
    let mut columns = Columns {
        payloads: Strings::with_capacity(raws.len()),
        kinds: Strings::with_capacity(raws.len()),
        ids: Strings::with_capacity(raws.len()),
        cursors: Strings::with_capacity(raws.len()),
    };
    columns.payloads.data.reserve(raws.iter().map(|raw| raw.len()).sum());
    let mut page = 0;
    for (index, raw) in raws.iter().enumerate() {
        while index >= ends[page] {
            page += 1;
        }
        let kind = kind(raw);
        // a string payload is stored as the string itself, every other value as the JSON text sent
        if kind == STRING {
            columns.payloads.push(Some(&unquoted(raw).map_err(invalid_payload)?))?;
        } else {
            columns.payloads.push(Some(raw))?;
        }
        columns.kinds.push(Some(KIND_NAMES[kind as usize]))?;
        columns.ids.push(event_id(raw, field).map_err(invalid_payload)?.as_deref())?;
        columns.cursors.push(Some(cursors[page].as_bytes()))?;
    }
    Ok(columns)
}

fn invalid_payload(error: serde_json::Error) -> String {
    format!("payload is not valid JSON: {error}")
}


type Buffers<'py> = (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Option<Bound<'py, PyBytes>>);

/// The string columns of pages of payloads (`raws`: `Payloads` one after the other, as `scan_lines`
/// gives them: validated JSON), page i holding payloads `ends[i-1]..ends[i]` under `cursors[i]`:
/// `payload`, `payload_type`, `event_id` and `cursor`, each as Arrow buffers (data, 32-bit offsets,
/// validity or None).
///
/// The GIL is kept: a group takes a millisecond or two, and getting a busy GIL back can take longer
/// (measured: releasing it here made a load slower). `scan_lines` releases it while it parses.
#[pyfunction]
fn table_columns<'py>(
    py: Python<'py>,
    raws: Vec<PyRef<'py, Payloads>>,
    id_field: &str,
    ends: Vec<usize>,
    cursors: Vec<String>,
) -> PyResult<(Buffers<'py>, Buffers<'py>, Buffers<'py>, Buffers<'py>)> {
    let slices: Vec<&[u8]> = raws.iter().flat_map(|payloads| payloads.slices(py)).collect();
    let columns = columns(&slices, id_field, &ends, &cursors).map_err(PyValueError::new_err)?;
    Ok((
        columns.payloads.into_python(py),
        columns.kinds.into_python(py),
        columns.ids.into_python(py),
        columns.cursors.into_python(py),
    ))
}

/// The event id of each payload (see `table_columns`), or None.
#[pyfunction]
fn event_ids<'py>(py: Python<'py>, raws: PyRef<'py, Payloads>, id_field: &str) -> PyResult<Vec<Option<Bound<'py, PyBytes>>>> {
    raws.slices(py)
        .map(|raw| {
            let id = event_id(raw, id_field)
                .map_err(|error| PyValueError::new_err(invalid_payload(error)))?;
            Ok(id.map(|id| PyBytes::new(py, &id)))
        })
        .collect()
}

#[pymodule]
fn feedapi_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(scan_lines, module)?)?;
    module.add_function(wrap_pyfunction!(table_columns, module)?)?;
    module.add_function(wrap_pyfunction!(event_ids, module)?)?;
    module.add_class::<Payloads>()?;
    Ok(())
}
