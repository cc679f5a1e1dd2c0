//! A `MetricBatch` as the ingester reads it: the message's bytes kept in one buffer (or, decoded by serde,
//! every name and label string copied once into one), each sample a few integers pointing into it.
//!
//! Decoding `MetricBatch` into its owned form allocated a `String` per name, a `BTreeMap` and two `String`s
//! per label, and dropped them all after the append: about a third of the TSDB's ingest CPU in the
//! 2026-12-02 profile. [`ScrapeBatch`] reads the same bytes (same schema, same version, same rules: a sample
//! without its `name`, `labels`, `value` or `timestamp_ms` fails the whole message, which goes to the
//! dead-letter stream; unknown fields are skipped; a label given twice keeps its last value, as the map
//! does; a malformed metric family fails the message too, though the TSDB has no use for them) into three
//! vectors allocated once per batch. The usual message (the envelope as the agent writes it) is read by
//! a MessagePack reader of its own (`fast`), a third of the time serde takes, which copies no string: a name
//! or label is a span of the body, checked to be UTF-8 on its own, and the body is the message's own buffer
//! when the consumer hands it over ([`Payload::decode_envelope_shared`]); anything it does not expect goes
//! through serde. It checks a sample's labels but does not read them into pairs: they are read when asked
//! for, which the store does only for a sample its scrape cache does not know (see `RowLabels::Map`).

use std::borrow::Cow;
use std::fmt;

use multipilot_schemas::Payload;
use multipilot_schemas::envelope::Envelope;
use multipilot_schemas::payload::{MetricBatch, MetricFamily, Sample};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::store::SampleView;

/// A span of [`ScrapeBatch`]'s text.
type Span = (u32, u32);

#[derive(Debug, Clone, Copy, PartialEq)]
struct Row {
    name: Span,
    labels: RowLabels,
    value: f64,
    timestamp_ms: i64,
    /// The sample's name and labels as the message spelled them, a span of the text (empty when decoded by
    /// serde): what the store's scrape cache compares, as Prometheus' compares a series' text.
    ident: Span,
}

/// Where a sample's labels are.
#[derive(Debug, Clone, Copy, PartialEq)]
enum RowLabels {
    /// A range of `pairs` (decoded by serde).
    Pairs(u32, u32),
    /// The label map in the text, every string checked to be UTF-8 by the fast reader and read only when
    /// asked for: what the scrape cache knows (spelled as last time) never is, as Prometheus parses a
    /// series only on a scrape cache miss. Reading every sample's labels into `pairs` was a fifth of the
    /// decoding time.
    Map(Span),
}

/// The samples of one `MetricBatch` message, decoded for ingestion (see the module docs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScrapeBatch {
    /// The scrape target's job name.
    pub job: String,
    /// The scraped endpoint.
    pub instance: String,
    /// Lines of the scrape the agent could not parse.
    pub rejected_lines: u64,
    /// The strings the spans point into. Read by the fast reader, the message body itself (each name and
    /// label string a span of it, checked to be UTF-8 on its own; the message's own buffer when the
    /// consumer gave it, not a copy), then any spelling that is not one run of it; decoded by serde, the
    /// strings one after another.
    text: TextBuf,
    /// (name, value) spans of the labels of the samples decoded by serde, each sample's sorted by name,
    /// names unique.
    pairs: Vec<(Span, Span)>,
    rows: Vec<Row>,
}

/// The bytes a batch's spans point into: the message's own buffer, shared, or bytes of the batch's own.
#[derive(Debug, Clone)]
enum TextBuf {
    Shared(bytes::Bytes),
    Owned(Vec<u8>),
}

impl Default for TextBuf {
    fn default() -> Self {
        TextBuf::Owned(Vec::new())
    }
}

impl std::ops::Deref for TextBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            TextBuf::Shared(b) => b,
            TextBuf::Owned(v) => v,
        }
    }
}

impl PartialEq for TextBuf {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl TextBuf {
    /// The bytes, to append to (shared ones copied first, once).
    fn owned(&mut self) -> &mut Vec<u8> {
        match self {
            TextBuf::Owned(v) => v,
            TextBuf::Shared(b) => {
                *self = TextBuf::Owned(b.to_vec());
                self.owned()
            }
        }
    }
}

/// One sample of a [`ScrapeBatch`], borrowing its strings.
#[derive(Debug, Clone, Copy)]
pub struct SampleRef<'a> {
    batch: &'a ScrapeBatch,
    row: &'a Row,
}

impl<'a> SampleView<'a> for SampleRef<'a> {
    fn name(&self) -> &'a str {
        self.batch.span(self.row.name)
    }

    fn labels(&self) -> impl Iterator<Item = (&'a str, &'a str)> {
        let b = self.batch;
        let spans: Cow<'a, [(Span, Span)]> = match self.row.labels {
            RowLabels::Pairs(from, to) => Cow::Borrowed(&b.pairs[from as usize..to as usize]),
            RowLabels::Map(map) => Cow::Owned(fast::label_map(&b.text, map)),
        };
        (0..spans.len()).map(move |i| (b.span(spans[i].0), b.span(spans[i].1)))
    }

    fn value(&self) -> f64 {
        self.row.value
    }

    fn timestamp_ms(&self) -> i64 {
        self.row.timestamp_ms
    }

    fn ident(&self) -> &'a [u8] {
        let (from, to) = self.row.ident;
        &self.batch.text[from as usize..to as usize]
    }
}

impl ScrapeBatch {
    fn span(&self, (from, to): Span) -> &str {
        // a span is made by `push_text` of a `&str`, or by the fast reader of a string it checked to be
        // UTF-8: never empty for want of being UTF-8 (checked again here rather than trusted unsafely, a
        // short string at a time, only where the name and labels are read: what the scrape cache misses)
        std::str::from_utf8(&self.text[from as usize..to as usize]).unwrap_or_default()
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The samples, in message order.
    pub fn samples(&self) -> impl ExactSizeIterator<Item = SampleRef<'_>> + '_ {
        self.rows
            .iter()
            .map(move |row| SampleRef { batch: self, row })
    }

    /// The owned form (for tests and tools; the ingest path never builds it). Metric families are not
    /// kept by the decoder, so they are empty here.
    pub fn to_metric_batch(&self) -> MetricBatch {
        MetricBatch {
            job: self.job.clone(),
            instance: self.instance.clone(),
            families: Vec::new(),
            samples: self
                .samples()
                .map(|s| Sample {
                    name: s.name().to_string(),
                    labels: s
                        .labels()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    value: s.value(),
                    timestamp_ms: s.timestamp_ms(),
                })
                .collect(),
            rejected_lines: self.rejected_lines,
        }
    }

    /// Appends `s` to the text; `None` past 4 GiB (the spans are 32-bit).
    fn push_text(&mut self, s: &str) -> Option<Span> {
        let from = self.text.len();
        let to = u32::try_from(from + s.len()).ok()?;
        self.text.owned().extend_from_slice(s.as_bytes());
        Some((from as u32, to))
    }
}

/// Whether the labels from `from` on are sorted by name, each name once (as producers send them).
fn sorted_once(pairs: &[(Span, Span)], text: &[u8], from: usize) -> bool {
    let key = |p: &(Span, Span)| &text[p.0.0 as usize..p.0.1 as usize];
    pairs[from..]
        .windows(2)
        .all(|w| less(key(&w[0]), key(&w[1])))
}

/// `a < b` for label names, compared inline: they are short and usually differ in their first bytes,
/// where a call to `memcmp` per pair cost more than the comparison (~4 % of ingest).
fn less(a: &[u8], b: &[u8]) -> bool {
    match a.iter().zip(b).find(|(x, y)| x != y) {
        Some((x, y)) => x < y,
        None => a.len() < b.len(),
    }
}

/// Sorts the labels from `from` to the end by name, keeping the last value of a name given twice (what
/// decoding into a map did). Producers send them sorted: then this only checks. Names compare as bytes,
/// which orders them as strings do.
fn normalize_labels(pairs: &mut Vec<(Span, Span)>, text: &[u8], from: usize) {
    if !sorted_once(pairs, text, from) {
        sort_labels(pairs, text, from);
    }
}

/// [`normalize_labels`] for labels known not to be sorted and unique.
fn sort_labels(pairs: &mut Vec<(Span, Span)>, text: &[u8], from: usize) {
    let key = |p: &(Span, Span)| &text[p.0.0 as usize..p.0.1 as usize];
    let labels = &mut pairs[from..];
    // stable: equal names stay in message order, so the last of a run is the one given last
    labels.sort_by(|a, b| key(a).cmp(key(b)));
    let mut kept: Vec<(Span, Span)> = Vec::with_capacity(labels.len());
    for p in labels.iter() {
        match kept.last_mut() {
            Some(last) if key(last) == key(p) => *last = *p,
            _ => kept.push(*p),
        }
    }
    pairs.truncate(from);
    pairs.extend(kept);
}

impl Payload for ScrapeBatch {
    const SCHEMA: &'static str = <MetricBatch as Payload>::SCHEMA;
    const VERSION: u32 = <MetricBatch as Payload>::VERSION;

    /// The envelope as the agent writes it (named MessagePack) is read by `fast::envelope`; anything
    /// else, including every malformed message, goes through serde, whose errors name what is wrong.
    fn decode_envelope(
        schema: &str,
        body: &[u8],
    ) -> Result<Envelope<Self>, rmp_serde::decode::Error> {
        let _ = schema;
        match fast::envelope(body) {
            Some(envelope) => Ok(envelope),
            None => rmp_serde::from_slice(body),
        }
    }

    /// As `decode_envelope`, the batch's text the message's own buffer rather than a copy of it.
    fn decode_envelope_shared(
        schema: &str,
        body: &bytes::Bytes,
    ) -> Result<Envelope<Self>, rmp_serde::decode::Error> {
        let _ = schema;
        match fast::envelope_shared(body) {
            Some(envelope) => Ok(envelope),
            None => rmp_serde::from_slice(body),
        }
    }
}

impl schemars::JsonSchema for ScrapeBatch {
    fn schema_name() -> Cow<'static, str> {
        MetricBatch::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        MetricBatch::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        MetricBatch::json_schema(generator)
    }
}

/// Serialized as the `MetricBatch` it was read from (without its metric families).
impl Serialize for ScrapeBatch {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_metric_batch().serialize(serializer)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum BatchField {
    Job,
    Instance,
    Families,
    Samples,
    RejectedLines,
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum SampleField {
    Name,
    Labels,
    Value,
    TimestampMs,
    #[serde(other)]
    Other,
}

const BATCH_FIELDS: &[&str] = &["job", "instance", "families", "samples", "rejected_lines"];
const SAMPLE_FIELDS: &[&str] = &["name", "labels", "value", "timestamp_ms"];

impl<'de> Deserialize<'de> for ScrapeBatch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct("MetricBatch", BATCH_FIELDS, BatchVisitor)
    }
}

struct BatchVisitor;

impl<'de> Visitor<'de> for BatchVisitor {
    type Value = ScrapeBatch;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a MetricBatch")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ScrapeBatch, A::Error> {
        let mut out = ScrapeBatch::default();
        let (mut job, mut samples) = (false, false);
        let (mut instance, mut families, mut rejected) = (false, false, false);
        // a field given twice is an error, as the derived decoder has it
        let once = |seen: &mut bool, name: &'static str| {
            if std::mem::replace(seen, true) {
                Err(de::Error::duplicate_field(name))
            } else {
                Ok(())
            }
        };
        while let Some(field) = map.next_key::<BatchField>()? {
            match field {
                BatchField::Job => {
                    once(&mut job, "job")?;
                    out.job = map.next_value()?;
                }
                BatchField::Instance => {
                    once(&mut instance, "instance")?;
                    out.instance = map.next_value()?;
                }
                BatchField::Samples => {
                    once(&mut samples, "samples")?;
                    map.next_value_seed(SamplesSeed(&mut out))?;
                }
                BatchField::RejectedLines => {
                    once(&mut rejected, "rejected_lines")?;
                    out.rejected_lines = map.next_value()?;
                }
                BatchField::Families => {
                    once(&mut families, "families")?;
                    // checked as the owned decoder checks them, then dropped
                    map.next_value::<Vec<MetricFamily>>()?;
                }
                BatchField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !job {
            return Err(de::Error::missing_field("job"));
        }
        if !samples {
            return Err(de::Error::missing_field("samples"));
        }
        Ok(out)
    }

    /// The positional form (`rmp_serde::to_vec`, fields in declaration order).
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ScrapeBatch, A::Error> {
        let mut out = ScrapeBatch {
            job: seq
                .next_element()?
                .ok_or_else(|| de::Error::invalid_length(0, &self))?,
            // as the derived decoder: fields with a default may be left off the end
            instance: seq.next_element()?.unwrap_or_default(),
            ..Default::default()
        };
        seq.next_element::<Vec<MetricFamily>>()?;
        seq.next_element_seed(SamplesSeed(&mut out))?
            .ok_or_else(|| de::Error::invalid_length(3, &self))?;
        out.rejected_lines = seq.next_element()?.unwrap_or_default();
        if seq.next_element::<IgnoredAny>()?.is_some() {
            return Err(de::Error::invalid_length(6, &"5 fields"));
        }
        Ok(out)
    }
}

struct SamplesSeed<'b>(&'b mut ScrapeBatch);

impl<'de> DeserializeSeed<'de> for SamplesSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for SamplesSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of samples")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if let Some(n) = seq.size_hint() {
            // a hint from the message's own header: bounded by what its bytes can hold
            self.0.rows.reserve(n.min(1 << 16));
        }
        while seq.next_element_seed(SampleSeed(&mut *self.0))?.is_some() {}
        Ok(())
    }
}

struct SampleSeed<'b>(&'b mut ScrapeBatch);

impl<'de> DeserializeSeed<'de> for SampleSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_struct("Sample", SAMPLE_FIELDS, self)
    }
}

impl SampleSeed<'_> {
    fn finish<E: de::Error>(
        self,
        name: Option<Span>,
        labels: Option<RowLabels>,
        value: Option<f64>,
        timestamp_ms: Option<i64>,
    ) -> Result<(), E> {
        let row = Row {
            name: name.ok_or_else(|| E::missing_field("name"))?,
            labels: labels.ok_or_else(|| E::missing_field("labels"))?,
            value: value.ok_or_else(|| E::missing_field("value"))?,
            timestamp_ms: timestamp_ms.ok_or_else(|| E::missing_field("timestamp_ms"))?,
            ident: (0, 0),
        };
        self.0.rows.push(row);
        Ok(())
    }
}

impl<'de> Visitor<'de> for SampleSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Sample")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (mut name, mut labels, mut value, mut ts) = (None, None, None, None);
        fn once<T, E: de::Error>(slot: &Option<T>, name: &'static str) -> Result<(), E> {
            match slot {
                Some(_) => Err(E::duplicate_field(name)),
                None => Ok(()),
            }
        }
        while let Some(field) = map.next_key::<SampleField>()? {
            match field {
                SampleField::Name => {
                    once(&name, "name")?;
                    name = Some(map.next_value_seed(Text(&mut *self.0))?);
                }
                SampleField::Labels => {
                    once(&labels, "labels")?;
                    labels = Some(map.next_value_seed(Labels(&mut *self.0))?);
                }
                SampleField::Value => {
                    once(&value, "value")?;
                    value = Some(map.next_value()?);
                }
                SampleField::TimestampMs => {
                    once(&ts, "timestamp_ms")?;
                    ts = Some(map.next_value()?);
                }
                SampleField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        self.finish(name, labels, value, ts)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let name = seq.next_element_seed(Text(&mut *self.0))?;
        let labels = seq.next_element_seed(Labels(&mut *self.0))?;
        let value = seq.next_element()?;
        let ts = seq.next_element()?;
        if seq.next_element::<IgnoredAny>()?.is_some() {
            return Err(de::Error::invalid_length(5, &"4 fields"));
        }
        self.finish(name, labels, value, ts)
    }
}

/// A string appended to the batch's text; yields its span.
struct Text<'b>(&'b mut ScrapeBatch);

impl<'de> DeserializeSeed<'de> for Text<'_> {
    type Value = Span;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Span, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Text<'_> {
    type Value = Span;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Span, E> {
        push_text(self.0, v)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Span, E> {
        // what `String` accepts too: bytes that are valid UTF-8
        match std::str::from_utf8(v) {
            Ok(s) => push_text(self.0, s),
            Err(_) => Err(E::invalid_value(de::Unexpected::Bytes(v), &self)),
        }
    }
}

fn push_text<E: de::Error>(batch: &mut ScrapeBatch, s: &str) -> Result<Span, E> {
    batch
        .push_text(s)
        .ok_or_else(|| E::custom("batch text exceeds 4 GiB"))
}

/// A sample's label map appended to the batch's pairs; yields its range.
struct Labels<'b>(&'b mut ScrapeBatch);

impl<'de> DeserializeSeed<'de> for Labels<'_> {
    type Value = RowLabels;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<RowLabels, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Labels<'_> {
    type Value = RowLabels;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of label names to values")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RowLabels, A::Error> {
        let batch = self.0;
        let from = batch.pairs.len();
        while let Some(k) = map.next_key_seed(Text(&mut *batch))? {
            let v = map.next_value_seed(Text(&mut *batch))?;
            batch.pairs.push((k, v));
        }
        normalize_labels(&mut batch.pairs, &batch.text, from);
        let to = batch.pairs.len();
        if to > u32::MAX as usize {
            return Err(de::Error::custom("too many labels in one batch"));
        }
        Ok(RowLabels::Pairs(from as u32, to as u32))
    }
}

/// A MessagePack reader for the one shape the agent writes: the envelope (a map) around a `MetricBatch`
/// (a map), its samples (maps) and their labels (a map of strings). Every function returns `None` on
/// anything else (another type, a truncated body, invalid UTF-8, a field twice, trailing bytes), and the
/// caller then decodes with serde, which accepts or refuses the message with its reason: this reader never
/// decides that a message is bad, it only reads the good ones faster.
pub(crate) mod fast {
    use chrono::{DateTime, Utc};
    use multipilot_schemas::envelope::Envelope;

    use super::{Row, RowLabels, ScrapeBatch, Span, TextBuf, normalize_labels};

    /// Nesting a skipped value may have.
    const MAX_DEPTH: usize = 32;

    struct Reader<'a> {
        buf: &'a [u8],
    }

    impl<'a> Reader<'a> {
        fn byte(&mut self) -> Option<u8> {
            let (&b, rest) = self.buf.split_first()?;
            self.buf = rest;
            Some(b)
        }

        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if n > self.buf.len() {
                return None;
            }
            let (head, rest) = self.buf.split_at(n);
            self.buf = rest;
            Some(head)
        }

        fn be<const N: usize>(&mut self) -> Option<[u8; N]> {
            self.take(N)?.try_into().ok()
        }

        fn len(&mut self, marker: u8, fix: (u8, u8), w8: u8, w16: u8, w32: u8) -> Option<usize> {
            Some(match marker {
                m if (fix.0..=fix.1).contains(&m) => (m - fix.0) as usize,
                m if m == w8 && w8 != 0 => self.byte()? as usize,
                m if m == w16 => u16::from_be_bytes(self.be()?) as usize,
                m if m == w32 => u32::from_be_bytes(self.be()?) as usize,
                _ => return None,
            })
        }

        fn str(&mut self) -> Option<&'a str> {
            std::str::from_utf8(self.raw_str()?).ok()
        }

        /// A string's bytes, not checked to be UTF-8 (the caller checks them).
        fn raw_str(&mut self) -> Option<&'a [u8]> {
            let m = self.byte()?;
            let n = self.len(m, (0xa0, 0xbf), 0xd9, 0xda, 0xdb)?;
            self.take(n)
        }

        fn map(&mut self) -> Option<usize> {
            let m = self.byte()?;
            self.len(m, (0x80, 0x8f), 0, 0xde, 0xdf)
        }

        fn array(&mut self) -> Option<usize> {
            let m = self.byte()?;
            self.len(m, (0x90, 0x9f), 0, 0xdc, 0xdd)
        }

        /// An integer of any width, as i128 (covers u64 and i64).
        fn int(&mut self) -> Option<i128> {
            Some(match self.byte()? {
                m @ 0x00..=0x7f => m as i128,
                m @ 0xe0..=0xff => m as i8 as i128,
                0xcc => self.byte()? as i128,
                0xcd => u16::from_be_bytes(self.be()?) as i128,
                0xce => u32::from_be_bytes(self.be()?) as i128,
                0xcf => u64::from_be_bytes(self.be()?) as i128,
                0xd0 => self.byte()? as i8 as i128,
                0xd1 => i16::from_be_bytes(self.be()?) as i128,
                0xd2 => i32::from_be_bytes(self.be()?) as i128,
                0xd3 => i64::from_be_bytes(self.be()?) as i128,
                _ => return None,
            })
        }

        fn f64(&mut self) -> Option<f64> {
            match self.buf.first()? {
                0xcb => {
                    self.byte()?;
                    Some(f64::from_be_bytes(self.be()?))
                }
                0xca => {
                    self.byte()?;
                    Some(f32::from_be_bytes(self.be()?) as f64)
                }
                // serde reads an integer into an f64 too
                _ => self.int().map(|i| i as f64),
            }
        }

        fn skip(&mut self, depth: usize) -> Option<()> {
            if depth > MAX_DEPTH {
                return None;
            }
            let m = self.byte()?;
            let n = match m {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
                0x80..=0x8f | 0xde | 0xdf => {
                    let n = self.len(m, (0x80, 0x8f), 0, 0xde, 0xdf)?;
                    for _ in 0..n.checked_mul(2)? {
                        self.skip(depth + 1)?;
                    }
                    return Some(());
                }
                0x90..=0x9f | 0xdc | 0xdd => {
                    let n = self.len(m, (0x90, 0x9f), 0, 0xdc, 0xdd)?;
                    for _ in 0..n {
                        self.skip(depth + 1)?;
                    }
                    return Some(());
                }
                0xa0..=0xbf | 0xd9..=0xdb => self.len(m, (0xa0, 0xbf), 0xd9, 0xda, 0xdb)?,
                0xc4 => self.byte()? as usize,
                0xc5 => u16::from_be_bytes(self.be()?) as usize,
                0xc6 => u32::from_be_bytes(self.be()?) as usize,
                0xc7 => self.byte()? as usize + 1,
                0xc8 => u16::from_be_bytes(self.be()?) as usize + 1,
                0xc9 => u32::from_be_bytes(self.be()?) as usize + 1,
                0xca => 4,
                0xcb => 8,
                0xcc | 0xd0 => 1,
                0xcd | 0xd1 => 2,
                0xce | 0xd2 => 4,
                0xcf | 0xd3 => 8,
                0xd4 => 2,
                0xd5 => 3,
                0xd6 => 5,
                0xd7 => 9,
                0xd8 => 17,
                _ => return None,
            };
            self.take(n).map(|_| ())
        }
    }

    /// Marks a field seen; `None` when it was seen already.
    fn once(seen: &mut bool) -> Option<()> {
        (!std::mem::replace(seen, true)).then_some(())
    }

    /// The envelope around a batch, or `None` to leave the message to serde.
    pub(crate) fn envelope(body: &[u8]) -> Option<Envelope<ScrapeBatch>> {
        envelope_in(body, None)
    }

    /// [`envelope`] of the message's own buffer, which the batch keeps as its text instead of a copy.
    pub(crate) fn envelope_shared(body: &bytes::Bytes) -> Option<Envelope<ScrapeBatch>> {
        envelope_in(body, Some(body))
    }

    /// The envelope, the batch's text `shared` when given (the same bytes as `body`), else a copy.
    fn envelope_in(body: &[u8], shared: Option<&bytes::Bytes>) -> Option<Envelope<ScrapeBatch>> {
        if body.len() > u32::MAX as usize {
            return None;
        }
        let mut r = Reader { buf: body };
        let (mut schema, mut version, mut cluster, mut source) = (None, None, None, None);
        let (mut cluster_time, mut agent_time, mut seq, mut payload) = (None, None, None, None);
        fn set<T>(slot: &mut Option<T>, v: T) -> Option<()> {
            slot.is_none().then(|| *slot = Some(v))
        }
        fn time(s: &str) -> Option<DateTime<Utc>> {
            // what chrono's serde does
            s.parse().ok()
        }
        for _ in 0..r.map()? {
            match r.str()? {
                "schema" => set(&mut schema, r.str()?.to_string())?,
                "version" => set(&mut version, u32::try_from(r.int()?).ok()?)?,
                "cluster" => set(&mut cluster, r.str()?.to_string())?,
                "source" => set(&mut source, r.str()?.to_string())?,
                "cluster_time" => set(&mut cluster_time, time(r.str()?)?)?,
                "agent_time" => set(&mut agent_time, time(r.str()?)?)?,
                "seq" => set(&mut seq, u64::try_from(r.int()?).ok()?)?,
                "payload" => set(&mut payload, batch(&mut r, body, shared)?)?,
                _ => r.skip(0)?,
            }
        }
        if !r.buf.is_empty() {
            return None;
        }
        Some(Envelope {
            schema: schema?,
            version: version?,
            cluster: cluster?,
            source: source?,
            cluster_time: cluster_time?,
            agent_time: agent_time?,
            seq: seq?,
            payload: payload?,
        })
    }

    /// Whether `s` is UTF-8: the usual ASCII label checked inline, anything else by the standard library
    /// (called for each of a batch's ~5,000 short strings, `from_utf8` alone was a tenth of the ingest time).
    fn utf8(s: &[u8]) -> Option<()> {
        (s.is_ascii() || std::str::from_utf8(s).is_ok()).then_some(())
    }

    /// Where the reader is in `body` (a rest of it), as a span's offset; `None` past 4 GiB.
    fn at(body: &[u8], r: &Reader<'_>) -> Option<u32> {
        u32::try_from(body.len() - r.buf.len()).ok()
    }

    /// The span of the string just read, which ended where the reader is.
    fn span_before(body: &[u8], r: &Reader<'_>, s: &[u8]) -> Option<Span> {
        let to = at(body, r)?;
        Some((to - s.len() as u32, to))
    }

    /// The batch, the reader at its start in `body`. Its text is `body` itself: every name and label a span
    /// of it, no string copied.
    fn batch(
        r: &mut Reader<'_>,
        body: &[u8],
        shared: Option<&bytes::Bytes>,
    ) -> Option<ScrapeBatch> {
        let mut out = ScrapeBatch {
            text: match shared {
                Some(shared) => TextBuf::Shared(shared.clone()),
                None => TextBuf::Owned(body.to_vec()),
            },
            ..Default::default()
        };
        let (mut job, mut instance, mut families, mut samples, mut rejected) =
            (false, false, false, false, false);
        for _ in 0..r.map()? {
            match r.str()? {
                "job" => {
                    once(&mut job)?;
                    out.job = r.str()?.to_string();
                }
                "instance" => {
                    once(&mut instance)?;
                    out.instance = r.str()?.to_string();
                }
                "families" => {
                    once(&mut families)?;
                    for _ in 0..r.array()? {
                        family(r)?;
                    }
                }
                "samples" => {
                    once(&mut samples)?;
                    let n = r.array()?;
                    // each sample takes more than 8 bytes of the body
                    out.rows.reserve(n.min(body.len() / 8));
                    for _ in 0..n {
                        sample(r, &mut out, body)?;
                    }
                }
                "rejected_lines" => {
                    once(&mut rejected)?;
                    out.rejected_lines = u64::try_from(r.int()?).ok()?;
                }
                _ => r.skip(0)?,
            }
        }
        (job && samples).then_some(out)
    }

    /// A metric family, checked as `MetricFamily` decodes (`name` and a known `type` required, `help` a
    /// string when given) and dropped.
    fn family(r: &mut Reader<'_>) -> Option<()> {
        let (mut name, mut type_, mut help) = (false, false, false);
        for _ in 0..r.map()? {
            match r.str()? {
                "name" => {
                    once(&mut name)?;
                    r.str()?;
                }
                "type" => {
                    once(&mut type_)?;
                    matches!(
                        r.str()?,
                        "counter" | "gauge" | "histogram" | "summary" | "untyped"
                    )
                    .then_some(())?;
                }
                "help" => {
                    once(&mut help)?;
                    r.str()?;
                }
                _ => r.skip(0)?,
            }
        }
        (name && type_).then_some(())
    }

    /// The labels of the map at `map` in `text` (checked by the reader that found it), sorted by name,
    /// a name given twice keeping its last value. Empty if it is not such a map (never: the reader
    /// checked it).
    pub(super) fn label_map(text: &[u8], map: Span) -> Vec<(Span, Span)> {
        let Some(bytes) = text.get(map.0 as usize..map.1 as usize) else {
            debug_assert!(false, "a label map's span out of its text");
            return Vec::new();
        };
        let mut r = Reader { buf: bytes };
        let read = |r: &mut Reader<'_>| -> Option<Span> {
            let s = r.raw_str()?;
            utf8(s)?;
            let to = map.0 + u32::try_from(bytes.len() - r.buf.len()).ok()?;
            Some((to - s.len() as u32, to))
        };
        let mut pairs = Vec::new();
        let Some(n) = r.map() else {
            debug_assert!(false, "a label map that is not a map");
            return pairs;
        };
        pairs.reserve(n.min(bytes.len() / 2));
        for _ in 0..n {
            match (read(&mut r), read(&mut r)) {
                (Some(k), Some(v)) => pairs.push((k, v)),
                _ => {
                    debug_assert!(false, "a label map the reader did not check");
                    return Vec::new();
                }
            }
        }
        normalize_labels(&mut pairs, text, 0);
        pairs
    }

    /// One sample. Its spelling ([`Row::ident`]) is the run of the body from its name to the end of its
    /// labels when the labels come right after the name (as the agent writes them, the `labels` key
    /// between them); otherwise the two copied one after the other to the end of the text.
    fn sample(r: &mut Reader<'_>, out: &mut ScrapeBatch, body: &[u8]) -> Option<()> {
        let (mut name, mut labels, mut value, mut ts) = (None, None, None, None);
        // where the name's value and the labels' map start and end in the body
        let (mut name_run, mut labels_run): (Option<Span>, Option<Span>) = (None, None);
        let mut labels_key_at = 0;
        for _ in 0..r.map()? {
            let key_at = at(body, r)?;
            match r.raw_str()? {
                b"name" => {
                    name.is_none().then_some(())?;
                    let from = at(body, r)?;
                    let s = r.raw_str()?;
                    utf8(s)?;
                    name = Some(span_before(body, r, s)?);
                    name_run = Some((from, at(body, r)?));
                }
                b"labels" => {
                    labels.is_none().then_some(())?;
                    labels_key_at = key_at;
                    let start = at(body, r)?;
                    // checked, not read: see `RowLabels::Map`
                    for _ in 0..r.map()?.checked_mul(2)? {
                        utf8(r.raw_str()?)?;
                    }
                    let run = (start, at(body, r)?);
                    labels = Some(RowLabels::Map(run));
                    labels_run = Some(run);
                }
                b"value" => {
                    value.is_none().then_some(())?;
                    value = Some(r.f64()?);
                }
                b"timestamp_ms" => {
                    ts.is_none().then_some(())?;
                    ts = Some(i64::try_from(r.int()?).ok()?);
                }
                other => {
                    // a key serde would refuse is left to serde
                    std::str::from_utf8(other).ok()?;
                    r.skip(0)?
                }
            }
        }
        let (name_run, labels_run) = (name_run?, labels_run?);
        let ident = if name_run.1 == labels_key_at {
            (name_run.0, labels_run.1)
        } else {
            let from = u32::try_from(out.text.len()).ok()?;
            for (a, b) in [name_run, labels_run] {
                out.text
                    .owned()
                    .extend_from_slice(&body[a as usize..b as usize]);
            }
            (from, u32::try_from(out.text.len()).ok()?)
        };
        out.rows.push(Row {
            name: name?,
            labels: labels?,
            value: value?,
            timestamp_ms: ts?,
            ident,
        });
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use multipilot_schemas::envelope::Envelope;
    use multipilot_schemas::payload::{MetricFamily, MetricType};

    use super::*;

    fn sample(name: &str, labels: &[(&str, &str)], value: f64, t: i64) -> Sample {
        Sample::new(name, labels, value, t)
    }

    fn batch() -> MetricBatch {
        MetricBatch {
            job: "kube-state-metrics".into(),
            instance: "10.0.0.7:8080".into(),
            families: vec![MetricFamily {
                name: "kube_pod_info".into(),
                type_: MetricType::Gauge,
                help: "Information about pod.".into(),
            }],
            samples: vec![
                sample(
                    "kube_pod_info",
                    &[("namespace", "shop"), ("pod", "web-0"), ("node", "n1")],
                    1.0,
                    1_700_000_000_000,
                ),
                sample("up", &[], f64::NAN, 1_700_000_000_001),
                sample("é_unicode", &[("ünï", "çødé")], -2.5, -1),
            ],
            rejected_lines: 3,
        }
    }

    #[test]
    fn reads_what_the_owned_decoder_reads() {
        let b = batch();
        for bytes in [
            rmp_serde::to_vec_named(&b).unwrap(),
            rmp_serde::to_vec(&b).unwrap(),
        ] {
            let got: ScrapeBatch = rmp_serde::from_slice(&bytes).expect("decodes");
            let mut want = b.clone();
            want.families.clear();
            let back = got.to_metric_batch();
            assert_eq!(back.job, want.job);
            assert_eq!(back.instance, want.instance);
            assert_eq!(back.rejected_lines, 3);
            assert_eq!(back.samples.len(), 3);
            for (g, w) in back.samples.iter().zip(&want.samples) {
                assert_eq!(g.name, w.name);
                assert_eq!(g.labels, w.labels);
                assert_eq!(g.timestamp_ms, w.timestamp_ms);
                assert_eq!(g.value.to_bits(), w.value.to_bits());
            }
        }
    }

    #[test]
    fn the_envelope_decodes_through_the_contract() {
        let env = Envelope::new("c1", "agent-c1", chrono::Utc::now(), 7, batch());
        let bytes = multipilot_schemas::encode(&env).unwrap();
        let got: Envelope<ScrapeBatch> = multipilot_schemas::decode(
            Some(multipilot_schemas::CONTENT_TYPE_MSGPACK),
            Some(&MetricBatch::schema_header()),
            &bytes,
            multipilot_schemas::codec::DEFAULT_MAX_BYTES,
        )
        .expect("decodes");
        assert_eq!(got.cluster, "c1");
        assert_eq!(got.payload.len(), 3);
        assert_eq!(
            got.payload
                .samples()
                .next()
                .unwrap()
                .labels()
                .collect::<Vec<_>>(),
            vec![("namespace", "shop"), ("node", "n1"), ("pod", "web-0")]
        );
    }

    /// A producer writing its own MessagePack may send labels unsorted and a name twice: sorted, the last
    /// value kept, as a map keeps it.
    #[test]
    fn unsorted_and_repeated_labels_are_normalised() {
        // MessagePack written by hand (a map can't hold a name twice): fixmap, fixstr, positive fixint
        fn map(buf: &mut Vec<u8>, n: u8) {
            buf.push(0x80 | n);
        }
        fn text(buf: &mut Vec<u8>, s: &str) {
            match s.len() {
                n @ 0..32 => buf.push(0xa0 | n as u8),
                n => buf.extend_from_slice(&[0xd9, n as u8]), // str8
            }
            buf.extend_from_slice(s.as_bytes());
        }
        let long = "v".repeat(40);
        let mut buf = Vec::new();
        map(&mut buf, 3);
        text(&mut buf, "job");
        text(&mut buf, "j");
        text(&mut buf, "extra");
        buf.push(1);
        text(&mut buf, "samples");
        buf.push(0x91); // fixarray of 1
        map(&mut buf, 5);
        text(&mut buf, "labels");
        map(&mut buf, 5);
        for (k, v) in [("z", "1"), ("a", "2"), ("z", "3"), ("m", "4"), ("l", &long)] {
            text(&mut buf, k);
            text(&mut buf, v);
        }
        text(&mut buf, "name");
        text(&mut buf, "x");
        text(&mut buf, "comment");
        text(&mut buf, "ignored");
        text(&mut buf, "value");
        buf.push(5);
        text(&mut buf, "timestamp_ms");
        buf.extend_from_slice(&[0xcd, 0x03, 0xe8]); // uint16 1000
        let got: ScrapeBatch = rmp_serde::from_slice(&buf).expect("decodes");
        let owned: MetricBatch = rmp_serde::from_slice(&buf).expect("the owned form decodes too");
        let s = got.samples().next().unwrap();
        let sorted = vec![("a", "2"), ("l", long.as_str()), ("m", "4"), ("z", "3")];
        assert_eq!(s.labels().collect::<Vec<_>>(), sorted);
        let want: BTreeMap<String, String> = owned.samples[0].labels.clone();
        assert_eq!(got.to_metric_batch().samples[0].labels, want);
        assert_eq!(s.value(), 5.0);
        // the fast reader, in an envelope: the labels read when asked for, the same
        let mut env = Vec::new();
        map(&mut env, 8);
        let now = chrono::Utc::now().to_rfc3339();
        for (k, v) in [
            ("schema", ScrapeBatch::SCHEMA),
            ("cluster", "c1"),
            ("source", "a"),
            ("cluster_time", &now),
            ("agent_time", &now),
        ] {
            text(&mut env, k);
            text(&mut env, v);
        }
        text(&mut env, "version");
        env.push(ScrapeBatch::VERSION as u8);
        text(&mut env, "seq");
        env.push(1);
        text(&mut env, "payload");
        env.extend_from_slice(&buf);
        let fast = fast::envelope(&env).expect("read by the fast reader");
        let s = fast.payload.samples().next().unwrap();
        assert!(matches!(s.row.labels, RowLabels::Map(_)));
        assert_eq!(s.labels().collect::<Vec<_>>(), sorted);
        assert!(same(&fast, &rmp_serde::from_slice(&env).expect("serde")));
    }

    #[test]
    fn label_names_compare_as_bytes_do() {
        let names: [&[u8]; 8] = [b"", b"a", b"ab", b"abc", b"b", b"\xc3\xa9", b"job", b"jobs"];
        for a in names {
            for b in names {
                assert_eq!(less(a, b), a < b, "{a:?} {b:?}");
            }
        }
    }

    /// What the owned decoder refuses, this one refuses: missing required fields, wrong types.
    #[test]
    fn refuses_what_the_owned_decoder_refuses() {
        let cases: Vec<serde_json::Value> = vec![
            serde_json::json!({"samples": []}),
            serde_json::json!({"job": "j"}),
            serde_json::json!({"job": "j", "samples": [{"name": "x", "value": 1.0, "timestamp_ms": 1}]}),
            serde_json::json!({"job": "j", "samples": [{"name": "x", "labels": {}, "timestamp_ms": 1}]}),
            serde_json::json!({"job": "j", "samples": [{"labels": {}, "value": 1.0, "timestamp_ms": 1}]}),
            serde_json::json!({"job": "j", "samples": [{"name": "x", "labels": {}, "value": 1.0}]}),
            serde_json::json!({"job": "j", "samples": [{"name": 3, "labels": {}, "value": 1.0, "timestamp_ms": 1}]}),
            serde_json::json!({"job": "j", "samples": [{"name": "x", "labels": {"a": 1}, "value": 1.0, "timestamp_ms": 1}]}),
            serde_json::json!({"job": "j", "samples": [{"name": "x", "labels": [], "value": "1", "timestamp_ms": 1}]}),
            serde_json::json!({"job": "j", "samples": {}}),
            serde_json::json!({"job": "j", "families": 5, "samples": []}),
            serde_json::json!({"job": "j", "families": [{"name": "x", "type": "info"}], "samples": []}),
            serde_json::json!({"job": "j", "families": [{"type": "gauge"}], "samples": []}),
            serde_json::json!({"job": "j", "families": [{"name": "x"}], "samples": []}),
            serde_json::json!({"job": "j", "families": [{"name": "x", "type": "gauge", "help": 1}], "samples": []}),
            serde_json::json!(["j", "i", [], [], 0, "extra"]),
            serde_json::json!(["j", "i", [], [["x", {}, 1.0, 1, "extra"]], 0]),
        ];
        for case in cases {
            let bytes = rmp_serde::to_vec_named(&case).unwrap();
            assert!(
                rmp_serde::from_slice::<MetricBatch>(&bytes).is_err(),
                "owned accepts {case}"
            );
            assert!(
                rmp_serde::from_slice::<ScrapeBatch>(&bytes).is_err(),
                "compact accepts {case}"
            );
        }
        // and a truncated message
        let bytes = rmp_serde::to_vec_named(&batch()).unwrap();
        for cut in [1, bytes.len() / 2, bytes.len() - 1] {
            assert!(rmp_serde::from_slice::<ScrapeBatch>(&bytes[..cut]).is_err());
        }
    }

    /// The same decoded envelope (values compared by their bits: NaN is a value here).
    fn same(a: &Envelope<ScrapeBatch>, b: &Envelope<ScrapeBatch>) -> bool {
        let (p, q) = (&a.payload, &b.payload);
        (
            &a.schema,
            a.version,
            &a.cluster,
            &a.source,
            a.cluster_time,
            a.agent_time,
            a.seq,
        ) == (
            &b.schema,
            b.version,
            &b.cluster,
            &b.source,
            b.cluster_time,
            b.agent_time,
            b.seq,
        ) && (&p.job, &p.instance, p.rejected_lines) == (&q.job, &q.instance, q.rejected_lines)
            && p.len() == q.len()
            && p.samples().zip(q.samples()).all(|(x, y)| {
                (x.name(), x.timestamp_ms(), x.value().to_bits())
                    == (y.name(), y.timestamp_ms(), y.value().to_bits())
                    && x.labels().eq(y.labels())
            })
    }

    /// The fast reader reads the agent's messages as serde does, and never accepts what serde refuses:
    /// every truncation and many single-byte corruptions of a real-shaped message either fall back to
    /// serde (`None`) or decode to exactly what serde decodes.
    #[test]
    fn the_fast_reader_agrees_with_serde() {
        let mut b = batch();
        b.samples
            .push(sample("big", &[("v", &"x".repeat(300))], 1e300, i64::MAX));
        b.samples
            .push(sample("neg", &[], f64::NEG_INFINITY, i64::MIN));
        let env = Envelope::new("c1", "agent-c1", chrono::Utc::now(), u64::MAX, b);
        let body = multipilot_schemas::encode(&env).unwrap();
        let fast = fast::envelope(&body).expect("the agent's own form is read fast");
        let serde: Envelope<ScrapeBatch> = rmp_serde::from_slice(&body).unwrap();
        assert!(same(&fast, &serde));
        let check = |bytes: &[u8]| {
            // and the compact decoder accepts exactly what the owned one accepts
            let owned = rmp_serde::from_slice::<Envelope<MetricBatch>>(bytes);
            let compact = rmp_serde::from_slice::<Envelope<ScrapeBatch>>(bytes);
            assert_eq!(
                owned.is_ok(),
                compact.is_ok(),
                "owned {:?} vs compact {:?}",
                owned.err(),
                compact.err()
            );
            if let Some(f) = fast::envelope(bytes) {
                let s = rmp_serde::from_slice::<Envelope<ScrapeBatch>>(bytes)
                    .unwrap_or_else(|e| panic!("fast accepted what serde refuses ({e})"));
                assert!(same(&f, &s), "fast and serde disagree");
            }
        };
        for cut in 0..body.len() {
            check(&body[..cut]);
        }
        let mut bytes = body.clone();
        bytes.push(0xc0);
        check(&bytes);
        for at in 0..body.len() {
            for v in [
                0x00, 0x7f, 0x80, 0x9f, 0xa1, 0xc0, 0xc1, 0xcb, 0xd9, 0xdf, 0xff,
            ] {
                let mut bytes = body.clone();
                bytes[at] = v;
                check(&bytes);
            }
        }
    }

    /// A field given twice fails the message, as with the derived decoder.
    #[test]
    fn a_field_given_twice_is_refused() {
        let case = serde_json::json!({"job": "j", "samples": [{"name": "x", "labels": {}, "value": 1.0, "timestamp_ms": 1}]});
        let mut again: [Vec<u8>; 2] = [b"\xa3job\xa1k".to_vec(), b"\xa7samples\x90".to_vec()];
        for extra in &mut again {
            let mut bytes = rmp_serde::to_vec_named(&case).unwrap();
            // fixmap of 2 → 3, then a field once more
            bytes[0] += 1;
            bytes.append(extra);
            assert!(rmp_serde::from_slice::<MetricBatch>(&bytes).is_err());
            assert!(rmp_serde::from_slice::<ScrapeBatch>(&bytes).is_err());
        }
    }

    /// The sample strings are checked as UTF-8 all at once: a character split between a label's name and
    /// its value (each invalid alone, valid together), or between two values a repeated name drops, is
    /// still refused, as serde refuses it; an unknown
    /// key of a sample that is not UTF-8 is left to serde (which skips it, as the owned decoder does).
    #[test]
    fn strings_checked_together_are_refused_as_when_checked_alone() {
        let env = |labels: &[(&str, &str)]| {
            let b = MetricBatch {
                job: "j".into(),
                instance: "i".into(),
                families: Vec::new(),
                samples: vec![
                    sample("up", &[("a", "1")], 1.0, 5),
                    sample("m", labels, 2.0, 6),
                ],
                rejected_lines: 0,
            };
            multipilot_schemas::encode(&Envelope::new("c1", "a", chrono::Utc::now(), 1, b)).unwrap()
        };
        let replace = |body: &[u8], from: &[u8], to: &[u8]| {
            let at = body
                .windows(from.len())
                .position(|w| w == from)
                .expect("present");
            let mut out = body.to_vec();
            out[at..at + from.len()].copy_from_slice(to);
            out
        };
        let good = env(&[("kA", "Bv")]);
        assert!(fast::envelope(&good).is_some());
        // "k\xc3" + "\xa9v": "é" across the name and value of one label
        let split = replace(&replace(&good, b"kA", b"k\xc3"), b"Bv", b"\xa9v");
        // and the name of the sample ending in the middle of a character
        let name = replace(&env(&[("kA", "v")]), b"\xa1m", b"\xa1\xc3");
        // an unknown key of a sample that is not UTF-8
        let mut with_key = serde_json::to_value(MetricBatch {
            job: "j".into(),
            instance: String::new(),
            families: Vec::new(),
            samples: vec![sample("up", &[], 1.0, 5)],
            rejected_lines: 0,
        })
        .unwrap();
        with_key["samples"][0]["zz"] = serde_json::json!(1);
        let key = rmp_serde::to_vec_named(&with_key).unwrap();
        assert!(rmp_serde::from_slice::<ScrapeBatch>(&key).is_ok());
        let key = replace(&key, b"\xa2zz", b"\xa2z\xff");
        // three labels named "" (a map keeps the last): "\xc3" and "\xa9", dropped, are "é" together
        let dropped = {
            let body = env(&[("a", "1"), ("b", "2"), ("c", "x")]);
            let from: &[u8] = b"\xa1a\xa11\xa1b\xa12\xa1c\xa1x";
            let at = body
                .windows(from.len())
                .position(|w| w == from)
                .expect("present");
            let to: &[u8] = b"\xa0\xa1\xc3\xa0\xa1\xa9\xa0\xa1x";
            [&body[..at], to, &body[at + from.len()..]].concat()
        };
        for bytes in [&split, &name, &dropped] {
            assert!(
                fast::envelope(bytes).is_none(),
                "the fast reader leaves it to serde"
            );
            assert!(rmp_serde::from_slice::<Envelope<MetricBatch>>(bytes).is_err());
            assert!(rmp_serde::from_slice::<Envelope<ScrapeBatch>>(bytes).is_err());
        }
        assert!(rmp_serde::from_slice::<MetricBatch>(&key).is_ok());
        assert_eq!(
            rmp_serde::from_slice::<ScrapeBatch>(&key)
                .map(|b| b.len())
                .ok(),
            Some(1)
        );
    }

    /// Each sample's spelling (its name and label map as the bytes came) is kept for the scrape cache:
    /// the same series spelled the same, another series spelled otherwise.
    #[test]
    fn each_sample_keeps_its_spelling() {
        let env = Envelope::new("c1", "a", chrono::Utc::now(), 1, batch());
        let body = multipilot_schemas::encode(&env).unwrap();
        let got = fast::envelope(&body).expect("fast");
        let idents: Vec<&[u8]> = got.payload.samples().map(|s| s.ident()).collect();
        assert_eq!(idents.len(), 3);
        // "up", the `labels` key and no labels: a fixstr of 2, a fixstr of 6 and an empty fixmap
        assert_eq!(idents[1], b"\xa2up\xa6labels\x80");
        assert!(idents.iter().all(|i| !i.is_empty()));
        assert_ne!(idents[0], idents[2]);
        let again = fast::envelope(&body).expect("fast");
        assert!(again.payload.samples().map(|s| s.ident()).eq(idents));
        // serde's form has none: never cached
        let serde: Envelope<ScrapeBatch> = rmp_serde::from_slice(&body).unwrap();
        assert!(serde.payload.samples().all(|s| s.ident().is_empty()));
    }

    /// A sample whose name and labels are not one run of the message (another producer's field order)
    /// is spelled by the two copied together: the same for the same series whatever its value, another
    /// for another series.
    #[test]
    fn a_spelling_apart_in_the_message_is_put_together() {
        #[derive(Serialize)]
        struct Odd<'a> {
            labels: BTreeMap<&'a str, &'a str>,
            value: f64,
            name: &'a str,
            timestamp_ms: i64,
        }
        #[derive(Serialize)]
        struct OddBatch<'a> {
            job: &'a str,
            instance: &'a str,
            samples: Vec<Odd<'a>>,
        }
        let body = |v: f64| {
            let odd = |name, pod| Odd {
                labels: BTreeMap::from([("pod", pod)]),
                value: v,
                name,
                timestamp_ms: 1000,
            };
            let t = chrono::Utc::now();
            let env = Envelope {
                schema: "MetricBatch".to_string(),
                version: 1,
                cluster: "c1".to_string(),
                source: "a".to_string(),
                cluster_time: t,
                agent_time: t,
                seq: 1,
                payload: OddBatch {
                    job: "j",
                    instance: "i",
                    samples: vec![odd("up", "p1"), odd("up", "p2")],
                },
            };
            rmp_serde::to_vec_named(&env).unwrap()
        };
        let (one, two) = (body(1.0), body(2.0));
        let (a, b) = (
            fast::envelope(&one).expect("fast"),
            fast::envelope(&two).expect("fast"),
        );
        let idents = |e: &Envelope<ScrapeBatch>| -> Vec<Vec<u8>> {
            e.payload.samples().map(|s| s.ident().to_vec()).collect()
        };
        assert_eq!(idents(&a)[0], b"\xa2up\x81\xa3pod\xa2p1");
        assert_eq!(idents(&a), idents(&b));
        assert_ne!(idents(&a)[0], idents(&a)[1]);
        let s = a.payload.samples().nth(1).unwrap();
        assert_eq!(
            (s.name(), s.labels().collect::<Vec<_>>()),
            ("up", vec![("pod", "p2")])
        );
        assert!(same(&a, &rmp_serde::from_slice(&one).unwrap()));
        // read from the message's own buffer, the spelling put together is the batch's own copy
        let shared = fast::envelope_shared(&bytes::Bytes::from(one.clone())).expect("fast");
        assert_eq!(idents(&shared), idents(&a));
        assert!(same(&shared, &a));
        assert!(matches!(shared.payload.text, TextBuf::Owned(_)));
    }

    #[test]
    fn the_message_buffer_is_the_text_not_a_copy() {
        let env = Envelope::new("c1", "agent-c1", chrono::Utc::now(), 7, batch());
        let body = bytes::Bytes::from(multipilot_schemas::encode(&env).unwrap());
        let shared: Envelope<ScrapeBatch> = multipilot_schemas::decode_shared(
            Some(multipilot_schemas::CONTENT_TYPE_MSGPACK),
            Some(&MetricBatch::schema_header()),
            &body,
            usize::MAX,
        )
        .expect("decodes");
        match &shared.payload.text {
            TextBuf::Shared(text) => assert_eq!(text.as_ptr(), body.as_ptr()),
            TextBuf::Owned(_) => panic!("the body was copied"),
        }
        let copied = fast::envelope(&body).expect("fast");
        assert!(matches!(copied.payload.text, TextBuf::Owned(_)));
        assert!(same(&shared, &copied));
        assert_eq!(shared.payload.to_metric_batch().samples.len(), 3);
    }
}
