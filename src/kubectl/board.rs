//! Live progress: an overall bar and one bar per node in progress on a terminal, plain lines
//! otherwise (a pipe, a CI log), so that no escape codes end up in files.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Node bars beyond this are not drawn (the overall bar still counts them), so that a rollout
/// with many nodes in flight does not scroll the terminal.
const MAX_NODE_BARS: usize = 16;
/// Node labels longer than this are cut (from the front: the end of a node name tells nodes apart).
const MAX_LABEL_WIDTH: usize = 28;

/// Where lines go; cheap to clone into tasks (a command's output is printed through it).
#[derive(Clone)]
pub enum Printer {
    Terminal(MultiProgress),
    Plain,
}

impl Printer {
    pub fn line(&self, line: &str) {
        match self {
            // A failed write to the terminal cannot be reported anywhere better.
            Printer::Terminal(multi) => {
                let _ = multi.println(line);
            }
            Printer::Plain => println!("{line}"),
        }
    }
}

pub struct Board {
    printer: Printer,
    /// Width of the label column of node bars.
    label_width: usize,
    overall: Option<ProgressBar>,
    nodes: HashMap<String, ProgressBar>,
    /// Plain mode: the last line printed per node, to print only changes.
    last: HashMap<String, String>,
    /// Plain mode: the count of the last overall line printed.
    last_done: Option<u64>,
    /// Terminal: the note lines below the bars (see [`Board::notes`]).
    note_bars: Vec<ProgressBar>,
    /// Plain mode: the note lines printed last time.
    last_notes: Vec<String>,
}

fn style(template: &str) -> ProgressStyle {
    // The templates are constants of this file; a bad one falls back to indicatif's default.
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

impl Board {
    /// Bars when stdout is a terminal (and TERM is not `dumb`), plain lines otherwise.
    /// `labels` are the node labels expected, to size their column.
    pub fn new<'a>(total: u64, labels: impl Iterator<Item = &'a str>) -> Board {
        let label_width = labels
            .map(|l| l.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(4, MAX_LABEL_WIDTH);
        let terminal = std::io::stdout().is_terminal()
            && std::env::var("TERM").map_or(true, |term| term != "dumb");
        if !terminal {
            return Board {
                printer: Printer::Plain,
                label_width,
                overall: None,
                nodes: HashMap::new(),
                last: HashMap::new(),
                last_done: None,
                note_bars: Vec::new(),
                last_notes: Vec::new(),
            };
        }
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stdout());
        let overall = multi.add(ProgressBar::new(total).with_style(style(
            "{spinner:.green} {elapsed_precise} [{bar:30.green/white}] {pos}/{len} {wide_msg}",
        )));
        overall.enable_steady_tick(Duration::from_millis(120));
        Board {
            printer: Printer::Terminal(multi),
            label_width,
            overall: Some(overall),
            nodes: HashMap::new(),
            last: HashMap::new(),
            last_done: None,
            note_bars: Vec::new(),
            last_notes: Vec::new(),
        }
    }

    pub fn printer(&self) -> Printer {
        self.printer.clone()
    }

    pub fn line(&self, line: &str) {
        self.printer.line(line);
    }

    /// The overall bar; in plain mode a line each time `done` changes.
    pub fn overall(&mut self, done: u64, total: u64, message: String) {
        match &self.overall {
            Some(bar) => {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(message);
            }
            None => {
                if self.last_done != Some(done) {
                    println!("[{done}/{total}] {message}");
                    self.last_done = Some(done);
                }
            }
        }
    }

    /// The bar (or, in plain mode, a line when the message changed) of one node in progress.
    /// `key` identifies the bar, `label` is shown in front of it.
    pub fn node(&mut self, key: &str, label: &str, percent: u64, message: String) {
        match &self.printer {
            Printer::Terminal(multi) => {
                if let Some(bar) = self.nodes.get(key) {
                    bar.set_position(percent);
                    bar.set_message(message);
                    return;
                }
                if self.nodes.len() >= MAX_NODE_BARS {
                    return;
                }
                let width = self.label_width;
                let label = if label.chars().count() > width {
                    let tail: String = label
                        .chars()
                        .rev()
                        .take(width - 1)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    format!("…{tail}")
                } else {
                    label.to_string()
                };
                let bar = ProgressBar::new(100)
                    .with_style(style(&format!(
                        "  {{prefix:<{width}}} [{{bar:20.cyan/blue}}] {{wide_msg}}"
                    )))
                    .with_prefix(label)
                    .with_position(percent)
                    .with_message(message);
                // Node bars stay above the notes.
                let bar = match self.note_bars.first() {
                    Some(first) => multi.insert_before(first, bar),
                    None => multi.add(bar),
                };
                self.nodes.insert(key.to_string(), bar);
            }
            Printer::Plain => {
                if self.last.get(key) != Some(&message) {
                    println!("{label}: {message}");
                    self.last.insert(key.to_string(), message);
                }
            }
        }
    }

    /// Removes a node's bar and prints `line` (when given) above the bars.
    pub fn node_finished(&mut self, key: &str, line: Option<&str>) {
        if let Some(bar) = self.nodes.remove(key) {
            bar.finish_and_clear();
            if let Printer::Terminal(multi) = &self.printer {
                multi.remove(&bar);
            }
        }
        self.last.remove(key);
        if let Some(line) = line {
            self.printer.line(line);
        }
    }

    /// Lines shown below the bars, replacing the previous ones (e.g. why requests wait); none
    /// clears them. In plain mode a line is printed when it was not among the previous lines.
    pub fn notes(&mut self, lines: &[String]) {
        match &self.printer {
            Printer::Terminal(multi) => {
                while self.note_bars.len() > lines.len() {
                    if let Some(bar) = self.note_bars.pop() {
                        bar.finish_and_clear();
                        multi.remove(&bar);
                    }
                }
                for (index, line) in lines.iter().enumerate() {
                    match self.note_bars.get(index) {
                        Some(bar) => bar.set_message(line.clone()),
                        None => {
                            let bar = multi.add(
                                ProgressBar::new(0)
                                    .with_style(style("  {wide_msg}"))
                                    .with_message(line.clone()),
                            );
                            bar.tick();
                            self.note_bars.push(bar);
                        }
                    }
                }
            }
            Printer::Plain => {
                for line in lines {
                    if !self.last_notes.contains(line) {
                        println!("{line}");
                    }
                }
                self.last_notes = lines.to_vec();
            }
        }
    }

    /// Clears every bar; what follows prints as plain text.
    pub fn finish(&mut self) {
        for (_, bar) in self.nodes.drain() {
            bar.finish_and_clear();
        }
        for bar in self.note_bars.drain(..) {
            bar.finish_and_clear();
        }
        if let Some(bar) = self.overall.take() {
            bar.finish_and_clear();
        }
        if let Printer::Terminal(multi) = &self.printer {
            let _ = multi.clear();
        }
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        self.finish();
    }
}
