//! A run's report: figures, checks (invariants that must hold, goals that are measured), plots; written as
//! `report.md`, `report.json` and `plots/*.svg` in the output directory.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::Serialize;

use crate::plot::{self, Line};
use crate::record::Recorder;

/// Whether a check is an invariant (the run fails without it, short or full) or a goal (a timing target,
/// reported, never failing a run on a shared machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Must hold.
    Invariant,
    /// Target figure.
    Goal,
}

/// One check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What is checked.
    pub name: String,
    /// Invariant or goal.
    pub kind: Kind,
    /// Held?
    pub ok: bool,
    /// The evidence.
    pub detail: String,
}

/// One plot: series names (from the recorder) and how to draw them.
#[derive(Debug, Clone, Serialize)]
pub struct Plot {
    /// File name (without `.svg`).
    pub file: String,
    /// Title.
    pub title: String,
    /// Unit of y.
    pub unit: String,
    /// (legend, series name) pairs.
    pub lines: Vec<(String, String)>,
    /// Plot rates of these counters instead of their values.
    pub as_rate: bool,
}

/// The report of one scenario run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Short (CI) variant?
    pub short: bool,
    /// When it started (RFC 3339).
    pub started: String,
    /// Seconds it took.
    pub duration_s: f64,
    /// The machine.
    pub machine: String,
    /// The settings used.
    pub settings: serde_json::Value,
    /// Named figures, in order: (name, value, unit or note).
    pub figures: Vec<(String, String)>,
    /// Checks.
    pub checks: Vec<Check>,
    /// Plots.
    pub plots: Vec<Plot>,
    /// Notes (what was decided, what is approximate).
    pub notes: Vec<String>,
}

impl Report {
    /// An empty report.
    pub fn new(scenario: &str, short: bool, settings: serde_json::Value) -> Self {
        Report {
            scenario: scenario.into(),
            short,
            started: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            duration_s: 0.0,
            machine: crate::proc::machine(),
            settings,
            figures: Vec::new(),
            checks: Vec::new(),
            plots: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a figure.
    pub fn figure(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.figures.push((name.into(), value.into()));
    }

    /// Adds an invariant.
    pub fn invariant(&mut self, name: impl Into<String>, ok: bool, detail: impl Into<String>) {
        self.check(Kind::Invariant, name, ok, detail);
    }

    /// Adds a goal.
    pub fn goal(&mut self, name: impl Into<String>, ok: bool, detail: impl Into<String>) {
        self.check(Kind::Goal, name, ok, detail);
    }

    fn check(&mut self, kind: Kind, name: impl Into<String>, ok: bool, detail: impl Into<String>) {
        let c = Check {
            name: name.into(),
            kind,
            ok,
            detail: detail.into(),
        };
        if ok {
            tracing::info!(check = %c.name, "ok: {}", c.detail);
        } else {
            tracing::warn!(check = %c.name, kind = ?c.kind, "NOT MET: {}", c.detail);
        }
        self.checks.push(c);
    }

    /// Adds a note.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Adds a plot.
    pub fn plot(&mut self, file: &str, title: &str, unit: &str, lines: Vec<(String, String)>) {
        self.plots.push(Plot {
            file: file.into(),
            title: title.into(),
            unit: unit.into(),
            lines,
            as_rate: false,
        });
    }

    /// Adds a plot of counter rates.
    pub fn rate_plot(&mut self, file: &str, title: &str, unit: &str, lines: Vec<(String, String)>) {
        self.plots.push(Plot {
            file: file.into(),
            title: title.into(),
            unit: unit.into(),
            lines,
            as_rate: true,
        });
    }

    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok || c.kind == Kind::Goal)
    }

    /// Writes `report.md`, `report.json`, `series.json` and the plots into `dir`; returns the Markdown path.
    pub fn write(&self, dir: &Path, rec: &Recorder) -> Result<PathBuf> {
        let plots_dir = dir.join("plots");
        std::fs::create_dir_all(&plots_dir)
            .with_context(|| format!("creating {}", plots_dir.display()))?;
        let marks = rec.marks();
        for p in &self.plots {
            let data: Vec<(String, Vec<(f64, f64)>)> = p
                .lines
                .iter()
                .filter_map(|(label, name)| {
                    let s = rec.series(name)?;
                    let pts = if p.as_rate {
                        crate::record::rates(&s.points)
                    } else {
                        s.points
                    };
                    Some((label.clone(), pts))
                })
                .collect();
            let lines: Vec<Line<'_>> = data
                .iter()
                .map(|(label, pts)| Line {
                    label: label.clone(),
                    points: pts,
                })
                .collect();
            let svg = plot::chart(&p.title, &p.unit, &lines, &marks);
            std::fs::write(plots_dir.join(format!("{}.svg", p.file)), svg)?;
        }
        std::fs::write(
            dir.join("report.json"),
            serde_json::to_vec_pretty(&serde_json::json!({
                "report": self,
                "passed": self.passed(),
            }))?,
        )?;
        std::fs::write(dir.join("series.json"), serde_json::to_vec(&rec.to_json())?)?;
        let md = dir.join("report.md");
        std::fs::write(&md, self.markdown())?;
        Ok(md)
    }

    /// The Markdown text.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# Load test `{}`{} — {}\n",
            self.scenario,
            if self.short { " (short)" } else { "" },
            if self.passed() {
                "invariants held"
            } else {
                "INVARIANTS BROKEN"
            }
        );
        let _ = writeln!(
            s,
            "Started {} on {}; took {:.0} s.\n",
            self.started, self.machine, self.duration_s
        );
        let _ = writeln!(
            s,
            "Settings: `{}`\n",
            serde_json::to_string(&self.settings).unwrap_or_default()
        );
        if !self.figures.is_empty() {
            let _ = writeln!(s, "## Figures\n\n| figure | value |\n|---|---|");
            for (k, v) in &self.figures {
                let _ = writeln!(s, "| {} | {} |", k, v.replace('|', "\\|"));
            }
            s.push('\n');
        }
        if !self.checks.is_empty() {
            let _ = writeln!(
                s,
                "## Checks\n\n| | kind | check | evidence |\n|---|---|---|---|"
            );
            for c in &self.checks {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} |",
                    if c.ok { "✅" } else { "❌" },
                    match c.kind {
                        Kind::Invariant => "invariant",
                        Kind::Goal => "goal",
                    },
                    c.name,
                    c.detail.replace('|', "\\|").replace('\n', " ")
                );
            }
            s.push('\n');
        }
        if !self.plots.is_empty() {
            let _ = writeln!(s, "## Plots\n");
            for p in &self.plots {
                let _ = writeln!(s, "![{}](plots/{}.svg)\n", p.title, p.file);
            }
        }
        if !self.notes.is_empty() {
            let _ = writeln!(s, "## Notes\n");
            for n in &self.notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goals_do_not_fail_a_run_but_invariants_do() {
        let mut r = Report::new("x", true, serde_json::json!({}));
        r.goal("fast", false, "40 s");
        assert!(r.passed());
        r.invariant("nothing lost", true, "0 missing");
        assert!(r.passed());
        r.invariant("no duplicates", false, "2 | twice");
        assert!(!r.passed());
        let md = r.markdown();
        assert!(md.contains("INVARIANTS BROKEN"));
        assert!(md.contains("2 \\| twice"));
    }

    #[test]
    fn writes_markdown_json_and_plots() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let rec = Recorder::new();
        rec.point("in/x", "msgs", 1.0);
        rec.point("in/x", "msgs", 5.0);
        let mut r = Report::new("x", true, serde_json::json!({"clusters": 2}));
        r.rate_plot(
            "rates",
            "Input",
            "msgs/s",
            vec![("x".into(), "in/x".into())],
        );
        let md = r.write(dir.path(), &rec)?;
        assert!(std::fs::read_to_string(md)?.contains("plots/rates.svg"));
        assert!(dir.path().join("plots/rates.svg").is_file());
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("report.json"))?)?;
        assert_eq!(json["passed"], true);
        Ok(())
    }
}
