//! How every command that reports results prints them: one [`emit`] for
//! all the output formats, so a command builds its report once, as a type,
//! and never writes the format match itself.

use serde::Serialize;

use crate::Format;

/// A command's result: a document for scripts (its serde form) and a text
/// for people.
pub trait Report: Serialize {
    /// Tables and lines for a person.
    fn to_text(&self) -> String;
}

impl Format {
    /// Whether the output is for a person, so that progress lines may share
    /// stdout with it; a document must stay parseable.
    pub fn is_text(self) -> bool {
        matches!(self, Format::Table)
    }
}

/// Print `report` in `format` on stdout.
pub fn emit(format: Format, report: &impl Report) -> anyhow::Result<()> {
    match format {
        Format::Table => {
            let text = report.to_text();
            // A report with nothing for a person (ZONED without enough
            // regions to fit) prints nothing, not an empty line.
            if text.is_empty() || text.ends_with('\n') {
                print!("{text}");
            } else {
                println!("{text}");
            }
        }
        Format::Json => println!("{}", serde_json::to_string_pretty(report)?),
    }
    Ok(())
}

/// Library report types whose text is their own `to_text`.
macro_rules! reports {
    ($($t:ty),* $(,)?) => {
        $(impl Report for $t {
            fn to_text(&self) -> String {
                <$t>::to_text(self)
            }
        })*
    };
}

reports!(
    vswitch::Status,
    bench::control::Report,
    bench::fleet_sim::Report,
    bench::switch::Report,
    bench::veth::Report,
    bench::scaling::Report,
    bench::forwarder::Report,
    bench::hash_eval::Report,
    bench::maio::Report,
    lab::soak::Report,
    lbd::status::Status,
    lbd::agreement::Agreement,
);
