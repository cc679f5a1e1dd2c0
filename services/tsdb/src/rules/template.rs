//! Annotation and label templates: the Go template forms Prometheus rules commonly use (`{{ $labels.x }}`,
//! `{{ $value }}`, `{{ humanize $value }}`, `{{ $value | humanizePercentage }}`,
//! `{{ printf "%.2f" $value }}`) translated to minijinja, and Go's and Prometheus' number formatting.

use std::collections::BTreeMap;

use super::{Error, Result};

pub(super) fn template_env() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.add_filter("humanize", |v: f64| humanize(v));
    env.add_filter("humanizePercentage", |v: f64| {
        format!("{}%", format_g(v * 100.0, 4))
    });
    env.add_filter("humanizeDuration", |v: f64| humanize_duration(v));
    env.add_filter("goFloat", |v: f64| go_float(v));
    env.add_function("printf", printf);
    env
}

/// Go's `printf` for the verbs rule templates use: `%s`, `%v`, `%d`, `%f`, `%.Nf`, `%g`, `%%`.
fn printf(fmt: String, args: minijinja::value::Rest<minijinja::Value>) -> String {
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = String::new();
        while let Some(&n) = chars.peek() {
            chars.next();
            if n.is_ascii_alphabetic() || n == '%' {
                spec.push(n);
                break;
            }
            spec.push(n);
        }
        let verb = spec.pop().unwrap_or('v');
        if verb == '%' {
            out.push('%');
            continue;
        }
        let arg = args.next().cloned().unwrap_or_default();
        let num = f64::try_from(arg.clone()).ok();
        match (verb, num) {
            ('f', Some(v)) => {
                let prec = spec
                    .strip_prefix('.')
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(6);
                out.push_str(&format!("{v:.prec$}"));
            }
            ('d', Some(v)) => out.push_str(&format!("{}", v as i64)),
            ('g', Some(v)) => out.push_str(&format_g(v, 6)),
            _ => out.push_str(&arg.to_string()),
        }
    }
    out
}

/// Go's `%v` of a float64 (shortest representation, exponent below 1e-4 and from 1e21).
pub fn go_float(v: f64) -> String {
    if !v.is_finite() || v == 0.0 {
        return format_g(v, 4);
    }
    if v.abs() >= 1e21 || v.abs() < 1e-4 {
        format_e(v)
    } else {
        format!("{v}")
    }
}

/// Go's `%.{prec}g`.
pub fn format_g(v: f64, prec: usize) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let exp = format!("{:.*e}", prec.saturating_sub(1), v);
    let (mantissa, e) = exp.split_once('e').unwrap_or((&exp, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if e < -4 || e >= prec as i32 {
        let sign = if e < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), e.abs())
    } else {
        let decimals = (prec as i32 - 1 - e).max(0) as usize;
        trim(&format!("{v:.decimals$}"))
    }
}

/// Prometheus' `humanize`: SI prefixes, four significant digits.
pub fn humanize(v: f64) -> String {
    if v == 0.0 || v.is_nan() || v.is_infinite() {
        return format_g(v, 4);
    }
    let mut v = v;
    if v.abs() >= 1.0 {
        let mut prefix = "";
        for p in ["k", "M", "G", "T", "P", "E", "Z", "Y"] {
            if v.abs() < 1000.0 {
                break;
            }
            prefix = p;
            v /= 1000.0;
        }
        return format!("{}{prefix}", format_g(v, 4));
    }
    let mut prefix = "";
    for p in ["m", "u", "n", "p", "f", "a", "z", "y"] {
        if v.abs() >= 1.0 {
            break;
        }
        prefix = p;
        v *= 1000.0;
    }
    format!("{}{prefix}", format_g(v, 4))
}

/// Prometheus' `humanizeDuration` (seconds to `1d 2h 3m 4s`).
pub fn humanize_duration(v: f64) -> String {
    if v.is_nan() || v.is_infinite() {
        return format_g(v, 4);
    }
    if v.abs() >= 1.0 {
        let sign = if v < 0.0 { "-" } else { "" };
        let s = v.abs() as i64;
        let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
        return if d != 0 {
            format!("{sign}{d}d {h}h {m}m {sec}s")
        } else if h != 0 {
            format!("{sign}{h}h {m}m {sec}s")
        } else if m != 0 {
            format!("{sign}{m}m {sec}s")
        } else {
            format!("{sign}{sec}s")
        };
    }
    if v == 0.0 {
        return "0s".into();
    }
    format!("{}ms", format_g(v * 1000.0, 4))
}

/// Why a Go template has no minijinja translation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TranslateError {
    /// `{{` without its `}}`.
    #[error("unclosed action: missing \"}}}}\"")]
    Unclosed,
    /// An action, or a stage of its pipeline, with nothing in it.
    #[error("empty template action")]
    EmptyAction,
    /// A control action (`if`, `range`, …).
    #[error("unsupported template action {0:?}")]
    Action(String),
    /// A function other than the `humanize` family and `printf`.
    #[error("unsupported template function {0:?}")]
    Function(String),
    /// A `humanize` function without its argument.
    #[error("{0} needs an argument")]
    NoArgument(String),
    /// An operand other than `$labels…`, `$value`, a string or a number.
    #[error("unsupported template operand {0:?}")]
    Operand(String),
}

/// Translates a Go template (the forms Prometheus rules use) to minijinja: `$labels.x`/`.Labels.x` →
/// `labels.x`, `$value`/`.Value` → `value`, `func arg` → `arg | func`, `printf "f" a` → `printf("f", a)`.
/// Control actions (`if`, `range`, …) are refused.
pub fn translate_template(src: &str) -> Result<String, TranslateError> {
    let mut out = String::new();
    let mut rest = src;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after.find("}}").ok_or(TranslateError::Unclosed)?;
        let inner = after[..close].trim_matches(|c: char| c == '-' || c.is_whitespace());
        out.push_str("{{ ");
        out.push_str(&translate_action(inner)?);
        out.push_str(" }}");
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

fn translate_operand(op: &str) -> Result<String, TranslateError> {
    let op = op.trim();
    if op.starts_with('"') || op.parse::<f64>().is_ok() {
        return Ok(op.to_string());
    }
    let mapped = if let Some(rest) = op.strip_prefix("$labels") {
        format!("labels{rest}")
    } else if let Some(rest) = op.strip_prefix(".Labels") {
        format!("labels{rest}")
    } else if op == "$value" || op == ".Value" {
        "value".to_string()
    } else if op == "$externalLabels" || op == "$externalURL" {
        "none".to_string()
    } else {
        return Err(TranslateError::Operand(op.to_string()));
    };
    Ok(mapped)
}

fn split_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

const FILTERS: [&str; 3] = ["humanize", "humanizePercentage", "humanizeDuration"];

fn translate_action(inner: &str) -> Result<String, TranslateError> {
    let mut stages = Vec::new();
    for stage in inner.split('|') {
        let words = split_words(stage);
        let Some(first) = words.first() else {
            return Err(TranslateError::EmptyAction);
        };
        if [
            "if", "else", "end", "range", "with", "define", "template", "block",
        ]
        .contains(&first.as_str())
        {
            return Err(TranslateError::Action(first.clone()));
        }
        stages.push(words);
    }
    let mut expr = String::new();
    for (i, words) in stages.into_iter().enumerate() {
        let f = words[0].as_str();
        if FILTERS.contains(&f) {
            if i == 0 {
                let arg = words
                    .get(1)
                    .ok_or_else(|| TranslateError::NoArgument(f.to_string()))?;
                expr = format!("{} | {f}", translate_operand(arg)?);
            } else {
                expr = format!("{expr} | {f}");
            }
        } else if f == "printf" {
            let mut args: Vec<String> = words[1..]
                .iter()
                .map(|w| translate_operand(w))
                .collect::<Result<_, _>>()?;
            if i > 0 {
                args.push(std::mem::take(&mut expr));
            }
            expr = format!("printf({})", args.join(", "));
        } else if i == 0 && words.len() == 1 {
            expr = translate_operand(f)?;
        } else {
            return Err(TranslateError::Function(f.to_string()));
        }
    }
    if expr == "value" {
        // printed as Go prints a float64 (`2000`, not `2000.0`)
        expr = "value | goFloat".into();
    }
    Ok(expr)
}

pub(super) fn render(
    env: &minijinja::Environment<'_>,
    template: &str,
    labels: &BTreeMap<String, String>,
    value: f64,
) -> Result<String> {
    let src = translate_template(template).map_err(Error::Untranslatable)?;
    env.render_str(
        &src,
        minijinja::context! { labels => labels, value => value },
    )
    .map_err(Error::Template)
}

/// Go's `strconv.FormatFloat(v, 'e', -1, 64)`, as `/api/v1/alerts` shows values.
pub(super) fn format_e(v: f64) -> String {
    if !v.is_finite() {
        return format_g(v, 4);
    }
    let s = format!("{v:e}");
    let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
    let e: i32 = e.parse().unwrap_or(0);
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_humanize_like_go() {
        assert_eq!(humanize(1234.5), "1.234k");
        assert_eq!(humanize(12_345_678.0), "12.35M");
        assert_eq!(humanize(0.5), "500m");
        assert_eq!(humanize(3.0), "3");
        assert_eq!(humanize(0.0), "0");
        assert_eq!(format_g(1e-7, 4), "1e-07");
        assert_eq!(format_e(1.0), "1e+00");
        assert_eq!(format_e(0.25), "2.5e-01");
        assert_eq!(humanize_duration(3725.0), "1h 2m 5s");
    }

    #[test]
    fn go_templates_translate_to_minijinja() {
        assert_eq!(
            translate_template("{{ $labels.node }} at {{ humanize $value }}").unwrap(),
            "{{ labels.node }} at {{ value | humanize }}"
        );
        assert_eq!(
            translate_template("{{ $value | humanizePercentage }}").unwrap(),
            "{{ value | humanizePercentage }}"
        );
        assert_eq!(
            translate_template("{{ $value }}").unwrap(),
            "{{ value | goFloat }}"
        );
        assert_eq!(go_float(2000.0), "2000");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(
            translate_template(r#"{{ printf "%.2f" $value }}"#).unwrap(),
            r#"{{ printf("%.2f", value) }}"#
        );
        assert!(translate_template("{{ if $value }}x{{ end }}").is_err());
        let env = template_env();
        let labels = BTreeMap::from([("node".to_string(), "n1".to_string())]);
        assert_eq!(
            render(
                &env,
                r#"{{ $labels.node }}: {{ humanize $value }} ({{ printf "%.1f" $value }}) {{ $labels.missing }}."#,
                &labels,
                2048.0
            )
            .unwrap(),
            "n1: 2.048k (2048.0) ."
        );
    }
}
