//! A hand-written parser of the Prometheus text exposition format (0.0.4) and of the OpenMetrics text
//! subset real scrapes use, producing the contract's [`MetricFamily`] and [`Sample`] values.
//!
//! What it accepts:
//!
//! - `# HELP name text` (escapes `\\` and `\n`; in OpenMetrics bodies also `\"`), `# TYPE name type` with
//!   `counter`, `gauge`, `histogram`, `summary`, `untyped`, `unknown`, `info`, `stateset` and
//!   `gaugehistogram`; any other `#` line is a comment; `# EOF` ends the body.
//! - Sample lines `name{label="value",...} value [timestamp] [# exemplar]`: label values with the escapes
//!   `\"`, `\\` and `\n` (any other escape is kept as written), a trailing comma in the label set, spaces
//!   and tabs between tokens, values `NaN`, `+Inf`, `-Inf`, `Inf`, integers and scientific notation.
//!   Exemplars (` # {...} ...`) are ignored.
//! - Timestamps: a body that carries the OpenMetrics `# EOF` marker has its timestamps read as seconds
//!   (fractions allowed, e.g. `1520879607.789`); any other body is Prometheus text, whose timestamps are
//!   milliseconds. A sample without a timestamp gets the caller's default.
//!
//! Every sample is attached to a family: the family declared with exactly its name if there is one,
//! otherwise the family it is a part of by suffix (`_bucket`, `_sum`, `_count`, `_created` of a histogram;
//! `_sum`, `_count`, `_created` of a summary; `_total`, `_created` of a counter; `_gcount`, `_gsum` of a
//! gauge histogram; `_info` of an info), otherwise a new `untyped` family of its own name. Families are
//! listed once, in order of first appearance (metadata line or sample).
//!
//! A line that cannot be parsed never stops the parse: it becomes a [`Rejected`] with its line number and
//! the reason, and parsing goes on with the next line. The body is never copied; only names, label pairs
//! and help texts are allocated.

use std::collections::{BTreeMap, HashMap};

use multipilot_schemas::payload::{MetricBatch, MetricFamily, MetricType, Sample};

/// Result of parsing one scrape body.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// Metric families, once each, in order of first appearance.
    pub families: Vec<MetricFamily>,
    /// Samples, in body order.
    pub samples: Vec<Sample>,
    /// Lines that could not be parsed.
    pub rejected: Vec<Rejected>,
}

/// A line that could not be parsed, with its 1-based line number and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    /// 1-based line number in the body.
    pub line: usize,
    /// Why the line was rejected, for a person (columns are 1-based, counted in characters).
    pub reason: String,
}

/// Parse `body`.
///
/// `default_ts_ms` is used for samples without a timestamp. `extra_labels` (e.g. `cluster="prod-1"`) are
/// added to every sample and always win, like Prometheus with `honor_labels: false`: when the scraped
/// sample already has a non-empty label of the same name, the scraped value is kept under
/// `exported_<name>` (prefixed with `exported_` again until the name is free). A scraped label with an
/// empty value counts as absent and is simply replaced.
pub fn parse(body: &str, default_ts_ms: i64, extra_labels: &BTreeMap<String, String>) -> Parsed {
    let body = body.strip_prefix('\u{feff}').unwrap_or(body);
    let mut parser = Parser {
        openmetrics: has_eof_marker(body),
        default_ts_ms,
        extra_labels,
        index: HashMap::new(),
        out: Parsed {
            families: Vec::new(),
            samples: Vec::new(),
            rejected: Vec::new(),
        },
    };

    let mut lines = body.split('\n').enumerate();
    while let Some((i, raw)) = lines.next() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let start = line.len() - line.trim_start_matches(WS).len();
        if line[start..].trim_end_matches(WS).is_empty() {
            continue;
        }
        let outcome = if line.as_bytes()[start] == b'#' {
            parser.comment(&line[start + 1..])
        } else {
            parser.sample(line, start).map(|()| Flow::Continue)
        };
        match outcome {
            Ok(Flow::Continue) => {}
            Ok(Flow::Eof) => {
                let trailing = lines
                    .find(|(_, l)| !l.trim_matches(|c| WS.contains(&c) || c == '\r').is_empty());
                if let Some((j, _)) = trailing {
                    parser.out.rejected.push(Rejected {
                        line: j + 1,
                        reason: Error::AfterEof.to_string(),
                    });
                }
                break;
            }
            Err(e) => parser.out.rejected.push(Rejected {
                line: i + 1,
                reason: e.to_string(),
            }),
        }
    }
    parser.out
}

/// Build a MetricBatch from a parse: families and samples move over, rejected lines are counted.
pub fn into_batch(parsed: Parsed, job: &str, instance: &str) -> MetricBatch {
    MetricBatch {
        job: job.to_owned(),
        instance: instance.to_owned(),
        families: parsed.families,
        samples: parsed.samples,
        rejected_lines: parsed.rejected.len() as u64,
    }
}

// ---------------------------------------------------------------------------------------------------------

/// Token separators inside a line.
const WS: [char; 2] = [' ', '\t'];

/// Suffixes that attach a sample to a family of another name, tried in this order.
const SUFFIXES: [&str; 8] = [
    "_bucket", "_sum", "_count", "_created", "_total", "_gcount", "_gsum", "_info",
];

/// Whether the body carries the OpenMetrics `# EOF` marker on a line of its own.
fn has_eof_marker(body: &str) -> bool {
    body.match_indices("# EOF").any(|(at, m)| {
        let line_start = body[..at].rfind('\n').map_or(0, |n| n + 1);
        let line_end = body[at..].find('\n').map_or(body.len(), |n| at + n);
        body[line_start..at].trim_start_matches(WS).is_empty()
            && body[at + m.len()..line_end]
                .trim_end_matches(|c| WS.contains(&c) || c == '\r')
                .is_empty()
    })
}

/// Why a line is rejected (its text is [`Rejected::reason`]); names and tokens borrow from the body.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum Error<'a> {
    /// A non-blank line after `# EOF`.
    #[error("content after '# EOF' is ignored")]
    AfterEof,
    /// A `HELP` or `TYPE` line (`keyword`) without a metric name.
    #[error("{keyword} line without a metric name")]
    NoMetadataName {
        /// `HELP` or `TYPE`.
        keyword: &'static str,
    },
    /// A `HELP` or `TYPE` line (`keyword`) naming something that is not a metric name.
    #[error("invalid metric name '{name}' in {keyword} line")]
    BadMetadataName {
        /// `HELP` or `TYPE`.
        keyword: &'static str,
        /// What it names.
        name: &'a str,
    },
    /// A second `HELP` or `TYPE` line (`keyword`) for a family; the first one is kept.
    #[error("duplicate {keyword} for '{name}' (the first one is kept)")]
    DuplicateMetadata {
        /// `HELP` or `TYPE`.
        keyword: &'static str,
        /// The family.
        name: &'a str,
    },
    /// A `TYPE` line without a type.
    #[error("TYPE line for '{0}' without a type")]
    NoType(&'a str),
    /// A `TYPE` line with a type neither format knows.
    #[error("unknown metric type '{0}'")]
    UnknownType(&'a str),
    /// Text after the type of a `TYPE` line.
    #[error("unexpected text '{0}' after the type in TYPE line")]
    AfterType(&'a str),
    /// A `TYPE` line after samples of its family.
    #[error("TYPE for '{0}' comes after its samples")]
    TypeAfterSamples(&'a str),
    /// A sample line starting with `{` (OpenMetrics 2's quoted metric names), at that column.
    #[error("quoted metric names are not supported: expected a metric name at column {0}")]
    QuotedMetricName(usize),
    /// A sample line that does not start with a metric name, at that column.
    #[error("expected a metric name at column {0}")]
    NoMetricName(usize),
    /// A character that can't follow a metric name.
    #[error("invalid character {found:?} in metric name at column {column}")]
    MetricNameChar {
        /// The character.
        found: char,
        /// Its column.
        column: usize,
    },
    /// A sample without its value.
    #[error("missing value")]
    NoValue,
    /// A value that is not a float.
    #[error("invalid float '{token}' at column {column}")]
    Value {
        /// The value as written.
        token: &'a str,
        /// Its column.
        column: usize,
    },
    /// A timestamp that is not a number, or out of range.
    #[error("invalid timestamp '{0}'")]
    Timestamp(&'a str),
    /// Text after the timestamp that is not an exemplar.
    #[error("unexpected text '{token}' after the timestamp at column {column}")]
    AfterTimestamp {
        /// The first token of it.
        token: &'a str,
        /// Its column.
        column: usize,
    },
    /// The line ends inside a label set, at that column.
    #[error("label set never closes (expected '}}') at column {0}")]
    UnclosedLabelSet(usize),
    /// Something else than a label name where one is expected.
    #[error("bad label set at column {column}: expected a label name, found {found:?}")]
    NoLabelName {
        /// What is there instead.
        found: char,
        /// Its column.
        column: usize,
    },
    /// A label name not followed by `=`.
    #[error("bad label set at column {column}: expected '=' after label name '{name}'")]
    NoEquals {
        /// The label.
        name: &'a str,
        /// Where the `=` should be.
        column: usize,
    },
    /// A label value that does not start with `"`.
    #[error("bad label set at column {column}: expected '\"' to open the value of '{name}'")]
    UnquotedValue {
        /// The label.
        name: &'a str,
        /// Where the `"` should be.
        column: usize,
    },
    /// A label not followed by `,` or `}`.
    #[error("bad label set at column {0}: expected ',' or '}}' after a label")]
    NoSeparator(usize),
    /// A label that is already in the set.
    #[error("duplicate label '{name}' at column {column}")]
    DuplicateLabel {
        /// The label.
        name: &'a str,
        /// The column of its second occurrence.
        column: usize,
    },
    /// A label value whose closing `"` never comes; `0` is the column of the opening one.
    #[error("label value opened at column {0} never closes")]
    UnclosedValue(usize),
}

/// Every metric type either format names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    GaugeHistogram,
    Summary,
    Untyped,
    Unknown,
    Info,
    StateSet,
}

impl Kind {
    fn from_token(token: &str) -> Option<Kind> {
        const KINDS: [(&str, Kind); 9] = [
            ("counter", Kind::Counter),
            ("gauge", Kind::Gauge),
            ("histogram", Kind::Histogram),
            ("gaugehistogram", Kind::GaugeHistogram),
            ("summary", Kind::Summary),
            ("untyped", Kind::Untyped),
            ("unknown", Kind::Unknown),
            ("info", Kind::Info),
            ("stateset", Kind::StateSet),
        ];
        KINDS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(token))
            .map(|&(_, kind)| kind)
    }

    /// The contract's type. OpenMetrics `info` and `stateset` are gauges (their values are current
    /// states, 1 or 0); a gauge histogram keeps the histogram shape (`_bucket` samples with `le`).
    fn contract(self) -> MetricType {
        match self {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge | Kind::Info | Kind::StateSet => MetricType::Gauge,
            Kind::Histogram | Kind::GaugeHistogram => MetricType::Histogram,
            Kind::Summary => MetricType::Summary,
            Kind::Untyped | Kind::Unknown => MetricType::Untyped,
        }
    }

    /// Whether a sample named `<family><suffix>` belongs to a family of this kind.
    fn owns_suffix(self, suffix: &str) -> bool {
        let owned: &[&str] = match self {
            Kind::Counter => &["_total", "_created"],
            Kind::Histogram => &["_bucket", "_sum", "_count", "_created"],
            Kind::GaugeHistogram => &["_bucket", "_gcount", "_gsum"],
            Kind::Summary => &["_sum", "_count", "_created"],
            Kind::Info => &["_info"],
            Kind::Gauge | Kind::Untyped | Kind::Unknown | Kind::StateSet => &[],
        };
        owned.contains(&suffix)
    }
}

/// What the parser knows of one family.
#[derive(Debug)]
struct FamilyState {
    /// Position in `Parsed::families`.
    at: usize,
    kind: Kind,
    typed: bool,
    helped: bool,
    sampled: bool,
}

/// What to do after a line.
#[derive(Debug)]
enum Flow {
    Continue,
    Eof,
}

#[derive(Debug)]
struct Parser<'a> {
    openmetrics: bool,
    default_ts_ms: i64,
    extra_labels: &'a BTreeMap<String, String>,
    /// Families by name; the keys borrow from the body.
    index: HashMap<&'a str, FamilyState>,
    out: Parsed,
}

impl<'a> Parser<'a> {
    /// The family of that name, created (untyped, no help) at the end of the list if it is new.
    fn family(&mut self, name: &'a str) -> &mut FamilyState {
        let families = &mut self.out.families;
        self.index.entry(name).or_insert_with(|| {
            families.push(MetricFamily {
                name: name.to_owned(),
                type_: MetricType::Untyped,
                help: String::new(),
            });
            FamilyState {
                at: families.len() - 1,
                kind: Kind::Untyped,
                typed: false,
                helped: false,
                sampled: false,
            }
        })
    }

    /// Attach a sample name to its family (see the module doc), creating an untyped one if needed.
    fn attach(&mut self, name: &'a str) {
        if let Some(state) = self.index.get_mut(name) {
            state.sampled = true;
            return;
        }
        for suffix in SUFFIXES {
            let Some(base) = name.strip_suffix(suffix) else {
                continue;
            };
            if let Some(state) = self.index.get_mut(base)
                && state.kind.owns_suffix(suffix)
            {
                state.sampled = true;
                return;
            }
        }
        self.family(name).sampled = true;
    }

    /// A line whose first non-blank character is `#`; `rest` follows the `#`.
    fn comment(&mut self, rest: &'a str) -> Result<Flow, Error<'a>> {
        let after = rest.trim_start_matches(WS);
        if after.len() == rest.len() {
            // `#HELP`, `#foo`: a comment, the keyword must be separated from the `#`.
            return Ok(Flow::Continue);
        }
        let (keyword, tail) = split_token(after);
        match keyword {
            "EOF" if tail.trim_matches(WS).is_empty() => Ok(Flow::Eof),
            "HELP" => self.help(tail).map(|()| Flow::Continue),
            "TYPE" => self.type_line(tail).map(|()| Flow::Continue),
            _ => Ok(Flow::Continue),
        }
    }

    fn help(&mut self, tail: &'a str) -> Result<(), Error<'a>> {
        const KEYWORD: &str = "HELP";
        let (name, text) = split_token(tail.trim_start_matches(WS));
        if name.is_empty() {
            return Err(Error::NoMetadataName { keyword: KEYWORD });
        }
        if !is_metric_name(name) {
            return Err(Error::BadMetadataName {
                keyword: KEYWORD,
                name,
            });
        }
        let text = unescape_help(text.trim_matches(WS), self.openmetrics);
        let family = self.family(name);
        if family.helped {
            return Err(Error::DuplicateMetadata {
                keyword: KEYWORD,
                name,
            });
        }
        family.helped = true;
        let at = family.at;
        self.out.families[at].help = text;
        Ok(())
    }

    fn type_line(&mut self, tail: &'a str) -> Result<(), Error<'a>> {
        const KEYWORD: &str = "TYPE";
        let (name, rest) = split_token(tail.trim_start_matches(WS));
        if name.is_empty() {
            return Err(Error::NoMetadataName { keyword: KEYWORD });
        }
        if !is_metric_name(name) {
            return Err(Error::BadMetadataName {
                keyword: KEYWORD,
                name,
            });
        }
        let (token, rest) = split_token(rest.trim_start_matches(WS));
        if token.is_empty() {
            return Err(Error::NoType(name));
        }
        let kind = Kind::from_token(token).ok_or(Error::UnknownType(token))?;
        let extra = rest.trim_matches(WS);
        if !extra.is_empty() {
            return Err(Error::AfterType(extra));
        }
        let family = self.family(name);
        if family.typed {
            return Err(Error::DuplicateMetadata {
                keyword: KEYWORD,
                name,
            });
        }
        if family.sampled {
            return Err(Error::TypeAfterSamples(name));
        }
        family.typed = true;
        family.kind = kind;
        let at = family.at;
        self.out.families[at].type_ = kind.contract();
        Ok(())
    }

    /// A sample line; `start` is the byte offset of its first non-blank character.
    fn sample(&mut self, line: &'a str, start: usize) -> Result<(), Error<'a>> {
        let mut cur = Cursor { line, pos: start };
        let name = cur.metric_name();
        if name.is_empty() {
            return Err(if cur.peek() == Some(b'{') {
                Error::QuotedMetricName(cur.here())
            } else {
                Error::NoMetricName(cur.here())
            });
        }

        let mut labels = BTreeMap::new();
        let spaced = cur.skip_ws();
        match cur.peek() {
            None => return Err(Error::NoValue),
            Some(b'{') => {
                cur.pos += 1;
                cur.label_set(&mut labels)?;
                cur.skip_ws();
            }
            Some(_) if spaced => {}
            Some(_) => {
                return Err(Error::MetricNameChar {
                    found: cur.next_char(),
                    column: cur.here(),
                });
            }
        }

        let value_at = cur.pos;
        let token = cur.token();
        if token.is_empty() || token.starts_with('#') {
            return Err(Error::NoValue);
        }
        let value = parse_value(token).ok_or_else(|| Error::Value {
            token,
            column: cur.column(value_at),
        })?;

        cur.skip_ws();
        let mut timestamp_ms = self.default_ts_ms;
        let token = cur.token();
        if !token.is_empty() && !token.starts_with('#') {
            timestamp_ms = self.timestamp(token)?;
            cur.skip_ws();
            let extra_at = cur.pos;
            let token = cur.token();
            if !token.is_empty() && !token.starts_with('#') {
                return Err(Error::AfterTimestamp {
                    token,
                    column: cur.column(extra_at),
                });
            }
        }
        // Anything left starts with `#`: an exemplar, ignored.

        self.attach(name);
        self.add_extra_labels(&mut labels);
        self.out.samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
            timestamp_ms,
        });
        Ok(())
    }

    fn timestamp(&self, token: &'a str) -> Result<i64, Error<'a>> {
        let bad = || Error::Timestamp(token);
        // OpenMetrics: seconds, fractions allowed; Prometheus text: milliseconds.
        let scale = if self.openmetrics { 1000 } else { 1 };
        if let Ok(whole) = token.parse::<i64>() {
            return whole.checked_mul(scale).ok_or_else(bad);
        }
        let ms = (token.parse::<f64>().map_err(|_| bad())? * scale as f64).round();
        // i64::MAX as f64 rounds up to 2^63, which does not fit: keep strictly below it.
        if ms.is_finite() && ms.abs() < 9.2e18 {
            Ok(ms as i64)
        } else {
            Err(bad())
        }
    }

    fn add_extra_labels(&self, labels: &mut BTreeMap<String, String>) {
        for (name, value) in self.extra_labels {
            let Some(scraped) = labels.insert(name.clone(), value.clone()) else {
                continue;
            };
            if scraped.is_empty() {
                continue;
            }
            let mut renamed = format!("exported_{name}");
            while labels.contains_key(&renamed) {
                renamed.insert_str(0, "exported_");
            }
            labels.insert(renamed, scraped);
        }
    }
}

/// A position in one line.
#[derive(Debug)]
struct Cursor<'a> {
    line: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.line.as_bytes().get(self.pos).copied()
    }

    fn next_char(&self) -> char {
        self.line[self.pos..].chars().next().unwrap_or(' ')
    }

    /// 1-based column, in characters, of byte offset `at`.
    fn column(&self, at: usize) -> usize {
        self.line
            .char_indices()
            .take_while(|&(i, _)| i < at)
            .count()
            + 1
    }

    /// 1-based column, in characters, of the cursor.
    fn here(&self) -> usize {
        self.column(self.pos)
    }

    /// Skip spaces and tabs; whether there were any.
    fn skip_ws(&mut self) -> bool {
        let from = self.pos;
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        self.pos > from
    }

    /// Everything up to the next space, tab or the end of the line.
    fn token(&mut self) -> &'a str {
        let from = self.pos;
        while !matches!(self.peek(), None | Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        &self.line[from..self.pos]
    }

    /// `[a-zA-Z_:][a-zA-Z0-9_:]*`, or empty.
    fn metric_name(&mut self) -> &'a str {
        self.ident(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
    }

    /// `[a-zA-Z_][a-zA-Z0-9_]*`, or empty.
    fn label_name(&mut self) -> &'a str {
        self.ident(|b| b.is_ascii_alphabetic() || b == b'_')
    }

    fn ident(&mut self, first: impl Fn(u8) -> bool) -> &'a str {
        let from = self.pos;
        match self.peek() {
            Some(b) if first(b) => self.pos += 1,
            _ => return "",
        }
        while matches!(self.peek(), Some(b) if first(b) || b.is_ascii_digit()) {
            self.pos += 1;
        }
        &self.line[from..self.pos]
    }

    /// The label pairs after `{`, up to and including the closing `}`.
    fn label_set(&mut self, labels: &mut BTreeMap<String, String>) -> Result<(), Error<'a>> {
        loop {
            self.skip_ws();
            match self.peek() {
                None => return Err(Error::UnclosedLabelSet(self.here())),
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(_) => {}
            }
            let name_at = self.pos;
            let name = self.label_name();
            if name.is_empty() {
                return Err(Error::NoLabelName {
                    found: self.next_char(),
                    column: self.here(),
                });
            }
            self.skip_ws();
            if self.peek() != Some(b'=') {
                return Err(Error::NoEquals {
                    name,
                    column: self.here(),
                });
            }
            self.pos += 1;
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(Error::UnquotedValue {
                    name,
                    column: self.here(),
                });
            }
            self.pos += 1;
            let value = self.quoted()?;
            if labels.insert(name.to_owned(), value).is_some() {
                return Err(Error::DuplicateLabel {
                    name,
                    column: self.column(name_at),
                });
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                None => return Err(Error::UnclosedLabelSet(self.here())),
                Some(_) => return Err(Error::NoSeparator(self.here())),
            }
        }
    }

    /// A label value after its opening `"`, up to and including the closing `"`, unescaped.
    fn quoted(&mut self) -> Result<String, Error<'a>> {
        let open = self.pos - 1;
        let rest = &self.line[self.pos..];
        let bytes = rest.as_bytes();
        let mut out = String::new();
        let (mut seg, mut i) = (0, 0);
        while i < bytes.len() {
            match bytes[i] {
                b'"' => {
                    out.push_str(&rest[seg..i]);
                    self.pos += i + 1;
                    return Ok(out);
                }
                b'\\' => {
                    out.push_str(&rest[seg..i]);
                    match bytes.get(i + 1) {
                        Some(b'n') => out.push('\n'),
                        Some(b'\\') => out.push('\\'),
                        Some(b'"') => out.push('"'),
                        // An escape the format doesn't define: kept as written.
                        Some(_) => {
                            out.push('\\');
                            i += 1;
                            seg = i;
                            continue;
                        }
                        None => break,
                    }
                    i += 2;
                    seg = i;
                }
                _ => i += 1,
            }
        }
        Err(Error::UnclosedValue(self.column(open)))
    }
}

/// The first token of `s` (which starts with a non-blank) and what follows it.
fn split_token(s: &str) -> (&str, &str) {
    s.split_once(WS).unwrap_or((s, ""))
}

fn is_metric_name(s: &str) -> bool {
    let mut cur = Cursor { line: s, pos: 0 };
    !cur.metric_name().is_empty() && cur.pos == s.len()
}

/// `NaN`, `+Inf`, `-Inf`, `Inf`, integers, decimals, scientific notation.
fn parse_value(token: &str) -> Option<f64> {
    token.parse::<f64>().ok()
}

/// HELP text escapes: `\\` and `\n`, and `\"` in OpenMetrics; anything else is kept as written.
fn unescape_help(text: &str, openmetrics: bool) -> String {
    if !text.contains('\\') {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.clone().next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('"') if openmetrics => out.push('"'),
            _ => {
                out.push('\\');
                continue;
            }
        }
        chars.next();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const KSM: &str =
        include_str!("../../../../shared/fixtures/metrics/kube-state-metrics-v1.35.prom");
    const NODE: &str = include_str!("../../../../shared/fixtures/metrics/node-exporter.prom");
    const ALLTYPES: &str =
        include_str!("../../../../shared/fixtures/metrics/prometheus-alltypes.prom");

    const TS: i64 = 1_700_000_000_000;

    fn no_extra() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn parse_plain(body: &str) -> Parsed {
        parse(body, TS, &no_extra())
    }

    /// Parses a fixture and checks it parsed completely: no rejected line, one sample per sample line.
    fn parse_fixture(body: &str) -> Parsed {
        let sample_lines = body
            .lines()
            .filter(|l| {
                let t = l.trim();
                !t.is_empty() && !t.starts_with('#')
            })
            .count();
        let parsed = parse_plain(body);
        assert_eq!(parsed.rejected, Vec::new());
        assert_eq!(parsed.samples.len(), sample_lines);
        assert!(parsed.samples.iter().all(|s| s.timestamp_ms == TS));
        parsed
    }

    fn find<'p>(parsed: &'p Parsed, name: &str, with: &[(&str, &str)]) -> &'p Sample {
        parsed
            .samples
            .iter()
            .find(|s| {
                s.name == name
                    && with
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .unwrap_or_else(|| panic!("no sample {name} {with:?}"))
    }

    fn family<'p>(parsed: &'p Parsed, name: &str) -> &'p MetricFamily {
        parsed
            .families
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no family {name}"))
    }

    fn assert_families_unique(parsed: &Parsed) {
        let mut names: Vec<&str> = parsed.families.iter().map(|f| f.name.as_str()).collect();
        let total = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), total, "a family is listed twice");
    }

    // --- fixtures ---------------------------------------------------------------------------------------

    #[test]
    fn kube_state_metrics_fixture_parses_completely() {
        let parsed = parse_fixture(KSM);
        assert_families_unique(&parsed);
        // One family per TYPE line, many of them without samples; no untyped strays.
        assert_eq!(parsed.families.len(), 231);
        assert!(
            parsed
                .families
                .iter()
                .all(|f| f.type_ != MetricType::Untyped)
        );

        let restarts = family(&parsed, "kube_pod_container_status_restarts_total");
        assert_eq!(restarts.type_, MetricType::Counter);
        assert_eq!(
            restarts.help,
            "[STABLE] The number of container restarts per container."
        );
        let s = find(
            &parsed,
            "kube_pod_container_status_restarts_total",
            &[
                ("pod", "kube-apiserver-datagen-1-35"),
                ("container", "kube-apiserver"),
            ],
        );
        assert_eq!(s.value, 0.0);
        assert_eq!(s.labels["uid"], "091e4cfe-bbaf-4634-99c2-2627b3b25e5e");

        assert_eq!(
            family(&parsed, "kube_configmap_info").help,
            "[STABLE] Information about configmap."
        );
        let csr = find(
            &parsed,
            "kube_certificatesigningrequest_created",
            &[("certificatesigningrequest", "csr-w7r2t")],
        );
        assert_eq!(csr.value, 1.782468732e9);
        assert_eq!(
            csr.labels["signer_name"],
            "kubernetes.io/kube-apiserver-client-kubelet"
        );
        // A family declared without samples is still listed.
        assert_eq!(
            family(&parsed, "kube_certificatesigningrequest_annotations").type_,
            MetricType::Gauge
        );
        assert!(
            !parsed
                .samples
                .iter()
                .any(|s| s.name == "kube_certificatesigningrequest_annotations")
        );
    }

    #[test]
    fn node_exporter_fixture_parses_completely() {
        let parsed = parse_fixture(NODE);
        assert_families_unique(&parsed);
        assert_eq!(parsed.families.len(), 1228);

        // `go_memstats_alloc_bytes` (gauge) and `go_memstats_alloc_bytes_total` (counter) are two families:
        // the exact name wins over the `_total` suffix.
        assert_eq!(
            family(&parsed, "go_memstats_alloc_bytes").type_,
            MetricType::Gauge
        );
        assert_eq!(
            family(&parsed, "go_memstats_alloc_bytes_total").type_,
            MetricType::Counter
        );
        assert_eq!(
            family(&parsed, "go_gc_duration_seconds").type_,
            MetricType::Summary
        );

        let cpu = family(&parsed, "node_cpu_seconds_total");
        assert_eq!(cpu.type_, MetricType::Counter);
        assert_eq!(cpu.help, "Seconds the CPUs spent in each mode.");
        assert_eq!(
            find(
                &parsed,
                "node_cpu_seconds_total",
                &[("cpu", "0"), ("mode", "idle")]
            )
            .value,
            10870.69
        );

        // Spaces, `=` and `;` inside label values.
        let bcachefs = find(&parsed, "node_bcachefs_device_info", &[("device", "10")]);
        assert_eq!(bcachefs.labels["state"], "[rw] ro evacuating spare");
        let dmi = find(&parsed, "node_dmi_info", &[]);
        assert_eq!(
            dmi.labels["product_sku"],
            "SKU=NotProvided;ModelName=PowerEdge R6515"
        );
        assert_eq!(dmi.labels["chassis_asset_tag"], "");
        // A raw control character (U+001C) and U+FFFD inside a label value are kept as they are.
        assert_eq!(dmi.labels["product_version"], "\u{fffd}\u{1c}[\u{fffd}");

        // Non-ASCII HELP text.
        assert_eq!(
            family(&parsed, "node_xfrm_acquire_error_packets_total").help,
            "State hasn\u{2019}t been fully acquired before use"
        );

        let untyped = family(&parsed, "testmetric1_1");
        assert_eq!(untyped.type_, MetricType::Untyped);
        assert_eq!(
            untyped.help,
            "Metric read from collector/fixtures/textfile/two_metric_files/metrics1.prom"
        );
        assert_eq!(
            find(&parsed, "testmetric1_1", &[("foo", "bar")]).value,
            10.0
        );
    }

    #[test]
    fn prometheus_alltypes_fixture_parses_completely() {
        let parsed = parse_fixture(ALLTYPES);
        assert_families_unique(&parsed);
        // Buckets, sums and counts join their histogram or summary: no stray untyped families.
        assert_eq!(parsed.families.len(), 237);
        assert!(
            parsed
                .families
                .iter()
                .all(|f| f.type_ != MetricType::Untyped)
        );
        assert!(!parsed.families.iter().any(|f| f.name.ends_with("_bucket")));

        let hist = family(&parsed, "prometheus_http_request_duration_seconds");
        assert_eq!(hist.type_, MetricType::Histogram);
        assert_eq!(hist.help, "Histogram of latencies for HTTP requests.");
        let inf = find(
            &parsed,
            "prometheus_http_request_duration_seconds_bucket",
            &[("handler", "/"), ("le", "+Inf")],
        );
        assert_eq!(inf.value, 688.0);
        assert_eq!(
            find(
                &parsed,
                "prometheus_http_request_duration_seconds_sum",
                &[("handler", "/")]
            )
            .value,
            0.026826932000000022
        );
        assert_eq!(
            find(
                &parsed,
                "go_gc_heap_allocs_by_size_bytes_bucket",
                &[("le", "+Inf")]
            )
            .value,
            4.4046288803e10
        );

        assert_eq!(
            family(&parsed, "go_gc_duration_seconds").type_,
            MetricType::Summary
        );
        assert_eq!(
            find(&parsed, "go_gc_duration_seconds", &[("quantile", "0.5")]).value,
            0.000135819
        );
        assert_eq!(
            find(&parsed, "go_gc_duration_seconds_count", &[]).value,
            190932.0
        );
        assert!(
            find(
                &parsed,
                "prometheus_sd_consul_rpc_duration_seconds",
                &[("call", "service"), ("quantile", "0.99")]
            )
            .value
            .is_nan()
        );

        assert_eq!(
            family(&parsed, "go_gc_cycles_automatic_gc_cycles_total").type_,
            MetricType::Counter
        );
        assert_eq!(
            find(
                &parsed,
                "promhttp_metric_handler_requests_total",
                &[("code", "200")]
            )
            .value,
            4.059092e6
        );
    }

    // --- hand-made cases --------------------------------------------------------------------------------

    #[test]
    fn empty_body_gives_nothing() {
        for body in ["", "\n", "  \n\t\n\r\n"] {
            let parsed = parse_plain(body);
            assert!(parsed.families.is_empty());
            assert!(parsed.samples.is_empty());
            assert!(parsed.rejected.is_empty());
        }
    }

    #[test]
    fn label_value_escapes_are_decoded() {
        let parsed = parse_plain(
            r#"m{a="say \"hi\"",b="back\\slash",c="two\nlines",d="kept \t as is",e="é ✓"} 1"#,
        );
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        let l = &parsed.samples[0].labels;
        assert_eq!(l["a"], "say \"hi\"");
        assert_eq!(l["b"], "back\\slash");
        assert_eq!(l["c"], "two\nlines");
        assert_eq!(l["d"], "kept \\t as is");
        assert_eq!(l["e"], "é ✓");
    }

    #[test]
    fn help_escapes_are_decoded() {
        let parsed = parse_plain(
            "# HELP m Line one\\nline two, a \\\\ backslash, \\\"quotes\\\" kept\n# TYPE m gauge\nm 1\n",
        );
        assert_eq!(
            family(&parsed, "m").help,
            "Line one\nline two, a \\ backslash, \\\"quotes\\\" kept"
        );
        // OpenMetrics also escapes double quotes in HELP.
        let parsed = parse_plain("# HELP m say \\\"hi\\\"\nm 1\n# EOF\n");
        assert_eq!(family(&parsed, "m").help, "say \"hi\"");
    }

    #[test]
    fn special_and_scientific_values_are_parsed() {
        let parsed = parse_plain(
            "a NaN\nb +Inf\nc -Inf\nd Inf\ne 1.5e+09\nf -2E-3\ng 42\nh -0\ni 0.25\nj 1e3\n",
        );
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        let v: Vec<f64> = parsed.samples.iter().map(|s| s.value).collect();
        assert!(v[0].is_nan());
        assert_eq!(v[1], f64::INFINITY);
        assert_eq!(v[2], f64::NEG_INFINITY);
        assert_eq!(v[3], f64::INFINITY);
        assert_eq!(&v[4..], &[1.5e9, -2e-3, 42.0, -0.0, 0.25, 1000.0]);
    }

    #[test]
    fn invalid_value_is_rejected_with_the_token() {
        let parsed = parse_plain("m{a=\"b\"} abc\n");
        assert_eq!(parsed.rejected.len(), 1);
        assert_eq!(
            parsed.rejected[0].reason,
            "invalid float 'abc' at column 10"
        );
        assert!(parsed.samples.is_empty());
    }

    #[test]
    fn missing_value_is_rejected() {
        let parsed = parse_plain("m\nm{a=\"b\"}\nm{a=\"b\"}   \nm # {trace_id=\"x\"} 1\n");
        assert_eq!(parsed.rejected.len(), 4);
        assert!(parsed.rejected.iter().all(|r| r.reason == "missing value"));
    }

    #[test]
    fn prometheus_text_timestamps_are_milliseconds() {
        let parsed = parse_plain("m 1 1520879607789\nn 2\no 3 -5\n");
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(parsed.samples[0].timestamp_ms, 1_520_879_607_789);
        assert_eq!(parsed.samples[1].timestamp_ms, TS);
        assert_eq!(parsed.samples[2].timestamp_ms, -5);
    }

    #[test]
    fn openmetrics_timestamps_are_seconds_with_fractions() {
        let parsed = parse_plain(
            "# TYPE m counter\nm_total 1 1520879607.789\nm_total 2 1520879607\nm_total 3\n# EOF\n",
        );
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(parsed.samples[0].timestamp_ms, 1_520_879_607_789);
        assert_eq!(parsed.samples[1].timestamp_ms, 1_520_879_607_000);
        assert_eq!(parsed.samples[2].timestamp_ms, TS);
    }

    #[test]
    fn invalid_timestamp_is_rejected() {
        let parsed = parse_plain("m 1 soon\nm 1 NaN\nm 1 1e30\nm 2 3\n");
        let reasons: Vec<&str> = parsed.rejected.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "invalid timestamp 'soon'",
                "invalid timestamp 'NaN'",
                "invalid timestamp '1e30'"
            ]
        );
        assert_eq!(parsed.samples.len(), 1);
    }

    #[test]
    fn exemplars_are_ignored() {
        let body = "# TYPE h histogram\n\
                    h_bucket{le=\"0.5\"} 3 # {trace_id=\"abc\"} 0.4 1520879607.789\n\
                    h_bucket{le=\"+Inf\"} 5 1520879608 # {trace_id=\"def\"} 2.5\n\
                    h_count 5\n# EOF\n";
        let parsed = parse_plain(body);
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(parsed.samples.len(), 3);
        assert_eq!(parsed.samples[0].value, 3.0);
        assert_eq!(parsed.samples[0].timestamp_ms, TS);
        assert_eq!(parsed.samples[0].labels, labels(&[("le", "0.5")]));
        assert_eq!(parsed.samples[1].timestamp_ms, 1_520_879_608_000);
    }

    #[test]
    fn text_after_the_timestamp_is_rejected() {
        let parsed = parse_plain("m 1 2 3\n");
        assert_eq!(
            parsed.rejected[0].reason,
            "unexpected text '3' after the timestamp at column 7"
        );
    }

    #[test]
    fn trailing_comma_in_label_set_is_accepted() {
        let parsed = parse_plain("m{a=\"1\",b=\"2\",} 1\nn{a=\"1\",} 2\n");
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(parsed.samples[0].labels, labels(&[("a", "1"), ("b", "2")]));
        assert_eq!(parsed.samples[1].labels, labels(&[("a", "1")]));
    }

    #[test]
    fn whitespace_between_tokens_is_tolerated() {
        let parsed = parse_plain(
            "  m { a = \"1\" , b=\"2\" }\t 7 \t 1000 \t\n\tn 3   \n  # TYPE   o   gauge  \no{}8\n",
        );
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(parsed.samples[0].labels, labels(&[("a", "1"), ("b", "2")]));
        assert_eq!(parsed.samples[0].value, 7.0);
        assert_eq!(parsed.samples[0].timestamp_ms, 1000);
        assert_eq!(parsed.samples[1].value, 3.0);
        assert_eq!(family(&parsed, "o").type_, MetricType::Gauge);
        assert!(parsed.samples[2].labels.is_empty());
        assert_eq!(parsed.samples[2].value, 8.0);
    }

    #[test]
    fn crlf_line_endings_are_accepted() {
        let parsed = parse_plain("# HELP m Help.\r\n# TYPE m gauge\r\nm{a=\"b\"} 1\r\n");
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(family(&parsed, "m").help, "Help.");
        assert_eq!(family(&parsed, "m").type_, MetricType::Gauge);
        assert_eq!(parsed.samples[0].value, 1.0);
    }

    #[test]
    fn metric_names_may_contain_colons() {
        let parsed =
            parse_plain("# TYPE job:rate5m:sum gauge\njob:rate5m:sum{job=\"x\"} 0.5\n:odd 1\n");
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(parsed.samples[0].name, "job:rate5m:sum");
        assert_eq!(family(&parsed, "job:rate5m:sum").type_, MetricType::Gauge);
        assert_eq!(parsed.samples[1].name, ":odd");
    }

    #[test]
    fn other_comments_are_ignored() {
        let parsed =
            parse_plain("# just a comment\n#HELP m not a help line\n#\n# HELPS m no\nm 1\n");
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(family(&parsed, "m").help, "");
        assert_eq!(parsed.samples.len(), 1);
    }

    #[test]
    fn eof_marker_ends_the_body() {
        let parsed = parse_plain("m 1\n# EOF\n");
        assert!(parsed.rejected.is_empty());
        assert_eq!(parsed.samples.len(), 1);

        let parsed = parse_plain("m 1\n# EOF\nn 2\ngarbage\n");
        assert_eq!(parsed.samples.len(), 1);
        assert_eq!(
            parsed.rejected,
            vec![Rejected {
                line: 3,
                reason: "content after '# EOF' is ignored".to_owned()
            }]
        );
    }

    #[test]
    fn bad_line_is_rejected_and_parsing_continues() {
        let body = "# TYPE m gauge\n\
                    m{a=\"1\"} 1\n\
                    this is garbage\n\
                    m{a=\"2\"} 2\n\
                    m{a=\"3\" b=\"4\"} 3\n\
                    m{1a=\"x\"} 4\n\
                    m{a=x} 5\n\
                    m{a=\"1\",a=\"2\"} 6\n\
                    m-bad 7\n\
                    {\"quoted\"} 8\n\
                    m{a=\"5\"} 9\n";
        let parsed = parse_plain(body);
        let values: Vec<f64> = parsed.samples.iter().map(|s| s.value).collect();
        assert_eq!(values, [1.0, 2.0, 9.0]);
        let got: Vec<(usize, &str)> = parsed
            .rejected
            .iter()
            .map(|r| (r.line, r.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (3, "invalid float 'is' at column 6"),
                (
                    5,
                    "bad label set at column 9: expected ',' or '}' after a label"
                ),
                (
                    6,
                    "bad label set at column 3: expected a label name, found '1'"
                ),
                (
                    7,
                    "bad label set at column 5: expected '\"' to open the value of 'a'"
                ),
                (8, "duplicate label 'a' at column 9"),
                (9, "invalid character '-' in metric name at column 2"),
                (
                    10,
                    "quoted metric names are not supported: expected a metric name at column 1"
                ),
            ]
        );
    }

    #[test]
    fn label_set_that_never_closes_is_rejected() {
        let parsed = parse_plain("m{a=\"1\" 5\nm{a=\"1\",\nm{\nok 1\n");
        let got: Vec<(usize, &str)> = parsed
            .rejected
            .iter()
            .map(|r| (r.line, r.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    1,
                    "bad label set at column 9: expected ',' or '}' after a label"
                ),
                (2, "label set never closes (expected '}') at column 9"),
                (3, "label set never closes (expected '}') at column 3"),
            ]
        );
        assert_eq!(parsed.samples.len(), 1);
    }

    #[test]
    fn label_value_that_never_closes_is_rejected() {
        let parsed = parse_plain("m{a=\"open} 1\nm{a=\"trailing backslash\\\nok 1\n");
        assert_eq!(parsed.rejected.len(), 2);
        assert_eq!(
            parsed.rejected[0].reason,
            "label value opened at column 5 never closes"
        );
        assert_eq!(
            parsed.rejected[1].reason,
            "label value opened at column 5 never closes"
        );
        assert_eq!(parsed.samples.len(), 1);
    }

    #[test]
    fn histogram_and_summary_samples_belong_to_their_family() {
        let body = "# TYPE h histogram\n\
                    h_bucket{le=\"1\"} 1\n\
                    h_bucket{le=\"+Inf\"} 2\n\
                    h_sum 3\n\
                    h_count 2\n\
                    h_created 1.7e9\n\
                    # TYPE s summary\n\
                    s{quantile=\"0.5\"} 0.1\n\
                    s_sum 4\n\
                    s_count 5\n\
                    # TYPE g gauge\n\
                    g_sum 1\n";
        let parsed = parse_plain(body);
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        let names: Vec<(&str, MetricType)> = parsed
            .families
            .iter()
            .map(|f| (f.name.as_str(), f.type_))
            .collect();
        // `_sum` is not a part of a gauge: `g_sum` gets an untyped family of its own.
        assert_eq!(
            names,
            [
                ("h", MetricType::Histogram),
                ("s", MetricType::Summary),
                ("g", MetricType::Gauge),
                ("g_sum", MetricType::Untyped),
            ]
        );
        assert_eq!(parsed.samples.len(), 9);
        assert_eq!(parsed.samples[1].labels["le"], "+Inf");
        assert_eq!(parsed.samples[5].labels["quantile"], "0.5");
    }

    #[test]
    fn openmetrics_total_and_created_belong_to_their_counter() {
        let body = "# TYPE requests counter\n\
                    # HELP requests Requests served.\n\
                    requests_total{code=\"200\"} 10\n\
                    requests_created{code=\"200\"} 1520430000.123\n\
                    # TYPE build info\n\
                    build_info{version=\"1.2\"} 1\n\
                    # TYPE door stateset\n\
                    door{door=\"open\"} 1\n\
                    # TYPE queue gaugehistogram\n\
                    queue_bucket{le=\"+Inf\"} 4\n\
                    queue_gcount 4\n\
                    queue_gsum 9\n\
                    # TYPE mystery unknown\n\
                    mystery 1\n\
                    # EOF\n";
        let parsed = parse_plain(body);
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        let names: Vec<(&str, MetricType)> = parsed
            .families
            .iter()
            .map(|f| (f.name.as_str(), f.type_))
            .collect();
        assert_eq!(
            names,
            [
                ("requests", MetricType::Counter),
                ("build", MetricType::Gauge),
                ("door", MetricType::Gauge),
                ("queue", MetricType::Histogram),
                ("mystery", MetricType::Untyped),
            ]
        );
        assert_eq!(family(&parsed, "requests").help, "Requests served.");
        assert_eq!(parsed.samples[0].name, "requests_total");
        assert_eq!(parsed.samples[1].value, 1520430000.123);
    }

    #[test]
    fn exact_family_name_wins_over_a_suffix() {
        let body =
            "# TYPE a_bytes gauge\n# TYPE a_bytes_total counter\na_bytes 1\na_bytes_total 2\n";
        let parsed = parse_plain(body);
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(parsed.families.len(), 2);
        assert_eq!(family(&parsed, "a_bytes_total").type_, MetricType::Counter);
    }

    #[test]
    fn sample_without_type_gets_an_untyped_family_of_its_own_name() {
        let parsed = parse_plain("x_bucket{le=\"1\"} 1\nx_bucket{le=\"2\"} 1\ny 2\n");
        let names: Vec<(&str, MetricType)> = parsed
            .families
            .iter()
            .map(|f| (f.name.as_str(), f.type_))
            .collect();
        assert_eq!(
            names,
            [
                ("x_bucket", MetricType::Untyped),
                ("y", MetricType::Untyped)
            ]
        );
    }

    #[test]
    fn families_are_listed_once_in_order_of_first_appearance() {
        let body = "# HELP b B.\nc 1\n# TYPE b gauge\nb 2\na 3\nc 4\n# TYPE d counter\n";
        let parsed = parse_plain(body);
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        let names: Vec<&str> = parsed.families.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["b", "c", "a", "d"]);
        assert_eq!(family(&parsed, "b").help, "B.");
        assert_eq!(family(&parsed, "b").type_, MetricType::Gauge);
    }

    #[test]
    fn duplicate_help_and_type_keep_the_first_and_reject_the_duplicate() {
        let body = "# HELP m First.\n# TYPE m counter\n# HELP m Second.\n# TYPE m gauge\nm 1\n";
        let parsed = parse_plain(body);
        assert_eq!(family(&parsed, "m").help, "First.");
        assert_eq!(family(&parsed, "m").type_, MetricType::Counter);
        let got: Vec<(usize, &str)> = parsed
            .rejected
            .iter()
            .map(|r| (r.line, r.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (3, "duplicate HELP for 'm' (the first one is kept)"),
                (4, "duplicate TYPE for 'm' (the first one is kept)"),
            ]
        );
        assert_eq!(parsed.samples.len(), 1);
    }

    #[test]
    fn type_after_its_samples_is_rejected() {
        let parsed = parse_plain("m 1\n# TYPE m counter\n# HELP m Late help is fine.\n");
        assert_eq!(parsed.rejected.len(), 1);
        assert_eq!(
            parsed.rejected[0].reason,
            "TYPE for 'm' comes after its samples"
        );
        assert_eq!(family(&parsed, "m").type_, MetricType::Untyped);
        assert_eq!(family(&parsed, "m").help, "Late help is fine.");
    }

    #[test]
    fn malformed_metadata_lines_are_rejected() {
        let body =
            "# TYPE m histogramm\n# TYPE\n# TYPE n\n# TYPE o gauge extra\n# HELP\n# HELP 9bad x\n";
        let parsed = parse_plain(body);
        let reasons: Vec<&str> = parsed.rejected.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "unknown metric type 'histogramm'",
                "TYPE line without a metric name",
                "TYPE line for 'n' without a type",
                "unexpected text 'extra' after the type in TYPE line",
                "HELP line without a metric name",
                "invalid metric name '9bad' in HELP line",
            ]
        );
    }

    #[test]
    fn extra_labels_are_added_to_every_sample() {
        let extra = labels(&[("cluster", "prod-1"), ("region", "eu")]);
        let parsed = parse("a 1\nb{x=\"y\"} 2\n", TS, &extra);
        assert_eq!(parsed.samples[0].labels, extra);
        assert_eq!(
            parsed.samples[1].labels,
            labels(&[("cluster", "prod-1"), ("region", "eu"), ("x", "y")])
        );
    }

    #[test]
    fn conflicting_scraped_label_is_renamed_exported() {
        let extra = labels(&[("cluster", "prod-1")]);
        let body = "a{cluster=\"other\"} 1\n\
                    b{cluster=\"other\",exported_cluster=\"older\"} 2\n\
                    c{cluster=\"\"} 3\n";
        let parsed = parse(body, TS, &extra);
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(
            parsed.samples[0].labels,
            labels(&[("cluster", "prod-1"), ("exported_cluster", "other")])
        );
        assert_eq!(
            parsed.samples[1].labels,
            labels(&[
                ("cluster", "prod-1"),
                ("exported_cluster", "older"),
                ("exported_exported_cluster", "other"),
            ])
        );
        // An empty scraped value counts as absent.
        assert_eq!(parsed.samples[2].labels, labels(&[("cluster", "prod-1")]));
    }

    #[test]
    fn into_batch_moves_everything_and_counts_rejected_lines() {
        let parsed = parse_plain("# TYPE m gauge\nm 1\nbad\nworse {\n");
        let families = parsed.families.clone();
        let samples = parsed.samples.clone();
        let batch = into_batch(parsed, "node-exporter", "10.0.0.1:9100");
        assert_eq!(batch.job, "node-exporter");
        assert_eq!(batch.instance, "10.0.0.1:9100");
        assert_eq!(batch.families, families);
        assert_eq!(batch.samples, samples);
        assert_eq!(batch.rejected_lines, 2);
    }

    #[test]
    fn no_prefix_of_a_tricky_body_panics() {
        let body = "\u{feff}# HELP h Hé\\llo\\n\n# TYPE h histogram\n\
                    h_bucket{le=\"0.5\",path=\"/é\\\"\\\\\\n\",} 3 1520879607 # {t=\"x\"} 1\n\
                    h_count\t5\r\n# EOF\n";
        for (at, _) in body.char_indices().chain([(body.len(), ' ')]) {
            let parsed = parse(&body[..at], TS, &labels(&[("h", "x")]));
            assert!(parsed.samples.len() <= 2);
        }
        // The whole body parses cleanly.
        let parsed = parse_plain(body);
        assert!(parsed.rejected.is_empty(), "{:?}", parsed.rejected);
        assert_eq!(parsed.samples.len(), 2);
        assert_eq!(parsed.samples[0].labels["path"], "/é\"\\\n");
        // Seconds, because of the `# EOF` marker.
        assert_eq!(parsed.samples[0].timestamp_ms, 1_520_879_607_000);
        assert_eq!(family(&parsed, "h").help, "Hé\\llo\n");
    }
}
